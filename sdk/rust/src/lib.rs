//! The Rust SDK for Bosun plugins.
