//! The first-party plugins on real things, as one test binary: the tests here share no state
//! (each works in its own copy of a node root), so they run side by side as one file's tests
//! did. The two that run Operations on the lab's nodes are the `operations` binary. Run one
//! file's tests by its module, e.g. `cargo test -p bosun-plugins-tests --test plugins packages::`.

mod certs;
mod conformance;
mod conformance_first_party;
mod etcd;
mod examples;
mod hello;
mod kubeadm_upgrade;
mod kubelet;
mod packages;
mod planner_steps;
mod zypper;
