//! End-to-end tests of Bosun against the lab's real control plane (`tests/` of this crate).
//! Every test starts or reuses the lab through `bosun_lab::ensure_lab`.
