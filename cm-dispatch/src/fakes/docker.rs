//! A fake of the Docker Engine API: the routes the Docker backend uses, over TCP.
//!
//! It answers as the Engine API documents (v1.43 and later): `POST /containers/create` 201 with
//! `{"Id", "Warnings"}`, 404 `No such image: …` when the image is absent, 409 `Conflict. The
//! container name "/…" is already in use …` for a taken name; `POST /containers/{id}/start` 204,
//! 304 when already started, 404 `No such container: …`; `GET /containers/{id}/json`;
//! `POST /containers/{id}/stop` 204, 304 when not running; `DELETE /containers/{id}` 204;
//! `POST /images/create` streaming pull progress; `GET /images/{name}/json`;
//! `GET /containers/{id}/logs` with `stdout`, `stderr` and `tail`, in the engine's multiplexed
//! stream format (an 8-byte header of stream and length before each frame) as for a container
//! without a TTY. Paths may carry the `/v1.NN` version prefix clients send. A container's
//! `State.StartedAt` and `FinishedAt` are the times it was started and ended, by this clock.
//!
//! Tests set it up with [`FakeDocker::start`] (point `DOCKER_HOST` at [`FakeDocker::host`]),
//! make starts fail or stall with [`FakeDocker::fault_next_start`], give a container output with
//! [`FakeDocker::print`] and end it with [`FakeDocker::exit`], and read what happened with
//! [`FakeDocker::calls`] and [`FakeDocker::containers`]. [`FakeDocker::flood`] answers the
//! calls of one route with a body that does not end.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::{Answer, Call, FakeRequest, Flood, FloodRecord, Handler, Server, lock};

/// What the next `start` of a container does instead of starting it normally.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartFault {
    /// Answer 500 and leave the container created, never started: a fault of the engine, which
    /// the backend tries again.
    Fail,
    /// Answer 400 with this message, as the engine refusing the start of a container whose
    /// settings cannot work (a missing command).
    Refuse(String),
    /// Never answer, and leave the container created: a scheduler killed now died between
    /// create and start.
    StallBeforeStart,
    /// Start the container, then never answer: a scheduler killed now died after the start and
    /// before it could settle.
    StallAfterStart,
}

/// Which of a container's streams a text was written to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogStream {
    /// Standard output (stream 1 of the multiplexed format).
    Stdout,
    /// Standard error (stream 2).
    Stderr,
}

/// A container the fake holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    /// 64 hex digits.
    pub id: String,
    /// Its name, without Docker's leading `/`.
    pub name: String,
    /// The image it was created from.
    pub image: String,
    /// The command it was created with.
    pub cmd: Vec<String>,
    /// The user it runs as.
    pub user: Option<String>,
    /// Its environment, `NAME=value`.
    pub env: Vec<String>,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its `HostConfig` as sent.
    pub host_config: Value,
    /// How many times it was started (a real engine starts a container once until it stops).
    pub starts: usize,
    /// Its exit code once it ended ([`FakeDocker::exit`]) or was stopped (137).
    pub exit_code: Option<i64>,
    /// When it was started.
    pub started_at: Option<chrono::DateTime<chrono::Utc>>,
    /// When it ended.
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
    /// What it printed ([`FakeDocker::print`]), in order.
    pub output: Vec<(LogStream, String)>,
}

impl Container {
    /// The value of the environment variable `name`.
    pub fn env_var(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
    }
}

#[derive(Debug, Default)]
struct State {
    images: BTreeSet<String>,
    containers: Vec<Container>,
    calls: Vec<Call>,
    start_faults: VecDeque<StartFault>,
    /// How many of the next calls answer 503, as an engine restarting.
    unavailable: usize,
    pulls: usize,
    /// What every stop answers instead of stopping, while set: an engine whose authorization
    /// plugin refuses the caller the stop.
    refused_stops: Option<(u16, String)>,
    /// The calls answered with a flood instead: method, the path's end, and the flood.
    flood: Option<(String, String, Flood)>,
}

/// The fake engine; it stops when dropped.
pub struct FakeDocker {
    state: Arc<Mutex<State>>,
    server: Server,
}

struct Engine(Arc<Mutex<State>>);

impl FakeDocker {
    /// A fake engine on a free local port, holding `images`.
    pub fn start(images: &[&str]) -> FakeDocker {
        let state = Arc::new(Mutex::new(State {
            images: images.iter().map(|s| (*s).to_owned()).collect(),
            ..State::default()
        }));
        let server = Server::start(Arc::new(Engine(state.clone())));
        FakeDocker { state, server }
    }

    /// The engine's address as `DOCKER_HOST` takes it: `tcp://127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("tcp://{}", self.server.addr)
    }

    /// Makes the next start of a container (one call) behave as `fault` says.
    pub fn fault_next_start(&self, fault: StartFault) {
        lock(&self.state).start_faults.push_back(fault);
    }

    /// Answers every `method` call whose path (without its version) ends with `path_end`
    /// (`/containers/create`, `/json` for inspections) with `flood`, a body that does not end;
    /// `None` stops. What the floods sent is [`FakeDocker::floods`].
    pub fn flood(&self, method: &str, path_end: &str, flood: Option<Flood>) {
        lock(&self.state).flood =
            flood.map(|flood| (method.to_owned(), path_end.to_owned(), flood));
    }

    /// What the floods sent so far.
    pub fn floods(&self) -> FloodRecord {
        self.server.floods()
    }

    /// Makes the next `calls` calls (any route) answer 503, as an engine in the middle of a
    /// restart.
    pub fn unavailable_for(&self, calls: usize) {
        lock(&self.state).unavailable = calls;
    }

    /// Makes every stop of a container answer `code` with `message` and leave it running
    /// (`None`: stops work again), as an engine that refuses this client the stop (403 from
    /// an authorization plugin).
    pub fn refuse_stops(&self, refusal: Option<(u16, &str)>) {
        lock(&self.state).refused_stops = refusal.map(|(code, m)| (code, m.to_owned()));
    }

    /// The containers started and not ended, at this moment.
    pub fn running(&self) -> Vec<Container> {
        lock(&self.state)
            .containers
            .iter()
            .filter(|c| c.starts > 0 && c.exit_code.is_none())
            .cloned()
            .collect()
    }

    /// Ends the container named `name` with `code`, as its process exiting.
    pub fn exit(&self, name: &str, code: i64) {
        if let Some(c) = lock(&self.state)
            .containers
            .iter_mut()
            .find(|c| c.name == name)
        {
            c.exit_code = Some(code);
            c.finished_at = Some(chrono::Utc::now());
        }
    }

    /// Appends `text` to what the container named `name` printed on `stream`, as its process
    /// writing it.
    pub fn print(&self, name: &str, stream: LogStream, text: &str) {
        if let Some(c) = lock(&self.state)
            .containers
            .iter_mut()
            .find(|c| c.name == name)
        {
            c.output.push((stream, text.to_owned()));
        }
    }

    /// Forgets the container named `name`, as `docker rm` by someone else.
    pub fn forget(&self, name: &str) {
        lock(&self.state).containers.retain(|c| c.name != name);
    }

    /// Every call received, in order.
    pub fn calls(&self) -> Vec<Call> {
        lock(&self.state).calls.clone()
    }

    /// Every container, in the order created.
    pub fn containers(&self) -> Vec<Container> {
        lock(&self.state).containers.clone()
    }

    /// The container named `name`.
    pub fn container(&self, name: &str) -> Option<Container> {
        self.containers().into_iter().find(|c| c.name == name)
    }

    /// How many images were pulled.
    pub fn pulls(&self) -> usize {
        lock(&self.state).pulls
    }

    /// Whether the engine holds `image`.
    pub fn has_image(&self, image: &str) -> bool {
        lock(&self.state).images.contains(image)
    }
}

fn message(status: u16, text: String) -> Option<Answer> {
    Some((status, json!({ "message": text }).to_string()))
}

impl Handler for Engine {
    fn flood(&self, request: &FakeRequest) -> Option<Flood> {
        let mut state = lock(&self.0);
        let (method, path_end, flood) = state.flood.clone()?;
        let path = strip_version(&request.path);
        let flooded = request.method == method && path.ends_with(&path_end);
        if flooded {
            let mut call = Call::received(request, path);
            call.version = version_of(&request.path);
            call.status = flood.status;
            state.calls.push(call);
        }
        flooded.then_some(flood)
    }

    fn answer(&self, request: &FakeRequest) -> Option<Answer> {
        let mut state = lock(&self.0);
        let path = strip_version(&request.path).to_owned();
        let index = state.calls.len();
        let mut call = Call::received(request, &path);
        call.version = version_of(&request.path);
        state.calls.push(call);
        let answer = if state.unavailable > 0 {
            state.unavailable -= 1;
            message(503, "the engine is restarting".into())
        } else {
            route(&mut state, request, &path)
        };
        if let Some((status, _)) = &answer {
            state.calls[index].status = *status;
        }
        answer
    }
}

/// `/v1.47/containers/create` -> `Some("1.47")`.
fn version_of(path: &str) -> Option<String> {
    let rest = path.strip_prefix("/v")?;
    let version = &rest[..rest.find('/')?];
    version.starts_with("1.").then(|| version.to_owned())
}

/// `/v1.47/containers/create` -> `/containers/create`.
fn strip_version(path: &str) -> &str {
    match path.strip_prefix("/v1.") {
        Some(rest) => rest.find('/').map_or(path, |slash| &rest[slash..]),
        None => path,
    }
}

fn route(state: &mut State, request: &FakeRequest, path: &str) -> Option<Answer> {
    let method = request.method.as_str();
    if method == "GET" && path == "/_ping" {
        return Some((200, String::new()));
    }
    if method == "GET" && path == "/version" {
        return Some((
            200,
            json!({ "Version": "27.5.1", "ApiVersion": "1.47", "MinAPIVersion": "1.24",
                    "Os": "linux", "Arch": "amd64" })
            .to_string(),
        ));
    }
    if method == "POST" && path == "/containers/create" {
        return create(state, request);
    }
    if method == "POST" && path == "/images/create" {
        let image = request.param("fromImage").unwrap_or_default();
        let image = match request.param("tag") {
            Some(tag) if !tag.is_empty() => format!("{image}:{tag}"),
            _ => image.to_owned(),
        };
        state.pulls += 1;
        state.images.insert(image.clone());
        let progress = [
            json!({ "status": format!("Pulling from {image}") }),
            json!({ "status": "Digest: sha256:0000000000000000000000000000000000000000000000000000000000000000" }),
            json!({ "status": format!("Status: Downloaded newer image for {image}") }),
        ];
        let body: String = progress.iter().map(|p| format!("{p}\r\n")).collect();
        return Some((200, body));
    }
    if let Some(image) = path
        .strip_prefix("/images/")
        .and_then(|p| p.strip_suffix("/json"))
    {
        return if state.images.contains(image) {
            Some((
                200,
                json!({ "Id": format!("sha256:{}", hex_id()), "RepoTags": [image] }).to_string(),
            ))
        } else {
            message(404, format!("No such image: {image}"))
        };
    }
    let Some(rest) = path.strip_prefix("/containers/") else {
        return message(404, "page not found".into());
    };
    let (target, action) = rest.rsplit_once('/').unwrap_or((rest, ""));
    let Some(at) = state
        .containers
        .iter()
        .position(|c| c.id == target || c.name == target || c.id.starts_with(target))
    else {
        return message(404, format!("No such container: {target}"));
    };
    match (method, action) {
        ("POST", "start") => start(state, at),
        ("POST", "stop") => {
            if let Some((code, refusal)) = state.refused_stops.clone() {
                return message(code, refusal);
            }
            let c = &mut state.containers[at];
            if c.starts == 0 || c.exit_code.is_some() {
                return Some((304, String::new()));
            }
            c.exit_code = Some(137);
            c.finished_at = Some(chrono::Utc::now());
            Some((204, String::new()))
        }
        ("DELETE", "") => {
            state.containers.remove(at);
            Some((204, String::new()))
        }
        ("GET", "json") => Some((200, inspect(&state.containers[at]).to_string())),
        ("GET", "logs") => Some((200, logs(&state.containers[at], request))),
        _ => message(404, "page not found".into()),
    }
}

fn create(state: &mut State, request: &FakeRequest) -> Option<Answer> {
    let body: Value = match serde_json::from_slice(&request.body) {
        Ok(body) => body,
        Err(e) => return message(400, format!("invalid JSON: {e}")),
    };
    let image = body["Image"].as_str().unwrap_or_default().to_owned();
    if image.is_empty() {
        return message(
            400,
            "config cannot be empty in order to create a container".into(),
        );
    }
    if !state.images.contains(&image) {
        return message(404, format!("No such image: {image}"));
    }
    let name = request.param("name").unwrap_or_default().to_owned();
    if let Some(existing) = state.containers.iter().find(|c| c.name == name) {
        return message(
            409,
            format!(
                "Conflict. The container name \"/{name}\" is already in use by container \"{}\". \
                 You have to remove (or rename) that container to be able to reuse that name.",
                existing.id
            ),
        );
    }
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let container = Container {
        id: hex_id(),
        name: if name.is_empty() {
            hex_id()[..12].to_owned()
        } else {
            name
        },
        image,
        cmd: strings(&body["Cmd"]),
        user: body["User"].as_str().map(str::to_owned),
        env: strings(&body["Env"]),
        labels: body["Labels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect()
            })
            .unwrap_or_default(),
        host_config: body["HostConfig"].clone(),
        starts: 0,
        exit_code: None,
        started_at: None,
        finished_at: None,
        output: Vec::new(),
    };
    let answer = json!({ "Id": container.id, "Warnings": [] }).to_string();
    state.containers.push(container);
    Some((201, answer))
}

fn start(state: &mut State, at: usize) -> Option<Answer> {
    if state.containers[at].starts > 0 {
        return Some((304, String::new()));
    }
    match state.start_faults.pop_front() {
        Some(StartFault::Fail) => message(500, "cannot start container: injected failure".into()),
        Some(StartFault::Refuse(reason)) => message(400, reason),
        Some(StartFault::StallBeforeStart) => None,
        Some(StartFault::StallAfterStart) => {
            state.containers[at].starts += 1;
            state.containers[at].started_at = Some(chrono::Utc::now());
            None
        }
        None => {
            state.containers[at].starts += 1;
            state.containers[at].started_at = Some(chrono::Utc::now());
            Some((204, String::new()))
        }
    }
}

fn inspect(c: &Container) -> Value {
    let running = c.starts > 0 && c.exit_code.is_none();
    let status = match (c.starts, c.exit_code) {
        (_, Some(_)) => "exited",
        (0, None) => "created",
        _ => "running",
    };
    json!({
        "Id": c.id,
        "Name": format!("/{}", c.name),
        "Image": format!("sha256:{}", "0".repeat(64)),
        "State": {
            "Status": status,
            "Running": running,
            "Paused": false,
            "Restarting": false,
            "OOMKilled": false,
            "Dead": false,
            "Pid": if running { 4242 } else { 0 },
            "ExitCode": c.exit_code.unwrap_or(0),
            "Error": "",
            "StartedAt": engine_time(c.started_at),
            "FinishedAt": engine_time(c.finished_at)
        },
        "Config": { "Image": c.image, "Env": c.env, "Labels": c.labels, "Cmd": c.cmd },
        "HostConfig": c.host_config,
    })
}

/// A time as the engine writes it, the zero time for none.
fn engine_time(at: Option<chrono::DateTime<chrono::Utc>>) -> String {
    at.map_or_else(
        || "0001-01-01T00:00:00Z".to_owned(),
        |at| at.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
    )
}

/// The container's logs as the engine streams them for a container without a TTY: the last
/// `tail` lines (all without it) of the streams asked for, each in frames of an 8-byte header
/// (stream, three zero bytes, the big-endian length) and the payload. Frames are kept under
/// 128 bytes, so the whole answer is text.
fn logs(c: &Container, request: &FakeRequest) -> String {
    let wanted = |name: &str| matches!(request.param(name), Some("1" | "true"));
    let mut lines: Vec<(LogStream, &str)> = Vec::new();
    for (stream, text) in &c.output {
        let asked = match stream {
            LogStream::Stdout => wanted("stdout"),
            LogStream::Stderr => wanted("stderr"),
        };
        if asked {
            lines.extend(text.split_inclusive('\n').map(|line| (*stream, line)));
        }
    }
    if let Some(tail) = request.param("tail").and_then(|t| t.parse::<usize>().ok()) {
        lines.drain(..lines.len().saturating_sub(tail));
    }
    let mut body = String::new();
    for (stream, mut line) in lines {
        let kind = match stream {
            LogStream::Stdout => '\u{1}',
            LogStream::Stderr => '\u{2}',
        };
        while !line.is_empty() {
            let mut end = line.len().min(127);
            while !line.is_char_boundary(end) {
                end -= 1;
            }
            let (frame, rest) = line.split_at(end);
            body.push(kind);
            body.push_str("\0\0\0\0\0\0");
            body.push(char::from(u8::try_from(frame.len()).unwrap_or(127)));
            body.push_str(frame);
            line = rest;
        }
    }
    body
}

fn hex_id() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}
