//! The ground truth of a whole forward pass: the reverse sweep over its steps.
//!
//! Cotangents live per tensor name. A launch's VJP ([`tilegrad_ad::vjp`]) maps the cotangents
//! of the final contents of the tensors it touched to cotangents of their contents before it ran
//! (every float tensor of the launch is both an input and, where it has a cotangent, an output, so
//! that untouched elements pass theirs through); a host step's VJP is its transpose (sum over an
//! axis -> broadcast, reshape -> reshape, scale -> scale); an allocation ends its tensor's
//! cotangent.

use super::steps::{split_axis, LaunchRecord, Step};
use super::{CheckError, Env};
use std::collections::HashMap;
use tilegrad_ad::{vjp, GradOptions};
use tilegrad_reference::Launch;

/// Cotangents of the tensors of `env` before `steps` ran, from cotangents of their contents
/// after. `records` are the launches of `steps` as they ran (with their tensors before).
pub(crate) fn reverse(
    steps: &[Step],
    records: &[LaunchRecord],
    env: &Env,
    mut cot: HashMap<String, Vec<f64>>,
    opts: &GradOptions,
) -> Result<HashMap<String, Vec<f64>>, CheckError> {
    for (i, step) in steps.iter().enumerate().rev() {
        let at = |m: String| CheckError::Forward { step: i, what: step.describe(), message: m };
        match step {
            Step::Alloc { name, .. } => {
                cot.remove(name);
            }
            Step::Launch(_) => {
                let r = records.iter().find(|r| r.step == i).expect("every launch step is recorded");
                let floats: Vec<_> = r.names.iter().filter(|(t, _)| r.before.get(*t).dtype().is_float()).collect();
                let outputs: Vec<_> = floats.iter().filter_map(|(t, n)| cot.get(n).map(|c| (*t, c.clone()))).collect();
                if outputs.is_empty() {
                    continue;
                }
                let mut launch = Launch::new(&r.kernel, r.grid);
                for (n, a) in &r.args {
                    launch = launch.arg(n, *a);
                }
                let inputs: Vec<_> = floats.iter().map(|(t, _)| *t).collect();
                let g = vjp(&launch, &r.before, &inputs, &outputs, opts).map_err(|e| at(e.to_string()))?;
                for ((_, n), gi) in floats.iter().zip(g.inputs) {
                    cot.insert(n.clone(), gi);
                }
            }
            Step::Sum { src, axis, dst } => {
                let Some(c) = cot.remove(dst) else { continue };
                let shape = env.tensor(src).expect("ran forward").shape();
                let (_, outer, n, inner) = split_axis(shape, *axis).expect("the forward ran this sum");
                let s = cot.entry(src.clone()).or_insert_with(|| vec![0.0; outer * n * inner]);
                for o in 0..outer {
                    for k in 0..n {
                        for j in 0..inner {
                            s[(o * n + k) * inner + j] += c[o * inner + j];
                        }
                    }
                }
            }
            Step::Reshape { src, dst, .. } => {
                let Some(c) = cot.remove(dst) else { continue };
                let s = cot.entry(src.clone()).or_insert_with(|| vec![0.0; c.len()]);
                s.iter_mut().zip(&c).for_each(|(a, b)| *a += b);
            }
            Step::Scale { src, factor, dst } => {
                let Some(c) = cot.remove(dst) else { continue };
                let f = factor.eval(env).map_err(|e| at(e.to_string()))?.as_f64();
                let s = cot.entry(src.clone()).or_insert_with(|| vec![0.0; c.len()]);
                s.iter_mut().zip(&c).for_each(|(a, b)| *a += f * b);
            }
        }
    }
    Ok(cot)
}
