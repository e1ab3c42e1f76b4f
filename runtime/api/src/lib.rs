//! Bosun's Kubernetes API types (CRDs). No I/O.
