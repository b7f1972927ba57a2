//! A bound on how deeply a source file's syntax nests, checked before anything walks it.
//!
//! The syntax tree is walked (and dropped) recursively, one stack frame per level: a generated
//! `1 + 1 + ...` of 150,000 terms anywhere in a file, even outside every kernel, would overflow
//! the stack and abort the process. CPython refuses such files too (its compiler stops far
//! earlier), so a file past the bound is refused with the line where it goes too deep, and its
//! tree is never dropped recursively.

use ruff_python_ast::visitor::{walk_expr, walk_stmt, Visitor};
use ruff_python_ast::{Expr, Stmt};
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
