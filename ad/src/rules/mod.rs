//! One forward rule and one VJP rule per compute op, in one place.
//!
//! Both work on [`BTile`]s (batched f64 tiles). [`eval`] and [`vjp`] each match [`Op`] exhaustively
//! (no wildcard arm: a new op is a compile error here until it has its rules). Memory ops (`load`,
//! `store`, `atomic_add`, `addptr`), program ids and control flow (`for`, `if`, `yield`) are the
//! evaluator's business; for them both functions return an [`AdError::Rule`] error saying so.
//!
//! # Batches
//! Every operand holds `batch` program instances. An operand whose batch is 1 while others have
//! batch `B` is broadcast across the programs (constants and `arange`s are the same for every
//! program, so the evaluator may keep them at batch 1). Ops without operands (`const`, `arange`)
//! return batch 1. The cotangent of a batch-1 operand is the sum over the programs of its
//! per-program cotangents (the transpose of that broadcast).
//!
//! # Semantics
//! In [`Precision::F64`] every float op is computed in f64 without rounding (casts between float
//! dtypes are the identity). In [`Precision::Native`] results are rounded to their IR dtype
//! exactly as the reference interpreter computes them (f16/bf16 ops in f32, then rounded), so the
//! two agree bit for bit except for f32 `exp` (see the `elementwise` module). Integers follow Triton/C in
//! both modes: i32 wraps, `//` and `%` truncate toward zero; i64 results must stay within
//! +-2^53 (the f64 storage holds them exactly), else the rule fails.
//!
//! VJP rules are in F64 semantics; see [`vjp`] for the conventions (symbolic zeros, ties).

mod elementwise;
mod fastexp;
mod reduce;
mod shape;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_native;

use crate::{AdError, BTile};
use tilegrad_ir::{DType, Elem, Op, Type};

/// How values are rounded while evaluating.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Precision {
    /// Every float op in f64 (the ground truth); `dot` is exact.
    #[default]
    F64,
    /// Every float result rounded to its IR dtype (f32, f16, bf16), `dot` honouring its
    /// `input_precision`, as the reference interpreter computes.
    Native,
}

/// True for values that carry gradients: float numbers (not pointers, integers or i1).
pub fn is_differentiable(ty: &Type) -> bool {
    matches!(ty.elem, Elem::Num(d) if d.is_float())
}

/// Evaluates compute op `op` on a batch.
///
/// `args` are the operands' values, `arg_types` and `result_type` their IR types (per program).
/// The result has shape `result_type.shape` and the operands' batch (1 for `const` and `arange`).
pub fn eval(op: &Op, args: &[&BTile], arg_types: &[&Type], result_type: &Type, precision: Precision) -> Result<BTile, AdError> {
    let c = Ctx::new(op, args, arg_types, result_type)?;
    match op {
        Op::ProgramId { .. }
        | Op::NumPrograms { .. }
        | Op::AddPtr
        | Op::Load { .. }
        | Op::Store { .. }
        | Op::AtomicAdd { .. }
        | Op::AtomicRmw { .. }
        | Op::AtomicCas
        | Op::For { .. }
        | Op::While { .. }
        | Op::If { .. }
        | Op::Yield => Err(c.err("handled by the evaluator")),
        Op::Const { value } => elementwise::constant(&c, *value, precision),
        Op::Arange { start, end } => shape::arange(&c, *start, *end),
        Op::Broadcast => shape::broadcast(&c),
        Op::ExpandDims { .. } | Op::Reshape => shape::reshape(&c),
        Op::Permute { perm } => shape::permute(&c, perm),
        Op::Unary(u) => elementwise::unary(&c, *u, precision),
        Op::Binary(b) => elementwise::binary(&c, *b, precision),
        Op::Cmp(k) => elementwise::cmp(&c, *k),
        Op::Where => elementwise::select(&c),
        Op::Cast => elementwise::cast(&c, precision),
        Op::Reduce { kind, axis, .. } => reduce::reduce(&c, *kind, *axis as usize, precision),
        Op::Cumsum { axis, reverse } => reduce::cumsum(&c, *axis as usize, *reverse, precision),
        Op::Dot { precision: dp } => reduce::dot(&c, *dp, precision),
    }
}

/// The VJP of compute op `op`: one cotangent per operand, `None` where it is symbolically zero
/// (integer and boolean operands, `where`'s condition, comparisons, arg-reductions, casts to or
/// from integers, `floor`/`ceil`).
///
/// Rules are in F64 semantics, recomputed from `args` (so `result` may come from a native-precision
/// forward pass). `cot` has the result's type and batch; each returned cotangent has its operand's
/// shape and batch. Max/min (elementwise and reductions) send the cotangent to the selected
/// element; ties go to the first operand, or to the lowest index, as `argmax` picks.
pub fn vjp(
    op: &Op,
    args: &[&BTile],
    arg_types: &[&Type],
    result: &BTile,
    result_type: &Type,
    cot: &BTile,
) -> Result<Vec<Option<BTile>>, AdError> {
    let c = Ctx::new(op, args, arg_types, result_type)?;
    let out_batch = if args.is_empty() { 1 } else { c.batch };
    for (what, t) in [("result", result), ("cotangent", cot)] {
        if t.batch != out_batch || t.numel() != result_type.numel() || t.data.len() != t.batch * t.numel() {
            return Err(
                c.err(format!("the {what} holds {} program(s) of shape {:?}, expected {out_batch} of {}", t.batch, t.shape, result_type))
            );
        }
    }
    let grads = match op {
        Op::ProgramId { .. }
        | Op::NumPrograms { .. }
        | Op::AddPtr
        | Op::Load { .. }
        | Op::Store { .. }
        | Op::AtomicAdd { .. }
        | Op::AtomicRmw { .. }
        | Op::AtomicCas
        | Op::For { .. }
        | Op::While { .. }
        | Op::If { .. }
        | Op::Yield => return Err(c.err("handled by the evaluator")),
        Op::Const { .. } | Op::Arange { .. } => Vec::new(),
        Op::Cmp(_) => vec![None, None],
        Op::Broadcast => vec![c.when_diff(0, || shape::broadcast_vjp(&c, cot))?],
        Op::ExpandDims { .. } | Op::Reshape => vec![c.when_diff(0, || Ok(shape::reshape_vjp(&c, cot)))?],
        Op::Permute { perm } => vec![c.when_diff(0, || shape::permute_vjp(&c, perm, cot))?],
        Op::Unary(u) => vec![c.when_diff(0, || Ok(elementwise::unary_vjp(&c, *u, result, cot)))?.flatten()],
        Op::Binary(b) => elementwise::binary_vjp(&c, *b, cot)?,
        Op::Where => elementwise::select_vjp(&c, cot),
        Op::Cast => vec![if is_differentiable(c.tys[0]) && is_differentiable(c.rty) { Some(c.unbatch(0, cot.clone())) } else { None }],
        Op::Reduce { kind, axis, .. } => vec![c.when_diff(0, || reduce::reduce_vjp(&c, *kind, *axis as usize, result, cot))?.flatten()],
        Op::Cumsum { axis, reverse } => vec![c.when_diff(0, || reduce::cumsum_vjp(&c, *axis as usize, *reverse, cot))?],
        Op::Dot { .. } => reduce::dot_vjp(&c, cot)?,
    };
    debug_assert_eq!(grads.len(), args.len());
    Ok(grads)
}

/// The number of operands `op` takes, for the compute ops (`None` for the evaluator's ops).
fn arity(op: &Op) -> Option<usize> {
    Some(match op {
        Op::Const { .. } | Op::Arange { .. } => 0,
        Op::Broadcast | Op::ExpandDims { .. } | Op::Reshape | Op::Permute { .. } | Op::Unary(_) | Op::Cast => 1,
        Op::Reduce { .. } | Op::Cumsum { .. } => 1,
        Op::Binary(_) | Op::Cmp(_) => 2,
        Op::Where | Op::Dot { .. } => 3,
        Op::ProgramId { .. }
        | Op::NumPrograms { .. }
        | Op::AddPtr
        | Op::Load { .. }
        | Op::Store { .. }
        | Op::AtomicAdd { .. }
        | Op::AtomicRmw { .. }
        | Op::AtomicCas
        | Op::For { .. }
        | Op::While { .. }
        | Op::If { .. }
        | Op::Yield => return None,
    })
}

/// Whether `op`'s rules accept *broadcast views*: an operand held in a shape that broadcasts to
/// its type's (same rank, 1 where broadcast), read as if broadcast. The evaluator leaves a
/// `broadcast` whose only uses are such ops unmaterialised, and the VJP returns the view's
/// cotangent in the view's shape (summed over the broadcast dimensions).
pub fn takes_views(op: &Op) -> bool {
    use tilegrad_ir::BinaryOp::*;
    matches!(op, Op::Binary(Add | Sub | Mul | Div | FloorDiv | And | Or | Xor | UMulHi) | Op::Cmp(_))
}

/// `src` broadcasts to `dst` without a change of rank.
pub fn broadcasts_to(src: &[usize], dst: &[usize]) -> bool {
    src.len() == dst.len() && src.iter().zip(dst).all(|(&s, &d)| s == d || s == 1)
}

/// How an operand's elements line up with the result's, row by row (rows of the result's
/// last dimension).
pub(crate) enum Layout {
    /// The operand has the result's shape.
    Dense,
    /// A broadcast view: per result row, the offset of the operand's row, and whether that row
    /// is one element repeated (the last dimension broadcast).
    Rows { starts: Vec<usize>, splat: bool },
}

/// One row of an operand under its [`Layout`].
#[derive(Clone, Copy)]
pub(crate) enum RowRef<'x> {
    Slice(&'x [f64]),
    Splat(f64),
}

impl RowRef<'_> {
    #[inline(always)]
    fn at(self, j: usize) -> f64 {
        match self {
            RowRef::Slice(s) => s[j],
            RowRef::Splat(v) => v,
        }
    }
}

impl Layout {
    /// Row `r` (of `inner` elements) of a program's operand data.
    #[inline]
    fn row<'x>(&self, data: &'x [f64], r: usize, inner: usize) -> RowRef<'x> {
        match self {
            Layout::Dense => RowRef::Slice(&data[r * inner..(r + 1) * inner]),
            Layout::Rows { starts, splat: true } => RowRef::Splat(data[starts[r]]),
            Layout::Rows { starts, splat: false } => RowRef::Slice(&data[starts[r]..starts[r] + inner]),
        }
    }
}

/// One application of a rule: the op, its checked operands and types, and the batch.
pub(crate) struct Ctx<'a> {
    op: &'a Op,
    args: &'a [&'a BTile],
    tys: &'a [&'a Type],
    rty: &'a Type,
    /// The result's batch: the largest operand batch (operands of batch 1 are broadcast).
    batch: usize,
}

impl<'a> Ctx<'a> {
    /// Checks arity, operand sizes and batches.
    fn new(op: &'a Op, args: &'a [&'a BTile], tys: &'a [&'a Type], rty: &'a Type) -> Result<Ctx<'a>, AdError> {
        let mut c = Ctx { op, args, tys, rty, batch: 1 };
        let Some(n) = arity(op) else { return Ok(c) };
        if args.len() != n || tys.len() != n {
            return Err(c.err(format!("expects {n} operand(s), got {} value(s) and {} type(s)", args.len(), tys.len())));
        }
        c.batch = args.iter().map(|a| a.batch).max().unwrap_or(1);
        for (i, (a, t)) in args.iter().zip(tys).enumerate() {
            if a.batch != 1 && a.batch != c.batch {
                return Err(c.err(format!("operand {i} holds {} programs, others {}", a.batch, c.batch)));
            }
            if t.dtype().is_none() {
                return Err(c.err(format!("operand {i} is a pointer ({t}); pointers are the evaluator's business")));
            }
            // Operands of elementwise binary ops may be broadcast views (see [`takes_views`]).
            let view = takes_views(op) && broadcasts_to(&a.shape, &t.shape);
            if (a.numel() != t.numel() && !view) || a.data.len() != a.batch * a.numel() {
                return Err(c.err(format!("operand {i} has shape {:?} ({} values), its type is {t}", a.shape, a.data.len())));
            }
        }
        if rty.dtype().is_none() {
            return Err(c.err(format!("the result is a pointer ({rty})")));
        }
        Ok(c)
    }

    /// A rule error naming this op.
    fn err(&self, message: impl Into<String>) -> AdError {
        AdError::Rule { op: self.op.mnemonic().to_string(), message: message.into() }
    }

    /// Operand `i`'s dtype (checked numeric in [`Ctx::new`]).
    fn dtype(&self, i: usize) -> DType {
        self.tys[i].dtype().unwrap_or(DType::F64)
    }

    /// The result's dtype (checked numeric in [`Ctx::new`]).
    fn rdtype(&self) -> DType {
        self.rty.dtype().unwrap_or(DType::F64)
    }

    /// The result's per-program shape.
    fn rshape(&self) -> &[usize] {
        &self.rty.shape
    }

    /// Operand `i`'s tile in program `b` (program 0 for a batch-1 operand).
    fn row(&self, i: usize, b: usize) -> &'a [f64] {
        let a = self.args[i];
        a.row(if a.batch == 1 { 0 } else { b })
    }

    /// Operand `i`'s [`Layout`] against the result.
    fn layout(&self, i: usize) -> Layout {
        let (p, l) = (&self.args[i].shape, self.rshape());
        if p[..] == l[..] || !broadcasts_to(p, l) {
            return Layout::Dense;
        }
        let r = l.len();
        let outer = shape::bcast_index(&p[..r - 1], &l[..r - 1]);
        let row_len = p[r - 1];
        Layout::Rows { starts: outer.iter().map(|&o| o * row_len).collect(), splat: row_len == 1 && l[r - 1] != 1 }
    }

    /// The elements per row of the result (its last dimension; 1 for scalars).
    fn inner(&self) -> usize {
        self.rshape().last().copied().unwrap_or(1)
    }

    /// A result from its program-major data.
    fn out(&self, data: Vec<f64>) -> BTile {
        BTile::new(self.batch, self.rshape(), data)
    }

    /// `f` for operand `i` when it is differentiable, else a symbolic zero.
    fn when_diff<T>(&self, i: usize, f: impl FnOnce() -> Result<T, AdError>) -> Result<Option<T>, AdError> {
        if is_differentiable(self.tys[i]) {
            f().map(Some)
        } else {
            Ok(None)
        }
    }

    /// A cotangent computed at the result's batch, brought to operand `i`'s batch and shape
    /// (summed over the programs when the operand was broadcast across them).
    fn unbatch(&self, i: usize, g: BTile) -> BTile {
        let a = self.args[i];
        let n = a.numel();
        if a.batch == 1 && g.batch != 1 {
            let mut data = vec![0.0; n];
            for b in 0..g.batch {
                data.iter_mut().zip(g.row(b)).for_each(|(d, &x)| *d += x);
            }
            BTile::new(1, &a.shape, data)
        } else {
            BTile { batch: g.batch, shape: a.shape.clone(), data: g.data }
        }
    }
}

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut st = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        st[d] = st[d + 1] * shape[d + 1];
    }
    st
}

/// Splits a shape at `axis` into (outer, n, inner) element counts.
fn split(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (shape[..axis].iter().product(), shape[axis], shape[axis + 1..].iter().product())
}
