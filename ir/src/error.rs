//! The error type of the IR crate: diagnostics that name the kernel, the op and its source location.

use crate::kernel::Loc;
use std::fmt;

/// One problem found in a kernel, located at an op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// Kernel name.
    pub kernel: String,
    /// Mnemonic of the op (or a description such as `kernel` or `param x`).
    pub op: String,
    /// Source location of the op.
    pub loc: Loc,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: kernel `{}`, op `{}`: {}", self.loc, self.kernel, self.op, self.message)
    }
}

/// A text-format syntax or semantic error, at line:column of the text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// Line, from 1.
    pub line: u32,
    /// Column, from 1.
    pub col: u32,
    /// What was wrong, and what was expected.
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.line, self.col, self.message)
    }
}

/// Errors of the IR crate.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum IrError {
    /// The kernel is ill-typed or ill-formed; every problem found is listed.
    #[error("invalid kernel `{kernel}`:\n{}", list(.diagnostics))]
    Invalid {
        /// Kernel name.
        kernel: String,
        /// All problems found.
        diagnostics: Vec<Diagnostic>,
    },
    /// The text could not be parsed.
    #[error("{file}:{error}")]
    Parse {
        /// File name (or `<text>`).
        file: String,
        /// The error.
        error: ParseError,
    },
}

fn list(d: &[Diagnostic]) -> String {
    d.iter().map(|d| format!("  {d}")).collect::<Vec<_>>().join("\n")
}

impl IrError {
    /// The diagnostics of an `Invalid` error (empty otherwise).
    pub fn diagnostics(&self) -> &[Diagnostic] {
        match self {
            IrError::Invalid { diagnostics, .. } => diagnostics,
            IrError::Parse { .. } => &[],
        }
    }
}
