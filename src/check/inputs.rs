//! The inputs of a check: named constants for size expressions, and named tensors, given or drawn
//! from a seeded distribution (the same seed gives the same tensors on every machine).

use super::expr::Scalar;
use super::steps::Env;
use super::CheckError;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tilegrad_ir::DType;
use tilegrad_reference::HostTensor;

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
        for (i, it) in self.tensors.iter().enumerate() {
            if env.constants.iter().any(|(c, _)| *c == it.name) {
                return Err(CheckError::Spec(format!("`{}` is both a constant and a tensor", it.name)));
            }
            let t = match &it.source {
                Source::Given(t) => t.clone(),
                Source::Random { dtype, shape, dist } => {
                    let n: usize = shape.iter().product();
                    let mut r = StdRng::seed_from_u64(seed.wrapping_mul(0x2545_f491_4f6c_dd1d).wrapping_add(i as u64 * 0x9e37_79b9 + 1));
                    let v =
                        sample(dist, &mut r, n).ok_or_else(|| CheckError::Spec(format!("input `{}`: empty range in {dist:?}", it.name)))?;
                    if !dtype.is_float() && v.iter().any(|x| x.fract() != 0.0) {
                        return Err(CheckError::Spec(format!(
                            "input `{}` is {dtype}: use an integer distribution (randint) or a constant",
                            it.name
                        )));
                    }
                    HostTensor::from_f64_as(*dtype, shape, &v)
                }
            };
            env.add(&it.name, t).map_err(CheckError::Spec)?;
        }
        Ok(env)
    }
}

/// `n` values of `dist` in row-major order; `None` for an empty range.
pub(crate) fn sample(dist: &Dist, r: &mut StdRng, n: usize) -> Option<Vec<f64>> {
    Some(match *dist {
        Dist::Normal { mean, std } => normal(r, n).into_iter().map(|x| mean + std * x).collect(),
        Dist::Uniform { lo, hi } if lo < hi => (0..n).map(|_| r.gen_range(lo..hi)).collect(),
        Dist::RandInt { lo, hi } if lo < hi => (0..n).map(|_| r.gen_range(lo..hi) as f64).collect(),
        Dist::Constant(c) => vec![c; n],
        Dist::Arange { start, step } => (0..n).map(|i| start + step * i as f64).collect(),
        Dist::ArangeMod { start, step, modulus } if modulus != 0.0 => {
            (0..n).map(|i| (start + step * i as f64).rem_euclid(modulus)).collect()
        }
        Dist::Uniform { .. } | Dist::RandInt { .. } | Dist::ArangeMod { .. } => return None,
    })
}

/// `n` standard normal samples (Box-Muller on the generator's uniforms).
pub(crate) fn normal(r: &mut StdRng, n: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(n + 1);
    while out.len() < n {
        let u1: f64 = 1.0 - r.gen::<f64>(); // (0, 1]
        let u2: f64 = r.gen();
        let rad = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (std::f64::consts::TAU * u2).sin_cos();
        out.push(rad * c);
        out.push(rad * s);
    }
    out.truncate(n);
    out
}
