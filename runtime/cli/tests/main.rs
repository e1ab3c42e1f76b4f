//! The CLI's integration tests, as one test binary (one link instead of three). Run one
//! file's tests by its module, e.g. `cargo test -p kubectl-bosun --test cli doc_transcripts::`.

mod transcript;

mod cli;
mod doc_transcripts;
mod policy;
