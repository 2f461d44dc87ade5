//! The `cm-scheduler` binary: the command line over the scheduler and its store.
//!
//! Exit codes: 0 on success, 2 for bad input (one line on stderr, nothing written), 1 for any
//! other failure (the database unreachable, a migration refused).

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    cli::main()
}
