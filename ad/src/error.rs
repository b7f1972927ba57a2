//! The error type of the AD crate.

use tilegrad_ir::Loc;

/// Errors of graph construction, evaluation and differentiation.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum AdError {
    /// The kernel does not verify.
    #[error(transparent)]
    Invalid(#[from] tilegrad_ir::IrError),
    /// The launch failed in the reference interpreter (forward run, finite differences).
    #[error(transparent)]
    Exec(#[from] tilegrad_reference::ExecError),
    /// An op cannot be evaluated or differentiated here, with why and what to do instead.
    #[error("{loc}: kernel `{kernel}`, op `{op}`: {message}")]
    Unsupported {
        /// Kernel name.
        kernel: String,
        /// Op mnemonic.
        op: String,
        /// Source location.
        loc: Loc,
        /// Why.
        message: String,
    },
    /// A rule failed on its inputs (an i64 value beyond 2^53, integer division by zero, ...).
    #[error("op `{op}`: {message}")]
    Rule {
        /// Op mnemonic.
        op: String,
        /// What went wrong.
        message: String,
    },
    /// A check or launch specification is inconsistent (unknown tensor, wrong shapes, ...).
    #[error("{0}")]
    Spec(String),
}
