//! Host steps that take a tensor apart along an axis and put tensors together again, as
//! launchers do around a kernel that works on halves (`x.chunk(2, -1)`, `x[:, :H]`,
//! `torch.cat([da, db], -1)`): their values, and their VJPs for the ground truth (a chunk or a
//! slice scatters its cotangent back into the source's positions; a concatenation splits its
//! cotangent among its sources).
//!
//! Each piece is a new tensor holding a copy of the elements (torch gives a view): a launch that
//! writes into a piece does not change its source.

use super::{split_axis, Env};
use crate::check::expr::{Expr, Scope};
use tilegrad_ir::DType;
use tilegrad_reference::HostTensor;

/// The sizes of the chunks `torch.chunk` gives for an axis of extent `n` asked for `chunks`:
/// each `ceil(n / chunks)`, the last one what remains, so there may be fewer than `chunks`
/// (`n = 5`, 4 chunks: 2, 2, 1); an axis of extent 0 gives `chunks` empty ones.
pub(crate) fn chunk_sizes(n: usize, chunks: usize) -> Vec<usize> {
    if chunks == 0 {
        return Vec::new();
    }
    let size = n.div_ceil(chunks);
    if size == 0 {
        return vec![0; chunks];
    }
    let count = n.div_ceil(size);
    (0..count).map(|k| size.min(n - k * size)).collect()
}

/// The positions of a slice `start:stop:step` of an axis of extent `n`, by Python's rules
/// (negative bounds count from the end, bounds past either end are clamped); `step` must be
/// positive, as torch requires.
pub(crate) fn slice_positions(n: usize, start: Option<i64>, stop: Option<i64>, step: Option<i64>) -> Result<Vec<usize>, String> {
    let step = step.unwrap_or(1);
    if step <= 0 {
        return Err(format!("the step of a slice must be positive (torch), got {step}"));
    }
    let n = n as i64;
    let clamp = |v: i64| if v < 0 { (v + n).max(0) } else { v.min(n) };
    let (a, b) = (start.map_or(0, clamp), stop.map_or(n, clamp));
    Ok((a..b.max(a)).step_by(step as usize).map(|p| p as usize).collect())
}

/// For each element (row-major) of the piece of a tensor of `shape` that takes positions `pos`
/// along `axis`, its flat index in the tensor.
pub(crate) fn along(shape: &[usize], axis: usize, pos: &[usize]) -> Vec<usize> {
    let (outer, n, inner): (usize, usize, usize) = (shape[..axis].iter().product(), shape[axis], shape[axis + 1..].iter().product());
    let mut out = Vec::with_capacity(outer * pos.len() * inner);
    for o in 0..outer {
        for &p in pos {
            out.extend((0..inner).map(|j| (o * n + p) * inner + j));
        }
    }
    out
}

/// The piece of `t` at positions `pos` along `axis`, a new tensor of `t`'s dtype.
fn take(t: &HostTensor, axis: usize, pos: &[usize]) -> HostTensor {
    let v = t.to_f64_vec();
    let mut shape = t.shape().to_vec();
    shape[axis] = pos.len();
    let out: Vec<f64> = along(t.shape(), axis, pos).into_iter().map(|k| v[k]).collect();
    HostTensor::from_f64_as(t.dtype(), &shape, &out)
}

/// `src` and its axis (its index), or an error naming them.
fn source<'a>(env: &'a Env, src: &str, axis: i64, what: &str) -> Result<(&'a HostTensor, usize), String> {
    let t = env.tensor(src).ok_or_else(|| env.need(src).unwrap_err())?;
    let (a, ..) =
        split_axis(t.shape(), axis).ok_or_else(|| format!("{what} along axis {axis} of `{src}`, which has shape {:?}", t.shape()))?;
    Ok((t, a))
}

/// The positions along the axis of each chunk of `src.chunk(chunks, axis)`.
pub(crate) fn chunk_positions(shape: &[usize], chunks: usize, axis: usize) -> Vec<Vec<usize>> {
    let mut at = 0;
    chunk_sizes(shape[axis], chunks)
        .into_iter()
        .map(|k| {
            at += k;
            (at - k..at).collect()
        })
        .collect()
}

/// The chunks of `src.chunk(chunks, axis)`, which must be `count` (the tensors they go into).
pub(crate) fn chunk(env: &Env, src: &str, chunks: usize, axis: i64, count: usize) -> Result<Vec<HostTensor>, String> {
    let (t, a) = source(env, src, axis, "chunk")?;
    if chunks == 0 || (t.shape()[a] == 0 && chunks != count) {
        return Err(format!("`{src}`.chunk({chunks}, {axis}) of shape {:?}: {count} tensors named", t.shape()));
    }
    let parts = chunk_positions(t.shape(), chunks, a);
    if parts.len() != count {
        let sizes = chunk_sizes(t.shape()[a], chunks);
        return Err(format!(
            "`{src}`.chunk({chunks}, {axis}) of shape {:?} gives {} chunks (sizes {sizes:?}), not the {count} named",
            t.shape(),
            parts.len()
        ));
    }
    Ok(parts.iter().map(|p| take(t, a, p)).collect())
}

/// The slice bounds evaluated in `scope` (each an integer).
pub(crate) fn bounds(bounds: [&Option<Expr>; 3], scope: &dyn Scope) -> Result<[Option<i64>; 3], String> {
    let mut out = [None; 3];
    for (o, (b, what)) in out.iter_mut().zip(bounds.into_iter().zip(["start", "stop", "step"])) {
        if let Some(e) = b {
            *o = Some(e.eval_int(scope).map_err(|err| format!("{what} `{e}`: {err}"))?);
        }
    }
    Ok(out)
}

/// `src[start:stop:step]` along `axis`.
pub(crate) fn slice(env: &Env, src: &str, axis: i64, b: [&Option<Expr>; 3]) -> Result<HostTensor, String> {
    let (t, a) = source(env, src, axis, "slice")?;
    let [start, stop, step] = bounds(b, env)?;
    let pos = slice_positions(t.shape()[a], start, stop, step)?;
    Ok(take(t, a, &pos))
}

/// The shape and dtype of `torch.cat` of tensors of these shapes and dtypes along `axis`: the
/// same rank (at least 1) and extents but along the axis; the dtypes promoted as torch does.
pub(crate) fn cat_type(parts: &[(&str, DType, &[usize])], axis: i64) -> Result<(Vec<usize>, DType, usize), String> {
    let (first, d0, s0) = *parts.first().ok_or("cat needs at least one tensor")?;
    let (a, ..) = split_axis(s0, axis).ok_or_else(|| format!("cat along axis {axis} of `{first}`, which has shape {s0:?}"))?;
    let mut shape = s0.to_vec();
    let mut dtype = d0;
    for &(n, d, s) in &parts[1..] {
        let same = s.len() == s0.len() && s.iter().zip(s0).enumerate().all(|(k, (x, y))| k == a || x == y);
        if !same {
            return Err(format!("cat along axis {axis}: `{n}` has shape {s:?}, `{first}` {s0:?} (only axis {a} may differ)"));
        }
        shape[a] += s[a];
        dtype = DType::promote(dtype, d);
    }
    Ok((shape, dtype, a))
}

/// `torch.cat(srcs, axis)`.
pub(crate) fn cat(env: &Env, srcs: &[String], axis: i64) -> Result<HostTensor, String> {
    let ts = srcs.iter().map(|n| env.tensor(n).ok_or_else(|| env.need(n).unwrap_err())).collect::<Result<Vec<_>, _>>()?;
    let parts: Vec<(&str, DType, &[usize])> = srcs.iter().zip(&ts).map(|(n, t)| (n.as_str(), t.dtype(), t.shape())).collect();
    let (shape, dtype, a) = cat_type(&parts, axis)?;
    let mut out = vec![0.0; shape.iter().product()];
    for (t, pos) in ts.iter().zip(cat_positions(&ts.iter().map(|t| t.shape()[a]).collect::<Vec<_>>())) {
        for (v, k) in t.to_f64_vec().into_iter().zip(along(&shape, a, &pos)) {
            out[k] = v;
        }
    }
    Ok(HostTensor::from_f64_as(dtype, &shape, &out))
}

/// The positions along the axis of the result that each part of a concatenation fills.
pub(crate) fn cat_positions(extents: &[usize]) -> Vec<Vec<usize>> {
    let mut at = 0;
    extents
        .iter()
        .map(|&k| {
            at += k;
            (at - k..at).collect()
        })
        .collect()
}

/// For each element of `dst`, made from `src` by a chunk, slice or concatenation `step` of a
/// pass that left `env`, the element of `src` it holds (`None`: from another source, or
/// another kind of step).
pub(crate) fn source_map(step: &super::Step, env: &Env, dst: &str, src: &str) -> Option<Vec<Option<usize>>> {
    use super::Step;
    let shape = |n: &str| env.tensor(n).map(|t| t.shape().to_vec());
    let (s, d) = (shape(src)?, shape(dst)?);
    match step {
        Step::Chunk { chunks, axis, dsts, .. } => {
            let (a, ..) = split_axis(&s, *axis)?;
            let k = dsts.iter().position(|x| x == dst)?;
            Some(along(&s, a, chunk_positions(&s, *chunks, a).get(k)?).into_iter().map(Some).collect())
        }
        Step::Slice { axis, start, stop, step, .. } => {
            let (a, ..) = split_axis(&s, *axis)?;
            let [start, stop, step] = bounds([start, stop, step], env).ok()?;
            Some(along(&s, a, &slice_positions(s[a], start, stop, step).ok()?).into_iter().map(Some).collect())
        }
        Step::Cat { srcs, axis, .. } => {
            let (a, ..) = split_axis(&d, *axis)?;
            let extents = srcs.iter().map(|n| shape(n).map(|sh| sh[a])).collect::<Option<Vec<_>>>()?;
            let k = srcs.iter().position(|x| x == src)?;
            let mut out = vec![None; d.iter().product()];
            for (j, e) in along(&d, a, &cat_positions(&extents)[k]).into_iter().enumerate() {
                out[e] = Some(j);
            }
            Some(out)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_sizes_follow_torch() {
        // torch.chunk(torch.arange(n), c) sizes, as torch gives them.
        for (n, c, want) in [
            (6, 2, vec![3, 3]),
            (5, 2, vec![3, 2]),
            (5, 4, vec![2, 2, 1]),
            (6, 4, vec![2, 2, 2]),
            (7, 3, vec![3, 3, 1]),
            (1, 3, vec![1]),
            (10, 1, vec![10]),
            (3, 5, vec![1, 1, 1]),
            (0, 3, vec![0, 0, 0]),
            (13, 6, vec![3, 3, 3, 3, 1]),
        ] {
            assert_eq!(chunk_sizes(n, c), want, "n={n}, chunks={c}");
        }
    }

    #[test]
    fn slices_follow_python() {
        let r = |a: Option<i64>, b: Option<i64>, s: Option<i64>| slice_positions(7, a, b, s).unwrap();
        assert_eq!(r(None, None, None), (0..7).collect::<Vec<_>>());
        assert_eq!(r(Some(2), Some(5), None), vec![2, 3, 4]);
        assert_eq!(r(Some(-3), None, None), vec![4, 5, 6]);
        assert_eq!(r(None, Some(-5), None), vec![0, 1]);
        assert_eq!(r(Some(1), Some(100), Some(2)), vec![1, 3, 5]);
        assert_eq!(r(Some(-100), Some(2), None), vec![0, 1]);
        assert_eq!(r(Some(5), Some(2), None), Vec::<usize>::new());
        assert!(slice_positions(7, None, None, Some(0)).unwrap_err().contains("must be positive"));
        assert!(slice_positions(7, None, None, Some(-1)).is_err());
    }

    #[test]
    fn pieces_index_the_source_row_major() {
        // [2, 3, 4]: positions 1 and 3 of the last axis.
        assert_eq!(along(&[2, 3, 4], 2, &[1, 3])[..4], [1, 3, 5, 7]);
        assert_eq!(along(&[2, 3, 4], 1, &[2]), vec![8, 9, 10, 11, 20, 21, 22, 23]);
        let cat = cat_type(&[("a", DType::F16, &[2, 3]), ("b", DType::F32, &[2, 5])], -1).unwrap();
        assert_eq!(cat, (vec![2, 8], DType::F32, 1));
        let e = cat_type(&[("a", DType::F32, &[2, 3]), ("b", DType::F32, &[3, 3])], 1).unwrap_err();
        assert!(e.contains("`b` has shape [3, 3], `a` [2, 3] (only axis 1 may differ)"), "{e}");
        assert!(cat_type(&[("a", DType::F32, &[])], 0).unwrap_err().contains("shape []"));
        assert_eq!(cat_positions(&[2, 0, 3]), vec![vec![0, 1], vec![], vec![2, 3, 4]]);
    }
}
