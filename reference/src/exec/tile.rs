//! Runtime values of one program: numeric tiles and pointer tiles.
//!
//! A tile's data is shared (`Arc`) so that reshapes and carried loop values cost nothing, and a
//! broadcast is lazy: the tile keeps its source data and shape and elementwise kernels read it
//! with stride 0 along broadcast dimensions. This keeps `x * scalar` or `row[:, None] * col[None,
//! :]` at one pass over the result.

use crate::tensor::Data;
use smallvec::SmallVec;
use std::sync::Arc;
use tilegrad_ir::{DType, Shape};

/// A numeric tile (or scalar).
#[derive(Clone, Debug)]
pub(crate) struct Tile {
    pub dtype: DType,
    /// Logical shape.
    pub shape: Shape,
    pub data: Arc<Data>,
    /// When set, `data` is laid out with this shape (rank 0, or the rank of `shape` with 1s where
    /// it is broadcast) and logically broadcast to `shape`.
    pub src: Option<Shape>,
}

/// A pointer tile: a tensor slot of the launch and element offsets into it.
#[derive(Clone, Debug)]
pub(crate) struct PtrTile {
    pub slot: u32,
    /// i64 offsets, with the pointer's shape.
    pub offs: Tile,
}

/// A runtime value.
#[derive(Clone, Debug)]
pub(crate) enum RV {
    Num(Tile),
    Ptr(PtrTile),
}

/// Element strides with which to read a tile's data along each logical dimension (0 where
/// broadcast).
pub(crate) type Strides = SmallVec<[usize; 4]>;

impl Tile {
    pub fn dense(dtype: DType, shape: &[usize], data: Data) -> Tile {
        debug_assert_eq!(data.len(), shape.iter().product::<usize>());
        Tile { dtype, shape: Shape::from_slice(shape), data: Arc::new(data), src: None }
    }

    pub fn scalar(dtype: DType, data: Data) -> Tile {
        Tile::dense(dtype, &[], data)
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// True when every element is the same source element.
    pub fn is_splat(&self) -> bool {
        self.data.len() == 1
    }

    /// Strides for reading the data along the logical shape, or `None` when dense.
    pub fn strides(&self) -> Option<Strides> {
        let src = self.src.as_ref()?;
        let r = self.shape.len();
        let mut st: Strides = SmallVec::from_elem(0, r);
        if src.is_empty() {
            return Some(st);
        }
        let mut acc = 1usize;
        for d in (0..r).rev() {
            st[d] = if src[d] == 1 && self.shape[d] != 1 { 0 } else { acc };
            acc *= src[d];
        }
        Some(st)
    }

    /// The data laid out densely with the logical shape.
    pub fn materialize(&self) -> Arc<Data> {
        let Some(st) = self.strides() else { return self.data.clone() };
        let n = self.numel();
        Arc::new(match &*self.data {
            Data::I1(v) => Data::I1(expand(v, &self.shape, &st, n)),
            Data::I32(v) => Data::I32(expand(v, &self.shape, &st, n)),
            Data::I64(v) => Data::I64(expand(v, &self.shape, &st, n)),
            Data::F32(v) => Data::F32(expand(v, &self.shape, &st, n)),
            Data::F64(v) => Data::F64(expand(v, &self.shape, &st, n)),
        })
    }

    /// A lazily broadcast view with logical shape `shape`.
    pub fn broadcast(&self, shape: &[usize]) -> Tile {
        let src = match &self.src {
            Some(s) => s.clone(),
            None if self.shape.is_empty() => Shape::new(),
            None => self.shape.clone(),
        };
        let src = if self.is_splat() { Shape::new() } else { src };
        Tile { dtype: self.dtype, shape: Shape::from_slice(shape), data: self.data.clone(), src: Some(src) }
    }

    /// The same elements with another shape (row-major).
    pub fn reshape(&self, shape: &[usize]) -> Tile {
        if self.src.is_none() {
            return Tile { dtype: self.dtype, shape: Shape::from_slice(shape), data: self.data.clone(), src: None };
        }
        if self.is_splat() {
            return Tile { dtype: self.dtype, shape: Shape::from_slice(shape), data: self.data.clone(), src: Some(Shape::new()) };
        }
        Tile { dtype: self.dtype, shape: Shape::from_slice(shape), data: self.materialize(), src: None }
    }

    /// Inserts a dimension of size 1.
    pub fn expand_dims(&self, axis: usize) -> Tile {
        let mut shape = self.shape.clone();
        shape.insert(axis, 1);
        let src = self.src.as_ref().map(|s| {
            let mut s = s.clone();
            if !s.is_empty() {
                s.insert(axis, 1);
            }
            s
        });
        Tile { dtype: self.dtype, shape, data: self.data.clone(), src }
    }

    pub fn i64_scalar(&self) -> i64 {
        match &*self.data {
            Data::I1(v) => v[0] as i64,
            Data::I32(v) => v[0] as i64,
            Data::I64(v) => v[0],
            Data::F32(v) => v[0] as i64,
            Data::F64(v) => v[0] as i64,
        }
    }

    pub fn bool_scalar(&self) -> bool {
        match &*self.data {
            Data::I1(v) => v[0],
            _ => self.i64_scalar() != 0,
        }
    }
}

/// Copies strided `src` into a dense vector of `n` elements with logical `shape`.
pub(crate) fn expand<T: Copy>(src: &[T], shape: &[usize], st: &[usize], n: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(n);
    if shape.is_empty() || n == 0 {
        out.extend(std::iter::repeat_n(src[0], n));
        return out;
    }
    for_rows(shape, &[st], |bases, inner| {
        let (b, s) = (bases[0], st[st.len() - 1]);
        if s == 0 {
            out.extend(std::iter::repeat_n(src[b], inner));
        } else {
            out.extend_from_slice(&src[b..b + inner]);
        }
    });
    out
}

/// Calls `f(bases, inner_len)` for each row (last dimension) of `shape`, in row-major order, with
/// the base offset of the row in each operand (given its strides).
pub(crate) fn for_rows(shape: &[usize], strides: &[&[usize]], mut f: impl FnMut(&[usize], usize)) {
    let r = shape.len();
    let inner = shape[r - 1];
    let outer: usize = shape[..r - 1].iter().product();
    let k = strides.len();
    let mut idx: SmallVec<[usize; 4]> = SmallVec::from_elem(0, r);
    let mut bases: SmallVec<[usize; 4]> = SmallVec::from_elem(0, k);
    for _ in 0..outer {
        f(&bases, inner);
        // Increment the outer multi-index and update the bases.
        let mut d = r - 1;
        while d > 0 {
            d -= 1;
            idx[d] += 1;
            for (j, st) in strides.iter().enumerate() {
                bases[j] += st[d];
            }
            if idx[d] < shape[d] {
                break;
            }
            for (j, st) in strides.iter().enumerate() {
                bases[j] -= st[d] * shape[d];
            }
            idx[d] = 0;
        }
    }
}

/// Row-major strides of a dense shape.
pub(crate) fn dense_strides(shape: &[usize]) -> Strides {
    let mut st: Strides = SmallVec::from_elem(1, shape.len());
    for d in (0..shape.len().saturating_sub(1)).rev() {
        st[d] = st[d + 1] * shape[d + 1];
    }
    st
}

/// Elementwise map of two tiles of one logical shape.
pub(crate) fn map2<T: Copy, S: Copy, U: Copy>(a: &Tile, x: &[T], b: &Tile, y: &[S], f: impl Fn(T, S) -> U) -> Vec<U> {
    let n = a.numel();
    let (sa, sb) = (a.strides(), b.strides());
    if sa.is_none() && sb.is_none() {
        return x.iter().zip(y).map(|(&p, &q)| f(p, q)).collect();
    }
    if a.shape.is_empty() {
        return vec![f(x[0], y[0])];
    }
    if x.len() == 1 && sb.is_none() {
        let p = x[0];
        return y.iter().map(|&q| f(p, q)).collect();
    }
    if y.len() == 1 && sa.is_none() {
        let q = y[0];
        return x.iter().map(|&p| f(p, q)).collect();
    }
    let sa = sa.unwrap_or_else(|| dense_strides(&a.shape));
    let sb = sb.unwrap_or_else(|| dense_strides(&b.shape));
    let (ia, ib) = (sa[sa.len() - 1], sb[sb.len() - 1]);
    let mut out = Vec::with_capacity(n);
    for_rows(&a.shape, &[&sa, &sb], |bases, inner| {
        let (ba, bb) = (bases[0], bases[1]);
        match (ia, ib) {
            (0, 0) => out.extend(std::iter::repeat_n(f(x[ba], y[bb]), inner)),
            (0, _) => {
                let p = x[ba];
                out.extend(y[bb..bb + inner].iter().map(|&q| f(p, q)));
            }
            (_, 0) => {
                let q = y[bb];
                out.extend(x[ba..ba + inner].iter().map(|&p| f(p, q)));
            }
            _ => out.extend(x[ba..ba + inner].iter().zip(&y[bb..bb + inner]).map(|(&p, &q)| f(p, q))),
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize], v: Vec<f64>) -> Tile {
        Tile::dense(DType::F64, shape, Data::F64(v))
    }

    #[test]
    fn broadcast_row_and_column() {
        let col = t(&[2, 1], vec![1.0, 2.0]).broadcast(&[2, 3]);
        let row = t(&[1, 3], vec![10.0, 20.0, 30.0]).broadcast(&[2, 3]);
        let (Data::F64(x), Data::F64(y)) = (&*col.data, &*row.data) else { unreachable!() };
        let out = map2(&col, x, &row, y, |a, b| a + b);
        assert_eq!(out, vec![11.0, 21.0, 31.0, 12.0, 22.0, 32.0]);
        assert_eq!(*col.materialize(), Data::F64(vec![1.0, 1.0, 1.0, 2.0, 2.0, 2.0]));
    }

    #[test]
    fn broadcast_middle_dim_of_rank3() {
        let a = t(&[2, 1, 2], vec![1.0, 2.0, 3.0, 4.0]).broadcast(&[2, 3, 2]);
        assert_eq!(*a.materialize(), Data::F64(vec![1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 4.0, 3.0, 4.0]));
        let s = t(&[], vec![5.0]).broadcast(&[2, 2]).expand_dims(0);
        assert_eq!(s.shape.as_slice(), &[1, 2, 2]);
        assert_eq!(*s.materialize(), Data::F64(vec![5.0; 4]));
    }
}
