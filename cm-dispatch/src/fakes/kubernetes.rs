//! A fake of the Kubernetes API's Jobs: the routes the Kubernetes backend uses, over HTTP.
//!
//! It answers as the API server documents: `POST /apis/batch/v1/namespaces/{ns}/jobs` 201
//! with the Job as stored (`metadata.uid`, `resourceVersion`, `creationTimestamp`, the
//! generated selector and pod template labels, `status: {}`); `GET
//! /apis/batch/v1/namespaces/{ns}/jobs/{name}` 200 with it. Every error is a `Status` object
//! (`kind: Status`, `status: Failure`, `message`, `reason`, `details`, `code`) as the server
//! sends: 409 `AlreadyExists` for a taken name (`jobs.batch "NAME" already exists`), 404
//! `NotFound` for a Job or namespace that is not there, 422 `Invalid` for a name that is not a
//! DNS-1123 label (a Job's name is its pods' `job-name` label value, so at most 63), a label
//! value Kubernetes refuses, a `restartPolicy` other than `Never`/`OnFailure`, or a container
//! without a name or image; 401 `Unauthorized` for a request without the configured bearer
//! token.
//!
//! `DELETE /apis/batch/v1/namespaces/{ns}/jobs/{name}` deletes a Job as its `propagationPolicy`
//! (in the body's `DeleteOptions`, or the query) says: `Background`, the Job goes at once and its
//! pods are deleted after it; `Foreground`, its pods are deleted first and the Job stays, with a
//! `deletionTimestamp` and the `foregroundDeletion` finalizer, until none is left; `Orphan` (the
//! API's default for Jobs), the Job goes and its pods stay. A pod being deleted carries a
//! `deletionTimestamp` and is gone once its termination took
//! [`FakeKubernetes::set_pod_termination`] (at once unless set), as the kubelet stops its
//! containers with their grace. A Job's pods are the test's to make ([`FakeKubernetes::add_pod`],
//! each with the canned text of its log): `GET /api/v1/namespaces/{ns}/pods` lists them
//! (`labelSelector` of `key=value` terms, as the Job controller labels them:
//! `batch.kubernetes.io/job-name`, `job-name`, `controller-uid`); `GET
//! /api/v1/namespaces/{ns}/pods/{pod}/log` answers the log as text, its last `tailLines` lines
//! and then, as the kubelet does, at most `limitBytes` bytes from that text's start; 404 for a
//! pod that is not there, 400 for a `container` the pod has not.
//!
//! Tests set it up with [`FakeKubernetes::start`], write a kubeconfig pointing at it with
//! [`FakeKubernetes::kubeconfig`], make creates fail, be refused or stall with
//! [`FakeKubernetes::fault_next_create`], end a Job with [`FakeKubernetes::set_job_status`],
//! and read what happened with [`FakeKubernetes::calls`] and [`FakeKubernetes::jobs`].
//!
//! `GET /apis/batch/v1/namespaces/{ns}/jobs` lists the Jobs' metadata (the readiness check's
//! call). [`FakeKubernetes::flood`] answers the calls of one route with a body that does not end. [`FakeKubernetes::permissions_asked`] says which permission (`verb resource`) each
//! request needed, so a test can hold a Role to what the backend calls.
//!
//! What it does not do: run the Jobs (no controller makes pods, `status` stays what the test
//! sets), watch or patch Jobs, or expire them after `ttlSecondsAfterFinished`.

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::{Answer, Call, FakeRequest, Flood, FloodRecord, Handler, Server, lock};

/// What the next create of a Job does instead of creating it normally.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateFault {
    /// Answer 500 `InternalError` and create nothing (etcd failing for a moment).
    Fail,
    /// Answer `code` with a `Status` carrying `message`, and create nothing: an admission
    /// webhook or quota refusing (403), a server overloaded (429, 503).
    Refuse {
        /// The HTTP status code.
        code: u16,
        /// The Status's message.
        message: String,
    },
    /// Never answer, and create nothing: a scheduler killed now died before the Job existed.
    StallBeforeCreate,
    /// Create the Job, then never answer: a scheduler killed now died after the Job existed
    /// and before it learnt so.
    StallAfterCreate,
}

/// A Job the fake holds.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredJob {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The uid the server gave it.
    pub uid: String,
    /// The whole object as stored and answered.
    pub object: Value,
}

impl StoredJob {
    /// The first container of its pod template.
    pub fn container(&self) -> &Value {
        &self.object["spec"]["template"]["spec"]["containers"][0]
    }

    /// The value of the environment variable `name` of its first container.
    pub fn env_var(&self, name: &str) -> Option<&str> {
        self.container()["env"]
            .as_array()?
            .iter()
            .find(|e| e["name"] == name)?["value"]
            .as_str()
    }
}

/// A pod the fake holds, made by the test for a Job.
#[derive(Debug, Clone, PartialEq)]
struct StoredPod {
    namespace: String,
    name: String,
    /// The Job it belongs to.
    job: String,
    object: Value,
    log: String,
    /// When a pod being deleted is gone (its termination over); `None` while it is not being
    /// deleted.
    gone_at: Option<std::time::Instant>,
}

#[derive(Debug, Default)]
struct State {
    namespaces: BTreeSet<String>,
    token: String,
    jobs: Vec<StoredJob>,
    pods: Vec<StoredPod>,
    /// The creation time of the last pod made, so each later one is newer.
    last_pod_created: Option<chrono::DateTime<chrono::Utc>>,
    calls: Vec<Call>,
    create_faults: VecDeque<CreateFault>,
    resource_version: u64,
    /// What the token may do, as `verb resource` (`delete jobs`, `get pods/log`); `None`: all.
    granted: Option<BTreeSet<String>>,
    /// The permission each authenticated request needed, as `verb resource`, granted or not.
    asked: BTreeSet<String>,
    /// How long a pod takes to go once deleted (its containers' termination).
    pod_termination: std::time::Duration,
    /// The calls answered with a flood instead: method, the path's end, and the flood.
    flood: Option<(String, String, Flood)>,
}

impl State {
    /// Ends the terminations that are over: the pods whose time came go, then every Job being
    /// deleted in the foreground that has no pod left.
    fn sweep(&mut self) {
        let now = std::time::Instant::now();
        self.pods.retain(|p| p.gone_at.is_none_or(|at| at > now));
        let pods = &self.pods;
        self.jobs.retain(|j| {
            j.object["metadata"]["deletionTimestamp"].is_null()
                || pods
                    .iter()
                    .any(|p| p.namespace == j.namespace && p.job == j.name)
        });
    }

    /// Begins the deletion of the pods of the Job `job` in `namespace`, as the garbage
    /// collector does: each is gone once its termination took `pod_termination`.
    fn delete_pods_of(&mut self, namespace: &str, job: &str) {
        let now = std::time::Instant::now();
        let stamp = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        for pod in self
            .pods
            .iter_mut()
            .filter(|p| p.namespace == namespace && p.job == job && p.gone_at.is_none())
        {
            pod.gone_at = Some(now + self.pod_termination);
            pod.object["metadata"]["deletionTimestamp"] = json!(stamp);
        }
        self.sweep();
    }
}

/// The fake API server; it stops when dropped.
pub struct FakeKubernetes {
    state: Arc<Mutex<State>>,
    server: Server,
}

struct ApiServer(Arc<Mutex<State>>);

impl FakeKubernetes {
    /// A fake API server on a free local port, with `namespaces`, that accepts requests bearing
    /// `token`.
    pub fn start(namespaces: &[&str], token: &str) -> FakeKubernetes {
        let state = Arc::new(Mutex::new(State {
            namespaces: namespaces.iter().map(|s| (*s).to_owned()).collect(),
            token: token.to_owned(),
            resource_version: 1000,
            ..State::default()
        }));
        let server = Server::start(Arc::new(ApiServer(state.clone())));
        FakeKubernetes { state, server }
    }

    /// The server's URL: `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    /// A kubeconfig file's text whose current context is this server, with the token, and
    /// `namespace` as the context's namespace.
    pub fn kubeconfig(&self, namespace: &str) -> String {
        let token = lock(&self.state).token.clone();
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             users:\n- name: cm\n  user:\n    token: {token}\ncontexts:\n- name: fake\n  context:\n\
             \x20   cluster: fake\n    user: cm\n    namespace: {namespace}\ncurrent-context: fake\n",
            self.url()
        )
    }

    /// Makes the next create of a Job (one call) behave as `fault` says.
    pub fn fault_next_create(&self, fault: CreateFault) {
        lock(&self.state).create_faults.push_back(fault);
    }

    /// Grants the token only `permissions`, each `verb resource` (`create jobs`, `get jobs`,
    /// `list pods`, `get pods/log`), as a Role would; every other request of those routes is
    /// answered 403 Forbidden, and SelfSubjectAccessReviews answer accordingly. `None` grants
    /// everything again.
    pub fn grant_only(&self, permissions: Option<&[&str]>) {
        lock(&self.state).granted =
            permissions.map(|p| p.iter().map(|s| (*s).to_owned()).collect());
    }

    /// Answers every `method` call whose path ends with `path_end` (`/jobs` for creates, a
    /// Job's name for its reads) with `flood`, a body that does not end; `None` stops. What
    /// the floods sent is [`FakeKubernetes::floods`].
    pub fn flood(&self, method: &str, path_end: &str, flood: Option<Flood>) {
        lock(&self.state).flood =
            flood.map(|flood| (method.to_owned(), path_end.to_owned(), flood));
    }

    /// What the floods sent so far.
    pub fn floods(&self) -> FloodRecord {
        self.server.floods()
    }

    /// Drops the faults not yet spent.
    pub fn clear_faults(&self) {
        lock(&self.state).create_faults.clear();
    }

    /// Stores `object` as the Job `name` in `namespace`, as someone else created it, and
    /// returns its uid.
    pub fn put_job(&self, namespace: &str, name: &str, mut object: Value) -> String {
        let uid = uuid::Uuid::new_v4().to_string();
        object["metadata"]["name"] = json!(name);
        object["metadata"]["namespace"] = json!(namespace);
        object["metadata"]["uid"] = json!(uid);
        lock(&self.state).jobs.push(StoredJob {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            uid: uid.clone(),
            object,
        });
        uid
    }

    /// Sets the `status` of the Job `name` in `namespace`, as the Job controller would (its
    /// `startTime`, `completionTime`, `conditions`); `false` when there is no such Job.
    pub fn set_job_status(&self, namespace: &str, name: &str, status: Value) -> bool {
        let mut state = lock(&self.state);
        match state
            .jobs
            .iter_mut()
            .find(|j| j.namespace == namespace && j.name == name)
        {
            Some(job) => {
                job.object["status"] = status;
                true
            }
            None => false,
        }
    }

    /// Makes a pod of the Job `job` in `namespace` whose log reads `log`, as the Job controller
    /// would for each try (labelled as its pod template is, created after every earlier pod),
    /// and returns its name.
    pub fn add_pod(&self, namespace: &str, job: &str, log: &str) -> String {
        let mut state = lock(&self.state);
        let stored = state
            .jobs
            .iter()
            .find(|j| j.namespace == namespace && j.name == job)
            .cloned();
        let mut labels = stored
            .as_ref()
            .map(|j| j.object["spec"]["template"]["metadata"]["labels"].clone())
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        for key in ["batch.kubernetes.io/job-name", "job-name"] {
            labels[key] = json!(job);
        }
        let containers = stored
            .as_ref()
            .map(|j| j.object["spec"]["template"]["spec"]["containers"].clone())
            .filter(Value::is_array)
            .unwrap_or_else(|| json!([{ "name": "mission", "image": "unknown" }]));
        let now = chrono::Utc::now();
        let created = match state.last_pod_created {
            Some(last) if last + chrono::TimeDelta::seconds(1) > now => {
                last + chrono::TimeDelta::seconds(1)
            }
            _ => now,
        };
        state.last_pod_created = Some(created);
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..5];
        let name = format!("{job}-{suffix}");
        let created = created.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        state.resource_version += 1;
        let object = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": uuid::Uuid::new_v4().to_string(),
                "resourceVersion": state.resource_version.to_string(),
                "creationTimestamp": created,
                "labels": labels,
                "ownerReferences": stored.as_ref().map(|j| json!([{
                    "apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": j.uid,
                    "controller": true, "blockOwnerDeletion": true,
                }])),
            },
            "spec": { "containers": containers, "restartPolicy": "Never" },
            "status": { "phase": "Succeeded", "startTime": created },
        });
        state.pods.push(StoredPod {
            namespace: namespace.to_owned(),
            name: name.clone(),
            job: job.to_owned(),
            object,
            log: log.to_owned(),
            gone_at: None,
        });
        name
    }

    /// Makes every pod deleted from now on take `termination` to go (its containers stopping
    /// within their grace), so a Job deleted in the foreground lingers that long.
    pub fn set_pod_termination(&self, termination: std::time::Duration) {
        lock(&self.state).pod_termination = termination;
    }

    /// The names of the pods of the Job `job` in `namespace` still there, those being deleted
    /// included.
    pub fn pods_of(&self, namespace: &str, job: &str) -> Vec<String> {
        let mut state = lock(&self.state);
        state.sweep();
        state
            .pods
            .iter()
            .filter(|p| p.namespace == namespace && p.job == job)
            .map(|p| p.name.clone())
            .collect()
    }

    /// The permission every authenticated request so far needed, as `verb resource` (`create
    /// jobs`, `get pods/log`, `create selfsubjectaccessreviews`), whether it was granted or not:
    /// what a Role for the backend must consider.
    pub fn permissions_asked(&self) -> BTreeSet<String> {
        lock(&self.state).asked.clone()
    }

    /// Every call received, in order.
    pub fn calls(&self) -> Vec<Call> {
        lock(&self.state).calls.clone()
    }

    /// Every Job, in the order created (those being deleted in the foreground included).
    pub fn jobs(&self) -> Vec<StoredJob> {
        let mut state = lock(&self.state);
        state.sweep();
        state.jobs.clone()
    }

    /// The Job `name` in `namespace`.
    pub fn job(&self, namespace: &str, name: &str) -> Option<StoredJob> {
        self.jobs()
            .into_iter()
            .find(|j| j.namespace == namespace && j.name == name)
    }
}

/// The reason the API server gives with a code.
fn reason(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        408 => "Timeout",
        409 => "AlreadyExists",
        410 => "Gone",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "",
    }
}

/// A `Status` answer, as `metav1.Status` is serialized.
fn status(code: u16, message: String, details: Option<Value>) -> Option<Answer> {
    let mut body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason(code),
        "code": code,
    });
    if let Some(details) = details {
        body["details"] = details;
    }
    Some((code, body.to_string()))
}

fn job_details(name: &str) -> Value {
    json!({ "name": name, "group": "batch", "kind": "jobs" })
}

impl Handler for ApiServer {
    fn flood(&self, request: &FakeRequest) -> Option<Flood> {
        let mut state = lock(&self.0);
        let (method, path_end, flood) = state.flood.clone()?;
        let expected = format!("Bearer {}", state.token);
        let flooded = request.method == method
            && request.path.ends_with(&path_end)
            && request.authorization.as_deref() == Some(expected.as_str());
        if flooded {
            let mut call = Call::received(request, &request.path);
            call.status = flood.status;
            state.calls.push(call);
        }
        flooded.then_some(flood)
    }

    fn answer(&self, request: &FakeRequest) -> Option<Answer> {
        let mut state = lock(&self.0);
        let index = state.calls.len();
        state.calls.push(Call::received(request, &request.path));
        let expected = format!("Bearer {}", state.token);
        let answer = if request.authorization.as_deref() != Some(expected.as_str()) {
            status(401, "Unauthorized".into(), None)
        } else {
            route(&mut state, request)
        };
        if let Some((code, _)) = &answer {
            state.calls[index].status = *code;
        }
        answer
    }
}

fn route(state: &mut State, request: &FakeRequest) -> Option<Answer> {
    state.sweep();
    let segments: Vec<&str> = request.path.trim_matches('/').split('/').collect();
    if let (
        "POST",
        [
            "apis",
            "authorization.k8s.io",
            "v1",
            "selfsubjectaccessreviews",
        ],
    ) = (request.method.as_str(), segments.as_slice())
    {
        // Every authenticated identity may review itself (the built-in system:basic-user).
        state
            .asked
            .insert("create selfsubjectaccessreviews".to_owned());
    }
    let permission = permission_of(request.method.as_str(), &segments);
    if let Some((verb, resource, _)) = &permission {
        state.asked.insert(format!("{verb} {resource}"));
    }
    if let Some((verb, resource, ns)) = permission
        && !allowed(state, verb, &resource)
    {
        return status(
            403,
            format!(
                "{resource} is forbidden: User \"system:serviceaccount:{ns}:cm-scheduler\" \
                 cannot {verb} resource \"{resource}\" in the namespace \"{ns}\""
            ),
            None,
        );
    }
    match (request.method.as_str(), segments.as_slice()) {
        (
            "POST",
            [
                "apis",
                "authorization.k8s.io",
                "v1",
                "selfsubjectaccessreviews",
            ],
        ) => access_review(state, request),
        ("DELETE", ["apis", "batch", "v1", "namespaces", ns, "jobs", name]) => {
            match state
                .jobs
                .iter()
                .position(|j| j.namespace == *ns && j.name == *name)
            {
                Some(at) => delete_job(state, at, request),
                None => status(
                    404,
                    format!("jobs.batch \"{name}\" not found"),
                    Some(job_details(name)),
                ),
            }
        }
        ("POST", ["apis", "batch", "v1", "namespaces", ns, "jobs"]) => create(state, ns, request),
        ("GET", ["apis", "batch", "v1", "namespaces", ns, "jobs"]) => list_jobs(state, ns),
        ("GET", ["api", "v1", "namespaces", ns, "pods"]) => list_pods(state, ns, request),
        ("GET", ["api", "v1", "namespaces", ns, "pods", pod, "log"]) => {
            pod_log(state, ns, pod, request)
        }
        ("GET", ["apis", "batch", "v1", "namespaces", ns, "jobs", name]) => {
            match state
                .jobs
                .iter()
                .find(|j| j.namespace == *ns && j.name == *name)
            {
                Some(job) => Some((200, job.object.to_string())),
                None => status(
                    404,
                    format!("jobs.batch \"{name}\" not found"),
                    Some(job_details(name)),
                ),
            }
        }
        _ => status(
            404,
            "the server could not find the requested resource".into(),
            Some(
                json!({ "causes": [{ "reason": "UnexpectedServerResponse", "message": "404 page not found" }] }),
            ),
        ),
    }
}

/// The propagation policy a delete asks for: the body's `DeleteOptions`, else the query's.
fn propagation_policy(request: &FakeRequest) -> Option<String> {
    serde_json::from_slice::<Value>(&request.body)
        .ok()
        .and_then(|options| options["propagationPolicy"].as_str().map(str::to_owned))
        .or_else(|| request.param("propagationPolicy").map(str::to_owned))
}

/// Deletes the Job at `at` as the request's propagation policy says, and answers it as the
/// server does: the Job as it was, or as it now is while it waits for its pods.
fn delete_job(state: &mut State, at: usize, request: &FakeRequest) -> Option<Answer> {
    let (namespace, name) = (
        state.jobs[at].namespace.clone(),
        state.jobs[at].name.clone(),
    );
    match propagation_policy(request).as_deref() {
        Some("Foreground") => {
            let stamp = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            let meta = &mut state.jobs[at].object["metadata"];
            if meta["deletionTimestamp"].is_null() {
                meta["deletionTimestamp"] = json!(stamp);
                meta["finalizers"] = json!(["foregroundDeletion"]);
            }
            let answer = state.jobs[at].object.to_string();
            // Sweeps the Job too once no pod is left.
            state.delete_pods_of(&namespace, &name);
            Some((200, answer))
        }
        Some("Background") => {
            let job = state.jobs.remove(at);
            state.delete_pods_of(&namespace, &name);
            Some((200, job.object.to_string()))
        }
        Some("Orphan") | None => Some((200, state.jobs.remove(at).object.to_string())),
        Some(other) => status(
            400,
            format!(
                "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \"{other}\""
            ),
            None,
        ),
    }
}

/// The permission a request of the Job or pod routes needs: (verb, resource, namespace).
fn permission_of<'a>(
    method: &str,
    segments: &[&'a str],
) -> Option<(&'static str, String, &'a str)> {
    let (verb, resource, ns) = match (method, segments) {
        ("POST", ["apis", "batch", "v1", "namespaces", ns, "jobs"]) => ("create", "jobs", *ns),
        ("GET", ["apis", "batch", "v1", "namespaces", ns, "jobs"]) => ("list", "jobs", *ns),
        ("GET", ["apis", "batch", "v1", "namespaces", ns, "jobs", _]) => ("get", "jobs", *ns),
        ("DELETE", ["apis", "batch", "v1", "namespaces", ns, "jobs", _]) => ("delete", "jobs", *ns),
        ("GET", ["api", "v1", "namespaces", ns, "pods"]) => ("list", "pods", *ns),
        ("GET", ["api", "v1", "namespaces", ns, "pods", _, "log"]) => ("get", "pods/log", *ns),
        _ => return None,
    };
    Some((verb, resource.to_owned(), ns))
}

/// The Jobs of `namespace` as a `PartialObjectMetadataList`: the metadata-only list the
/// backend's readiness check asks for (it reads no more than that an answer came).
fn list_jobs(state: &State, namespace: &str) -> Option<Answer> {
    let items: Vec<Value> = state
        .jobs
        .iter()
        .filter(|j| j.namespace == namespace)
        .map(|j| {
            json!({
                "apiVersion": "meta.k8s.io/v1",
                "kind": "PartialObjectMetadata",
                "metadata": j.object["metadata"],
            })
        })
        .collect();
    Some((
        200,
        json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadataList",
            "metadata": { "resourceVersion": state.resource_version.to_string() },
            "items": items,
        })
        .to_string(),
    ))
}

/// Whether the token may `verb` the `resource`.
fn allowed(state: &State, verb: &str, resource: &str) -> bool {
    state
        .granted
        .as_ref()
        .is_none_or(|granted| granted.contains(&format!("{verb} {resource}")))
}

/// A SelfSubjectAccessReview: the review as sent, with `status.allowed` as the grants say.
fn access_review(state: &State, request: &FakeRequest) -> Option<Answer> {
    let mut review: Value = match serde_json::from_slice(&request.body) {
        Ok(review) => review,
        Err(e) => {
            return status(
                400,
                format!("the object provided is unrecognized: {e}"),
                None,
            );
        }
    };
    let attributes = &review["spec"]["resourceAttributes"];
    let verb = attributes["verb"].as_str().unwrap_or_default().to_owned();
    let mut resource = attributes["resource"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if let Some(sub) = attributes["subresource"].as_str().filter(|s| !s.is_empty()) {
        resource = format!("{resource}/{sub}");
    }
    let allowed = allowed(state, &verb, &resource);
    review["status"] = json!({ "allowed": allowed });
    Some((201, review.to_string()))
}

/// The pods of `namespace` whose labels match every `key=value` (or `key==value`) term of the
/// request's `labelSelector`, as a `PodList`.
fn list_pods(state: &State, namespace: &str, request: &FakeRequest) -> Option<Answer> {
    let mut terms = Vec::new();
    for term in request
        .param("labelSelector")
        .unwrap_or_default()
        .split(',')
        .filter(|t| !t.is_empty())
    {
        let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) else {
            return status(
                400,
                format!("unable to parse requirement: {term}: only key=value is faked"),
                None,
            );
        };
        terms.push((key.trim(), value.trim()));
    }
    let items: Vec<&Value> = state
        .pods
        .iter()
        .filter(|p| p.namespace == namespace)
        .filter(|p| {
            terms
                .iter()
                .all(|(k, v)| p.object["metadata"]["labels"][*k].as_str() == Some(*v))
        })
        .map(|p| &p.object)
        .collect();
    Some((
        200,
        json!({
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": { "resourceVersion": state.resource_version.to_string() },
            "items": items,
        })
        .to_string(),
    ))
}

/// The log of `pod`: its last `tailLines` lines, then at most `limitBytes` bytes of those from
/// their start (cut back to a character), as text.
fn pod_log(state: &State, namespace: &str, pod: &str, request: &FakeRequest) -> Option<Answer> {
    let Some(found) = state
        .pods
        .iter()
        .find(|p| p.namespace == namespace && p.name == pod)
    else {
        return status(
            404,
            format!("pods \"{pod}\" not found"),
            Some(json!({ "name": pod, "kind": "pods" })),
        );
    };
    if let Some(container) = request.param("container") {
        let known = found.object["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["name"] == container);
        if !known {
            return status(
                400,
                format!("container {container} is not valid for pod {pod}"),
                None,
            );
        }
    }
    let mut log = found.log.as_str();
    if let Some(lines) = request
        .param("tailLines")
        .and_then(|n| n.parse::<usize>().ok())
    {
        let starts: Vec<usize> = std::iter::once(0)
            .chain(log.match_indices('\n').map(|(at, _)| at + 1))
            .filter(|&at| at < log.len())
            .collect();
        if lines == 0 {
            log = "";
        } else if starts.len() > lines {
            log = &log[starts[starts.len() - lines]..];
        }
    }
    if let Some(limit) = request
        .param("limitBytes")
        .and_then(|n| n.parse::<usize>().ok())
        && log.len() > limit
    {
        let mut end = limit;
        while !log.is_char_boundary(end) {
            end -= 1;
        }
        log = &log[..end];
    }
    Some((200, log.to_owned()))
}

fn create(state: &mut State, namespace: &str, request: &FakeRequest) -> Option<Answer> {
    let mut job: Value = match serde_json::from_slice(&request.body) {
        Ok(job) => job,
        Err(e) => {
            return status(
                400,
                format!("the object provided is unrecognized: {e}"),
                None,
            );
        }
    };
    if job["kind"] != "Job" || job["apiVersion"] != "batch/v1" {
        return status(
            400,
            format!(
                "the API version in the data ({}) does not match the expected API version (batch/v1)",
                job["apiVersion"]
            ),
            None,
        );
    }
    if let Some(ns) = job["metadata"]["namespace"].as_str()
        && ns != namespace
    {
        return status(
            400,
            "the namespace of the provided object does not match the namespace sent on the request"
                .into(),
            None,
        );
    }
    if !state.namespaces.contains(namespace) {
        return status(
            404,
            format!("namespaces \"{namespace}\" not found"),
            Some(json!({ "name": namespace, "kind": "namespaces" })),
        );
    }
    let name = job["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if let Some(invalid) = invalid(&job, &name) {
        return status(
            422,
            format!("Job.batch \"{name}\" is invalid: {invalid}"),
            Some(json!({ "name": name, "group": "batch", "kind": "Job",
                         "causes": [{ "reason": "FieldValueInvalid", "message": invalid }] })),
        );
    }
    let fault = state.create_faults.pop_front();
    match &fault {
        Some(CreateFault::Fail) => {
            return status(
                500,
                "Internal error occurred: injected failure".into(),
                Some(json!({ "causes": [{ "message": "injected failure" }] })),
            );
        }
        Some(CreateFault::Refuse { code, message }) => {
            let message = if *code == 403 {
                format!("jobs.batch \"{name}\" is forbidden: {message}")
            } else {
                message.clone()
            };
            return status(*code, message, Some(job_details(&name)));
        }
        Some(CreateFault::StallBeforeCreate) => return None,
        Some(CreateFault::StallAfterCreate) | None => {}
    }
    if state
        .jobs
        .iter()
        .any(|j| j.namespace == namespace && j.name == name)
    {
        return status(
            409,
            format!("jobs.batch \"{name}\" already exists"),
            Some(job_details(&name)),
        );
    }
    let uid = uuid::Uuid::new_v4().to_string();
    state.resource_version += 1;
    // What the API server's defaulting and the Job strategy add on create.
    let meta = &mut job["metadata"];
    meta["namespace"] = json!(namespace);
    meta["uid"] = json!(uid);
    meta["resourceVersion"] = json!(state.resource_version.to_string());
    meta["generation"] = json!(1);
    meta["creationTimestamp"] =
        json!(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    let spec = &mut job["spec"];
    spec["selector"] = json!({ "matchLabels": { "batch.kubernetes.io/controller-uid": uid } });
    for (field, default) in [
        ("parallelism", json!(1)),
        ("completions", json!(1)),
        ("completionMode", json!("NonIndexed")),
        ("suspend", json!(false)),
        ("podReplacementPolicy", json!("TerminatingOrFailed")),
    ] {
        if spec[field].is_null() {
            spec[field] = default;
        }
    }
    let template_labels = &mut spec["template"]["metadata"]["labels"];
    if !template_labels.is_object() {
        *template_labels = json!({});
    }
    for key in ["batch.kubernetes.io/controller-uid", "controller-uid"] {
        template_labels[key] = json!(uid);
    }
    for key in ["batch.kubernetes.io/job-name", "job-name"] {
        template_labels[key] = json!(name);
    }
    job["status"] = json!({});
    let answer = job.to_string();
    state.jobs.push(StoredJob {
        namespace: namespace.to_owned(),
        name,
        uid,
        object: job,
    });
    match fault {
        Some(CreateFault::StallAfterCreate) => None,
        _ => Some((201, answer)),
    }
}

/// What the API server's validation would refuse in `job`, as its message says it.
fn invalid(job: &Value, name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("metadata.name: Required value: name or generateName is required".into());
    }
    if !dns_label(name) {
        return Some(format!(
            "metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 label must consist \
             of lower case alphanumeric characters or '-', and must start and end with an \
             alphanumeric character, and be at most 63 characters"
        ));
    }
    for (field, labels) in [
        ("metadata.labels", &job["metadata"]["labels"]),
        (
            "spec.template.metadata.labels",
            &job["spec"]["template"]["metadata"]["labels"],
        ),
    ] {
        for (key, value) in labels.as_object().into_iter().flatten() {
            let value = value.as_str().unwrap_or("\u{0}");
            if !label_value(value) {
                return Some(format!(
                    "{field}: Invalid value: \"{value}\": a valid label must be an empty string \
                     or consist of alphanumeric characters, '-', '_' or '.', and must start and \
                     end with an alphanumeric character (key {key})"
                ));
            }
        }
    }
    let pod = &job["spec"]["template"]["spec"];
    match pod["restartPolicy"].as_str() {
        Some("Never" | "OnFailure") => {}
        other => {
            return Some(format!(
                "spec.template.spec.restartPolicy: Unsupported value: {}: supported values: \
                 \"OnFailure\", \"Never\"",
                other.map_or("\"\"".to_owned(), |p| format!("\"{p}\""))
            ));
        }
    }
    let containers = pod["containers"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if containers.is_empty() {
        return Some("spec.template.spec.containers: Required value".into());
    }
    for (i, c) in containers.iter().enumerate() {
        if c["name"].as_str().is_none_or(str::is_empty) {
            return Some(format!(
                "spec.template.spec.containers[{i}].name: Required value"
            ));
        }
        if c["image"].as_str().is_none_or(str::is_empty) {
            return Some(format!(
                "spec.template.spec.containers[{i}].image: Required value"
            ));
        }
    }
    None
}

fn dns_label(name: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|&c| alnum(c) || c == b'-')
        && alnum(b[0])
        && alnum(b[b.len() - 1])
}

fn label_value(value: &str) -> bool {
    let b = value.as_bytes();
    b.is_empty()
        || (b.len() <= 63
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric())
}
