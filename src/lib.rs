//! tilegrad: ground-truth gradients for GPU tile kernels, to check hand-written backward kernels.
//!
//! - [`check`]: [`check_backward`], which compares a hand-written backward with the ground-truth
//!   gradient of its forward and reports, element by element, where it is wrong;
//! - [`suite`]: [`suite::GradCase`], gradient checks for users' own `cargo test`;
//! - [`spec`]: launch spec files (TOML) describing a check without Rust; [`npy`]: `.npy` I/O;
//! - [`zoo`]: classic Triton kernels built with the Rust builder, with f64 references.
#![warn(missing_docs)]

pub mod check;
pub mod npy;
pub mod spec;
pub mod suite;
pub mod zoo;

pub use check::{check_backward, Backward, CheckError, CheckOptions, Forward, Inputs, Report};

/// The pages of the documentation, whose `rust` blocks run as doctests (`tests/docs.rs` runs the
/// blocks in other languages).
#[cfg(doctest)]
mod docs {
    #[doc = include_str!("../README.md")]
    struct Readme;
    #[doc = include_str!("../docs/architecture.md")]
    struct Architecture;
    #[doc = include_str!("../docs/benchmarks.md")]
    struct Benchmarks;
    #[doc = include_str!("../docs/blame.md")]
    struct Blame;
    #[doc = include_str!("../docs/error-map.md")]
    struct ErrorMap;
    #[doc = include_str!("../docs/python.md")]
    struct Python;
    #[doc = include_str!("../docs/reliability.md")]
    struct Reliability;
    #[doc = include_str!("../docs/rust.md")]
    struct Rust;
    #[doc = include_str!("../docs/spec.md")]
    struct Spec;
    #[doc = include_str!("../docs/triton.md")]
    struct Triton;
    #[doc = include_str!("../docs/verdicts.md")]
    struct Verdicts;
}
