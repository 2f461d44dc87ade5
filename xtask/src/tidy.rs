//! Tidy checks: boundaries the architecture promises, checked by tests rather than by hope.

#[cfg(test)]
mod tests {
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

    #[test]
    fn the_domain_is_pure() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let output = Command::new(cargo)
            .current_dir(root())
            .args([
                "tree",
                "--package",
                "cm-domain",
                "--edges",
                "normal",
                "--prefix",
                "none",
                "--offline",
            ])
            .output()
            .expect("cargo tree runs");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let tree = String::from_utf8(output.stdout).unwrap();
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
            "cm-store",
            "cm-dispatch",
            "cm-scheduler",
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
}
