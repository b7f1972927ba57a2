//! The forward and its ground truth on their own, without a backward to check: the forward's
//! outputs (`tilegrad run`), the ground-truth gradients for a random cotangent (`tilegrad grad`,
//! written as `.npy` for users' own harnesses), and the engine's self-check against central
//! finite differences (`tilegrad gradcheck`).

use super::steps::{self, Mode};
use super::{ground, inputs, promote, CheckError, CheckOptions, Env, Forward, Inputs, Precision};
use rand::SeedableRng;
use serde::Serialize;
use std::collections::HashMap;
use std::fmt;
use tilegrad_ad::GradOptions;
use tilegrad_reference::HostTensor;

fn forward_err(fwd: &Forward) -> impl Fn(steps::StepFailure) -> CheckError + '_ {
    move |f| CheckError::Forward {
        step: f.step,
        what: fwd.steps[f.step].describe(),
        message: match f.error {
            steps::StepError::Spec(m) => m,
            steps::StepError::Exec(e) => e.to_string(),
        },
    }
}

/// Tensors by name.
pub type Named = Vec<(String, HostTensor)>;

/// Runs the forward in the kernels' own dtypes; returns the inputs as drawn and the outputs and
/// saved tensors, by name.
pub fn run_forward(fwd: &Forward, inputs: &Inputs, seed: u64) -> Result<(Named, Named), CheckError> {
    let env0 = inputs.materialise(seed)?;
    let mut env = env0.clone();
    steps::run(&mut env, &fwd.steps, Mode::Native, None, None).map_err(forward_err(fwd))?;
    Ok((
        named(&env0, inputs.tensors.iter().map(|t| t.name.as_str()))?,
        named(&env, fwd.outputs.iter().chain(&fwd.saved).map(String::as_str))?,
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
}

fn setup(fwd: &Forward, inputs: &Inputs, opts: &CheckOptions) -> Result<(Env, Env, Vec<steps::LaunchRecord>), CheckError> {
    if opts.backend == super::Backend::Gpu {
        return Err(CheckError::Unsupported("the GPU backend is not part of this build; use the CPU backend".into()));
    }
    let native = inputs.materialise(opts.seed)?;
    let mut env_n = native.clone();
    steps::run(&mut env_n, &fwd.steps, Mode::Native, None, None).map_err(forward_err(fwd))?;
    let f64_mode = opts.precision == Precision::F64;
    let mut env_g = if f64_mode { promote(&native) } else { native };
    let mut records = Vec::new();
    steps::run(&mut env_g, &fwd.steps, if f64_mode { Mode::F64 } else { Mode::Native }, Some(&mut records), None)
        .map_err(forward_err(fwd))?;
    for d in &fwd.differentiable {
        if !env_n.tensor(d).is_some_and(|t| t.dtype().is_float()) {
            return Err(CheckError::Spec(format!("differentiable input `{d}` is not a float input")));
        }
    }
    Ok((env_n, env_g, records))
}

/// The ground-truth gradients of `fwd` for a random cotangent drawn from `opts.seed`.
pub fn ground_truth(fwd: &Forward, inputs: &Inputs, opts: &CheckOptions) -> Result<GroundTruth, CheckError> {
    let (env_n, env_g, records) = setup(fwd, inputs, opts)?;
    let env0 = inputs.materialise(opts.seed)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut cot = HashMap::new();
    let mut cotangents = Vec::new();
    for o in &fwd.outputs {
        let t = env_n.tensor(o).ok_or_else(|| CheckError::Spec(format!("forward output `{o}` is not a tensor after the forward")))?;
        let c: Vec<f64> = inputs::normal(&mut rng, t.numel()).into_iter().map(|x| tilegrad_reference::round_to(t.dtype(), x)).collect();
        cotangents.push((o.clone(), HostTensor::from_f64_as(t.dtype(), t.shape(), &c)));
        cot.insert(o.clone(), c);
    }
    let gopts = GradOptions { precision: opts.precision, memory_budget: opts.memory_budget, ..GradOptions::default() };
    let truth = ground::reverse(&fwd.steps, &records, &env_g, cot, &gopts)?;
    let gradients = fwd
        .differentiable
        .iter()
        .map(|d| {
            let t = env_n.tensor(d).expect("checked in setup");
            let g = truth.get(d).cloned().unwrap_or_else(|| vec![0.0; t.numel()]);
            (d.clone(), HostTensor::from_f64(t.shape(), g))
        })
        .collect();
    Ok(GroundTruth {
        inputs: named(&env0, inputs.tensors.iter().map(|t| t.name.as_str()))?,
        outputs: named(&env_n, fwd.outputs.iter().chain(&fwd.saved).map(String::as_str))?,
        cotangents,
        gradients,
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
    let opts = CheckOptions { precision: Precision::F64, ..opts.clone() };
    let (env_n, env_g, records) = setup(fwd, inputs, &opts)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed ^ 0x5851_f42d_4c95_7f2d);
    let mut cot = HashMap::new();
    for o in &fwd.outputs {
        let t = env_g.tensor(o).ok_or_else(|| CheckError::Spec(format!("forward output `{o}` is not a tensor after the forward")))?;
        cot.insert(o.clone(), inputs::normal(&mut rng, t.numel()));
    }
    let gopts = GradOptions { memory_budget: opts.memory_budget, ..GradOptions::default() };
    let truth = ground::reverse(&fwd.steps, &records, &env_g, cot.clone(), &gopts)?;
    // L(x) = sum over outputs of <cot, forward(x)>, the forward run in f64 from perturbed inputs.
    let base = promote(&inputs.materialise(opts.seed)?);
    let loss = |dirs: &[(String, Vec<f64>)], h: f64| -> Result<f64, CheckError> {
        let mut env = base.clone();
        for (d, v) in dirs {
            let id = env.id(d).expect("differentiable inputs exist");
            let t = env.mem.get(id);
            let x: Vec<f64> = t.to_f64_vec().iter().zip(v).map(|(a, b)| a + h * b).collect();
            *env.mem.get_mut(id) = HostTensor::from_f64(t.shape(), x);
        }
        steps::run(&mut env, &fwd.steps, Mode::F64, None, None).map_err(forward_err(fwd))?;
        Ok(cot.iter().map(|(o, c)| env.tensor(o).expect("ran").to_f64_vec().iter().zip(c).map(|(a, b)| a * b).sum::<f64>()).sum())
    };
    let rel_step = 1e-6;
    let tolerance = 1e-6;
    let mut trials = Vec::new();
    for _ in 0..opts.trials.max(1) {
        let mut dirs = Vec::new();
        for d in &fwd.differentiable {
            let t = env_n.tensor(d).expect("checked in setup");
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
