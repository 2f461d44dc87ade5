//! Tidy checks of the house's layout: rooms of one concern stay small, and the binary stays glue.
//!
//! A source file that grows past [`MAX_FILE_LINES`] holds more than one concern (the ledger, the
//! engine and the page each reached 1,400-2,200 lines before they became folders); and code that
//! only the binary compiles cannot be used, or unit-tested, by a service that embeds the library,
//! so the binary's own modules stay under [`MAX_BINARY_ONLY_LINES`] in all.

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    /// The most lines one source file of a product crate may have.
    const MAX_FILE_LINES: usize = 1_000;

    /// The most lines the `cm-scheduler` binary may compile that the library does not:
    /// `main.rs` and every module only it declares (flag definitions, printing).
    const MAX_BINARY_ONLY_LINES: usize = 1_500;

    /// The crates other services depend on, and the scheduler built from them.
    const PRODUCT_CRATES: [&str; 4] = ["cm-domain", "cm-store", "cm-dispatch", "cm-scheduler"];

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_path_buf()
    }

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    fn lines(file: &Path) -> usize {
        std::fs::read_to_string(file).unwrap().lines().count()
    }

    #[test]
    fn no_source_file_of_a_product_crate_is_over_a_thousand_lines() {
        let mut files = Vec::new();
        for krate in PRODUCT_CRATES {
            rust_files(&root().join(krate).join("src"), &mut files);
        }
        assert!(files.len() > 40, "found only {} files", files.len());
        let large: Vec<String> = files
            .iter()
            .filter_map(|f| {
                let n = lines(f);
                (n > MAX_FILE_LINES)
                    .then(|| format!("{} ({n})", f.strip_prefix(root()).unwrap().display()))
            })
            .collect();
        assert!(
            large.is_empty(),
            "over {MAX_FILE_LINES} lines, split by concern: {large:?}"
        );
    }

    /// The modules `main.rs` declares (`mod NAME;`), which only the binary compiles.
    fn binary_only_files() -> Vec<PathBuf> {
        let src = root().join("cm-scheduler/src");
        let main = src.join("main.rs");
        let mut files = vec![main.clone()];
        for line in std::fs::read_to_string(&main).unwrap().lines() {
            let line = line.trim();
            let Some(name) = line
                .strip_prefix("mod ")
                .or_else(|| line.strip_prefix("pub mod "))
                .and_then(|rest| rest.strip_suffix(';'))
            else {
                continue;
            };
            let file = src.join(format!("{name}.rs"));
            if file.exists() {
                files.push(file);
            }
            let folder = src.join(name);
            if folder.is_dir() {
                rust_files(&folder, &mut files);
            }
        }
        files
    }

    #[test]
    fn the_binary_compiles_little_the_library_does_not() {
        let files = binary_only_files();
        let total: usize = files.iter().map(|f| lines(f)).sum();
        let listed: Vec<String> = files
            .iter()
            .map(|f| {
                format!(
                    "{} ({})",
                    f.strip_prefix(root()).unwrap().display(),
                    lines(f)
                )
            })
            .collect();
        assert!(
            total <= MAX_BINARY_ONLY_LINES,
            "the binary alone compiles {total} lines (at most {MAX_BINARY_ONLY_LINES}): \
             move what is not flag parsing or printing into the library: {listed:?}"
        );
    }
}
