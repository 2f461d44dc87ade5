//! The completion scripts in the real shells, driven as a person drives them: bash, zsh and
//! fish run in a tmux pane of their own, a command line is typed, TAB is pressed, and the line
//! the shell completed is run. `routine show NAME --json` then names the routine the completion
//! wrote, so a name quoted wrongly (split at its `:` or `=`, its `*` left to the glob, its `'`
//! unbalanced) fails to find it. The database is named only by `--database-url` on the typed
//! line: the shells' environment has no `DATABASE_URL`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use uuid::Uuid;

use crate::cli::{BIN, NOWHERE, ok};
use crate::operator::create;
use crate::support::{TestDb, poll_blocking, wait_until_blocking};

/// Names as crontab imports make them, and others a shell must quote.
const NAMES: &[&str] = &[
    "backup.cron: 0 3 * * * /usr/bin/backup",
    "key=value job",
    "it's late",
    "standup",
];

/// A tmux server of its own (its socket in a fresh directory) running one shell.
struct Pane {
    dir: PathBuf,
}

impl Pane {
    /// Starts `shell` (a command line) in a 250-column pane, with the binary on the PATH and
    /// `DATABASE_URL` a URL nothing answers on.
    fn start(shell: &str) -> Pane {
        let dir = std::env::temp_dir().join(format!("cm-shell-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let pane = Pane { dir };
        let bin_dir = Path::new(BIN).parent().unwrap();
        let path = format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let status = pane
            .tmux()
            .args([
                "new-session",
                "-d",
                "-s",
                "t",
                "-x",
                "250",
                "-y",
                "50",
                shell,
            ])
            .env("PATH", path)
            .env("HOME", &pane.dir)
            .env("TERM", "xterm")
            // Each command line typed names its database; one that did not reaches none.
            .env("DATABASE_URL", NOWHERE)
            .env_remove("DATABASE_URL_FILE")
            .status()
            .unwrap_or_else(|e| panic!("cannot run tmux ({e}): apt-get install tmux"));
        assert!(status.success(), "tmux new-session failed");
        pane
    }

    fn tmux(&self) -> Command {
        let mut c = Command::new("tmux");
        c.arg("-S").arg(self.dir.join("socket"));
        c.stdin(Stdio::null());
        c
    }

    /// Types `text` as it is (no key names).
    fn type_text(&self, text: &str) {
        let status = self
            .tmux()
            .args(["send-keys", "-t", "t", "-l", text])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Presses `key` (a tmux key name: `Tab`, `Enter`, `C-u`).
    fn press(&self, key: &str) {
        let status = self
            .tmux()
            .args(["send-keys", "-t", "t", key])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// What the pane shows.
    fn screen(&self) -> String {
        let out = self
            .tmux()
            .args(["capture-pane", "-p", "-J", "-t", "t"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until `file` holds a whole line, and returns it; `None` after 15 s.
    fn wait_for_line(&self, file: &Path) -> Option<String> {
        poll_blocking(
            Duration::from_secs(15),
            || {
                std::fs::read_to_string(file)
                    .ok()
                    .filter(|t| t.ends_with('\n'))
            },
            Option::is_some,
        )
        .ok()
        .flatten()
    }

    /// Runs `line` (typed, then Enter) and waits until it has written `file`'s line.
    fn run(&self, line: &str, file: &Path) -> String {
        self.type_text(line);
        self.press("Enter");
        self.wait_for_line(file)
            .unwrap_or_else(|| panic!("`{line}` did not finish; the pane:\n{}", self.screen()))
    }
}

impl Drop for Pane {
    fn drop(&mut self) {
        let _ = self.tmux().arg("kill-server").status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// In `shell` (started by `command`, made ready by `setup`, a line run once), each prefix of a
/// name, typed after `--database-url URL routine show` and completed with TAB, completes to a
/// command that shows that routine; and `__` completes to no subcommand.
async fn names_complete_in(shell: &str, command: &str, setup: &dyn Fn(&Path, &Path) -> String) {
    let db = TestDb::new().await;
    for name in NAMES {
        create(&db.url, name, "@daily", "UTC");
    }
    let pane = Pane::start(command);
    let script = pane.dir.join(format!("cm-scheduler.{shell}"));
    std::fs::write(&script, ok(NOWHERE, &["completions", shell])).unwrap();
    let ready = pane.dir.join("ready");
    pane.run(
        &format!(
            "{}; echo ready > {}",
            setup(&script, &pane.dir),
            ready.display()
        ),
        &ready,
    );
    for (n, (prefix, name)) in [
        ("backup.c", NAMES[0]),
        ("backup.cron:", NAMES[0]),
        ("key=", NAMES[1]),
        ("it", NAMES[2]),
    ]
    .into_iter()
    .enumerate()
    {
        let out = pane.dir.join(format!("show-{n}.json"));
        pane.type_text(&format!(
            "cm-scheduler --database-url {} routine show {prefix}",
            db.url
        ));
        // The completion asks the database: wait until the line holds the name's last word
        // once more (however the shell quotes it) before typing on.
        let word = name.rsplit(' ').next().unwrap();
        let before = pane.screen().matches(word).count();
        pane.press("Tab");
        wait_until_blocking(
            &format!("{shell}: `{prefix}` TAB to complete to {name:?}"),
            Duration::from_secs(15),
            || pane.screen(),
            |screen| screen.matches(word).count() > before,
        );
        let line = pane.run(&format!(" --json > {} 2>&1", out.display()), &out);
        let shown: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|_| {
            panic!(
                "{shell}: `{prefix}` TAB did not complete to a routine: {line}\nthe pane:\n{}",
                pane.screen()
            )
        });
        assert_eq!(shown["name"], *name, "{shell}: `{prefix}` TAB: {line}");
    }
    // The internal subcommand is never offered.
    pane.type_text("cm-scheduler __");
    pane.press("Tab");
    // Time passes on purpose: a second for a completion that must not come.
    std::thread::sleep(Duration::from_millis(1000));
    let screen = pane.screen();
    pane.press("C-u");
    assert!(
        !screen.contains("__complete-routine"),
        "{shell} offered the internal subcommand:\n{screen}"
    );
}

#[tokio::test]
#[ignore = "needs tmux: apt-get install tmux"]
async fn bash_completes_quoted_names_after_global_flags() {
    names_complete_in("bash", "bash --norc --noprofile", &|script, _| {
        format!("PS1='$ '; source {}", script.display())
    })
    .await;
}

#[tokio::test]
#[ignore = "needs zsh: apt-get install zsh tmux"]
async fn zsh_completes_quoted_names_after_global_flags() {
    names_complete_in("zsh", "zsh -f", &|script, dir| {
        format!(
            "PS1='$ '; autoload -U compinit; compinit -u -d {}/zcompdump; source {}",
            dir.display(),
            script.display()
        )
    })
    .await;
}

#[tokio::test]
#[ignore = "needs fish: apt-get install fish tmux"]
async fn fish_completes_quoted_names_after_global_flags() {
    // Fish's autosuggestions would show an earlier command's name on the line before TAB is
    // pressed, which the wait for the completed name would take for the completion.
    names_complete_in("fish", "fish --no-config", &|script, _| {
        format!(
            "set -g fish_autosuggestion_enabled 0; source {}",
            script.display()
        )
    })
    .await;
}
