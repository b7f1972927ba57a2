//! A bound on how deeply a source file's syntax nests, checked before anything walks it.
//!
//! The syntax tree is walked (and dropped) recursively, one stack frame per level: a generated
//! `1 + 1 + ...` of 150,000 terms anywhere in a file, even outside every kernel, would overflow
//! the stack and abort the process. CPython refuses such files too (its compiler stops far
//! earlier), so a file past the bound is refused with the line where it goes too deep, and its
//! tree is never dropped recursively. The parse itself (which drops what it built when it meets
//! a syntax error) runs on a thread with a stack sized by the file.

use ruff_python_ast::visitor::{walk_expr, walk_stmt, Visitor};
use ruff_python_ast::{Expr, ModModule, Stmt};
use ruff_python_parser::{ParseError, Parsed};
use ruff_text_size::Ranged;

/// The deepest nesting of expressions and statements a file may have. Dropping one level of the
/// tree takes a few dozen bytes of stack in a release build: 20,000 levels stay within a 2 MiB
/// thread stack.
pub(crate) const MAX_NESTING: usize = 20_000;

/// Where (a byte offset) the first expression or statement nested deeper than [`MAX_NESTING`]
/// starts, if one does.
pub(crate) fn too_deep(suite: &[Stmt]) -> Option<u32> {
    // On a thread of its own with a stack that holds the walk to the bound in any build (an
    // unoptimised build's frames are several times larger than a release build's).
    let walk = || {
        let mut d = Depth { depth: 0, at: None };
        for s in suite {
            d.visit_stmt(s);
            if d.at.is_some() {
                break;
            }
        }
        d.at
    };
    std::thread::scope(|scope| {
        match std::thread::Builder::new().stack_size(WALK_STACK).spawn_scoped(scope, walk) {
            Ok(h) => h.join().unwrap_or(Some(0)),
            // No thread to be had: walk here (a release build's frames fit a 2 MiB stack).
            Err(_) => walk(),
        }
    })
}

/// The stack of the thread that measures a file's nesting.
const WALK_STACK: usize = 64 << 20;

/// Stack per byte of source for the parse: a file nests at most one level per byte, and ruff's
/// parser (and the drop of a tree) takes under a hundred bytes of stack per level in an
/// optimised build, a few times that unoptimised.
const PARSE_STACK_PER_BYTE: usize = 512;

/// The largest parse stack asked for (address space only: pages are touched as deep as it goes).
const MAX_PARSE_STACK: usize = 2 << 30;

/// `ruff_python_parser::parse_module` on a thread whose stack holds its recursion: on a syntax
/// error, ruff drops the partial tree it built before returning the error, one frame per level,
/// and a `1 + 1 + ...` of 150,000 terms with a syntax error after it would overflow the caller's
/// stack (the nesting bound is checked only on a tree that parsed). An error when no such thread
/// could be had: the error is the stack it needed, in MiB.
pub(crate) fn parse_module(source: &str) -> Result<Result<Parsed<ModModule>, ParseError>, usize> {
    let stack = source.len().saturating_mul(PARSE_STACK_PER_BYTE).clamp(WALK_STACK, MAX_PARSE_STACK);
    std::thread::scope(|scope| {
        match std::thread::Builder::new().stack_size(stack).spawn_scoped(scope, || ruff_python_parser::parse_module(source)) {
            Ok(h) => Ok(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))),
            Err(_) => Err(stack >> 20),
        }
    })
}

struct Depth {
    depth: usize,
    at: Option<u32>,
}

impl Depth {
    /// Enters one level at `start` (each `enter` is matched by a `depth -= 1`); false once a
    /// level past the bound was found (`at` set), here or earlier.
    fn enter(&mut self, start: u32) -> bool {
        self.depth += 1;
        if self.at.is_none() && self.depth > MAX_NESTING {
            self.at = Some(start);
        }
        self.at.is_none()
    }
}

impl<'a> Visitor<'a> for Depth {
    fn visit_stmt(&mut self, stmt: &'a Stmt) {
        if self.enter(stmt.start().to_u32()) {
            walk_stmt(self, stmt);
        }
        self.depth -= 1;
    }

    fn visit_expr(&mut self, expr: &'a Expr) {
        if self.enter(expr.start().to_u32()) {
            walk_expr(self, expr);
        }
        self.depth -= 1;
    }
}
