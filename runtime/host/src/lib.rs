//! The wasmtime host that runs Bosun plugins.
