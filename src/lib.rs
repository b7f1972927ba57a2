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
