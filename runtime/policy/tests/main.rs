//! The policy engine's integration tests, as one test binary (one link instead of three).
//! Run one file's tests by its module, e.g. `cargo test -p bosun-policy --test policy library::`.

mod capabilities;
mod engine;
mod library;
