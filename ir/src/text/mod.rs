//! The text format of the IR (`.tgir` files): a printer (`Display` for [`Kernel`]) and a parser.
//!
//! The text format exists so that kernels can be written by hand, diffed, stored as test fixtures
//! and shown in reports. It is exact: `parse(print(k)) == k` holds for every verified kernel,
//! locations included. A kernel looks like this:
//!
//! ```text
//! # comment
//! kernel scale(%x: ptr<f32>, %n: i32, %BLOCK: constexpr i32 = 128) @ "src/zoo.rs":10:17 {
//!   %3: i32 = program_id 0 @ "src/zoo.rs":11:9
//!   %4: i32[128] = arange 0, 128
//!   %5: f32 = const 2.0
//!   ...
//!   store %9, %10, mask=%8
//! }
//! ```
//!
//! One op per line: results with their types, `=`, the mnemonic, operands and attributes, then an
//! optional location `@ "file":line:col`. Parameters print as `%<name>` and other values as
//! `%<index>`; the parser accepts any `%[A-Za-z0-9_.]+` name. Ops without a location get the
//! position of their first token in the parsed text. `for` and `if` carry nested blocks in braces.
//! Parsed kernels are canonicalized ([`Kernel::canonicalize`]) and verified ([`crate::verify`]).
//!
//! Files: `lexer.rs` (tokens with positions), `parse.rs` (recursive descent into the arenas),
//! `print.rs` (the printer).

mod lexer;
mod parse;
mod print;
#[cfg(test)]
mod tests;

use crate::error::{IrError, ParseError};
use crate::kernel::Kernel;
use std::fmt;

/// Parses every kernel in `text` (one or more `kernel` definitions). `file` names the source in
/// errors and in the locations of ops that carry none of their own. Each kernel is canonicalized
/// and verified; the first syntax or verification error is returned.
pub fn parse(text: &str, file: &str) -> Result<Vec<Kernel>, IrError> {
    let mut out = Vec::new();
    let res = parse::parse_kernels(text, file, |mut k| {
        k.canonicalize();
        crate::verify::verify(&k)?;
        out.push(k);
        Ok(())
    });
    match res {
        Ok(()) => Ok(out),
        Err(Ok(error)) => Err(IrError::Parse { file: file.to_string(), error }),
        Err(Err(e)) => Err(e),
    }
}

/// Parses a text holding exactly one kernel.
pub fn parse_kernel(text: &str, file: &str) -> Result<Kernel, IrError> {
    let mut ks = parse(text, file)?;
    if ks.len() != 1 {
        return Err(IrError::Parse {
            file: file.to_string(),
            error: ParseError { line: 1, col: 1, message: format!("expected exactly one kernel, found {}", ks.len()) },
        });
    }
    Ok(ks.remove(0))
}

/// Prints several kernels as one text, separated by blank lines; [`parse`] reads it back.
pub fn print_module(kernels: &[Kernel]) -> String {
    kernels.iter().map(|k| k.to_string()).collect::<Vec<_>>().join("\n")
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        print::write_kernel(self, f)
    }
}
