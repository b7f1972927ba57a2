//! Rules of the layout ops (`arange`, `broadcast`, `expand_dims`, `reshape`, `permute`): index
//! maps from result elements to operand elements, and their transposes (scatter-adds) as VJPs.

use super::{strides, Ctx};
use crate::{AdError, BTile};

/// `arange(start, end)`: i32 values start..end (batch 1: the same in every program).
pub(super) fn arange(c: &Ctx<'_>, start: i64, end: i64) -> Result<BTile, AdError> {
    let n = end.saturating_sub(start).max(0) as usize;
    if c.rshape() != [n] {
        return Err(c.err(format!("arange({start}, {end}) has {n} elements, its type is {}", c.rty)));
    }
    if i32::try_from(start).is_err() || i32::try_from(end).is_err() {
        return Err(c.err(format!("arange({start}, {end}) is beyond i32")));
    }
    Ok(BTile::new(1, &[n], (start..end).map(|v| v as f64).collect()))
}

/// Applies an index map (result element -> operand-0 element) to every program.
fn gather(c: &Ctx<'_>, map: &[usize]) -> BTile {
    let mut out = Vec::with_capacity(c.batch * map.len());
    for b in 0..c.batch {
        let x = c.row(0, b);
        out.extend(map.iter().map(|&j| x[j]));
    }
    c.out(out)
}

/// The transpose of [`gather`]: scatter-adds the cotangent into operand 0's shape.
fn scatter_add(c: &Ctx<'_>, map: &[usize], cot: &BTile) -> BTile {
    let n = c.args[0].numel();
    let mut data = vec![0.0; cot.batch * n];
    for b in 0..cot.batch {
        let row = &mut data[b * n..(b + 1) * n];
        cot.row(b).iter().zip(map).for_each(|(&x, &j)| row[j] += x);
    }
    c.unbatch(0, BTile::new(cot.batch, &c.args[0].shape, data))
}

/// The operand element each result element of a broadcast reads.
fn broadcast_map(c: &Ctx<'_>) -> Result<Vec<usize>, AdError> {
    let (src, dst) = (&c.tys[0].shape, c.rshape());
    let n: usize = dst.iter().product();
    if src.is_empty() {
        return Ok(vec![0; n]);
    }
    let ok = src.len() == dst.len() && src.iter().zip(dst).all(|(s, d)| s == d || *s == 1);
    if !ok {
        return Err(c.err(format!("cannot broadcast {} to {}", c.tys[0], c.rty)));
    }
    Ok(bcast_index(src, dst))
}

/// Checks that operand 0 broadcasts to the result (same rank, 1s where they differ).
fn check_broadcast(c: &Ctx<'_>) -> Result<(), AdError> {
    let (src, dst) = (&c.tys[0].shape, c.rshape());
    if src.len() == dst.len() && src.iter().zip(dst).all(|(s, d)| s == d || *s == 1) {
        Ok(())
    } else {
        Err(c.err(format!("cannot broadcast {} to {}", c.tys[0], c.rty)))
    }
}

/// For each element of `dst` (row-major), the element of `src` (same rank, 1s where broadcast)
/// it reads: a walk that moves the operand index by its stride (0 along broadcast dimensions),
/// O(1) per element.
pub(super) fn bcast_index(src: &[usize], dst: &[usize]) -> Vec<usize> {
    let n: usize = dst.iter().product();
    let sst = strides(src);
    let bst: Vec<usize> = (0..dst.len()).map(|d| if src[d] == 1 { 0 } else { sst[d] }).collect();
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0usize; dst.len()];
    let mut base = 0usize;
    for _ in 0..n {
        out.push(base);
        let mut d = dst.len();
        while d > 0 {
            d -= 1;
            idx[d] += 1;
            base += bst[d];
            if idx[d] < dst[d] {
                break;
            }
            base -= bst[d] * dst[d];
            idx[d] = 0;
        }
    }
    out
}

/// `broadcast` of a scalar, or of a tile with 1s where the result is larger.
pub(super) fn broadcast(c: &Ctx<'_>) -> Result<BTile, AdError> {
    let (src, dst) = (&c.tys[0].shape, c.rshape());
    let n: usize = dst.iter().product();
    if src.is_empty() || src.iter().product::<usize>() == 1 {
        // A scalar (or single element) fills the tile.
        let mut out = Vec::with_capacity(c.batch * n);
        for b in 0..c.batch {
            out.extend(std::iter::repeat_n(c.row(0, b)[0], n));
        }
        return Ok(c.out(out));
    }
    if src.len() != dst.len() || dst.is_empty() {
        return Ok(gather(c, &broadcast_map(c)?));
    }
    check_broadcast(c)?;
    // Row by row (last dimension): a broadcast last dimension repeats one value, otherwise the
    // operand's row is copied; the operand row's offset comes from the outer index map.
    let r = dst.len();
    let inner = dst[r - 1];
    let outer_map = bcast_index(&src[..r - 1], &dst[..r - 1]);
    let last_bcast = src[r - 1] == 1;
    let row_len = src[r - 1];
    let mut out = Vec::with_capacity(c.batch * n);
    for b in 0..c.batch {
        let x = c.row(0, b);
        for &o in &outer_map {
            let start = o * row_len;
            if last_bcast {
                out.extend(std::iter::repeat_n(x[start], inner));
            } else {
                out.extend_from_slice(&x[start..start + inner]);
            }
        }
    }
    Ok(c.out(out))
}

/// The VJP of `broadcast`: sums over the broadcast dimensions.
pub(super) fn broadcast_vjp(c: &Ctx<'_>, cot: &BTile) -> Result<BTile, AdError> {
    let (src, dst) = (&c.tys[0].shape, c.rshape());
    if src.len() != dst.len() || dst.is_empty() {
        return Ok(scatter_add(c, &broadcast_map(c)?, cot));
    }
    check_broadcast(c)?;
    // Row by row, the transpose of `broadcast`: a broadcast last dimension sums the row into
    // one element, otherwise the row is added onto the operand's row.
    let r = dst.len();
    let inner = dst[r - 1];
    let outer_map = bcast_index(&src[..r - 1], &dst[..r - 1]);
    let last_bcast = src[r - 1] == 1;
    let row_len = src[r - 1];
    let n = c.args[0].numel();
    let mut data = vec![0.0; cot.batch * n];
    for b in 0..cot.batch {
        let (g, acc) = (cot.row(b), &mut data[b * n..(b + 1) * n]);
        for (k, &o) in outer_map.iter().enumerate() {
            let (row, start) = (&g[k * inner..(k + 1) * inner], o * row_len);
            if last_bcast {
                // Eight interleaved partial sums (as `reduce` sums a row): not a latency-bound
                // chain of dependent additions.
                acc[start] += super::reduce::sum_run(row);
            } else {
                acc[start..start + inner].iter_mut().zip(row).for_each(|(a, &x)| *a += x);
            }
        }
    }
    Ok(c.unbatch(0, BTile::new(cot.batch, &c.args[0].shape, data)))
}

/// `expand_dims` and `reshape`: the same elements in row-major order, another shape.
pub(super) fn reshape(c: &Ctx<'_>) -> Result<BTile, AdError> {
    if c.args[0].numel() != c.rty.numel() {
        return Err(c.err(format!("cannot reshape {} to {}", c.tys[0], c.rty)));
    }
    let n = c.rty.numel();
    let mut out = Vec::with_capacity(c.batch * n);
    for b in 0..c.batch {
        out.extend_from_slice(c.row(0, b));
    }
    Ok(c.out(out))
}

/// The VJP of `expand_dims` and `reshape`: the cotangent reshaped back.
pub(super) fn reshape_vjp(c: &Ctx<'_>, cot: &BTile) -> BTile {
    c.unbatch(0, cot.clone())
}

/// Result element -> operand element of `permute` (result dim i is operand dim `perm[i]`).
fn permute_map(c: &Ctx<'_>, perm: &[u8]) -> Result<Vec<usize>, AdError> {
    let src = &c.tys[0].shape;
    let r = src.len();
    let mut seen = vec![false; r];
    for &p in perm {
        let p = p as usize;
        if p >= r || std::mem::replace(&mut seen[p], true) {
            return Err(c.err(format!("{perm:?} is not a permutation of the {r} dimensions of {}", c.tys[0])));
        }
    }
    let dst: Vec<usize> = perm.iter().map(|&p| src[p as usize]).collect();
    if perm.len() != r || dst.as_slice() != c.rshape() {
        return Err(c.err(format!("permuting {} by {perm:?} does not give {}", c.tys[0], c.rty)));
    }
    let sst = strides(src);
    let dst_st = strides(&dst);
    let n: usize = dst.iter().product();
    Ok((0..n).map(|flat| (0..r).map(|d| ((flat / dst_st[d]) % dst[d]) * sst[perm[d] as usize]).sum()).collect())
}

/// `permute`.
pub(super) fn permute(c: &Ctx<'_>, perm: &[u8]) -> Result<BTile, AdError> {
    Ok(gather(c, &permute_map(c, perm)?))
}

/// The VJP of `permute`: the inverse permutation (a scatter of the same index map).
pub(super) fn permute_vjp(c: &Ctx<'_>, perm: &[u8], cot: &BTile) -> Result<BTile, AdError> {
    Ok(scatter_add(c, &permute_map(c, perm)?, cot))
}
