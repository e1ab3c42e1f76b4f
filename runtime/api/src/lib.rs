//! Bosun's Kubernetes API types (group `bosun.dev`, version `v1alpha1`). No I/O.

pub mod grants;
