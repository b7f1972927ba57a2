//! A conditional expression (`a if c else b`) on a runtime condition, as Triton's `visit_IfExp`
//! lowers it: an IR `if` on the scalar condition whose branches each evaluate one side, so that
//! a side Python would not evaluate (a load at `i - 1` guarded by `i > 0`) never runs. Both
//! sides become tensors with Triton's literal rules (an int is i32, a float f32) and must have
//! the same type, as Triton requires; a tile condition is refused, as Triton refuses it (its
//! `scf.if` takes a scalar), pointing to `tl.where`.

use super::super::errors::{fail, Fail, R};
use super::super::value::{tensor, Val};
use super::Cx;
use crate::{KernelBuilder, Type, Value};
use ruff_python_ast::{self as ast, Expr};
use std::cell::RefCell;

impl Cx<'_> {
    /// `i.body if c else i.orelse` where `c` is not a compile-time constant.
    pub(super) fn ternary(&mut self, c: Val, i: &ast::ExprIf, o: u32) -> R<Val> {
        let cv = self.ternary_condition(c, o)?;
        let saved = self.env.clone();
        let mut b = std::mem::replace(&mut self.b, KernelBuilder::new("if"));
        let err: RefCell<Option<Fail>> = RefCell::new(None);
        let then_ty: RefCell<Option<Type>> = RefCell::new(None);
        let me = RefCell::new(&mut *self);
        let results = b.if_else(
            cv,
            |bb| {
                let r = me.borrow_mut().side(bb, &i.body, None, o);
                me.borrow_mut().env = saved.clone();
                let v = r.unwrap_or_else(|e| {
                    err.borrow_mut().get_or_insert(e);
                    None
                });
                *then_ty.borrow_mut() = v.map(|v| bb.ty(v));
                v.into_iter().collect()
            },
            |bb| {
                if err.borrow().is_some() {
                    return Vec::new();
                }
                let r = me.borrow_mut().side(bb, &i.orelse, Some(then_ty.borrow().clone()), o);
                me.borrow_mut().env = saved.clone();
                r.unwrap_or_else(|e| {
                    err.borrow_mut().get_or_insert(e);
                    None
                })
                .into_iter()
                .collect()
            },
        );
        self.b = b;
        if let Some(e) = err.into_inner() {
            return Err(e);
        }
        Ok(results.first().map_or(Val::None, |&v| Val::Tensor(v)))
    }

    /// The scalar condition of a conditional expression.
    fn ternary_condition(&mut self, c: Val, o: u32) -> R<Value> {
        let Val::Tensor(cv) = c else {
            return fail(o, format!("the condition of a conditional expression must be a scalar or a constant, found {}", c.kind()));
        };
        let ty = self.b.ty(cv);
        if !ty.is_scalar() {
            return fail(
                o,
                format!(
                    "the condition of a conditional expression (`a if c else b`) is a tile {ty}: Triton lowers it to a branch on a \
                     scalar and does not compile a tile condition; select lanes with `tl.where(c, a, b)`"
                ),
            );
        }
        Ok(cv)
    }

    /// One side of a conditional expression, converted into `bb`'s current block: its tensor
    /// (`None` for a side that is `None`, as a call returning nothing is), of the type `want`
    /// says (the then side's, when converting the else side).
    fn side(&mut self, bb: &mut KernelBuilder, e: &Expr, want: Option<Option<Type>>, o: u32) -> R<Option<Value>> {
        std::mem::swap(&mut self.b, bb);
        let r = self.side_value(e);
        std::mem::swap(&mut self.b, bb);
        bb.set_loc(Some(self.lines.loc(o)));
        let mut v = r?;
        // In an f64-promoted run every float is f64: a float literal on one side (f32 by
        // Triton's rules, as in the run it stands for) is too, as the promoted load beside it.
        if let Some(x) = v.filter(|&x| self.promoted && bb.ty(x).elem == crate::Elem::Num(crate::DType::F32)) {
            v = Some(bb.cast(x, crate::DType::F64));
        }
        let got = v.map(|v| bb.ty(v));
        match want {
            Some(w) if w != got => {
                let show = |t: &Option<Type>| t.as_ref().map_or("None".to_string(), |t| t.to_string());
                fail(
                    o,
                    format!(
                        "the two sides of this conditional expression have different types, {} and {}: Triton requires one type \
                         (convert a side with `.to(...)`, or write the literal with the other side's type, e.g. `0.0`)",
                        show(&w),
                        show(&got)
                    ),
                )
            }
            _ => Ok(v),
        }
    }

    fn side_value(&mut self, e: &Expr) -> R<Option<Value>> {
        self.nest += 1;
        let r = self.expr(e);
        self.nest -= 1;
        match r? {
            Val::None => Ok(None),
            v => tensor(&mut self.b, &v, super::off(e), "a side of a conditional expression on a runtime condition").map(Some),
        }
    }
}
