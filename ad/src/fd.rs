//! Central finite differences through the reference interpreter, in f64: the engine's self-check.
//!
//! A launch is a function `F` from the initial contents of chosen *input* tensors to the final
//! contents of chosen *output* tensors; a tensor may be both (updated in place), in which case its
//! initial contents are the input and its final contents the output. Given one cotangent per
//! output, these functions estimate derivatives of the scalar
//! `L(x) = sum_o <cot_o, F_o(x)>` by central differences `(L(x + h v) - L(x - h v)) / (2h)`.
//!
//! Every evaluation runs in f64, whatever the kernel's dtypes: the kernel is promoted with
//! [`tilegrad_ir::passes::promote_floats`] (every float becomes f64, `dot` exact) and every float
//! tensor of the memory is copied to f64 (integer and boolean tensors are used unchanged). An
//! evaluation clones that f64 memory, adds `t * v` to the inputs' initial contents, runs the
//! promoted launch with [`tilegrad_reference::Launch::run`], and reads the outputs.
//!
//! # Choosing `h`
//! The step is the caller's, used as is (an absolute step in every input element):
//! - kernels that are piecewise linear in the inputs (loads, stores, adds, multiplies by
//!   constants or by other inputs when each perturbation touches one element, `where`, `max`,
//!   `min`, ...) give the exact derivative for any `h` that does not cross a kink (a `max` tie, a
//!   comparison that flips): there, a large `h` such as 1e-3 only reduces rounding error;
//! - for smooth kernels, the truncation error is `O(h^2)` and the rounding error
//!   `O(eps * |L| / h)`; `h = 1e-6 * max(1, |x|)` (with `|x|` the magnitude of the inputs)
//!   balances them and gives about 8 to 10 correct digits.
//!
//! Non-finite evaluations are not hidden: a NaN or infinite `L` yields a NaN or infinite
//! estimate.

use crate::AdError;
use rayon::prelude::*;
use std::collections::HashSet;
use tilegrad_ir::passes::promote_floats;
use tilegrad_ir::{DType, Kernel};
use tilegrad_reference::{Data, HostTensor, Launch, Memory, TensorId};

/// What is differentiated: a launch, the memory it runs against, and the tensors whose initial
/// contents are the inputs and whose final contents are the outputs of the function.
#[derive(Clone, Debug)]
pub struct FdSpec<'a> {
    /// The launch (any dtypes: it is run promoted to f64).
    pub launch: &'a Launch<'a>,
    /// The tensors' initial contents (left unchanged).
    pub mem: &'a Memory,
    /// Differentiable inputs (float tensors, each listed once).
    pub inputs: Vec<TensorId>,
    /// Outputs (float tensors, each listed once); may include inputs (in-place updates).
    pub outputs: Vec<TensorId>,
}

impl<'a> FdSpec<'a> {
    /// A specification (`inputs` and `outputs` as arrays, slices or vectors of ids).
    pub fn new(launch: &'a Launch<'a>, mem: &'a Memory, inputs: impl Into<Vec<TensorId>>, outputs: impl Into<Vec<TensorId>>) -> FdSpec<'a> {
        FdSpec { launch, mem, inputs: inputs.into(), outputs: outputs.into() }
    }
}

/// The directional derivative of `L = sum_o <cotangents[o], F_o>` along `directions` (one per
/// input, as many elements as the tensor): `(L(x + h v) - L(x - h v)) / (2h)`.
///
/// Cost: 2 launches. See the module docs for the semantics and the choice of `h`.
pub fn fd_directional(spec: &FdSpec<'_>, cotangents: &[Vec<f64>], directions: &[Vec<f64>], h: f64) -> Result<f64, AdError> {
    let p = Prepared::new(spec, cotangents, h)?;
    if directions.len() != spec.inputs.len() {
        return Err(AdError::Spec(format!(
            "finite differences: {} direction(s) given for {} input tensor(s)",
            directions.len(),
            spec.inputs.len()
        )));
    }
    for (&id, d) in spec.inputs.iter().zip(directions) {
        let n = spec.mem.get(id).numel();
        if d.len() != n {
            return Err(AdError::Spec(format!(
                "finite differences: the direction for input tensor `{}` has {} element(s), the tensor has {n}",
                spec.mem.name(id),
                d.len()
            )));
        }
    }
    let eval = |t: f64| {
        p.eval(spec, |mem| {
            for (&id, d) in spec.inputs.iter().zip(directions) {
                let x = f64_data_mut(mem, id);
                x.iter_mut().zip(d).for_each(|(x, &v)| *x += t * v);
            }
        })
    };
    let (plus, minus) = (eval(h)?, eval(-h)?);
    Ok(Prepared::central(cotangents, &plus, &minus, h))
}

/// The full vector-Jacobian product: for every input tensor, the derivative of
/// `L = sum_o <cotangents[o], F_o>` with respect to each element of its initial contents (one
/// `Vec` per input, in `spec.inputs` order, with the tensor's element count).
///
/// Cost: 2 launches per input element (each perturbs one element by `+h` and `-h`), so this is
/// meant for small tensors; the launches run in parallel. Use [`fd_directional`] (2 launches in
/// all) to check a VJP along random directions on larger problems.
pub fn fd_vjp(spec: &FdSpec<'_>, cotangents: &[Vec<f64>], h: f64) -> Result<Vec<Vec<f64>>, AdError> {
    let p = Prepared::new(spec, cotangents, h)?;
    let elems: Vec<(usize, usize)> =
        spec.inputs.iter().enumerate().flat_map(|(k, &id)| (0..spec.mem.get(id).numel()).map(move |i| (k, i))).collect();
    let grads: Vec<f64> = elems
        .par_iter()
        .map(|&(k, i)| {
            let id = spec.inputs[k];
            let eval = |t: f64| p.eval(spec, |mem| f64_data_mut(mem, id)[i] += t);
            Ok(Prepared::central(cotangents, &eval(h)?, &eval(-h)?, h))
        })
        .collect::<Result<_, AdError>>()?;
    let mut out = Vec::with_capacity(spec.inputs.len());
    let mut rest = grads.as_slice();
    for &id in &spec.inputs {
        let (g, r) = rest.split_at(spec.mem.get(id).numel());
        out.push(g.to_vec());
        rest = r;
    }
    Ok(out)
}

/// The promoted kernel and the f64 copy of the memory, after checking the specification.
struct Prepared {
    kernel: Kernel,
    mem: Memory,
}

impl Prepared {
    fn new(spec: &FdSpec<'_>, cotangents: &[Vec<f64>], h: f64) -> Result<Prepared, AdError> {
        let mem = spec.mem;
        if !(h.is_finite() && h > 0.0) {
            return Err(AdError::Spec(format!("finite differences: the step h must be positive and finite, got {h}")));
        }
        for (role, ids) in [("input", &spec.inputs), ("output", &spec.outputs)] {
            let mut seen = HashSet::new();
            for &id in ids.iter() {
                if id.0 as usize >= mem.len() {
                    return Err(AdError::Spec(format!(
                        "finite differences: {role} tensor id {} is not in this memory ({} tensor(s))",
                        id.0,
                        mem.len()
                    )));
                }
                let t = mem.get(id);
                if !t.dtype().is_float() {
                    let why = match role {
                        "input" => "only float tensors are differentiable",
                        _ => "integer and boolean outputs carry no gradient; leave it out of the outputs",
                    };
                    return Err(AdError::Spec(format!("finite differences: {role} tensor `{}` is {}: {why}", mem.name(id), t.dtype())));
                }
                if !seen.insert(id) {
                    return Err(AdError::Spec(format!("finite differences: {role} tensor `{}` is listed twice", mem.name(id))));
                }
            }
        }
        if cotangents.len() != spec.outputs.len() {
            return Err(AdError::Spec(format!(
                "finite differences: {} cotangent(s) given for {} output tensor(s)",
                cotangents.len(),
                spec.outputs.len()
            )));
        }
        for (&id, c) in spec.outputs.iter().zip(cotangents) {
            let n = mem.get(id).numel();
            if c.len() != n {
                return Err(AdError::Spec(format!(
                    "finite differences: the cotangent for output tensor `{}` has {} element(s), the tensor has {n}",
                    mem.name(id),
                    c.len()
                )));
            }
        }
        let kernel = promote_floats(spec.launch.kernel(), DType::F64)?;
        let mut mem64 = mem.clone();
        for i in 0..mem64.len() {
            let id = TensorId(i as u32);
            let t = mem64.get(id);
            if t.dtype().is_float() && t.dtype() != DType::F64 {
                let promoted = HostTensor::from_f64(t.shape(), t.to_f64_vec());
                *mem64.get_mut(id) = promoted;
            }
        }
        Ok(Prepared { kernel, mem: mem64 })
    }

    /// The outputs' final contents after `perturb` changed a clone of the f64 memory.
    fn eval(&self, spec: &FdSpec<'_>, perturb: impl FnOnce(&mut Memory)) -> Result<Vec<Vec<f64>>, AdError> {
        let mut mem = self.mem.clone();
        perturb(&mut mem);
        spec.launch.with_kernel(&self.kernel).run(&mut mem)?;
        Ok(spec.outputs.iter().map(|&id| mem.get(id).as_f64().expect("float tensors were promoted to f64").to_vec()).collect())
    }

    /// The central difference `(L(+h) - L(-h)) / 2h` from the outputs of both evaluations.
    /// `L(+h) - L(-h)` is summed as `sum <cot, y+ - y->`, so that elements the perturbation did
    /// not change contribute exactly zero instead of the rounding error of two large sums.
    fn central(cotangents: &[Vec<f64>], plus: &[Vec<f64>], minus: &[Vec<f64>], h: f64) -> f64 {
        let mut acc = Neumaier::default();
        for ((c, p), m) in cotangents.iter().zip(plus).zip(minus) {
            for ((&c, &p), &m) in c.iter().zip(p).zip(m) {
                if p != m {
                    acc.add(c * (p - m));
                }
            }
        }
        acc.sum() / (2.0 * h)
    }
}

/// The f64 storage of a (promoted) float tensor.
fn f64_data_mut(mem: &mut Memory, id: TensorId) -> &mut Vec<f64> {
    match mem.get_mut(id).data_mut() {
        Data::F64(v) => v,
        _ => unreachable!("inputs are float tensors, promoted to f64"),
    }
}

/// Neumaier's compensated summation (the terms of a difference can cancel).
#[derive(Default)]
struct Neumaier {
    sum: f64,
    comp: f64,
}

impl Neumaier {
    fn add(&mut self, x: f64) {
        let t = self.sum + x;
        if self.sum.abs() >= x.abs() {
            self.comp += (self.sum - t) + x;
        } else {
            self.comp += (x - t) + self.sum;
        }
        self.sum = t;
    }

    fn sum(&self) -> f64 {
        self.sum + self.comp
    }
}
