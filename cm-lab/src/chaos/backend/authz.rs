//! A Docker authorization plugin of the run's own (`--refuse-stops`): the run's dockerd asks it
//! about every request (`--authorization-plugin`), and it refuses the stop of every other
//! container (those whose name, the occurrence's key, names an even second), so the real
//! engine answers cm's stop with 403 ("authorization denied by plugin …") as one guarded by an
//! authorization plugin would. Everything else is allowed.
//!
//! The protocol (Docker's plugin API, v1 JSON over HTTP on a Unix socket under
//! `/run/docker/plugins/`): `POST /Plugin.Activate` answers `{"Implements": ["authz"]}`;
//! `POST /AuthZPlugin.AuthZReq` gets the request's method and URI and answers `{"Allow": …,
//! "Msg": …}`; `POST /AuthZPlugin.AuthZRes` allows every response.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};

/// The plugin's name, as `--authorization-plugin` takes it.
pub(in crate::chaos) fn name() -> String {
    format!("cm-chaos-authz-{}", std::process::id())
}

/// Stops refused and allowed so far.
#[derive(Debug, Default)]
pub(in crate::chaos) struct Verdicts {
    pub refused: AtomicU64,
    pub allowed: AtomicU64,
}

/// The plugin, serving on its socket from a thread of its own until the process ends.
pub(in crate::chaos) struct AuthzPlugin {
    pub verdicts: Arc<Verdicts>,
    socket: PathBuf,
}

impl AuthzPlugin {
    /// Starts serving on `/run/docker/plugins/NAME.sock`.
    pub fn start() -> anyhow::Result<AuthzPlugin> {
        let dir = PathBuf::from("/run/docker/plugins");
        std::fs::create_dir_all(&dir)?;
        let socket = dir.join(format!("{}.sock", name()));
        let _ = std::fs::remove_file(&socket);
        let verdicts = Arc::new(Verdicts::default());
        let std_listener = std::os::unix::net::UnixListener::bind(&socket)?;
        std_listener.set_nonblocking(true)?;
        let state = verdicts.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the authorization plugin's runtime");
            rt.block_on(async move {
                let listener = tokio::net::UnixListener::from_std(std_listener)
                    .expect("the authorization plugin's socket");
                let app = Router::new()
                    .route("/Plugin.Activate", post(activate))
                    .route("/AuthZPlugin.AuthZReq", post(request))
                    .route("/AuthZPlugin.AuthZRes", post(response))
                    .with_state(state);
                let _ = axum::serve(listener, app).await;
            });
        });
        Ok(AuthzPlugin { verdicts, socket })
    }
}

impl Drop for AuthzPlugin {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
    }
}

async fn activate() -> String {
    json!({ "Implements": ["authz"] }).to_string()
}

async fn response() -> String {
    json!({ "Allow": true }).to_string()
}

async fn request(State(verdicts): State<Arc<Verdicts>>, body: Bytes) -> String {
    let request: Value = serde_json::from_slice(&body).unwrap_or_default();
    let method = request["RequestMethod"].as_str().unwrap_or_default();
    let uri = request["RequestUri"]
        .as_str()
        .or(request["RequestURI"].as_str())
        .unwrap_or_default();
    match refused_stop(method, uri) {
        Some(container) => {
            verdicts.refused.fetch_add(1, Ordering::Relaxed);
            json!({ "Allow": false, "Msg": format!("stopping {container} is not allowed") })
                .to_string()
        }
        None => {
            if is_stop(method, uri).is_some() {
                verdicts.allowed.fetch_add(1, Ordering::Relaxed);
            }
            json!({ "Allow": true }).to_string()
        }
    }
}

/// The container a request stops (`POST /v1.47/containers/NAME/stop?t=10`), if it is a stop.
fn is_stop<'a>(method: &str, uri: &'a str) -> Option<&'a str> {
    let path = uri.split('?').next()?;
    let mut parts = path.trim_start_matches('/').split('/');
    let first = parts.next()?;
    let (containers, name, action) = if first.starts_with('v') {
        (parts.next()?, parts.next()?, parts.next()?)
    } else {
        (first, parts.next()?, parts.next()?)
    };
    (method == "POST" && containers == "containers" && action == "stop").then_some(name)
}

/// The container whose stop is refused: every other one, by the second its name (the key,
/// `cm-<routine>-<unix microseconds>`) names.
fn refused_stop<'a>(method: &str, uri: &'a str) -> Option<&'a str> {
    let name = is_stop(method, uri)?;
    let micros: i64 = name.rsplit('-').next()?.parse().ok()?;
    (micros.div_euclid(1_000_000) % 2 == 0).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_other_stop_is_refused() {
        let check = |method, uri, expected: Option<&str>| {
            assert_eq!(refused_stop(method, uri), expected, "{method} {uri}");
        };
        check(
            "POST",
            "/v1.47/containers/cm-ab-4000000/stop?t=10",
            Some("cm-ab-4000000"),
        );
        check(
            "POST",
            "/containers/cm-ab-2000000/stop",
            Some("cm-ab-2000000"),
        );
        check("POST", "/v1.47/containers/cm-ab-3000000/stop", None);
        check("POST", "/v1.47/containers/cm-ab-4000000/start", None);
        check("GET", "/v1.47/containers/cm-ab-4000000/json", None);
        check("POST", "/v1.47/containers/create?name=cm-ab-4000000", None);
    }
}
