//! The ground truth's reverse sweep over a forward whose tensors are in device memory: each
//! launch's VJP kernel runs in place on the forward's tensors as they were before it (its
//! backup put back), with cotangents in device buffers by tensor name, as
//! [`crate::check::ground::reverse`] keeps them on the host; a sum's cotangent is broadcast
//! back along its axis, a chunk's pieces' and a concatenation's parts' go back to their
//! positions; other host steps go back on the host, as they went forward
//! ([`DeviceEnv::on_host`]), from copies of what they read and made and of their cotangents.

use super::env::{dev, Aside, DeviceEnv};
use super::pass::Ran;
use crate::check::backend::Executor;
use crate::check::ground;
use crate::check::ground::contents_matter;
use crate::check::steps::pieces::chunk_sizes;
use crate::check::steps::Step;
use crate::check::steps::{split_axis, Records};
use crate::check::vjp_in_place::{vjp_in_place, vjp_kernel};
use std::collections::HashMap;
use tilegrad_ad::{GradOptions, Precision, VjpKernel};
use tilegrad_gpu::{Along, DeviceBuffer, Gpu};
use tilegrad_ir::DType;

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
            Step::Sum { src, axis, dst } => {
                sum_back(gpu, env, &mut cot, (src, *axis, dst))?;
                continue;
            }
            Step::Chunk { src, chunks, axis, dsts } => {
                chunk_back(gpu, env, &mut cot, (src, *chunks, *axis, dsts))?;
                continue;
            }
            Step::Cat { srcs, axis, dst } => {
                cat_back(gpu, env, &mut cot, (srcs, *axis, dst))?;
                continue;
            }
            _ => {
                host_back(gpu, env, &mut cot, step).map_err(|e| format!("forward step {i} ({}): {e}", step.describe()))?;
                continue;
            }
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

/// The cotangent of tensor `name` of `env` in `cot`, zeros where it has none yet.
fn cot_of<'c>(gpu: &Gpu, env: &DeviceEnv, cot: &'c mut HashMap<String, DeviceBuffer>, name: &str) -> Result<&'c DeviceBuffer, Aside> {
    if !cot.contains_key(name) {
        let t = env.get(name).ok_or_else(|| format!("no tensor `{name}`"))?;
        cot.insert(name.to_string(), gpu.alloc_zeroed(t.numel * 8).map_err(dev)?);
    }
    Ok(&cot[name])
}

/// The shape of `name` split at `axis`: (outer, extent, inner).
fn split(env: &DeviceEnv, name: &str, axis: i64) -> Result<(usize, usize, usize), Aside> {
    let shape = env.shape_of(name).ok_or_else(|| format!("no tensor `{name}`"))?;
    split_axis(shape, axis).map(|(_, o, n, i)| (o, n, i)).ok_or_else(|| format!("axis {axis} of `{name}`"))
}

/// `dst = src.sum(axis)` backwards: `dst`'s cotangent added to every position along the axis.
fn sum_back(gpu: &Gpu, env: &DeviceEnv, cot: &mut HashMap<String, DeviceBuffer>, (src, axis, dst): (&str, i64, &str)) -> Result<(), Aside> {
    let Some(c) = cot.remove(dst) else { return Ok(()) };
    let (outer, n, inner) = split(env, src, axis)?;
    let into = cot_of(gpu, env, cot, src)?;
    gpu.broadcast_add(c.addr(), into.addr(), outer, n, inner).map_err(dev)
}

/// A chunk backwards: each piece's cotangent added into its positions in the source's.
fn chunk_back(
    gpu: &Gpu,
    env: &DeviceEnv,
    cot: &mut HashMap<String, DeviceBuffer>,
    (src, chunks, axis, dsts): (&str, usize, i64, &[String]),
) -> Result<(), Aside> {
    let (outer, n, inner) = split(env, src, axis)?;
    let mut at = 0;
    for (d, len) in dsts.iter().zip(chunk_sizes(n, chunks)) {
        if let Some(c) = cot.remove(d) {
            let into = cot_of(gpu, env, cot, src)?;
            let along = Along { outer, inner, len, n_src: len, src_at: 0, n_dst: n, dst_at: at };
            gpu.copy_along(c.addr(), into.addr(), DType::F64, along, true).map_err(dev)?;
        }
        at += len;
    }
    Ok(())
}

/// A concatenation backwards: each source's positions of the result's cotangent added into
/// the source's.
fn cat_back(
    gpu: &Gpu,
    env: &DeviceEnv,
    cot: &mut HashMap<String, DeviceBuffer>,
    (srcs, axis, dst): (&[String], i64, &str),
) -> Result<(), Aside> {
    let Some(c) = cot.remove(dst) else { return Ok(()) };
    let (outer, n, inner) = split(env, dst, axis)?;
    let mut at = 0;
    for s in srcs {
        let (_, len, _) = split(env, s, axis)?;
        if env.get(s).is_some_and(|t| t.dtype.is_float()) {
            let into = cot_of(gpu, env, cot, s)?;
            let along = Along { outer, inner, len, n_src: n, src_at: at, n_dst: len, dst_at: 0 };
            gpu.copy_along(c.addr(), into.addr(), DType::F64, along, true).map_err(dev)?;
        }
        at += len;
    }
    Ok(())
}

/// A host step computed on the host in the forward ([`DeviceEnv::on_host`]) backwards, by the
/// host's reverse sweep ([`crate::check::ground::reverse`]) over copies of what it read and
/// made and of their cotangents; the cotangents of what it read come back to the device.
fn host_back(gpu: &Gpu, env: &DeviceEnv, cot: &mut HashMap<String, DeviceBuffer>, step: &Step) -> Result<(), Aside> {
    let made = step.host_writes();
    if !made.iter().any(|n| cot.contains_key(*n)) {
        return Ok(());
    }
    let mut names = step.data_reads();
    names.extend(made.iter().copied());
    let host = env.host_copies(gpu, &names)?;
    let mut host_cot = HashMap::new();
    for (name, id) in &host.names {
        if let Some(b) = cot.get(name) {
            host_cot.insert(name.clone(), gpu.download_f64(b.addr(), host.mem.get(*id).numel()).map_err(dev)?);
        }
    }
    let records = Records::default();
    let back = ground::reverse(std::slice::from_ref(step), &records, &host, host_cot, &GradOptions::default(), None, &mut Vec::new())
        .map_err(|e| e.to_string())?;
    for n in made {
        cot.remove(n);
    }
    for (name, g) in back {
        cot.insert(name, gpu.upload_f64(&g).map_err(dev)?);
    }
    Ok(())
}
