//! Rules of the elementwise ops (`const`, unary and binary maths, comparisons, `where`, `cast`),
//! with the integer semantics of Triton/C and the rounding of the reference interpreter.
//!
//! Floats in [`Precision::Native`] with dtype f32, f16 or bf16 are computed with the f32 function
//! the reference uses, then rounded to the dtype; f64 values (and every float in
//! [`Precision::F64`]) use the f64 function. One exception: the reference's f32 `exp` (and
//! `sigmoid`, built on it) is a private polynomial; here it is `(x as f64).exp() as f32`, the
//! correctly rounded result, which the polynomial (relative error below 2e-14) matches except
//! when e^x lies within ~1e-14 of an f32 rounding boundary: then the two differ by 1 ulp.

use super::{Ctx, Layout, Precision, RowRef};
use crate::{AdError, BTile};
use tilegrad_ir::{BinaryOp, CmpOp, DType, Lit, UnaryOp};
use tilegrad_reference::{round_bf16, round_f16};

/// 2^53: the largest magnitude an i64 value may have here (f64 holds it exactly).
const I64_LIMIT: i128 = 1 << 53;

/// How float arithmetic of one dtype is carried out.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Arith {
    /// In f64, unrounded.
    F64,
    /// In f32, then rounded to this dtype (f32, f16 or bf16), as the reference computes.
    F32(DType),
}

impl Arith {
    /// The arithmetic of float dtype `d` under `p`.
    pub(super) fn of(d: DType, p: Precision) -> Arith {
        match (p, d) {
            (Precision::Native, DType::F32 | DType::F16 | DType::BF16) => Arith::F32(d),
            _ => Arith::F64,
        }
    }
}

/// Rounds an f32 to `d` when `d` is f16 or bf16 (the reference's `round_narrow`).
pub(super) fn narrow(d: DType, x: f32) -> f32 {
    match d {
        DType::F16 => round_f16(x),
        DType::BF16 => round_bf16(x),
        _ => x,
    }
}

/// An exact integer result as the dtype `d` holds it: i32 wraps, i64 must stay within +-2^53.
pub(super) fn int_result(c: &Ctx<'_>, d: DType, r: i128) -> Result<f64, AdError> {
    match d {
        DType::I32 => Ok(r as i32 as f64),
        DType::I1 => Ok((r & 1) as f64),
        _ => {
            if r.abs() > I64_LIMIT {
                Err(c.err(format!("i64 result {r} is beyond +-2^53, which the f64 ground truth cannot hold exactly")))
            } else {
                Ok(r as f64)
            }
        }
    }
}

/// `const`: the literal converted to the result dtype as the reference converts it (floats
/// unrounded in F64 mode).
pub(super) fn constant(c: &Ctx<'_>, value: Lit, p: Precision) -> Result<BTile, AdError> {
    let d = c.rdtype();
    let v = match d {
        DType::I1 => (value.as_i64() != 0) as i64 as f64,
        DType::I32 | DType::I64 => int_result(c, d, value.as_i64() as i128)?,
        _ => match Arith::of(d, p) {
            Arith::F64 => value.as_f64(),
            Arith::F32(DType::F16) => half::f16::from_f64(value.as_f64()).to_f64(),
            Arith::F32(DType::BF16) => half::bf16::from_f64(value.as_f64()).to_f64(),
            Arith::F32(_) => value.as_f64() as f32 as f64,
        },
    };
    Ok(BTile::full(1, c.rshape(), v))
}

/// Applies `f` to every element of operand 0.
fn map1(c: &Ctx<'_>, mut f: impl FnMut(f64) -> Result<f64, AdError>) -> Result<BTile, AdError> {
    let n = c.rty.numel();
    let mut out = Vec::with_capacity(c.batch * n);
    for b in 0..c.batch {
        for &x in c.row(0, b) {
            out.push(f(x)?);
        }
    }
    Ok(c.out(out))
}

/// Applies `f` to every pair of elements of operands 0 and 1.
fn map2(c: &Ctx<'_>, mut f: impl FnMut(f64, f64) -> Result<f64, AdError>) -> Result<BTile, AdError> {
    let n = c.rty.numel();
    let (la, lb) = (c.layout(0), c.layout(1));
    if !matches!((&la, &lb), (Layout::Dense, Layout::Dense)) {
        return map2_views(c, &la, &lb, f);
    }
    if c.args[0].numel() != n || c.args[1].numel() != n {
        return Err(c.err(format!("operands of {} and {} elements for a result of {n}", c.args[0].numel(), c.args[1].numel())));
    }
    let mut out = Vec::with_capacity(c.batch * n);
    for b in 0..c.batch {
        for (&x, &y) in c.row(0, b).iter().zip(c.row(1, b)) {
            out.push(f(x, y)?);
        }
    }
    Ok(c.out(out))
}

/// [`map2`] with a broadcast view among the operands: row by row, each operand's row a slice
/// or one repeated element.
fn map2_views(c: &Ctx<'_>, la: &Layout, lb: &Layout, mut f: impl FnMut(f64, f64) -> Result<f64, AdError>) -> Result<BTile, AdError> {
    let (n, inner) = (c.rty.numel(), c.inner());
    let mut out = Vec::with_capacity(c.batch * n);
    for b in 0..c.batch {
        let (x, y) = (c.row(0, b), c.row(1, b));
        for r in 0..n / inner.max(1) {
            let (ra, rb) = (la.row(x, r, inner), lb.row(y, r, inner));
            for j in 0..inner {
                out.push(f(ra.at(j), rb.at(j))?);
            }
        }
    }
    Ok(c.out(out))
}

/// Applies an infallible `f` to every pair of elements of operands 0 and 1 (a tight loop the
/// compiler vectorises; with a broadcast view, one tight loop per row).
fn map2_ok(c: &Ctx<'_>, f: impl Fn(f64, f64) -> f64) -> Result<BTile, AdError> {
    Ok(map2_all(c, f, |_| true)?.0)
}

/// [`map2_ok`], also telling whether `keep` holds for every result (checked row by row, or
/// chunk by chunk, while the results are in cache).
fn map2_all(c: &Ctx<'_>, f: impl Fn(f64, f64) -> f64, keep: impl Fn(f64) -> bool) -> Result<(BTile, bool), AdError> {
    let n = c.rty.numel();
    let (la, lb) = (c.layout(0), c.layout(1));
    let mut ok = true;
    let mut out: Vec<f64> = Vec::with_capacity(c.batch * n);
    let mut check = |out: &[f64]| ok &= out.iter().fold(true, |o, &r| o & keep(r));
    if !matches!((&la, &lb), (Layout::Dense, Layout::Dense)) {
        let inner = c.inner();
        for b in 0..c.batch {
            let (x, y) = (c.row(0, b), c.row(1, b));
            for r in 0..n / inner.max(1) {
                let at = out.len();
                match (la.row(x, r, inner), lb.row(y, r, inner)) {
                    (RowRef::Slice(xs), RowRef::Slice(ys)) => out.extend(xs.iter().zip(ys).map(|(&a, &b)| f(a, b))),
                    (RowRef::Slice(xs), RowRef::Splat(v)) => out.extend(xs.iter().map(|&a| f(a, v))),
                    (RowRef::Splat(u), RowRef::Slice(ys)) => out.extend(ys.iter().map(|&b| f(u, b))),
                    (RowRef::Splat(u), RowRef::Splat(v)) => out.extend(std::iter::repeat_n(f(u, v), inner)),
                }
                check(&out[at..]);
            }
        }
        return Ok((c.out(out), ok));
    }
    if c.args[0].numel() != n || c.args[1].numel() != n {
        return Err(c.err(format!("operands of {} and {} elements for a result of {n}", c.args[0].numel(), c.args[1].numel())));
    }
    for b in 0..c.batch {
        let (x, y) = (c.row(0, b), c.row(1, b));
        for (xs, ys) in x.chunks(1024).zip(y.chunks(1024)) {
            let at = out.len();
            crate::simd::wide(|| out.extend(xs.iter().zip(ys).map(|(&x, &y)| f(x, y))));
            check(&out[at..]);
        }
    }
    Ok((c.out(out), ok))
}

/// The reference's f32 function of each unary float op (`None` for `not`).
fn unary_f32(op: UnaryOp) -> Option<fn(f32) -> f32> {
    use UnaryOp::*;
    Some(match op {
        Neg => |a| -a,
        Abs => f32::abs,
        // The reference's polynomial agrees except in rare 1-ulp ties (see the module docs).
        Exp => |a| (a as f64).exp() as f32,
        // Transcendentals in f64, rounded once, as the reference (and the GPU backend) does.
        Exp2 => |a| (a as f64).exp2() as f32,
        Log => |a| (a as f64).ln() as f32,
        Log2 => |a| (a as f64).log2() as f32,
        Sqrt => f32::sqrt,
        Rsqrt => |a| 1.0 / a.sqrt(),
        Sin => |a| (a as f64).sin() as f32,
        Cos => |a| (a as f64).cos() as f32,
        Tanh => |a| (a as f64).tanh() as f32,
        Sigmoid => |a| 1.0 / (1.0 + (-a as f64).exp() as f32),
        Erf => |a| libm::erf(a as f64) as f32,
        Floor => f32::floor,
        Ceil => f32::ceil,
        Not => return None,
    })
}

/// The f64 function of each unary float op (`None` for `not`).
fn unary_f64(op: UnaryOp) -> Option<fn(f64) -> f64> {
    use UnaryOp::*;
    Some(match op {
        Neg => |a| -a,
        Abs => f64::abs,
        Exp => f64::exp,
        Exp2 => f64::exp2,
        Log => f64::ln,
        Log2 => f64::log2,
        Sqrt => f64::sqrt,
        Rsqrt => |a| 1.0 / a.sqrt(),
        Sin => f64::sin,
        Cos => f64::cos,
        Tanh => f64::tanh,
        Sigmoid => |a| 1.0 / (1.0 + (-a).exp()),
        Erf => libm::erf,
        Floor => f64::floor,
        Ceil => f64::ceil,
        Not => return None,
    })
}

/// Elementwise unary op.
pub(super) fn unary(c: &Ctx<'_>, op: UnaryOp, p: Precision) -> Result<BTile, AdError> {
    let d = c.dtype(0);
    let bad = || c.err(format!("`{}` is not defined on {d}", op.name()));
    if d.is_float() {
        return match Arith::of(d, p) {
            // The ground truth's exp: a vectorised loop (within 1 ulp of libm).
            Arith::F64 if op == UnaryOp::Exp => {
                let mut out = Vec::with_capacity(c.batch * c.rty.numel());
                for b in 0..c.batch {
                    super::fastexp::exp_extend(c.row(0, b), &mut out);
                }
                Ok(c.out(out))
            }
            Arith::F64 => {
                let f = unary_f64(op).ok_or_else(bad)?;
                map1(c, |x| Ok(f(x)))
            }
            Arith::F32(d) => {
                let f = unary_f32(op).ok_or_else(bad)?;
                map1(c, |x| Ok(narrow(d, f(x as f32)) as f64))
            }
        };
    }
    if d.is_bool() {
        return match op {
            UnaryOp::Not => map1(c, |x| Ok((x == 0.0) as i64 as f64)),
            _ => Err(bad()),
        };
    }
    match op {
        UnaryOp::Neg => map1(c, |x| int_result(c, d, -(x as i128))),
        UnaryOp::Abs => map1(c, |x| int_result(c, d, (x as i128).abs())),
        UnaryOp::Not => map1(c, |x| int_result(c, d, !(x as i128))),
        _ => Err(bad()),
    }
}

/// The VJP of a unary op on a float operand (`None` for `floor`/`ceil`: piecewise constant).
pub(super) fn unary_vjp(c: &Ctx<'_>, op: UnaryOp, result: &BTile, cot: &BTile) -> Option<BTile> {
    use std::f64::consts::{LN_2, PI};
    use UnaryOp::*;
    // Derivatives that are functions of the result use it (no second evaluation of exp, tanh,
    // ...): in f64 mode it is exactly f(x); in native mode it is f(x) rounded to the kernel's
    // dtype, as the kernel itself would have it.
    // `cot * d(v)` for every element, `v` from the result or from the operand (one
    // monomorphised loop per derivative).
    fn times<F: Fn(f64) -> f64>(c: &Ctx<'_>, cot: &BTile, v: &BTile, d: F) -> BTile {
        let mut data = Vec::with_capacity(cot.data.len());
        for b in 0..cot.batch {
            let r = v.row(if v.batch == 1 { 0 } else { b });
            // A zero cotangent contributes zero, even where the derivative is infinite or NaN
            // (a masked-off lane whose forward value overflowed).
            data.extend(cot.row(b).iter().zip(r).map(|(&g, &r)| if g == 0.0 { 0.0 } else { g * d(r) }));
        }
        c.unbatch(0, BTile { batch: cot.batch, shape: cot.shape.clone(), data })
    }
    let x = c.args[0];
    Some(match op {
        Exp => times(c, cot, result, |r| r),
        Exp2 => times(c, cot, result, |r| LN_2 * r),
        Sqrt => times(c, cot, result, |r| 0.5 / r),
        Rsqrt => times(c, cot, result, |r| -0.5 * r * r * r),
        Tanh => times(c, cot, result, |r| 1.0 - r * r),
        Sigmoid => times(c, cot, result, |r| r * (1.0 - r)),
        Neg => times(c, cot, x, |_| -1.0),
        Abs => times(c, cot, x, |x| {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        }),
        Log => times(c, cot, x, |x| 1.0 / x),
        Log2 => times(c, cot, x, |x| 1.0 / (x * LN_2)),
        Sin => times(c, cot, x, f64::cos),
        Cos => times(c, cot, x, |x| -x.sin()),
        Erf => times(c, cot, x, |x| 2.0 / PI.sqrt() * (-x * x).exp()),
        Floor | Ceil | Not => return None,
    })
}

/// A float binary op in f64 (`None` for integer-only ops).
fn binary_f64(op: BinaryOp, a: f64, b: f64) -> Option<f64> {
    use BinaryOp::*;
    Some(match op {
        Add => a + b,
        Sub => a - b,
        Mul => a * b,
        Div => a / b,
        Mod => a % b,
        Min => a.min(b),
        Max => a.max(b),
        Pow => a.powf(b),
        FloorDiv | And | Or | Xor | UMulHi => return None,
    })
}

/// A float binary op in f32, as the reference computes it (`None` for integer-only ops).
fn binary_f32(op: BinaryOp, a: f32, b: f32) -> Option<f32> {
    use BinaryOp::*;
    Some(match op {
        Add => a + b,
        Sub => a - b,
        Mul => a * b,
        Div => a / b,
        Mod => a % b,
        Min => a.min(b),
        Max => a.max(b),
        Pow => (a as f64).powf(b as f64) as f32,
        FloorDiv | And | Or | Xor | UMulHi => return None,
    })
}

/// `umulhi` at the width of `d`: the high half of the product of the operands' bits read as
/// unsigned (the reference's `umulhi`).
fn umulhi(d: DType, x: i128, y: i128) -> i128 {
    if d == DType::I32 {
        ((x as u32 as u64 * y as u32 as u64) >> 32) as u32 as i32 as i128
    } else {
        ((x as u64 as u128 * y as u64 as u128) >> 64) as u64 as i64 as i128
    }
}

/// An integer binary op in exact arithmetic (C semantics: `//` and `%` truncate toward zero).
fn binary_int(c: &Ctx<'_>, op: BinaryOp, d: DType, a: f64, b: f64) -> Result<f64, AdError> {
    use BinaryOp::*;
    let (x, y) = (a as i128, b as i128);
    let r = match op {
        Add => x + y,
        Sub => x - y,
        Mul => x * y,
        FloorDiv | Mod => {
            if y == 0 {
                return Err(c.err("integer division by zero"));
            }
            // i32::MIN / -1 wraps to i32::MIN (and % gives 0), as `wrapping_div` does.
            if op == FloorDiv {
                x / y
            } else {
                x % y
            }
        }
        Min => x.min(y),
        Max => x.max(y),
        And => x & y,
        Or => x | y,
        Xor => x ^ y,
        UMulHi => umulhi(d, x, y),
        Div | Pow => return Err(c.err(format!("`{}` is not defined on integers", op.name()))),
    };
    int_result(c, d, r)
}

/// Elementwise binary op on two operands of one type.
pub(super) fn binary(c: &Ctx<'_>, op: BinaryOp, p: Precision) -> Result<BTile, AdError> {
    let d = c.dtype(0);
    if c.dtype(1) != d {
        return Err(c.err(format!("operands have different dtypes {d} and {}", c.dtype(1))));
    }
    let bad = || c.err(format!("`{}` is not defined on {d}", op.name()));
    if d.is_float() {
        return match Arith::of(d, p) {
            // The ground truth's hot path: one monomorphised loop per op.
            Arith::F64 => match op {
                BinaryOp::Add => map2_ok(c, |a, b| a + b),
                BinaryOp::Sub => map2_ok(c, |a, b| a - b),
                BinaryOp::Mul => map2_ok(c, |a, b| a * b),
                BinaryOp::Div => map2_ok(c, |a, b| a / b),
                _ => map2(c, |a, b| binary_f64(op, a, b).ok_or_else(bad)),
            },
            Arith::F32(d) => map2(c, |a, b| binary_f32(op, a as f32, b as f32).map(|r| narrow(d, r) as f64).ok_or_else(bad)),
        };
    }
    if d.is_bool() {
        let f = |x: bool| x as u8 as f64;
        return match op {
            BinaryOp::And => map2_ok(c, |a, b| f((a != 0.0) & (b != 0.0))),
            BinaryOp::Or => map2_ok(c, |a, b| f((a != 0.0) | (b != 0.0))),
            BinaryOp::Xor => map2_ok(c, |a, b| f((a != 0.0) ^ (b != 0.0))),
            _ => Err(bad()),
        };
    }
    if matches!(d, DType::I32 | DType::I64) && matches!(op, BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul) {
        // Integers held in f64: the f64 result is exact whenever its magnitude is below 2^53
        // (rounding is monotonic, so an inexact result lands at or beyond 2^53). When every
        // result is also within the dtype's range (no i32 wrap), it is the answer; otherwise
        // the exact paths below decide.
        let lim = if d == DType::I32 { 2f64.powi(31) } else { I64_LIMIT as f64 };
        // `r < lim && r >= -lim` (NaN cannot occur: operands are integers).
        let within = |r: f64| (r < lim) & (r >= -lim);
        let (t, ok) = match op {
            BinaryOp::Add => map2_all(c, |a, b| a + b, within),
            BinaryOp::Sub => map2_all(c, |a, b| a - b, within),
            _ => map2_all(c, |a, b| a * b, within),
        }?;
        if ok {
            return Ok(t);
        }
    }
    if d == DType::I32 && matches!(op, BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul) {
        // i32 operands: exact in i64, then wrapped as i32 arithmetic wraps.
        return match op {
            BinaryOp::Add => map2_ok(c, |a, b| (a as i64).wrapping_add(b as i64) as i32 as f64),
            BinaryOp::Sub => map2_ok(c, |a, b| (a as i64).wrapping_sub(b as i64) as i32 as f64),
            _ => map2_ok(c, |a, b| (a as i64).wrapping_mul(b as i64) as i32 as f64),
        };
    }
    if d == DType::I64 && matches!(op, BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul) {
        // Exact in i64 for operands within 2^53; results beyond are rejected below.
        // Checked in i64 before converting back: beyond +-2^53 becomes infinite and is rejected.
        let lim = I64_LIMIT as i64;
        let exact = move |r: Option<i64>| r.filter(|r| r.abs() <= lim).map_or(f64::INFINITY, |r| r as f64);
        let t = match op {
            BinaryOp::Add => map2_ok(c, |a, b| exact((a as i64).checked_add(b as i64))),
            BinaryOp::Sub => map2_ok(c, |a, b| exact((a as i64).checked_sub(b as i64))),
            _ => map2_ok(c, |a, b| exact((a as i64).checked_mul(b as i64))),
        }?;
        if t.data.iter().any(|v| v.abs() > I64_LIMIT as f64) {
            return Err(c.err("an i64 result is beyond +-2^53, which the f64 ground truth cannot hold exactly"));
        }
        return Ok(t);
    }
    map2(c, |a, b| binary_int(c, op, d, a, b))
}

/// The VJP of `+ - * /` with one tight loop per operand (the hot path of ground-truth
/// gradients). As in the general rule, a zero partial is a symbolic zero: it does not turn an
/// infinite cotangent into NaN.
fn arith_vjp(c: &Ctx<'_>, op: BinaryOp, cot: &BTile) -> Result<Vec<Option<BTile>>, AdError> {
    use BinaryOp::*;
    /// `f(cot, a, b)` for every element, brought to operand `i` (one monomorphised loop each).
    fn scaled<F: Fn(f64, f64, f64) -> f64>(c: &Ctx<'_>, cot: &BTile, i: usize, f: F) -> Result<Option<BTile>, AdError> {
        c.when_diff(i, || {
            let (la, lb) = (c.layout(0), c.layout(1));
            if matches!((&la, &lb), (Layout::Dense, Layout::Dense)) {
                let mut data = Vec::with_capacity(cot.data.len());
                for b in 0..cot.batch {
                    let (x, y, g) = (c.row(0, b), c.row(1, b), cot.row(b));
                    crate::simd::wide(|| data.extend(g.iter().zip(x.iter().zip(y)).map(|(&g, (&a, &bb))| f(g, a, bb))));
                }
                return Ok(c.unbatch(i, BTile { batch: cot.batch, shape: cot.shape.clone(), data }));
            }
            // A broadcast view among the operands: the cotangent of a view operand is summed
            // over its broadcast dimensions (row by row, in order) into the view's shape.
            let (n, inner) = (c.rty.numel(), c.inner());
            let li = if i == 0 { &la } else { &lb };
            let pn = c.args[i].numel();
            let mut data = match li {
                Layout::Dense => Vec::with_capacity(cot.data.len()),
                Layout::Rows { .. } => vec![0.0; cot.batch * pn],
            };
            for b in 0..cot.batch {
                let (x, y, g) = (c.row(0, b), c.row(1, b), cot.row(b));
                for r in 0..n / inner.max(1) {
                    let gr = &g[r * inner..(r + 1) * inner];
                    let mut out = match li {
                        Layout::Dense => Out::Extend(&mut data),
                        Layout::Rows { starts, splat: true } => Out::Sum(&mut data[b * pn + starts[r]]),
                        Layout::Rows { starts, splat: false } => Out::Add(&mut data[b * pn + starts[r]..][..inner]),
                    };
                    // One loop per pair of row kinds.
                    match (la.row(x, r, inner), lb.row(y, r, inner)) {
                        (RowRef::Slice(xa), RowRef::Slice(xb)) => view_row(gr, xa, xb, &f, &mut out),
                        (RowRef::Slice(xa), RowRef::Splat(vb)) => view_row(gr, xa, Splat(vb), &f, &mut out),
                        (RowRef::Splat(va), RowRef::Slice(xb)) => view_row(gr, Splat(va), xb, &f, &mut out),
                        (RowRef::Splat(va), RowRef::Splat(vb)) => view_row(gr, Splat(va), Splat(vb), &f, &mut out),
                    }
                }
            }
            let shape = if matches!(li, Layout::Dense) { cot.shape.clone() } else { c.args[i].shape.clone() };
            Ok(c.unbatch(i, BTile { batch: cot.batch, shape, data }))
        })
    }
    /// `g * p`, where a zero factor on either side is a symbolic zero: a zero partial does not
    /// turn an infinite cotangent into NaN, and a zero cotangent (a masked-off lane) does not
    /// turn an infinite or NaN partial into NaN.
    #[inline(always)]
    fn keep(g: f64, p: f64) -> f64 {
        if p == 0.0 || g == 0.0 {
            0.0
        } else {
            g * p
        }
    }
    Ok(match op {
        Add => vec![scaled(c, cot, 0, |g, _, _| g)?, scaled(c, cot, 1, |g, _, _| g)?],
        Sub => vec![scaled(c, cot, 0, |g, _, _| g)?, scaled(c, cot, 1, |g, _, _| -g)?],
        Mul => vec![scaled(c, cot, 0, |g, _, b| keep(g, b))?, scaled(c, cot, 1, |g, a, _| keep(g, a))?],
        Div => vec![scaled(c, cot, 0, |g, _, b| keep(g, 1.0 / b))?, scaled(c, cot, 1, |g, a, b| keep(g, -a / (b * b)))?],
        _ => unreachable!("only called for + - * /"),
    })
}

/// One operand's row in a loop over a row of a broadcast view: a slice of the row's length, or
/// one element repeated.
trait RowSrc: Copy {
    /// Elements `8c..8c + 8`.
    fn chunk(self, c: usize) -> [f64; 8];
    fn at(self, j: usize) -> f64;
}

impl RowSrc for &[f64] {
    #[inline(always)]
    fn chunk(self, c: usize) -> [f64; 8] {
        self[8 * c..8 * c + 8].try_into().expect("eight elements")
    }
    #[inline(always)]
    fn at(self, j: usize) -> f64 {
        self[j]
    }
}

/// A row that repeats one element.
#[derive(Clone, Copy)]
struct Splat(f64);

impl RowSrc for Splat {
    #[inline(always)]
    fn chunk(self, _: usize) -> [f64; 8] {
        [self.0; 8]
    }
    #[inline(always)]
    fn at(self, _: usize) -> f64 {
        self.0
    }
}

/// Where the values of one row of a view VJP go: appended (a dense operand), summed into one
/// element (a row that repeats one element), or added to a row (a row repeated over outer
/// dimensions).
enum Out<'o> {
    Extend(&'o mut Vec<f64>),
    Sum(&'o mut f64),
    Add(&'o mut [f64]),
}

/// `f(g[j], a[j], b[j])` for every element `j` of a row, to `out`; a sum takes eight partial sums
/// in a fixed order (deterministic, and not bound by the latency of one chain of additions).
/// Eight lanes at a time, compiled for AVX2 where the CPU has it (its own AVX2 function rather
/// than [`crate::simd::wide`]: a closure this large is not inlined into `wide`'s).
fn view_row<A: RowSrc, B: RowSrc, F: Fn(f64, f64, f64) -> f64>(g: &[f64], a: A, b: B, f: &F, out: &mut Out<'_>) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        fn avx2<A: RowSrc, B: RowSrc, F: Fn(f64, f64, f64) -> f64>(g: &[f64], a: A, b: B, f: &F, out: &mut Out<'_>) {
            view_row_lanes(g, a, b, f, out)
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked above).
            return unsafe { avx2(g, a, b, f, out) };
        }
    }
    view_row_lanes(g, a, b, f, out)
}

/// `f` on elements `8c..8c + 8` of a row.
#[inline(always)]
fn lanes<A: RowSrc, B: RowSrc, F: Fn(f64, f64, f64) -> f64>(g: &[f64], a: A, b: B, f: &F, c: usize) -> [f64; 8] {
    let (gc, ac, bc): (&[f64; 8], _, _) = (g[8 * c..8 * c + 8].try_into().expect("eight elements"), a.chunk(c), b.chunk(c));
    let mut r = [0.0; 8];
    for (k, r) in r.iter_mut().enumerate() {
        *r = f(gc[k], ac[k], bc[k]);
    }
    r
}

#[inline(always)]
fn view_row_lanes<A: RowSrc, B: RowSrc, F: Fn(f64, f64, f64) -> f64>(g: &[f64], a: A, b: B, f: &F, out: &mut Out<'_>) {
    let n = g.len();
    let full = n / 8;
    let lanes = |c: usize| lanes(g, a, b, f, c);
    match out {
        Out::Extend(v) => {
            v.reserve(n);
            for c in 0..full {
                v.extend_from_slice(&lanes(c));
            }
            v.extend((8 * full..n).map(|j| f(g[j], a.at(j), b.at(j))));
        }
        Out::Sum(d) => {
            let mut acc = [0.0f64; 8];
            for c in 0..full {
                let l = lanes(c);
                for k in 0..8 {
                    acc[k] += l[k];
                }
            }
            let mut s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
            s = (8 * full..n).fold(s, |s, j| s + f(g[j], a.at(j), b.at(j)));
            **d += s;
        }
        Out::Add(d) => {
            for c in 0..full {
                let l = lanes(c);
                let dc: &mut [f64; 8] = (&mut d[8 * c..8 * c + 8]).try_into().expect("eight elements");
                for k in 0..8 {
                    dc[k] += l[k];
                }
            }
            d[8 * full..].iter_mut().zip(8 * full..).for_each(|(d, j)| *d += f(g[j], a.at(j), b.at(j)));
        }
    }
}

/// True where `max(a, b)` (or `min` when `max` is false) selects `a`: ties go to `a`; a NaN
/// operand yields the other one (both NaN: `a`).
pub(super) fn selects_first(max: bool, a: f64, b: f64) -> bool {
    if a.is_nan() || b.is_nan() {
        return !a.is_nan() || b.is_nan();
    }
    if max {
        a >= b
    } else {
        a <= b
    }
}

/// The VJP of a binary op: cotangents for the float operands.
pub(super) fn binary_vjp(c: &Ctx<'_>, op: BinaryOp, cot: &BTile) -> Result<Vec<Option<BTile>>, AdError> {
    use BinaryOp::*;
    if matches!(op, Add | Sub | Mul | Div) {
        return arith_vjp(c, op, cot);
    }
    // d(result)/da and d(result)/db at (a, b).
    let partials: fn(f64, f64) -> (f64, f64) = match op {
        Add => |_, _| (1.0, 1.0),
        Sub => |_, _| (1.0, -1.0),
        Mul => |a, b| (b, a),
        Div => |a, b| (1.0 / b, -a / (b * b)),
        Mod => |a, b| (1.0, -(a / b).trunc()),
        Pow => |a, b| {
            let da = if b == 0.0 { 0.0 } else { b * a.powf(b - 1.0) };
            let db = if a == 0.0 { 0.0 } else { a.powf(b) * a.ln() };
            (da, db)
        },
        Min => |a, b| if selects_first(false, a, b) { (1.0, 0.0) } else { (0.0, 1.0) },
        Max => |a, b| if selects_first(true, a, b) { (1.0, 0.0) } else { (0.0, 1.0) },
        FloorDiv | And | Or | Xor | UMulHi => return Ok(vec![None, None]),
    };
    if (0..2).any(|i| !matches!(c.layout(i), Layout::Dense)) {
        return Err(c.err("broadcast views reach only `+ - * /` among the differentiable ops"));
    }
    let mut out = Vec::with_capacity(2);
    for i in 0..2 {
        out.push(c.when_diff(i, || {
            let mut g = cot.clone();
            for bt in 0..g.batch {
                let (x, y) = (c.row(0, bt), c.row(1, bt));
                for ((g, &a), &b) in g.row_mut(bt).iter_mut().zip(x).zip(y) {
                    let (da, db) = partials(a, b);
                    let p = if i == 0 { da } else { db };
                    // A zero partial or a zero cotangent is a symbolic zero: neither turns an
                    // infinite or NaN factor into NaN.
                    *g = if p == 0.0 || *g == 0.0 { 0.0 } else { *g * p };
                }
            }
            Ok(c.unbatch(i, g))
        })?);
    }
    Ok(out)
}

/// Elementwise comparison: 1.0 where true, 0.0 where false.
pub(super) fn cmp(c: &Ctx<'_>, op: CmpOp) -> Result<BTile, AdError> {
    let b = |x: bool| x as u8 as f64;
    match op {
        CmpOp::Eq => map2_ok(c, |x, y| b(x == y)),
        CmpOp::Ne => map2_ok(c, |x, y| b(x != y)),
        CmpOp::Lt => map2_ok(c, |x, y| b(x < y)),
        CmpOp::Le => map2_ok(c, |x, y| b(x <= y)),
        CmpOp::Gt => map2_ok(c, |x, y| b(x > y)),
        CmpOp::Ge => map2_ok(c, |x, y| b(x >= y)),
    }
}

/// `where(cond, a, b)`.
pub(super) fn select(c: &Ctx<'_>) -> Result<BTile, AdError> {
    let n = c.rty.numel();
    if c.args.iter().any(|a| a.numel() != n) {
        return Err(c.err("condition and branches have different shapes"));
    }
    let mut out = Vec::with_capacity(c.batch * n);
    for b in 0..c.batch {
        let (m, x, y) = (c.row(0, b), c.row(1, b), c.row(2, b));
        out.extend((0..n).map(|j| if m[j] != 0.0 { x[j] } else { y[j] }));
    }
    Ok(c.out(out))
}

/// The VJP of `where`: the cotangent goes to `a` where the condition holds, to `b` elsewhere.
pub(super) fn select_vjp(c: &Ctx<'_>, cot: &BTile) -> Vec<Option<BTile>> {
    let branch = |i: usize| {
        if !super::is_differentiable(c.tys[i]) {
            return None;
        }
        let mut g = cot.clone();
        for b in 0..g.batch {
            let m = c.row(0, b);
            g.row_mut(b).iter_mut().zip(m).for_each(|(g, &m)| {
                if (m != 0.0) != (i == 1) {
                    *g = 0.0;
                }
            });
        }
        Some(c.unbatch(i, g))
    };
    vec![None, branch(1), branch(2)]
}

/// `cast`: C/Triton conversions (float to int truncates and saturates, NaN to 0; to i1 is
/// `!= 0`); float results rounded as the reference rounds them in native mode, unrounded in F64.
pub(super) fn cast(c: &Ctx<'_>, p: Precision) -> Result<BTile, AdError> {
    let (s, d) = (c.dtype(0), c.rdtype());
    map1(c, |x| match d {
        DType::I1 => Ok((x != 0.0) as i64 as f64),
        // `as` truncates toward zero, saturates, and maps NaN to 0; i64 -> i32 wraps.
        DType::I32 if s.is_float() => Ok(x as i32 as f64),
        DType::I32 => Ok(x as i64 as i32 as f64),
        DType::I64 => int_result(c, d, x as i64 as i128),
        _ => Ok(match Arith::of(d, p) {
            Arith::F64 => x,
            Arith::F32(DType::F32) => x as f32 as f64,
            // From f32 storage (f32, f16, bf16) the reference rounds the f32; from f64 and
            // integers it rounds the f64 once.
            Arith::F32(t) if matches!(s, DType::F32 | DType::F16 | DType::BF16) => narrow(t, x as f32) as f64,
            Arith::F32(DType::F16) => half::f16::from_f64(x).to_f64(),
            Arith::F32(_) => half::bf16::from_f64(x).to_f64(),
        }),
    })
}
