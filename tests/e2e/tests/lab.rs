//! The end-to-end tests whose every test holds the lab's nodes (`bosun_e2e::lock_lab_nodes`)
//! while it runs, as one test binary: they ran one at a time as separate binaries, and the
//! lock still runs them one at a time here, for one link of wasmtime and kube instead of
//! one per file. (`version_shows_the_client_and_the_running_controller` in `cli` takes no lock: it
//! starts its own controller and reads only its own Lease, as it did beside the other `cli`
//! tests.) Run one file's tests by its module, e.g. `cargo test -p bosun-e2e --test lab
//! lifecycle::`. The files that are binaries of their own run tests that do not take the lock,
//! or (`outage`) stop the lab's API server.

mod backends;
mod cli;
mod cordon;
mod exclusion;
mod lifecycle;
mod node_facts;
mod operator;
mod operator_control;
mod plugin_sources;
mod policy;
mod stalled_watch;
mod trust_and_capabilities;
