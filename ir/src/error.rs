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

/// The text of a source file (Triton, text IR, spec) from its bytes; bytes that are not UTF-8 are
/// an [`IrError::Parse`] at the line:column (columns count characters) of the first bad byte.
pub fn source_text(bytes: Vec<u8>, file: &str) -> Result<String, IrError> {
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let bytes = e.as_bytes();
        let good = std::str::from_utf8(&bytes[..at]).unwrap_or_default();
        let line_start = good.rfind('\n').map_or(0, |i| i + 1);
        let line = good.matches('\n').count() + 1;
        let col = good[line_start..].chars().count() + 1;
        let bad = bytes.get(at).map_or(String::new(), |b| format!(" (byte 0x{b:02x})"));
        IrError::Parse {
            file: file.to_string(),
            error: ParseError {
                line: u32::try_from(line).unwrap_or(u32::MAX),
                col: u32::try_from(col).unwrap_or(u32::MAX),
                message: format!("the file is not valid UTF-8{bad}: save it as UTF-8"),
            },
        }
    })
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
