//! `while` statements: Triton's `scf.while` with a runtime condition. The names the body assigns
//! that exist before the loop are carried (as in `for` loops); the condition is evaluated at the
//! start of every iteration on the carried values, and may have effects (the spin lock
//! `while tl.atomic_cas(lock, 0, 1) == 1: pass`).

use super::{assigned, off, Cx};
use crate::triton::errors::{fail, Fail, R};
use crate::triton::value::{carriable, flatten, flatten_like, rebuild, tensor, truthy, Val};
use crate::{DType, KernelBuilder, Value};
use ruff_python_ast::{self as ast, Stmt};

impl Cx<'_> {
    /// `while cond: body`.
    pub(super) fn while_stmt(&mut self, w: &ast::StmtWhile) -> R<()> {
        let o = off(w);
        if !w.orelse.is_empty() {
            return fail(off(&w.orelse[0]), "`while ... else` is not supported");
        }
        let mut names_in = Vec::new();
        assigned(&w.body, &mut names_in);
        let names: Vec<String> = names_in.into_iter().filter(|n| self.env.get(n).is_some_and(carriable)).collect();
        let templates: Vec<Val> = names.iter().map(|n| self.env[n].clone()).collect();
        self.at(o);
        let mut init = Vec::new();
        for (n, t) in names.iter().zip(&templates) {
            flatten(&mut self.b, t, o, n, &mut init)?;
        }
        let templates: Vec<Val> = {
            let mut it = init.iter().copied();
            templates.iter().map(|t| rebuild(t, &mut it)).collect()
        };
        let saved = self.env.clone();
        let mut b = std::mem::replace(&mut self.b, KernelBuilder::new("while"));
        let mut err: Option<Fail> = None;
        let bind = |cx: &mut Cx, carried: &[Value]| {
            let mut it = carried.iter().copied();
            for (n, t) in names.iter().zip(&templates) {
                let v = rebuild(t, &mut it);
                cx.env.insert(n.clone(), v);
            }
        };
        let results = {
            let err = std::cell::RefCell::new(&mut err);
            let me = std::cell::RefCell::new(&mut *self);
            b.while_loop(
                None,
                &init,
                |bb, carried| {
                    let mut cx = me.borrow_mut();
                    std::mem::swap(&mut cx.b, bb);
                    bind(&mut cx, carried);
                    let r = cx.while_condition(&w.test);
                    std::mem::swap(&mut cx.b, bb);
                    bb.set_loc(Some(cx.lines.loc(o)));
                    cx.env = saved.clone();
                    r.unwrap_or_else(|e| {
                        err.borrow_mut().get_or_insert(e);
                        bb.constant(false, DType::I1)
                    })
                },
                |bb, carried| {
                    let mut cx = me.borrow_mut();
                    if err.borrow().is_some() {
                        return carried.to_vec();
                    }
                    std::mem::swap(&mut cx.b, bb);
                    bind(&mut cx, carried);
                    cx.nest += 1;
                    let r = cx.block(&w.body);
                    cx.nest -= 1;
                    let mut next = Vec::new();
                    let r = r.and_then(|ret| {
                        if ret.is_some() {
                            return fail(o, "`return` inside a `while` loop is not supported");
                        }
                        for (n, t) in names.iter().zip(&templates) {
                            let v = cx.env.get(n).cloned().unwrap_or_else(|| t.clone());
                            flatten_like(&mut cx.b, t, &v, o, n, &mut next)?;
                        }
                        Ok(())
                    });
                    std::mem::swap(&mut cx.b, bb);
                    bb.set_loc(Some(cx.lines.loc(o)));
                    cx.env = saved.clone();
                    match r {
                        Ok(()) => next,
                        Err(e) => {
                            err.borrow_mut().get_or_insert(e);
                            carried.to_vec()
                        }
                    }
                },
            )
        };
        self.b = b;
        if let Some(e) = err {
            return Err(e);
        }
        self.env = saved;
        let mut it = results.into_iter();
        for (n, t) in names.iter().zip(&templates) {
            let v = rebuild(t, &mut it);
            self.env.insert(n.clone(), v);
        }
        Ok(())
    }

    /// The condition of a `while`, as an i1 scalar. A condition that is always true is an error
    /// (`break` is not supported, so the loop could not end).
    fn while_condition(&mut self, test: &ast::Expr) -> R<Value> {
        let o = off(test);
        let c = self.expr(test)?;
        self.at(o);
        match truthy(&c) {
            Some(true) => fail(o, "this `while` condition is always true: the loop could never end (`break` is not supported)"),
            Some(false) => Ok(self.b.constant(false, DType::I1)),
            None => {
                let Val::Tensor(_) = c else {
                    return fail(o, format!("a `while` condition must be a scalar, found {}", c.kind()));
                };
                let t = tensor(&mut self.b, &c, o, "the condition")?;
                let ty = self.b.ty(t);
                if !ty.is_scalar() {
                    return fail(o, format!("a `while` condition must be a scalar, found a tile {ty}: reduce it first"));
                }
                Ok(t)
            }
        }
    }
}

/// Names assigned by a `while` statement's body (for the enclosing loops' carried values).
pub(super) fn assigned_in(s: &Stmt, out: &mut Vec<String>) {
    if let Stmt::While(w) = s {
        assigned(&w.body, out);
    }
}
