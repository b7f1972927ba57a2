//! The forward and its ground truth: the preparation every check shares (the forward run in the
//! kernels' dtypes and as the ground truth computes it, and the random cotangents), and what needs
//! no backward to check: the forward's outputs (`tilegrad run`), the ground-truth gradients for a random cotangent (`tilegrad grad`,
//! written as `.npy` for users' own harnesses), and the engine's self-check against central
//! finite differences (`tilegrad gradcheck`).

use super::backend::Executor;
use super::steps::{self, Mode, Trace};
use super::{ground, inputs, promote, validate_forward, Backend, CheckError, CheckOptions, Env, Forward, Inputs, Precision, Timings};
use serde::Serialize;
use std::collections::HashMap;
use std::fmt;
use tilegrad_ad::GradOptions;
use tilegrad_reference::HostTensor;

/// The usage error of a forward step that failed.
pub(crate) fn forward_err(fwd: &Forward) -> impl Fn(steps::StepFailure) -> CheckError + '_ {
    move |f| CheckError::Forward { step: f.step, what: fwd.steps[f.step].describe(), message: f.error.message() }
}

/// The error of a forward step that failed: a defect of the forward's kernels where one of its
/// launches failed as it would on a GPU, else a usage error.
fn forward_defect(fwd: &Forward) -> impl Fn(steps::StepFailure) -> CheckError + '_ {
    move |f| match f.error {
        steps::StepError::Exec(error) => CheckError::ForwardDefect { step: f.step, what: fwd.steps[f.step].describe(), error },
        e => CheckError::Forward { step: f.step, what: fwd.steps[f.step].describe(), message: e.message() },
    }
}

/// Tensors by name.
pub type Named = Vec<(String, HostTensor)>;

/// Runs the forward in the kernels' own dtypes; returns the inputs as drawn and the outputs and
/// saved tensors, by name.
pub fn run_forward(fwd: &Forward, inputs: &Inputs, seed: u64) -> Result<(Named, Named), CheckError> {
    run_forward_on(fwd, inputs, seed, Backend::Cpu).map(|(i, o, _)| (i, o))
}

/// [`run_forward`] on a backend; also says where the launches ran.
pub fn run_forward_on(fwd: &Forward, inputs: &Inputs, seed: u64, backend: Backend) -> Result<(Named, Named, String), CheckError> {
    run_forward_with(fwd, inputs, &CheckOptions { seed, backend, ..CheckOptions::default() })
}

/// [`run_forward_on`] with the seed, backend and launch limits of `opts`.
pub fn run_forward_with(fwd: &Forward, inputs: &Inputs, opts: &CheckOptions) -> Result<(Named, Named, String), CheckError> {
    let exec = opts.executor()?;
    let env0 = inputs.materialise(opts.seed)?;
    let mut env = env0.clone();
    steps::run(&mut env, &fwd.steps, Mode::Native, None, None, None, &exec).map_err(forward_err(fwd))?;
    Ok((
        named(&env0, inputs.tensors.iter().map(|t| t.name.as_str()))?,
        named(&env, fwd.outputs.iter().chain(&fwd.saved).map(String::as_str))?,
        exec.describe(),
    ))
}

fn named<'a>(env: &Env, names: impl Iterator<Item = &'a str>) -> Result<Vec<(String, HostTensor)>, CheckError> {
    names
        .map(|n| {
            env.tensor(n).map(|t| (n.to_string(), t.clone())).ok_or_else(|| CheckError::Spec(format!("no tensor `{n}` after the forward")))
        })
        .collect()
}

/// Ground-truth gradients for one random cotangent.
#[derive(Clone, Debug)]
pub struct GroundTruth {
    /// The inputs, as drawn.
    pub inputs: Vec<(String, HostTensor)>,
    /// The forward's outputs and saved tensors, computed in the kernels' dtypes.
    pub outputs: Vec<(String, HostTensor)>,
    /// The cotangent of each output (by output name; a backward sees it as `grad_<output>`),
    /// in the output's dtype.
    pub cotangents: Vec<(String, HostTensor)>,
    /// The gradient of each differentiable input (by input name), f64.
    pub gradients: Vec<(String, HostTensor)>,
    /// How the ground truth was computed where it matters: launches whose VJP kernel was
    /// refused and that the evaluator differentiated instead (`--ground kernels`).
    pub notes: Vec<super::Finding>,
}

/// A forward run twice: in the kernels' own dtypes (traced, for blame) and as the ground truth
/// sees it (promoted to f64 unless the precision is native), with its launches recorded for the
/// reverse sweep.
pub(crate) struct Prepared {
    /// The inputs as drawn.
    pub drawn: Env,
    /// After the forward, in the kernels' dtypes.
    pub native: Env,
    /// Who wrote what in `native`.
    pub trace: Trace,
    /// After the forward, as the ground truth computes it.
    pub truth: Env,
    /// The launches of the ground truth's forward.
    pub records: steps::Records,
    /// After the forward with every float in f32, when asked for (see [`super::verdict`]).
    pub f32: Option<Env>,
    /// Seconds spent so far, by phase.
    pub timings: Timings,
    /// What the forward's launches rely on ([`super::notes`]).
    pub notes: Vec<super::Finding>,
}

/// Runs the forward both ways; with `replay32`, a third time with every float in f32.
pub(crate) fn prepare(
    fwd: &Forward,
    inputs: &Inputs,
    opts: &CheckOptions,
    replay32: bool,
    exec: &Executor,
) -> Result<Prepared, CheckError> {
    let mut timings = Timings::default();
    let drawn = timings.time("inputs", || inputs.materialise(opts.seed))?;
    validate_forward(fwd, &drawn)?;
    if !opts.allow_non_finite {
        timings.time("inputs", || check_finite_inputs(&drawn, inputs))?;
    }
    let mut native = drawn.clone();
    let mut trace = Trace::default();
    let mut notes = Vec::new();
    timings
        .time("forward in the kernels' dtypes", || {
            steps::run(&mut native, &fwd.steps, Mode::Native, None, Some(&mut trace), Some(("forward", &mut notes)), exec)
        })
        .map_err(forward_defect(fwd))?;
    tilegrad_reference::release_buffers();
    let f64_mode = opts.precision == Precision::F64;
    let mut truth = if f64_mode { promote(&drawn) } else { drawn.clone() };
    let mut records = steps::Records { share: drawn.mem_tensors(), ..steps::Records::default() };
    timings
        .time("forward of the ground truth", || {
            steps::run(&mut truth, &fwd.steps, if f64_mode { Mode::F64 } else { Mode::Native }, Some(&mut records), None, None, exec)
        })
        .map_err(forward_err(fwd))?;
    tilegrad_reference::release_buffers();
    let f32 = match replay32 {
        true => Some(timings.time("replay in f32", || -> Result<Env, CheckError> {
            let mut env = super::promote_to(&drawn, tilegrad_ir::DType::F32);
            steps::run(&mut env, &fwd.steps, Mode::F32, None, None, None, exec).map_err(forward_err(fwd))?;
            Ok(env)
        })?),
        false => None,
    };
    Ok(Prepared { drawn, native, trace, truth, records, f32, timings, notes })
}

/// Every float input is finite: with a NaN or an infinity among the inputs the ground truth is
/// not finite either, and NaN would match NaN whatever the backward computes.
fn check_finite_inputs(drawn: &Env, inputs: &Inputs) -> Result<(), CheckError> {
    for t in &inputs.tensors {
        let Some(h) = drawn.tensor(&t.name) else { continue };
        if !h.dtype().is_float() {
            continue;
        }
        let bad = match h.data() {
            tilegrad_reference::Data::F32(v) => v.iter().position(|x| !x.is_finite()),
            tilegrad_reference::Data::F64(v) => v.iter().position(|x| !x.is_finite()),
            _ => None,
        };
        if let Some((i, x)) = bad.map(|i| (i, h.get_f64(i))) {
            return Err(CheckError::NonFinite(format!(
                "input `{}` is {} at {:?} ({}): a check on non-finite inputs cannot tell a right backward from a wrong \
                 one (allow it with `allow_non_finite`)",
                t.name,
                if x.is_nan() { "NaN".to_string() } else { format!("{x}") },
                super::report::unravel(i, h.shape()),
                match &t.source {
                    inputs::Source::Given(_) => "given".to_string(),
                    inputs::Source::Random { dist, .. } => format!("{dist:?}"),
                    inputs::Source::Slices { parts, .. } => format!("slices {parts:?}"),
                }
            )));
        }
    }
    Ok(())
}

/// The generator of the cotangents of a check (trial 0 of `check` and `grad` draw the same).
pub(crate) fn cotangent_rng(seed: u64) -> inputs::Keys {
    inputs::Keys::new(seed ^ 0x9e37_79b9_7f4a_7c15)
}

/// A cotangent per output of `env` (random normal, or as `fwd.cotangents` says), rounded to the
/// output's dtype so that the ground truth and the checked backward see the same values: as f64
/// and as a tensor.
pub(crate) fn draw_cotangents(rng: &mut inputs::Keys, env: &Env, fwd: &Forward) -> Result<Vec<(String, Vec<f64>, HostTensor)>, CheckError> {
    fwd.outputs
        .iter()
        .map(|o| {
            Ok(match draw_cotangent(rng, env, fwd, o)? {
                (None, h) => (o.clone(), h.to_f64_vec(), h),
                (Some(c), h) => (o.clone(), c, h),
            })
        })
        .collect()
}

/// The tensors of [`draw_cotangents`] alone (the same values from the same `rng`), without
/// their f64 copies.
pub(crate) fn draw_cotangent_tensors(rng: &mut inputs::Keys, env: &Env, fwd: &Forward) -> Result<Vec<(String, HostTensor)>, CheckError> {
    fwd.outputs.iter().map(|o| Ok((o.clone(), draw_cotangent(rng, env, fwd, o)?.1))).collect()
}

/// The cotangent of output `o`, as a tensor of its dtype and, where already made, its values
/// as f64 (`None`: the tensor's values).
fn draw_cotangent(rng: &mut inputs::Keys, env: &Env, fwd: &Forward, o: &str) -> Result<(Option<Vec<f64>>, HostTensor), CheckError> {
    let t = env.tensor(o).ok_or_else(|| CheckError::Spec(format!("forward output `{o}` is not a tensor after the forward")))?;
    let given = fwd.cotangents.iter().find(|(n, _)| n == o).map(|(_, c)| c);
    if t.dtype().is_float() && !matches!(given, Some(super::Cotangent::Given(_))) {
        // Drawn as inputs are, in parallel chunks and in the output's dtype.
        let d = match given {
            Some(super::Cotangent::Random(d)) => *d,
            _ => inputs::Dist::Normal { mean: 0.0, std: 1.0 },
        };
        let h = inputs::draw_floats(t.dtype(), t.shape(), t.numel(), d, rng)
            .map_err(|e| CheckError::Spec(format!("cotangent of `{o}`: {e}")))?;
        return Ok((None, h));
    }
    let raw = match given {
        None => inputs::normal(rng, t.numel()),
        Some(super::Cotangent::Random(d)) => {
            inputs::sample(d, rng, t.numel()).ok_or_else(|| CheckError::Spec(format!("cotangent of `{o}`: empty range in {d:?}")))?
        }
        Some(super::Cotangent::Given(h)) => {
            if h.shape() != t.shape() {
                return Err(CheckError::Spec(format!(
                    "cotangent of `{o}`: the given tensor has shape {:?}, the output {:?}",
                    h.shape(),
                    t.shape()
                )));
            }
            h.to_f64_vec()
        }
    };
    let c: Vec<f64> = raw.into_iter().map(|x| tilegrad_reference::round_to(t.dtype(), x)).collect();
    let h = HostTensor::from_f64_as(t.dtype(), t.shape(), &c);
    Ok((Some(c), h))
}

/// The ground-truth gradients of `fwd` for a random cotangent drawn from `opts.seed`.
pub fn ground_truth(fwd: &Forward, inputs: &Inputs, opts: &CheckOptions) -> Result<GroundTruth, CheckError> {
    let exec = opts.executor()?;
    let mut p = prepare(fwd, inputs, opts, false, &exec)?;
    let drawn = draw_cotangents(&mut cotangent_rng(opts.seed), &p.native, fwd)?;
    let mut cot: HashMap<String, Vec<f64>> = HashMap::new();
    let mut cotangents = Vec::new();
    for (o, c, h) in drawn {
        cot.insert(o.clone(), c);
        cotangents.push((o, h));
    }
    let gopts = GradOptions { precision: opts.precision, memory_budget: opts.memory_budget, ..GradOptions::default() };
    // As in a check: a forward of launches alone reverses against the native environment's
    // names and shapes, and the f64 one is freed first.
    let host_steps = fwd.steps.iter().any(|s| !matches!(s, steps::Step::Alloc { .. } | steps::Step::Launch(_)));
    if !host_steps {
        p.truth = Env::default();
    }
    let by = opts.kernels_ground(&exec);
    let mut notes = Vec::new();
    let env = if host_steps { &p.truth } else { &p.native };
    let mut truth = ground::reverse(&fwd.steps, &p.records, env, cot, &gopts, by, &mut notes)?;
    p.records = steps::Records::default();
    let gradients = fwd
        .differentiable
        .iter()
        .map(|d| {
            let t = p.native.tensor(d).expect("validated");
            // Moved out, unless the input is listed again later.
            let again = fwd.differentiable.iter().filter(|x| *x == d).count() > 1;
            let g = if again { truth.get(d).cloned() } else { truth.remove(d) }.unwrap_or_else(|| vec![0.0; t.numel()]);
            (d.clone(), HostTensor::from_f64(t.shape(), g))
        })
        .collect();
    Ok(GroundTruth {
        inputs: named(&p.drawn, inputs.tensors.iter().map(|t| t.name.as_str()))?,
        outputs: named(&p.native, fwd.outputs.iter().chain(&fwd.saved).map(String::as_str))?,
        cotangents,
        gradients,
        notes,
    })
}

/// One direction of a finite-difference self-check.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FdTrial {
    /// `<cotangent, J v>` from the AD gradient: `sum_i <grad_i, v_i>`.
    pub ad: f64,
    /// The same by central differences of `<cotangent, forward(x + h v)>` in f64.
    pub fd: f64,
    /// `|ad - fd| / max(|ad|, |fd|)`.
    pub rel_err: f64,
}

/// The engine's self-check: AD against central finite differences along random directions.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GradcheckReport {
    /// Name of the check.
    pub name: String,
    /// All directions within the tolerance.
    pub passed: bool,
    /// Tolerance on the relative error.
    pub tolerance: f64,
    /// Step of the differences (relative to each input's RMS).
    pub step: f64,
    /// Per direction.
    pub trials: Vec<FdTrial>,
}

impl fmt::Display for GradcheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "gradcheck `{}`: {} (AD vs central differences in f64, step {:.0e}, tolerance {:.0e})",
            self.name,
            if self.passed { "PASS" } else { "FAIL" },
            self.step,
            self.tolerance
        )?;
        writeln!(f, "  {:>9} {:>22} {:>22} {:>10}", "direction", "AD <c, J v>", "FD <c, J v>", "rel err")?;
        for (i, t) in self.trials.iter().enumerate() {
            writeln!(f, "  {:>9} {:>22.15e} {:>22.15e} {:>10.2e}", i, t.ad, t.fd, t.rel_err)?;
        }
        Ok(())
    }
}

/// Checks the ground truth of `fwd` (in f64) against central finite differences of the whole
/// forward, promoted to f64, along `opts.trials` random directions.
pub fn gradcheck(fwd: &Forward, inputs: &Inputs, opts: &CheckOptions, name: &str) -> Result<GradcheckReport, CheckError> {
    super::check_trials(opts.trials)?;
    let opts = CheckOptions { precision: Precision::F64, ..opts.clone() };
    let exec = opts.executor()?;
    let p = prepare(fwd, inputs, &opts, false, &exec)?;
    let mut rng = inputs::Keys::new(opts.seed ^ 0x5851_f42d_4c95_7f2d);
    let cot: HashMap<String, Vec<f64>> = draw_cotangents(&mut rng, &p.truth, fwd)?.into_iter().map(|(o, c, _)| (o, c)).collect();
    let gopts = GradOptions { memory_budget: opts.memory_budget, ..GradOptions::default() };
    // Launches whose VJP kernel is refused are differentiated by the evaluator, as the
    // evaluator's own ground truth is: nothing to note against finite differences.
    let truth = ground::reverse(&fwd.steps, &p.records, &p.truth, cot.clone(), &gopts, opts.kernels_ground(&exec), &mut Vec::new())?;
    // L(x) = sum over outputs of <cot, forward(x)>, the forward run in f64 from perturbed inputs.
    let base = promote(&p.drawn);
    let loss = |dirs: &[(String, Vec<f64>)], h: f64| -> Result<f64, CheckError> {
        let mut env = base.clone();
        for (d, v) in dirs {
            let id = env.id(d).expect("differentiable inputs exist");
            let t = env.mem.get(id);
            let x: Vec<f64> = t.to_f64_vec().iter().zip(v).map(|(a, b)| a + h * b).collect();
            *env.mem.get_mut(id) = HostTensor::from_f64(t.shape(), x);
        }
        steps::run(&mut env, &fwd.steps, Mode::F64, None, None, None, &exec).map_err(forward_err(fwd))?;
        Ok(cot.iter().map(|(o, c)| env.tensor(o).expect("ran").to_f64_vec().iter().zip(c).map(|(a, b)| a * b).sum::<f64>()).sum())
    };
    let rel_step = 1e-6;
    let tolerance = 1e-6;
    let mut trials = Vec::new();
    for _ in 0..opts.trials {
        let mut dirs = Vec::new();
        for d in &fwd.differentiable {
            let t = p.drawn.tensor(d).expect("validated");
            let rms = (t.to_f64_vec().iter().map(|x| x * x).sum::<f64>() / t.numel().max(1) as f64).sqrt().max(1e-3);
            dirs.push((d.clone(), inputs::normal(&mut rng, t.numel()).into_iter().map(|x| x * rms).collect::<Vec<f64>>()));
        }
        let ad: f64 = dirs.iter().map(|(d, v)| truth.get(d).map_or(0.0, |g| g.iter().zip(v).map(|(a, b)| a * b).sum())).sum();
        let fd = (loss(&dirs, rel_step)? - loss(&dirs, -rel_step)?) / (2.0 * rel_step);
        let scale = ad.abs().max(fd.abs());
        let rel_err = if scale == 0.0 { 0.0 } else { (ad - fd).abs() / scale };
        trials.push(FdTrial { ad, fd, rel_err });
    }
    let passed = trials.iter().all(|t| t.rel_err <= tolerance || (t.ad - t.fd).abs() <= 1e-12);
    Ok(GradcheckReport { name: name.to_string(), passed, tolerance, step: rel_step, trials })
}
