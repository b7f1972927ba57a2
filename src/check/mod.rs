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
//! true gradients, and the backward runs on the reference interpreter with its allocations
//! poisoned (NaN) and masked loads without `other` reading NaN, recording who wrote every element.
//! The [`Report`] compares them element by element and blames the worst element on the program
//! and store that wrote it. What goes wrong inside the backward (out of bounds, race, loop bound,
//! NaN, unwritten element, wrong value) is a verdict in the report; what is wrong with the forward
//! or the check's description is a [`CheckError`].
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

mod blame;
pub mod expr;
mod ground;
mod inputs;
mod report;
mod slice;
mod steps;
mod truth;

pub use expr::{Expr, ExprError, Scalar};
pub use inputs::{Dist, InputTensor, Inputs, Source};
pub use report::{Blame, BlameSite, Explained, Failure, Report, Slice, SliceLine, TensorReport, Tolerance, Worst};
pub(crate) use steps::{eval_shape as steps_eval_shape, split_axis};
pub use steps::{Env, Init, KernelLaunch, Step};
pub use tilegrad_ad::Precision;
pub use truth::{gradcheck, ground_truth, run_forward, FdTrial, GradcheckReport, GroundTruth, Named};

use std::collections::HashMap;
use steps::{Mode, StepError, Trace};
use tilegrad_ad::GradOptions;
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
    /// This build cannot do what was asked.
    #[error("unsupported: {0}")]
    Unsupported(String),
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
}

impl Forward {
    /// A forward with these differentiable inputs and outputs and no steps yet.
    pub fn new(differentiable: &[&str], outputs: &[&str]) -> Forward {
        Forward {
            steps: Vec::new(),
            differentiable: differentiable.iter().map(|s| s.to_string()).collect(),
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
            saved: Vec::new(),
        }
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
    /// A CUDA GPU.
    Gpu,
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
    /// Gradient elements to explain in the report whatever their error: (gradient tensor or its
    /// input's name, multi-index). Each gets blame and its data-flow slice ([`Report::explained`]).
    pub blame_elements: Vec<(String, Vec<usize>)>,
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
            blame_elements: Vec::new(),
        }
    }
}

/// Checks `bwd` against the ground-truth gradient of `fwd` on `inputs`.
pub fn check_backward(fwd: &Forward, bwd: &Backward, inputs: &Inputs, opts: &CheckOptions) -> Result<Report, CheckError> {
    check_backward_with(fwd, bwd, inputs, opts, "check", &mut |_, _| {})
}

/// [`check_backward`] with a name for the report and a progress callback `(done, total)` over
/// the trials.
pub fn check_backward_with(
    fwd: &Forward,
    bwd: &Backward,
    inputs: &Inputs,
    opts: &CheckOptions,
    name: &str,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Report, CheckError> {
    if opts.trials == 0 {
        return Err(CheckError::Spec("at least one cotangent trial is needed".into()));
    }
    validate_backward(fwd, bwd)?;
    let p = truth::prepare(fwd, inputs, opts)?;
    let (env_n, trace_f) = (&p.native, &p.trace);

    let fwd_tf32 = uses_tf32(&fwd.steps);
    let mut forward = Vec::new();
    for o in fwd.outputs.iter().chain(&fwd.saved) {
        let t = env_n.tensor(o).ok_or_else(|| CheckError::Spec(format!("forward tensor `{o}` is not a tensor after the forward")))?;
        if !t.dtype().is_float() && fwd.outputs.contains(o) {
            return Err(CheckError::Spec(format!("forward output `{o}` is {}, not a float tensor (list it as saved)", t.dtype())));
        }
        if let Some((step, e)) = blame::first_unwritten(trace_f, o) {
            return Err(CheckError::Forward {
                step,
                what: fwd.steps[step].describe(),
                message: format!(
                    "element {:?} of `{o}` is never written by the forward (it was allocated empty)",
                    report::unravel(e, t.shape())
                ),
            });
        }
        let tol = opts.tolerance.unwrap_or_else(|| Tolerance::for_dtype(t.dtype(), fwd_tf32));
        let exp = p.truth.tensor(o).expect("same steps").to_f64_vec();
        let (mut r, w) = report::compare(o, o, t.dtype(), t.shape(), tol, &exp, &t.to_f64_vec(), 0);
        if let (Some((w, _)), Some(worst)) = (w, r.worst.as_mut()) {
            worst.blame = Some(blame::blame(trace_f, env_n, &fwd.steps, o, w, Some((worst.expected, worst.got))));
        }
        forward.push(r);
    }

    let gopts = GradOptions { precision: opts.precision, memory_budget: opts.memory_budget, ..GradOptions::default() };
    let bwd_tf32 = uses_tf32(&bwd.steps);
    let mut gradients: Vec<Option<(TensorReport, f64)>> = vec![None; bwd.gradients.len()];
    let mut failure = None;
    let mut rng = truth::cotangent_rng(opts.seed);
    let mut explained = Vec::new();
    progress(0, opts.trials);
    for trial in 0..opts.trials {
        let mut cot = HashMap::new();
        let mut env_b = env_n.clone();
        for (o, c, h) in truth::draw_cotangents(&mut rng, env_n, &fwd.outputs)? {
            env_b.add(&format!("grad_{o}"), h).map_err(CheckError::Spec)?;
            cot.insert(o, c);
        }
        let truth = ground::reverse(&fwd.steps, &p.records, &p.truth, cot, &gopts)?;

        let mut trace_b = Trace::default();
        if let Err(f) = steps::run(&mut env_b, &bwd.steps, Mode::Poisoned, None, Some(&mut trace_b)) {
            let what = bwd.steps[f.step].describe();
            match f.error {
                StepError::Spec(message) => return Err(CheckError::Backward { step: f.step, what, message }),
                StepError::Exec(e) => {
                    failure = Some(Failure { step: f.step, what, message: e.to_string(), trial });
                    break;
                }
            }
        }
        for (gi, (input, gname)) in bwd.gradients.iter().enumerate() {
            let it = p.drawn.tensor(input).expect("validated");
            let Some(g) = env_b.tensor(gname) else {
                return Err(CheckError::Spec(format!("gradient tensor `{gname}` of input `{input}` is not defined by the backward")));
            };
            if g.shape() != it.shape() {
                failure = Some(Failure {
                    step: bwd.steps.len(),
                    what: "gradients".into(),
                    message: format!("gradient `{gname}` has shape {:?}, input `{input}` has shape {:?}", g.shape(), it.shape()),
                    trial,
                });
                break;
            }
            let exp = truth.get(input).cloned().unwrap_or_else(|| vec![0.0; it.numel()]);
            let tol = opts.tolerance.unwrap_or_else(|| Tolerance::for_dtype(g.dtype(), bwd_tf32));
            let (mut r, w) = report::compare(input, gname, g.dtype(), g.shape(), tol, &exp, &g.to_f64_vec(), trial);
            let badness = w.map_or(0.0, |(_, ratio)| ratio);
            if gradients[gi].as_ref().is_none_or(|(_, b)| badness > *b) {
                if let (Some((w, _)), Some(worst)) = (w, r.worst.as_mut()) {
                    worst.blame = Some(blame::blame(&trace_b, &env_b, &bwd.steps, gname, w, Some((worst.expected, worst.got))));
                }
                gradients[gi] = Some((r, badness));
            }
        }
        if failure.is_some() {
            break;
        }
        if trial + 1 == opts.trials {
            explained = explain_elements(opts, bwd, &env_b, &trace_b, &truth, trial)?;
        }
        progress(trial + 1, opts.trials);
    }
    let gradients: Vec<TensorReport> = gradients.into_iter().flatten().map(|(r, _)| r).collect();
    let passed = failure.is_none() && forward.iter().all(|r| r.passed) && gradients.iter().all(|r| r.passed);
    Ok(Report {
        name: name.to_string(),
        passed,
        seed: opts.seed,
        trials: opts.trials,
        precision: if opts.precision == Precision::F64 { "f64".into() } else { "native".into() },
        forward,
        gradients,
        failure,
        explained,
    })
}

/// Blame for the gradient elements [`CheckOptions::blame_elements`] asks about.
fn explain_elements(
    opts: &CheckOptions,
    bwd: &Backward,
    env: &Env,
    trace: &Trace,
    truth: &HashMap<String, Vec<f64>>,
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
        let expected = truth.get(input).map_or(0.0, |t| t[e]);
        let got = g.get_f64(e);
        let blame = Some(blame::blame(trace, env, &bwd.steps, gname, e, Some((expected, got))));
        out.push(report::Explained { tensor: gname.clone(), trial, element: Worst { index: index.clone(), expected, got, blame } });
    }
    Ok(out)
}

/// Differentiable inputs are float inputs; outputs and saved tensors are consistent.
fn validate_forward(fwd: &Forward, env: &Env) -> Result<(), CheckError> {
    if fwd.outputs.is_empty() {
        return Err(CheckError::Spec("the forward names no outputs".into()));
    }
    if fwd.differentiable.is_empty() {
        return Err(CheckError::Spec("the forward names no differentiable inputs".into()));
    }
    for d in &fwd.differentiable {
        let t = env.tensor(d).ok_or_else(|| CheckError::Spec(format!("differentiable input `{d}` is not an input")))?;
        if !t.dtype().is_float() {
            return Err(CheckError::Spec(format!("differentiable input `{d}` is {}, not a float tensor", t.dtype())));
        }
    }
    if let Some(o) = fwd.saved.iter().find(|s| fwd.outputs.contains(s)) {
        return Err(CheckError::Spec(format!("`{o}` is both an output and saved: an output is saved for the backward anyway")));
    }
    for o in &fwd.outputs {
        if env.id(&format!("grad_{o}")).is_some() {
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
            return Err(CheckError::Spec(format!("the backward must name one gradient tensor for input `{d}`, it names {n}")));
        }
    }
    for (i, _) in &bwd.gradients {
        if !fwd.differentiable.contains(i) {
            return Err(CheckError::Spec(format!(
                "the backward gives a gradient for `{i}`, which is not a differentiable input (differentiable: {})",
                fwd.differentiable.join(", ")
            )));
        }
    }
    Ok(())
}

/// The environment with every float tensor converted to f64.
fn promote(env: &Env) -> Env {
    let mut out = Env { constants: env.constants.clone(), ..Env::default() };
    for (n, t) in &env.names {
        let h = env.mem.get(*t);
        let h = if h.dtype().is_float() { HostTensor::from_f64(h.shape(), h.to_f64_vec()) } else { h.clone() };
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
