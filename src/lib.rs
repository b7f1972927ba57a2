//! tilegrad: ground-truth gradients for GPU tile kernels, to check hand-written backward kernels.
//!
//! - [`zoo`]: classic Triton kernels built with the Rust builder, with f64 references.
#![warn(missing_docs)]

pub mod zoo;
