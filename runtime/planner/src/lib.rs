//! Plans an Operation into per-node tasks. A pure function.
