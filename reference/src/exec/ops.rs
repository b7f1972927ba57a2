//! The compute ops of the interpreter, on [`Tile`]s: elementwise maths with Triton/C semantics,
//! casts, reductions, scans, `dot` and layout changes. Each op computes in its result dtype:
//! f16/bf16 results are computed in f32 and rounded.

use super::tile::{dense_strides, for_rows, map2, Tile};
use crate::tensor::{round_bf16, round_f16, Data};
use std::sync::Arc;
use tilegrad_ir::{BinaryOp, CmpOp, DType, DotPrecision, ReduceOp, Shape, UnaryOp};

/// Rounds f32 storage to f16/bf16 when the dtype asks for it.
pub(crate) fn round_narrow(d: DType, v: &mut [f32]) {
    match d {
        DType::F16 => v.iter_mut().for_each(|x| *x = round_f16(*x)),
        DType::BF16 => v.iter_mut().for_each(|x| *x = round_bf16(*x)),
        _ => {}
    }
}

fn with_data(t: &Tile, data: Data) -> Tile {
    Tile { dtype: t.dtype, shape: t.shape.clone(), data: Arc::new(data), src: t.src.clone() }
}

fn sigmoid32(x: f32) -> f32 {
    1.0 / (1.0 + super::fastmath::exp1(-x))
}
fn sigmoid64(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Elementwise unary op. Works on the source data of a lazily broadcast tile.
pub(crate) fn unary(op: UnaryOp, x: &Tile) -> Result<Tile, String> {
    use UnaryOp::*;
    let bad = || format!("`{}` is not defined on {}", op.name(), x.dtype);
    let data = match &*x.data {
        Data::F32(v) if op == Exp => {
            let mut out = super::fastmath::exp_f32(v);
            round_narrow(x.dtype, &mut out);
            Data::F32(out)
        }
        Data::F32(v) if op == Sigmoid => {
            // 1 / (1 + e^-x), with the vectorised exp.
            let neg: Vec<f32> = v.iter().map(|&a| -a).collect();
            let mut out = super::fastmath::exp_f32(&neg);
            out.iter_mut().for_each(|e| *e = 1.0 / (1.0 + *e));
            round_narrow(x.dtype, &mut out);
            Data::F32(out)
        }
        Data::F32(v) => {
            let f: fn(f32) -> f32 = match op {
                Neg => |a| -a,
                Abs => f32::abs,
                Exp => super::fastmath::exp1,
                // Transcendentals are evaluated in f64 and rounded once: correctly rounded
                // but for values within an f64 ulp of an f32 rounding boundary, so every
                // backend (libm here, CUDA's f64 functions on a GPU) gives the same f32.
                Exp2 => |a| (a as f64).exp2() as f32,
                Log => |a| (a as f64).ln() as f32,
                Log2 => |a| (a as f64).log2() as f32,
                Sqrt => f32::sqrt,
                Rsqrt => |a| 1.0 / a.sqrt(),
                Sin => |a| (a as f64).sin() as f32,
                Cos => |a| (a as f64).cos() as f32,
                Tanh => |a| (a as f64).tanh() as f32,
                Sigmoid => sigmoid32,
                Erf => |a| libm::erf(a as f64) as f32,
                Floor => f32::floor,
                Ceil => f32::ceil,
                Not => return Err(bad()),
            };
            let mut out: Vec<f32> = v.iter().map(|&a| f(a)).collect();
            round_narrow(x.dtype, &mut out);
            Data::F32(out)
        }
        Data::F64(v) => {
            let f: fn(f64) -> f64 = match op {
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
                Sigmoid => sigmoid64,
                Erf => libm::erf,
                Floor => f64::floor,
                Ceil => f64::ceil,
                Not => return Err(bad()),
            };
            Data::F64(v.iter().map(|&a| f(a)).collect())
        }
        Data::I32(v) => Data::I32(match op {
            Neg => v.iter().map(|a| a.wrapping_neg()).collect(),
            Abs => v.iter().map(|a| a.wrapping_abs()).collect(),
            Not => v.iter().map(|a| !a).collect(),
            _ => return Err(bad()),
        }),
        Data::I64(v) => Data::I64(match op {
            Neg => v.iter().map(|a| a.wrapping_neg()).collect(),
            Abs => v.iter().map(|a| a.wrapping_abs()).collect(),
            Not => v.iter().map(|a| !a).collect(),
            _ => return Err(bad()),
        }),
        Data::I1(v) => match op {
            Not => Data::I1(v.iter().map(|a| !a).collect()),
            _ => return Err(bad()),
        },
    };
    Ok(with_data(x, data))
}

/// `umulhi`: the high half of the full product of two integers read as unsigned.
trait MulHigh {
    fn umulhi(self, other: Self) -> Self;
}

impl MulHigh for i32 {
    fn umulhi(self, other: i32) -> i32 {
        ((self as u32 as u64 * other as u32 as u64) >> 32) as u32 as i32
    }
}

impl MulHigh for i64 {
    fn umulhi(self, other: i64) -> i64 {
        ((self as u64 as u128 * other as u64 as u128) >> 64) as u64 as i64
    }
}

macro_rules! int_binary {
    ($op:expr, $a:expr, $x:expr, $b:expr, $y:expr, $t:ty) => {{
        use BinaryOp::*;
        match $op {
            Add => map2($a, $x, $b, $y, <$t>::wrapping_add),
            Sub => map2($a, $x, $b, $y, <$t>::wrapping_sub),
            Mul => map2($a, $x, $b, $y, <$t>::wrapping_mul),
            FloorDiv | Mod => {
                if $y.iter().any(|&d| d == 0) {
                    return Err("integer division by zero".to_string());
                }
                if $op == FloorDiv {
                    map2($a, $x, $b, $y, <$t>::wrapping_div)
                } else {
                    map2($a, $x, $b, $y, <$t>::wrapping_rem)
                }
            }
            Min => map2($a, $x, $b, $y, |p: $t, q: $t| p.min(q)),
            Max => map2($a, $x, $b, $y, |p: $t, q: $t| p.max(q)),
            And => map2($a, $x, $b, $y, |p: $t, q: $t| p & q),
            Or => map2($a, $x, $b, $y, |p: $t, q: $t| p | q),
            Xor => map2($a, $x, $b, $y, |p: $t, q: $t| p ^ q),
            UMulHi => map2($a, $x, $b, $y, <$t as MulHigh>::umulhi),
            Div | Pow => return Err(format!("`{}` is not defined on integers", $op.name())),
        }
    }};
}

macro_rules! float_binary {
    ($op:expr, $a:expr, $x:expr, $b:expr, $y:expr, $t:ty) => {{
        use BinaryOp::*;
        match $op {
            Add => map2($a, $x, $b, $y, |p: $t, q: $t| p + q),
            Sub => map2($a, $x, $b, $y, |p: $t, q: $t| p - q),
            Mul => map2($a, $x, $b, $y, |p: $t, q: $t| p * q),
            Div => map2($a, $x, $b, $y, |p: $t, q: $t| p / q),
            Mod => map2($a, $x, $b, $y, |p: $t, q: $t| p % q),
            Min => map2($a, $x, $b, $y, <$t as MinMaxNum>::min_num),
            Max => map2($a, $x, $b, $y, <$t as MinMaxNum>::max_num),
            Pow => map2($a, $x, $b, $y, |p: $t, q: $t| (p as f64).powf(q as f64) as $t),
            FloorDiv | And | Or | Xor | UMulHi => return Err(format!("`{}` is not defined on floats", $op.name())),
        }
    }};
}

/// A dense result with `a`'s logical shape.
fn result(a: &Tile, dtype: DType, data: Data) -> Tile {
    Tile { dtype, shape: a.shape.clone(), data: Arc::new(data), src: None }
}

/// Elementwise binary op on two tiles of one type.
pub(crate) fn binary(op: BinaryOp, a: &Tile, b: &Tile) -> Result<Tile, String> {
    let data = match (&*a.data, &*b.data) {
        (Data::F32(x), Data::F32(y)) => {
            let mut v = float_binary!(op, a, x, b, y, f32);
            round_narrow(a.dtype, &mut v);
            Data::F32(v)
        }
        (Data::F64(x), Data::F64(y)) => Data::F64(float_binary!(op, a, x, b, y, f64)),
        (Data::I32(x), Data::I32(y)) => Data::I32(int_binary!(op, a, x, b, y, i32)),
        (Data::I64(x), Data::I64(y)) => Data::I64(int_binary!(op, a, x, b, y, i64)),
        (Data::I1(x), Data::I1(y)) => Data::I1(match op {
            BinaryOp::And => map2(a, x, b, y, |p, q| p & q),
            BinaryOp::Or => map2(a, x, b, y, |p, q| p | q),
            BinaryOp::Xor => map2(a, x, b, y, |p, q| p ^ q),
            _ => return Err(format!("`{}` is not defined on i1", op.name())),
        }),
        _ => return Err(format!("operands of `{}` have different dtypes", op.name())),
    };
    Ok(result(a, a.dtype, data))
}

macro_rules! cmp_map {
    ($op:expr, $a:expr, $x:expr, $b:expr, $y:expr) => {
        match $op {
            CmpOp::Eq => map2($a, $x, $b, $y, |p, q| p == q),
            CmpOp::Ne => map2($a, $x, $b, $y, |p, q| p != q),
            CmpOp::Lt => map2($a, $x, $b, $y, |p, q| p < q),
            CmpOp::Le => map2($a, $x, $b, $y, |p, q| p <= q),
            CmpOp::Gt => map2($a, $x, $b, $y, |p, q| p > q),
            CmpOp::Ge => map2($a, $x, $b, $y, |p, q| p >= q),
        }
    };
}

/// Pointer arithmetic: offsets plus an integer tile of the same shape. A pointer fresh from a
/// parameter (offset 0) takes the index tile as it is (no copy: offsets stay i32 when the
/// indices are i32); otherwise the sum is computed in i64.
pub(crate) fn add_offsets(base: &Tile, delta: &Tile) -> Tile {
    let zero_base = base.is_splat() && base.i64_scalar() == 0;
    if zero_base {
        return Tile { dtype: delta.dtype, shape: base.shape.clone(), data: delta.data.clone(), src: delta.src.clone() };
    }
    let v: Vec<i64> = match (&*base.data, &*delta.data) {
        (Data::I64(b), Data::I32(d)) => map2(base, b, delta, d.as_slice(), |x, y| x.wrapping_add(y as i64)),
        (Data::I64(b), Data::I64(d)) => map2(base, b, delta, d.as_slice(), |x, y| x.wrapping_add(y)),
        (Data::I32(b), Data::I32(d)) => map2(base, b, delta, d.as_slice(), |x, y| (x as i64).wrapping_add(y as i64)),
        (Data::I32(b), Data::I64(d)) => map2(base, b, delta, d.as_slice(), |x, y| (x as i64).wrapping_add(y)),
        _ => unreachable!("pointer offsets and deltas are integers"),
    };
    result(base, DType::I64, Data::I64(v))
}

/// Elementwise comparison.
pub(crate) fn cmp(op: CmpOp, a: &Tile, b: &Tile) -> Result<Tile, String> {
    let v = match (&*a.data, &*b.data) {
        (Data::F32(x), Data::F32(y)) => cmp_map!(op, a, x, b, y),
        (Data::F64(x), Data::F64(y)) => cmp_map!(op, a, x, b, y),
        (Data::I32(x), Data::I32(y)) => cmp_map!(op, a, x, b, y),
        (Data::I64(x), Data::I64(y)) => cmp_map!(op, a, x, b, y),
        (Data::I1(x), Data::I1(y)) => cmp_map!(op, a, x, b, y),
        _ => return Err("operands of `cmp` have different dtypes".into()),
    };
    Ok(result(a, DType::I1, Data::I1(v)))
}

/// Converts data to dtype `to` (C/Triton conversions: float to int truncates and saturates,
/// NaN to 0; int to bool is `!= 0`).
pub(crate) fn cast_data(data: &Data, to: DType) -> Data {
    macro_rules! conv {
        ($v:expr, $f:expr) => {
            $v.iter().map($f).collect()
        };
    }
    match to {
        DType::I1 => Data::I1(match data {
            Data::I1(v) => v.clone(),
            Data::I32(v) => conv!(v, |&x| x != 0),
            Data::I64(v) => conv!(v, |&x| x != 0),
            Data::F32(v) => conv!(v, |&x| x != 0.0),
            Data::F64(v) => conv!(v, |&x| x != 0.0),
        }),
        DType::I32 => Data::I32(match data {
            Data::I1(v) => conv!(v, |&x| x as i32),
            Data::I32(v) => v.clone(),
            Data::I64(v) => conv!(v, |&x| x as i32),
            Data::F32(v) => conv!(v, |&x| x as i32),
            Data::F64(v) => conv!(v, |&x| x as i32),
        }),
        DType::I64 => Data::I64(match data {
            Data::I1(v) => conv!(v, |&x| x as i64),
            Data::I32(v) => conv!(v, |&x| x as i64),
            Data::I64(v) => v.clone(),
            Data::F32(v) => conv!(v, |&x| x as i64),
            Data::F64(v) => conv!(v, |&x| x as i64),
        }),
        DType::F16 | DType::BF16 | DType::F32 => {
            let narrow = |x: f64| match to {
                DType::F16 => half::f16::from_f64(x).to_f32(),
                DType::BF16 => half::bf16::from_f64(x).to_f32(),
                _ => x as f32,
            };
            let mut v: Vec<f32> = match data {
                Data::I1(v) => conv!(v, |&x| x as i32 as f32),
                Data::I32(v) => conv!(v, |&x| narrow(x as f64)),
                Data::I64(v) => match to {
                    DType::F32 => conv!(v, |&x| x as f32),
                    _ => conv!(v, |&x| narrow(x as f64)),
                },
                Data::F32(v) => v.clone(),
                Data::F64(v) => conv!(v, |&x| narrow(x)),
            };
            if matches!(data, Data::F32(_)) {
                round_narrow(to, &mut v);
            }
            Data::F32(v)
        }
        DType::F64 => Data::F64(match data {
            Data::I1(v) => conv!(v, |&x| x as i32 as f64),
            Data::I32(v) => conv!(v, |&x| x as f64),
            Data::I64(v) => conv!(v, |&x| x as f64),
            Data::F32(v) => conv!(v, |&x| x as f64),
            Data::F64(v) => v.clone(),
        }),
    }
}

/// Cast (on the source data of a lazily broadcast tile).
pub(crate) fn cast(x: &Tile, to: DType) -> Tile {
    Tile { dtype: to, shape: x.shape.clone(), data: Arc::new(cast_data(&x.data, to)), src: x.src.clone() }
}

/// `where(c, a, b)`.
pub(crate) fn select(c: &Tile, a: &Tile, b: &Tile) -> Result<Tile, String> {
    let cd = c.materialize();
    let Data::I1(m) = &*cd else { return Err("condition is not i1".into()) };
    let (ad, bd) = (a.materialize(), b.materialize());
    macro_rules! sel {
        ($x:expr, $y:expr) => {
            m.iter().zip($x.iter().zip($y.iter())).map(|(&k, (&p, &q))| if k { p } else { q }).collect()
        };
    }
    let data = match (&*ad, &*bd) {
        (Data::F32(x), Data::F32(y)) => Data::F32(sel!(x, y)),
        (Data::F64(x), Data::F64(y)) => Data::F64(sel!(x, y)),
        (Data::I32(x), Data::I32(y)) => Data::I32(sel!(x, y)),
        (Data::I64(x), Data::I64(y)) => Data::I64(sel!(x, y)),
        (Data::I1(x), Data::I1(y)) => Data::I1(sel!(x, y)),
        _ => return Err("branches of `where` have different dtypes".into()),
    };
    Ok(Tile::dense(a.dtype, &a.shape, data))
}

/// Splits a shape at `axis` into (outer, n, inner).
fn split(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (shape[..axis].iter().product(), shape[axis], shape[axis + 1..].iter().product())
}

/// Interleaved accumulators of a sum (see `sum_run`).
pub const SUM_LANES: usize = 64;

/// Sum of a contiguous run, in the order every backend uses: [`SUM_LANES`] interleaved
/// accumulators from 0 (accumulator j adds elements j, j + 64, ... of the whole chunks), folded
/// pairwise (accumulator j takes j + w for w = 32, 16, ..., 1, as a warp's shuffle tree does),
/// then the remainder in order. Vectorisable on a CPU, parallel on a GPU, deterministic on both.
/// `plus` is the addition (wrapping for integers).
pub fn sum_in_order<T: Copy + Default>(v: &[T], plus: impl Fn(T, T) -> T) -> T {
    let mut acc = [T::default(); SUM_LANES];
    let chunks = v.chunks_exact(SUM_LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..SUM_LANES {
            acc[j] = plus(acc[j], c[j]);
        }
    }
    let mut w = SUM_LANES / 2;
    while w >= 1 {
        for j in 0..w {
            acc[j] = plus(acc[j], acc[j + w]);
        }
        w /= 2;
    }
    let mut s = acc[0];
    for &x in rest {
        s = plus(s, x);
    }
    s
}

fn sum_run<T: Reducible>(v: &[T]) -> T {
    sum_in_order(v, T::plus)
}

/// Element types of reductions: addition wraps for integers (Triton/C semantics).
trait Reducible: Copy + Default + PartialOrd {
    fn plus(a: Self, b: Self) -> Self;
    fn max2(a: Self, b: Self) -> Self;
    fn min2(a: Self, b: Self) -> Self;
}
macro_rules! reducible {
    ($($t:ty => $plus:expr, $max:expr, $min:expr);*) => {$(
        impl Reducible for $t {
            fn plus(a: $t, b: $t) -> $t {
                $plus(a, b)
            }
            fn max2(a: $t, b: $t) -> $t {
                $max(a, b)
            }
            fn min2(a: $t, b: $t) -> $t {
                $min(a, b)
            }
        }
    )*};
}
reducible!(
    f32 => |a, b| a + b, f32::max_num, f32::min_num;
    f64 => |a, b| a + b, f64::max_num, f64::min_num;
    i32 => i32::wrapping_add, i32::max, i32::min;
    i64 => i64::wrapping_add, i64::max, i64::min
);

/// Float max and min as IEEE 754-2019 `maximumNumber` and `minimumNumber`, the rule of a GPU's
/// `max.f32`: a NaN operand gives the other (two NaNs: the second), and -0 < +0. Written out
/// because Rust's `f32::max` orders signed zeros only from some toolchains on (an older one
/// kept either), and the reference's results must not depend on the compiler.
pub(crate) trait MinMaxNum: Copy {
    fn max_num(self, b: Self) -> Self;
    fn min_num(self, b: Self) -> Self;
}
macro_rules! min_max_num {
    ($($t:ty),*) => {$(
        impl MinMaxNum for $t {
            fn max_num(self, b: $t) -> $t {
                match (self.is_nan(), b.is_nan()) {
                    (true, _) => b,
                    (_, true) => self,
                    _ if b > self || (b == self && self.is_sign_negative()) => b,
                    _ => self,
                }
            }
            fn min_num(self, b: $t) -> $t {
                match (self.is_nan(), b.is_nan()) {
                    (true, _) => b,
                    (_, true) => self,
                    _ if b < self || (b == self && b.is_sign_negative()) => b,
                    _ => self,
                }
            }
        }
    )*};
}
min_max_num!(f32, f64);

/// Reduces `v` laid out as [outer, n, inner] along the middle; arg-reductions return i32 indices
/// (first index among ties; NaN is never selected unless every element is NaN).
fn reduce_typed<T: Reducible>(kind: ReduceOp, v: &[T], outer: usize, n: usize, inner: usize) -> Result<Vec<T>, Vec<i32>> {
    match kind {
        ReduceOp::Sum if inner == 1 => Ok((0..outer).map(|o| sum_run(&v[o * n..(o + 1) * n])).collect()),
        ReduceOp::Max if inner == 1 => {
            Ok((0..outer).map(|o| v[o * n..(o + 1) * n].iter().copied().reduce(T::max2).expect("n > 0")).collect())
        }
        ReduceOp::Min if inner == 1 => {
            Ok((0..outer).map(|o| v[o * n..(o + 1) * n].iter().copied().reduce(T::min2).expect("n > 0")).collect())
        }
        ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min => {
            let mut out = Vec::with_capacity(outer * inner);
            for o in 0..outer {
                let base = o * n * inner;
                let mut acc: Vec<T> = v[base..base + inner].to_vec();
                for k in 1..n {
                    let row = &v[base + k * inner..base + (k + 1) * inner];
                    match kind {
                        ReduceOp::Sum => acc.iter_mut().zip(row).for_each(|(a, &b)| *a = T::plus(*a, b)),
                        ReduceOp::Max => acc.iter_mut().zip(row).for_each(|(a, &b)| *a = T::max2(*a, b)),
                        _ => acc.iter_mut().zip(row).for_each(|(a, &b)| *a = T::min2(*a, b)),
                    }
                }
                out.extend(acc);
            }
            Ok(out)
        }
        ReduceOp::Argmax | ReduceOp::Argmin => {
            let mut out = Vec::with_capacity(outer * inner);
            for o in 0..outer {
                for i in 0..inner {
                    let at = |k: usize| v[(o * n + k) * inner + i];
                    let mut best = 0usize;
                    #[allow(clippy::eq_op)]
                    for k in 1..n {
                        let (x, b) = (at(k), at(best));
                        let b_is_nan = b != b;
                        let better = if kind == ReduceOp::Argmax { x > b } else { x < b };
                        if better || (b_is_nan && x == x) {
                            best = k;
                        }
                    }
                    out.push(best as i32);
                }
            }
            Err(out)
        }
    }
}

/// `reduce` along `axis`; the result shape is given by the caller.
pub(crate) fn reduce(kind: ReduceOp, x: &Tile, axis: usize, out_dtype: DType, out_shape: &[usize]) -> Result<Tile, String> {
    let d = x.materialize();
    let (outer, n, inner) = split(&x.shape, axis);
    macro_rules! go {
        ($v:expr, $var:ident) => {
            match reduce_typed(kind, $v, outer, n, inner) {
                Ok(r) => Data::$var(r),
                Err(idx) => Data::I32(idx),
            }
        };
    }
    let data = match &*d {
        Data::F32(v) => match go!(v, F32) {
            Data::F32(mut r) => {
                round_narrow(out_dtype, &mut r);
                Data::F32(r)
            }
            other => other,
        },
        Data::F64(v) => go!(v, F64),
        Data::I32(v) => go!(v, I32),
        Data::I64(v) => go!(v, I64),
        Data::I1(_) => return Err("cannot reduce i1".into()),
    };
    Ok(Tile::dense(out_dtype, out_shape, data))
}

/// Inclusive prefix sum along `axis`.
pub(crate) fn cumsum(x: &Tile, axis: usize, reverse: bool) -> Result<Tile, String> {
    let d = x.materialize();
    let (outer, n, inner) = split(&x.shape, axis);
    fn scan<T: Copy + std::ops::Add<Output = T>>(v: &[T], outer: usize, n: usize, inner: usize, reverse: bool) -> Vec<T> {
        let mut out = v.to_vec();
        for o in 0..outer {
            for i in 0..inner {
                let idx = |k: usize| (o * n + k) * inner + i;
                for s in 1..n {
                    let (k, prev) = if reverse { (n - 1 - s, n - s) } else { (s, s - 1) };
                    out[idx(k)] = out[idx(prev)] + out[idx(k)];
                }
            }
        }
        out
    }
    let data = match &*d {
        Data::F32(v) => {
            let mut r = scan(v, outer, n, inner, reverse);
            if matches!(x.dtype, DType::F16 | DType::BF16) {
                // Round after every step, as a scan in the narrow dtype would.
                r = v.to_vec();
                for o in 0..outer {
                    for i in 0..inner {
                        let idx = |k: usize| (o * n + k) * inner + i;
                        for s in 1..n {
                            let (k, prev) = if reverse { (n - 1 - s, n - s) } else { (s, s - 1) };
                            let mut t = [r[idx(prev)] + r[idx(k)]];
                            round_narrow(x.dtype, &mut t);
                            r[idx(k)] = t[0];
                        }
                    }
                }
            }
            Data::F32(r)
        }
        Data::F64(v) => Data::F64(scan(v, outer, n, inner, reverse)),
        Data::I32(v) => Data::I32(
            scan(&v.iter().map(|&x| std::num::Wrapping(x)).collect::<Vec<_>>(), outer, n, inner, reverse).iter().map(|w| w.0).collect(),
        ),
        Data::I64(v) => Data::I64(
            scan(&v.iter().map(|&x| std::num::Wrapping(x)).collect::<Vec<_>>(), outer, n, inner, reverse).iter().map(|w| w.0).collect(),
        ),
        Data::I1(_) => return Err("cannot scan i1".into()),
    };
    Ok(Tile::dense(x.dtype, &x.shape, data))
}

/// Rounds an f32 to tf32 (10 explicit mantissa bits, round to nearest even), as tensor cores
/// read f32 operands by default.
pub fn round_tf32(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    let b = x.to_bits();
    let lsb = (b >> 13) & 1;
    let r = b.wrapping_add(0x0fff + lsb) & !0x1fff;
    f32::from_bits(r)
}

/// The f32 accumulation of `dot`: `out[i, j] = fma(a[i, k], b[k, j], out[i, j])` for k in
/// order, each step one fused multiply-add (rounded once), as Triton lowers an f32 `dot` that
/// runs on FMA units (`input_precision="ieee"`: a chain of `llvm.fmuladd` over k, which NVPTX
/// emits as `fma.rn.f32`). Where the operands have at most 12 significant bits (tf32, f16,
/// bf16), each product is exact and this equals a product and a sum rounded apart. Every
/// backend computes an f32 `dot` this way: hardware FMA where the CPU has it (checked at run
/// time), else the correctly rounded software `mul_add`, with the same result.
pub fn dot_f32(out: &mut [f32], a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize)) {
    #[inline(always)]
    fn rows(out: &mut [f32], a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize)) {
        for i in 0..m {
            let row = &mut out[i * n..(i + 1) * n];
            for kk in 0..k {
                let x = a[i * k + kk];
                let brow = &b[kk * n..(kk + 1) * n];
                row.iter_mut().zip(brow).for_each(|(o, &y)| *o = x.mul_add(y, *o));
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn rows_fma(out: &mut [f32], a: &[f32], b: &[f32], dims: (usize, usize, usize)) {
        rows(out, a, b, dims)
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports AVX2 and FMA (checked above).
        return unsafe { rows_fma(out, a, b, (m, k, n)) };
    }
    rows(out, a, b, (m, k, n))
}

/// `dot(a, b, acc)`: [M,K] x [K,N] + [M,N], accumulated over k in order, in acc's dtype (f32
/// accumulation by [`dot_f32`]; f64 products and sums rounded apart).
pub(crate) fn dot(a: &Tile, b: &Tile, acc: &Tile, precision: DotPrecision) -> Result<Tile, String> {
    let (m, k, n) = (a.shape[0], a.shape[1], b.shape[1]);
    let (ad, bd, cd) = (a.materialize(), b.materialize(), acc.materialize());
    // Operands are converted to the accumulator's arithmetic (f32 for f16/bf16/f32, else f64).
    let data = match &*cd {
        Data::F32(c) => {
            let mut av = match &*ad {
                Data::F32(v) => v.clone(),
                other => match cast_data(other, DType::F32) {
                    Data::F32(v) => v,
                    _ => unreachable!("cast to f32 yields f32 storage"),
                },
            };
            let mut bv = match &*bd {
                Data::F32(v) => v.clone(),
                other => match cast_data(other, DType::F32) {
                    Data::F32(v) => v,
                    _ => unreachable!("cast to f32 yields f32 storage"),
                },
            };
            if precision == DotPrecision::Tf32 && a.dtype == DType::F32 {
                av.iter_mut().for_each(|x| *x = round_tf32(*x));
                bv.iter_mut().for_each(|x| *x = round_tf32(*x));
            }
            let mut out = c.clone();
            dot_f32(&mut out, &av, &bv, (m, k, n));
            round_narrow(acc.dtype, &mut out);
            Data::F32(out)
        }
        Data::F64(c) => {
            let to64 = |d: &Data| match cast_data(d, DType::F64) {
                Data::F64(v) => v,
                _ => unreachable!("cast to f64 yields f64 storage"),
            };
            let (av, bv) = (to64(&ad), to64(&bd));
            let mut out = c.clone();
            for i in 0..m {
                let row = &mut out[i * n..(i + 1) * n];
                for kk in 0..k {
                    let x = av[i * k + kk];
                    let brow = &bv[kk * n..(kk + 1) * n];
                    row.iter_mut().zip(brow).for_each(|(o, &y)| *o += x * y);
                }
            }
            Data::F64(out)
        }
        _ => return Err("dot accumulates in floats only".into()),
    };
    Ok(Tile::dense(acc.dtype, &acc.shape, data))
}

/// Permutes dimensions: result dim i is input dim `perm[i]`.
pub(crate) fn permute(x: &Tile, perm: &[u8]) -> Tile {
    let shape: Shape = perm.iter().map(|&p| x.shape[p as usize]).collect();
    if x.is_splat() {
        return x.reshape(&shape);
    }
    let d = x.materialize();
    let in_st = dense_strides(&x.shape);
    let st: Vec<usize> = perm.iter().map(|&p| in_st[p as usize]).collect();
    fn gather<T: Copy>(v: &[T], shape: &[usize], st: &[usize]) -> Vec<T> {
        let mut out = Vec::with_capacity(v.len());
        let inner_st = st[st.len() - 1];
        for_rows(shape, &[st], |bases, inner| {
            out.extend((0..inner).map(|j| v[bases[0] + j * inner_st]));
        });
        out
    }
    let data = match &*d {
        Data::I1(v) => Data::I1(gather(v, &shape, &st)),
        Data::I32(v) => Data::I32(gather(v, &shape, &st)),
        Data::I64(v) => Data::I64(gather(v, &shape, &st)),
        Data::F32(v) => Data::F32(gather(v, &shape, &st)),
        Data::F64(v) => Data::F64(gather(v, &shape, &st)),
    };
    Tile::dense(x.dtype, &shape, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Max and min order signed zeros and ignore a NaN operand, in either operand order, and
    /// keep the second of two NaNs (its payload), in f32 and f64 alike; reductions fold with them.
    #[test]
    fn max_and_min_order_signed_zeros_and_ignore_nans() {
        for (a, b) in [(0.0f64, -0.0f64), (-0.0, 0.0)] {
            assert_eq!(a.max_num(b).to_bits(), 0.0f64.to_bits(), "max({a:?}, {b:?})");
            assert_eq!(a.min_num(b).to_bits(), (-0.0f64).to_bits(), "min({a:?}, {b:?})");
            let (x, y) = (a as f32, b as f32);
            assert_eq!(x.max_num(y).to_bits(), 0.0f32.to_bits());
            assert_eq!(x.min_num(y).to_bits(), (-0.0f32).to_bits());
        }
        let (p, q) = (f64::from_bits(0x7ff8_0000_0000_0001), f64::from_bits(0x7ff8_0000_0000_0002));
        assert_eq!(p.max_num(q).to_bits(), q.to_bits());
        assert_eq!(q.min_num(p).to_bits(), p.to_bits());
        assert_eq!(p.max_num(-3.5), -3.5);
        assert_eq!(2.5f64.min_num(q), 2.5);
        assert_eq!(1.5f32.max_num(-7.0), 1.5);
        assert_eq!(1.5f32.min_num(-7.0), -7.0);
        let row = [-1.0f32, -0.0, -2.0, 0.0, -0.0, f32::NAN];
        let folded = row.iter().copied().reduce(<f32 as Reducible>::max2).unwrap();
        assert_eq!(folded.to_bits(), 0.0f32.to_bits());
        let folded = [0.0f32, 3.0, -0.0, 1.0].into_iter().reduce(<f32 as Reducible>::min2).unwrap();
        assert_eq!(folded.to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn tf32_rounding_keeps_ten_bits() {
        let x = 1.0f32 + f32::EPSILON * 3.0; // below tf32 resolution
        assert_eq!(round_tf32(x), 1.0);
        let y = 1.0f32 + 1.0 / 1024.0; // exactly representable in tf32
        assert_eq!(round_tf32(y), y);
        // Halfway case rounds to even.
        let h = f32::from_bits(1.0f32.to_bits() | 0x1000);
        assert_eq!(round_tf32(h), 1.0);
    }

    #[test]
    fn f32_dots_round_once_a_step() {
        // Each step is a fused multiply-add: the exact a*b (an f64 holds the product of two
        // f32s) plus the sum so far, rounded once to f32. Rounding the f64 sum again to f32 is
        // that rounding except on f32 midpoints, which random data does not hit.
        let (m, k, n) = (5, 37, 7);
        let mut seed = 0x9e3779b97f4a7c15u64;
        let mut draw = |len: usize| -> Vec<f32> {
            (0..len)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
                })
                .collect()
        };
        let (a, b, c) = (draw(m * k), draw(k * n), draw(m * n));
        let t = |shape: &[usize], v: &[f32]| Tile::dense(DType::F32, shape, Data::F32(v.to_vec()));
        let got = dot(&t(&[m, k], &a), &t(&[k, n], &b), &t(&[m, n], &c), DotPrecision::Ieee).unwrap();
        let Data::F32(got) = &*got.data else { panic!("f32 result") };
        let (mut fused, mut apart) = (c.clone(), c.clone());
        for i in 0..m {
            for j in 0..n {
                for q in 0..k {
                    let (x, y) = (a[i * k + q], b[q * n + j]);
                    fused[i * n + j] = (x as f64 * y as f64 + fused[i * n + j] as f64) as f32;
                    apart[i * n + j] += x * y;
                }
            }
        }
        assert_eq!(got, &fused);
        // Rounding products apart gives other results: the test tells the two apart.
        assert!(got.iter().zip(&apart).any(|(g, a)| g != a));
        // tf32 operands multiply exactly: the same sums as products and sums rounded apart.
        let got = dot(&t(&[m, k], &a), &t(&[k, n], &b), &t(&[m, n], &c), DotPrecision::Tf32).unwrap();
        let mut apart = c.clone();
        for i in 0..m {
            for j in 0..n {
                for q in 0..k {
                    apart[i * n + j] += round_tf32(a[i * k + q]) * round_tf32(b[q * n + j]);
                }
            }
        }
        assert_eq!(*got.data, Data::F32(apart));
    }

    #[test]
    fn integer_semantics_truncate_toward_zero() {
        let a = Tile::dense(DType::I32, &[4], Data::I32(vec![-7, 7, -7, i32::MIN]));
        let b = Tile::dense(DType::I32, &[4], Data::I32(vec![2, -2, -2, -1]));
        let q = binary(BinaryOp::FloorDiv, &a, &b).unwrap();
        assert_eq!(*q.data, Data::I32(vec![-3, -3, 3, i32::MIN]));
        let r = binary(BinaryOp::Mod, &a, &b).unwrap();
        assert_eq!(*r.data, Data::I32(vec![-1, 1, -1, 0]));
        let z = Tile::dense(DType::I32, &[4], Data::I32(vec![1, 0, 1, 1]));
        assert!(binary(BinaryOp::FloorDiv, &a, &z).is_err());
        let big = Tile::dense(DType::I32, &[1], Data::I32(vec![i32::MAX]));
        let one = Tile::dense(DType::I32, &[1], Data::I32(vec![1]));
        assert_eq!(*binary(BinaryOp::Add, &big, &one).unwrap().data, Data::I32(vec![i32::MIN]));
    }

    #[test]
    fn umulhi_reads_operands_as_unsigned() {
        let a = Tile::dense(DType::I32, &[4], Data::I32(vec![-1, 3, i32::MIN, 0x1234_5678]));
        let b = Tile::dense(DType::I32, &[4], Data::I32(vec![-1, 5, -2, 0x10]));
        // 0xFFFFFFFF^2 = 0xFFFFFFFE_00000001; 2^31 * 0xFFFFFFFE = 0x7FFFFFFF_00000000.
        let h = binary(BinaryOp::UMulHi, &a, &b).unwrap();
        assert_eq!(*h.data, Data::I32(vec![-2, 0, i32::MAX, 1]));
        let a = Tile::dense(DType::I64, &[2], Data::I64(vec![-1, 1 << 40]));
        let b = Tile::dense(DType::I64, &[2], Data::I64(vec![-1, 1 << 30]));
        assert_eq!(*binary(BinaryOp::UMulHi, &a, &b).unwrap().data, Data::I64(vec![-2, 1 << 6]));
        let f = Tile::dense(DType::F32, &[1], Data::F32(vec![1.0]));
        assert!(binary(BinaryOp::UMulHi, &f, &f).is_err());
    }

    #[test]
    fn argmax_takes_first_of_ties_and_reduces_axes() {
        let x = Tile::dense(DType::F32, &[2, 3], Data::F32(vec![1.0, 5.0, 5.0, 2.0, 0.0, 2.0]));
        let am = reduce(ReduceOp::Argmax, &x, 1, DType::I32, &[2]).unwrap();
        assert_eq!(*am.data, Data::I32(vec![1, 0]));
        let s0 = reduce(ReduceOp::Sum, &x, 0, DType::F32, &[3]).unwrap();
        // Integer sums wrap (no panic in debug builds).
        let big = Tile::dense(DType::I32, &[2, 9], Data::I32(vec![i32::MAX; 18]));
        let w = reduce(ReduceOp::Sum, &big, 1, DType::I32, &[2]).unwrap();
        assert_eq!(*w.data, Data::I32(vec![i32::MAX.wrapping_mul(9); 2]));
        let w0 = reduce(ReduceOp::Sum, &big, 0, DType::I32, &[9]).unwrap();
        assert_eq!(*w0.data, Data::I32(vec![i32::MAX.wrapping_mul(2); 9]));
        assert_eq!(*s0.data, Data::F32(vec![3.0, 5.0, 7.0]));
        let mn = reduce(ReduceOp::Min, &x, 1, DType::F32, &[2]).unwrap();
        assert_eq!(*mn.data, Data::F32(vec![1.0, 0.0]));
    }

    #[test]
    fn cumsum_and_permute() {
        let x = Tile::dense(DType::I32, &[2, 3], Data::I32(vec![1, 2, 3, 4, 5, 6]));
        assert_eq!(*cumsum(&x, 1, false).unwrap().data, Data::I32(vec![1, 3, 6, 4, 9, 15]));
        assert_eq!(*cumsum(&x, 0, true).unwrap().data, Data::I32(vec![5, 7, 9, 4, 5, 6]));
        let t = permute(&x, &[1, 0]);
        assert_eq!(t.shape.as_slice(), &[3, 2]);
        assert_eq!(*t.data, Data::I32(vec![1, 4, 2, 5, 3, 6]));
    }

    #[test]
    fn f16_arithmetic_rounds() {
        let a = Tile::dense(DType::F16, &[1], Data::F32(vec![1.0]));
        let b = Tile::dense(DType::F16, &[1], Data::F32(vec![1e-4]));
        // 1 + 1e-4 is not representable in f16 (spacing near 1 is ~9.8e-4).
        assert_eq!(*binary(BinaryOp::Add, &a, &b).unwrap().data, Data::F32(vec![1.0]));
    }
}
