//! The ground truth of a whole forward pass: the reverse sweep over its steps.
//!
//! Cotangents live per tensor name. A launch's VJP ([`tilegrad_ad::vjp`]) maps the cotangents
//! of the final contents of the tensors it touched to cotangents of their contents before it ran
//! (every float tensor of the launch is both an input and, where it has a cotangent, an output, so
//! that untouched elements pass theirs through); a host step's VJP is its transpose (sum over an
//! axis -> broadcast, reshape -> reshape, scale -> scale, cast -> identity, `dst += src` -> the
//! cotangent of `dst` passes through and `src` gets it summed over the axes it was broadcast
//! along), or for a nonlinear step its derivative at the operands as the step read them (an
//! elementwise expression is differentiated per element in reverse over its instructions; mean,
//! logsumexp and max per reduced row; a chunk or a slice scatters its pieces' cotangents back
//! into the source's positions, a concatenation splits its cotangent among its sources; a host
//! scalar from `item` carries none); an allocation ends its tensor's cotangent. Integer and
//! bool tensors get no cotangent.

use super::backend::Executor;
use super::report::{Finding, FindingKind, Location};
use super::steps::{bind, pieces, split_axis, Records, Reduction, Step};
use super::tensor_expr::broadcast_map;
use super::{CheckError, Env};
use std::collections::HashMap;
use tilegrad_ad::vjp_kernel::{gradient_by_kernel, TapeBounds};
use tilegrad_ad::{vjp, vjp_kernel_for, AdError, GradOptions, VjpKernel};
use tilegrad_ir::{DType, Elem};
use tilegrad_reference::Launch;

/// Cotangents of the tensors of `env` before `steps` ran, from cotangents of their contents
/// after. `records` are the launches of `steps` as they ran (with their tensors before) and the
/// operands of host steps that later steps overwrote. With `kernels`, each launch's VJP kernel
/// runs there; a launch whose VJP kernel is refused (a pattern VJP kernels do not take) is
/// differentiated by the evaluator on the host instead, and gets a note in `notes`.
pub(crate) fn reverse(
    steps: &[Step],
    records: &Records,
    env: &Env,
    mut cot: HashMap<String, Vec<f64>>,
    opts: &GradOptions,
    kernels: Option<&Executor>,
    notes: &mut Vec<Finding>,
) -> Result<HashMap<String, Vec<f64>>, CheckError> {
    // The recorded launches ran with every check, and their records may hold f64 tensors
    // narrowed (see `steps::narrowed`).
    let opts = &GradOptions { validated: true, ..opts.clone() };
    // The launches' VJP kernels, built first and compiled ahead together.
    let mut vks: HashMap<usize, Result<VjpKernel, tilegrad_ad::AdError>> = HashMap::new();
    if let Some(exec) = kernels {
        for r in records.launches.iter().filter(|r| !r.same_value) {
            let launch = record_launch(r);
            let vk = match exec.refuses_vjp_kernel(&launch) {
                Some(refused) => Err(refused),
                None => vjp_kernel_for(&launch, &r.before, vjp_float(&r.kernel, opts.precision)),
            };
            vks.insert(r.step, vk);
        }
        let programs: HashMap<usize, u64> = records.launches.iter().map(|r| (r.step, r.grid.programs())).collect();
        let ahead: Vec<_> = vks.iter().filter_map(|(step, v)| Some((&v.as_ref().ok()?.kernel, true, programs[step]))).collect();
        exec.precompile(&ahead);
    }
    for (i, step) in steps.iter().enumerate().rev() {
        let at = |m: String| CheckError::Forward { step: i, what: step.describe(), message: m };
        match step {
            Step::Alloc { name, .. } => {
                cot.remove(name);
            }
            Step::Launch(_) => {
                let r = records.launches.iter().find(|r| r.step == i).expect("every launch step is recorded");
                let floats: Vec<_> = r.names.iter().filter(|(t, _)| r.before.get(*t).dtype().is_float()).collect();
                if !floats.iter().any(|(_, n)| cot.contains_key(n)) {
                    continue;
                }
                // The output cotangents move into the VJP, which gives back those before the
                // launch: only of tensors whose earlier contents matter (not one allocated just
                // before, whose cotangent its allocation would drop).
                let outputs: Vec<_> = floats.iter().filter_map(|(t, n)| cot.remove(n).map(|c| (*t, c))).collect();
                let touches = |j: usize, n: &str| records.launches.iter().any(|r| r.step == j && r.names.iter().any(|(_, m)| m == n));
                let wanted: Vec<_> = floats.iter().filter(|(_, n)| contents_matter(steps, i, n, &touches)).collect();
                let inputs: Vec<_> = wanted.iter().map(|(t, _)| *t).collect();
                let by = match kernels {
                    // The evaluator where programs stored the same value to one element (its
                    // cotangent goes to the last store only, which VJP kernels do not tell).
                    Some(exec) if !r.same_value => By::Kernel(exec, Box::new(vks.remove(&i).expect("built for every launch"))),
                    _ => By::Evaluator,
                };
                let g = launch_vjp(r, by, &inputs, &outputs, opts, &format!("forward step {i} ({})", step.describe())).map_err(at)?;
                if let Some(n) = g.note {
                    notes.push(Finding { step: Some(i), ..n });
                }
                drop(outputs);
                for ((_, n), gi) in wanted.iter().zip(g.inputs) {
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
            Step::Compute { expr, dst, .. } => {
                let Some(c) = cot.remove(dst) else { continue };
                if !is_float(env, dst) {
                    continue;
                }
                let (bound, _) = bind(expr, env, &|n| records.operand(env, i, n)).map_err(at)?;
                for (n, g) in bound.vjp(&c) {
                    add(&mut cot, &n, &g);
                }
            }
            Step::Cast { src, dst, .. } => {
                let Some(c) = cot.remove(dst) else { continue };
                if is_float(env, src) && is_float(env, dst) {
                    add(&mut cot, src, &c);
                }
            }
            Step::Reduce { op, src, axis, dst } => {
                let Some(c) = cot.remove(dst) else { continue };
                let x = records.operand(env, i, src).expect("ran forward");
                if !x.dtype().is_float() {
                    continue;
                }
                let (_, outer, n, inner) = split_axis(x.shape(), *axis).expect("the forward ran this reduction");
                let v = x.to_f64_vec();
                let mut g = vec![0.0; v.len()];
                for (e, &ce) in c.iter().enumerate().take(outer * inner) {
                    let start = (e / inner.max(1)) * n * inner + e % inner.max(1);
                    let row = (0..n).map(|k| start + k * inner);
                    match op {
                        Reduction::Mean => row.for_each(|j| g[j] = ce / n as f64),
                        Reduction::LogSumExp => {
                            let lse = op.apply(&v, start, n, inner);
                            row.for_each(|j| g[j] = ce * (v[j] - lse).exp());
                        }
                        Reduction::Max => {
                            let m = op.apply(&v, start, n, inner);
                            let ties: Vec<usize> = row.filter(|&j| v[j] == m).collect();
                            ties.iter().for_each(|&j| g[j] = ce / ties.len() as f64);
                        }
                    }
                }
                add(&mut cot, src, &g);
            }
            Step::Chunk { src, chunks, axis, dsts } => {
                let shape = env.tensor(src).expect("ran forward").shape();
                let (a, ..) = split_axis(shape, *axis).expect("the forward ran this chunk");
                let pieces: Vec<_> = dsts.iter().zip(pieces::chunk_positions(shape, *chunks, a)).collect();
                scatter(&mut cot, env, src, a, &pieces);
            }
            Step::Slice { src, axis, start, stop, step: by, dst } => {
                let shape = env.tensor(src).expect("ran forward").shape();
                let (a, ..) = split_axis(shape, *axis).expect("the forward ran this slice");
                let [start, stop, by] = pieces::bounds([start, stop, by], env).map_err(at)?;
                let pos = pieces::slice_positions(shape[a], start, stop, by).map_err(at)?;
                scatter(&mut cot, env, src, a, &[(dst, pos)]);
            }
            Step::Cat { srcs, axis, dst } => {
                let Some(c) = cot.remove(dst) else { continue };
                let shape = env.tensor(dst).expect("ran forward").shape();
                let (a, ..) = split_axis(shape, *axis).expect("the forward ran this cat");
                let extents: Vec<usize> = srcs.iter().map(|s| env.tensor(s).expect("ran forward").shape()[a]).collect();
                for (s, pos) in srcs.iter().zip(pieces::cat_positions(&extents)) {
                    if is_float(env, s) {
                        let g: Vec<f64> = pieces::along(shape, a, &pos).into_iter().map(|k| c[k]).collect();
                        add(&mut cot, s, &g);
                    }
                }
            }
            Step::Item { .. } => {}
            Step::Accumulate { src, dst } => {
                let Some(c) = cot.get(dst) else { continue };
                if !is_float(env, src) {
                    continue;
                }
                let (s, d) = (env.tensor(src).expect("ran forward"), env.tensor(dst).expect("ran forward"));
                let mut g = vec![0.0; s.numel()];
                for (k, ck) in broadcast_map(s.shape(), d.shape()).into_iter().zip(c) {
                    g[k] += ck;
                }
                add(&mut cot, src, &g);
            }
        }
    }
    Ok(cot)
}

/// How a launch is differentiated: by its VJP kernel (or why it has none) on an executor, or by
/// the evaluator.
enum By<'e> {
    Kernel(&'e Executor, Box<Result<VjpKernel, AdError>>),
    Evaluator,
}

/// A launch's cotangents of its `inputs` before it ran, and the note of a refused VJP kernel.
struct LaunchVjp {
    inputs: Vec<Vec<f64>>,
    note: Option<Finding>,
}

/// The VJP of recorded launch `r` (`what` says which step it is): cotangents of `inputs` before
/// it from those of `outputs` after it. A refused VJP kernel falls back to the evaluator, with a
/// note; any other failure is the error's message.
fn launch_vjp(
    r: &super::steps::LaunchRecord,
    by: By,
    inputs: &[tilegrad_reference::TensorId],
    outputs: &[(tilegrad_reference::TensorId, Vec<f64>)],
    opts: &GradOptions,
    what: &str,
) -> Result<LaunchVjp, String> {
    let launch = record_launch(r);
    let evaluator = || -> Result<Vec<Vec<f64>>, String> {
        let o = GradOptions { last_writer_only: r.same_value, ..opts.clone() };
        vjp(&launch, &r.before, inputs, outputs, &o).map(|g| g.inputs).map_err(|e| e.to_string())
    };
    let (exec, vk) = match by {
        By::Evaluator => return Ok(LaunchVjp { inputs: evaluator()?, note: None }),
        By::Kernel(exec, vk) => (exec, *vk),
    };
    match vk {
        Err(refused @ AdError::Unsupported { .. }) => Ok(LaunchVjp { inputs: evaluator()?, note: Some(evaluator_note(&refused, what)) }),
        Err(e) => Err(format!("--ground kernels: {e}")),
        Ok(vk) => {
            // On the GPU (unless every launch is compared with the reference's), the VJP kernel
            // runs on device copies of the launch's tensors.
            if exec.on_gpu() && !exec.comparing() {
                if let Some(g) = super::vjp_in_place::vjp_through_device(exec, &launch, &vk, &r.before, (inputs, outputs), &r.max_trips)? {
                    return Ok(LaunchVjp { inputs: g, note: None });
                }
            }
            let mut run = |l: &Launch, m: &mut tilegrad_reference::Memory| exec.run_vjp(l, m).map(|_| ()).map_err(AdError::from);
            let bounds = TapeBounds { max_trips: &r.max_trips, memory: exec.vjp_launch_memory(opts.memory_budget as u64) };
            let g = gradient_by_kernel(&vk, &launch, &r.before, inputs, outputs, bounds, &mut run).map_err(|e| e.to_string())?;
            Ok(LaunchVjp { inputs: g, note: None })
        }
    }
}

/// The note of a forward launch (`what` says which step it is) whose VJP kernel was refused
/// with `refused`, an [`AdError::Unsupported`]: its ground truth is the evaluator's.
pub fn evaluator_note(refused: &AdError, what: &str) -> Finding {
    let mut f = Finding::new(FindingKind::GroundByEvaluator, "forward");
    let why = match refused {
        AdError::Unsupported { kernel, op, loc, message } => {
            let l = Location { file: loc.file.to_string(), line: loc.line, col: loc.col, kernel: kernel.clone(), op: op.clone() };
            let why = format!("its VJP kernel is refused at `{op}` {}:{}:{} of kernel `{kernel}`: {message}", l.file, l.line, l.col);
            f.locations.push(l);
            why
        }
        other => format!("its VJP kernel is refused: {other}"),
    };
    f.message = format!("{what}: ground truth by the evaluator on the host, not by a VJP kernel\n{}", wrap(&why, 94));
    f
}

/// `text` in lines of at most `width` characters, broken between words.
fn wrap(text: &str, width: usize) -> String {
    let mut lines: Vec<String> = vec![String::new()];
    for word in text.split_whitespace() {
        let last = lines.last_mut().expect("one line at least");
        if !last.is_empty() && last.len() + 1 + word.len() > width {
            lines.push(word.to_string());
        } else {
            if !last.is_empty() {
                last.push(' ');
            }
            last.push_str(word);
        }
    }
    lines.join("\n")
}

/// Whether the contents of tensor `name` before step `i` can have a cotangent that reaches
/// anything: not when the step that last touched it was its allocation (whose cotangent the
/// allocation drops), conservatively yes otherwise.
///
/// `launch_touches(j, name)`: whether the launch of step `j` took tensor `name`.
pub(crate) fn contents_matter(steps: &[Step], i: usize, name: &str, launch_touches: &dyn Fn(usize, &str) -> bool) -> bool {
    for (j, step) in steps[..i].iter().enumerate().rev() {
        match step {
            Step::Alloc { name: a, .. } if a == name => return false,
            Step::Alloc { .. } => {}
            Step::Launch(_) => {
                if launch_touches(j, name) {
                    return true;
                }
            }
            host => {
                if host.host_writes().contains(&name) {
                    return true;
                }
            }
        }
    }
    true
}

/// Adds the cotangents of `pieces` (tensors and their positions along axis `a` of `src`) into
/// `src`'s at those positions (a float `src` only).
fn scatter(cot: &mut HashMap<String, Vec<f64>>, env: &Env, src: &str, a: usize, pieces: &[(&String, Vec<usize>)]) {
    let shape = env.tensor(src).expect("ran forward").shape().to_vec();
    for (dst, pos) in pieces {
        let Some(c) = cot.remove(*dst) else { continue };
        if !is_float(env, src) {
            continue;
        }
        let mut g = vec![0.0; shape.iter().product()];
        for (k, ck) in pieces::along(&shape, a, pos).into_iter().zip(c) {
            g[k] += ck;
        }
        add(cot, src, &g);
    }
}

fn is_float(env: &Env, name: &str) -> bool {
    env.tensor(name).is_some_and(|t| t.dtype().is_float())
}

/// Adds `g` into the cotangent of `name`.
fn add(cot: &mut HashMap<String, Vec<f64>>, name: &str, g: &[f64]) {
    let s = cot.entry(name.to_string()).or_insert_with(|| vec![0.0; g.len()]);
    s.iter_mut().zip(g).for_each(|(a, b)| *a += b);
}

/// A recorded launch, launchable again.
fn record_launch(r: &super::steps::LaunchRecord) -> Launch<'_> {
    let mut launch = Launch::new(&r.kernel, r.grid);
    for (n, a) in &r.args {
        launch = launch.arg(n, *a);
    }
    launch
}

/// The dtype a launch's VJP kernel computes in: f64 for the f64 ground truth; at native
/// precision f32, or f64 for a kernel with f64 values (f16 and bf16 values are computed in f32,
/// more precisely than the evaluator's native rules round them).
pub fn vjp_float(k: &tilegrad_ir::Kernel, precision: tilegrad_ad::Precision) -> DType {
    let f64_values = k.values.iter().any(|v| matches!(v.ty.elem, Elem::Num(DType::F64) | Elem::Ptr(DType::F64)));
    if precision == tilegrad_ad::Precision::F64 || f64_values {
        DType::F64
    } else {
        DType::F32
    }
}
