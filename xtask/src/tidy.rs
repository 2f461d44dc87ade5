//! Tidy checks: boundaries the architecture promises, checked by tests rather than by hope.

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};
    use std::process::Command;

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_path_buf()
    }

    /// The crates `cm-domain` must never depend on: runtimes, databases, I/O stacks.
    const FORBIDDEN_IN_DOMAIN: &[&str] = &[
        "tokio",
        "sqlx",
        "async-std",
        "smol",
        "mio",
        "hyper",
        "reqwest",
        "async-trait",
        "futures",
        "postgres",
    ];

    /// What `cargo tree --prefix none --offline ARGS` prints, run in the workspace.
    fn cargo_tree(args: &[&str]) -> String {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let output = Command::new(cargo)
            .current_dir(root())
            .arg("tree")
            .args(args)
            .args(["--prefix", "none", "--offline"])
            .output()
            .expect("cargo tree runs");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    #[test]
    fn the_domain_is_pure() {
        let tree = cargo_tree(&["--package", "cm-domain", "--edges", "normal"]);
        let crates: Vec<&str> = tree
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert!(crates.contains(&"croner"), "the tree was not read: {tree}");
        for forbidden in FORBIDDEN_IN_DOMAIN {
            assert!(
                !crates
                    .iter()
                    .any(|c| c == forbidden || c.starts_with(&format!("{forbidden}-"))),
                "cm-domain depends on {forbidden}:\n{tree}"
            );
        }
    }

    #[test]
    fn the_domain_reads_no_clock_and_does_no_io() {
        // chrono's clock feature is on (croner enables it), so the type system alone would let
        // the domain call `Utc::now()`; this keeps `now` an argument.
        let mut files = Vec::new();
        rust_files(&root().join("cm-domain/src"), &mut files);
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for needle in [
                "::now()",
                "SystemTime",
                "std::fs",
                "std::net",
                "std::process",
                "std::thread",
            ] {
                assert!(
                    !text.contains(needle),
                    "{} contains {needle:?}",
                    file.display()
                );
            }
        }
    }

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if path.is_dir() {
                if !name.starts_with('.') && !name.starts_with("target") {
                    rust_files(&path, out);
                }
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }

    #[test]
    fn every_source_file_says_what_it_is_for() {
        let mut files = Vec::new();
        for krate in [
            "cm-domain",
            "migrations",
            "cm-store",
            "cm-dispatch",
            "cm-scheduler",
            "cm-lab",
            "xtask",
        ] {
            rust_files(&root().join(krate), &mut files);
        }
        assert!(files.len() > 20, "found only {} files", files.len());
        let missing: Vec<_> = files
            .iter()
            .filter(|f| {
                let text = std::fs::read_to_string(f).unwrap();
                !text.trim_start().starts_with("//!")
            })
            .map(|f| f.strip_prefix(root()).unwrap().display().to_string())
            .collect();
        assert!(missing.is_empty(), "files without a //! line: {missing:?}");
    }

    #[test]
    fn xtask_builds_nothing_but_itself() {
        // `cargo xtask demo` builds xtask before anything else: with a dependency it would
        // build that first, and with the engine's (as when the harness lived here) the demo's
        // first run waited for every backend to compile.
        let tree = cargo_tree(&["--package", "xtask", "--edges", "normal,build"]);
        let packages: Vec<&str> = tree.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(
            packages.len() == 1 && packages[0].starts_with("xtask "),
            "xtask depends on more than the standard library:\n{tree}"
        );
    }

    #[test]
    fn every_ignored_test_names_the_service_it_needs() {
        // `cargo xtask test` runs an ignored test where its service is present and counts it
        // as skipped where it is not; an ignore without a known service would hide a test.
        let mut files = Vec::new();
        for krate in [
            "cm-domain",
            "cm-store",
            "cm-dispatch",
            "cm-scheduler",
            "cm-lab",
        ] {
            rust_files(&root().join(krate), &mut files);
        }
        let mut ignored = 0;
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for (at, _) in text.match_indices("#[ignore") {
                let rest = &text[at..];
                let line = &rest[..rest.find('\n').unwrap_or(rest.len())];
                let known = crate::testrun::SERVICES
                    .iter()
                    .any(|s| line.starts_with(&format!("#[ignore = \"{}: ", s.needs)));
                assert!(
                    known,
                    "{}: `{line}` names no service `cargo xtask test` knows",
                    file.display()
                );
                ignored += 1;
            }
        }
        assert!(ignored > 0, "no ignored test found: the search is broken");
    }

    #[test]
    fn sql_lives_in_cm_store() {
        // A statement outside cm-store would escape the one place that shows every statement
        // the system sends. Tests may run SQL to set up and inspect; product code may not.
        let mut files = Vec::new();
        for krate in ["cm-domain", "cm-dispatch", "cm-scheduler"] {
            rust_files(&root().join(krate).join("src"), &mut files);
        }
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for needle in ["sqlx::query", "INSERT INTO", "UPDATE routine", "SELECT "] {
                assert!(
                    !text.contains(needle),
                    "{} contains {needle:?}",
                    file.display()
                );
            }
        }
    }

    #[test]
    fn the_status_page_never_imports_the_router() {
        // The dependency goes one way: `http` routes to the page's handlers and draws its
        // refusals, and the page reads only `http_state`; were the page to import `http` too,
        // the two would be one module in all but name.
        let mut files = Vec::new();
        rust_files(&root().join("cm-scheduler/src/page"), &mut files);
        assert!(
            !files.is_empty(),
            "no file of the page found: the search is broken"
        );
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let imports_http = text
                .match_indices("crate::http")
                .any(|(at, needle)| !text[at + needle.len()..].starts_with('_'));
            assert!(!imports_http, "{} imports crate::http", file.display());
        }
    }

    #[test]
    fn the_engine_knows_nothing_of_the_application() {
        // The loop is what a service embeds: it takes a store, a dispatcher and a validated
        // configuration, and knows nothing of flags, HTTP, the page or the operations built
        // around it in the same crate.
        let mut files = Vec::new();
        rust_files(&root().join("cm-scheduler/src/engine"), &mut files);
        assert!(
            files.len() > 5,
            "no file of the engine found: the search is broken"
        );
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for module in [
                "http",
                "page",
                "service",
                "operations",
                "flags",
                "import",
                "edit",
                "bounded",
            ] {
                let needle = format!("crate::{module}");
                assert!(!text.contains(&needle), "{} names {needle}", file.display());
            }
        }
    }

    #[test]
    fn cm_dispatch_does_no_logging() {
        // What a backend met goes back in its `Receipt` or its `DispatchError`, and the
        // scheduler decides what to log (through its scrubber); a log line written here would
        // bypass both, and could carry a target's URL or a header.
        let mut files = Vec::new();
        rust_files(&root().join("cm-dispatch/src"), &mut files);
        assert!(files.len() > 10, "found only {} files", files.len());
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for needle in [
                "tracing::",
                "log::",
                "println!",
                "eprintln!",
                "print!(",
                "dbg!",
            ] {
                assert!(
                    !text.contains(needle),
                    "{} contains {needle:?}",
                    file.display()
                );
            }
        }
        let direct = cargo_tree(&[
            "--package",
            "cm-dispatch",
            "--all-features",
            "--edges",
            "normal",
            "--depth",
            "1",
        ]);
        for line in direct.lines().skip(1) {
            let name = line.split_whitespace().next().unwrap_or("");
            assert!(
                name != "tracing" && name != "log",
                "cm-dispatch depends on {name} directly:\n{direct}"
            );
        }
    }

    /// The workspace's crates each product crate depends on, through any path, in a normal
    /// build with every feature.
    fn workspace_dependencies(package: &str) -> BTreeSet<String> {
        let tree = cargo_tree(&["--package", package, "--all-features", "--edges", "normal"]);
        let found: BTreeSet<String> = tree
            .lines()
            .skip(1)
            .filter(|l| l.contains(" (/"))
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_string)
            .collect();
        assert!(
            tree.lines().next().is_some_and(|l| l.starts_with(package)),
            "the tree was not read: {tree}"
        );
        found
    }

    #[test]
    fn the_crates_depend_downward_only() {
        // cm-domain below cm-store below cm-dispatch below cm-scheduler: a sibling service
        // imports the lower crates without the engine, its HTTP stack or its backends' clients.
        // cm-migrations is the schema's SQL alone, below the store that applies it.
        let allowed: [(&str, &[&str]); 5] = [
            ("cm-domain", &[]),
            ("cm-migrations", &["cm-workspace-hack"]),
            (
                "cm-store",
                &["cm-domain", "cm-migrations", "cm-workspace-hack"],
            ),
            (
                "cm-dispatch",
                &[
                    "cm-domain",
                    "cm-migrations",
                    "cm-store",
                    "cm-workspace-hack",
                ],
            ),
            (
                "cm-scheduler",
                &[
                    "cm-domain",
                    "cm-migrations",
                    "cm-store",
                    "cm-dispatch",
                    "cm-workspace-hack",
                ],
            ),
        ];
        for (package, may) in allowed {
            let found = workspace_dependencies(package);
            let extra: Vec<&String> = found
                .iter()
                .filter(|d| !may.contains(&d.as_str()))
                .collect();
            assert!(
                extra.is_empty(),
                "{package} depends on {extra:?}, above it or beside it"
            );
        }
    }

    #[test]
    fn only_cm_store_depends_on_the_database_driver() {
        // Every statement goes through cm-store's traits; a crate above it with sqlx of its own
        // could send one. Tests may (a dev-dependency), product code may not.
        for package in ["cm-domain", "cm-dispatch", "cm-scheduler"] {
            let direct = cargo_tree(&[
                "--package",
                package,
                "--all-features",
                "--edges",
                "normal",
                "--depth",
                "1",
            ]);
            let names: Vec<&str> = direct
                .lines()
                .filter_map(|l| l.split_whitespace().next())
                .collect();
            assert!(names.len() > 3, "the tree was not read: {direct}");
            assert!(
                !names.iter().any(|n| *n == "sqlx" || n.starts_with("sqlx-")),
                "{package} depends on sqlx directly:\n{direct}"
            );
        }
    }

    #[test]
    fn the_stores_sql_is_private() {
        // The statements are the store's to change: a caller names what it wants done (a trait
        // method, an `explain::HotStatement`), never a statement's text.
        let mut files = Vec::new();
        rust_files(&root().join("cm-store/src"), &mut files);
        let mut constants = 0;
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let in_sql_folder = file
                .strip_prefix(root())
                .unwrap()
                .components()
                .any(|c| c.as_os_str() == "sql");
            for line in text.lines() {
                let line = line.trim_start();
                let is_sql = line.contains("_SQL");
                if is_sql && (line.contains("const ") || line.contains("static ")) {
                    constants += 1;
                }
                let public = [
                    "pub const ",
                    "pub static ",
                    "pub use ",
                    "pub fn ",
                    "pub mod ",
                ]
                .iter()
                .any(|p| line.starts_with(p));
                // A folder of statements (`ledger/sql/`) re-exports them by glob; it and its
                // module stay crate-private too.
                let names_sql = is_sql
                    || line.contains("sql::")
                    || line.starts_with("pub mod sql")
                    || in_sql_folder;
                assert!(
                    !(public && names_sql),
                    "{}: `{line}` makes a statement public",
                    file.display()
                );
            }
        }
        assert!(
            constants > 20,
            "only {constants} statements found: the search is broken"
        );
    }

    /// Each third-party package's feature sets (one per build it takes part in: for the target,
    /// for build scripts and proc macros) in the build that `args` select.
    fn features(args: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
        let mut args = args.to_vec();
        args.extend(["--format", "{p} {f}"]);
        let mut found: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for line in cargo_tree(&args).lines() {
            let line = line.trim_end_matches(" (*)").replace(" (proc-macro)", "");
            let mut words = line.splitn(3, ' ');
            let (Some(name), Some(version)) = (words.next(), words.next()) else {
                continue;
            };
            let rest = words.next().unwrap_or("");
            // The workspace's own crates differ on purpose (their `mock` and `fakes` features
            // in tests) and are rebuilt anyway when they change.
            if rest.starts_with('(') {
                continue;
            }
            found
                .entry(format!("{name} {version}"))
                .or_default()
                .insert(rest.to_string());
        }
        assert!(
            found.keys().any(|k| k.starts_with("tokio ")),
            "the tree was not read: {found:?}"
        );
        found
    }

    #[test]
    fn every_command_builds_one_set_of_dependency_features() {
        // Cargo unifies features over the packages a command builds, so a dependency that one
        // member or test asks more of is built twice, and each switch between `cargo test`,
        // `cargo xtask …` and `cargo build -p cm-scheduler` rebuilds it and everything above
        // it. The binary's build is the reference: xtask and the tests may add packages, never
        // features of a package the binary builds. Align a new dependency's features in the
        // workspace's `[workspace.dependencies]` instead.
        let binary = features(&["--package", "cm-scheduler", "--edges", "no-dev"]);
        let builds = [
            (
                "cargo xtask bench|chaos|scale (cm-lab)",
                features(&["--package", "cm-lab", "--edges", "no-dev"]),
            ),
            ("cargo test --workspace", features(&["--workspace"])),
        ];
        for (command, build) in builds {
            let differing: Vec<String> = build
                .iter()
                .filter_map(|(package, sets)| {
                    let reference = binary.get(package)?;
                    (reference != sets).then(|| {
                        format!("{package}: {reference:?} for the binary, {sets:?} for {command}")
                    })
                })
                .collect();
            assert!(
                differing.is_empty(),
                "`{command}` builds dependencies with other features than \
                 `cargo build -p cm-scheduler`, so each rebuilds them:\n{}",
                differing.join("\n")
            );
        }
    }

    /// The front door stays a front door: what it is, the set-up, a tour and where to read
    /// on. The manual is `docs/guide/`.
    const README_MAX_LINES: usize = 300;

    /// Markdown files that are generated elsewhere and may be linked before they exist in a
    /// checkout: the command-line reference is written by cm-scheduler's CLI reference test
    /// from the clap definitions.
    const GENERATED_DOCS: &[&str] = &["docs/guide/cli.md"];

    #[test]
    fn the_readme_is_a_front_door() {
        let text = std::fs::read_to_string(root().join("README.md")).unwrap();
        let lines = text.lines().count();
        assert!(
            lines <= README_MAX_LINES,
            "README.md has {lines} lines, more than {README_MAX_LINES}: move the detail to docs/guide/"
        );
    }

    /// The Markdown files whose links are checked: README.md, ARCHITECTURE.md and docs/**.
    fn markdown_files() -> Vec<PathBuf> {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path, out);
                } else if path.extension().is_some_and(|e| e == "md") {
                    out.push(path);
                }
            }
        }
        let mut files = vec![root().join("README.md"), root().join("ARCHITECTURE.md")];
        walk(&root().join("docs"), &mut files);
        files.sort();
        files
    }

    /// The targets of a Markdown text's inline links (`[text](target)`) and reference
    /// definitions (`[label]: target`), outside fenced code blocks and inline code.
    fn link_targets(text: &str) -> Vec<String> {
        let mut targets = Vec::new();
        let mut fenced = false;
        for line in text.lines() {
            let trimmed = line.trim_start();
            if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
                fenced = !fenced;
                continue;
            }
            if fenced {
                continue;
            }
            // Inline code is text, not a link: drop every span between backticks.
            let prose: String = line
                .split('`')
                .enumerate()
                .filter(|(i, _)| i % 2 == 0)
                .map(|(_, part)| part)
                .collect::<Vec<_>>()
                .join(" ");
            if let Some(rest) = prose.trim_start().strip_prefix('[')
                && let Some((_, target)) = rest.split_once("]: ")
            {
                targets.push(target.split_whitespace().next().unwrap_or("").to_string());
            }
            let mut rest = prose.as_str();
            while let Some(at) = rest.find("](") {
                rest = &rest[at + 2..];
                let end = rest.find(')').unwrap_or(rest.len());
                let target = rest[..end].trim();
                let target = target.strip_prefix('<').unwrap_or(target);
                let target = target.split(['>', ' ']).next().unwrap_or("");
                targets.push(target.to_string());
                rest = &rest[end..];
            }
        }
        targets
    }

    /// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
    fn anchor_of(heading: &str) -> String {
        heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect()
    }

    /// The anchors a Markdown file's headings make, duplicates numbered as GitHub numbers them.
    fn anchors(text: &str) -> BTreeSet<String> {
        let mut found = BTreeSet::new();
        let mut fenced = false;
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                continue;
            }
            let Some(heading) = line.strip_prefix('#') else {
                continue;
            };
            if fenced || !(heading.starts_with(' ') || heading.starts_with('#')) {
                continue;
            }
            let base = anchor_of(heading.trim_start_matches('#'));
            let mut anchor = base.clone();
            let mut n = 0;
            while found.contains(&anchor) {
                n += 1;
                anchor = format!("{base}-{n}");
            }
            found.insert(anchor);
        }
        found
    }

    /// `path` with `.` and `..` taken out, without asking the file system.
    fn normalized(path: &Path) -> PathBuf {
        let mut out = PathBuf::new();
        for part in path.components() {
            match part {
                std::path::Component::ParentDir => {
                    out.pop();
                }
                std::path::Component::CurDir => {}
                other => out.push(other),
            }
        }
        out
    }

    #[test]
    fn every_relative_link_in_the_docs_points_to_a_file_that_exists() {
        let root = root();
        let mut broken = Vec::new();
        let mut checked = 0;
        for file in markdown_files() {
            let text = std::fs::read_to_string(&file).unwrap();
            let name = file.strip_prefix(&root).unwrap().display().to_string();
            for target in link_targets(&text) {
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, anchor) = match target.split_once('#') {
                    Some((path, anchor)) => (path, Some(anchor)),
                    None => (target.as_str(), None),
                };
                checked += 1;
                let resolved = if path.is_empty() {
                    file.clone()
                } else {
                    normalized(&file.parent().unwrap().join(path))
                };
                let relative = resolved
                    .strip_prefix(&root)
                    .map(|p| p.display().to_string())
                    .unwrap_or_default();
                if GENERATED_DOCS.contains(&relative.as_str()) {
                    continue;
                }
                if !resolved.exists() {
                    broken.push(format!("{name}: {target} (no file {relative})"));
                    continue;
                }
                if let (Some(anchor), true) =
                    (anchor, resolved.extension().is_some_and(|e| e == "md"))
                {
                    let linked = std::fs::read_to_string(&resolved).unwrap();
                    if !anchors(&linked).contains(anchor) {
                        broken.push(format!("{name}: {target} (no heading makes #{anchor})"));
                    }
                }
            }
        }
        assert!(
            checked > 10,
            "only {checked} links found: the search is broken"
        );
        assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    }

    #[test]
    fn links_and_anchors_are_read_as_github_reads_them() {
        let text =
            "See [a](a.md) and [b](<b c.md#x>), not `[c](c.md)`.\n```\n[d](d.md)\n```\n[e]: e.md\n";
        assert_eq!(link_targets(text), ["a.md", "b", "e.md"]);
        assert_eq!(
            anchor_of(" The claim: `INSERT … RETURNING`, once"),
            "the-claim-insert--returning-once"
        );
        let headings = anchors("# A\n## A\n```\n# B\n```\n#hashtag\n");
        assert_eq!(
            headings,
            BTreeSet::from(["a".to_string(), "a-1".to_string()])
        );
    }
}
