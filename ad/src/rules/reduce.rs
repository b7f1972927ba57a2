//! Rules of the ops that combine elements along an axis (`reduce`, `cumsum`, `dot`), with the
//! reference interpreter's summation orders, so that native-precision sums are bit-identical.

use super::elementwise::{int_result, narrow, Arith};
use super::{split, Ctx, Precision};
use crate::{AdError, BTile};
use tilegrad_ir::{DotPrecision, ReduceOp};
use tilegrad_reference::{dot_f32, round_tf32};

/// Sum of a contiguous run in the reference's order ([`tilegrad_reference::sum_in_order`]).
pub(super) fn sum_run<T: Copy + Default + std::ops::Add<Output = T>>(v: &[T]) -> T {
    tilegrad_reference::sum_in_order(v, |a, b| a + b)
}

/// Sums `v`, laid out as [outer, n, inner], along the middle, in the reference's order: a
/// contiguous run (`inner == 1`) with [`sum_run`], otherwise in order of the reduced index.
fn sum_axis<T: Copy + Default + std::ops::Add<Output = T>>(v: &[T], outer: usize, n: usize, inner: usize) -> Vec<T> {
    if inner == 1 {
        return (0..outer).map(|o| sum_run(&v[o * n..(o + 1) * n])).collect();
    }
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        let base = o * n * inner;
        let mut acc: Vec<T> = v[base..base + inner].to_vec();
        for k in 1..n {
            let row = &v[base + k * inner..base + (k + 1) * inner];
            acc.iter_mut().zip(row).for_each(|(a, &b)| *a = *a + b);
        }
        out.extend(acc);
    }
    out
}

/// The maximum (or minimum) of a contiguous run with eight independent lanes, when that decides
/// it: the extreme of finite or infinite values is one of them whatever the order, so it equals
/// the in-order fold; a zero (whose sign the order may decide) or NaN result returns `None` for the
/// in-order fold to decide.
fn extreme_run(max: bool, v: &[f64]) -> Option<f64> {
    if max {
        extreme_lanes::<true>(v)
    } else {
        extreme_lanes::<false>(v)
    }
}

/// [`extreme_run`] for one direction. A strict comparison against a non-NaN accumulator never
/// picks NaN, so NaN elements are ignored as `f64::max`/`min` ignore them; only a NaN first
/// element (the accumulators' start) makes the result NaN, and then the fold decides.
fn extreme_lanes<const MAX: bool>(v: &[f64]) -> Option<f64> {
    let pick = |a: f64, b: f64| if (MAX && b > a) || (!MAX && b < a) { b } else { a };
    let (first, rest) = v.split_first()?;
    let mut acc = [*first; 8];
    let chunks = rest.chunks_exact(8);
    let tail = chunks.remainder();
    for ch in chunks {
        for j in 0..8 {
            acc[j] = pick(acc[j], ch[j]);
        }
    }
    let r = tail.iter().fold(acc.iter().copied().fold(*first, pick), |r, &x| pick(r, x));
    (r != 0.0 && !r.is_nan()).then_some(r)
}

/// The index along the axis that argmax (`max`) or argmin selects: the first extreme; NaN is
/// never selected unless every element is NaN (the reference's rule).
fn arg_extreme(max: bool, n: usize, at: impl Fn(usize) -> f64) -> usize {
    let mut best = 0usize;
    for k in 1..n {
        let (x, b) = (at(k), at(best));
        let better = if max { x > b } else { x < b };
        if better || (b.is_nan() && !x.is_nan()) {
            best = k;
        }
    }
    best
}

/// Checks the axis and returns (outer, n, inner) of operand 0.
fn axis_split(c: &Ctx<'_>, axis: usize) -> Result<(usize, usize, usize), AdError> {
    let shape = &c.tys[0].shape;
    if axis >= shape.len() {
        return Err(c.err(format!("axis {axis} is out of range for {}", c.tys[0])));
    }
    let s = split(shape, axis);
    if s.0 * s.2 != c.rty.numel() && !matches!(c.op, tilegrad_ir::Op::Cumsum { .. }) {
        return Err(c.err(format!("reducing {} along axis {axis} does not give {}", c.tys[0], c.rty)));
    }
    Ok(s)
}

/// `reduce` along `axis`.
pub(super) fn reduce(c: &Ctx<'_>, kind: ReduceOp, axis: usize, p: Precision) -> Result<BTile, AdError> {
    let (outer, n, inner) = axis_split(c, axis)?;
    let d = c.dtype(0);
    if d.is_bool() {
        return Err(c.err("cannot reduce i1 values"));
    }
    if n == 0 {
        return Err(c.err("cannot reduce an empty axis"));
    }
    let mut out = Vec::with_capacity(c.batch * outer * inner);
    for b in 0..c.batch {
        let v = c.row(0, b);
        match kind {
            ReduceOp::Sum if d.is_float() => match Arith::of(d, p) {
                Arith::F64 => out.extend(sum_axis(v, outer, n, inner)),
                Arith::F32(d) => {
                    let v32: Vec<f32> = v.iter().map(|&x| x as f32).collect();
                    out.extend(sum_axis(&v32, outer, n, inner).into_iter().map(|s| narrow(d, s) as f64));
                }
            },
            ReduceOp::Sum => {
                let vi: Vec<i128> = v.iter().map(|&x| x as i128).collect();
                for s in sum_axis(&vi, outer, n, inner) {
                    out.push(int_result(c, d, s)?);
                }
            }
            ReduceOp::Max | ReduceOp::Min => {
                // f64::max/min ignore NaN as the reference's f32/f64 max/min do; no rounding.
                let f: fn(f64, f64) -> f64 = if kind == ReduceOp::Max { f64::max } else { f64::min };
                for o in 0..outer {
                    for i in 0..inner {
                        let at = |k: usize| v[(o * n + k) * inner + i];
                        let fold = || (1..n).fold(at(0), |acc, k| f(acc, at(k)));
                        out.push(if inner == 1 {
                            extreme_run(kind == ReduceOp::Max, &v[o * n..(o + 1) * n]).unwrap_or_else(fold)
                        } else {
                            fold()
                        });
                    }
                }
            }
            ReduceOp::Argmax | ReduceOp::Argmin => {
                for o in 0..outer {
                    for i in 0..inner {
                        out.push(arg_extreme(kind == ReduceOp::Argmax, n, |k| v[(o * n + k) * inner + i]) as f64);
                    }
                }
            }
        }
    }
    Ok(c.out(out))
}

/// The VJP of `reduce` on a float operand: `sum` broadcasts the cotangent back; `max`/`min`
/// send it to the first index attaining the extreme (as `argmax`/`argmin` pick); arg-reductions
/// have none.
pub(super) fn reduce_vjp(c: &Ctx<'_>, kind: ReduceOp, axis: usize, result: &BTile, cot: &BTile) -> Result<Option<BTile>, AdError> {
    let (outer, n, inner) = axis_split(c, axis)?;
    if matches!(kind, ReduceOp::Argmax | ReduceOp::Argmin) {
        return Ok(None);
    }
    let m = c.args[0].numel();
    if kind == ReduceOp::Sum && inner == 1 && n > 0 {
        // Each reduced run receives its cotangent.
        let mut data = Vec::with_capacity(cot.batch * m);
        for &g in &cot.data {
            data.extend(std::iter::repeat_n(g, n));
        }
        return Ok(Some(c.unbatch(0, BTile::new(cot.batch, &c.args[0].shape, data))));
    }
    let mut data = vec![0.0; cot.batch * m];
    for b in 0..cot.batch {
        let (v, g, row) = (c.row(0, b), cot.row(b), &mut data[b * m..(b + 1) * m]);
        for o in 0..outer {
            for i in 0..inner {
                let gi = g[o * inner + i];
                let idx = |k: usize| (o * n + k) * inner + i;
                match kind {
                    ReduceOp::Sum => (0..n).for_each(|k| row[idx(k)] = gi),
                    _ => {
                        // The forward result is the extreme of the non-NaN elements (NaN when
                        // all are): the first element equal to it (either zero equals either)
                        // is the one argmax picks.
                        let r = result.row(b)[o * inner + i];
                        let first =
                            if inner == 1 { v[o * n..(o + 1) * n].iter().position(|&x| x == r) } else { (0..n).find(|&k| v[idx(k)] == r) };
                        row[idx(first.unwrap_or_else(|| arg_extreme(kind == ReduceOp::Max, n, |k| v[idx(k)])))] = gi
                    }
                }
            }
        }
    }
    Ok(Some(c.unbatch(0, BTile::new(cot.batch, &c.args[0].shape, data))))
}

/// Inclusive scan of `v` ([outer, n, inner]) along the middle, with `add` combining the running
/// value with the next element, from the end when `reverse`.
fn scan(
    v: &mut [f64],
    (outer, n, inner): (usize, usize, usize),
    reverse: bool,
    mut add: impl FnMut(f64, f64) -> Result<f64, AdError>,
) -> Result<(), AdError> {
    for o in 0..outer {
        for i in 0..inner {
            let idx = |k: usize| (o * n + k) * inner + i;
            for s in 1..n {
                let (k, prev) = if reverse { (n - 1 - s, n - s) } else { (s, s - 1) };
                v[idx(k)] = add(v[idx(prev)], v[idx(k)])?;
            }
        }
    }
    Ok(())
}

/// `cumsum` along `axis` (f16/bf16 rounded after every step, as the reference does).
pub(super) fn cumsum(c: &Ctx<'_>, axis: usize, reverse: bool, p: Precision) -> Result<BTile, AdError> {
    let sp = axis_split(c, axis)?;
    let d = c.dtype(0);
    if d.is_bool() {
        return Err(c.err("cannot scan i1 values"));
    }
    let mut out = Vec::with_capacity(c.batch * c.rty.numel());
    for b in 0..c.batch {
        let start = out.len();
        out.extend_from_slice(c.row(0, b));
        let v = &mut out[start..];
        if d.is_float() {
            match Arith::of(d, p) {
                Arith::F64 => scan(v, sp, reverse, |a, x| Ok(a + x))?,
                Arith::F32(d) => scan(v, sp, reverse, |a, x| Ok(narrow(d, a as f32 + x as f32) as f64))?,
            }
        } else {
            // Exact running sums, each wrapped (i32) or checked (i64): wrapping partial sums are
            // the exact ones modulo 2^32.
            let mut exact: Vec<i128> = v.iter().map(|&x| x as i128).collect();
            let (outer, n, inner) = sp;
            for o in 0..outer {
                for i in 0..inner {
                    let idx = |k: usize| (o * n + k) * inner + i;
                    for s in 1..n {
                        let (k, prev) = if reverse { (n - 1 - s, n - s) } else { (s, s - 1) };
                        exact[idx(k)] += exact[idx(prev)];
                    }
                }
            }
            for (o, e) in v.iter_mut().zip(exact) {
                *o = int_result(c, d, e)?;
            }
        }
    }
    Ok(c.out(out))
}

/// The VJP of `cumsum`: a cumsum of the cotangent in the opposite direction.
pub(super) fn cumsum_vjp(c: &Ctx<'_>, axis: usize, reverse: bool, cot: &BTile) -> Result<BTile, AdError> {
    let sp = axis_split(c, axis)?;
    let mut g = cot.clone();
    for b in 0..g.batch {
        scan(g.row_mut(b), sp, !reverse, |a, x| Ok(a + x))?;
    }
    Ok(c.unbatch(0, g))
}

/// `out[i, :] += sum over kk (ascending) of a[i, kk] * b[kk, :]` for `a` [M, K], `b` [K, N] and
/// `out` [M, N]: contiguous row updates, compiled for AVX2 where the CPU has it. Products and
/// sums are separate roundings in either version (no fused multiply-add), so both give the same
/// bits.
fn gemm_acc(out: &mut [f64], a: &[f64], b: &[f64], mkn: (usize, usize, usize)) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked above).
        return unsafe { gemm_acc_avx2(out, a, b, mkn) };
    }
    gemm_acc_impl(out, a, b, mkn)
}

/// [`gemm_acc`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn gemm_acc_avx2(out: &mut [f64], a: &[f64], b: &[f64], mkn: (usize, usize, usize)) {
    gemm_acc_impl(out, a, b, mkn)
}

#[inline(always)]
fn gemm_acc_impl(out: &mut [f64], a: &[f64], b: &[f64], (m, k, n): (usize, usize, usize)) {
    for i in 0..m {
        let row = &mut out[i * n..(i + 1) * n];
        let ar = &a[i * k..(i + 1) * k];
        // Four k steps per pass over the row, applied one after the other to each element (the
        // same order and roundings as one step per pass, with a quarter of the row traffic).
        let mut kk = 0;
        while kk + 4 <= k {
            let (x0, x1, x2, x3) = (ar[kk], ar[kk + 1], ar[kk + 2], ar[kk + 3]);
            let (b0, b1, b2, b3) =
                (&b[kk * n..(kk + 1) * n], &b[(kk + 1) * n..(kk + 2) * n], &b[(kk + 2) * n..(kk + 3) * n], &b[(kk + 3) * n..(kk + 4) * n]);
            for j in 0..n {
                let mut o = row[j];
                o += x0 * b0[j];
                o += x1 * b1[j];
                o += x2 * b2[j];
                o += x3 * b3[j];
                row[j] = o;
            }
            kk += 4;
        }
        for kk in kk..k {
            let x = ar[kk];
            row.iter_mut().zip(&b[kk * n..(kk + 1) * n]).for_each(|(o, &y)| *o += x * y);
        }
    }
}

/// [`gemm_acc`] for a VJP, where one factor is a cotangent: [`gemm_acc_masked`] when a factor is
/// infinite or NaN.
fn gemm_acc_vjp(out: &mut [f64], a: &[f64], b: &[f64], mkn: (usize, usize, usize)) {
    if a.iter().chain(b).all(|x| x.is_finite()) {
        gemm_acc(out, a, b, mkn)
    } else {
        gemm_acc_masked(out, a, b, mkn)
    }
}

/// [`gemm_acc`] where a factor is infinite or NaN: a product with a zero factor is a symbolic
/// zero (a zero cotangent of a masked-off lane does not turn an infinite operand into NaN, nor
/// does a zero operand an infinite cotangent); the same order of sums otherwise.
fn gemm_acc_masked(out: &mut [f64], a: &[f64], b: &[f64], (m, k, n): (usize, usize, usize)) {
    for i in 0..m {
        let row = &mut out[i * n..(i + 1) * n];
        for kk in 0..k {
            let x = a[i * k + kk];
            if x == 0.0 {
                continue;
            }
            row.iter_mut().zip(&b[kk * n..(kk + 1) * n]).for_each(|(o, &y)| {
                if y != 0.0 {
                    *o += x * y
                }
            });
        }
    }
}

/// Checks `dot`'s shapes and returns (M, K, N).
fn dot_dims(c: &Ctx<'_>) -> Result<(usize, usize, usize), AdError> {
    let (a, b, acc) = (&c.tys[0].shape, &c.tys[1].shape, &c.tys[2].shape);
    let ok = a.len() == 2 && b.len() == 2 && acc.len() == 2 && a[1] == b[0] && acc[0] == a[0] && acc[1] == b[1];
    if !ok || c.rshape() != acc.as_slice() {
        return Err(c.err(format!("shapes {} x {} + {} do not match [M, K] x [K, N] + [M, N]", c.tys[0], c.tys[1], c.tys[2])));
    }
    Ok((a[0], a[1], b[1]))
}

/// `dot(a, b, acc)`: acc + sum over k in order of a[i, k] * b[k, j]. In native mode with an
/// f32/f16/bf16 accumulator the operands are converted to f32 (rounded to tf32 for f32 operands
/// with `tf32` precision), the sum runs in f32 as the reference's ([`dot_f32`]: one fused
/// multiply-add a step) and the result is rounded to acc's dtype once.
pub(super) fn dot(c: &Ctx<'_>, dp: DotPrecision, p: Precision) -> Result<BTile, AdError> {
    let (m, k, n) = dot_dims(c)?;
    let arith = Arith::of(c.rdtype(), p);
    let tf32 = dp == DotPrecision::Tf32 && c.dtype(0) == tilegrad_ir::DType::F32;
    let mut out = Vec::with_capacity(c.batch * m * n);
    for bt in 0..c.batch {
        let (a, b, acc) = (c.row(0, bt), c.row(1, bt), c.row(2, bt));
        match arith {
            Arith::F64 => {
                // Each element is `acc + a0*b0 + a1*b1 + ...` in that order.
                let start = out.len();
                out.extend_from_slice(acc);
                gemm_acc(&mut out[start..], a, b, (m, k, n));
            }
            Arith::F32(d) => {
                let conv = |x: f64| if tf32 { round_tf32(x as f32) } else { x as f32 };
                let (a32, b32): (Vec<f32>, Vec<f32>) = (a.iter().map(|&x| conv(x)).collect(), b.iter().map(|&x| conv(x)).collect());
                let mut s: Vec<f32> = acc.iter().map(|&x| x as f32).collect();
                dot_f32(&mut s, &a32, &b32, (m, k, n));
                out.extend(s.into_iter().map(|x| narrow(d, x) as f64));
            }
        }
    }
    Ok(c.out(out))
}

/// The VJP of `dot`: a_bar = cot b^T, b_bar = a^T cot, acc_bar = cot (exact, in f64).
pub(super) fn dot_vjp(c: &Ctx<'_>, cot: &BTile) -> Result<Vec<Option<BTile>>, AdError> {
    let (m, k, n) = dot_dims(c)?;
    let bsz = cot.batch;
    let a_bar = c.when_diff(0, || {
        let mut g = vec![0.0; bsz * m * k];
        let mut bt_t = vec![0.0; k * n];
        for bt in 0..bsz {
            let (b, ct) = (c.row(1, bt), cot.row(bt));
            if bt == 0 || c.args[1].batch != 1 {
                // b^T, so that a_bar[i, :] = sum over j (ascending) of cot[i, j] * b^T[j, :] runs
                // over contiguous rows (vectorisable) instead of strided dot products.
                for kk in 0..k {
                    for j in 0..n {
                        bt_t[j * k + kk] = b[kk * n + j];
                    }
                }
            }
            gemm_acc_vjp(&mut g[bt * m * k..(bt + 1) * m * k], ct, &bt_t, (m, n, k));
        }
        Ok(c.unbatch(0, BTile::new(bsz, &[m, k], g)))
    })?;
    let b_bar = c.when_diff(1, || {
        let mut g = vec![0.0; bsz * k * n];
        let mut a_t = vec![0.0; m * k];
        for bt in 0..bsz {
            let (a, ct) = (c.row(0, bt), cot.row(bt));
            if bt == 0 || c.args[0].batch != 1 {
                for i in 0..m {
                    for kk in 0..k {
                        a_t[kk * m + i] = a[i * k + kk];
                    }
                }
            }
            // b_bar[kk, :] = sum over i (ascending) of a^T[kk, i] * cot[i, :].
            gemm_acc_vjp(&mut g[bt * k * n..(bt + 1) * k * n], &a_t, ct, (k, m, n));
        }
        Ok(c.unbatch(1, BTile::new(bsz, &[k, n], g)))
    })?;
    let acc_bar = c.when_diff(2, || Ok(c.unbatch(2, cot.clone())))?;
    Ok(vec![a_bar, b_bar, acc_bar])
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    /// Runs whose values include repeats, signed zeros, infinities and NaN.
    fn runs() -> Vec<Vec<f64>> {
        let mut rng = StdRng::seed_from_u64(11);
        let special = [0.0, -0.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 1.5, -1.5];
        let mut out = Vec::new();
        for len in [1, 2, 7, 8, 9, 17, 100, 1000] {
            for mix in 0..6 {
                out.push(
                    (0..len)
                        .map(|_| match mix {
                            0 => rng.gen_range(-3.0..3.0),
                            1 => rng.gen_range(-3..3) as f64,
                            2 => special[rng.gen_range(0..special.len())],
                            3 => -rng.gen_range(0.0..1.0),
                            4 => [0.0, -0.0][rng.gen_range(0..2)],
                            _ => f64::NAN,
                        })
                        .collect(),
                );
            }
        }
        out
    }

    #[test]
    fn eight_lane_extremes_equal_the_in_order_fold_or_defer_to_it() {
        for v in runs() {
            for max in [true, false] {
                let f: fn(f64, f64) -> f64 = if max { f64::max } else { f64::min };
                let fold = v[1..].iter().fold(v[0], |a, &x| f(a, x));
                if let Some(r) = extreme_run(max, &v) {
                    assert_eq!(r.to_bits(), fold.to_bits(), "{v:?} max={max}");
                    // The first element equal to it is argmax's pick.
                    let first = v.iter().position(|&x| x == r).unwrap();
                    assert_eq!(first, arg_extreme(max, v.len(), |k| v[k]), "{v:?} max={max}");
                } else {
                    assert!(fold == 0.0 || v[0].is_nan(), "{v:?} max={max}: deferred needlessly");
                }
            }
        }
    }

    #[test]
    fn max_and_min_send_the_cotangent_where_argmax_and_argmin_point() {
        use crate::rules::{eval, vjp, Precision};
        use tilegrad_ir::{DType, Op, Type};
        for v in runs() {
            let n = v.len();
            for kind in [ReduceOp::Max, ReduceOp::Min] {
                let pick = arg_extreme(kind == ReduceOp::Max, n, |k| v[k]);
                // Along a contiguous last axis ([1, n]) and a strided leading one ([n, 2], the
                // second column reversed).
                let strided: Vec<f64> = (0..n).flat_map(|k| [v[k], v[n - 1 - k]]).collect();
                for (shape, data, axis, want) in [([1, n], v.clone(), 1u8, vec![pick]), ([n, 2], strided, 0u8, vec![2 * pick])] {
                    let ty = Type::tile(DType::F64, &shape);
                    let rty = Type::tile(DType::F64, &[shape[1 - axis as usize]]);
                    let op = Op::Reduce { kind, axis, keep_dims: false };
                    let x = BTile::new(1, &shape, data);
                    let y = eval(&op, &[&x], &[&ty], &rty, Precision::F64).unwrap();
                    let cot = BTile::new(1, &rty.shape, (1..=rty.numel()).map(|j| j as f64).collect());
                    let g = vjp(&op, &[&x], &[&ty], &y, &rty, &cot).unwrap().remove(0).unwrap();
                    let got: Vec<usize> = g.data.iter().enumerate().filter(|(_, &x)| x == 1.0).map(|(j, _)| j).collect();
                    assert_eq!(got, want, "{v:?} {} axis {axis}", kind.name());
                }
            }
        }
    }

    #[test]
    fn gemm_versions_give_the_same_bits() {
        let mut rng = StdRng::seed_from_u64(12);
        for (m, k, n) in [(1, 1, 1), (3, 5, 7), (16, 9, 33), (64, 32, 64)] {
            let a: Vec<f64> = (0..m * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let b: Vec<f64> = (0..k * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let init: Vec<f64> = (0..m * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
            // One k step at a time, in order.
            let mut want = init.clone();
            for i in 0..m {
                for kk in 0..k {
                    for j in 0..n {
                        want[i * n + j] += a[i * k + kk] * b[kk * n + j];
                    }
                }
            }
            let mut got = init.clone();
            gemm_acc(&mut got, &a, &b, (m, k, n));
            let mut plain = init.clone();
            gemm_acc_impl(&mut plain, &a, &b, (m, k, n));
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{m}x{k}x{n}");
            assert_eq!(bits(&plain), bits(&want), "{m}x{k}x{n}");
        }
    }
}
