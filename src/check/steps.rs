//! Pipelines of steps over named tensors: kernel launches and the host steps real forward and
//! backward passes use between them (allocate, sum over an axis, reshape, scale).
//!
//! A forward or backward pass is a list of [`Step`]s run against an [`Env`] of named tensors. The
//! same steps run natively (the kernels in their own dtypes: the user's view) and promoted to f64
//! (the ground truth); natively, every launch records which program and store wrote each element,
//! so that a report can blame the line that wrote a wrong gradient element.

use super::expr::{Expr, Scalar, Scope};
use super::CheckError;
use std::sync::Arc;
use tilegrad_ir::{DType, Kernel, Lit, ParamKind};
use tilegrad_reference::{Arg, ExecError, Grid, HostTensor, Launch, Memory, Options, RaceMode, TensorId, Writers};

/// How an allocated tensor starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Init {
    /// Undefined contents (`torch.empty`): float elements are NaN, so an element no program
    /// writes is caught; integer elements are 0.
    Empty,
    /// Zeros (`torch.zeros`).
    Zeros,
}

/// One launch of a kernel: grid expressions (1 to 3 axes) and arguments by parameter name. An
/// argument that is the bare name of a tensor passes the tensor; any other expression is
/// evaluated to a scalar.
#[derive(Clone, Debug)]
pub struct KernelLaunch {
    /// The kernel (constexprs bound).
    pub kernel: Arc<Kernel>,
    /// Grid size per axis.
    pub grid: Vec<Expr>,
    /// Arguments by parameter name.
    pub args: Vec<(String, Expr)>,
}

impl KernelLaunch {
    /// A launch of `kernel` with no arguments yet.
    pub fn new(kernel: impl Into<Arc<Kernel>>, grid: &[&str]) -> Result<KernelLaunch, CheckError> {
        let grid =
            grid.iter().map(|g| Expr::parse(g).map_err(|e| CheckError::Spec(format!("grid `{g}`: {e}")))).collect::<Result<_, _>>()?;
        Ok(KernelLaunch { kernel: kernel.into(), grid, args: Vec::new() })
    }

    /// Binds a parameter to an expression (a tensor name, or a scalar expression).
    pub fn arg(mut self, name: &str, value: &str) -> Result<KernelLaunch, CheckError> {
        let e = Expr::parse(value).map_err(|e| CheckError::Spec(format!("argument `{name}` = `{value}`: {e}")))?;
        self.args.push((name.to_string(), e));
        Ok(self)
    }
}

/// A step of a forward or backward pass.
#[derive(Clone, Debug)]
pub enum Step {
    /// A new tensor.
    Alloc {
        /// Its name.
        name: String,
        /// Its shape.
        shape: Vec<Expr>,
        /// Its dtype.
        dtype: DType,
        /// Its contents.
        init: Init,
    },
    /// A kernel launch.
    Launch(KernelLaunch),
    /// `dst = src.sum(axis)` (a new tensor of `src`'s dtype, summed in f64 and rounded once).
    Sum {
        /// Source tensor.
        src: String,
        /// Axis (negative counts from the end).
        axis: i64,
        /// New tensor.
        dst: String,
    },
    /// `dst = src.reshape(shape)` (same elements in row-major order).
    Reshape {
        /// Source tensor.
        src: String,
        /// New shape (element counts must agree).
        shape: Vec<Expr>,
        /// New tensor.
        dst: String,
    },
    /// `dst = src * factor` (rounded to `src`'s dtype).
    Scale {
        /// Source tensor.
        src: String,
        /// Scale factor.
        factor: Expr,
        /// New tensor.
        dst: String,
    },
}

impl Step {
    /// A short description for messages and reports.
    pub fn describe(&self) -> String {
        match self {
            Step::Alloc { name, shape, dtype, init } => {
                let sh: Vec<String> = shape.iter().map(|e| e.to_string()).collect();
                format!("{name} = {}([{}], {dtype})", if *init == Init::Zeros { "zeros" } else { "empty" }, sh.join(", "))
            }
            Step::Launch(l) => {
                let g: Vec<String> = l.grid.iter().map(|e| e.to_string()).collect();
                format!("launch `{}` on grid ({})", l.kernel.name, g.join(", "))
            }
            Step::Sum { src, axis, dst } => format!("{dst} = {src}.sum({axis})"),
            Step::Reshape { src, shape, dst } => {
                let sh: Vec<String> = shape.iter().map(|e| e.to_string()).collect();
                format!("{dst} = {src}.reshape([{}])", sh.join(", "))
            }
            Step::Scale { src, factor, dst } => format!("{dst} = {src} * ({factor})"),
        }
    }
}

/// Named tensors and constants.
#[derive(Clone, Debug, Default)]
pub struct Env {
    pub(crate) mem: Memory,
    pub(crate) names: Vec<(String, TensorId)>,
    pub(crate) constants: Vec<(String, Scalar)>,
}

impl Scope for Env {
    fn constant(&self, name: &str) -> Option<Scalar> {
        self.constants.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.id(name).map(|t| self.mem.get(t).shape().to_vec())
    }
}

impl Env {
    /// The tensor named `name`.
    pub fn id(&self, name: &str) -> Option<TensorId> {
        self.names.iter().rev().find(|(n, _)| n == name).map(|(_, t)| *t)
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&HostTensor> {
        self.id(name).map(|t| self.mem.get(t))
    }

    /// Adds a tensor; a name can be defined once.
    pub fn add(&mut self, name: &str, t: HostTensor) -> Result<TensorId, String> {
        if self.id(name).is_some() {
            return Err(format!("tensor `{name}` is already defined"));
        }
        let id = self.mem.add(name, t);
        self.names.push((name.to_string(), id));
        Ok(id)
    }

    pub(crate) fn need(&self, name: &str) -> Result<TensorId, String> {
        self.id(name).ok_or_else(|| {
            let known: Vec<&str> = self.names.iter().map(|(n, _)| n.as_str()).collect();
            format!("no tensor named `{name}` (tensors: {})", known.join(", "))
        })
    }
}

/// How the steps run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The kernels' own dtypes.
    Native,
    /// The kernels' own dtypes, masked-off float lanes of loads without `other` reading NaN (the
    /// user's backward: Triton leaves them undefined).
    Poisoned,
    /// As [`Mode::Poisoned`], with races resolved in program order (the highest program id's
    /// store wins) instead of failing: to still compare the gradients of a racy backward.
    PoisonedResolvingRaces,
    /// Every float promoted to f64 (kernels and tensors).
    F64,
}

/// A launch as the ground truth needs it again for its reverse sweep: the kernel it ran, its
/// grid and arguments, and the tensors it touched as they were before it ran.
pub(crate) struct LaunchRecord {
    pub step: usize,
    pub kernel: Arc<Kernel>,
    pub grid: Grid,
    /// Arguments by parameter name; tensors are ids in `before`.
    pub args: Vec<(String, Arg)>,
    /// The launch's tensors before it ran, and their names in the pass's environment.
    pub before: Memory,
    pub names: Vec<(TensorId, String)>,
}

/// Where a tensor's elements came from, for blame.
#[derive(Clone, Debug)]
pub(crate) enum Origin {
    /// An input, output or cotangent handed to the pass.
    Given,
    /// Allocated by a step.
    Alloc { step: usize, init: Init },
    /// Made by a host step from another tensor.
    Host { step: usize, src: String },
}

/// A launch that wrote into a tensor: its step, kernel, grid and who wrote each element.
pub(crate) type WriteLayer = (usize, Arc<Kernel>, Grid, Writers);

/// Per tensor: its origin and the launches that wrote into it (in order).
#[derive(Clone, Debug, Default)]
pub(crate) struct Trace {
    pub tensors: Vec<(String, Origin, Vec<WriteLayer>)>,
}

impl Trace {
    pub fn get(&self, name: &str) -> Option<&(String, Origin, Vec<WriteLayer>)> {
        self.tensors.iter().find(|(n, ..)| n == name)
    }
}

/// A step that failed: which, and the error.
#[derive(Debug)]
pub(crate) struct StepFailure {
    pub step: usize,
    pub error: StepError,
}

#[derive(Debug)]
pub(crate) enum StepError {
    /// The spec is wrong for this step (unknown tensor, bad expression, argument mismatch).
    Spec(String),
    /// The kernel failed while running (out of bounds, race, loop bound, runtime error).
    Exec(Box<ExecError>),
}

/// Runs `steps` on `env`. With `records`, every launch's tensors are snapshotted before it runs
/// (for the ground truth's reverse sweep); with `trace`, origins and writers are recorded.
pub(crate) fn run(
    env: &mut Env,
    steps: &[Step],
    mode: Mode,
    mut records: Option<&mut Vec<LaunchRecord>>,
    mut trace: Option<&mut Trace>,
) -> Result<(), StepFailure> {
    if let Some(t) = trace.as_deref_mut() {
        for (n, _) in &env.names {
            if t.get(n).is_none() {
                t.tensors.push((n.clone(), Origin::Given, Vec::new()));
            }
        }
    }
    for (i, step) in steps.iter().enumerate() {
        let fail = |error| StepFailure { step: i, error };
        let spec = |m: String| StepFailure { step: i, error: StepError::Spec(m) };
        let scope: &Env = env;
        match step {
            Step::Alloc { name, shape, dtype, init } => {
                let shape = eval_shape(shape, scope).map_err(spec)?;
                let dtype = if mode == Mode::F64 && dtype.is_float() { DType::F64 } else { *dtype };
                let fill = if *init == Init::Empty && dtype.is_float() { f64::NAN } else { 0.0 };
                let t = HostTensor::try_full(dtype, &shape, fill).map_err(|e| spec(format!("`{name}`: {e}")))?;
                env.add(name, t).map_err(spec)?;
                if let Some(tr) = trace.as_deref_mut() {
                    tr.tensors.push((name.clone(), Origin::Alloc { step: i, init: *init }, Vec::new()));
                }
            }
            Step::Launch(kl) => {
                let kernel = match mode {
                    Mode::Native | Mode::Poisoned | Mode::PoisonedResolvingRaces => kl.kernel.clone(),
                    Mode::F64 => Arc::new(
                        tilegrad_ir::passes::promote_floats(&kl.kernel, DType::F64)
                            .map_err(|e| fail(StepError::Exec(Box::new(e.into()))))?,
                    ),
                };
                let (grid, args) = resolve(kl, &kernel, env).map_err(spec)?;
                if let Some(r) = records.as_deref_mut() {
                    let mut before = Memory::new();
                    let mut names = Vec::new();
                    let mut remap: Vec<(TensorId, TensorId)> = Vec::new();
                    let args = args
                        .iter()
                        .map(|(n, a)| {
                            let a = match a {
                                Arg::Tensor(t) => Arg::Tensor(match remap.iter().find(|(o, _)| o == t) {
                                    Some((_, m)) => *m,
                                    None => {
                                        let m = before.add(env.mem.name(*t), env.mem.get(*t).clone());
                                        remap.push((*t, m));
                                        names.push((m, env.mem.name(*t).to_string()));
                                        m
                                    }
                                }),
                                s => *s,
                            };
                            (n.clone(), a)
                        })
                        .collect();
                    r.push(LaunchRecord { step: i, kernel: kernel.clone(), grid, args, before, names });
                }
                let opts = Options {
                    poison_masked_loads: matches!(mode, Mode::Poisoned | Mode::PoisonedResolvingRaces),
                    record_writers: trace.is_some(),
                    races: if mode == Mode::PoisonedResolvingRaces { RaceMode::Warn } else { RaceMode::Error },
                    ..Options::default()
                };
                let mut launch = Launch::new(&kernel, grid).options(opts);
                for (n, a) in &args {
                    launch = launch.arg(n, *a);
                }
                let summary = launch.run(&mut env.mem).map_err(|e| match e {
                    ExecError::Invalid(_) | ExecError::Argument { .. } | ExecError::Grid { .. } | ExecError::BadTensor { .. } => {
                        spec(e.to_string())
                    }
                    e => fail(StepError::Exec(Box::new(e))),
                })?;
                if let Some(tr) = trace.as_deref_mut() {
                    for w in summary.writers {
                        let name = env.mem.name(w.tensor).to_string();
                        if let Some(t) = tr.tensors.iter_mut().find(|(n, ..)| *n == name) {
                            t.2.push((i, kl.kernel.clone(), grid, w));
                        }
                    }
                }
            }
            Step::Sum { src, axis, dst } => {
                let t = env.tensor(src).ok_or_else(|| spec(env.need(src).unwrap_err()))?;
                let shape = t.shape().to_vec();
                let Some((a, outer, n, inner)) = split_axis(&shape, *axis) else {
                    return Err(spec(format!("sum over axis {axis} of `{src}`, which has shape {shape:?}")));
                };
                let v = t.to_f64_vec();
                let mut out = vec![0.0; outer * inner];
                for o in 0..outer {
                    for k in 0..n {
                        for j in 0..inner {
                            out[o * inner + j] += v[(o * n + k) * inner + j];
                        }
                    }
                }
                let mut nshape = shape.clone();
                nshape.remove(a);
                let nt = HostTensor::from_f64_as(t.dtype(), &nshape, &out);
                add_host(env, trace.as_deref_mut(), dst, nt, i, src).map_err(spec)?;
            }
            Step::Reshape { src, shape, dst } => {
                let nshape = eval_shape(shape, scope).map_err(spec)?;
                let t = env.tensor(src).ok_or_else(|| spec(env.need(src).unwrap_err()))?;
                if nshape.iter().product::<usize>() != t.numel() {
                    return Err(spec(format!("cannot reshape `{src}` of shape {:?} to {nshape:?}", t.shape())));
                }
                let nt = HostTensor::new(t.dtype(), &nshape, t.data().clone()).map_err(|e| spec(e.to_string()))?;
                add_host(env, trace.as_deref_mut(), dst, nt, i, src).map_err(spec)?;
            }
            Step::Scale { src, factor, dst } => {
                let f = factor.eval(scope).map_err(|e| spec(format!("factor `{factor}`: {e}")))?.as_f64();
                let t = env.tensor(src).ok_or_else(|| spec(env.need(src).unwrap_err()))?;
                let v: Vec<f64> = t.to_f64_vec().iter().map(|x| x * f).collect();
                let nt = HostTensor::from_f64_as(t.dtype(), t.shape(), &v);
                add_host(env, trace.as_deref_mut(), dst, nt, i, src).map_err(spec)?;
            }
        }
    }
    Ok(())
}

fn add_host(env: &mut Env, trace: Option<&mut Trace>, dst: &str, t: HostTensor, step: usize, src: &str) -> Result<(), String> {
    env.add(dst, t)?;
    if let Some(tr) = trace {
        tr.tensors.push((dst.to_string(), Origin::Host { step, src: src.to_string() }, Vec::new()));
    }
    Ok(())
}

/// The axis `axis` of a tensor of `shape` (negative counts from the end) and the extents around
/// it: `(axis, outer, n, inner)` with `shape = [outer..., n, inner...]`; `None` when out of range.
pub(crate) fn split_axis(shape: &[usize], axis: i64) -> Option<(usize, usize, usize, usize)> {
    let rank = shape.len() as i64;
    let a = if axis < 0 { axis + rank } else { axis };
    if a < 0 || a >= rank {
        return None;
    }
    let a = a as usize;
    Some((a, shape[..a].iter().product(), shape[a], shape[a + 1..].iter().product()))
}

pub(crate) fn eval_shape(shape: &[Expr], scope: &dyn Scope) -> Result<Vec<usize>, String> {
    let dims: Vec<usize> =
        shape.iter().map(|e| e.eval_size(scope).map_err(|err| format!("shape `{e}`: {err}"))).collect::<Result<_, _>>()?;
    tilegrad_reference::checked_numel(&dims)?;
    Ok(dims)
}

/// Evaluates a launch's grid and arguments: tensors by name, scalars converted to the
/// parameter's dtype.
fn resolve(kl: &KernelLaunch, kernel: &Kernel, env: &Env) -> Result<(Grid, Vec<(String, Arg)>), String> {
    if kl.grid.is_empty() || kl.grid.len() > 3 {
        return Err(format!("a grid has 1 to 3 axes, got {}", kl.grid.len()));
    }
    let mut g = [1u32; 3];
    for (a, e) in kl.grid.iter().enumerate() {
        let v = e.eval_int(env).map_err(|err| format!("grid `{e}`: {err}"))?;
        g[a] = u32::try_from(v).ok().filter(|&v| v >= 1).ok_or_else(|| format!("grid axis {a} `{e}` is {v}, not a positive size"))?;
    }
    let mut args = Vec::new();
    for (name, e) in &kl.args {
        let Some(p) = kernel.param(name) else {
            let known: Vec<&str> = kernel.params.iter().map(|p| p.name.as_str()).collect();
            return Err(format!("kernel `{}` has no parameter `{name}` (parameters: {})", kernel.name, known.join(", ")));
        };
        let a = match (&p.kind, e.as_name().and_then(|n| env.id(n))) {
            (ParamKind::Ptr(_), Some(t)) => Arg::Tensor(t),
            (ParamKind::Ptr(d), None) => return Err(format!("parameter `{name}` is a pointer to {d}: `{e}` names no tensor")),
            (_, Some(_)) => return Err(format!("parameter `{name}` is a scalar, `{e}` is a tensor")),
            (ParamKind::Scalar(d) | ParamKind::Constexpr(d, _), None) => {
                let v = e.eval(env).map_err(|err| format!("argument `{name}` = `{e}`: {err}"))?;
                Arg::Scalar(match (v, d.is_float()) {
                    (Scalar::Int(i), false) if *d == DType::I1 => Lit::Bool(i != 0),
                    (Scalar::Int(i), false) => Lit::Int(i),
                    (v, true) => Lit::Float(v.as_f64()),
                    (Scalar::Float(x), false) => return Err(format!("parameter `{name}` is {d}, `{e}` is the float {x:?}")),
                })
            }
        };
        args.push((name.clone(), a));
    }
    Ok((Grid(g), args))
}
