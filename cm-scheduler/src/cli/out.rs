//! Standard output for the commands. A reader that goes away (`cm-scheduler routine list |
//! head -1`) ends the command quietly with exit code 0, as Unix tools do, where `println!`
//! would panic; any other write error ends it with one line on stderr and exit code 1.

use std::io::{self, Write as _};

/// Writes one line to standard output (the `say!` macro formats it).
pub(crate) fn line(args: std::fmt::Arguments<'_>) {
    checked(writeln!(io::stdout().lock(), "{args}"));
}

/// Writes `bytes` to standard output as they are (a completion script).
pub(crate) fn bytes(bytes: &[u8]) {
    let mut out = io::stdout().lock();
    checked(out.write_all(bytes).and_then(|()| out.flush()));
}

fn checked(result: io::Result<()>) {
    match result {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => {
            eprintln!("cm-scheduler: cannot write to standard output: {e}");
            std::process::exit(1);
        }
    }
}
