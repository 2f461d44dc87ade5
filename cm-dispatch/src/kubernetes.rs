//! The Kubernetes mission backend: one Job per occurrence, named by its idempotency key.
//!
//! A dispatch creates the Job [`job_name`] derives from the key, in the operator's namespace.
//! The API server refuses a second object of one name (409, reason `AlreadyExists`), so a retry
//! of the occurrence after a crash, or a second scheduler, cannot launch a second mission: on
//! `AlreadyExists` the backend reads the Job and reports the occurrence as already launched,
//! with that Job's name and uid.
//!
//! Unlike a Docker container, a Job has no "created but not started" state: the create is
//! atomic, and the Job controller starts its pod. A crash after the create was written (the
//! answer lost) leaves a launched mission, which the Retry finds by name; a crash before it
//! leaves nothing, and the Retry creates it.
//!
//! Answers are handled as the API documents them: `AlreadyExists` is a launch already made; any
//! other 4xx but 408 and 429 (a forbidden namespace, an invalid spec, an exceeded quota) fails
//! the dispatch at once with the server's message; 5xx, 408, 429 and connection failures are
//! tried again with backoff until the dispatch's deadline, then fail with the last answer. The
//! client's own retries are off, so every try is this backend's, within the deadline.
//!
//! An ended run's report ([`crate::MissionRuntime::report`]) is the Job's `status.startTime` and
//! its `completionTime` (or, for a failed Job, its `Failed` condition's `lastTransitionTime`),
//! and the tail of the log of the Job's newest pod (listed by [`JOB_NAME_LABEL`], the label
//! the Job controller gives its pods), read with `tailLines` and `limitBytes`: the API server
//! cuts a log at `limitBytes` from its start, so a tail that does not fit is asked again with
//! fewer lines, and what comes back under the limit ends at the log's end. A Job or pod gone
//! (its TTL after finishing, an operator) has no output to report, which is no error.
//!
//! The cluster is the one `kube::Config::infer` finds: `KUBECONFIG` or `~/.kube/config`, else
//! the in-cluster service account. Tested against a fake of the API
//! (`fakes::kubernetes`, feature `fakes`); no cluster was available where it was built.
//!
//! A pod's log is read up to `FETCH_LIMIT` bytes, whatever `limitBytes` the server honours.
//! Every other reply (a Job, a pod list, an error's `Status`) kube reads whole before it parses
//! it, with no bound of its own: the client is built with a layer that bounds each reply's body
//! at [`crate::MAX_REPLY_BYTES`] (one declaring a longer `Content-Length` is refused unread). A
//! reply past it fails the call with an error naming the bound, which is retried and reported as
//! any failed call: a launch whose create answer was cut is unconfirmed, a watch's read is
//! asked again, and no run is judged by a part of a reply.

use std::collections::BTreeMap;

use async_trait::async_trait;
use futures_util::AsyncReadExt as _;
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, EnvVar, Pod, PodSpec, PodTemplateSpec, ResourceRequirements, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use sha2::{Digest as _, Sha256};
use tokio::time::Instant;

mod names;

use names::checked_settings;
pub use names::{is_dns_label, is_label_value, is_quantity, job_name};

use crate::bounded::Bounded;
use crate::mission::{HostResolver, Launch, MissionConfig, SystemResolver};
use crate::output::{FETCH_LIMIT, TAIL_LINES, kept_output};
use crate::retry::{Retried, never_connected, unconfirmed, until_deadline};
use crate::{Dispatch, DispatchError, Dispatcher, Receipt};

/// The annotation holding the occurrence's key on every Job, whatever its name.
pub const KEY_ANNOTATION: &str = "cm.idempotency-key";

/// The name of the mission's container in the Job's pod.
pub const CONTAINER_NAME: &str = "mission";

/// The label the Job controller puts on a Job's pods, naming the Job (Kubernetes 1.27 and
/// later; the older `job-name` is set beside it).
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";

/// Every permission the backend uses in its namespace, as (verb, API group, resource,
/// subresource): Jobs created, read and deleted (a launch, the watch, overlap `replace`), and the
/// Job's pods listed and their logs read (what a run printed). The start-up check asks the API
/// server about each (SelfSubjectAccessReview). `deploy/kubernetes/role.yaml` grants exactly
/// these, which a test checks against this list and against the calls the backend makes.
pub const REQUIRED_PERMISSIONS: &[(&str, &str, &str, Option<&str>)] = &[
    ("create", "batch", "jobs", None),
    ("get", "batch", "jobs", None),
    ("delete", "batch", "jobs", None),
    ("list", "", "pods", None),
    ("get", "", "pods", Some("log")),
];

/// How long the start-up permission check may take.
const PERMISSION_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The field manager cm writes Jobs as.
const FIELD_MANAGER: &str = "cm-scheduler";

/// Launches each mission as a Kubernetes Job.
#[derive(Clone)]
pub struct KubernetesDispatcher {
    jobs: Api<Job>,
    client: kube::Client,
    namespace: String,
    image: String,
    config: MissionConfig,
    user: Option<(i64, Option<i64>)>,
    resolver: std::sync::Arc<dyn HostResolver>,
}

impl std::fmt::Debug for KubernetesDispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client holds credentials: only the settings are shown.
        f.debug_struct("KubernetesDispatcher")
            .field("namespace", &self.namespace)
            .field("image", &self.image)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Why the Kubernetes backend could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum KubernetesSetupError {
    /// The operator's settings cannot be expressed as a Job.
    #[error("{0}")]
    Config(String),
    /// No cluster configuration was found, or its client could not be built.
    #[error("cannot use the Kubernetes API: {0}")]
    Cluster(String),
}

impl KubernetesDispatcher {
    /// A backend talking to the cluster `kube::Config::infer` finds (`KUBECONFIG`,
    /// `~/.kube/config`, or the in-cluster service account), running `image` with the
    /// operator's `config`. It reads the configuration now and connects on the first dispatch.
    pub async fn from_env(
        image: String,
        config: MissionConfig,
    ) -> Result<Self, KubernetesSetupError> {
        let user = checked_settings(&config)?;
        let cluster = kube::Config::infer()
            .await
            .map_err(|e| KubernetesSetupError::Cluster(e.to_string()))?;
        KubernetesDispatcher::with_config(cluster, image, config, user)
    }

    /// A backend talking to the current context of the kubeconfig file at `path`, as if
    /// `KUBECONFIG` named it alone.
    pub async fn from_kubeconfig(
        path: &std::path::Path,
        image: String,
        config: MissionConfig,
    ) -> Result<Self, KubernetesSetupError> {
        let user = checked_settings(&config)?;
        let cluster_error = |e: kube::config::KubeconfigError| {
            KubernetesSetupError::Cluster(format!("kubeconfig {}: {e}", path.display()))
        };
        let file = kube::config::Kubeconfig::read_from(path).map_err(cluster_error)?;
        let cluster =
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(cluster_error)?;
        KubernetesDispatcher::with_config(cluster, image, config, user)
    }

    /// A backend talking to the cluster `cluster` describes.
    pub fn connect(
        cluster: kube::Config,
        image: String,
        config: MissionConfig,
    ) -> Result<Self, KubernetesSetupError> {
        let user = checked_settings(&config)?;
        KubernetesDispatcher::with_config(cluster, image, config, user)
    }

    fn with_config(
        mut cluster: kube::Config,
        image: String,
        config: MissionConfig,
        user: Option<(i64, Option<i64>)>,
    ) -> Result<Self, KubernetesSetupError> {
        // Every try is this backend's, bounded by the dispatch's deadline.
        cluster.default_retry = false;
        // Every reply is read up to MAX_REPLY_BYTES (kube reads a reply whole to parse it).
        let bound = tower::util::MapResponseLayer::new(
            |reply: http::Response<Box<kube::client::DynBody>>| {
                reply.map(|body| Bounded::new(body, "the Kubernetes API"))
            },
        );
        let client = kube::client::ClientBuilder::try_from(cluster)
            .map_err(|e| KubernetesSetupError::Cluster(e.to_string()))?
            .with_layer(&bound)
            .build();
        let namespace = config.kubernetes.namespace.clone();
        Ok(KubernetesDispatcher {
            jobs: Api::namespaced(client.clone(), &namespace),
            client,
            namespace,
            image,
            config,
            user,
            resolver: std::sync::Arc::new(SystemResolver),
        })
    }

    /// The same backend resolving repository hosts with `resolver` at dispatch
    /// ([`crate::mission::check_resolved`]) instead of the system's.
    pub fn with_resolver(mut self, resolver: std::sync::Arc<dyn HostResolver>) -> Self {
        self.resolver = resolver;
        self
    }

    /// The Job that launches `launch`, named `name`.
    pub fn job(&self, launch: &Launch, name: &str) -> Job {
        let k8s = &self.config.kubernetes;
        // Every cm label is an annotation; those Kubernetes accepts as labels are labels too
        // (a label value cannot hold the `:` of cm.scheduled-at).
        let mut annotations: BTreeMap<String, String> = launch.labels.clone();
        annotations.insert(KEY_ANNOTATION.into(), launch.name.clone());
        let labels: BTreeMap<String, String> = launch
            .labels
            .iter()
            .filter(|(_, v)| is_label_value(v))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let meta = ObjectMeta {
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        };
        let quantities = || {
            let mut q = BTreeMap::new();
            if let Some(cpu) = &k8s.cpu {
                q.insert("cpu".to_owned(), Quantity(cpu.clone()));
            }
            if let Some(memory) = &k8s.memory {
                q.insert("memory".to_owned(), Quantity(memory.clone()));
            }
            (!q.is_empty()).then_some(q)
        };
        let container = Container {
            name: CONTAINER_NAME.into(),
            image: Some(self.image.clone()),
            // Like Docker's Cmd: the image's entrypoint runs with these arguments.
            args: (!self.config.command.is_empty()).then(|| self.config.command.clone()),
            env: Some(
                launch
                    .env
                    .iter()
                    .map(|(name, value)| EnvVar {
                        name: name.clone(),
                        value: Some(value.clone()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            resources: quantities().map(|q| ResourceRequirements {
                requests: Some(q.clone()),
                limits: Some(q),
                ..Default::default()
            }),
            security_context: self.user.map(|(uid, gid)| SecurityContext {
                run_as_user: Some(uid),
                run_as_group: gid,
                ..Default::default()
            }),
            ..Default::default()
        };
        Job {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(self.namespace.clone()),
                ..meta.clone()
            },
            spec: Some(JobSpec {
                backoff_limit: Some(k8s.backoff_limit),
                active_deadline_seconds: Some(k8s.active_deadline_seconds),
                ttl_seconds_after_finished: Some(k8s.ttl_seconds_after_finished),
                template: PodTemplateSpec {
                    metadata: Some(meta),
                    spec: Some(PodSpec {
                        restart_policy: Some("Never".into()),
                        service_account_name: k8s.service_account.clone(),
                        containers: vec![container],
                        ..Default::default()
                    }),
                },
                ..Default::default()
            }),
            status: None,
        }
    }

    async fn launch(&self, launch: &Launch, deadline: Instant) -> Result<Receipt, DispatchError> {
        let name = job_name(&launch.name);
        let job = self.job(launch, &name);
        let params = PostParams {
            dry_run: false,
            field_manager: Some(FIELD_MANAGER.into()),
        };
        let created = self
            .retrying(deadline, &format!("create Job {name}"), || async {
                match self.jobs.create(&params, &job).await {
                    Ok(created) => Ok(Some(created)),
                    Err(e) if already_exists(&e) => Ok(None),
                    Err(e) => Err(e),
                }
            })
            .await?;
        match created {
            Some(created) => Ok(self.receipt(false, &name, &created)),
            None => self.already_launched(launch, &name, deadline).await,
        }
    }

    /// The Job exists: an earlier attempt created it, and the Job controller runs it.
    async fn already_launched(
        &self,
        launch: &Launch,
        name: &str,
        deadline: Instant,
    ) -> Result<Receipt, DispatchError> {
        let found = self
            .retrying(deadline, &format!("read Job {name}"), || async {
                match self.jobs.get(name).await {
                    Ok(job) => Ok(Some(job)),
                    Err(e) if status_code(&e) == Some(404) => Ok(None),
                    Err(e) => Err(e),
                }
            })
            .await
            // The create found the name taken: a Job holds it, so the outcome is open.
            .map_err(unconfirmed)?;
        let Some(found) = found else {
            // Created, then deleted since (its TTL after finishing, or an operator): it was
            // launched, and creating it again would launch the mission twice.
            return Ok(Receipt {
                duplicate: true,
                detail: format!(
                    "job {}/{name} (already launched, since deleted)",
                    self.namespace
                ),
            });
        };
        let key = found
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(KEY_ANNOTATION));
        if key.is_some_and(|key| *key != launch.name) {
            return Err(DispatchError::Rejected(format!(
                "a Job named {name} exists in {} for another occurrence ({})",
                self.namespace,
                key.map(String::as_str).unwrap_or_default()
            )));
        }
        Ok(self.receipt(true, name, &found))
    }

    fn receipt(&self, duplicate: bool, name: &str, job: &Job) -> Receipt {
        let uid = job.metadata.uid.as_deref().unwrap_or("unknown");
        Receipt {
            duplicate,
            detail: format!("job {}/{name} uid {uid}", self.namespace),
        }
    }

    /// Runs `call` until it answers or fails for good, or the deadline passes: a refusal (a
    /// 4xx answer but 408, 409 and 429) fails at once; anything else is tried again.
    async fn retrying<T, F, Fut>(
        &self,
        deadline: Instant,
        what: &str,
        call: F,
    ) -> Result<T, DispatchError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, kube::Error>>,
    {
        until_deadline(deadline, is_refusal, left_no_effect, call)
            .await
            .map_err(|failed| match failed {
                Retried::Refused(e) => {
                    DispatchError::Rejected(format!("kubernetes {what}: {}", describe(&e)))
                }
                Retried::PastDeadline {
                    last,
                    may_have_taken_effect,
                } => {
                    let past = past_deadline(what, last.map(|e| describe(&e)));
                    // A create sent whose answer never came may have stored the Job.
                    if may_have_taken_effect {
                        unconfirmed(past)
                    } else {
                        past
                    }
                }
            })
    }
}

impl KubernetesDispatcher {
    /// The Job `name`, or `None` when there is none.
    async fn read_job(&self, name: &str, deadline: Instant) -> Result<Option<Job>, DispatchError> {
        self.retrying(deadline, &format!("read Job {name}"), || async {
            match self.jobs.get(name).await {
                Ok(job) => Ok(Some(job)),
                Err(e) if status_code(&e) == Some(404) => Ok(None),
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// The end of the log of the Job `job`'s newest pod, as kept; `None` when the Job has no
    /// pod, or its pod no log (gone, or its container never started).
    async fn log_tail(
        &self,
        job: &str,
        deadline: Instant,
    ) -> Result<Option<String>, DispatchError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let params = kube::api::ListParams::default().labels(&format!("{JOB_NAME_LABEL}={job}"));
        let listed = self
            .retrying(deadline, &format!("list the pods of Job {job}"), || {
                pods.list(&params)
            })
            .await?;
        // The newest pod is the last try's (a Job with a backoff limit tries in new pods).
        let newest = listed
            .items
            .into_iter()
            .filter_map(|pod| {
                let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
                Some((created, pod.metadata.name?))
            })
            .max();
        let Some((_, pod)) = newest else {
            return Ok(None);
        };
        for (i, lines) in TAIL_LINES.iter().enumerate() {
            let params = kube::api::LogParams {
                container: Some(CONTAINER_NAME.to_owned()),
                tail_lines: Some(*lines as i64),
                limit_bytes: Some(FETCH_LIMIT as i64),
                ..Default::default()
            };
            let read = self
                .retrying(deadline, &format!("read the log of pod {pod}"), || async {
                    match pods.log_stream(&pod, &params).await {
                        // `limitBytes` asks the server for no more than FETCH_LIMIT bytes; one
                        // that sends more anyway (or without end) is not read past it. The bytes
                        // need not be UTF-8: they are read lossily, as every output is.
                        Ok(log) => {
                            let mut end = Vec::new();
                            log.take(FETCH_LIMIT as u64)
                                .read_to_end(&mut end)
                                .await
                                .map_err(kube::Error::ReadEvents)?;
                            Ok(Some(end))
                        }
                        // Gone, or a container that never started (400: waiting to start).
                        Err(e) if matches!(status_code(&e), Some(400 | 404)) => Ok(None),
                        Err(e) => Err(e),
                    }
                })
                .await?;
            let Some(end) = read else { return Ok(None) };
            if end.len() < FETCH_LIMIT || i + 1 == TAIL_LINES.len() {
                // A tail of lines starts at a line start.
                return Ok(Some(kept_output(&end, true)));
            }
        }
        Ok(None)
    }
}

/// When the Job's run started and ended, by the API server's record: `status.startTime`, and
/// `completionTime` or the `Failed` condition's `lastTransitionTime`.
fn job_times(
    job: &Job,
) -> (
    Option<chrono::DateTime<chrono::Utc>>,
    Option<chrono::DateTime<chrono::Utc>>,
) {
    let time = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| {
        chrono::DateTime::from_timestamp(t.0.as_second(), t.0.subsec_nanosecond().max(0) as u32)
    };
    let Some(status) = &job.status else {
        return (None, None);
    };
    let failed = || {
        status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Failed" && c.status == "True")
            .and_then(|c| c.last_transition_time.as_ref())
    };
    let started = status.start_time.as_ref().and_then(time);
    let finished = status
        .completion_time
        .as_ref()
        .or_else(failed)
        .and_then(time);
    (started, finished)
}

fn past_deadline(what: &str, last: Option<String>) -> DispatchError {
    DispatchError::Unavailable(match last {
        Some(last) => {
            format!("the Kubernetes API did not {what} before the deadline; last answer: {last}")
        }
        None => format!("the Kubernetes API did not {what} before the deadline"),
    })
}

fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

fn already_exists(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 409 && status.reason == "AlreadyExists")
}

/// Whether a failed call certainly did nothing at the API server: it answered with an error
/// status, or the connection was never made.
fn left_no_effect(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(_)) || never_connected(e)
}

/// A 4xx answer that trying again cannot change.
fn is_refusal(e: &kube::Error) -> bool {
    status_code(e)
        .is_some_and(|code| (400..500).contains(&code) && ![408, 409, 429].contains(&code))
}

/// An error as the operator reads it: the server's message, reason and code for an answer,
/// the client's own words otherwise. Neither carries credentials.
fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) if status.reason.is_empty() => {
            format!("{} ({})", status.message, status.code)
        }
        kube::Error::Api(status) => {
            format!("{} ({} {})", status.message, status.code, status.reason)
        }
        other => other.to_string(),
    }
}

#[async_trait]
impl Dispatcher for KubernetesDispatcher {
    async fn dispatch(&self, dispatch: &Dispatch) -> Result<Receipt, DispatchError> {
        let policy = self.config.policy().map_err(DispatchError::Rejected)?;
        let launch = Launch::checked(dispatch, &policy, &*self.resolver).await?;
        let deadline = Instant::from_std(dispatch.deadline);
        self.launch(&launch, deadline).await
    }
}

/// The run a Job's status shows: its `Complete` or `Failed` condition (or a succeeded pod),
/// otherwise running.
fn job_run_state(job: &Job) -> cm_domain::RunState {
    use cm_domain::{ErrorText, RunState};
    let Some(status) = &job.status else {
        return RunState::Running;
    };
    let condition = |kind: &str| {
        status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == kind && c.status == "True")
    };
    if condition("Complete").is_some() || status.succeeded.unwrap_or(0) > 0 {
        return RunState::Succeeded;
    }
    match condition("Failed") {
        Some(failed) => RunState::Failed {
            exit_code: None,
            reason: ErrorText::new(
                match (failed.reason.as_deref(), failed.message.as_deref()) {
                    (Some(reason), Some(message)) => format!("{reason}: {message}"),
                    (Some(text), None) | (None, Some(text)) => text.to_owned(),
                    (None, None) => "the Job failed".to_owned(),
                },
            ),
        },
        None => RunState::Running,
    }
}

#[async_trait]
impl crate::MissionRuntime for KubernetesDispatcher {
    /// The API server answers: any answer counts (listing Jobs may be forbidden to a service
    /// account that can create them), only a failure to reach it does not.
    async fn ready(&self) -> Result<(), String> {
        let params = kube::api::ListParams::default().limit(1);
        match self.jobs.list_metadata(&params).await {
            Ok(_) | Err(kube::Error::Api(_)) => Ok(()),
            Err(e) => Err(format!(
                "no usable answer from the Kubernetes API: {}",
                describe(&e)
            )),
        }
    }

    async fn observe(
        &self,
        run: &crate::RunRef,
        deadline: std::time::Instant,
    ) -> Result<cm_domain::RunState, DispatchError> {
        let name = job_name(&run.name);
        let found = self
            .retrying(
                Instant::from_std(deadline),
                &format!("read Job {name}"),
                || async {
                    match self.jobs.get(&name).await {
                        Ok(job) => Ok(Some(job)),
                        Err(e) if status_code(&e) == Some(404) => Ok(None),
                        Err(e) => Err(e),
                    }
                },
            )
            .await?;
        Ok(match found {
            Some(job) => job_run_state(&job),
            None => cm_domain::RunState::Lost {
                reason: cm_domain::ErrorText::new(format!(
                    "the Kubernetes API has no Job {}/{name}",
                    self.namespace
                )),
            },
        })
    }

    /// The Job's times and the tail of its newest pod's log; a Job gone reports nothing.
    async fn report(
        &self,
        run: &crate::RunRef,
        deadline: std::time::Instant,
    ) -> Result<crate::RunReport, DispatchError> {
        let name = job_name(&run.name);
        let deadline = Instant::from_std(deadline);
        let Some(job) = self.read_job(&name, deadline).await? else {
            return Ok(crate::RunReport::default());
        };
        let (started_at, finished_at) = job_times(&job);
        Ok(crate::RunReport {
            output: self.log_tail(&name, deadline).await?,
            started_at,
            finished_at,
        })
    }

    async fn missing_permissions(&self) -> Result<Vec<String>, DispatchError> {
        use k8s_openapi::api::authorization::v1::{
            ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
        };
        let reviews: Api<SelfSubjectAccessReview> = Api::all(self.client.clone());
        let deadline = Instant::now() + PERMISSION_CHECK_TIMEOUT;
        let mut missing = Vec::new();
        for (verb, group, resource, subresource) in REQUIRED_PERMISSIONS {
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        namespace: Some(self.namespace.clone()),
                        verb: Some((*verb).to_owned()),
                        group: Some((*group).to_owned()),
                        resource: Some((*resource).to_owned()),
                        subresource: subresource.map(str::to_owned),
                        ..ResourceAttributes::default()
                    }),
                    ..SelfSubjectAccessReviewSpec::default()
                },
                ..SelfSubjectAccessReview::default()
            };
            let answer = self
                .retrying(
                    deadline,
                    &format!("review the permission to {verb} {resource}"),
                    || {
                        let review = review.clone();
                        let reviews = reviews.clone();
                        async move { reviews.create(&PostParams::default(), &review).await }
                    },
                )
                .await?;
            if !answer.status.is_some_and(|s| s.allowed) {
                missing.push(match subresource {
                    Some(sub) => format!("{verb} {resource}/{sub}"),
                    None => format!("{verb} {resource}"),
                });
            }
        }
        Ok(missing)
    }

    /// Deletes the Job in the foreground and reads it back until it is gone: the API server
    /// keeps it (with a `deletionTimestamp`) until its pods are deleted. A Job still there at
    /// the deadline is an unconfirmed stop (its deletion goes on).
    async fn stop(
        &self,
        run: &crate::RunRef,
        deadline: std::time::Instant,
    ) -> Result<(), DispatchError> {
        let name = job_name(&run.name);
        let deadline = Instant::from_std(deadline);
        let params = kube::api::DeleteParams::foreground();
        self.retrying(deadline, &format!("delete Job {name}"), || async {
            match self.jobs.delete(&name, &params).await {
                Ok(_) => Ok(()),
                Err(e) if status_code(&e) == Some(404) => Ok(()),
                Err(e) => Err(e),
            }
        })
        .await?;
        let mut pause = STOP_POLL_FIRST;
        loop {
            let Some(job) = self.read_job(&name, deadline).await? else {
                return Ok(());
            };
            let now = Instant::now();
            if now + STOP_POLL_FIRST >= deadline {
                let (ns, deleting) = (&self.namespace, job.metadata.deletion_timestamp.is_some());
                let what = ["was still there", "and its pods were still being deleted"];
                let what = what[usize::from(deleting)];
                let why =
                    format!("kubernetes delete Job {ns}/{name}: the Job {what} at the deadline");
                return Err(DispatchError::Unconfirmed(why));
            }
            tokio::time::sleep(pause.min(deadline - now - STOP_POLL_FIRST)).await;
            pause = (pause * 2).min(STOP_POLL_MOST);
        }
    }
}

/// A stop's first and longest wait between reads of a Job it deleted.
const STOP_POLL_FIRST: std::time::Duration = std::time::Duration::from_millis(100);
const STOP_POLL_MOST: std::time::Duration = std::time::Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::names::numeric_user;
    use chrono::{TimeZone, Utc};
    use cm_domain::Occurrence;
    use uuid::Uuid;

    use super::*;

    #[test]
    fn every_key_shape_names_a_valid_stable_job() {
        let at = |micros| Utc.timestamp_micros(micros).unwrap();
        let keys = [
            Occurrence::new(Uuid::nil(), at(0)),
            Occurrence::new(Uuid::from_u128(u128::MAX), at(253_402_300_799_999_999)),
            Occurrence::new(Uuid::from_u128(7), at(-62_135_596_800_000_000)),
            Occurrence::new(Uuid::from_u128(7), at(-1)),
        ]
        .map(|o| o.idempotency_key().to_string());
        for key in &keys {
            // cm's own keys are names already: `kubectl get job <key>` finds the mission.
            assert_eq!(job_name(key), *key);
            assert!(is_dns_label(key), "{key}");
        }
        // Text that is no valid name still maps to one, stably, and distinct texts apart.
        let odd = [
            "",
            "CM-Upper",
            "-leading",
            "trailing-",
            "has.dot",
            "under_score",
            "ünïcode",
            &"x".repeat(64),
            &"y".repeat(500),
        ];
        let names: Vec<String> = odd.iter().map(|k| job_name(k)).collect();
        for (key, name) in odd.iter().zip(&names) {
            assert!(is_dns_label(name), "{key:?} -> {name}");
            assert_eq!(name.len(), 43, "{name}");
            assert_eq!(job_name(key), *name, "stable for {key:?}");
        }
        let distinct: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(distinct.len(), names.len());
        // A pinned value: the derivation never changes under a running fleet.
        assert_eq!(
            job_name("CM-Upper"),
            format!(
                "cm-{}",
                &Sha256::digest(b"CM-Upper")
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>()[..40]
            )
        );
    }

    #[test]
    fn dns_labels_and_label_values_follow_kubernetes() {
        for ok in ["a", "a-1", "0", &"a".repeat(63)] {
            assert!(is_dns_label(ok), "{ok}");
        }
        for bad in ["", "A", "-a", "a-", "a.b", "a_b", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
        for ok in ["", "a", "A.b_c-D", &"a".repeat(63)] {
            assert!(is_label_value(ok), "{ok}");
        }
        for bad in ["-a", "a.", "2026-03-29T01:30:00Z", "a b", &"a".repeat(64)] {
            assert!(!is_label_value(bad), "{bad}");
        }
    }

    #[test]
    fn quantities_parse_as_kubernetes_parses_them() {
        for ok in [
            "1", "0", "500m", "1.5", ".5", "5.", "2Gi", "128Mi", "1e3", "1E-2", "+1", "100k", "3Ei",
        ] {
            assert!(is_quantity(ok), "{ok}");
        }
        for bad in [
            "", "1.5cores", "lots", "-1", "1.2.3", "Gi", "1gi", "1KiB", "1e", "1e+", "m", " 1",
        ] {
            assert!(!is_quantity(bad), "{bad}");
        }
    }

    #[test]
    fn settings_the_api_server_would_refuse_are_refused_naming_the_key() {
        let check = |json: &str, key: &str| {
            let config = MissionConfig::from_json(json).unwrap();
            let err = checked_settings(&config).unwrap_err().to_string();
            assert!(
                err.contains(&format!("\"kubernetes\".{key}")),
                "{json}: {err}"
            );
        };
        check(r#"{"kubernetes": {"backoff_limit": -1}}"#, "backoff_limit");
        check(
            r#"{"kubernetes": {"ttl_seconds_after_finished": -5}}"#,
            "ttl_seconds_after_finished",
        );
        check(
            r#"{"kubernetes": {"active_deadline_seconds": 0}}"#,
            "active_deadline_seconds",
        );
        check(r#"{"kubernetes": {"cpu": "1.5cores"}}"#, "cpu");
        check(r#"{"kubernetes": {"memory": "lots"}}"#, "memory");
        check(
            r#"{"kubernetes": {"namespace": "Not_A_Namespace"}}"#,
            "namespace",
        );
        check(
            r#"{"kubernetes": {"service_account": "Bad Name"}}"#,
            "service_account",
        );
        let fine = MissionConfig::from_json(
            r#"{"user": "1000", "kubernetes": {"namespace": "missions", "cpu": "500m",
                "memory": "2Gi", "backoff_limit": 0, "ttl_seconds_after_finished": 0}}"#,
        )
        .unwrap();
        assert_eq!(checked_settings(&fine).unwrap(), Some((1000, None)));
    }

    #[test]
    fn users_are_numeric() {
        assert_eq!(numeric_user(None).unwrap(), None);
        assert_eq!(numeric_user(Some("1000")).unwrap(), Some((1000, None)));
        assert_eq!(
            numeric_user(Some("1000:2000")).unwrap(),
            Some((1000, Some(2000)))
        );
        for bad in ["mission", "1000:staff", "-1", ":1", "1:"] {
            let err = numeric_user(Some(bad)).unwrap_err();
            assert!(err.to_string().contains("numeric user"), "{err}");
        }
    }
}
