//! Missions as an operator meets them without a container engine: the overlap policy in
//! `routine import`, `run --mission-backend docker` started before its engine, and the process
//! backend's runs watched to their end.

use crate::cli::{MissionFiles, ok};
use crate::operator::{case, check_refused};
use crate::support::TestDb;

/// JSON Lines give a mission routine its `overlap` (`forbid` when the line names none), checked
/// as `--overlap` is; a message routine's line may not have one. `--upsert` and `--sync` set it
/// again from the file.
#[tokio::test]
async fn import_reads_a_missions_overlap_and_refuses_a_bad_one() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let files = MissionFiles::new();
    files.write(
        "m.json",
        r#"{"repository": "https://example.invalid/r.git", "task": "m"}"#,
    );
    let line = |name: &str, overlap: &str| {
        format!(r#"{{"name": "{name}", "schedule": "0 3 * * *", "mission": "m.json"{overlap}}}"#)
    };
    let file = files.write(
        "missions.jsonl",
        &[
            line("allowed", r#", "overlap": "allow""#),
            line("default", ""),
            line("replaced", r#", "overlap": "replace""#),
            r#"{"name": "note", "schedule": "0 3 * * *", "message": "hi"}"#.to_owned(),
        ]
        .join("\n"),
    );
    let out = ok(url, &["routine", "import", &file]);
    assert_eq!(out.lines().count(), 4, "{out}");
    let overlap = async |name: &str| db.stored(name).await["overlap"].clone();
    assert_eq!(overlap("allowed").await, "allow");
    assert_eq!(overlap("default").await, "forbid");
    assert_eq!(overlap("replaced").await, "replace");
    let shown = ok(url, &["routine", "show", "allowed"]);
    assert!(shown.contains("overlap     allow"), "{shown}");

    // Refused with the line, nothing written.
    let bad = |name: &str, text: String| files.write(name, &format!("{}\n{text}\n", line("x", "")));
    let cases = [
        (
            bad("value.jsonl", line("y", r#", "overlap": "sometimes""#)),
            ":2: \"overlap\": ",
        ),
        (
            bad(
                "message.jsonl",
                r#"{"name": "y", "schedule": "0 3 * * *", "message": "hi", "overlap": "allow"}"#
                    .to_owned(),
            ),
            ":2: \"overlap\" is for mission routines",
        ),
    ];
    let cases: Vec<_> = cases
        .iter()
        .map(|(file, fragment)| case(&["routine", "import", file], fragment))
        .collect();
    check_refused(&db, &cases).await;
    let value = crate::cli::cm(url, &["routine", "import", &cases[0].0[2]]);
    assert!(value.stderr.contains("sometimes"), "{value:?}");

    // --upsert sets it from the file again: a line without one goes back to forbid.
    let again = files.write(
        "again.jsonl",
        &[
            line("allowed", ""),
            line("default", r#", "overlap": "replace""#),
        ]
        .join("\n"),
    );
    ok(url, &["routine", "import", &again, "--upsert"]);
    assert_eq!(overlap("allowed").await, "forbid");
    assert_eq!(overlap("default").await, "replace");

    // --sync: a line that changes only the overlap updates the routine and says so.
    let synced = files.write("synced.jsonl", &line("s", r#", "overlap": "allow""#));
    let first = ok(url, &["routine", "import", &synced, "--sync"]);
    assert!(first.starts_with("created"), "{first}");
    assert_eq!(overlap("s").await, "allow");
    let same = ok(url, &["routine", "import", &synced, "--sync"]);
    assert!(same.starts_with("unchanged"), "{same}");
    std::fs::write(&synced, line("s", r#", "overlap": "replace""#)).unwrap();
    let changed = ok(url, &["routine", "import", &synced, "--sync"]);
    assert!(changed.starts_with("updated"), "{changed}");
    assert_eq!(overlap("s").await, "replace");
}
