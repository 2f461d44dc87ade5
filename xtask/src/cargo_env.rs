//! What both task runners (xtask and cm-lab) need to start cargo and the scheduler well: a cargo
//! command without the variables `cargo run` set for the runner itself, the workspace's root, and
//! whether PostgreSQL answers before anything is built. cm-lab includes this file as a module of
//! its own, so the two cannot drift apart and xtask keeps no dependency on cm-lab.

use std::process::Command;

/// A cargo command, without the variables `cargo run` set for the running task itself. Build
/// scripts such as ring's (through cc) ask to be rerun when `CARGO_PKG_NAME`,
/// `CARGO_MANIFEST_DIR` and the like change in cargo's environment, so a cargo started with the
/// runner's values rebuilt ring and everything above it (rustls, reqwest, kube, async-nats), and
/// the next cargo started from a shell rebuilt them again.
pub fn cargo() -> Command {
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if is_set_by_cargo_run(&key) {
            command.env_remove(key.as_ref());
        }
    }
    command
}

/// Whether `cargo run` sets `key` for the program it runs (as opposed to configuration a
/// person exported, such as `CARGO_HOME` or `CARGO_TARGET_DIR`).
pub fn is_set_by_cargo_run(key: &str) -> bool {
    key.starts_with("CARGO_PKG_")
        || key.starts_with("CARGO_BIN_EXE_")
        || [
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_MANIFEST_LINKS",
            "CARGO_CRATE_NAME",
            "CARGO_BIN_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_RUSTC_CURRENT_DIR",
        ]
        .contains(&key)
}

/// The workspace's root: the parent of the running task's crate.
pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the task runners live in the workspace root")
        .to_path_buf()
}

/// Where cargo puts what it builds: `CARGO_TARGET_DIR`, else the workspace's `target/`.
pub fn target_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Whether something accepts TCP connections at the URL's host and port.
pub fn postgres_answers(url: &str) -> bool {
    let rest = url.split("://").nth(1).unwrap_or("");
    let host_port = rest.split('/').next().unwrap_or("");
    let host_port = host_port.rsplit('@').next().unwrap_or("");
    let with_port = if host_port.contains(':') {
        host_port.to_string()
    } else {
        format!("{host_port}:5432")
    };
    use std::net::ToSocketAddrs;
    with_port
        .to_socket_addrs()
        .map(|mut addrs| {
            addrs.any(|a| {
                std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(2)).is_ok()
            })
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    #[test]
    fn cargo_started_by_a_task_does_not_see_the_variables_cargo_set_for_the_task() {
        // This test runs under cargo too, with CARGO_PKG_NAME and CARGO_MANIFEST_DIR set.
        assert!(std::env::var_os("CARGO_PKG_NAME").is_some());
        let command = super::cargo();
        let removed: Vec<String> = command
            .get_envs()
            .filter(|(_, value)| value.is_none())
            .map(|(key, _)| key.to_string_lossy().into_owned())
            .collect();
        for key in [
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_MANIFEST_DIR",
        ] {
            assert!(
                removed.iter().any(|k| k == key),
                "{key} is passed on: {removed:?}"
            );
        }
        assert!(!super::is_set_by_cargo_run("CARGO_TARGET_DIR"));
        assert!(!super::is_set_by_cargo_run("CARGO_HOME"));
    }
}
