//! The command line's definitions (clap): what the binary parses, and what its reference in
//! `docs/guide/cli.md` is generated from.

pub mod schedule;
