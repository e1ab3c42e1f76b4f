//! kubectl-bosun: the Bosun kubectl plugin.
fn main() {}
