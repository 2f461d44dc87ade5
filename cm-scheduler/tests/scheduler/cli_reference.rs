//! `docs/guide/cli.md`, the command line's reference, is generated from the clap definitions
//! (`cm_scheduler::flags::reference`): this test fails when it is stale, and rewrites it with
//! `CM_BLESS_CLI=1 cargo test -p cm-scheduler --test tests cli_reference`, so a change to a
//! command's help shows in the diff of the commit that makes it.

use std::path::Path;

#[test]
fn cli_reference_is_the_generated_one() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/guide/cli.md");
    let now = cm_scheduler::flags::reference();
    let recorded = std::fs::read_to_string(&file).unwrap_or_default();
    if now == recorded {
        return;
    }
    if std::env::var_os("CM_BLESS_CLI").is_some() {
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, &now).unwrap();
        return;
    }
    let first = now
        .lines()
        .zip(recorded.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| now.lines().count().min(recorded.lines().count()));
    panic!(
        "docs/guide/cli.md is stale (first difference on line {}); rewrite it with \
         CM_BLESS_CLI=1 cargo test -p cm-scheduler --test tests cli_reference and commit it",
        first + 1
    );
}
