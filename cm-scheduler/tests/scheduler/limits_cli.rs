//! Concurrency keys and limits through the binary: `routine create|update --concurrency-key`
//! (and `--no-concurrency-key`), shown by `routine show` and its JSON, given by a JSON Lines
//! import; `limit set|list|delete` round trip. Bad input (a bad key, a limit out of range, a
//! missing limit, conflicting flags) exits 2 with one line and writes nothing.

use serde_json::Value;

use crate::cli::{check_fails, create_args, created_id, ok};
use crate::support::TestDb;

/// The routine as `routine show --json` prints it.
fn shown_json(url: &str, routine: &str) -> Value {
    serde_json::from_str(ok(url, &["routine", "show", routine, "--json"]).trim())
        .expect("routine show --json prints one JSON object")
}

/// The routine's `concurrency` line of `routine show`, if it has one.
fn concurrency_line(url: &str, routine: &str) -> Option<String> {
    ok(url, &["routine", "show", routine])
        .lines()
        .find(|l| l.starts_with("concurrency "))
        .map(str::to_owned)
}

#[tokio::test]
async fn a_routine_is_given_its_concurrency_key_changed_and_cleared() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let id = created_id(&ok(
        url,
        &create_args(
            "render",
            "0 3 * * *",
            &["--message", "go", "--concurrency-key", "gpu-pool"],
        ),
    ));
    assert_eq!(shown_json(url, "render")["concurrency_key"], "gpu-pool");
    assert_eq!(
        concurrency_line(url, "render").as_deref(),
        Some("concurrency gpu-pool: no limit set (unlimited)")
    );
    let stored: Option<String> =
        sqlx::query_scalar("SELECT concurrency_key FROM cm.routines WHERE id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(stored.as_deref(), Some("gpu-pool"));

    // Without a key: `null` in JSON, no line in show.
    ok(
        url,
        &create_args("plain", "0 4 * * *", &["--message", "go"]),
    );
    assert_eq!(shown_json(url, "plain")["concurrency_key"], Value::Null);
    assert_eq!(concurrency_line(url, "plain"), None);

    // Update sets it, then clears it; each prints the id as update does.
    let out = ok(
        url,
        &[
            "routine",
            "update",
            "render",
            "--concurrency-key",
            "tenant:acme",
        ],
    );
    assert_eq!(created_id(&out), id);
    assert_eq!(shown_json(url, "render")["concurrency_key"], "tenant:acme");
    let out = ok(
        url,
        &[
            "routine",
            "update",
            "plain",
            "--concurrency-key",
            "cluster/eu-1",
            "--json",
        ],
    );
    let updated: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(updated["concurrency_key"], "cluster/eu-1");
    ok(
        url,
        &["routine", "update", "render", "--no-concurrency-key"],
    );
    assert_eq!(shown_json(url, "render")["concurrency_key"], Value::Null);
    assert_eq!(concurrency_line(url, "render"), None);

    // The two flags conflict; a bad key is refused; neither changes anything.
    check_fails(
        url,
        &[
            "routine",
            "update",
            "plain",
            "--concurrency-key",
            "x",
            "--no-concurrency-key",
        ],
        2,
        "--no-concurrency-key",
    );
    check_fails(
        url,
        &[
            "routine",
            "update",
            "plain",
            "--concurrency-key",
            "gpu pool",
        ],
        2,
        "a concurrency key is 1 to 100 letters",
    );
    assert_eq!(shown_json(url, "plain")["concurrency_key"], "cluster/eu-1");
}

#[tokio::test]
async fn a_bad_concurrency_key_exits_2_with_one_line_and_writes_nothing() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    ok(
        url,
        &create_args("before", "0 3 * * *", &["--message", "go"]),
    );
    let before = db.count("routines").await;
    let too_long = "k".repeat(101);
    for bad in ["gpu pool", "-pool", "", "é", too_long.as_str()] {
        let flag = format!("--concurrency-key={bad}");
        check_fails(
            url,
            &create_args("keyed", "0 3 * * *", &["--message", "go", &flag]),
            2,
            "a concurrency key is 1 to 100 letters, digits and . _ : / -",
        );
    }
    assert_eq!(db.count("routines").await, before, "nothing was written");
}

#[tokio::test]
async fn limits_are_set_listed_and_deleted() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    ok(
        url,
        &create_args(
            "render",
            "0 3 * * *",
            &["--message", "go", "--concurrency-key", "gpu-pool"],
        ),
    );
    // An empty list still has its header; as JSON, an empty array.
    let empty = ok(url, &["limit", "list"]);
    assert_eq!(empty.lines().count(), 1, "{empty}");
    assert!(empty.starts_with("KEY"), "{empty}");
    for column in ["MAX", "RUNNING", "ROUTINES"] {
        assert!(empty.contains(column), "{empty}");
    }
    assert_eq!(ok(url, &["limit", "list", "--json"]).trim(), "[]");

    assert_eq!(
        ok(url, &["limit", "set", "gpu-pool", "2"]).trim(),
        "limit gpu-pool: 2 at once (new)"
    );
    assert_eq!(
        ok(url, &["limit", "set", "gpu-pool", "3"]).trim(),
        "limit gpu-pool: 3 at once (changed)"
    );
    assert_eq!(
        ok(url, &["limit", "set", "tenant:acme", "0"]).trim(),
        "limit tenant:acme: 0 at once (new)"
    );
    let listed = ok(url, &["limit", "list"]);
    let rows: Vec<Vec<&str>> = listed
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows,
        [
            vec!["KEY", "MAX", "RUNNING", "ROUTINES"],
            vec!["gpu-pool", "3", "0", "1"],
            vec!["tenant:acme", "0", "0", "0"],
        ],
        "{listed}"
    );
    let json: Value = serde_json::from_str(ok(url, &["limit", "list", "--json"]).trim()).unwrap();
    let all = json.as_array().expect("one JSON array");
    assert_eq!(all.len(), 2, "{json}");
    assert_eq!(all[0]["key"], "gpu-pool");
    assert_eq!(all[0]["max_running"], 3);
    assert_eq!(all[0]["running"], 0);
    assert_eq!(all[0]["routines"], 1);
    assert!(all[0]["updated_at"].is_string(), "{json}");
    assert_eq!(all[1]["key"], "tenant:acme");
    assert_eq!(all[1]["max_running"], 0);
    assert_eq!(
        concurrency_line(url, "render").as_deref(),
        Some("concurrency gpu-pool: at most 3 at once (0 running)")
    );

    assert_eq!(
        ok(url, &["limit", "delete", "gpu-pool"]).trim(),
        "deleted limit gpu-pool"
    );
    // A key with no limit: exit 2, as deleting a missing calendar is.
    check_fails(url, &["limit", "delete", "gpu-pool"], 2, "no limit is set");
    check_fails(url, &["limit", "delete", "never-set"], 2, "\"never-set\"");
    let json: Value = serde_json::from_str(ok(url, &["limit", "list", "--json"]).trim()).unwrap();
    assert_eq!(json.as_array().map(Vec::len), Some(1), "{json}");
    assert_eq!(json[0]["key"], "tenant:acme");
    // The routine keeps its key, now unlimited.
    assert_eq!(shown_json(url, "render")["concurrency_key"], "gpu-pool");
    assert_eq!(
        concurrency_line(url, "render").as_deref(),
        Some("concurrency gpu-pool: no limit set (unlimited)")
    );
}

#[tokio::test]
async fn a_bad_limit_exits_2_with_one_line_and_writes_nothing() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    ok(url, &["limit", "set", "gpu-pool", "2"]);
    let before = db.count("concurrency_limits").await;
    for (args, fragment) in [
        (
            vec!["limit", "set", "gpu-pool", "1000001"],
            "a concurrency limit must be 0 to 1000000 (it was 1000001)",
        ),
        (
            vec!["limit", "set", "other", "99999999999999999999"],
            "a concurrency limit must be 0 to 1000000",
        ),
        (
            vec!["limit", "set", "other", "-1"],
            "a concurrency limit must be 0 to 1000000 (it was -1)",
        ),
        (
            vec!["limit", "set", "other", "many"],
            "is not a concurrency limit",
        ),
        (
            vec!["limit", "set", "gpu pool", "2"],
            "a concurrency key is 1 to 100 letters",
        ),
        (
            vec!["limit", "set", "tenant!", "2"],
            "a concurrency key is 1 to 100 letters",
        ),
        (vec!["limit", "set", "other"], "<N>"),
        (
            vec!["limit", "delete", "gpu pool"],
            "a concurrency key is 1 to 100 letters",
        ),
    ] {
        check_fails(url, &args, 2, fragment);
    }
    assert_eq!(db.count("concurrency_limits").await, before);
    let max: i32 = sqlx::query_scalar("SELECT max_running FROM cm.concurrency_limits")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(max, 2, "the limit is as it was set");
}

#[tokio::test]
async fn a_json_lines_import_gives_the_concurrency_key() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let file = std::env::temp_dir().join(format!("{}-keys.jsonl", db.name));
    let keyed =
        r#"{"name":"keyed","schedule":"0 9 * * *","message":"m","concurrency_key":"tenant:acme"}"#;
    let plain = r#"{"name":"plain","schedule":"0 9 * * *","message":"m"}"#;
    let bad =
        r#"{"name":"bad","schedule":"0 9 * * *","message":"m","concurrency_key":"no spaces"}"#;
    let path = file.to_str().unwrap();

    // A bad key refuses the whole file, naming its line.
    std::fs::write(&file, format!("{keyed}\n{plain}\n{bad}\n")).unwrap();
    check_fails(
        url,
        &["routine", "import", path],
        2,
        ":3: concurrency_key: a concurrency key is 1 to 100 letters",
    );
    // So does a key that is not a string.
    std::fs::write(
        &file,
        format!(
            "{keyed}\n{}\n",
            r#"{"name":"n","schedule":"0 9 * * *","message":"m","concurrency_key":7}"#
        ),
    )
    .unwrap();
    check_fails(url, &["routine", "import", path], 2, ":2: not a routine");
    assert_eq!(db.count("routines").await, 0, "nothing was written");

    std::fs::write(&file, format!("{keyed}\n{plain}\n")).unwrap();
    let out = ok(url, &["routine", "import", path]);
    assert_eq!(out.lines().count(), 2, "{out}");
    assert_eq!(shown_json(url, "keyed")["concurrency_key"], "tenant:acme");
    assert_eq!(shown_json(url, "plain")["concurrency_key"], Value::Null);

    // A sync with a changed key updates that routine only; the other is unchanged.
    let moved = keyed.replace("tenant:acme", "tenant:globex");
    std::fs::write(&file, format!("{moved}\n{plain}\n")).unwrap();
    let out = ok(url, &["routine", "import", path, "--sync"]);
    assert!(
        out.lines()
            .any(|l| l.starts_with("updated") && l.ends_with("keyed")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("unchanged") && l.ends_with("plain")),
        "{out}"
    );
    assert_eq!(shown_json(url, "keyed")["concurrency_key"], "tenant:globex");
    let _ = std::fs::remove_file(&file);
    assert_eq!(db.count("routines").await, 2);
}
