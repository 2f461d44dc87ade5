//! The Docker mission backend: one container per occurrence, named by its idempotency key.
//!
//! A dispatch creates the container `cm-<routine>-<micros>` and starts it. Docker refuses a
//! second container of one name (409 Conflict), so a retry of the occurrence after a crash, or a
//! second scheduler, cannot launch a second mission: on 409 the backend inspects the container,
//! starts it if it was created but never started (a crash between create and start), and
//! reports the occurrence as already launched. A container that already ran is never started
//! again (a real engine answers the start of an exited container by running it once more). An
//! image the engine lacks is pulled, within the dispatch's deadline, and the create tried again.
//!
//! Faults are handled as the Kubernetes backend handles its API's: connection failures, 5xx,
//! 408 and 429 are tried again with backoff until the dispatch's deadline, then fail with the
//! last answer, naming the engine's address and the cause. A refusal (any other 4xx, or a 500
//! the engine gives for a setting that cannot work: an unknown user, a missing executable) fails
//! at once as `rejected`. A container the engine created but refused to start is removed before
//! the dispatch fails, so its name is not taken for ever.
//!
//! Every request carries the API version agreed with the engine (`/v1.41/containers/create`),
//! so an engine older than the client reads it at its own version.
//!
//! The engine is the one `DOCKER_HOST` names (`unix://` or `tcp://`), or the default socket. It
//! need not answer when the backend is made: the scheduler waits for it ([`MissionRuntime::ready`]).
//!
//! An ended run's report ([`MissionRuntime::report`]) is the container's `State.StartedAt` and
//! `FinishedAt` and the tail of its logs (stdout and stderr, as the engine's logging driver keeps
//! them), read as a tail of lines ([`TAIL_LINES`]) and cut to the last 16 KiB. With the operator's
//! `auto_remove` the engine removes the container as it exits, its logs with it: the report of
//! such a run, asked after the watch saw it end, is most often empty (no output, no times),
//! which is no error. A logging driver that cannot be read back (`none`, `syslog`) keeps no
//! output either.
//!
//! The logs are read up to `FETCH_LIMIT` bytes, a frame at a time (bollard takes each frame
//! whole, at the length the engine declares). Every other reply (inspect, create, an error's
//! text) bollard reads whole before it parses it, and it lets no caller wrap a reply's body (its
//! custom transport must hand back hyper's own body type). So the backend connects to the
//! engine itself (`transport.rs`): bollard over a hyper client of cm's, one request and its
//! reply per connection, whose reads fail past [`crate::MAX_REPLY_BYTES`] (16 MiB; a frame of
//! the logs declaring more is cut there too). A reply past it fails the call with an error
//! naming the bound, which is retried and reported as any failed call: a launch whose create
//! answer was cut is unconfirmed, and no run is judged by a part of a reply. An image pull's
//! progress stream counts as one reply too: one whose progress lines pass the bound is cut and
//! tried again within the deadline. Time bounds every call as well: `CLIENT_TIMEOUT_SECS` for
//! an answer's head, and the dispatch's deadline.

use std::collections::HashMap;

use async_trait::async_trait;
use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, ContainerStateStatusEnum, HostConfig,
};
use bollard::query_parameters::{
    CreateContainerOptions, CreateImageOptions, LogsOptions, RemoveContainerOptions,
    StopContainerOptions,
};
use cm_domain::{ErrorText, RunState};
use futures_util::StreamExt as _;
use tokio::time::Instant;

mod transport;

use crate::bounded::too_large;
use crate::mission::{HostResolver, Launch, MissionConfig, SystemResolver};
use crate::output::{FETCH_LIMIT, TAIL_LINES, kept_output};
use crate::retry::{
    FIRST_BACKOFF, MAX_BACKOFF, Retried, never_connected, unconfirmed, until_deadline,
};
use crate::runtime::{MissionRuntime, RunRef, RunReport};
use crate::{Dispatch, DispatchError, Dispatcher, Receipt};

/// The engine used when `DOCKER_HOST` is not set, as the docker CLI does.
const DEFAULT_DOCKER_HOST: &str = "unix:///var/run/docker.sock";

/// How long bollard waits for one answer, in seconds; every call is bounded by the dispatch's
/// deadline as well.
const CLIENT_TIMEOUT_SECS: u64 = 120;

/// Launches each mission as a Docker container.
#[derive(Debug, Clone)]
pub struct DockerDispatcher {
    /// The engine's address as configured, for errors (it carries no credentials).
    host: String,
    /// The client at the API version both it and the engine speak, made on first success.
    client: std::sync::Arc<tokio::sync::OnceCell<Docker>>,
    image: String,
    config: MissionConfig,
    resolver: std::sync::Arc<dyn HostResolver>,
}

/// Why the Docker backend could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("cannot use the Docker engine at {host}: {reason}")]
pub struct DockerSetupError {
    host: String,
    reason: String,
}

impl DockerDispatcher {
    /// A backend talking to the engine `DOCKER_HOST` names (or the default socket), running
    /// `image` with the operator's `config`. It does not connect until it is used.
    pub fn from_env(image: String, config: MissionConfig) -> Result<Self, DockerSetupError> {
        match std::env::var("DOCKER_HOST") {
            Ok(host) => DockerDispatcher::connect(&host, image, config),
            Err(_) => DockerDispatcher::connect(DEFAULT_DOCKER_HOST, image, config),
        }
    }

    /// A backend talking to the engine at `host` (`unix:///var/run/docker.sock`,
    /// `tcp://127.0.0.1:2375`). It does not connect until it is used, so an engine that is down
    /// (or a socket not there yet) is waited for rather than refused. Only an address of another
    /// scheme is refused.
    pub fn connect(
        host: &str,
        image: String,
        config: MissionConfig,
    ) -> Result<Self, DockerSetupError> {
        let supported = ["unix://", "tcp://", "http://"];
        if !supported.iter().any(|scheme| host.starts_with(scheme)) {
            return Err(DockerSetupError {
                host: host.to_owned(),
                reason: "the address must start with unix://, tcp:// or http://".into(),
            });
        }
        Ok(DockerDispatcher {
            host: host.to_owned(),
            client: std::sync::Arc::new(tokio::sync::OnceCell::new()),
            image,
            config,
            resolver: std::sync::Arc::new(SystemResolver),
        })
    }

    /// The same backend resolving repository hosts with `resolver` at dispatch
    /// ([`crate::mission::check_resolved`]) instead of the system's.
    pub fn with_resolver(mut self, resolver: std::sync::Arc<dyn HostResolver>) -> Self {
        self.resolver = resolver;
        self
    }

    /// The engine's address.
    pub fn host(&self) -> &str {
        &self.host
    }

    fn container(&self, launch: &Launch) -> ContainerCreateBody {
        let docker = &self.config.docker;
        ContainerCreateBody {
            image: Some(self.image.clone()),
            cmd: (!self.config.command.is_empty()).then(|| self.config.command.clone()),
            user: self.config.user.clone(),
            env: Some(launch.env_strings()),
            labels: Some(
                launch
                    .labels
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<HashMap<_, _>>(),
            ),
            host_config: Some(HostConfig {
                network_mode: docker.network.clone(),
                memory: docker.memory_bytes,
                nano_cpus: docker.nano_cpus,
                auto_remove: Some(docker.auto_remove),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The client, at an API version the engine speaks (an older engine refuses a newer
    /// client's requests), sending that version in every request's path.
    async fn client(&self) -> Result<&Docker, DockerError> {
        self.client
            .get_or_try_init(|| async {
                let docker = transport::connect(&self.host, CLIENT_TIMEOUT_SECS)?
                    .negotiate_version()
                    .await?;
                let version = docker.client_version();
                let prefix = format!("/v{}.{}", version.major_version, version.minor_version);
                Ok(docker.with_request_modifier(move |request| versioned(request, &prefix)))
            })
            .await
    }

    /// Runs `call` until it answers or fails for good, or the deadline passes: a refusal fails
    /// at once; a connection failure, 5xx, 408 or 429 is tried again after a pause.
    async fn retrying<T, F, Fut>(
        &self,
        deadline: Instant,
        what: &str,
        call: F,
    ) -> Result<T, DispatchError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, DockerError>>,
    {
        until_deadline(deadline, is_refusal, left_no_effect, call)
            .await
            .map_err(|failed| match failed {
                Retried::Refused(e) => {
                    DispatchError::Rejected(format!("docker {what}: {}", self.describe(&e)))
                }
                Retried::PastDeadline {
                    last,
                    may_have_taken_effect,
                } => {
                    let past = self.past_deadline(what, last.map(|e| self.describe(&e)));
                    if may_have_taken_effect {
                        unconfirmed(past)
                    } else {
                        past
                    }
                }
            })
    }

    fn past_deadline(&self, what: &str, last: Option<String>) -> DispatchError {
        DispatchError::Unavailable(match last {
            Some(last) => {
                format!("the Docker engine did not {what} before the deadline; last answer: {last}")
            }
            None => format!(
                "the Docker engine at {} did not {what} before the deadline",
                self.host
            ),
        })
    }

    /// An error as the operator reads it: the engine's message and status for an answer; the
    /// address and the deepest cause when the engine could not be reached.
    fn describe(&self, e: &DockerError) -> String {
        if let Some(cut) = too_large(e) {
            return format!("{cut} (at {})", self.host);
        }
        match e {
            DockerError::DockerResponseServerError {
                status_code,
                message,
            } => format!("{message} ({status_code})"),
            DockerError::SocketNotFoundError(path) => format!(
                "cannot reach the Docker engine at {}: no socket at {path}",
                self.host
            ),
            other => format!(
                "cannot reach the Docker engine at {}: {}",
                self.host,
                root_cause(other)
            ),
        }
    }

    async fn launch(&self, launch: &Launch, deadline: Instant) -> Result<Receipt, DispatchError> {
        let options = || CreateContainerOptions {
            name: Some(launch.name.clone()),
            ..Default::default()
        };
        let what = format!("create container {}", launch.name);
        let mut pulled = false;
        let created = loop {
            let created = self
                .retrying(deadline, &what, || async {
                    let docker = self.client().await?;
                    match docker
                        .create_container(Some(options()), self.container(launch))
                        .await
                    {
                        Ok(created) => Ok(Created::Id(created.id)),
                        Err(e) if status(&e) == Some(409) => Ok(Created::Exists),
                        Err(e) if no_such_image(&e) => Ok(Created::NoImage),
                        Err(e) => Err(e),
                    }
                })
                .await?;
            match created {
                Created::NoImage if !pulled => {
                    self.pull(deadline).await?;
                    pulled = true;
                }
                Created::NoImage => {
                    return Err(DispatchError::Rejected(format!(
                        "docker {what}: the engine has no image {} even after pulling it",
                        self.image
                    )));
                }
                other => break other,
            }
        };
        match created {
            Created::Id(id) => {
                // The container exists from here on: a start that goes unanswered leaves the
                // occurrence to the next attempt, which finds it by name and starts it.
                self.start(&id, &launch.name, deadline)
                    .await
                    .map_err(unconfirmed)?;
                Ok(Receipt {
                    duplicate: false,
                    detail: detail(&id, &launch.name),
                })
            }
            _ => self.already_created(&launch.name, deadline).await,
        }
    }

    /// Creates the container, or finds the one an earlier attempt created (started if it never
    /// was). A real engine reserves a name before the container can be inspected: a create
    /// that meets a name being created by a concurrent attempt gets 409, then 404 from the
    /// inspect; it tries again after a pause until one of the two answers.
    async fn launch_or_find(
        &self,
        launch: &Launch,
        deadline: Instant,
    ) -> Result<Receipt, DispatchError> {
        let mut backoff = FIRST_BACKOFF;
        loop {
            match self.launch(launch, deadline).await {
                Err(DispatchError::Rejected(text)) if text.contains(VANISHED) => {
                    if Instant::now() + backoff >= deadline {
                        // The name is taken: a container holds it, or is being created.
                        return Err(DispatchError::Unconfirmed(text));
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                other => return other,
            }
        }
    }

    async fn pull(&self, deadline: Instant) -> Result<(), DispatchError> {
        let options = || CreateImageOptions {
            from_image: Some(self.image.clone()),
            ..Default::default()
        };
        self.retrying(deadline, &format!("pull {}", self.image), || async {
            let docker = self.client().await?;
            let mut progress = docker.create_image(Some(options()), None, None);
            while let Some(step) = progress.next().await {
                step?;
            }
            Ok(())
        })
        .await
    }

    /// The container exists: an earlier attempt created it. Start it if it never started.
    async fn already_created(
        &self,
        name: &str,
        deadline: Instant,
    ) -> Result<Receipt, DispatchError> {
        let Some(found) = self.inspect(name, deadline).await.map_err(unconfirmed)? else {
            return Err(DispatchError::Rejected(format!(
                "docker: the container {name} {VANISHED}"
            )));
        };
        let id = found.id.clone().unwrap_or_else(|| name.to_owned());
        let never_started = found
            .state
            .and_then(|s| s.status)
            .is_some_and(|s| s == ContainerStateStatusEnum::CREATED);
        if never_started {
            self.start(&id, name, deadline).await.map_err(unconfirmed)?;
        }
        Ok(Receipt {
            duplicate: true,
            detail: detail(&id, name),
        })
    }

    /// Starts the created container `id`. One the engine refuses to start is removed, so the
    /// occurrence, which then settles `failed`, leaves no container holding its name.
    async fn start(&self, id: &str, name: &str, deadline: Instant) -> Result<(), DispatchError> {
        // 304 (already started, by a concurrent attempt or a start whose answer was lost) is
        // success to the client too.
        let started = self
            .retrying(deadline, &format!("start container {name}"), || async {
                self.client().await?.start_container(id, None).await
            })
            .await;
        match started {
            Err(DispatchError::Rejected(refused)) => {
                let removed = self
                    .retrying(deadline, &format!("remove container {name}"), || async {
                        let options = RemoveContainerOptions {
                            force: true,
                            ..Default::default()
                        };
                        match self
                            .client()
                            .await?
                            .remove_container(id, Some(options))
                            .await
                        {
                            Err(e) if status(&e) == Some(404) => Ok(()),
                            other => other,
                        }
                    })
                    .await;
                Err(DispatchError::Rejected(match removed {
                    Ok(()) => format!("{refused}; the container was removed"),
                    Err(e) => format!("{refused}; removing the container failed too: {e}"),
                }))
            }
            other => other,
        }
    }

    async fn inspect(
        &self,
        name: &str,
        deadline: Instant,
    ) -> Result<Option<ContainerInspectResponse>, DispatchError> {
        self.retrying(deadline, &format!("inspect container {name}"), || async {
            match self.client().await?.inspect_container(name, None).await {
                Ok(found) => Ok(Some(found)),
                Err(e) if status(&e) == Some(404) => Ok(None),
                Err(e) => Err(e),
            }
        })
        .await
    }
}

impl DockerDispatcher {
    /// The end of the container `name`'s logs, stdout and stderr, as kept; `None` when the
    /// container is gone or its logging driver cannot be read back. Each try asks for a tail of
    /// lines and reads at most [`FETCH_LIMIT`] bytes of it; a tail that does not fit is asked
    /// again with fewer lines, so the answer ends at the logs' end.
    async fn log_tail(
        &self,
        name: &str,
        deadline: Instant,
    ) -> Result<Option<String>, DispatchError> {
        self.retrying(
            deadline,
            &format!("read the logs of container {name}"),
            || async {
                let docker = self.client().await?;
                let mut end = Vec::new();
                for lines in TAIL_LINES {
                    let options = LogsOptions {
                        stdout: true,
                        stderr: true,
                        tail: lines.to_string(),
                        ..Default::default()
                    };
                    let mut logs = docker.logs(name, Some(options));
                    end.clear();
                    let mut fits = true;
                    while let Some(chunk) = logs.next().await {
                        match chunk {
                            Ok(chunk) => end.extend_from_slice(chunk.as_ref()),
                            Err(e) if status(&e) == Some(404) || unreadable_logs(&e) => {
                                return Ok(None);
                            }
                            Err(e) => return Err(e),
                        }
                        if end.len() > FETCH_LIMIT {
                            fits = false;
                            break;
                        }
                    }
                    if fits {
                        break;
                    }
                }
                // A tail of lines starts at a line start; one line longer than all that is read
                // is kept from where the read began.
                Ok(Some(kept_output(&end, true)))
            },
        )
        .await
    }
}

/// Whether the engine refused the logs because its logging driver keeps none it can read back
/// (`none`, `syslog`, `fluentd`): the run left no output to read, which is no failure.
fn unreadable_logs(e: &DockerError) -> bool {
    matches!(e, DockerError::DockerResponseServerError { status_code, message }
        if *status_code == 501 || message.contains("does not support reading"))
}

/// A time of a container's state, as the engine writes it (RFC 3339 with nanoseconds); `None`
/// for the zero time it writes for a start or an end that has not happened
/// (`0001-01-01T00:00:00Z`).
fn engine_time(text: Option<&str>) -> Option<chrono::DateTime<chrono::Utc>> {
    let at = chrono::DateTime::parse_from_rfc3339(text?).ok()?;
    (at.timestamp() > 0).then(|| at.with_timezone(&chrono::Utc))
}

/// Whether a failed call certainly did nothing at the engine: it answered with an error (a
/// create answered 500 made no container), or the connection was never made.
fn left_no_effect(e: &DockerError) -> bool {
    matches!(
        e,
        DockerError::DockerResponseServerError { .. } | DockerError::SocketNotFoundError(_)
    ) || never_connected(e)
}

/// Why a create that found the name taken could not inspect the container: it is being created
/// by a concurrent attempt, or was removed in between.
const VANISHED: &str = "was in use by name but could not be inspected";

/// What a create answered.
enum Created {
    /// A new container, by id.
    Id(String),
    /// The name is taken: an earlier attempt created it.
    Exists,
    /// The engine lacks the image.
    NoImage,
}

/// `request` with the API version in front of its path (`/containers/create` becomes
/// `/v1.41/containers/create`). bollard builds the versioned path, then joins the request's
/// absolute path onto it, which drops the version; this puts it back once.
fn versioned(request: bollard::BollardRequest, prefix: &str) -> bollard::BollardRequest {
    let (mut parts, body) = request.into_parts();
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or("/");
    if !path_and_query.starts_with("/v1.") {
        let mut uri = parts.uri.clone().into_parts();
        if let Ok(versioned) = format!("{prefix}{path_and_query}").parse() {
            uri.path_and_query = Some(versioned);
            if let Ok(uri) = http::Uri::from_parts(uri) {
                parts.uri = uri;
            }
        }
    }
    bollard::BollardRequest::from_parts(parts, body)
}

/// The innermost cause of `e` (`Connection refused (os error 111)`), which is what an operator
/// can act on; bollard's own text for a failed connection names only the client.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

fn detail(id: &str, name: &str) -> String {
    let short = id.get(..12).unwrap_or(id);
    format!("container {short} {name}")
}

fn status(e: &DockerError) -> Option<u16> {
    match e {
        DockerError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

fn no_such_image(e: &DockerError) -> bool {
    matches!(e, DockerError::DockerResponseServerError { status_code: 404, message }
        if message.starts_with("No such image"))
}

/// Texts of a 500 the engine gives for a setting that can never work: trying again cannot
/// change the answer, so the dispatch is refused (`rejected`), not retried to its deadline.
const PERMANENT_ENGINE_ERRORS: &[&str] = &[
    "unable to find user",
    "no matching entries in passwd file",
    "executable file not found",
    "invalid reference format",
    "no such file or directory: unknown",
    "permission denied: unknown",
];

/// An answer that trying again cannot change: a 4xx but 408 and 429, or a 500 for a setting
/// that cannot work.
fn is_refusal(e: &DockerError) -> bool {
    match e {
        DockerError::DockerResponseServerError {
            status_code,
            message,
        } => match *status_code {
            408 | 429 => false,
            400..=499 => true,
            _ => {
                let message = message.to_lowercase();
                PERMANENT_ENGINE_ERRORS.iter().any(|m| message.contains(m))
            }
        },
        _ => false,
    }
}

/// The run a container's inspection shows.
fn run_state(found: &ContainerInspectResponse) -> RunState {
    use ContainerStateStatusEnum as S;
    let Some(state) = &found.state else {
        return RunState::Running;
    };
    match state.status {
        Some(S::EXITED) => {
            let code = i32::try_from(state.exit_code.unwrap_or(-1)).unwrap_or(-1);
            let mut detail = Vec::new();
            if state.oom_killed == Some(true) {
                detail.push("OOMKilled".to_owned());
            }
            if let Some(error) = state.error.as_deref().filter(|e| !e.is_empty()) {
                detail.push(error.to_owned());
            }
            RunState::exited(code, &detail.join("; "))
        }
        Some(S::DEAD) => RunState::Failed {
            exit_code: state.exit_code.and_then(|c| i32::try_from(c).ok()),
            reason: ErrorText::new(format!(
                "the container is dead{}",
                state
                    .error
                    .as_deref()
                    .filter(|e| !e.is_empty())
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            )),
        },
        // Created (started and restarted by the engine since), running, restarting, paused,
        // being removed: not ended yet.
        _ => RunState::Running,
    }
}

#[async_trait]
impl Dispatcher for DockerDispatcher {
    async fn dispatch(&self, dispatch: &Dispatch) -> Result<Receipt, DispatchError> {
        let policy = self.config.policy().map_err(DispatchError::Rejected)?;
        let launch = Launch::checked(dispatch, &policy, &*self.resolver).await?;
        let deadline = Instant::from_std(dispatch.deadline);
        match tokio::time::timeout_at(deadline, self.launch_or_find(&launch, deadline)).await {
            Ok(result) => result,
            Err(_) => Err(DispatchError::Unconfirmed(format!(
                "the Docker engine at {} did not finish launching {} before the deadline",
                self.host, launch.name
            ))),
        }
    }
}

#[async_trait]
impl MissionRuntime for DockerDispatcher {
    async fn ready(&self) -> Result<(), String> {
        let docker = self.client().await.map_err(|e| self.describe(&e))?;
        docker.ping().await.map_err(|e| self.describe(&e))?;
        Ok(())
    }

    async fn observe(
        &self,
        run: &RunRef,
        deadline: std::time::Instant,
    ) -> Result<RunState, DispatchError> {
        let deadline = Instant::from_std(deadline);
        Ok(match self.inspect(&run.name, deadline).await? {
            Some(found) => run_state(&found),
            None => RunState::Lost {
                reason: ErrorText::new(format!(
                    "the Docker engine at {} has no container {}",
                    self.host, run.name
                )),
            },
        })
    }

    async fn stop(&self, run: &RunRef, deadline: std::time::Instant) -> Result<(), DispatchError> {
        let deadline = Instant::from_std(deadline);
        let grace = self.config.docker.stop_grace_seconds;
        self.retrying(
            deadline,
            &format!("stop container {}", run.name),
            || async {
                let options = StopContainerOptions {
                    t: Some(grace),
                    ..Default::default()
                };
                match self
                    .client()
                    .await?
                    .stop_container(&run.name, Some(options))
                    .await
                {
                    // Gone already, or not running (304): stopped.
                    Err(e) if matches!(status(&e), Some(404 | 304)) => Ok(()),
                    other => other,
                }
            },
        )
        .await
    }

    /// The container's start and end times from inspect and the tail of its logs; a container
    /// gone (removed by `auto_remove`, or by someone else) reports nothing, and is no error.
    async fn report(
        &self,
        run: &RunRef,
        deadline: std::time::Instant,
    ) -> Result<RunReport, DispatchError> {
        let deadline = Instant::from_std(deadline);
        let Some(found) = self.inspect(&run.name, deadline).await? else {
            return Ok(RunReport::default());
        };
        let state = found.state.unwrap_or_default();
        let finished_at = engine_time(state.finished_at.as_deref());
        // The engine records `StartedAt` once the runtime's start returns, and a process that
        // exits at once may have ended before that: it began by its end at the latest.
        let started_at = engine_time(state.started_at.as_deref())
            .map(|started| finished_at.map_or(started, |finished| started.min(finished)));
        Ok(RunReport {
            output: self.log_tail(&run.name, deadline).await?,
            started_at,
            finished_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(status_code: u16, message: &str) -> DockerError {
        DockerError::DockerResponseServerError {
            status_code,
            message: message.into(),
        }
    }

    #[test]
    fn refusals_fail_at_once_and_the_rest_is_retried() {
        let refused = [
            server(400, "invalid reference format"),
            server(404, "network missions not found"),
            server(
                500,
                "unable to find user nobody2: no matching entries in passwd file",
            ),
            server(
                400,
                "OCI runtime create failed: exec: \"/no\": stat /no: no such file or directory: unknown",
            ),
        ];
        for e in &refused {
            assert!(is_refusal(e), "{e}");
        }
        let retried = [
            server(
                500,
                "Get \"https://registry-1.docker.io/v2/\": dial tcp: i/o timeout",
            ),
            server(503, "the engine is shutting down"),
            server(408, "timeout"),
            server(429, "too many requests"),
            DockerError::SocketNotFoundError("/tmp/none.sock".into()),
        ];
        for e in &retried {
            assert!(!is_refusal(e), "{e}");
        }
    }

    #[test]
    fn the_version_goes_in_front_of_the_path_once() {
        let request = |uri: &str| {
            bollard::BollardRequest::from_parts(
                http::Request::builder()
                    .uri(uri)
                    .body(())
                    .unwrap()
                    .into_parts()
                    .0,
                bollard::body_full(Default::default()),
            )
        };
        let path = |r: bollard::BollardRequest| r.uri().to_string();
        assert_eq!(
            path(versioned(
                request("http://localhost/containers/create?name=cm-1"),
                "/v1.41"
            )),
            "http://localhost/v1.41/containers/create?name=cm-1"
        );
        assert_eq!(
            path(versioned(request("http://localhost/v1.47/_ping"), "/v1.41")),
            "http://localhost/v1.47/_ping"
        );
    }

    #[test]
    fn an_address_of_another_scheme_is_refused_and_a_missing_socket_is_not() {
        let config = MissionConfig::default;
        assert!(DockerDispatcher::connect("unix:///no/such.sock", "i".into(), config()).is_ok());
        let err = DockerDispatcher::connect("ftp://h", "i".into(), config()).unwrap_err();
        assert!(err.to_string().contains("ftp://h"), "{err}");
    }
}
