//! The inputs of a check: named constants for size expressions, and named tensors, given or drawn
//! from a seeded distribution (the same seed gives the same tensors on every machine).

use super::expr::Scalar;
use super::steps::Env;
use super::CheckError;
use tilegrad_ir::DType;
use tilegrad_reference::{Data, HostTensor};

/// A distribution of random input elements (rounded to the tensor's dtype).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Dist {
    /// Normal with this mean and standard deviation.
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        std: f64,
    },
    /// Uniform on `[lo, hi)`.
    Uniform {
        /// Lower bound.
        lo: f64,
        /// Upper bound.
        hi: f64,
    },
    /// Integers uniform on `[lo, hi)` (for index tensors, or small integer-valued floats).
    RandInt {
        /// Lower bound.
        lo: i64,
        /// Upper bound (exclusive).
        hi: i64,
    },
    /// Every element this value.
    Constant(f64),
    /// Every element this integer (exact for i64 tensors, where an f64 would round).
    ConstInt(i64),
    /// `start, start + step, ...` in row-major order (positions, labels, ramps).
    Arange {
        /// The first element.
        start: f64,
        /// The difference between consecutive elements.
        step: f64,
    },
    /// `arange(start, step) % modulus`: repeating ramps (e.g. labels cycling through classes).
    ArangeMod {
        /// The first element.
        start: f64,
        /// The difference between consecutive elements.
        step: f64,
        /// Every element is taken modulo this (floored, as Python's `%`).
        modulus: f64,
    },
}

impl Default for Dist {
    /// Standard normal.
    fn default() -> Dist {
        Dist::Normal { mean: 0.0, std: 1.0 }
    }
}

/// Where an input tensor's contents come from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// These contents.
    Given(HostTensor),
    /// Drawn from a distribution.
    Random {
        /// Dtype.
        dtype: DType,
        /// Shape.
        shape: Vec<usize>,
        /// Distribution.
        dist: Dist,
    },
    /// Consecutive slices along one axis, each drawn from its own distribution (e.g. the last
    /// rows of a label tensor set to `ignore_index`, or a block of large values among small ones).
    Slices {
        /// Dtype.
        dtype: DType,
        /// Shape.
        shape: Vec<usize>,
        /// The axis the slices split.
        axis: usize,
        /// Each slice's extent along `axis` (they add up to `shape[axis]`) and distribution.
        parts: Vec<(usize, Dist)>,
    },
}

/// A named input tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct InputTensor {
    /// Name, as steps refer to it.
    pub name: String,
    /// Contents.
    pub source: Source,
}

/// Constants and input tensors.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Inputs {
    /// Named constants (sizes, scalars) for expressions.
    pub constants: Vec<(String, Scalar)>,
    /// Input tensors.
    pub tensors: Vec<InputTensor>,
}

impl Inputs {
    /// No inputs.
    pub fn new() -> Inputs {
        Inputs::default()
    }

    /// Adds an integer constant.
    pub fn constant_int(mut self, name: &str, v: i64) -> Inputs {
        self.constants.push((name.into(), Scalar::Int(v)));
        self
    }

    /// Adds a float constant.
    pub fn constant_float(mut self, name: &str, v: f64) -> Inputs {
        self.constants.push((name.into(), Scalar::Float(v)));
        self
    }

    /// Adds a given tensor.
    pub fn given(mut self, name: &str, t: HostTensor) -> Inputs {
        self.tensors.push(InputTensor { name: name.into(), source: Source::Given(t) });
        self
    }

    /// Adds a random tensor.
    pub fn random(mut self, name: &str, dtype: DType, shape: &[usize], dist: Dist) -> Inputs {
        self.tensors.push(InputTensor { name: name.into(), source: Source::Random { dtype, shape: shape.to_vec(), dist } });
        self
    }

    /// The random inputs together fit the memory the process can take (each alone is checked
    /// as it is drawn): refused up front, with the sizes, rather than failing an allocation half
    /// way through.
    fn check_planned_memory(&self) -> Result<(), CheckError> {
        let mut total = 0u128;
        let mut sizes = Vec::new();
        for it in &self.tensors {
            if let Source::Random { dtype, shape, .. } | Source::Slices { dtype, shape, .. } = &it.source {
                let n = tilegrad_reference::checked_numel(shape).map_err(|m| CheckError::Spec(format!("input `{}`: {m}", it.name)))?;
                let bytes = n as u128 * tilegrad_reference::storage_bytes(*dtype) as u128;
                total += bytes;
                sizes.push(format!("`{}` {}", it.name, tilegrad_reference::human_bytes(bytes)));
            }
        }
        match tilegrad_reference::available_memory() {
            Some(avail) if sizes.len() > 1 && total > u128::from(avail) => Err(CheckError::Spec(format!(
                "the inputs need {} of memory together ({}); {} is available to this process",
                tilegrad_reference::human_bytes(total),
                sizes.join(", "),
                tilegrad_reference::human_bytes(avail.into())
            ))),
            _ => Ok(()),
        }
    }

    /// The environment of the check: constants and tensors, random ones drawn from `seed` (each
    /// tensor from its own stream, so adding a tensor does not change the others).
    pub(crate) fn materialise(&self, seed: u64) -> Result<Env, CheckError> {
        let mut env = Env::default();
        for (i, (n, v)) in self.constants.iter().enumerate() {
            if self.constants[..i].iter().any(|(m, _)| m == n) {
                return Err(CheckError::Spec(format!("constant `{n}` is defined twice")));
            }
            env.constants.push((n.clone(), *v));
        }
        self.check_planned_memory()?;
        for (i, it) in self.tensors.iter().enumerate() {
            if env.constants.iter().any(|(c, _)| *c == it.name) {
                return Err(CheckError::Spec(format!("`{}` is both a constant and a tensor", it.name)));
            }
            env.add(&it.name, self.tensor_at(i, seed)?).map_err(CheckError::Spec)?;
        }
        Ok(env)
    }

    /// Input tensor `i` of a check of `seed`, as [`Inputs::materialise`] makes it.
    pub(crate) fn tensor_at(&self, i: usize, seed: u64) -> Result<HostTensor, CheckError> {
        let it = &self.tensors[i];
        match &it.source {
            Source::Given(t) => Ok(t.clone()),
            Source::Random { dtype, shape, dist } => draw(*dtype, shape, *dist, &mut input_keys(seed, i)),
            Source::Slices { dtype, shape, axis, parts } => draw_slices(*dtype, shape, *axis, parts, &mut input_keys(seed, i)),
        }
        .map_err(|m| CheckError::Spec(format!("input `{}`: {m}", it.name)))
    }

    /// Where input tensor `i` is drawn in a float dtype from a normal or a uniform distribution
    /// (the device's draws), the key and the distribution that draw it as
    /// [`Inputs::materialise`] does (element `j` is [`value_at`]`(dist, key, j)`, rounded to the
    /// dtype: f16 and bf16 through f32).
    pub(crate) fn device_draw(&self, i: usize, seed: u64) -> Option<(u64, Dist)> {
        match self.tensors[i].source {
            Source::Random {
                dtype: DType::F16 | DType::BF16 | DType::F32 | DType::F64,
                dist: d @ (Dist::Normal { .. } | Dist::Uniform { .. }),
                ..
            } if nonempty(&d) => Some((input_keys(seed, i).next_key(), d)),
            _ => None,
        }
    }

    /// The error [`Inputs::materialise`] gives before drawing, if any (a constant defined
    /// twice, a name both a constant and a tensor, a plan too large for memory).
    pub(crate) fn check_names(&self) -> Result<(), CheckError> {
        for (i, (n, _)) in self.constants.iter().enumerate() {
            if self.constants[..i].iter().any(|(m, _)| m == n) || self.tensors.iter().any(|t| t.name == *n) {
                return Err(CheckError::Spec(format!("constant `{n}` is defined twice, or is also a tensor")));
            }
        }
        self.check_planned_memory()
    }
}

/// The keys of input tensor `i` of a check of `seed`.
fn input_keys(seed: u64, i: usize) -> Keys {
    Keys::new(seed.wrapping_mul(0x2545_f491_4f6c_dd1d).wrapping_add(i as u64 * 0x9e37_79b9 + 1))
}

/// 2^63, exactly.
const TWO_63: f64 = 9_223_372_036_854_775_808.0;

/// The smallest and largest value of an integer dtype.
fn int_range(dtype: DType) -> (i64, i64) {
    match dtype {
        DType::I1 => (0, 1),
        DType::I32 => (i32::MIN.into(), i32::MAX.into()),
        _ => (i64::MIN, i64::MAX),
    }
}

/// Whether `dist` can fill a tensor of `dtype`: an integer tensor takes integers in its range,
/// drawn or given exactly; uniform bounds are finite. Returns the first and last integer value
/// for an integer dtype drawn or given as one integer (`None` for float dtypes and ramps).
pub(crate) fn check_dist(dtype: DType, dist: Dist) -> Result<Option<(i64, i64)>, String> {
    if let Dist::Uniform { lo, hi } = dist {
        if !(lo.is_finite() && hi.is_finite()) {
            return Err(format!("uniform({lo}, {hi}): the bounds must be finite"));
        }
        let max = match dtype {
            DType::F16 => f64::from(half::f16::MAX),
            DType::BF16 => f64::from(half::bf16::MAX),
            DType::F32 => f64::from(f32::MAX),
            _ => f64::MAX,
        };
        if dtype.is_float() && (lo.abs() > max || hi.abs() > max) {
            return Err(format!("uniform({lo:e}, {hi:e}): {dtype} holds values up to {max:e}; draws past it would round to infinity"));
        }
    }
    let empty = match dist {
        Dist::RandInt { lo, hi } => lo >= hi,
        Dist::Uniform { lo, hi } => lo.is_nan() || hi.is_nan() || lo >= hi,
        Dist::ArangeMod { modulus, .. } => modulus == 0.0 || !modulus.is_finite(),
        _ => false,
    };
    if empty {
        return Err(format!("empty range in {dist:?}"));
    }
    if dtype.is_float() || matches!(dist, Dist::Arange { .. } | Dist::ArangeMod { .. }) {
        return Ok(None);
    }
    let (min, max) = int_range(dtype);
    let (lo, last) = match dist {
        Dist::RandInt { lo, hi } => (lo, hi - 1),
        Dist::ConstInt(c) => (c, c),
        // An integer-valued float below 2^63 in magnitude converts exactly.
        Dist::Constant(c) if c.fract() == 0.0 && (-TWO_63..TWO_63).contains(&c) => (c as i64, c as i64),
        Dist::Constant(c) if c.is_finite() && c.fract() == 0.0 => {
            return Err(format!("const({c}) is outside the range of {dtype} ({min} to {max})"))
        }
        _ => return Err(format!("the tensor is {dtype}: use an integer distribution (randint), an integer constant or arange")),
    };
    if lo < min || last > max {
        return Err(format!("{dist:?} has values outside the range of {dtype} ({min} to {max})"));
    }
    Ok(Some((lo, last)))
}

/// An integer tensor of `dtype` holding `v` (every value in the dtype's range).
fn int_tensor(dtype: DType, shape: &[usize], v: Vec<i64>) -> Result<HostTensor, String> {
    let data = match dtype {
        DType::I1 => Data::I1(v.iter().map(|&x| x != 0).collect()),
        DType::I32 => Data::I32(v.iter().map(|&x| x as i32).collect()), // in range: checked by the callers
        _ => Data::I64(v),
    };
    HostTensor::new(dtype, shape, data).map_err(|e| e.to_string())
}

/// The keys of a check's draws, in the order it draws tensors: each tensor (each slice of a
/// sliced one) takes the next key, and element `i` of its draw is a function of that key and
/// `i` alone ([`tilegrad_gpu::draw`]): the same values whatever the number of threads, and on
/// the device.
#[derive(Clone, Debug)]
pub(crate) struct Keys(u64);

impl Keys {
    /// The keys of stream `seed`.
    pub(crate) fn new(seed: u64) -> Keys {
        Keys(seed)
    }

    /// The next key (SplitMix64).
    pub(crate) fn next_key(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// A tensor of `dtype` and `shape` drawn from `dist`: integer tensors exactly (never through a
/// float), each value checked against the dtype's range; float tensors rounded to the dtype.
fn draw(dtype: DType, shape: &[usize], dist: Dist, keys: &mut Keys) -> Result<HostTensor, String> {
    let n = tilegrad_reference::check_alloc(dtype, shape).map_err(|e| e.to_string())?;
    let ints = check_dist(dtype, dist)?;
    if !dtype.is_float() {
        let v: Vec<i64> = match (dist, ints) {
            (Dist::RandInt { lo, hi }, _) => {
                let key = keys.next_key();
                (0..n).map(|i| int_at(key, i, lo, hi)).collect()
            }
            (_, Some((lo, _))) => vec![lo; n],
            // A ramp: every value an integer of the dtype (exact below 2^53).
            _ => {
                let (min, max) = int_range(dtype);
                let v = sample(&dist, keys, n).ok_or_else(|| format!("empty range in {dist:?}"))?;
                v.into_iter()
                    .map(|x| {
                        let ok = x.fract() == 0.0 && x.abs() <= 9_007_199_254_740_992.0 && x >= min as f64 && x <= max as f64;
                        if ok {
                            Ok(x as i64)
                        } else {
                            Err(format!("{dist:?} gives {x}, which is not an integer of {dtype}"))
                        }
                    })
                    .collect::<Result<_, _>>()?
            }
        };
        return int_tensor(dtype, shape, v);
    }
    draw_floats(dtype, shape, n, dist, keys)
}

/// Elements a thread draws at a time.
const CHUNK: usize = 1 << 20;

/// A float tensor drawn from `dist` with the next key, chunks in parallel, each element rounded
/// to `dtype` as it is drawn (no f64 copy of the whole tensor).
pub(crate) fn draw_floats(dtype: DType, shape: &[usize], n: usize, dist: Dist, keys: &mut Keys) -> Result<HostTensor, String> {
    let data = match dtype {
        DType::F64 => {
            let mut v = vec![0.0f64; n];
            draw_into(&mut v, dist, keys.next_key(), |x| x)?;
            Data::F64(v)
        }
        _ => {
            let mut v = vec![0.0f32; n];
            draw_into(&mut v, dist, keys.next_key(), |x| tilegrad_reference::round_to(dtype, x) as f32)?;
            Data::F32(v)
        }
    };
    HostTensor::new(dtype, shape, data).map_err(|e| e.to_string())
}

/// Fills `out` with the values of `dist` under `key` (each through `conv`), in chunks of
/// [`CHUNK`] on as many threads as there are cores.
fn draw_into<T: Send>(out: &mut [T], dist: Dist, key: u64, conv: impl Fn(f64) -> T + Sync) -> Result<(), String> {
    if !nonempty(&dist) {
        return Err(format!("empty range in {dist:?}"));
    }
    let fill = |k: usize, c: &mut [T]| match dist {
        // Both halves of each Box-Muller pair (chunks start at even elements).
        Dist::Normal { mean, std } => c.chunks_mut(2).enumerate().for_each(|(j, o)| {
            let (a, b) = tilegrad_gpu::draw::normal_pair(key, (k * CHUNK / 2 + j) as u64);
            o[0] = conv(mean + std * a);
            if let Some(o1) = o.get_mut(1) {
                *o1 = conv(mean + std * b);
            }
        }),
        _ => c.iter_mut().enumerate().for_each(|(j, o)| *o = conv(value_at(&dist, key, k * CHUNK + j))),
    };
    let chunks = out.len().div_ceil(CHUNK);
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()).min(chunks).max(1);
    if threads == 1 {
        out.chunks_mut(CHUNK).enumerate().for_each(|(k, c)| fill(k, c));
        return Ok(());
    }
    std::thread::scope(|sc| {
        let mut per: Vec<Vec<(usize, &mut [T])>> = (0..threads).map(|_| Vec::new()).collect();
        for (k, c) in out.chunks_mut(CHUNK).enumerate() {
            per[k % threads].push((k, c));
        }
        for mine in per {
            let fill = &fill;
            sc.spawn(move || mine.into_iter().for_each(|(k, c)| fill(k, c)));
        }
    });
    Ok(())
}

/// `n` standard normal f64 values keyed by `seed` alone (element `i` is
/// [`tilegrad_gpu::draw::normal_at`]`(seed, i)`, which the device draws too): the Python
/// package's cotangents.
pub fn standard_normal(n: usize, seed: u64) -> Vec<f64> {
    let mut v = vec![0.0; n];
    standard_normal_into(&mut v, seed);
    v
}

/// [`standard_normal`] into `out` (its length is `n`).
pub fn standard_normal_into(out: &mut [f64], seed: u64) {
    draw_into(out, Dist::default(), seed, |x| x).expect("the standard normal is not empty");
}

/// A tensor whose consecutive slices along `axis` are drawn from their own distributions (each
/// slice with the next key, in order).
fn draw_slices(dtype: DType, shape: &[usize], axis: usize, parts: &[(usize, Dist)], keys: &mut Keys) -> Result<HostTensor, String> {
    let n = tilegrad_reference::check_alloc(dtype, shape).map_err(|e| e.to_string())?;
    if axis >= shape.len() || parts.iter().map(|p| p.0).sum::<usize>() != shape[axis] {
        return Err(format!(
            "slices of {:?} along axis {axis} do not cover shape {shape:?}",
            parts.iter().map(|p| p.0).collect::<Vec<_>>()
        ));
    }
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let drawn: Vec<HostTensor> = parts
        .iter()
        .map(|&(len, dist)| {
            let mut sh = shape.to_vec();
            sh[axis] = len;
            draw(dtype, &sh, dist, keys)
        })
        .collect::<Result<_, _>>()?;
    // Row-major interleaving: for each outer index, each slice's `len * inner` elements in turn.
    macro_rules! stitch {
        ($var:ident) => {{
            let mut out = Vec::with_capacity(n);
            for o in 0..outer {
                for (t, &(len, _)) in drawn.iter().zip(parts) {
                    let Data::$var(v) = t.data() else { unreachable!("drawn in one dtype") };
                    out.extend_from_slice(&v[o * len * inner..(o + 1) * len * inner]);
                }
            }
            Data::$var(out)
        }};
    }
    let data = match drawn.first().map(|t| t.data()) {
        Some(Data::I1(_)) => stitch!(I1),
        Some(Data::I32(_)) => stitch!(I32),
        Some(Data::I64(_)) => stitch!(I64),
        Some(Data::F32(_)) => stitch!(F32),
        Some(Data::F64(_)) => stitch!(F64),
        None => return Err("no slices".into()),
    };
    HostTensor::new(dtype, shape, data).map_err(|e| e.to_string())
}

/// Whether `dist` has values (finite bounds, a non-empty range, a modulus).
fn nonempty(dist: &Dist) -> bool {
    match *dist {
        Dist::Uniform { lo, hi } => lo < hi && lo.is_finite() && hi.is_finite(),
        Dist::RandInt { lo, hi } => lo < hi,
        Dist::ArangeMod { modulus, .. } => modulus != 0.0 && modulus.is_finite(),
        Dist::Normal { .. } | Dist::Constant(_) | Dist::ConstInt(_) | Dist::Arange { .. } => true,
    }
}

/// Integer `i` of a draw uniform on `[lo, hi)` under `key` (`lo < hi`).
fn int_at(key: u64, i: usize, lo: i64, hi: i64) -> i64 {
    let range = (i128::from(hi) - i128::from(lo)) as u128;
    let off = (u128::from(tilegrad_gpu::draw::bits_at(key, i as u64)) * range) >> 64;
    lo.wrapping_add(off as i64)
}

/// Element `i` of `dist` under `key`, as a float (`dist` [`nonempty`]).
fn value_at(dist: &Dist, key: u64, i: usize) -> f64 {
    use tilegrad_gpu::draw::{normal_at, uniform_at};
    match *dist {
        Dist::Normal { mean, std } => mean + std * normal_at(key, i as u64),
        // Where the width overflows (uniform(-1e308, 1e308)), a convex combination of the
        // bounds stays finite; rounding up to `hi` is pulled back to `lo`.
        Dist::Uniform { lo, hi } => {
            let u = uniform_at(key, i as u64);
            let x = if (hi - lo).is_finite() { lo + (hi - lo) * u } else { lo * (1.0 - u) + hi * u };
            if x < hi {
                x.max(lo)
            } else {
                lo
            }
        }
        Dist::RandInt { lo, hi } => int_at(key, i, lo, hi) as f64,
        Dist::Constant(c) => c,
        Dist::ConstInt(c) => c as f64,
        Dist::Arange { start, step } => start + step * i as f64,
        Dist::ArangeMod { start, step, modulus } => (start + step * i as f64).rem_euclid(modulus),
    }
}

/// `n` values of `dist` under the next key, in row-major order, as floats; `None` when the
/// distribution is empty (or its bounds are not finite).
pub(crate) fn sample(dist: &Dist, keys: &mut Keys, n: usize) -> Option<Vec<f64>> {
    let mut v = vec![0.0; n];
    draw_into(&mut v, *dist, keys.next_key(), |x| x).ok()?;
    Some(v)
}

/// `n` standard normal samples under the next key.
pub(crate) fn normal(keys: &mut Keys, n: usize) -> Vec<f64> {
    sample(&Dist::default(), keys, n).expect("the standard normal is not empty")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The device's draws take the key and distribution [`Inputs::device_draw`] gives: element
    /// `j` of the tensor [`Inputs::materialise`] draws is [`value_at`] of them, rounded to the
    /// dtype, for normal and uniform inputs in f32 and f64 (of odd lengths); other inputs have
    /// none.
    #[test]
    fn device_draws_are_keyed_as_the_host_draws() {
        let inputs = Inputs::new()
            .random("a", DType::F32, &[7, 13], Dist::Normal { mean: 0.5, std: 2.0 })
            .random("b", DType::F64, &[1001], Dist::Uniform { lo: -1.0, hi: 3.0 })
            .random("c", DType::F32, &[33], Dist::Uniform { lo: 0.5, hi: 1.5 })
            .random("d", DType::I32, &[5], Dist::RandInt { lo: 0, hi: 9 })
            .random("e", DType::F32, &[9], Dist::Constant(2.0))
            .random("f", DType::BF16, &[77], Dist::Normal { mean: 0.0, std: 3.0 })
            .random("g", DType::F16, &[40], Dist::Uniform { lo: -2.0, hi: 2.0 });
        let env = inputs.materialise(11).unwrap();
        for (i, name) in [(0, "a"), (1, "b"), (2, "c"), (5, "f"), (6, "g")] {
            let (key, dist) = inputs.device_draw(i, 11).unwrap();
            let h = env.tensor(name).unwrap();
            for j in 0..h.numel() {
                let want = tilegrad_reference::round_to(h.dtype(), value_at(&dist, key, j));
                assert_eq!(h.get_f64(j).to_bits(), want.to_bits(), "`{name}`[{j}]");
            }
        }
        assert!(inputs.device_draw(3, 11).is_none() && inputs.device_draw(4, 11).is_none());
    }

    /// A draw is the same whatever the chunk or thread that draws an element: the f32 tensor
    /// is the f64 draw rounded element by element, a short draw is the long one's beginning,
    /// and the values are a standard normal's.
    #[test]
    fn large_draws_are_their_elements_drawn_one_by_one_in_every_dtype() {
        let n = 3 * CHUNK + 12_345;
        let v = standard_normal(n, 42);
        let f32s = draw_floats(DType::F32, &[n], n, Dist::default(), &mut Keys::new(7)).unwrap();
        let f64s = draw_floats(DType::F64, &[n], n, Dist::default(), &mut Keys::new(7)).unwrap();
        let (Data::F32(w), Data::F64(x)) = (f32s.data(), f64s.data()) else { panic!("float data") };
        assert!(x.iter().zip(w).all(|(&a, &b)| a as f32 == b));
        for i in [0, 1, CHUNK - 1, CHUNK, 2 * CHUNK + 7, n - 1] {
            assert_eq!(v[i].to_bits(), tilegrad_gpu::draw::normal_at(42, i as u64).to_bits());
        }
        assert_ne!(standard_normal(n, 43)[..64], v[..64]);
        let mean = v.iter().sum::<f64>() / n as f64;
        let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 5e-3 && (var - 1.0).abs() < 5e-3, "mean {mean}, variance {var}");
        let small = standard_normal(1000, 42);
        assert!(small.iter().zip(&v).all(|(a, b)| a.to_bits() == b.to_bits()));
    }

    /// Uniform and integer draws stay in their ranges and cover them; keys in sequence differ.
    #[test]
    fn uniform_and_integer_draws_cover_their_ranges() {
        let mut keys = Keys::new(3);
        let u = sample(&Dist::Uniform { lo: -2.0, hi: 3.0 }, &mut keys, 100_000).unwrap();
        assert!(u.iter().all(|&x| (-2.0..3.0).contains(&x)));
        assert!(u.iter().any(|&x| x < -1.99) && u.iter().any(|&x| x > 2.99));
        let k = sample(&Dist::RandInt { lo: -3, hi: 4 }, &mut keys, 100_000).unwrap();
        for v in -3..4 {
            let c = k.iter().filter(|&&x| x == v as f64).count();
            assert!((13_000..15_600).contains(&c), "{v}: {c}");
        }
        let wide = sample(&Dist::Uniform { lo: -1e308, hi: 1e308 }, &mut keys, 1000).unwrap();
        assert!(wide.iter().all(|x| x.is_finite()) && wide.iter().any(|&x| x > 1e307));
        assert!(sample(&Dist::Uniform { lo: 1.0, hi: 1.0 }, &mut keys, 3).is_none());
        assert_ne!(Keys::new(1).next_key(), Keys::new(2).next_key());
    }
}
