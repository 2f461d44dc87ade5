//! cm developer tasks.
fn main() {}
