//! The tile IR of tilegrad.
//!
//! A [`Kernel`] is what one program instance of a launch grid executes: it loads tiles through
//! pointer offsets and masks, computes on them, and stores tiles back, in the style of OpenAI
//! Triton. Kernels are built with the Rust [`KernelBuilder`], parsed from the text format
//! ([`text::parse`]) or converted from Triton source; all three emit the same canonical [`Op`]s,
//! which the [`verify`] function checks and every backend trusts.
//!
//! ```
//! use tilegrad_ir::{DType, KernelBuilder};
//! let mut b = KernelBuilder::new("copy");
//! let x = b.ptr_param("x", DType::F32);
//! let y = b.ptr_param("y", DType::F32);
//! let n = b.scalar_param("n", DType::I32);
//! let pid = b.program_id(0);
//! let block = b.i32(128);
//! let start = b.mul(pid, block);
//! let lanes = b.arange(0, 128);
//! let offs = b.add(start, lanes);
//! let mask = b.lt(offs, n);
//! let px = b.add(x, offs);
//! let v = b.load(px, Some(mask), None);
//! let py = b.add(y, offs);
//! b.store(py, v, Some(mask));
//! let kernel = b.finish().unwrap();
//! let text = kernel.to_string();
//! assert_eq!(tilegrad_ir::text::parse_kernel(&text, "copy.tgir").unwrap(), kernel);
//! ```
#![warn(missing_docs)]

pub mod analysis;
mod builder;
mod error;
mod kernel;
mod offsets;
mod op;
pub mod passes;
pub mod text;
pub mod triton;
mod types;
mod verify;

pub use builder::{BlockPtr, KernelBuilder, Padding};
pub use error::{source_text, Diagnostic, IrError, ParseError};
pub use kernel::{Block, BlockData, Inst, InstData, Kernel, Loc, Param, ParamKind, Value, ValueData};
pub use op::{AtomicOp, BinaryOp, CmpOp, DotPrecision, Op, ReduceOp, UnaryOp};
pub use types::{DType, Elem, Lit, Shape, Type, MAX_NUMEL, MAX_RANK};
pub use verify::verify;
