//! Reverse-mode automatic differentiation of tile-kernel launches: tilegrad's ground truth.
//!
//! A launch is a function from the initial contents of its differentiable input tensors to the
//! final contents of its output tensors. This crate computes its vector-Jacobian product in f64
//! and checks itself against central finite differences run through the reference interpreter.
#![warn(missing_docs)]

mod btile;
mod error;
pub mod fd;
mod grad;
pub mod graph;
mod pages;
mod program;
pub mod rules;
mod simd;
pub mod vjp_kernel;

pub use btile::BTile;
pub use error::AdError;
pub use grad::{vjp, GradOptions, Gradient};
pub use rules::Precision;
pub use vjp_kernel::{vjp_kernel, vjp_kernel_as, vjp_kernel_for, vjp_kernel_with, VjpKernel};
