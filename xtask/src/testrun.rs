//! `cargo xtask test`: the whole suite, with the tests that need a service this machine lacks
//! reported as skipped, never as passed.
//!
//! A test that needs a service beyond PostgreSQL is `#[ignore = "needs SERVICE: how to get it"]`,
//! so a plain `cargo test --workspace` lists it as ignored with that reason, and run anyway it
//! fails saying what is missing. This task runs `cargo test --workspace`, then those ignored tests
//! whose service it finds (by the variable or program [`SERVICES`] names), and ends with one
//! line: how many passed, failed and were skipped, and for each missing service how many of its
//! tests did not run and how to start it. Where every service is present (and always under
//! `CI=true`, which refuses to start without them) it is one run with `--include-ignored`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::Stdio;

use crate::{Failure, Outcome, cargo};

/// A service some tests need: the start of their ignore reason, and how to tell it is here.
pub(crate) struct Service {
    /// The reason's first words, e.g. `needs Citus`.
    pub(crate) needs: &'static str,
    /// Whether this machine has it.
    present: fn() -> bool,
}

/// Every service a test may be ignored for.
pub(crate) const SERVICES: &[Service] = &[
    Service {
        needs: "needs Citus",
        present: || set("CM_TEST_CITUS_URL"),
    },
    Service {
        needs: "needs pg_auto_failover",
        present: || set("CM_TEST_AUTO_FAILOVER_URL") && set("CM_TEST_AUTO_FAILOVER_MONITOR"),
    },
    Service {
        needs: "needs PgBouncer in transaction mode",
        present: || set("CM_TEST_PGBOUNCER_URL"),
    },
    Service {
        needs: "needs PgBouncer in session mode",
        present: || set("CM_TEST_PGBOUNCER_SESSION_URL"),
    },
    Service {
        needs: "needs PgBouncer 1.18",
        present: || set("CM_TEST_PGBOUNCER_118_URL"),
    },
    Service {
        needs: "needs a Docker engine",
        present: || set("CM_TEST_DOCKER_HOST"),
    },
    Service {
        needs: "needs Chromium",
        present: || set("CHROMIUM") || on_path("chromium"),
    },
    Service {
        needs: "needs kubernetes-validate",
        present: || set("CM_TEST_KUBERNETES_VALIDATE") || on_path("kubernetes-validate"),
    },
    Service {
        needs: "needs systemd-analyze",
        present: || on_path("systemd-analyze"),
    },
    // The TLS tests start a PostgreSQL cluster of their own, with certificates they make.
    Service {
        needs: "needs initdb and openssl",
        present: || on_path("openssl") && has_initdb(),
    },
    Service {
        needs: "needs tmux",
        present: || on_path("tmux"),
    },
    // The zsh and fish tests drive the shell in tmux, or run it directly.
    Service {
        needs: "needs zsh",
        present: || on_path("zsh") && on_path("tmux"),
    },
    Service {
        needs: "needs fish",
        present: || on_path("fish") && on_path("tmux"),
    },
];

fn set(variable: &str) -> bool {
    std::env::var_os(variable).is_some_and(|v| !v.is_empty())
}

/// Whether PostgreSQL's `initdb` is where the TLS tests look: in `CM_TEST_PG_BIN`, in
/// Debian's `/usr/lib/postgresql/*/bin`, or on the `PATH`.
fn has_initdb() -> bool {
    if let Some(dir) = std::env::var_os("CM_TEST_PG_BIN").filter(|d| !d.is_empty()) {
        return std::path::Path::new(&dir).join("initdb").is_file();
    }
    let debian = std::fs::read_dir("/usr/lib/postgresql").is_ok_and(|versions| {
        versions
            .filter_map(Result::ok)
            .any(|v| v.path().join("bin/initdb").is_file())
    });
    debian || on_path("initdb")
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            let candidate = dir.join(program);
            std::fs::metadata(&candidate).is_ok_and(|m| {
                use std::os::unix::fs::PermissionsExt as _;
                m.is_file() && m.permissions().mode() & 0o111 != 0
            })
        })
    })
}

/// What one `cargo test` printed, added up over its test binaries.
#[derive(Debug, Default, PartialEq)]
struct Tally {
    passed: u64,
    failed: u64,
    ignored: u64,
    /// The ignored tests, by name, with their reasons (empty when none was given).
    ignored_tests: Vec<(String, String)>,
    /// Each failed test's name with where it panicked and the first lines of why, read from
    /// libtest's `failures:` section; repeated in the closing lines, since the section itself
    /// may sit thousands of lines above them.
    failures: Vec<(String, Vec<String>)>,
    /// Lines still to keep of the panic being read: the message's first [`FAILURE_LINES`].
    reading_failure: usize,
}

/// How many lines of a failed test's panic the closing lines repeat: where, and the start of
/// the message (a message may carry a whole process log).
const FAILURE_LINES: usize = 4;

/// The longest line of a panic the closing lines repeat, in characters.
const FAILURE_LINE_CHARS: usize = 240;

impl Tally {
    /// Reads one line of libtest's output.
    fn read(&mut self, line: &str) {
        if let Some(name) = line
            .strip_prefix("---- ")
            .and_then(|rest| rest.strip_suffix(" stdout ----"))
        {
            self.failures.push((name.to_string(), Vec::new()));
            self.reading_failure = 0;
        } else if line.starts_with("thread '") && line.contains(" panicked at ") {
            if let Some((_, lines)) = self.failures.last_mut()
                && lines.is_empty()
            {
                lines.push(clip(line));
                self.reading_failure = FAILURE_LINES - 1;
            }
        } else if self.reading_failure > 0 {
            if line.is_empty()
                || line == "failures:"
                || line == "stack backtrace:"
                || line.starts_with("---- ")
            {
                self.reading_failure = 0;
            } else if let Some((_, lines)) = self.failures.last_mut() {
                lines.push(clip(line));
                self.reading_failure -= 1;
            }
        }
        if let Some(result) = line.strip_prefix("test result: ") {
            // `ok. 5 passed; 0 failed; 2 ignored; 0 measured; 3 filtered out; finished in 0.01s`
            for part in result.split(';') {
                let mut words = part.split_whitespace().skip_while(|w| w.ends_with('.'));
                let (Some(count), Some(what)) = (words.next(), words.next()) else {
                    continue;
                };
                let Ok(count) = count.parse::<u64>() else {
                    continue;
                };
                match what {
                    "passed" => self.passed += count,
                    "failed" => self.failed += count,
                    "ignored" => self.ignored += count,
                    _ => {}
                }
            }
        } else if let Some(test) = line.strip_prefix("test ")
            && let Some((name, verdict)) = test.split_once(" ... ")
            && let Some(reason) = verdict.strip_prefix("ignored")
        {
            let reason = reason.strip_prefix(", ").unwrap_or("").trim().to_string();
            self.ignored_tests.push((name.to_string(), reason));
        }
    }
}

/// `line` cut to [`FAILURE_LINE_CHARS`] characters, marked where it was cut.
fn clip(line: &str) -> String {
    match line.char_indices().nth(FAILURE_LINE_CHARS) {
        Some((at, _)) => format!("{} [...]", &line[..at]),
        None => line.to_string(),
    }
}

/// Prints each failed test with the start of its panic, so the run's last lines say what
/// failed and why.
fn print_failures(tallies: &[&Tally]) {
    for (name, lines) in tallies.iter().flat_map(|t| &t.failures) {
        println!("xtask test: FAILED {name}");
        for line in lines {
            println!("xtask test:     {line}");
        }
    }
}

/// `cargo test ARGS -- TEST_ARGS`, its output passed through and added up. `Err` only when
/// cargo cannot be started or did not run the tests (a build error); failed tests are counted.
fn cargo_test(args: &[String], test_args: &[String]) -> Result<(Tally, bool), Failure> {
    let mut c = cargo();
    c.arg("test");
    if !args.iter().any(|a| a == "-p" || a.starts_with("--package")) {
        c.arg("--workspace");
    }
    c.arg("--no-fail-fast").args(args).arg("--").args(test_args);
    c.stdout(Stdio::piped());
    let shown = format!("{c:?}");
    let mut child = c
        .spawn()
        .map_err(|e| Failure::Failed(format!("cannot start {shown}: {e}")))?;
    let mut tally = Tally::default();
    let stdout = child.stdout.take().expect("piped");
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        println!("{line}");
        tally.read(&line);
    }
    let status = child
        .wait()
        .map_err(|e| Failure::Failed(format!("waiting for {shown}: {e}")))?;
    Ok((tally, status.success()))
}

/// Runs the suite (see the module's documentation); `required` (CI) refuses to run without
/// every service.
pub fn run(args: &[String], required: bool) -> Outcome {
    let (args, test_args) = match args.iter().position(|a| a == "--") {
        Some(at) => (&args[..at], &args[at + 1..]),
        None => (args, &[][..]),
    };
    let missing: Vec<&Service> = SERVICES.iter().filter(|s| !(s.present)()).collect();
    if required && !missing.is_empty() {
        let names: Vec<&str> = missing.iter().map(|s| s.needs).collect();
        return Err(Failure::Failed(format!(
            "CI runs every test, and this machine lacks what they need: {} (.ci/run starts them)",
            names.join("; ")
        )));
    }
    if missing.is_empty() {
        let mut all = test_args.to_vec();
        all.push("--include-ignored".into());
        let (tally, ok) = cargo_test(args, &all)?;
        print_failures(&[&tally]);
        println!(
            "xtask test: {} passed, {} failed, 0 skipped (every service present)",
            tally.passed, tally.failed
        );
        return if ok {
            Ok(())
        } else {
            Err(Failure::Failed("tests failed".into()))
        };
    }
    let (first, first_ok) = cargo_test(args, test_args)?;
    let service_of = |reason: &str| SERVICES.iter().find(|s| reason.starts_with(s.needs));
    let runnable: Vec<String> = first
        .ignored_tests
        .iter()
        .filter(|(_, reason)| service_of(reason).is_some_and(|s| (s.present)()))
        .map(|(name, _)| name.clone())
        .collect();
    let (second, second_ok) = if runnable.is_empty() {
        (Tally::default(), true)
    } else {
        let mut only = test_args.to_vec();
        only.extend(["--ignored".to_string(), "--exact".to_string()]);
        only.extend(runnable.iter().cloned());
        cargo_test(args, &only)?
    };
    // The skipped, by the reason their service gives (its first test's words).
    let mut skipped: BTreeMap<&str, (u64, &str)> = BTreeMap::new();
    for (_, reason) in &first.ignored_tests {
        match service_of(reason) {
            Some(s) if (s.present)() => {}
            Some(s) => {
                let entry = skipped.entry(s.needs).or_insert((0, reason.as_str()));
                entry.0 += 1;
            }
            None => {
                let entry = skipped
                    .entry("ignored")
                    .or_insert((0, "ignored without a service named"));
                entry.0 += 1;
            }
        }
    }
    let skipped_count = first.ignored.saturating_sub(second.passed + second.failed);
    print_failures(&[&first, &second]);
    let why: Vec<String> = skipped
        .values()
        .map(|(count, reason)| match reason.strip_prefix("needs ") {
            Some(rest) if *count != 1 => format!("{count} need {rest}"),
            _ => format!("{count} {reason}"),
        })
        .collect();
    println!(
        "xtask test: {} passed, {} failed, {} skipped{}{}",
        first.passed + second.passed,
        first.failed + second.failed,
        skipped_count,
        if why.is_empty() { "" } else { ": " },
        why.join("; ")
    );
    if first_ok && second_ok {
        Ok(())
    } else {
        Err(Failure::Failed("tests failed".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::Tally;

    #[test]
    fn libtest_output_is_added_up_with_the_reasons_of_the_ignored() {
        let mut tally = Tally::default();
        for line in [
            "running 3 tests",
            "test citus::claims_in_one_group ... ignored, needs Citus: run .ci/citus",
            "test plain ... ok",
            "test other ... ignored",
            "test result: ok. 1 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.01s",
            "test result: FAILED. 4 passed; 1 failed; 0 ignored; 0 measured; 7 filtered out; finished in 2.00s",
            "test a line that only looks like one",
        ] {
            tally.read(line);
        }
        assert_eq!(
            tally,
            Tally {
                passed: 5,
                failed: 1,
                ignored: 2,
                ignored_tests: vec![
                    (
                        "citus::claims_in_one_group".into(),
                        "needs Citus: run .ci/citus".into()
                    ),
                    ("other".into(), String::new()),
                ],
                ..Tally::default()
            }
        );
    }

    #[test]
    fn a_failed_tests_panic_is_kept_to_its_first_lines() {
        let mut tally = Tally::default();
        let long = "x".repeat(300);
        for line in [
            "failures:",
            "",
            "---- citus::two_schedulers stdout ----",
            "",
            "thread 'citus::two_schedulers' (17552) panicked at cm-scheduler/tests/scheduler/citus.rs:95:9:",
            "assertion `left == right` failed",
            "  left: 1",
            long.as_str(),
            "a fifth line of the log",
            "",
            "---- quiet stdout ----",
            "thread 'quiet' panicked at a.rs:1:1:",
            "stack backtrace:",
            "   0: __rustc::rust_begin_unwind",
            "failures:",
            "    citus::two_schedulers",
            "test result: FAILED. 0 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.00s",
        ] {
            tally.read(line);
        }
        assert_eq!(tally.failed, 2);
        assert_eq!(
            tally.failures,
            vec![
                (
                    "citus::two_schedulers".to_string(),
                    vec![
                        "thread 'citus::two_schedulers' (17552) panicked at cm-scheduler/tests/scheduler/citus.rs:95:9:".to_string(),
                        "assertion `left == right` failed".to_string(),
                        "  left: 1".to_string(),
                        format!("{} [...]", "x".repeat(super::FAILURE_LINE_CHARS)),
                    ]
                ),
                (
                    "quiet".to_string(),
                    vec!["thread 'quiet' panicked at a.rs:1:1:".to_string()]
                ),
            ]
        );
    }

    #[test]
    fn every_service_reason_names_one_service() {
        // No reason may start another's, or a test would be counted under the wrong one.
        for a in super::SERVICES {
            for b in super::SERVICES {
                assert!(
                    std::ptr::eq(a, b) || !b.needs.starts_with(a.needs),
                    "{} and {}",
                    a.needs,
                    b.needs
                );
            }
        }
    }
}
