//! sqlx's `migrate!` embeds the `.sql` files when the crate is compiled, and on stable Rust it
//! cannot tell cargo which files it read: without this, a migration added (or pulled) after the
//! last build would be missing from the binary until something else rebuilt this crate.

fn main() {
    // The crate's directory: a `.sql` file added, changed or removed rebuilds it.
    println!("cargo:rerun-if-changed=.");
}
