//! The Bosun lab: a real control plane on loopback.
