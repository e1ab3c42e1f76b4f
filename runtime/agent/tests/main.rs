//! The agent's integration tests, as one test binary (one link of wasmtime and kube instead
//! of three). Run one file's tests by its module, e.g. `cargo test -p bosun-agent --test agent sources::`.

mod cli;
mod sources;
mod status_writes;
