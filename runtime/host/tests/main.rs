//! The host's integration tests, as one test binary: each linked test binary carries
//! wasmtime, so one binary instead of six saves five links (issue 38). Run one file's tests
//! with its module name, e.g. `cargo test -p bosun-host --test host sandbox::`.

mod support;

mod dry_run;
mod exec_grants;
mod grant_paths;
mod hostile;
mod https;
mod limits;
mod sandbox;
