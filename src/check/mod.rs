//! `check_backward`: does a hand-written backward compute the true derivative of its forward?
//!
//! A check has three parts:
//!
//! - a [`Forward`]: steps (kernel launches and host steps) that compute output tensors from input
//!   tensors, which inputs are differentiable, and which tensors are outputs;
//! - a [`Backward`]: the user's steps that, given the inputs, everything the forward computed
//!   (saved tensors such as a softmax's output or a layer norm's mean) and a cotangent
//!   `grad_<output>` per output, produce one gradient tensor per differentiable input;
//! - [`Inputs`]: named tensors, given or drawn from a seeded distribution, and named constants
//!   for the size expressions.
//!
//! The forward runs twice: in the kernels' own dtypes (what the backward sees) and promoted to
//! f64 (the ground truth; [`CheckOptions::precision`]). For each of [`CheckOptions::trials`]
//! random cotangents the ground truth's reverse sweep ([`tilegrad_ad::vjp`] per launch) gives the
//! true gradients, and the backward runs with its `empty` allocations poisoned (NaN) and the
//! masked-off lanes of loads without `other` read as 0, as Triton's GPU backends read them (a
//! launch whose results depend on them gets a note), recording who wrote every element.
//! The [`Report`] compares them element by element and blames the worst element on the program
//! and store that wrote it. What goes wrong inside the backward (out of bounds, race, loop bound,
//! NaN, unwritten element, wrong value) is a verdict in the report; what is wrong with the forward
//! or the check's description is a [`CheckError`].
//!
//! The check runs through host tensors (the `host` module: on the reference, or on the GPU with
//! each launch's tensors crossing to the device and back) or, on the GPU with the ground truth by
//! VJP kernels, with its tensors kept on the device (the `resident` module), which leaves a check
//! it cannot finish there (a failing one among them) to the first.
//!
//! ```
//! use tilegrad::check::{check_backward, Backward, CheckOptions, Forward, Inputs, KernelLaunch, Step};
//! use tilegrad_ir::triton::{convert, ConvertOptions};
//! use tilegrad_ir::DType;
//!
//! let src = r#"
//! import triton
//! import triton.language as tl
//!
//! @triton.jit
//! def square(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
//!     offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
//!     x = tl.load(x_ptr + offs, mask=offs < n)
//!     tl.store(y_ptr + offs, x * x, mask=offs < n)
//!
//! @triton.jit
//! def square_bwd(x_ptr, gy_ptr, gx_ptr, n, BLOCK: tl.constexpr):
//!     offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
//!     x = tl.load(x_ptr + offs, mask=offs < n)
//!     gy = tl.load(gy_ptr + offs, mask=offs < n)
//!     tl.store(gx_ptr + offs, 2.0 * x * gy, mask=offs < n)
//! "#;
//! let opts = ConvertOptions::with_constexprs(&[("BLOCK", 64)]);
//! let fwd_k = convert(src, "square.py", "square", &opts).unwrap();
//! let bwd_k = convert(src, "square.py", "square_bwd", &opts).unwrap();
//! let fwd = Forward::new(&["x"], &["y"])
//!     .step(Step::alloc("y", &["n"], DType::F32).unwrap())
//!     .step(Step::Launch(KernelLaunch::new(fwd_k, &["cdiv(n, 64)"]).unwrap()
//!         .arg("x_ptr", "x").unwrap().arg("y_ptr", "y").unwrap().arg("n", "n").unwrap()));
//! let bwd = Backward::new(&[("x", "grad_x")])
//!     .step(Step::alloc("grad_x", &["n"], DType::F32).unwrap())
//!     .step(Step::Launch(KernelLaunch::new(bwd_k, &["cdiv(n, 64)"]).unwrap()
//!         .arg("x_ptr", "x").unwrap().arg("gy_ptr", "grad_y").unwrap()
//!         .arg("gx_ptr", "grad_x").unwrap().arg("n", "n").unwrap()));
//! let inputs = Inputs::new().constant_int("n", 1000).random("x", DType::F32, &[1000], tilegrad::check::Dist::default());
//! let report = check_backward(&fwd, &bwd, &inputs, &CheckOptions::default()).unwrap();
//! assert!(report.passed, "{report}");
//! ```

pub(crate) mod backend;
mod blame;
pub mod chunked;
pub mod device_compare;
pub mod error_map;
pub mod expr;
mod findings;
mod folded;
mod ground;
mod helpers;
mod host;
mod html;
mod inputs;
mod kernel_facts;
pub mod notes;
mod padding;
mod recompute;
mod recorded;
mod report;
mod resident;
mod slice;
mod spectrum;
mod steps;
pub mod tensor_expr;
mod transforms;
mod truth;
pub mod verdict;
pub mod vjp_in_place;

pub use backend::{Executor, DEFAULT_MAX_PROGRAMS};
pub use expr::{Expr, ExprError, Scalar};
pub use ground::{evaluator_note, vjp_float};
pub use html::page as html_page;
pub(crate) use inputs::check_dist;
pub use inputs::{standard_normal, standard_normal_into, Dist, InputTensor, Inputs, Source};
pub use recorded::{RecordedLaunch, RecordedPass, RecordedTensor};
pub use report::{
    compare, compare_by, judge, unravel, Blame, BlameSite, Calibration, CompileTime, ErrorMap, Explained, Failure, Finding, FindingKind,
    Formula, Location, Report, Rounding, Slice, SliceLine, TensorReport, Timings, Tolerance, Worst, SCHEMA_VERSION,
};
pub(crate) use steps::{can_accumulate, eval_shape as steps_eval_shape, item as step_item, pieces as step_pieces, split_axis};
pub use steps::{Env, Init, ItemReduce, KernelLaunch, Reduction, Step};
pub use tensor_expr::TensorExpr;
pub use tilegrad_ad::Precision;
pub use truth::{gradcheck, ground_truth, run_forward, run_forward_on, run_forward_with, FdTrial, GradcheckReport, GroundTruth, Named};

use std::collections::HashMap;
use steps::{Mode, Trace};
use tilegrad_ad::GradOptions;
use tilegrad_ir::passes::promote_floats;
use tilegrad_ir::{DType, DotPrecision, Op};
use tilegrad_reference::HostTensor;

/// Why a check could not be carried out (the forward or the description is wrong; a wrong
/// backward is a failed [`Report`], not an error).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The description of the check is inconsistent.
    #[error("{0}")]
    Spec(String),
    /// The forward failed.
    #[error("forward step {step} ({what}): {message}")]
    Forward {
        /// Step (0-based).
        step: usize,
        /// The step.
        what: String,
        /// What went wrong.
        message: String,
    },
    /// The backward is described inconsistently (unknown tensor, unknown parameter, ...).
    #[error("backward step {step} ({what}): {message}")]
    Backward {
        /// Step (0-based).
        step: usize,
        /// The step.
        what: String,
        /// What went wrong.
        message: String,
    },
    /// A forward launch failed as it runs on a GPU would (out of bounds, a race, a loop past
    /// its bound): a defect of the user's forward, which [`check_backward`] reports as a failed
    /// check; other commands cannot go on without a forward.
    #[error("forward step {step} ({what}): {error}")]
    ForwardDefect {
        /// Step (0-based).
        step: usize,
        /// The step.
        what: String,
        /// What went wrong, with kernel, op, source location and program id.
        error: Box<tilegrad_reference::ExecError>,
    },
    /// This build cannot do what was asked.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Inputs or the ground truth are not finite, so no verdict can be trusted (see
    /// [`CheckOptions::allow_non_finite`]).
    #[error("{0}")]
    NonFinite(String),
}

/// The forward pass.
#[derive(Clone, Debug, Default)]
pub struct Forward {
    /// Steps, in order.
    pub steps: Vec<Step>,
    /// Inputs whose gradients are checked (float tensors).
    pub differentiable: Vec<String>,
    /// Output tensors (each gets a random cotangent `grad_<name>`).
    pub outputs: Vec<String>,
    /// Tensors the forward computes for its backward (a layer norm's mean and rstd): checked
    /// against the ground truth's forward like outputs, but without a cotangent.
    pub saved: Vec<String>,
    /// Where the cotangent of an output comes from, for the outputs named here (the others get
    /// a standard normal one).
    pub cotangents: Vec<(String, Cotangent)>,
}

/// The cotangent of one output.
#[derive(Clone, Debug, PartialEq)]
pub enum Cotangent {
    /// Drawn afresh for each trial from this distribution (`const(1)` for the gradient of a
    /// summed loss, `normal(0, 0.01)` for a small one).
    Random(Dist),
    /// These values (from a `.npy` file), the same in every trial.
    Given(HostTensor),
}

impl Forward {
    /// A forward with these differentiable inputs and outputs and no steps yet.
    pub fn new(differentiable: &[&str], outputs: &[&str]) -> Forward {
        Forward {
            steps: Vec::new(),
            differentiable: differentiable.iter().map(|s| s.to_string()).collect(),
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
            saved: Vec::new(),
            cotangents: Vec::new(),
        }
    }

    /// Sets where the cotangent of `output` comes from.
    pub fn cotangent(mut self, output: &str, c: Cotangent) -> Forward {
        self.cotangents.retain(|(n, _)| n != output);
        self.cotangents.push((output.to_string(), c));
        self
    }

    /// Declares tensors saved for the backward (checked, no cotangent).
    pub fn saved(mut self, saved: &[&str]) -> Forward {
        self.saved = saved.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Appends a step.
    pub fn step(mut self, s: Step) -> Forward {
        self.steps.push(s);
        self
    }
}

/// The backward pass under test.
#[derive(Clone, Debug, Default)]
pub struct Backward {
    /// Steps, in order.
    pub steps: Vec<Step>,
    /// For each differentiable input, the tensor holding its gradient after the steps.
    pub gradients: Vec<(String, String)>,
}

impl Backward {
    /// A backward producing these `(input, gradient tensor)` pairs, with no steps yet.
    pub fn new(gradients: &[(&str, &str)]) -> Backward {
        Backward { steps: Vec::new(), gradients: gradients.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect() }
    }

    /// Appends a step.
    pub fn step(mut self, s: Step) -> Backward {
        self.steps.push(s);
        self
    }
}

impl Step {
    /// `Alloc` of an empty (NaN-poisoned) tensor; shape entries are size expressions.
    pub fn alloc(name: &str, shape: &[&str], dtype: DType) -> Result<Step, CheckError> {
        Ok(Step::Alloc { name: name.into(), shape: parse_all(shape)?, dtype, init: Init::Empty })
    }

    /// `Compute`: `dst = expr` (a [`TensorExpr`]), the result's dtype by promotion.
    pub fn compute(dst: &str, expr: &str) -> Result<Step, CheckError> {
        let expr = TensorExpr::parse(expr).map_err(|e| CheckError::Spec(format!("`{expr}`: {e}")))?;
        Ok(Step::Compute { expr, dtype: None, dst: dst.into() })
    }

    /// `Alloc` of a zero tensor.
    pub fn zeros(name: &str, shape: &[&str], dtype: DType) -> Result<Step, CheckError> {
        Ok(Step::Alloc { name: name.into(), shape: parse_all(shape)?, dtype, init: Init::Zeros })
    }
}

fn parse_all(v: &[&str]) -> Result<Vec<Expr>, CheckError> {
    v.iter().map(|s| Expr::parse(s).map_err(|e| CheckError::Spec(format!("`{s}`: {e}")))).collect()
}

/// Where gradients are computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// The CPU reference interpreter and AD engine.
    #[default]
    Cpu,
    /// A CUDA GPU (`tilegrad-gpu`); an error when none is usable.
    Gpu,
    /// The GPU when one is usable, else the CPU.
    Auto,
    /// Every launch on both the GPU and the reference, recording where they differ (for testing
    /// the GPU backend: [`Report::backend`] lists the differences); an error without a GPU.
    Compare,
}

/// Options of a check.
#[derive(Clone, Debug)]
pub struct CheckOptions {
    /// Seed of random inputs and cotangents.
    pub seed: u64,
    /// Random cotangent trials (each runs the ground truth and the backward once).
    pub trials: usize,
    /// Tolerances for every compared tensor, instead of the defaults by dtype.
    pub tolerance: Option<Tolerance>,
    /// Precision of the ground truth: f64 (default) or the kernels' own dtypes.
    pub precision: Precision,
    /// Where to compute.
    pub backend: Backend,
    /// Memory budget of the ground truth's programs in flight.
    pub memory_budget: usize,
    /// Accept non-finite inputs and a non-finite ground truth (NaN then matches only NaN, an
    /// infinity only the same infinity). Off by default: such a check is a usage error that
    /// names the tensor and the element.
    pub allow_non_finite: bool,
    /// Gradient elements to explain in the report whatever their error: (gradient tensor or its
    /// input's name, multi-index). Each gets blame and its data-flow slice ([`Report::explained`]).
    pub blame_elements: Vec<(String, Vec<usize>)>,
    /// How the f64 ground truth is computed: by each launch's VJP kernel run on the backend
    /// where launches run on the GPU, else by the CPU evaluator ([`Ground::Auto`], default); or
    /// always one of them.
    pub ground: Ground,
    /// With the ground truth by VJP kernels on the GPU: they add in program order, as the reference
    /// does, so that the ground truth is the same bit for bit on every run and both backends
    /// (slower: programs take turns). Without it, the hardware's order of float atomics makes
    /// f64 sums differ by about 1e-16 from run to run.
    pub deterministic: bool,
    /// With [`Ground::Kernels`]: bytes a VJP kernel's launch may take (its tensors, shadows and
    /// loop tapes); its programs run in batches whose tapes fit, at least one program each (where
    /// not even one program's tapes fit, its loops keep checkpoints and run each segment again).
    /// `None`: 80% of the GPU's free memory, or 4 GiB (or `memory_budget`, if larger) on the CPU,
    /// at most a quarter of the memory the process may still take.
    pub vjp_memory: Option<u64>,
    /// Notes fail the check: a launch whose results depend on the masked-off lanes of loads
    /// without `other` (read as 0, as Triton's GPU backends read them), or programs that
    /// conflict on an element with an outcome that does not depend on their order.
    pub strict: bool,
    /// Programs a launch may run: a larger grid is refused before it runs, naming the kernel
    /// and the grid (default [`backend::DEFAULT_MAX_PROGRAMS`]).
    pub max_programs: u64,
    /// On the GPU with the ground truth by VJP kernels, keep the check's tensors on the device where it can
    /// (default; see the `resident` module): only figures come to the host (and for a failing
    /// gradient's blame, the passes run again traced and that gradient with its truth), and a
    /// check that needs what only the host computes runs again through host copies. Off: every
    /// launch's tensors cross to the device and back.
    pub device_resident: bool,
}

/// How the ground truth of launches is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Ground {
    /// [`Ground::Kernels`] where launches run on the GPU, else [`Ground::Evaluator`]: on the GPU
    /// the ground truth runs where the launches do, on the CPU the evaluator is the faster.
    #[default]
    Auto,
    /// The evaluator of `tilegrad-ad` on the CPU (authoritative).
    Evaluator,
    /// Each launch's VJP kernel ([`tilegrad_ad::vjp_kernel()`]), run on the check's backend: on
    /// the GPU with `--backend gpu`. Kernels it does not take yet (loops inside loops, loops
    /// carrying pointers, loops or branches loading what the kernel writes) are an
    /// error that names the op. At native precision ([`CheckOptions::precision`]) they compute
    /// in f32 (f64 for kernels with f64 values): faster, with shadows half the size; the
    /// calibration of tolerances stays on the evaluator.
    Kernels,
}

impl CheckOptions {
    /// The executor these options ask for.
    pub(crate) fn executor(&self) -> Result<backend::Executor, CheckError> {
        Ok(backend::Executor::new(self.backend)?
            .deterministic(self.deterministic)
            .vjp_memory(self.vjp_memory)
            .max_programs(self.max_programs))
    }

    /// The executor of VJP kernels where the ground truth is computed by them.
    fn kernels_ground<'e>(&self, exec: &'e backend::Executor) -> Option<&'e backend::Executor> {
        self.by_kernels(exec.on_gpu()).then_some(exec)
    }

    /// Whether launches' VJP kernels compute the ground truth, on a backend running launches on
    /// the GPU or not.
    pub(crate) fn by_kernels(&self, on_gpu: bool) -> bool {
        match self.ground {
            Ground::Auto => on_gpu,
            Ground::Evaluator => false,
            Ground::Kernels => true,
        }
    }
}

impl Default for CheckOptions {
    fn default() -> CheckOptions {
        CheckOptions {
            seed: 0,
            trials: 2,
            tolerance: None,
            precision: Precision::F64,
            backend: Backend::Cpu,
            memory_budget: GradOptions::default().memory_budget,
            allow_non_finite: false,
            blame_elements: Vec::new(),
            ground: Ground::Auto,
            deterministic: false,
            vjp_memory: None,
            strict: false,
            max_programs: backend::DEFAULT_MAX_PROGRAMS,
            device_resident: true,
        }
    }
}

/// The most cotangent trials a check or gradcheck runs: each redraws every cotangent and reruns
/// the ground truth and the backward; past this many a typo is likelier than a plan.
pub const MAX_TRIALS: usize = 100_000;

/// At least one trial, at most [`MAX_TRIALS`].
pub(crate) fn check_trials(trials: usize) -> Result<(), CheckError> {
    match trials {
        0 => Err(CheckError::Spec("at least one cotangent trial is needed (trials = 0)".into())),
        t if t > MAX_TRIALS => Err(CheckError::Spec(format!(
            "{t} trials: at most {MAX_TRIALS} (each redraws the cotangents and reruns the ground truth and the backward)"
        ))),
        _ => Ok(()),
    }
}

/// Checks `bwd` against the ground-truth gradient of `fwd` on `inputs`.
pub fn check_backward(fwd: &Forward, bwd: &Backward, inputs: &Inputs, opts: &CheckOptions) -> Result<Report, CheckError> {
    check_backward_with(fwd, bwd, inputs, opts, "check", &mut |_, _, _| {})
}

/// [`check_backward`] with a name for the report and a progress callback `(phase, done, total)`:
/// the phase starting now, and the cotangent trials done of all.
pub fn check_backward_with(
    fwd: &Forward,
    bwd: &Backward,
    inputs: &Inputs,
    opts: &CheckOptions,
    name: &str,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<Report, CheckError> {
    check_trials(opts.trials)?;
    validate_backward(fwd, bwd)?;
    progress("inputs and forward", 0, opts.trials);
    let start = std::time::Instant::now();
    let exec = opts.executor()?;
    let mut r = check_on((fwd, bwd, inputs), opts, &exec, (name, start), progress)?;
    if let Some(g) = exec.gpu() {
        r.timings.compiles = g.compiles_since(start).iter().map(|c| report::CompileTime::of(c, start)).collect();
    }
    Ok(r)
}

/// [`check_backward_with`] on `exec`, started at `start`.
fn check_on(
    (fwd, bwd, inputs): (&Forward, &Backward, &Inputs),
    opts: &CheckOptions,
    exec: &Executor,
    (name, start): (&str, std::time::Instant),
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<Report, CheckError> {
    let bwd_tf32 = uses_tf32(&bwd.steps);
    let fwd_tf32 = uses_tf32(&fwd.steps);
    let replay32 = replays_in_f32(fwd, bwd, inputs, opts);
    let on_device = resident::eligible(fwd, bwd, opts, exec);
    if let (true, Some(g)) = (on_device, exec.gpu()) {
        // Its draws, conversions and comparisons, beside the kernels.
        g.precompile_utilities(false);
    }
    let ahead = if exec.on_gpu() { kernels_ahead(fwd, bwd, opts, inputs, (on_device, replay32)) } else { Vec::new() };
    // Every kernel compiles in the background, each launch waiting for its own: the forward
    // runs once its kernels are compiled, while the backward's compile beside it, and the VJP
    // kernels (run last, and the longest to compile: the causal attention's, seconds) in a
    // batch of their own.
    let (vjps, now): (Vec<_>, Vec<_>) = ahead.iter().map(|(k, v, p)| (k, *v, *p)).partition(|(_, vjp, _)| *vjp);
    exec.precompile_in_background(&now, false);
    exec.precompile_in_background(&vjps, false);
    drop(ahead);
    let mut before = Timings::default();
    if exec.on_gpu() {
        before.phases.push(("GPU context and kernels set to compile".into(), start.elapsed().as_secs_f64()));
    }
    if on_device {
        if let Some(r) = resident::check((fwd, bwd, inputs), opts, exec, name, &mut before, progress) {
            return Ok(r);
        }
    }
    let mut p = match truth::prepare(fwd, inputs, opts, replay32, exec) {
        Err(CheckError::ForwardDefect { step, what, error }) => {
            let mut r = Report::new(name.into(), opts.seed, opts.trials, precision_name(opts), Vec::new(), Vec::new(), None);
            r.findings.push(findings::of_error(&error, "forward", step, 0));
            r.forward_failure = Some(Failure { step, what, message: error.to_string(), trial: 0 });
            r.passed = false;
            r.backend = exec.describe();
            return Ok(r);
        }
        p => p?,
    };
    let mut tm = std::mem::take(&mut p.timings);
    tm.phases.splice(0..0, before.phases);
    host::HostCheck { fwd, bwd, inputs, opts, exec, fwd_tf32, bwd_tf32 }.run(p, tm, name, progress)
}

/// What a check found, before its report is made.
pub(crate) struct Found {
    /// The forward's outputs and saved tensors compared.
    forward: Vec<TensorReport>,
    /// Each gradient's report of its worst trial, and how bad that was.
    gradients: Vec<Option<(TensorReport, f64)>>,
    /// The first trial's verdicts and elementwise scale, per gradient.
    first: Vec<Option<(report::Formula, report::Rounding, f64)>>,
    failure: Option<Failure>,
    findings: Vec<Finding>,
    provisional: bool,
    explained: Vec<Explained>,
}

impl Found {
    /// Blames the worst element of each of `to_blame` (gradient, worst element), whose reports
    /// are those of the backward `bwd` that ran on `env` as `trace` tells, with `samples` of
    /// every gradient that trial compared.
    fn blame_worst(&mut self, bwd: &Backward, (env, trace): (&Env, &Trace), to_blame: &[(usize, usize)], samples: &spectrum::Samples) {
        for &(gi, w) in to_blame {
            let gname = &bwd.gradients[gi].1;
            if let Some(worst) = self.gradients[gi].as_mut().and_then(|(r, _)| r.worst.as_mut()) {
                let values = Some((worst.expected, worst.got));
                worst.blame = Some(blame::blame(trace, env, &bwd.steps, gname, w, values, samples));
            }
        }
    }

    /// Nothing found yet about `gradients` gradients, the forward compared as `forward`.
    fn new(forward: Vec<TensorReport>, gradients: usize) -> Found {
        Found {
            forward,
            gradients: vec![None; gradients],
            first: vec![None; gradients],
            failure: None,
            findings: Vec::new(),
            provisional: false,
            explained: Vec::new(),
        }
    }

    /// The report of check `name`.
    fn report(self, name: &str, opts: &CheckOptions, tm: Timings, exec: &Executor, notes: Vec<Finding>) -> Report {
        // A later trial's table carries the first trial's verdicts.
        let gradients: Vec<TensorReport> = self
            .gradients
            .into_iter()
            .zip(self.first)
            .filter_map(|(g, v)| {
                let (mut r, _) = g?;
                if let (None, Some((f, ro, _))) = (&r.formula, v) {
                    verdict::apply(&mut r, (f, ro), opts.tolerance.is_some());
                }
                Some(r)
            })
            .collect();
        let forward = self.forward;
        let passed = self.failure.is_none() && forward.iter().all(|r| r.passed) && gradients.iter().all(|r| r.passed);
        let mut all = Vec::new();
        all.extend(forward.iter().filter_map(|r| findings::of_tensor("forward", r)));
        all.extend(self.findings);
        all.extend(gradients.iter().filter_map(|r| findings::of_tensor("backward", r)));
        let report = Report {
            schema_version: report::SCHEMA_VERSION,
            name: name.to_string(),
            passed,
            seed: opts.seed,
            trials: opts.trials,
            precision: precision_name(opts),
            forward,
            gradients,
            gradients_provisional: self.provisional,
            failure: self.failure,
            forward_failure: None,
            findings: all,
            notes: Vec::new(),
            strict: false,
            explained: self.explained,
            timings: tm,
            backend: exec.describe(),
            backend_mismatches: exec.mismatches(),
        };
        report.with_notes(notes, opts.strict)
    }
}

/// Whether a check replays its passes in f32 too: a replay in f32 measures the size of what
/// roundings act on, where the passes compute in narrower floats than f32 (else the pass as
/// written is that replay).
fn replays_in_f32(fwd: &Forward, bwd: &Backward, inputs: &Inputs, opts: &CheckOptions) -> bool {
    let narrow = inputs.tensors.iter().any(|t| is_narrow(input_dtype(t))) || computes_narrow(fwd, bwd);
    opts.precision == Precision::F64 && (uses_tf32(&bwd.steps) || uses_tf32(&fwd.steps) || narrow)
}

/// The report's name of [`CheckOptions::precision`].
fn precision_name(opts: &CheckOptions) -> String {
    if opts.precision == Precision::F64 { "f64" } else { "native" }.into()
}

/// [`report::compare`] of a tensor in its own dtype against f64 values, without an f64 copy;
/// `terms`: the least scale `atol` is relative to ([`verdict::elementwise_scale`]).
fn compare_tensor(
    name: &str,
    tensor: &str,
    t: &HostTensor,
    tol: Tolerance,
    expected: &[f64],
    trial: usize,
    terms: f64,
) -> (TensorReport, Option<(usize, f64)>) {
    use tilegrad_reference::Data;
    match t.data() {
        Data::F32(v) => report::compare_by(name, tensor, t.dtype(), t.shape(), tol, expected, |i| v[i] as f64, trial, terms),
        Data::F64(v) => report::compare_by(name, tensor, t.dtype(), t.shape(), tol, expected, |i| v[i], trial, terms),
        _ => {
            let v = t.to_f64_vec();
            report::compare_by(name, tensor, t.dtype(), t.shape(), tol, expected, |i| v[i], trial, terms)
        }
    }
}

/// Root-mean-square of values (1 for none).
fn rms(v: impl Iterator<Item = f64>) -> f64 {
    let (mut s, mut n) = (0.0, 0usize);
    for x in v {
        s += x * x;
        n += 1;
    }
    if n == 0 || s == 0.0 {
        1.0
    } else {
        (s / n as f64).sqrt()
    }
}

/// Gradient `name` of `it_numel` elements in a replay, as f64 values (borrowed where f64).
fn replayed<'r>(r: &'r Option<HashMap<String, HostTensor>>, name: &str, it_numel: usize) -> Option<std::borrow::Cow<'r, [f64]>> {
    let t = r.as_ref()?.get(name).filter(|t| t.numel() == it_numel)?;
    Some(t.as_f64().map_or_else(|| std::borrow::Cow::Owned(t.to_f64_vec()), std::borrow::Cow::Borrowed))
}

/// The backward replayed in `mode` (every float in f64, or in f32) on the forward `env` as
/// that mode computed it, with the cotangents `cot`: its gradient tensors, or `None` where the
/// replay fails (a decision the replay makes otherwise; then no formula verdict).
/// In f64 the cotangents' own storage is lent to the replay (and taken back, as it was: a
/// backward writing its `grad_output` in place writes a copy).
fn replay(
    bwd: &Backward,
    env: &Env,
    mode: Mode,
    cot: &mut HashMap<String, Vec<f64>>,
    exec: &backend::Executor,
) -> Option<HashMap<String, HostTensor>> {
    let mut env = env.clone();
    let mut lent = Vec::new();
    for (o, c) in cot.iter_mut() {
        let shape = env.tensor(o)?.shape().to_vec();
        let h = match mode.float()? {
            DType::F64 => {
                let h = HostTensor::from_f64(&shape, std::mem::take(c));
                lent.push((o.clone(), h.clone()));
                h
            }
            d => HostTensor::from_f64_as(d, &shape, c),
        };
        env.add(&format!("grad_{o}"), h).ok()?;
    }
    let ran = steps::run(&mut env, &bwd.steps, mode, None, None, None, exec);
    let out = bwd.gradients.iter().filter_map(|(_, g)| Some((g.clone(), env.tensor(g)?.clone()))).collect();
    drop(env);
    for (o, h) in lent {
        if let tilegrad_reference::Data::F64(v) = h.into_data() {
            cot.insert(o, v);
        }
    }
    tilegrad_reference::release_buffers();
    ran.ok().map(|_| out)
}

/// `env` for a replay of `steps`: a tensor whose values no step reads (the forward's input of
/// a backward that reads only saved outputs) shares the storage of `native`'s tensor of that
/// name instead, so that a replay holds no wide copy of it.
fn lean(mut env: Env, native: &Env, steps: &[Step]) -> Env {
    let read: std::collections::HashSet<&str> = steps.iter().flat_map(Step::data_reads).collect();
    for (n, id) in &env.names {
        match native.tensor(n) {
            Some(t) if !read.contains(n.as_str()) && t.shape() == env.mem.get(*id).shape() => *env.mem.get_mut(*id) = t.clone(),
            _ => {}
        }
    }
    env
}

/// Whether some step of the passes computes in f16 or bf16 (an allocation, a cast, a kernel
/// value).
fn computes_narrow(fwd: &Forward, bwd: &Backward) -> bool {
    fwd.steps.iter().chain(&bwd.steps).any(|s| match s {
        Step::Alloc { dtype, .. } | Step::Cast { dtype, .. } => is_narrow(*dtype),
        Step::Compute { dtype, .. } => dtype.is_some_and(is_narrow),
        Step::Launch(l) => l.kernel.values.iter().any(|v| v.ty.dtype().is_some_and(is_narrow)),
        _ => false,
    })
}

/// Whether `step` may write into the existing tensor `name`: a launch passing it to a pointer
/// parameter that some store or atomic writes through, or an in-place `+=` into it.
fn step_writes(step: &Step, name: &str) -> bool {
    match step {
        Step::Launch(kl) => {
            let uses = tilegrad_ir::analysis::param_uses(&kl.kernel);
            kl.kernel
                .params
                .iter()
                .zip(&uses)
                .any(|(p, u)| (u.stored || u.atomic) && kl.args.iter().any(|(n, e)| *n == p.name && e.as_name() == Some(name)))
        }
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
    }
}

/// Whether a step of `steps` makes the tensor `name` (an allocation or a host step's result).
fn defined_by(steps: &[Step], name: &str) -> bool {
    steps.iter().any(|s| !matches!(s, Step::Accumulate { .. }) && s.host_writes().contains(&name))
}

/// The dtype of an input tensor.
fn input_dtype(t: &InputTensor) -> DType {
    match &t.source {
        Source::Given(h) => h.dtype(),
        Source::Random { dtype, .. } | Source::Slices { dtype, .. } => *dtype,
    }
}

/// f16 or bf16: dtypes whose default tolerances are loose.
pub fn is_narrow(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16)
}

/// What a tensor the backward was given is, for messages.
fn given_what(fwd: &Forward, inputs: &Inputs, name: &str) -> String {
    if let Some(o) = fwd.outputs.iter().find(|o| format!("grad_{o}") == name) {
        format!("it is the cotangent of output `{o}` as given to the backward")
    } else if inputs.tensors.iter().any(|t| t.name == name) {
        "it is an input of the forward as given".into()
    } else {
        "it is a tensor of the forward as the forward left it".into()
    }
}

/// A usage error for a non-finite value where finite values are needed.
fn non_finite(what: String, x: f64, index: Vec<usize>, why: &str) -> CheckError {
    CheckError::NonFinite(format!(
        "{what} is {} at {index:?}: {why}; a check against a non-finite ground truth cannot tell a right backward from a \
         wrong one (allow it with `allow_non_finite`)",
        if x.is_nan() { "NaN".to_string() } else { format!("{x}") }
    ))
}

/// How many times the rounding noise of the ground truth in the kernels' dtypes a gradient's
/// normwise error may be.
const NOISE_FACTOR: f64 = 3.0;

/// The calibrated normwise tolerance of a gradient of dtype `d` (see [`report::Calibration`]):
/// `truth` in f64, `noisy` the ground truth computed in the kernels' dtypes, `got` the checked
/// gradient; `tf32` when a tf32 `dot` computes it. Both are measured against the truth rounded to
/// `d` (the best a backward can store), so that the rounding every result of `d` has does not
/// drown a small systematic error.
pub fn calibration(d: DType, tf32: bool, truth: &[f64], noisy: &[f64], got: &[f64]) -> report::Calibration {
    let rounded: Vec<f64> = truth.iter().map(|&x| tilegrad_reference::round_to(d, x)).collect();
    let dist = |v: &[f64]| v.iter().zip(&rounded).map(|(a, b)| (tilegrad_reference::round_to(d, *a) - b).powi(2)).sum::<f64>().sqrt();
    let scale = truth.iter().map(|x| x * x).sum::<f64>().sqrt().max(f64::MIN_POSITIVE);
    let noise = dist(noisy) / scale;
    // Half a unit of roundoff of the dtype (of tf32 where a tf32 `dot` computes the gradient):
    // what a correct backward computing in that dtype, rather than as the forward does, may err.
    let unit = match d {
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        _ if tf32 => 2f64.powi(-11),
        _ => 2f64.powi(-24),
    };
    let limit = (NOISE_FACTOR * noise).max(0.5 * unit);
    let err = dist(got) / scale;
    let margin = if err.is_nan() {
        0.0
    } else if err > 0.0 {
        limit / err
    } else {
        f64::INFINITY
    };
    report::Calibration { noise, limit, error: err, margin }
}

/// Blame for the gradient elements [`CheckOptions::blame_elements`] asks about;
/// `expected(input, e)`: the true gradient of `input` at flat element `e`.
fn explain_elements(
    opts: &CheckOptions,
    bwd: &Backward,
    (env, trace): (&Env, &Trace),
    expected: &dyn Fn(&str, usize) -> Result<f64, CheckError>,
    trial: usize,
) -> Result<Vec<report::Explained>, CheckError> {
    let mut out = Vec::new();
    for (name, index) in &opts.blame_elements {
        let Some((input, gname)) = bwd.gradients.iter().find(|(i, g)| g == name || i == name) else {
            let known: Vec<&str> = bwd.gradients.iter().map(|(_, g)| g.as_str()).collect();
            return Err(CheckError::Spec(format!("`{name}` is not a gradient of the backward (gradients: {})", known.join(", "))));
        };
        let g = env.tensor(gname).ok_or_else(|| CheckError::Spec(format!("gradient tensor `{gname}` is not defined by the backward")))?;
        let shape = g.shape();
        if index.len() != shape.len() || index.iter().zip(shape).any(|(i, n)| i >= n) {
            return Err(CheckError::Spec(format!("element {index:?} is outside `{gname}`, of shape {shape:?}")));
        }
        let e = index.iter().zip(shape).fold(0usize, |acc, (i, n)| acc * n + i);
        let expected = expected(input, e)?;
        let got = g.get_f64(e);
        let blame = Some(blame::blame(trace, env, &bwd.steps, gname, e, Some((expected, got)), &[]));
        out.push(report::Explained { tensor: gname.clone(), trial, element: Worst { index: index.clone(), expected, got, blame } });
    }
    Ok(out)
}

/// The kernels a check launches, to compile ahead (`(kernel, whether a VJP kernel, programs of
/// its largest launch as far as [`programs_ahead`] tells)`): the
/// forward's in their dtypes and, for the f64 ground truth, promoted; the backward's; with
/// [`Ground::Kernels`], the forward launches' VJP kernels as the ground truth most likely builds
/// them (its records keep the tensors whose values are all f32s as f32: inputs and fresh
/// allocations; a guess that misses costs one compile, on a core of its own).
///
/// `resident`: the check keeps its tensors on the device ([`resident`]), where the ground
/// truth's tensors are f64 (on the host, its records hold f64 tensors of f32 values as f32).
/// The backward's kernels promoted to f64 are its replay's; with `replay32`, both passes'
/// kernels promoted to f32 too.
fn kernels_ahead(
    fwd: &Forward,
    bwd: &Backward,
    opts: &CheckOptions,
    inputs: &Inputs,
    (resident, replay32): (bool, bool),
) -> Vec<(tilegrad_ir::Kernel, bool, u64)> {
    let f64_truth = opts.precision == Precision::F64;
    let launched = |steps: &[Step]| -> Vec<(std::sync::Arc<tilegrad_ir::Kernel>, u64)> {
        steps
            .iter()
            .filter_map(|s| if let Step::Launch(kl) = s { Some((kl.kernel.clone(), programs_ahead(kl, inputs))) } else { None })
            .collect()
    };
    let mut out: Vec<_> = launched(&bwd.steps).iter().map(|(k, p)| ((**k).clone(), false, *p)).collect();
    if f64_truth {
        let replayed = launched(&bwd.steps).into_iter().filter_map(|(k, p)| Some((promote_floats(&k, DType::F64).ok()?, false, p)));
        out.extend(replayed.collect::<Vec<_>>());
    }
    for (k, programs) in launched(&fwd.steps) {
        out.push(((*k).clone(), false, programs));
        let truth = if f64_truth {
            match promote_floats(&k, DType::F64) {
                Ok(t) => t,
                Err(_) => continue,
            }
        } else {
            (*k).clone()
        };
        if opts.by_kernels(true) {
            let declared = |name: &str| match k.param(name).map(|p| p.kind.clone()) {
                Some(tilegrad_ir::ParamKind::Ptr(d)) => Some(d),
                _ => None,
            };
            let stored = |name: &str, d: DType| match declared(name) {
                _ if resident => d,
                Some(DType::F64) | None => d,
                Some(_) if f64_truth => DType::F32,
                Some(o) => o,
            };
            if let Ok(vk) = tilegrad_ad::vjp_kernel_as(&truth, &stored, ground::vjp_float(&truth, opts.precision)) {
                out.push((vk.kernel, true, programs));
            }
        }
        if f64_truth {
            out.push((truth, false, programs));
        }
    }
    if replay32 {
        // The replays in f32 of both passes.
        for (k, programs) in launched(&fwd.steps).into_iter().chain(launched(&bwd.steps)) {
            out.extend(promote_floats(&k, DType::F32).ok().map(|k| (k, false, programs)));
        }
    }
    out
}

/// The programs of a launch as far as its grid can be told before the check runs: its axes
/// evaluated with the constants and the inputs' shapes, or `u64::MAX` where one names anything
/// else (a tensor the steps allocate).
fn programs_ahead(kl: &KernelLaunch, inputs: &Inputs) -> u64 {
    struct Known<'a>(&'a Inputs);
    impl expr::Scope for Known<'_> {
        fn constant(&self, name: &str) -> Option<Scalar> {
            self.0.constants.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
        }
        fn shape(&self, name: &str) -> Option<Vec<usize>> {
            self.0.tensors.iter().find(|t| t.name == name).map(|t| match &t.source {
                Source::Given(h) => h.shape().to_vec(),
                Source::Random { shape, .. } | Source::Slices { shape, .. } => shape.clone(),
            })
        }
    }
    kl.grid.iter().try_fold(1u64, |n, e| n.checked_mul(u64::try_from(e.eval_int(&Known(inputs)).ok()?).ok()?)).unwrap_or(u64::MAX)
}

/// Differentiable inputs are float inputs; outputs and saved tensors are consistent.
fn validate_forward(fwd: &Forward, env: &Env) -> Result<(), CheckError> {
    validate_forward_by(fwd, &|n| env.tensor(n).map(HostTensor::dtype))
}

/// [`validate_forward`] against the inputs' dtypes by name (`None`: not an input).
fn validate_forward_by(fwd: &Forward, dtype_of: &dyn Fn(&str) -> Option<DType>) -> Result<(), CheckError> {
    if fwd.outputs.is_empty() {
        return Err(CheckError::Spec("the forward names no outputs".into()));
    }
    if fwd.differentiable.is_empty() {
        return Err(CheckError::Spec("the forward names no differentiable inputs".into()));
    }
    for d in &fwd.differentiable {
        let t = dtype_of(d).ok_or_else(|| CheckError::Spec(format!("differentiable input `{d}` is not an input")))?;
        if !t.is_float() {
            return Err(CheckError::Spec(format!("differentiable input `{d}` is {t}, not a float tensor")));
        }
    }
    if let Some(o) = fwd.saved.iter().find(|s| fwd.outputs.contains(s)) {
        return Err(CheckError::Spec(format!("`{o}` is both an output and saved: an output is saved for the backward anyway")));
    }
    for o in &fwd.outputs {
        if dtype_of(&format!("grad_{o}")).is_some() {
            return Err(CheckError::Spec(format!("input `grad_{o}` clashes with the cotangent of output `{o}`")));
        }
    }
    Ok(())
}

/// Each differentiable input has exactly one gradient tensor, and nothing else has one.
fn validate_backward(fwd: &Forward, bwd: &Backward) -> Result<(), CheckError> {
    for d in &fwd.differentiable {
        let n = bwd.gradients.iter().filter(|(i, _)| i == d).count();
        if n != 1 {
            return Err(CheckError::Spec(format!(
                "backward.gradients: the backward must name one gradient tensor for input `{d}`, it names {n}"
            )));
        }
    }
    for (i, _) in &bwd.gradients {
        if !fwd.differentiable.contains(i) {
            return Err(CheckError::Spec(format!(
                "backward.gradients.{i}: the backward gives a gradient for `{i}`, which is not a differentiable input (differentiable: {})",
                fwd.differentiable.join(", ")
            )));
        }
    }
    Ok(())
}

/// The environment with every float tensor converted to f64.
fn promote(env: &Env) -> Env {
    promote_to(env, DType::F64)
}

/// `env` with every float tensor converted to `to`.
fn promote_to(env: &Env, to: DType) -> Env {
    let mut out = Env { constants: env.constants.clone(), ..Env::default() };
    for (n, t) in &env.names {
        let h = env.mem.get(*t);
        let h = if h.dtype().is_float() && h.dtype() != to { HostTensor::from_f64_as(to, h.shape(), &h.to_f64_vec()) } else { h.clone() };
        out.add(n, h).expect("names are distinct");
    }
    out
}

/// Some launch runs a tf32 `dot` on f32 operands.
fn uses_tf32(steps: &[Step]) -> bool {
    steps.iter().any(|s| match s {
        Step::Launch(l) => {
            let mut found = false;
            l.kernel.walk(&mut |_, d| {
                if let Op::Dot { precision: DotPrecision::Tf32 } = d.op {
                    found |= d.args.iter().any(|&a| l.kernel.ty(a).dtype() == Some(DType::F32));
                }
            });
            found
        }
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_sizes_are_told_ahead_where_constants_and_inputs_tell_them() {
        let mut b = tilegrad_ir::KernelBuilder::new("k");
        b.program_id(0);
        let k = std::sync::Arc::new(b.finish().unwrap());
        let inputs = Inputs::new().constant_int("ROWS", 1000).random("x", DType::F32, &[37, 5], Dist::default());
        let at = |grid: &[&str]| programs_ahead(&KernelLaunch::new(k.clone(), grid).unwrap(), &inputs);
        assert_eq!(at(&["cdiv(ROWS, 16)"]), 63);
        assert_eq!(at(&["cdiv(ROWS, 16)", "x.shape[0]", "2"]), 63 * 37 * 2);
        // A tensor the steps allocate, or an unknown constant: not told, taken as large.
        assert_eq!(at(&["y.shape[0]"]), u64::MAX);
        assert_eq!(at(&["cdiv(COLS, 4)"]), u64::MAX);
    }

    /// The default ground truth is the VJP kernels' where launches run on the GPU, the
    /// evaluator's on the CPU; either, asked for, is that one on both.
    #[test]
    fn the_ground_truth_runs_where_the_launches_do_unless_asked_otherwise() {
        let o = |ground| CheckOptions { ground, ..CheckOptions::default() };
        assert_eq!(CheckOptions::default().ground, Ground::Auto);
        assert_eq!([o(Ground::Auto).by_kernels(true), o(Ground::Auto).by_kernels(false)], [true, false]);
        assert_eq!([o(Ground::Kernels).by_kernels(true), o(Ground::Kernels).by_kernels(false)], [true, true]);
        assert_eq!([o(Ground::Evaluator).by_kernels(true), o(Ground::Evaluator).by_kernels(false)], [false, false]);
        let cpu = o(Ground::Auto).executor().unwrap();
        assert!(o(Ground::Auto).kernels_ground(&cpu).is_none());
        assert!(o(Ground::Kernels).kernels_ground(&cpu).is_some());
    }
}
