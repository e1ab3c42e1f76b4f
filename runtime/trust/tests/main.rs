//! The trust crate's integration tests, as one test binary. Run one file's tests by its
//! module, e.g. `cargo test -p bosun-trust --test trust openssl::`.

mod openssl;
mod verify;
