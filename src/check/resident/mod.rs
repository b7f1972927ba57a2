//! A check whose tensors stay on the device: on the GPU backend with the ground truth by VJP
//! kernels, a forward of allocations and launches and a backward of those and sums over an axis
//! run from inputs drawn on the device to figures reduced there, and only the figures come to
//! the host.
//!
//! Each step computes what the host's check computes, the same way: inputs drawn by the same
//! counter-based generator (the same bits), the same launches in place, the f64 ground truth by
//! the same VJP kernels, the backward's replay in f64, and comparisons reduced on the device by
//! the host's rules ([`super::device_compare`]). A failing gradient's report is the device's
//! too, and its blame runs the passes again on the host, traced ([`blamed`]). What this path
//! does not compute itself it leaves to the host's check, which then runs from the start: a
//! failing forward comparison, a spec the host must explain (an error), a forward that is not
//! finite, a launch the evaluator must differentiate, an in-place accumulation, inputs or
//! cotangents the device does not draw. Host steps run on the device where it has them (sums
//! over an axis in f32 or f64, chunks, concatenations of one dtype), else on the host from
//! copies of only what they read and make ([`env::DeviceEnv::on_host`]). Elements asked
//! about are explained from the same traced passes. Where the passes compute in f16 or bf16, or
//! `dot` in tf32, the forward and the backward's first trial are also replayed with every float
//! in f32 on the device, as the host replays them (the size of what roundings act on). A check's
//! report is the host's, figure for figure, but for sums added in another order.

mod blamed;
mod env;
mod pass;
mod sweep;

use super::backend::Executor;
use super::device_compare::{compare_on_device, fetch, Compared, DeviceComparison, Naming};
use super::report::{Finding, Timings, Tolerance};
use super::spectrum::{Sample, Samples};
use super::steps::Mode;
use super::{verdict, Backward, CheckError, CheckOptions, Cotangent, Dist, Forward, Found, Inputs, Report};
use env::{dev, Aside, DeviceEnv};
use std::collections::HashMap;
use tilegrad_ad::Precision;
use tilegrad_gpu::{DeviceBuffer, Gpu};
use tilegrad_ir::DType;

/// Whether a check can keep its tensors on the device: on the GPU (not compared launch by launch
/// with the reference), the ground truth by VJP kernels in f64, allocations and launches only
/// (and sums in the backward), cotangents drawn from normal distributions, and non-finite values
/// not allowed. Narrow dtypes and tf32 `dot`s stay (their replays in f32 run on the device beside
/// the f64 ones), as do elements asked about (explained from passes traced on the host).
pub(crate) fn eligible(fwd: &Forward, bwd: &Backward, opts: &CheckOptions, exec: &Executor) -> bool {
    exec.on_gpu() && !exec.comparing() && spec_eligible(fwd, bwd, opts)
}

/// [`eligible`] but for the executor.
fn spec_eligible(fwd: &Forward, bwd: &Backward, opts: &CheckOptions) -> bool {
    let normal_cotangents = fwd.cotangents.iter().all(|(_, c)| matches!(c, Cotangent::Random(Dist::Normal { .. })));
    opts.device_resident
        && opts.by_kernels(true)
        && opts.precision == Precision::F64
        && !opts.allow_non_finite
        && normal_cotangents
        && pass::on_device(&fwd.steps)
        && pass::on_device(&bwd.steps)
}

/// The check on the device, or `None` where it leaves the check to the host (see the module's
/// documentation); `timings` then gets the time it took, and why it stepped aside.
pub(crate) fn check(
    (fwd, bwd, inputs): (&Forward, &Backward, &Inputs),
    opts: &CheckOptions,
    exec: &Executor,
    name: &str,
    timings: &mut Timings,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Option<Report> {
    let start = std::time::Instant::now();
    let mut tm = timings.clone();
    let mut notes = Vec::new();
    let replay32 = super::replays_in_f32(fwd, bwd, inputs, opts);
    match (Check { fwd, bwd, inputs, opts, exec, replay32, traced: Default::default() }).run(&mut tm, &mut notes, progress) {
        Ok(found) => {
            let mut r = found.report(name, opts, tm, exec, notes);
            r.backend.push_str("; its tensors kept on the device");
            Some(r)
        }
        Err(why) => {
            timings.phases.push((format!("on the device, until it stepped aside ({})", short(&why)), start.elapsed().as_secs_f64()));
            None
        }
    }
}

/// A reason in a few words (its first line, at most 120 characters).
fn short(why: &str) -> String {
    why.lines().next().unwrap_or("").chars().take(120).collect()
}

/// One check's description and options.
struct Check<'a> {
    fwd: &'a Forward,
    bwd: &'a Backward,
    inputs: &'a Inputs,
    opts: &'a CheckOptions,
    exec: &'a Executor,
    /// The passes are replayed in f32 too (f16, bf16 or tf32: `replays_in_f32`).
    replay32: bool,
    /// The forward as the host traced it, once a failing gradient is blamed.
    traced: std::cell::OnceCell<blamed::TracedForward>,
}

/// The forward as both passes left it, and the ground truth's launches.
struct Forwards {
    /// The forward in the kernels' dtypes.
    native: DeviceEnv,
    /// The forward promoted to f64.
    truth: DeviceEnv,
    /// The forward with every float in f32, where the passes compute in f16 or bf16 (the
    /// replay that measures roundings, as the host's `replay32`).
    r32: Option<DeviceEnv>,
    ran: Vec<pass::Ran>,
    vks: HashMap<usize, tilegrad_ad::VjpKernel>,
}

impl Check<'_> {
    fn gpu(&self) -> Result<&Gpu, Aside> {
        self.exec.gpu().ok_or_else(|| "no GPU".to_string())
    }

    /// Every phase of the check; any reason to leave it to the host is an `Err`.
    fn run(&self, tm: &mut Timings, notes: &mut Vec<Finding>, progress: &mut dyn FnMut(&str, usize, usize)) -> Result<Found, Aside> {
        progress("inputs and forward", 0, self.opts.trials);
        let f = self.forwards(tm, notes)?;
        let forward = tm.time("comparison", || self.compare_forward(&f))?;
        let mut found = Found::new(forward, self.bwd.gradients.len());
        let mut keys = super::truth::cotangent_rng(self.opts.seed);
        for trial in 0..self.opts.trials {
            self.trial(&f, trial, &mut keys, &mut found, tm, notes, progress)?;
            progress("trial done", trial + 1, self.opts.trials);
        }
        Ok(found)
    }

    /// The inputs drawn, and the forward run in the kernels' dtypes and in f64.
    fn forwards(&self, tm: &mut Timings, notes: &mut Vec<Finding>) -> Result<Forwards, Aside> {
        let gpu = self.gpu()?;
        let mut native = tm.time("inputs", || self.draw_inputs(gpu))?;
        let mut truth = tm.time("forward of the ground truth", || native.copy(gpu, Some(DType::F64)))?;
        let r32 = match self.replay32 {
            true => Some(tm.time("replay in f32", || -> Result<_, Aside> {
                let mut env = native.copy(gpu, Some(DType::F32))?;
                pass::run(&mut env, &self.fwd.steps, Mode::F32, false, None, self.exec)?;
                Ok(env)
            })?),
            false => None,
        };
        tm.time("forward in the kernels' dtypes", || {
            pass::run(&mut native, &self.fwd.steps, Mode::Native, false, Some(("forward", notes)), self.exec)
        })?;
        let (ran, vks) = tm.time("forward of the ground truth", || -> Result<_, Aside> {
            let ran = pass::run(&mut truth, &self.fwd.steps, Mode::F64, true, None, self.exec)?;
            let vks = sweep::vjp_kernels(&ran, &truth, self.exec)?;
            Ok((ran, vks))
        })?;
        Ok(Forwards { native, truth, r32, ran, vks })
    }

    /// The inputs: normal and uniform draws in every float dtype on the device, any other drawn
    /// on the host and copied there.
    fn draw_inputs(&self, gpu: &Gpu) -> Result<DeviceEnv, Aside> {
        let (inputs, seed) = (self.inputs, self.opts.seed);
        inputs.check_names().map_err(|e| e.to_string())?;
        let mut env = DeviceEnv::with_constants(inputs.constants.clone());
        for (i, it) in inputs.tensors.iter().enumerate() {
            match (inputs.device_draw(i, seed), &it.source) {
                (Some((key, dist)), super::Source::Random { dtype, shape, .. }) => {
                    let t = env.add_zeroed(gpu, &it.name, *dtype, shape)?;
                    // f16 and bf16 as the host draws them: in f32, then rounded.
                    let narrow = matches!(dtype, DType::F16 | DType::BF16);
                    let f32_draws = if narrow { Some(gpu.alloc_zeroed(t.numel * 4).map_err(dev)?) } else { None };
                    let at = f32_draws.as_ref().map_or(t.addr, DeviceBuffer::addr);
                    let f32 = *dtype != DType::F64;
                    match dist {
                        Dist::Normal { mean, std } => gpu.draw_normal(at, t.numel, key, mean, std, f32),
                        Dist::Uniform { lo, hi } => gpu.draw_uniform(at, t.numel, key, lo, hi, f32),
                        _ => return Err("a draw the device does not make".into()),
                    }
                    .map_err(dev)?;
                    if narrow {
                        gpu.convert(at, DType::F32, t.addr, *dtype, t.numel).map_err(dev)?;
                    }
                }
                _ => {
                    let h = inputs.tensor_at(i, seed).map_err(|e| e.to_string())?;
                    if h.dtype().is_float() && (0..h.numel()).any(|j| !h.get_f64(j).is_finite()) {
                        return Err(format!("input `{}` is not finite", it.name));
                    }
                    env.add_host(gpu, &it.name, &h)?;
                }
            }
        }
        super::validate_forward_by(self.fwd, &|n| env.get(n).map(|t| t.dtype)).map_err(|e| e.to_string())?;
        Ok(env)
    }

    /// The forward's outputs and saved tensors compared with the ground truth's, as the host
    /// compares them.
    fn compare_forward(&self, f: &Forwards) -> Result<Vec<super::TensorReport>, Aside> {
        let gpu = self.gpu()?;
        let tf32 = super::uses_tf32(&self.fwd.steps);
        let mut out = Vec::new();
        for o in self.fwd.outputs.iter().chain(&self.fwd.saved) {
            let (t, e) = (f.native.get(o).ok_or("not a tensor")?, f.truth.get(o).ok_or("not a tensor")?);
            if !t.dtype.is_float() {
                return Err(format!("forward tensor `{o}` is {}", t.dtype));
            }
            if !finite(gpu, e.addr, e.numel)? {
                return Err(format!("the ground truth's `{o}` is not finite"));
            }
            let got = f.native.as_f64(gpu, o)?;
            let noisy = f.r32.as_ref().map(|r| r.as_f64(gpu, o)).transpose()?;
            let tol = self.opts.tolerance.unwrap_or_else(|| Tolerance::for_dtype(t.dtype, tf32));
            let noisy_at = noisy.as_ref().map(DeviceBuffer::addr);
            let c = Compared {
                n: t.numel,
                expected: e.addr,
                got: got.addr(),
                replay: Some(e.addr),
                noisy: noisy_at,
                noisy_of_replay: false,
                terms: None,
            };
            let shape = f.native.shape_of(o).ok_or("no shape")?;
            let at = Naming { name: o, tensor: o, dtype: t.dtype, shape, trial: 0 };
            let mut r = compare_on_device(gpu, c, at, tol, tf32).map_err(|e| e.to_string())?;
            let norms = r.norms.ok_or("no norms")?;
            verdict::apply(&mut r.report, norms.judge(t.numel, 1.0, t.dtype, tf32), self.opts.tolerance.is_some());
            if !r.report.passed {
                return Err(format!("forward output `{o}` differs from the ground truth's"));
            }
            out.push(r.report);
        }
        Ok(out)
    }

    /// One trial: cotangents drawn, the backward's replay in f64 (the first trial), the ground
    /// truth, the backward, and the gradients compared.
    #[allow(clippy::too_many_arguments)]
    fn trial(
        &self,
        f: &Forwards,
        trial: usize,
        keys: &mut super::inputs::Keys,
        found: &mut Found,
        tm: &mut Timings,
        notes: &mut Vec<Finding>,
        progress: &mut dyn FnMut(&str, usize, usize),
    ) -> Result<(), Aside> {
        let gpu = self.gpu()?;
        progress("ground truth", trial, self.opts.trials);
        // The backward's environment: the forward's tensors (a copy: the backward may write
        // them) and the cotangents, drawn into it in the outputs' dtypes.
        let mut env_b = tm.time("backward", || f.native.copy(gpu, None))?;
        let keys_at = keys.clone();
        let (cot, cot_rms) = tm.time("cotangents", || self.draw_cotangents(gpu, &mut env_b, keys))?;
        let replays = match trial {
            0 => Some(tm.time("replay of the backward in f64 (formula)", || self.replay(&f.truth, DType::F64, &cot))?),
            _ => None,
        };
        let replays32 = match (&f.r32, trial) {
            (Some(r32), 0) => Some(tm.time("replay of the backward in f32 (scale)", || self.replay(r32, DType::F32, &cot))?),
            _ => None,
        };
        let truth = tm.time("ground truth", || -> Result<_, Aside> {
            let env = f.truth.copy(gpu, None)?;
            sweep::reverse(&self.fwd.steps, &f.ran, &f.vks, &env, cot, self.exec)
        })?;
        progress("backward", trial, self.opts.trials);
        let noted = (trial == 0).then_some(("backward", &mut *notes));
        tm.time("backward", || pass::run(&mut env_b, &self.bwd.steps, Mode::Native, false, noted, self.exec))?;
        progress("comparison", trial, self.opts.trials);
        let t_cmp = std::time::Instant::now();
        let compared = self.compare_gradients(f, &env_b, &truth, (replays.as_ref(), replays32.as_ref()), cot_rms, trial, found);
        tm.add("comparison", t_cmp.elapsed().as_secs_f64());
        let (samples, to_blame) = compared?;
        let explain = trial + 1 == self.opts.trials && !self.opts.blame_elements.is_empty();
        if to_blame.is_empty() && !explain {
            return Ok(());
        }
        drop((env_b, replays, replays32));
        tm.time("blame", || -> Result<(), Aside> {
            let tb = self.traced_backward(keys_at).map_err(|e| format!("blame of trial {trial}: {e}"))?;
            tb.blame(self.bwd, &samples, &to_blame, found);
            if explain {
                // Of the truth, only the elements asked about come to the host.
                let expected = |input: &str, e: usize| match truth.get(input) {
                    Some(b) => gpu.read_f64(b.addr(), e).map_err(|err| CheckError::Unsupported(err.to_string())),
                    None => Ok(0.0),
                };
                found.explained = tb.explain(self.opts, self.bwd, &expected, trial).map_err(|e| e.to_string())?;
            }
            Ok(())
        })
    }

    /// The trial's backward run again on the host, traced ([`blamed`]), the trial's cotangents
    /// drawn from `keys`; the forward traced once for every trial.
    fn traced_backward(&self, mut keys: super::inputs::Keys) -> Result<blamed::TracedBackward, Aside> {
        if self.traced.get().is_none() {
            let t = blamed::traced_forward(self.fwd, self.inputs, self.opts.seed, self.exec)?;
            let _ = self.traced.set(t);
        }
        let f = self.traced.get().ok_or("no traced forward")?;
        blamed::traced_backward((self.fwd, self.bwd), f, &mut keys, self.exec)
    }

    /// Each output's cotangent, drawn as the host draws it into tensor `grad_<output>` of
    /// `env_b` (the output's dtype), and as f64 values for the ground truth; with the
    /// cotangents' root-mean-square.
    fn draw_cotangents(
        &self,
        gpu: &Gpu,
        env_b: &mut DeviceEnv,
        keys: &mut super::inputs::Keys,
    ) -> Result<(HashMap<String, DeviceBuffer>, f64), Aside> {
        let mut cot = HashMap::new();
        let (mut sq, mut n) = (0.0, 0usize);
        for o in &self.fwd.outputs {
            let (dtype, shape) = (env_b.get(o).ok_or("no output")?.dtype, env_b.shape_of(o).ok_or("no output")?.to_vec());
            let (mean, std) = match self.fwd.cotangents.iter().find(|(n, _)| n == o).map(|(_, c)| c) {
                None => (0.0, 1.0),
                Some(Cotangent::Random(Dist::Normal { mean, std })) => (*mean, *std),
                Some(_) => return Err(format!("the cotangent of `{o}` is not drawn on the device")),
            };
            if !dtype.is_float() {
                return Err(format!("output `{o}` is {dtype}"));
            }
            let t = env_b.add_zeroed(gpu, &format!("grad_{o}"), dtype, &shape)?;
            let key = keys.next_key();
            if matches!(dtype, DType::F16 | DType::BF16) {
                // As the host draws them: in f32, then rounded.
                let drawn = gpu.alloc_zeroed(t.numel * 4).map_err(dev)?;
                gpu.draw_normal(drawn.addr(), t.numel, key, mean, std, true).map_err(dev)?;
                gpu.convert(drawn.addr(), DType::F32, t.addr, dtype, t.numel).map_err(dev)?;
            } else {
                gpu.draw_normal(t.addr, t.numel, key, mean, std, dtype == DType::F32).map_err(dev)?;
            }
            let c = env_b.as_f64(gpu, &t.name)?;
            sq += gpu.spread(c.addr(), c.addr(), None, None, t.numel).map_err(dev)?.truth_sq;
            n += t.numel;
            cot.insert(o.clone(), c);
        }
        let rms = if n == 0 || sq == 0.0 { 1.0 } else { (sq / n as f64).sqrt() };
        Ok((cot, rms))
    }

    /// The backward run with every float in `float` (f64, or f32) on the forward `forward` as
    /// that precision computed it, with the f64 cotangents (rounded to f32 for an f32 replay,
    /// as the host's): its gradient tensors.
    fn replay(&self, forward: &DeviceEnv, float: DType, cot: &HashMap<String, DeviceBuffer>) -> Result<DeviceEnv, Aside> {
        let gpu = self.gpu()?;
        let mut env = forward.copy(gpu, None)?;
        for o in &self.fwd.outputs {
            let shape = env.shape_of(o).ok_or("no output")?.to_vec();
            let t = env.add_zeroed(gpu, &format!("grad_{o}"), float, &shape)?;
            gpu.convert(cot[o].addr(), DType::F64, t.addr, float, t.numel).map_err(dev)?;
        }
        let mode = if float == DType::F64 { Mode::F64 } else { Mode::F32 };
        pass::run(&mut env, &self.bwd.steps, mode, false, None, self.exec)?;
        Ok(env)
    }

    /// Each gradient compared with the ground truth's (and its replay, the first trial), as the
    /// host compares them. Returns each gradient's sample of wrong and right elements (blame's
    /// evidence: only a failing gradient and its truth come to the host for it), and the failing
    /// gradients whose worst element is to be blamed (gradient, element).
    #[allow(clippy::too_many_arguments)]
    fn compare_gradients(
        &self,
        f: &Forwards,
        env_b: &DeviceEnv,
        truth: &HashMap<String, DeviceBuffer>,
        (replays, replays32): (Option<&DeviceEnv>, Option<&DeviceEnv>),
        cot_rms: f64,
        trial: usize,
        found: &mut Found,
    ) -> Result<(Samples, Vec<(usize, usize)>), Aside> {
        let gpu = self.gpu()?;
        let tf32 = super::uses_tf32(&self.bwd.steps) || super::uses_tf32(&self.fwd.steps);
        let (mut samples, mut to_blame) = (Vec::new(), Vec::new());
        for (gi, (input, gname)) in self.bwd.gradients.iter().enumerate() {
            let g = env_b.get(gname).ok_or_else(|| format!("no gradient `{gname}`"))?;
            let shape = f.native.shape_of(input).ok_or("no input")?;
            let written = self.bwd.steps.iter().any(|s| super::step_writes(s, gname)) || super::defined_by(&self.bwd.steps, gname);
            if env_b.shape_of(gname) != Some(shape) || !written {
                return Err(format!("gradient `{gname}`: its shape, or no step writes it"));
            }
            let expected = match truth.get(input) {
                Some(b) => b.addr(),
                None => return Err(format!("no ground truth for `{input}`")),
            };
            if !finite(gpu, expected, g.numel)? {
                return Err(format!("the ground-truth gradient of `{input}` is not finite"));
            }
            let got = env_b.as_f64(gpu, gname)?;
            let replay = match replays {
                Some(r) => Some(r.get(gname).filter(|t| t.numel == g.numel && t.dtype == DType::F64).ok_or("no replay")?.addr),
                None => None,
            };
            let noisy = match replays32 {
                Some(r) if r.get(gname).is_some_and(|t| t.numel == g.numel) => Some(r.as_f64(gpu, gname)?),
                Some(_) => return Err("no replay in f32".into()),
                None => None,
            };
            let terms = found.first[gi].as_ref().map(|(.., terms)| *terms);
            // The backward's own tf32 sets its tolerance; either pass's, its rounding's unit.
            let tol = self.opts.tolerance.unwrap_or_else(|| Tolerance::for_dtype(g.dtype, super::uses_tf32(&self.bwd.steps)));
            let noisy_at = noisy.as_ref().map(DeviceBuffer::addr);
            // The f32 replay's gap is measured from the f64 replay's, as the host measures it.
            let c = Compared { n: g.numel, expected, got: got.addr(), replay, noisy: noisy_at, noisy_of_replay: true, terms };
            let at = Naming { name: input, tensor: gname, dtype: g.dtype, shape, trial };
            let mut r = compare_on_device(gpu, c, at, tol, tf32).map_err(|e| e.to_string())?;
            let mut badness = r.worst.map_or(0.0, |(_, ratio)| ratio);
            if let Some(norms) = r.norms {
                let (fo, ro) = norms.judge(g.numel, cot_rms, g.dtype, tf32);
                found.first[gi] = Some((fo.clone(), ro.clone(), r.terms));
                badness = badness.max(verdict::apply(&mut r.report, (fo, ro), self.opts.tolerance.is_some()));
            }
            samples.push((gname.clone(), sample(gpu, &mut r, &c, tol)?));
            if found.gradients[gi].as_ref().is_none_or(|(_, b)| badness > *b) {
                if let (Some((w, _)), false) = (r.worst, r.report.passed) {
                    to_blame.push((gi, w));
                }
                found.gradients[gi] = Some((r.report, badness));
            }
        }
        Ok((samples, to_blame))
    }
}

/// Which elements of a comparison are wrong and which right, sampled (blame's evidence): only a
/// failing one's two tensors come to the host for it, those its error map fetched if it did.
fn sample(gpu: &Gpu, r: &mut DeviceComparison, c: &Compared, tol: Tolerance) -> Result<Sample, Aside> {
    let Some(w) = r.worst.filter(|_| !r.report.passed) else { return Ok(Sample::all_right(c.n)) };
    let (exp, got) = match r.elements.take() {
        Some(e) => e,
        None => fetch(gpu, c).map_err(dev)?,
    };
    Ok(Sample::compared(&exp, |i| got[i], tol, r.terms, w))
}

/// Whether the `n` f64 values at `addr` are all finite.
fn finite(gpu: &Gpu, addr: u64, n: usize) -> Result<bool, Aside> {
    let rule = tilegrad_gpu::TallyRule { atol: 0.0, rtol: 0.0, scale: 1.0, floor: 0.0 };
    let t = gpu.tally(addr, addr, n, rule).map_err(dev)?;
    Ok(t.nan == 0 && t.inf == 0)
}

#[cfg(test)]
mod tests {
    use super::spec_eligible;
    use crate::check::{CheckOptions, Ground};

    /// Which example specs a GPU check keeps on the device: those of allocations, launches and
    /// host steps, in any float dtype, tf32 `dot`s too, with the ground truth by VJP kernels;
    /// not those with an in-place accumulation, or the evaluator's ground truth, or with the
    /// option off.
    #[test]
    fn checks_of_launches_stay_on_the_device_and_others_do_not() {
        let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        let on = |file: &str, tweak: &dyn Fn(CheckOptions) -> CheckOptions| {
            let s = crate::spec::load(&examples.join(file)).unwrap();
            let opts = tweak(CheckOptions { ground: Ground::Kernels, ..s.options.clone() });
            let bwd = s.backward.as_ref().unwrap();
            spec_eligible(&s.forward, bwd, &opts)
        };
        let same = |o: CheckOptions| o;
        let launches = ["softmax.toml", "weighted_sum.toml", "layer_norm.toml", "matmul.toml", "flash_attention_causal.toml"];
        for f in launches.iter().chain(&["rms_norm_f16.toml", "smooth_ce_bf16.toml", "linear_tf32.toml"]) {
            assert!(on(f, &same), "{f}");
        }
        for f in ["block_sum.toml", "swiglu_chunk.toml", "cross_entropy_fused.toml", "cross_entropy_item.toml", "cross_entropy_mean.toml"] {
            assert!(on(f, &same), "{f}");
        }
        let s = crate::spec::load(&examples.join("cross_entropy_mean.toml")).unwrap();
        let mut bwd = s.backward.clone().unwrap();
        bwd.steps.push(crate::check::Step::Accumulate { src: "grad_x".into(), dst: "grad_x".into() });
        assert!(!spec_eligible(&s.forward, &bwd, &CheckOptions { ground: Ground::Kernels, ..s.options.clone() }));
        assert!(!on("softmax.toml", &|o| CheckOptions { ground: Ground::Evaluator, ..o }));
        assert!(!on("softmax.toml", &|o| CheckOptions { device_resident: false, ..o }));
        assert!(on("softmax.toml", &|o| CheckOptions { blame_elements: vec![("x".into(), vec![0, 0])], ..o }));
    }
}
