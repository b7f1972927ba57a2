//! The ground truth's reverse sweep over a forward of allocations and launches whose tensors
//! are in device memory: each launch's VJP kernel runs in place on the forward's tensors as they
//! were before it (its backup put back), with cotangents in device buffers by tensor name, as
//! [`crate::check::ground::reverse`] keeps them on the host.

use super::env::{dev, Aside, DeviceEnv};
use super::pass::Ran;
use crate::check::backend::Executor;
use crate::check::ground::contents_matter;
use crate::check::steps::Step;
use crate::check::vjp_in_place::{vjp_in_place, vjp_kernel};
use std::collections::HashMap;
use tilegrad_ad::{Precision, VjpKernel};
use tilegrad_gpu::DeviceBuffer;

/// Each kept launch's VJP kernel (f64, over the f64 tensors of `env`), compiled ahead
/// together. A launch the evaluator must differentiate (a refused VJP kernel, programs that
/// stored the same value to one element) steps aside.
pub(crate) fn vjp_kernels(ran: &[Ran], env: &DeviceEnv, exec: &Executor) -> Result<HashMap<usize, VjpKernel>, Aside> {
    let mem = env.memory()?;
    let mut out = HashMap::new();
    for r in ran {
        if r.same_value {
            return Err(format!("forward step {}: programs stored the same value to one element", r.step));
        }
        let vk = vjp_kernel(exec, &r.launch(), &mem, Precision::F64).map_err(|e| format!("forward step {}: {e}", r.step))?;
        out.insert(r.step, vk);
    }
    let ahead: Vec<_> = ran.iter().map(|r| (&out[&r.step].kernel, true, r.grid.programs())).collect();
    exec.precompile(&ahead);
    Ok(out)
}

/// Cotangents of the tensors of `env` before `steps` ran, from the f64 cotangents `cot` of
/// their contents after (by name, device buffers of the tensors' lengths). `env` holds the
/// tensors as the steps left them and is rewound launch by launch.
pub(crate) fn reverse(
    steps: &[Step],
    ran: &[Ran],
    vks: &HashMap<usize, VjpKernel>,
    env: &DeviceEnv,
    mut cot: HashMap<String, DeviceBuffer>,
    exec: &Executor,
) -> Result<HashMap<String, DeviceBuffer>, Aside> {
    let gpu = exec.gpu().ok_or("no GPU")?;
    let mem = env.memory()?;
    let touches = |j: usize, n: &str| ran.iter().any(|r| r.step == j && r.names.iter().any(|(_, m)| m == n));
    for (i, step) in steps.iter().enumerate().rev() {
        let r = match step {
            Step::Alloc { name, .. } => {
                cot.remove(name);
                continue;
            }
            Step::Launch(_) => ran.iter().find(|r| r.step == i).ok_or("a launch not kept")?,
            _ => return Err(format!("step {i} runs on the host")),
        };
        // The launch's tensors as it found them.
        gpu.restore(&r.before, &mem).map_err(dev)?;
        let floats: Vec<_> = r.names.iter().filter(|(t, _)| mem.get(*t).dtype.is_float()).collect();
        if !floats.iter().any(|(_, n)| cot.contains_key(n)) {
            continue;
        }
        let outputs: Vec<_> = floats.iter().filter_map(|(t, n)| cot.remove(n).map(|b| (*t, b))).collect();
        let wanted: Vec<_> = floats.iter().filter(|(_, n)| contents_matter(steps, i, n, &touches)).collect();
        let mut inputs = Vec::new();
        for (t, n) in &wanted {
            inputs.push((*t, n.clone(), gpu.alloc_zeroed(mem.get(*t).numel * 8).map_err(dev)?));
        }
        let outs: Vec<_> = outputs.iter().map(|(t, b)| (*t, b.addr())).collect();
        let ins: Vec<_> = inputs.iter().map(|(t, _, b)| (*t, b.addr())).collect();
        if !vjp_in_place(exec, &r.launch(), &vks[&i], &mem, (&ins, &outs), Some(&r.max_trips))? {
            return Err(format!("forward step {i}: its VJP kernel does not run in place"));
        }
        // The VJP kernel stored the launch's results again: rewind for the launches before.
        gpu.restore(&r.before, &mem).map_err(dev)?;
        for (_, n, b) in inputs {
            cot.insert(n, b);
        }
    }
    Ok(cot)
}
