//! The Rust SDK for Bosun plugins.
//!
//! A Bosun plugin is a WebAssembly component (`wasm32-wasip2`) that the agent on each node
//! runs inside a sandbox, reaching only the host capabilities an administrator granted.
//! This crate owns everything between a plugin author's Rust code and the ABI
//! (`sdk/wit/plugin.wit`, package `bosun:plugin@0.2.0`): the generated bindings, the
//! dispatch of `describe` / `preflight` / `run` with typed params, and safe wrappers over
//! the host interfaces (files, commands, services, facts, logs, downloads).
//!
//! A plugin implements one trait and writes one macro line:
//!
//! ```ignore
//! use bosun_plugin_sdk::prelude::*;
//!
//! /// Every action with its params; the SDK picks the variant by the action name.
//! #[derive(Deserialize, JsonSchema)]
//! #[serde(tag = "action", content = "params", rename_all = "kebab-case")]
//! enum Action {
//!     Greet(GreetParams),
//! }
//!
//! #[derive(Deserialize, JsonSchema)]
//! #[serde(deny_unknown_fields)]
//! struct GreetParams { name: String }
//!
//! struct Hello;
//!
//! impl Plugin for Hello {
//!     type Action = Action;
//!
//!     fn metadata() -> Metadata {
//!         bosun_plugin_sdk::metadata!()
//!             .action(ActionInfo::new("greet", "Say hello").params::<GreetParams>().idempotent())
//!     }
//!
//!     fn run(action: Action, ctx: &RunContext) -> Result<Outcome, PluginError> {
//!         let Action::Greet(p) = action;
//!         info!("greeting {}", p.name);
//!         Ok(Outcome::unchanged(format!("hello, {}", p.name)))
//!     }
//! }
//!
//! bosun_plugin_sdk::export_plugin!(Hello);
//! ```
//!
//! Build it with `cargo build --release --target wasm32-wasip2`; the `.wasm` file in
//! `target/wasm32-wasip2/release/` is the component to sign and run.
//!
//! The crate also compiles for native targets so a workspace that contains plugins can be
//! checked and unit-tested on the host; calling a host import there panics, because only
//! the Bosun host provides them.

pub mod exec;
pub mod facts;
pub mod fs;
pub mod http;
pub mod log;
pub mod service;

mod dispatch;
mod error;
mod metadata;
mod outcome;

pub use error::{HostError, PluginError};
pub use metadata::{ActionInfo, Capabilities, CommandRequest, Metadata, PathRequest, UnitRequest};
pub use outcome::{Check, CheckStatus, Outcome, RunContext};

/// The ABI version this SDK builds plugins against (the WIT package version).
pub const ABI_VERSION: &str = "0.2.0";

/// What a plugin implements.
///
/// The host calls `describe` when it loads or inspects a plugin, `preflight` before a
/// step and `run` to perform it. Each call happens in a fresh instance, so a plugin keeps
/// no state between calls (use the node itself, through granted files, as the state).
pub trait Plugin {
    /// The actions with their typed params, usually an enum adjacently tagged as
    /// `#[serde(tag = "action", content = "params")]`: the SDK deserializes
    /// `{"action": <action name>, "params": <params JSON>}` into it, so an unknown action
    /// ends in a `unknown-action` error and bad params in a `bad-params` error that names
    /// the offending field, before your code runs. Empty params are read as `{}`.
    type Action: serde::de::DeserializeOwned;

    /// Name, version, actions (with params schema and idempotency) and the capabilities the
    /// plugin asks for. Must be cheap and must not touch the node. Start from
    /// [`metadata!`], which fills name, version and description from `Cargo.toml`.
    fn metadata() -> Metadata;

    /// Checks whether `action` can run on this node, without changing anything. A check
    /// with [`CheckStatus::Fail`] stops the step before `run`. The default has no checks.
    ///
    /// # Errors
    /// Return a [`PluginError`] when the checks themselves cannot be made.
    fn preflight(action: &Self::Action) -> Result<Vec<Check>, PluginError> {
        let _ = action;
        Ok(Vec::new())
    }

    /// Performs `action`. When `ctx.dry_run` is set the plugin must not change the node: it
    /// says what it would do in the outcome message and returns `changed: false`. When
    /// `ctx.resumed` is set, the previous attempt of this step on this node was interrupted
    /// part-way (see [`RunContext::resumed`]): state that says "already done" may be only
    /// half the change.
    ///
    /// # Errors
    /// A [`PluginError`] with a stable code; mark it retryable when the same step may
    /// succeed if tried again unchanged.
    fn run(action: Self::Action, ctx: &RunContext) -> Result<Outcome, PluginError>;
}

/// Starts a [`Metadata`] with the calling crate's name, version and description from its
/// `Cargo.toml` (`CARGO_PKG_NAME`, `CARGO_PKG_VERSION`, `CARGO_PKG_DESCRIPTION`). Override
/// any of them with the builder methods, for example `.name("hello")`.
#[macro_export]
macro_rules! metadata {
    () => {
        $crate::Metadata::new(
            ::core::env!("CARGO_PKG_NAME"),
            ::core::env!("CARGO_PKG_VERSION"),
        )
        .description(::core::env!("CARGO_PKG_DESCRIPTION"))
    };
}

/// Exports a type implementing [`Plugin`] as the component's `bosun:plugin/plugin`
/// interface. Write it once, at the crate root of a `cdylib` crate.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        const _: () = {
            struct __BosunPluginExport;

            impl $crate::__private::Guest for __BosunPluginExport {
                fn describe() -> $crate::__private::WitMetadata {
                    $crate::__private::describe::<$plugin>()
                }

                fn preflight(
                    action: ::std::string::String,
                    params: ::std::string::String,
                ) -> ::core::result::Result<
                    ::std::vec::Vec<$crate::__private::WitCheck>,
                    $crate::__private::WitPluginError,
                > {
                    $crate::__private::preflight::<$plugin>(&action, &params)
                }

                fn run(
                    action: ::std::string::String,
                    params: ::std::string::String,
                    context: $crate::__private::WitRunContext,
                ) -> ::core::result::Result<
                    $crate::__private::WitOutcome,
                    $crate::__private::WitPluginError,
                > {
                    $crate::__private::run::<$plugin>(&action, &params, context)
                }
            }

            // Only a wasm component exports the ABI symbols (their names, such as
            // `bosun:plugin/plugin@0.2.0#run`, are not valid in native linker scripts);
            // on the host the impl above is still type-checked and unit tests link.
            #[cfg(target_arch = "wasm32")]
            $crate::__private::bindings::export!(
                __BosunPluginExport with_types_in $crate::__private::bindings
            );
        };
    };
}

/// Everything a plugin usually needs, for `use bosun_plugin_sdk::prelude::*;`.
pub mod prelude {
    pub use crate::exec::Command;
    pub use crate::{
        ActionInfo, Check, CheckStatus, HostError, Metadata, Outcome, Plugin, PluginError,
        RunContext, debug, error, info, warn,
    };
    #[cfg(feature = "schema")]
    pub use schemars::JsonSchema;
    pub use serde::{Deserialize, Serialize};
}

#[cfg(feature = "schema")]
pub use schemars;
pub use serde;
pub use serde_json;

// Lets the generated bindings name this crate by its absolute path, the same path the
// export macro uses from plugin crates.
extern crate self as bosun_plugin_sdk;

/// Code generated by wit-bindgen from `sdk/wit`. Not part of the SDK's API: plugins use the
/// typed wrappers in this crate, and the export macro reaches the bindings through
/// `__private`.
#[doc(hidden)]
#[allow(unsafe_code, clippy::all, clippy::pedantic, missing_docs)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "bosun-plugin",
        path: "../wit",
        // The `export!` macro is used by plugin crates, which do not depend on wit-bindgen
        // themselves: make it public and route every path through this crate.
        pub_export_macro: true,
        default_bindings_module: "::bosun_plugin_sdk::__private::bindings",
        runtime_path: "::bosun_plugin_sdk::__private::wit_bindgen::rt",
    });
}

#[doc(hidden)]
pub mod __private {
    //! Used by [`export_plugin!`](crate::export_plugin); not a stable API.
    pub use crate::bindings;
    pub use crate::bindings::exports::bosun::plugin::plugin::{
        Check as WitCheck, Guest, Metadata as WitMetadata, Outcome as WitOutcome,
        PluginError as WitPluginError, RunContext as WitRunContext,
    };
    pub use crate::dispatch::{describe, preflight, run};
    pub use wit_bindgen;
}
