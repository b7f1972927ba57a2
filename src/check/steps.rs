//! Pipelines of steps over named tensors: kernel launches and the host steps real forward and
//! backward passes use between them (allocate; sum, mean, logsumexp or max over an axis;
//! reshape; scale; elementwise expressions with broadcasting; casts; in-place `+=`; chunks,
//! slices and concatenations along an axis; host scalars computed from data, `.item()`).
//!
//! A forward or backward pass is a list of [`Step`]s run against an [`Env`] of named tensors. The
//! same steps run natively (the kernels in their own dtypes: the user's view) and promoted to f64
//! (the ground truth); natively, every launch records which program and store wrote each element,
//! so that a report can blame the line that wrote a wrong gradient element.

use super::expr::{Expr, Scalar, Scope};
use super::notes;
use super::report::Finding;
use super::tensor_expr::{broadcast, broadcast_map, Bound, Operand, TensorExpr, Typed, Values};
use super::CheckError;
use std::sync::Arc;
use tilegrad_ir::{DType, Kernel, Lit, ParamKind};
use tilegrad_reference::{Arg, ExecError, Grid, HostTensor, Launch, Memory, Options, RaceMode, TensorId, Writers};

pub(crate) mod item;
pub(crate) mod pieces;
pub use item::ItemReduce;

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
    /// `dst = expr`, elementwise with broadcasting (see [`TensorExpr`]): computed in f64 and
    /// rounded once to the result's dtype.
    Compute {
        /// The expression.
        expr: TensorExpr,
        /// The result's dtype; `None`: torch's promotion of the operands.
        dtype: Option<DType>,
        /// New tensor.
        dst: String,
    },
    /// `dst = src.to(dtype)`.
    Cast {
        /// Source tensor.
        src: String,
        /// The new dtype.
        dtype: DType,
        /// New tensor.
        dst: String,
    },
    /// `dst = src.<op>(axis)` (a new tensor of `src`'s dtype without the axis, computed in f64
    /// and rounded once).
    Reduce {
        /// Which reduction.
        op: Reduction,
        /// Source tensor.
        src: String,
        /// Axis (negative counts from the end).
        axis: i64,
        /// New tensor.
        dst: String,
    },
    /// `dst += src` in place (`src` broadcast to `dst`'s shape, the sum rounded to `dst`'s dtype).
    Accumulate {
        /// Added tensor.
        src: String,
        /// Existing tensor, updated.
        dst: String,
    },
    /// `dsts = src.chunk(chunks, axis)`: torch's chunk sizes (see `pieces::chunk_sizes`), each
    /// chunk a new tensor (a copy, where torch gives a view).
    Chunk {
        /// Source tensor.
        src: String,
        /// How many chunks were asked for.
        chunks: usize,
        /// Axis (negative counts from the end).
        axis: i64,
        /// New tensors, one per chunk torch gives.
        dsts: Vec<String>,
    },
    /// `dst = src[start:stop:step]` along `axis` (Python's slice rules; a copy).
    Slice {
        /// Source tensor.
        src: String,
        /// Axis (negative counts from the end).
        axis: i64,
        /// Start (default 0), stop (default the axis' extent) and step (default 1).
        start: Option<Expr>,
        /// See `start`.
        stop: Option<Expr>,
        /// See `start`.
        step: Option<Expr>,
        /// New tensor.
        dst: String,
    },
    /// `dst = torch.cat(srcs, axis)` (dtypes promoted as torch promotes them).
    Cat {
        /// Source tensors.
        srcs: Vec<String>,
        /// Axis (negative counts from the end).
        axis: i64,
        /// New tensor.
        dst: String,
    },
    /// `dst = reduce(expr).item()`: a host scalar computed from this pass's tensors, a constant
    /// of later steps (no gradient flows through it).
    Item {
        /// The reduction of the expression's elements; `None`: it has one element.
        reduce: Option<ItemReduce>,
        /// The expression.
        expr: TensorExpr,
        /// The new constant.
        dst: String,
    },
}

/// A reduction over one axis besides `sum`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduction {
    /// The mean (of floats).
    Mean,
    /// `log(sum(exp(x)))`, computed stably (of floats).
    LogSumExp,
    /// The largest element (`amax`: NaN if any is NaN; ties share the cotangent evenly).
    Max,
}

impl Reduction {
    /// The spec key and method name.
    pub fn name(self) -> &'static str {
        match self {
            Reduction::Mean => "mean",
            Reduction::LogSumExp => "logsumexp",
            Reduction::Max => "max",
        }
    }

    /// Whether it is defined on floats only (as in torch).
    pub fn needs_float(self) -> bool {
        match self {
            Reduction::Mean | Reduction::LogSumExp => true,
            Reduction::Max => false,
        }
    }

    /// The reduction of `v` (`n` elements along the axis, `inner` apart, from `start`).
    pub(crate) fn apply(self, v: &[f64], start: usize, n: usize, inner: usize) -> f64 {
        let xs = (0..n).map(|k| v[start + k * inner]);
        match self {
            Reduction::Mean => xs.sum::<f64>() / n as f64,
            Reduction::Max => xs.fold(f64::NEG_INFINITY, |m, x| if x.is_nan() || m.is_nan() { f64::NAN } else { m.max(x) }),
            Reduction::LogSumExp => {
                let m = Reduction::Max.apply(v, start, n, inner);
                if !m.is_finite() {
                    // -inf (every element -inf, or none), inf or NaN, as torch gives.
                    return if m == f64::NEG_INFINITY { m } else { m + xs.sum::<f64>() * 0.0 };
                }
                m + xs.map(|x| (x - m).exp()).sum::<f64>().ln()
            }
        }
    }
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
            Step::Compute { expr, dtype: Some(d), dst } => format!("{dst} = ({expr}).to({d})"),
            Step::Compute { expr, dtype: None, dst } => format!("{dst} = {expr}"),
            Step::Cast { src, dtype, dst } => format!("{dst} = {src}.to({dtype})"),
            Step::Reduce { op, src, axis, dst } => format!("{dst} = {src}.{}({axis})", op.name()),
            Step::Accumulate { src, dst } => format!("{dst} += {src}"),
            Step::Chunk { src, chunks, axis, dsts } => format!("{} = {src}.chunk({chunks}, {axis})", dsts.join(", ")),
            Step::Slice { src, axis, start, stop, step, dst } => {
                let part = |e: &Option<Expr>| e.as_ref().map_or(String::new(), |e| e.to_string());
                let step = step.as_ref().map_or(String::new(), |e| format!(":{e}"));
                format!("{dst} = {src}[{}:{}{step}] along axis {axis}", part(start), part(stop))
            }
            Step::Cat { srcs, axis, dst } => format!("{dst} = torch.cat([{}], {axis})", srcs.join(", ")),
            Step::Item { reduce: Some(_), expr, dst } => format!("{dst} = {}.item()", expr.text().trim()),
            Step::Item { reduce: None, expr, dst } => format!("{dst} = ({}).item()", expr.text().trim()),
        }
    }

    /// The existing tensors whose values the step reads: a launch's tensor arguments, a host
    /// step's operands (a name used only for its shape or strides is not read).
    pub(crate) fn data_reads(&self) -> Vec<&str> {
        match self {
            Step::Alloc { .. } => Vec::new(),
            Step::Launch(l) => l.args.iter().filter_map(|(_, e)| e.as_name()).collect(),
            Step::Sum { src, .. }
            | Step::Reshape { src, .. }
            | Step::Scale { src, .. }
            | Step::Cast { src, .. }
            | Step::Reduce { src, .. }
            | Step::Chunk { src, .. }
            | Step::Slice { src, .. } => vec![src],
            Step::Accumulate { src, dst } => vec![src, dst],
            Step::Compute { expr, .. } | Step::Item { expr, .. } => expr.names(),
            Step::Cat { srcs, .. } => srcs.iter().map(String::as_str).collect(),
        }
    }

    /// The tensors the step writes other than through a launch: an allocation's, a host step's
    /// results, and the tensor an accumulation updates in place.
    pub(crate) fn host_writes(&self) -> Vec<&str> {
        match self {
            Step::Alloc { name, .. } => vec![name],
            Step::Sum { dst, .. }
            | Step::Reshape { dst, .. }
            | Step::Scale { dst, .. }
            | Step::Compute { dst, .. }
            | Step::Cast { dst, .. }
            | Step::Reduce { dst, .. }
            | Step::Slice { dst, .. }
            | Step::Cat { dst, .. }
            | Step::Accumulate { dst, .. } => vec![dst],
            Step::Chunk { dsts, .. } => dsts.iter().map(String::as_str).collect(),
            Step::Launch(_) | Step::Item { .. } => Vec::new(),
        }
    }
}

/// The tensors of a launch of `kernel` with `args` whose contents before it no program reads:
/// every parameter bound to them is only stored through (no load, no atomic), in a kernel
/// without `while` loops (whose progress check compares stores with what they overwrite).
fn unread_tensors(kernel: &Kernel, args: &[(String, Arg)]) -> Vec<TensorId> {
    let mut whiles = false;
    kernel.walk(&mut |_, d| whiles |= matches!(d.op, tilegrad_ir::Op::While { .. }));
    if whiles {
        return Vec::new();
    }
    let uses = tilegrad_ir::analysis::param_uses(kernel);
    let bound =
        |t: TensorId| kernel.params.iter().zip(&uses).filter(move |(p, _)| args.iter().any(|(n, a)| *n == p.name && *a == Arg::Tensor(t)));
    let mut out: Vec<TensorId> = args.iter().filter_map(|(_, a)| if let Arg::Tensor(t) = a { Some(*t) } else { None }).collect();
    out.retain(|&t| bound(t).all(|(_, u)| !u.loaded && !u.atomic));
    out.sort();
    out.dedup();
    out
}

/// What an f64 forward's record keeps of a tensor its launch never reads (see
/// [`unread_tensors`]): the ground truth's reverse sweep reads none of its values, only its
/// shape, so zeros of that shape stand for it (f32 for floats, as [`narrowed`] keeps an
/// allocation's NaNs), which the system maps only when touched, instead of a copy.
fn unread_placeholder(h: &HostTensor) -> HostTensor {
    let dtype = if h.dtype().is_float() { DType::F32 } else { h.dtype() };
    HostTensor::zeros(dtype, h.shape())
}

/// An f64 tensor whose every value is an f32 (the inputs as drawn, an `empty` allocation's NaN)
/// as a narrower tensor: one of `share` holding the same values (sharing its storage), else a
/// new f32 tensor, at half the bytes. The AD engine reads it back exactly (the records of an
/// f64 forward are its input, see `GradOptions::validated`). Any other tensor shares its storage.
fn narrowed(h: &HostTensor, share: &[HostTensor]) -> HostTensor {
    use rayon::prelude::*;
    let same = |x: f64, y: f32| x == y as f64 || (x.is_nan() && y.is_nan());
    match h.as_f64() {
        Some(v) if v.par_iter().all(|&x| x.is_nan() || x as f32 as f64 == x) => share
            .iter()
            .find(|c| c.shape() == h.shape() && c.as_f32().is_some_and(|w| v.par_iter().zip(w).all(|(&x, &y)| same(x, y))))
            .cloned()
            .unwrap_or_else(|| HostTensor::from_f32(h.shape(), v.par_iter().map(|&x| x as f32).collect())),
        _ => h.clone(),
    }
}

/// A tensor as it was before a launch wrote it: shared storage, or for a tensor whose elements
/// are all one value (a fresh allocation) that value alone, so that a trace does not keep a
/// copy of every allocation it saw filled.
#[derive(Clone, Debug)]
pub(crate) enum Snapshot {
    Tensor(HostTensor),
    /// Every element equal to the one element of the tensor, in this shape.
    Uniform(HostTensor, Vec<usize>),
}

impl Snapshot {
    fn of(h: &HostTensor) -> Snapshot {
        use tilegrad_reference::Data;
        let uniform = h.numel() > 1
            && match h.data() {
                Data::F32(v) => v.iter().all(|x| x.to_bits() == v[0].to_bits()),
                Data::F64(v) => v.iter().all(|x| x.to_bits() == v[0].to_bits()),
                Data::I32(v) => v.iter().all(|&x| x == v[0]),
                Data::I1(v) => v.iter().all(|&x| x == v[0]),
                Data::I64(_) => false,
            };
        if uniform {
            let one = HostTensor::from_f64_as(h.dtype(), &[1], &[h.get_f64(0)]);
            Snapshot::Uniform(one, h.shape().to_vec())
        } else {
            Snapshot::Tensor(h.clone())
        }
    }

    /// The tensor (`None` when a uniform one cannot be allocated again).
    pub(crate) fn tensor(&self) -> Option<HostTensor> {
        match self {
            Snapshot::Tensor(h) => Some(h.clone()),
            Snapshot::Uniform(one, shape) => HostTensor::try_full(one.dtype(), shape, one.get_f64(0)).ok(),
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
    /// Every named tensor (clones sharing their storage).
    pub(crate) fn mem_tensors(&self) -> Vec<HostTensor> {
        self.names.iter().map(|(_, t)| self.mem.get(*t).clone()).collect()
    }

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
    /// The kernels' own dtypes; masked-off lanes of loads without `other` read 0, as Triton's
    /// NVIDIA and AMD backends read them.
    Native,
    /// As [`Mode::Native`], with races resolved in program order (the highest program id's
    /// store wins) instead of failing: to still compare the gradients of a racy backward.
    ResolvingRaces,
    /// As [`Mode::Native`], on the reference's exact path: of a launch that fails in more than
    /// one way, the first error in program order.
    Exact,
    /// Every float promoted to f64 (kernels and tensors).
    F64,
    /// Every float computed and held in f32, `dot`s in IEEE f32: the same computation with
    /// uniform f32 roundings, which measures the size of what a pass's roundings act on (see
    /// [`super::verdict`]).
    F32,
}

impl Mode {
    /// The dtype every float becomes, where the mode changes them.
    pub(crate) fn float(self) -> Option<DType> {
        match self {
            Mode::Native | Mode::ResolvingRaces | Mode::Exact => None,
            Mode::F64 => Some(DType::F64),
            Mode::F32 => Some(DType::F32),
        }
    }

    /// `d` as this mode holds it.
    pub(crate) fn dtype(self, d: DType) -> DType {
        match self.float() {
            Some(f) if d.is_float() => f,
            _ => d,
        }
    }
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
    /// Each loop's largest trip count in this run (sizes the tapes of VJP kernels).
    pub max_trips: std::collections::BTreeMap<tilegrad_ir::Inst, u64>,
    /// Programs stored the same value to one element ([`tilegrad_ad::GradOptions::last_writer_only`]).
    pub same_value: bool,
}

/// What the ground truth's reverse sweep needs again of a forward run: each launch, and the
/// operands of host steps whose VJP reads their values, where a later step may overwrite them.
#[derive(Default)]
pub(crate) struct Records {
    pub launches: Vec<LaunchRecord>,
    /// Tensors (the inputs as drawn) whose storage an f64 record may share where it holds the
    /// same values (see [`narrowed`]).
    pub share: Vec<HostTensor>,
    /// `(step, tensor name, its contents when the step ran)`.
    pub snapshots: Vec<(usize, String, HostTensor)>,
}

impl Records {
    /// Tensor `name` as step `step` read it: its snapshot, else its contents in `env` (nothing
    /// overwrote it since).
    pub fn operand<'a>(&'a self, env: &'a Env, step: usize, name: &str) -> Option<&'a HostTensor> {
        self.snapshots.iter().find(|(s, n, _)| *s == step && n == name).map(|(.., t)| t).or_else(|| env.tensor(name))
    }
}

/// Where a tensor's elements came from, for blame.
#[derive(Clone, Debug)]
pub(crate) enum Origin {
    /// An input, output or cotangent handed to the pass.
    Given,
    /// Allocated by a step.
    Alloc { step: usize, init: Init },
    /// Made by a host step from other tensors.
    Host { step: usize, srcs: Vec<String> },
}

/// A launch that wrote into a tensor: its step, kernel, grid and who wrote each element.
pub(crate) type WriteLayer = (usize, Arc<Kernel>, Grid, Writers);

/// A launch as blame needs it to re-run one of its programs: its step, kernel, grid, arguments
/// (tensors as ids of the pass's environment), options, and the tensors it may write as they
/// were before it ran.
#[derive(Clone, Debug)]
pub(crate) struct TracedLaunch {
    pub step: usize,
    pub kernel: Arc<Kernel>,
    pub grid: Grid,
    pub args: Vec<(String, Arg)>,
    pub options: Options,
    pub before: Vec<(TensorId, Snapshot)>,
}

/// Per tensor: its origin and the launches that wrote into it (in order); and every launch.
#[derive(Clone, Debug, Default)]
pub(crate) struct Trace {
    pub tensors: Vec<(String, Origin, Vec<WriteLayer>)>,
    pub launches: Vec<TracedLaunch>,
    /// Launch steps below this one are the forward's ([`Trace::after_forward`]); the pass's own
    /// steps are numbered from it.
    pub forward_steps: usize,
}

impl Trace {
    pub fn get(&self, name: &str) -> Option<&(String, Origin, Vec<WriteLayer>)> {
        self.tensors.iter().find(|(n, ..)| n == name)
    }

    /// This trace of a backward preceded by the launches of its forward (`fwd`, a pass of
    /// `fwd_steps` steps), for blame to follow a load of what a forward launch wrote (a
    /// gradient it left for the backward to scale, a statistic it saved) into that launch. The
    /// forward's launches keep their steps and the backward's are numbered after them; a
    /// tensor's origin stays the backward's, or for a tensor the backward was given, the
    /// forward's allocation. The forward's `outputs` are what the ground truth differentiates:
    /// whatever computed them is right by definition, and blame does not follow them.
    pub fn after_forward(&self, fwd: &Trace, fwd_steps: usize, outputs: &[String]) -> Trace {
        let shift = |layers: &[WriteLayer]| -> Vec<WriteLayer> {
            layers.iter().map(|(s, k, g, w)| (s + fwd_steps, k.clone(), *g, w.clone())).collect()
        };
        let tensors = self
            .tensors
            .iter()
            .map(|(name, origin, layers)| {
                let before = fwd.get(name).filter(|_| !outputs.contains(name));
                let origin = match (origin, before.map(|b| &b.1)) {
                    (Origin::Given, Some(a @ Origin::Alloc { .. })) => a.clone(),
                    (o, _) => o.clone(),
                };
                let mut all: Vec<WriteLayer> = before.map_or_else(Vec::new, |b| b.2.clone());
                all.extend(shift(layers));
                (name.clone(), origin, all)
            })
            .collect();
        let mut launches = fwd.launches.clone();
        launches.extend(self.launches.iter().map(|l| TracedLaunch { step: l.step + fwd_steps, ..l.clone() }));
        Trace { tensors, launches, forward_steps: fwd_steps }
    }

    /// A launch step as the report names it: `step 2` of the pass, or `forward step 0`.
    pub fn step_name(&self, step: usize) -> String {
        match step.checked_sub(self.forward_steps) {
            Some(s) => format!("step {s}"),
            None => format!("forward step {step}"),
        }
    }

    /// A launch step as the pass numbers its steps (a forward launch keeps its forward step).
    pub fn pass_step(&self, step: usize) -> usize {
        step.checked_sub(self.forward_steps).unwrap_or(step)
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

impl StepError {
    /// What went wrong, for a message.
    pub(crate) fn message(self) -> String {
        match self {
            StepError::Spec(m) => m,
            StepError::Exec(e) => e.to_string(),
        }
    }
}

pub(crate) use tilegrad_reference::written_tensors;

/// Whether a kernel has loads whose masked-off lanes the backend fills (see [`notes`]).
pub(crate) fn has_unfilled_loads(k: &Kernel) -> bool {
    !tilegrad_ir::analysis::unfilled_loads(k).is_empty()
}

/// Runs `steps` on `env`. With `records`, every launch's tensors are snapshotted before it runs
/// (for the ground truth's reverse sweep); with `trace`, origins and writers are recorded; with
/// `notes` (the pass's name and a list), what launches rely on is noted ([`notes`]).
pub(crate) fn run(
    env: &mut Env,
    steps: &[Step],
    mode: Mode,
    mut records: Option<&mut Records>,
    mut trace: Option<&mut Trace>,
    mut notes: Option<(&'static str, &mut Vec<Finding>)>,
    exec: &super::backend::Executor,
) -> Result<(), StepFailure> {
    if let Some(t) = trace.as_deref_mut() {
        for (n, _) in &env.names {
            if t.get(n).is_none() {
                t.tensors.push((n.clone(), Origin::Given, Vec::new()));
            }
        }
    }
    for (i, step) in steps.iter().enumerate() {
        let spec = |m: String| StepFailure { step: i, error: StepError::Spec(m) };
        let scope: &Env = env;
        match step {
            Step::Alloc { name, shape, dtype, init } => {
                let shape = eval_shape(shape, scope).map_err(spec)?;
                let dtype = mode.dtype(*dtype);
                let fill = if *init == Init::Empty && dtype.is_float() { f64::NAN } else { 0.0 };
                let t = HostTensor::try_full(dtype, &shape, fill).map_err(|e| spec(format!("`{name}`: {e}")))?;
                env.add(name, t).map_err(spec)?;
                if let Some(tr) = trace.as_deref_mut() {
                    tr.tensors.push((name.clone(), Origin::Alloc { step: i, init: *init }, Vec::new()));
                }
            }
            Step::Launch(kl) => run_launch(
                env,
                kl,
                (i, step),
                mode,
                records.as_deref_mut(),
                trace.as_deref_mut(),
                notes.as_mut().map(|(p, l)| (*p, &mut **l)),
                exec,
            )?,
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
                add_host(env, trace.as_deref_mut(), dst, nt, i, &[src]).map_err(spec)?;
            }
            Step::Reshape { src, shape, dst } => {
                let nshape = eval_shape(shape, scope).map_err(spec)?;
                let t = env.tensor(src).ok_or_else(|| spec(env.need(src).unwrap_err()))?;
                if nshape.iter().product::<usize>() != t.numel() {
                    return Err(spec(format!("cannot reshape `{src}` of shape {:?} to {nshape:?}", t.shape())));
                }
                let nt = HostTensor::new(t.dtype(), &nshape, t.data().clone()).map_err(|e| spec(e.to_string()))?;
                add_host(env, trace.as_deref_mut(), dst, nt, i, &[src]).map_err(spec)?;
            }
            Step::Scale { src, factor, dst } => {
                let f = factor.eval(scope).map_err(|e| spec(format!("factor `{factor}`: {e}")))?.as_f64();
                let t = env.tensor(src).ok_or_else(|| spec(env.need(src).unwrap_err()))?;
                let v: Vec<f64> = t.to_f64_vec().iter().map(|x| x * f).collect();
                let nt = HostTensor::from_f64_as(t.dtype(), t.shape(), &v);
                add_host(env, trace.as_deref_mut(), dst, nt, i, &[src]).map_err(spec)?;
            }
            Step::Compute { expr, dtype, dst } => {
                let (bound, typed) = bind(expr, env, &|n| env.tensor(n)).map_err(spec)?;
                let d = dtype.unwrap_or(typed.dtype);
                let d = mode.dtype(d);
                let nt = HostTensor::from_f64_as(d, &typed.shape, &bound.eval());
                if let Some(r) = records.as_deref_mut() {
                    if !expr.is_affine() {
                        snapshot(r, env, steps, i, &typed.tensors);
                    }
                }
                let srcs: Vec<&String> = typed.tensors.iter().collect();
                add_host(env, trace.as_deref_mut(), dst, nt, i, &srcs).map_err(spec)?;
            }
            Step::Cast { src, dtype, dst } => {
                let t = env.tensor(src).ok_or_else(|| spec(env.need(src).unwrap_err()))?;
                let d = mode.dtype(*dtype);
                let nt = HostTensor::from_f64_as(d, t.shape(), &t.to_f64_vec());
                add_host(env, trace.as_deref_mut(), dst, nt, i, &[src]).map_err(spec)?;
            }
            Step::Reduce { op, src, axis, dst } => {
                let t = env.tensor(src).ok_or_else(|| spec(env.need(src).unwrap_err()))?;
                let shape = t.shape().to_vec();
                let Some((a, outer, n, inner)) = split_axis(&shape, *axis) else {
                    return Err(spec(format!("{} over axis {axis} of `{src}`, which has shape {shape:?}", op.name())));
                };
                if op.needs_float() && !t.dtype().is_float() {
                    return Err(spec(format!("{} of `{src}`, which is {}: cast it to a float first", op.name(), t.dtype())));
                }
                let v = t.to_f64_vec();
                let out: Vec<f64> =
                    (0..outer * inner).map(|e| op.apply(&v, (e / inner.max(1)) * n * inner + e % inner.max(1), n, inner)).collect();
                let mut nshape = shape.clone();
                nshape.remove(a);
                let nt = HostTensor::from_f64_as(t.dtype(), &nshape, &out);
                if let Some(r) = records.as_deref_mut() {
                    if *op != Reduction::Mean {
                        snapshot(r, env, steps, i, std::slice::from_ref(src));
                    }
                }
                add_host(env, trace.as_deref_mut(), dst, nt, i, &[src]).map_err(spec)?;
            }
            Step::Chunk { src, chunks, axis, dsts } => {
                let parts = pieces::chunk(env, src, *chunks, *axis, dsts.len()).map_err(spec)?;
                for (d, t) in dsts.iter().zip(parts) {
                    add_host(env, trace.as_deref_mut(), d, t, i, &[src]).map_err(spec)?;
                }
            }
            Step::Slice { src, axis, start, stop, step: by, dst } => {
                let t = pieces::slice(env, src, *axis, [start, stop, by]).map_err(spec)?;
                add_host(env, trace.as_deref_mut(), dst, t, i, &[src]).map_err(spec)?;
            }
            Step::Cat { srcs, axis, dst } => {
                let t = pieces::cat(env, srcs, *axis).map_err(spec)?;
                add_host(env, trace.as_deref_mut(), dst, t, i, &srcs.iter().collect::<Vec<_>>()).map_err(spec)?;
            }
            Step::Item { reduce, expr, dst } => item::run(env, *reduce, expr, dst).map_err(spec)?,
            Step::Accumulate { src, dst } => {
                let id = env.need(dst).map_err(spec)?;
                let s = env.tensor(src).ok_or_else(|| spec(env.need(src).unwrap_err()))?;
                let d = env.mem.get(id);
                if broadcast(s.shape(), d.shape()).as_deref() != Some(d.shape()) {
                    return Err(spec(format!("`{src}` of shape {:?} does not broadcast to `{dst}` of shape {:?}", s.shape(), d.shape())));
                }
                if !can_accumulate(s.dtype(), d.dtype()) {
                    return Err(spec(format!("cannot add `{src}` ({}) into `{dst}` ({}) in place", s.dtype(), d.dtype())));
                }
                let (sv, map) = (s.to_f64_vec(), broadcast_map(s.shape(), d.shape()));
                let v: Vec<f64> = d.to_f64_vec().iter().zip(&map).map(|(x, &k)| x + sv[k]).collect();
                let nt = HostTensor::from_f64_as(d.dtype(), d.shape(), &v);
                *env.mem.get_mut(id) = nt;
            }
        }
    }
    Ok(())
}

/// Records the contents of `names` as step `step` reads them, those a later step may overwrite.
fn snapshot(r: &mut Records, env: &Env, steps: &[Step], step: usize, names: &[String]) {
    for n in names {
        if let Some(t) = env.tensor(n).filter(|_| written_later(steps, step, n)) {
            r.snapshots.push((step, n.clone(), t.clone()));
        }
    }
}

fn add_host(env: &mut Env, trace: Option<&mut Trace>, dst: &str, t: HostTensor, step: usize, srcs: &[&String]) -> Result<(), String> {
    env.add(dst, t)?;
    if let Some(tr) = trace {
        tr.tensors.push((dst.to_string(), Origin::Host { step, srcs: srcs.iter().map(|s| s.to_string()).collect() }, Vec::new()));
    }
    Ok(())
}

/// Whether a step after `step` may write tensor `name` (a launch that is passed it, or `+=` into
/// it): then a VJP that reads its value needs a snapshot.
fn written_later(steps: &[Step], step: usize, name: &str) -> bool {
    steps[step + 1..].iter().any(|s| match s {
        Step::Launch(kl) => kl.args.iter().any(|(_, e)| e.as_name() == Some(name)),
        Step::Accumulate { dst, .. } => dst == name,
        Step::Alloc { .. }
        | Step::Sum { .. }
        | Step::Reshape { .. }
        | Step::Scale { .. }
        | Step::Compute { .. }
        | Step::Cast { .. }
        | Step::Reduce { .. }
        | Step::Chunk { .. }
        | Step::Slice { .. }
        | Step::Cat { .. }
        | Step::Item { .. } => false,
    })
}

/// What a name of an expression is in `env`, with tensors looked up by `tensor`.
fn operand_of<'a>(env: &'a Env, tensor: &dyn Fn(&str) -> Option<&'a HostTensor>, name: &str) -> Option<Operand> {
    match tensor(name) {
        Some(t) => Some(Operand::Tensor(t.dtype(), t.shape().to_vec())),
        None => env.constant(name).map(Operand::Scalar),
    }
}

/// `expr` type-checked against `env` and bound to its operands' values, tensors looked up by
/// `tensor` (the pass's tensors, or the ground truth's snapshots).
pub(crate) fn bind<'e, 'a>(
    expr: &'e TensorExpr,
    env: &'a Env,
    tensor: &dyn Fn(&str) -> Option<&'a HostTensor>,
) -> Result<(Bound<'e>, Typed), String> {
    let typed = expr.check(&|n| operand_of(env, tensor, n)).map_err(|e| format!("`{expr}`: {e}"))?;
    let mut operands = Vec::new();
    for n in expr.names() {
        let v = match tensor(n) {
            Some(t) => Values::Tensor { values: t.to_f64_vec(), map: broadcast_map(t.shape(), &typed.shape), float: t.dtype().is_float() },
            None => Values::Scalar(env.constant(n).expect("checked").as_f64()),
        };
        operands.push((n.to_string(), v));
    }
    Ok((Bound::new(expr, operands, &typed.shape), typed))
}

/// Whether `+=` may store a value of dtype `from` into a tensor of dtype `to` (torch refuses
/// float into int and int into bool).
pub(crate) fn can_accumulate(from: DType, to: DType) -> bool {
    let float_into_int = from.is_float() && !to.is_float();
    let into_bool = !from.is_bool() && to.is_bool();
    !float_into_int && !into_bool
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

/// Runs launch step `i` (`kl`; `step` describes it) on `env` in `mode`: where asked, records it
/// for the ground truth's reverse sweep, traces who wrote what, and notes what it relies on.
#[allow(clippy::too_many_arguments)]
fn run_launch(
    env: &mut Env,
    kl: &KernelLaunch,
    (i, step): (usize, &Step),
    mode: Mode,
    mut records: Option<&mut Records>,
    mut trace: Option<&mut Trace>,
    mut notes: Option<(&'static str, &mut Vec<Finding>)>,
    exec: &super::backend::Executor,
) -> Result<(), StepFailure> {
    let fail = |error| StepFailure { step: i, error };
    let spec = |m: String| StepFailure { step: i, error: StepError::Spec(m) };
    let kernel = match mode {
        Mode::Native | Mode::ResolvingRaces | Mode::Exact => kl.kernel.clone(),
        Mode::F64 | Mode::F32 => Arc::new(
            tilegrad_ir::passes::promote_floats(&kl.kernel, mode.dtype(DType::F64))
                .map_err(|e| fail(StepError::Exec(Box::new(e.into()))))?,
        ),
    };
    let (grid, args) = resolve(kl, &kernel, env).map_err(spec)?;
    exec.check_grid(&kernel.name, grid).map_err(spec)?;
    if let Some(r) = records.as_deref_mut() {
        record_launch(r, env, i, (&kernel, grid, &args), mode);
    }
    let opts = Options {
        record_writers: trace.is_some(),
        exact: mode == Mode::Exact,
        races: if mode == Mode::ResolvingRaces { RaceMode::Warn } else { RaceMode::Error },
        ..Options::default()
    };
    let mut launch = Launch::new(&kernel, grid).options(opts.clone());
    for (n, a) in &args {
        launch = launch.arg(n, *a);
    }
    if let Some(tr) = trace.as_deref_mut() {
        // The tensors it may write, as they are now: blame re-runs one program later.
        let before = written_tensors(&kernel, &args).into_iter().map(|t| (t, Snapshot::of(env.mem.get(t)))).collect();
        tr.launches.push(TracedLaunch { step: i, kernel: kernel.clone(), grid, args: args.clone(), options: opts.clone(), before });
    }
    let before = notes.as_ref().is_some_and(|_| has_unfilled_loads(&kernel)).then(|| env.mem.clone());
    let summary = exec.run(&launch, &mut env.mem).map_err(|e| match e {
        ExecError::Invalid(_) | ExecError::Argument { .. } | ExecError::Grid { .. } | ExecError::BadTensor { .. } => spec(e.to_string()),
        e => fail(StepError::Exec(Box::new(e))),
    })?;
    if let Some((pass, list)) = notes.as_mut() {
        let at = notes::At { pass, step: i, what: &step.describe() };
        if let Some(before) = &before {
            list.extend(notes::masked_lanes(&kernel, grid, &args, &opts, before, &env.mem, exec, at));
        }
        list.extend(notes::same_value(&summary, at, &|_, _| None));
    }
    if let Some(r) = records {
        if let Some(last) = r.launches.last_mut().filter(|l| l.step == i) {
            last.max_trips = summary.max_trips.clone();
            last.same_value = summary.same_value_races > 0;
        }
    }
    if let Some(tr) = trace {
        for w in summary.writers {
            let name = env.mem.name(w.tensor).to_string();
            if let Some(t) = tr.tensors.iter_mut().find(|(n, ..)| *n == name) {
                t.2.push((i, kl.kernel.clone(), grid, w));
            }
        }
    }
    Ok(())
}

/// Records launch step `i` of `kernel` on `grid` with `args` for the ground truth's reverse
/// sweep: its tensors as they are before it runs (an f64 pass keeps f64 tensors of f32 values as
/// f32, and tensors the kernel never reads as placeholders).
fn record_launch(r: &mut Records, env: &Env, i: usize, (kernel, grid, args): (&Arc<Kernel>, Grid, &[(String, Arg)]), mode: Mode) {
    let mut before = Memory::new();
    let mut names = Vec::new();
    let mut remap: Vec<(TensorId, TensorId)> = Vec::new();
    let unread = unread_tensors(kernel, args);
    let args = args
        .iter()
        .map(|(n, a)| {
            let a = match a {
                Arg::Tensor(t) => Arg::Tensor(match remap.iter().find(|(o, _)| o == t) {
                    Some((_, m)) => *m,
                    None => {
                        let h = env.mem.get(*t);
                        let kept = match mode {
                            Mode::F64 if unread.contains(t) => unread_placeholder(h),
                            Mode::F64 => narrowed(h, &r.share),
                            _ => h.clone(),
                        };
                        let m = before.add(env.mem.name(*t), kept);
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
    r.launches.push(LaunchRecord {
        step: i,
        kernel: kernel.clone(),
        grid,
        args,
        before,
        names,
        max_trips: Default::default(),
        same_value: false,
    });
}

/// Named tensors and constants a launch's arguments are resolved against: a host
/// environment, or one whose tensors live on the device.
pub(crate) trait Bindings: Scope {
    /// The tensor bound to `name`, if any.
    fn tensor_id(&self, name: &str) -> Option<TensorId>;
}

impl Bindings for Env {
    fn tensor_id(&self, name: &str) -> Option<TensorId> {
        self.id(name)
    }
}

/// Evaluates a launch's grid and arguments in `env`: tensors by name, scalars converted to the
/// parameter's dtype (`kernel`: the launch's kernel, possibly promoted).
pub(crate) fn resolve<E: Bindings>(kl: &KernelLaunch, kernel: &Kernel, env: &E) -> Result<(Grid, Vec<(String, Arg)>), String> {
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
        let a = match (&p.kind, e.as_name().and_then(|n| env.tensor_id(n))) {
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

#[cfg(test)]
mod tests {
    use super::super::backend::Executor;
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn env_with(tensors: &[(&str, HostTensor)]) -> Env {
        let mut env = Env::default();
        for (n, t) in tensors {
            env.add(n, t.clone()).unwrap();
        }
        env.constants.push(("N".into(), Scalar::Int(5)));
        env
    }

    fn random(rng: &mut StdRng, d: DType, shape: &[usize]) -> HostTensor {
        let n = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|_| rng.gen_range(-3.0..3.0)).collect();
        HostTensor::from_f64_as(d, shape, &v)
    }

    fn reduce(op: Reduction, src: &str, axis: i64, dst: &str) -> Step {
        Step::Reduce { op, src: src.into(), axis, dst: dst.into() }
    }

    #[test]
    fn reductions_match_plain_loops() {
        let mut rng = StdRng::seed_from_u64(3);
        let x = random(&mut rng, DType::F32, &[5, 7, 3]);
        let v = x.to_f64_vec();
        let mut env = env_with(&[("x", x)]);
        let steps =
            [reduce(Reduction::Mean, "x", 1, "m"), reduce(Reduction::LogSumExp, "x", -1, "l"), reduce(Reduction::Max, "x", 0, "mx")];
        run(&mut env, &steps, Mode::Native, None, None, None, &Executor::cpu()).unwrap();
        let at = |i: usize, j: usize, k: usize| v[(i * 7 + j) * 3 + k];
        let close = |name: &str, want: Vec<f64>, shape: &[usize]| {
            let t = env.tensor(name).unwrap();
            assert_eq!(t.shape(), shape, "{name}");
            assert_eq!(t.dtype(), DType::F32, "{name}");
            for (g, w) in t.to_f64_vec().iter().zip(&want) {
                assert_eq!(*g, *w as f32 as f64, "{name}");
            }
        };
        let mut m = Vec::new();
        for i in 0..5 {
            for k in 0..3 {
                m.push((0..7).map(|j| at(i, j, k)).sum::<f64>() / 7.0);
            }
        }
        close("m", m, &[5, 3]);
        let mut l = Vec::new();
        for i in 0..5 {
            for j in 0..7 {
                l.push((0..3).map(|k| at(i, j, k).exp()).sum::<f64>().ln());
            }
        }
        // Stable and naive logsumexp agree here to well within f32 rounding.
        let lt = env.tensor("l").unwrap().to_f64_vec();
        assert!(lt.iter().zip(&l).all(|(g, w)| (g - w).abs() <= 1e-6 * w.abs().max(1.0)));
        let mut mx = Vec::new();
        for j in 0..7 {
            for k in 0..3 {
                mx.push((0..5).map(|i| at(i, j, k)).fold(f64::NEG_INFINITY, f64::max));
            }
        }
        close("mx", mx, &[7, 3]);
        // logsumexp stays finite where the naive form overflows, and is -inf on a row of -inf.
        let big = HostTensor::from_f64(&[2, 2], vec![1000.0, 1000.0, f64::NEG_INFINITY, f64::NEG_INFINITY]);
        let mut env = env_with(&[("b", big)]);
        run(&mut env, &[reduce(Reduction::LogSumExp, "b", 1, "lb")], Mode::Native, None, None, None, &Executor::cpu()).unwrap();
        assert_eq!(env.tensor("lb").unwrap().to_f64_vec(), vec![1000.0 + 2f64.ln(), f64::NEG_INFINITY]);
    }

    #[test]
    fn compute_rounds_once_and_f64_mode_keeps_floats_wide() {
        let mut rng = StdRng::seed_from_u64(5);
        let x = random(&mut rng, DType::F16, &[3, 4]);
        let s = HostTensor::from_f64_as(DType::F32, &[], &[0.1]);
        let steps = [
            Step::compute("y", "x * s + N").unwrap(),
            Step::Compute { expr: TensorExpr::parse("x / 3").unwrap(), dtype: Some(DType::BF16), dst: "z".into() },
        ];
        let mut env = env_with(&[("x", x.clone()), ("s", s)]);
        run(&mut env, &steps, Mode::Native, None, None, None, &Executor::cpu()).unwrap();
        let y = env.tensor("y").unwrap();
        assert_eq!((y.dtype(), y.shape()), (DType::F16, &[3usize, 4][..]));
        let sv = 0.1f32 as f64;
        for (g, xv) in y.to_f64_vec().iter().zip(x.to_f64_vec()) {
            assert_eq!(*g, tilegrad_reference::round_to(DType::F16, xv * sv + 5.0));
        }
        assert_eq!(env.tensor("z").unwrap().dtype(), DType::BF16);
        let mut env = env_with(&[("x", HostTensor::from_f64(&[3, 4], x.to_f64_vec())), ("s", HostTensor::from_f64(&[], vec![0.1]))]);
        run(&mut env, &steps, Mode::F64, None, None, None, &Executor::cpu()).unwrap();
        let y = env.tensor("y").unwrap();
        assert_eq!(y.dtype(), DType::F64);
        assert_eq!(y.to_f64_vec()[0], x.to_f64_vec()[0] * 0.1 + 5.0);
        assert_eq!(env.tensor("z").unwrap().dtype(), DType::F64);
    }

    #[test]
    fn cast_and_accumulate() {
        let x = HostTensor::from_f64(&[2, 3], vec![0.1, -1.7, 2.5, 1e-9, 70000.0, -3.0]);
        let b = HostTensor::from_f64_as(DType::F32, &[3], &[1.0, 2.0, 3.0]);
        let mut env = env_with(&[("x", x.clone()), ("b", b)]);
        let steps = [
            Step::Cast { src: "x".into(), dtype: DType::F16, dst: "h".into() },
            Step::Cast { src: "x".into(), dtype: DType::I32, dst: "i".into() },
            Step::Accumulate { src: "b".into(), dst: "h".into() },
        ];
        run(&mut env, &steps, Mode::Native, None, None, None, &Executor::cpu()).unwrap();
        let h = env.tensor("h").unwrap();
        assert_eq!(h.dtype(), DType::F16);
        let r = |v: f64| tilegrad_reference::round_to(DType::F16, v);
        let want: Vec<f64> = x.to_f64_vec().iter().enumerate().map(|(k, &v)| r(r(v) + [1.0, 2.0, 3.0][k % 3])).collect();
        assert_eq!(h.to_f64_vec(), want);
        assert_eq!(env.tensor("i").unwrap().to_f64_vec(), vec![0.0, -1.0, 2.0, 0.0, 70000.0, -3.0]);
        // Errors: a shape that does not broadcast to dst's, a float into an int, an int mean.
        let bad = |s: Step| run(&mut env.clone(), &[s], Mode::Native, None, None, None, &Executor::cpu()).unwrap_err().error;
        let msg = |e: StepError| match e {
            StepError::Spec(m) => m,
            StepError::Exec(e) => panic!("{e}"),
        };
        assert!(msg(bad(Step::Accumulate { src: "x".into(), dst: "b".into() })).contains("does not broadcast"));
        assert!(msg(bad(Step::Accumulate { src: "b".into(), dst: "i".into() })).contains("cannot add `b` (f32) into `i` (i32)"));
        assert!(msg(bad(reduce(Reduction::Mean, "i", 0, "m"))).contains("cast it to a float first"));
        assert!(msg(bad(reduce(Reduction::Max, "i", 2, "m"))).contains("axis 2"));
        assert!(msg(bad(Step::compute("c", "x + b * nope").unwrap())).contains("column 9: no tensor or constant named `nope`"));
    }

    #[test]
    fn operands_overwritten_later_are_snapshotted_and_only_those() {
        let x = HostTensor::from_f64(&[3], vec![1.0, 2.0, 3.0]);
        let mut env = env_with(&[("x", x.clone()), ("y", x)]);
        let steps = [
            Step::compute("p", "x * y").unwrap(),
            Step::compute("q", "x + y").unwrap(),
            reduce(Reduction::LogSumExp, "x", 0, "l"),
            reduce(Reduction::Max, "y", 0, "m"),
            Step::Accumulate { src: "p".into(), dst: "x".into() },
        ];
        let mut rec = Records::default();
        run(&mut env, &steps, Mode::F64, Some(&mut rec), None, None, &Executor::cpu()).unwrap();
        let snaps: Vec<(usize, &str)> = rec.snapshots.iter().map(|(s, n, _)| (*s, n.as_str())).collect();
        // `x` is overwritten by step 4: the product and the logsumexp read it; the sum is affine.
        assert_eq!(snaps, vec![(0, "x"), (2, "x")]);
        assert_eq!(rec.operand(&env, 0, "x").unwrap().to_f64_vec(), vec![1.0, 2.0, 3.0]);
        assert_eq!(rec.operand(&env, 1, "x").unwrap().to_f64_vec(), vec![2.0, 6.0, 12.0]);
    }

    #[test]
    fn f64_records_keep_exact_f32_values_narrow_and_share_the_drawn_storage() {
        let drawn = HostTensor::from_f32(&[4], vec![1.5, -2.25, f32::NAN, 3.0e-3]);
        let exact = HostTensor::from_f64(&[4], drawn.to_f64_vec());
        let shared = narrowed(&exact, std::slice::from_ref(&drawn));
        assert!(shared.shares_storage(&drawn), "the drawn tensor's storage is reused");
        // Exact in f32 but matching no candidate: a new f32 tensor with the same values.
        let alone = narrowed(&exact, &[]);
        assert_eq!(alone.dtype(), DType::F32);
        assert!(!alone.shares_storage(&drawn));
        for (a, b) in alone.to_f64_vec().iter().zip(exact.to_f64_vec()) {
            assert!(*a == b || (a.is_nan() && b.is_nan()));
        }
        // One value not an f32: kept in f64, sharing the original's storage.
        let inexact = HostTensor::from_f64(&[3], vec![1.0, 0.1, 2.0]);
        let kept = narrowed(&inexact, std::slice::from_ref(&drawn));
        assert_eq!(kept.dtype(), DType::F64);
        assert!(kept.shares_storage(&inexact));
    }

    #[test]
    fn f64_records_keep_only_the_shape_of_what_a_launch_never_reads() {
        use tilegrad_ir::KernelBuilder;
        // `y[i] = x[i]`, `w[i] += 1` (read and written), `z += x[i]` (atomic).
        let mut b = KernelBuilder::new("k");
        let (x, y, w, z) =
            (b.ptr_param("x", DType::F64), b.ptr_param("y", DType::F64), b.ptr_param("w", DType::F64), b.ptr_param("z", DType::F64));
        let offs = b.arange(0, 4);
        let (px, py, pw) = (b.add(x, offs), b.add(y, offs), b.add(w, offs));
        let v = b.load(px, None, None);
        b.store(py, v, None);
        let old = b.load(pw, None, None);
        let one = b.f64(1.0);
        let new = b.add(old, one);
        b.store(pw, new, None);
        let pz = b.broadcast_to(z, &[4]);
        b.atomic_add(pz, v, None);
        let k = b.finish().unwrap();
        let args: Vec<(String, Arg)> =
            ["x", "y", "w", "z"].iter().enumerate().map(|(i, n)| (n.to_string(), Arg::Tensor(TensorId(i as u32)))).collect();
        assert_eq!(unread_tensors(&k, &args), vec![TensorId(1)], "only `y`");
        let kept = unread_placeholder(&HostTensor::try_full(DType::F64, &[2, 4], f64::NAN).unwrap());
        assert_eq!((kept.dtype(), kept.shape()), (DType::F32, &[2usize, 4][..]));
        assert!(kept.to_f64_vec().iter().all(|&v| v == 0.0));
    }

    #[test]
    fn snapshots_of_uniform_tensors_keep_one_value_and_give_back_the_tensor() {
        let nan = HostTensor::try_full(DType::F32, &[5, 3], f64::NAN).unwrap();
        let snap = Snapshot::of(&nan);
        assert!(matches!(snap, Snapshot::Uniform(..)));
        let back = snap.tensor().unwrap();
        assert_eq!((back.dtype(), back.shape()), (DType::F32, &[5usize, 3][..]));
        assert!(back.to_f64_vec().iter().all(|x| x.is_nan()));
        let ints = HostTensor::from_i32(&[4], vec![7, 7, 7, 7]);
        assert_eq!(Snapshot::of(&ints).tensor(), Some(ints));
        let varied = HostTensor::from_f32(&[3], vec![1.0, 1.0, 2.0]);
        let snap = Snapshot::of(&varied);
        assert!(matches!(snap, Snapshot::Tensor(_)));
        assert_eq!(snap.tensor(), Some(varied));
    }
}
