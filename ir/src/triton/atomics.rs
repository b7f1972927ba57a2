//! Triton's atomics: `tl.atomic_add/max/min/and/or/xor/xchg(pointer, val, mask, sem, scope)` and
//! `tl.atomic_cas(pointer, cmp, val, sem, scope)`, each returning the old values. `sem` and
//! `scope` are checked against the values Triton accepts; they order memory on the GPU, and the
//! reference, which runs order-dependent launches one program after another, gives every value
//! the same meaning. As in Triton, the value of the read-modify-writes is converted to the
//! pointer's element type, while both operands of `atomic_cas` must already have it, and the
//! pointer's shape.

use super::builtins::Args;
use super::convert::Cx;
use super::errors::{fail, R};
use super::value::{tensor, Val};
use crate::{AtomicOp, Elem};

/// `sem=` values Triton accepts.
const SEMS: &[&str] = &["acquire", "release", "acq_rel", "relaxed"];
/// `scope=` values Triton accepts.
const SCOPES: &[&str] = &["gpu", "cta", "sys"];

/// Whether `name` (canonical, e.g. `tl.atomic_max`) is an atomic handled here.
pub(crate) fn is_atomic(name: &str) -> bool {
    matches!(
        name,
        "tl.atomic_add"
            | "tl.atomic_max"
            | "tl.atomic_min"
            | "tl.atomic_and"
            | "tl.atomic_or"
            | "tl.atomic_xor"
            | "tl.atomic_xchg"
            | "tl.atomic_cas"
    )
}

impl Cx<'_> {
    /// An atomic call (see [`is_atomic`]).
    pub(crate) fn atomic(&mut self, name: &str, a: Args, o: u32) -> R<Val> {
        let cas = name == "tl.atomic_cas";
        let params: &[&str] = if cas { &["pointer", "cmp", "val", "sem", "scope"] } else { &["pointer", "val", "mask", "sem", "scope"] };
        let b = a.bind_at(name, params)?;
        for (i, what, allowed) in [(3, "sem", SEMS), (4, "scope", SCOPES)] {
            match &b[i] {
                None | Some((Val::None, _)) => {}
                Some((Val::Str(s), _)) if allowed.contains(&s.as_str()) => {}
                Some((v, vo)) => {
                    let list: Vec<String> = allowed.iter().map(|x| format!("\"{x}\"")).collect();
                    return fail(*vo, format!("`{what}` of `{name}` must be one of {}, found {}", list.join(", "), v.kind()));
                }
            }
        }
        let arg = |cx: &mut Cx, j: usize, what: &str| -> R<crate::Value> {
            match &b[j] {
                Some((v, vo)) => tensor(&mut cx.b, v, *vo, what),
                None => fail(o, format!("`{name}` needs {what}")),
            }
        };
        let p = arg(self, 0, "a pointer")?;
        let pt = self.b.ty(p);
        let Elem::Ptr(dt) = pt.elem else {
            return fail(b[0].as_ref().map_or(o, |x| x.1), format!("`{name}` needs a pointer, found {pt}"));
        };
        if cas {
            let c = arg(self, 1, "`cmp`")?;
            let v = arg(self, 2, "a value")?;
            // Triton converts and broadcasts neither operand of a compare-and-swap: each must
            // already have the pointer's element type (a Python int is i32, a float f32) and its
            // shape (its op takes one shape for the pointer, `cmp`, `val` and the result).
            for (j, x, what) in [(1, c, "cmp"), (2, v, "val")] {
                let t = self.b.ty(x);
                let at = b[j].as_ref().map_or(o, |x| x.1);
                if t.dtype() != Some(dt) {
                    return fail(
                        at,
                        format!("`{what}` of `tl.atomic_cas` must have the pointer's element type {dt}, found {t} (Triton converts neither operand)"),
                    );
                }
                if t.shape != pt.shape {
                    return fail(
                        at,
                        format!(
                            "`{what}` of `tl.atomic_cas` must have the pointer's shape {:?}, found {t} (Triton broadcasts neither \
                             operand: give it that shape, e.g. with `tl.full`)",
                            pt.shape
                        ),
                    );
                }
            }
            return Ok(Val::Tensor(self.b.atomic_cas(p, c, v)));
        }
        let v = arg(self, 1, "a value")?;
        let m = match &b[2] {
            None | Some((Val::None, _)) => None,
            Some((m, mo)) => Some(tensor(&mut self.b, m, *mo, "the mask")?),
        };
        let kind = match name {
            "tl.atomic_add" => None,
            "tl.atomic_max" => Some(AtomicOp::Max),
            "tl.atomic_min" => Some(AtomicOp::Min),
            "tl.atomic_and" => Some(AtomicOp::And),
            "tl.atomic_or" => Some(AtomicOp::Or),
            "tl.atomic_xor" => Some(AtomicOp::Xor),
            _ => Some(AtomicOp::Xchg),
        };
        if matches!(kind, Some(AtomicOp::And | AtomicOp::Or | AtomicOp::Xor)) && !dt.is_int() {
            return fail(o, format!("`{name}` needs a pointer to integers, found {pt}"));
        }
        Ok(Val::Tensor(match kind {
            None => self.b.atomic_add(p, v, m),
            Some(k) => self.b.atomic_rmw(k, p, v, m),
        }))
    }
}
