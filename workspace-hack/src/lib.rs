//! No code. `cm-store` (and so every crate of the workspace above `cm-domain`) depends on this
//! crate only for the dependency features its manifest turns on: with them, `cargo test`,
//! `cargo xtask …` and `cargo build -p cm-scheduler` unify to the same features and share one
//! build of each dependency instead of rebuilding it whenever the command changes.
