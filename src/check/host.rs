//! The check through host tensors: on the reference interpreter, and on the GPU backend where
//! the check does not keep its tensors on the device ([`super::resident`]), each launch's tensors
//! crossing to the device and back. From the forward as [`super::truth::prepare`] ran it, the
//! forward's tensors are compared with the ground truth's, then each cotangent trial runs the
//! replays (the first trial), the ground truth's reverse sweep and the backward, compares the
//! gradients, and blames the worst element of a failing one.

use super::backend::Executor;
use super::blame;
use super::findings;
use super::ground;
use super::inputs::Keys;
use super::report::{self, Failure, Finding, Timings, Tolerance};
use super::spectrum;
use super::steps::{self, Env, Mode, Records, StepError, Trace};
use super::truth::{self, Prepared};
use super::{
    compare_tensor, defined_by, explain_elements, given_what, lean, non_finite, replay, replayed, rms, step_writes, verdict, Backward,
    CheckError, CheckOptions, Forward, Found, Inputs, Report, Step, TensorReport,
};
use std::collections::HashMap;
use tilegrad_ad::{GradOptions, Precision};
use tilegrad_ir::DType;
use tilegrad_reference::HostTensor;

/// One check's description, options and executor, and whether its passes use tf32.
pub(crate) struct HostCheck<'a> {
    pub fwd: &'a Forward,
    pub bwd: &'a Backward,
    pub inputs: &'a Inputs,
    pub opts: &'a CheckOptions,
    pub exec: &'a Executor,
    pub fwd_tf32: bool,
    pub bwd_tf32: bool,
}

/// What every trial reads of the forward.
struct Forwarded<'p> {
    /// After the forward, in the kernels' dtypes.
    native: &'p Env,
    /// Who wrote what in `native`.
    trace: &'p Trace,
    /// What the reverse sweep reads (see [`HostCheck::run`]).
    truth_env: &'p Env,
    /// The inputs' shapes.
    input_shape: &'p HashMap<String, Vec<usize>>,
}

/// What the trials carry from one to the next.
struct Trials {
    found: Found,
    /// The cotangents' generator.
    rng: Keys,
    /// The forward as the replays compute it (f64, and f32 where asked), for the first trial.
    replay_envs: (Option<Env>, Option<Env>),
    /// The ground truth's forward launches (until the last trial's reverse sweep).
    records: Records,
    notes: Vec<Finding>,
}

/// A replay's gradient tensors, by name (`None`: it was not made, or failed).
type Replayed = Option<HashMap<String, HostTensor>>;

/// The environment after a backward, and where recorded, a traced run's environment and who
/// wrote what.
type Ran = (Env, Option<(Env, Trace)>);

/// A trial's ground truth and what it is compared with.
struct Truths {
    /// The true gradients, by input.
    truth: HashMap<String, Vec<f64>>,
    /// The backward replayed in f64 and in f32 (the first trial).
    replays: (Replayed, Replayed),
    cot_rms: f64,
    /// The cotangents in the outputs' dtypes.
    as_tensors: Vec<(String, HostTensor)>,
}

impl HostCheck<'_> {
    /// The check from the forward `p` ran, with the phases timed so far.
    pub(crate) fn run(
        &self,
        p: Prepared,
        mut tm: Timings,
        name: &str,
        progress: &mut dyn FnMut(&str, usize, usize),
    ) -> Result<Report, CheckError> {
        let Prepared { drawn, native, trace, truth, records, f32, notes, .. } = p;
        // The inputs as drawn are not needed past here, only their shapes: free them early.
        let input_shape: HashMap<String, Vec<usize>> =
            drawn.names.iter().map(|(n, id)| (n.clone(), drawn.mem.get(*id).shape().to_vec())).collect();
        drop(drawn);
        let forward = self.compare_forward(&native, &trace, &truth, f32.as_ref(), &mut tm)?;
        // The reverse sweep reads the ground truth's environment only through host steps (their
        // operands' values); a forward of launches alone needs only names and shapes, which the
        // native environment has. The f64 environment stays for the backward's replay.
        let host_steps = self.fwd.steps.iter().any(|s| !matches!(s, Step::Alloc { .. } | Step::Launch(_)));
        let kept_truth = if host_steps { Some(truth.clone()) } else { None };
        let replay_envs = (Some(lean(truth, &native, &self.bwd.steps)), f32.map(|e| lean(e, &native, &self.bwd.steps)));
        let f = Forwarded { native: &native, trace: &trace, truth_env: kept_truth.as_ref().unwrap_or(&native), input_shape: &input_shape };
        let found = Found::new(forward, self.bwd.gradients.len());
        let mut st = Trials { found, rng: truth::cotangent_rng(self.opts.seed), replay_envs, records, notes };
        for trial in 0..self.opts.trials {
            if !self.trial(&f, &mut st, trial, &mut tm, progress)? {
                break;
            }
            progress("trial done", trial + 1, self.opts.trials);
        }
        Ok(st.found.report(name, self.opts, tm, self.exec, st.notes))
    }

    /// The forward's outputs and saved tensors compared with the ground truth's forward; a
    /// failing one blamed.
    fn compare_forward(
        &self,
        native: &Env,
        trace: &Trace,
        truth: &Env,
        f32: Option<&Env>,
        tm: &mut Timings,
    ) -> Result<Vec<TensorReport>, CheckError> {
        let (fwd, opts) = (self.fwd, self.opts);
        let mut forward = Vec::new();
        for o in fwd.outputs.iter().chain(&fwd.saved) {
            let t = native.tensor(o).ok_or_else(|| CheckError::Spec(format!("forward tensor `{o}` is not a tensor after the forward")))?;
            if !t.dtype().is_float() && fwd.outputs.contains(o) {
                return Err(CheckError::Spec(format!("forward output `{o}` is {}, not a float tensor (list it as saved)", t.dtype())));
            }
            if let Some((step, e)) = blame::first_unwritten(trace, o) {
                return Err(CheckError::Forward {
                    step,
                    what: fwd.steps[step].describe(),
                    message: format!(
                        "element {:?} of `{o}` is never written by the forward (it was allocated empty)",
                        report::unravel(e, t.shape())
                    ),
                });
            }
            let tol = opts.tolerance.unwrap_or_else(|| Tolerance::for_dtype(t.dtype(), self.fwd_tf32));
            let truth_o = truth.tensor(o).expect("same steps");
            let exp: std::borrow::Cow<[f64]> = truth_o.as_f64().map_or_else(|| truth_o.to_f64_vec().into(), Into::into);
            if !opts.allow_non_finite {
                if let Some(i) = exp.iter().position(|x| !x.is_finite()) {
                    return Err(non_finite(
                        format!("the ground truth's forward output `{o}`"),
                        exp[i],
                        report::unravel(i, t.shape()),
                        "the forward is not finite on these inputs",
                    ));
                }
            }
            let r32 = f32.and_then(|e| e.tensor(o)).map(HostTensor::to_f64_vec);
            let (mut r, w) = tm.time("comparison", || {
                let got = |i: usize| t.get_f64(i);
                let f32_pass = t.dtype() == DType::F32 && !self.fwd_tf32;
                let floor = verdict::elementwise_scale(&exp, r32.as_deref(), &got, f32_pass, tol.atol);
                let (mut r, w) = compare_tensor(o, o, t, tol, &exp, 0, floor);
                let judged = verdict::Replayed { truth: &exp, got: &got, r64: &exp, r32: r32.as_deref(), r32_of: &exp, cot_rms: 1.0 };
                verdict::apply(&mut r, judged.judge(t.dtype(), self.fwd_tf32), opts.tolerance.is_some());
                (r, w)
            });
            if let (Some((w, _)), Some(worst), false) = (w, r.worst.as_mut(), r.passed) {
                let values = Some((worst.expected, worst.got));
                worst.blame = Some(tm.time("blame", || blame::blame(trace, native, &fwd.steps, o, w, values, &[])));
            }
            forward.push(r);
        }
        Ok(forward)
    }

    /// One trial; `false` where the trials stop (the backward failed).
    fn trial(
        &self,
        f: &Forwarded,
        st: &mut Trials,
        trial: usize,
        tm: &mut Timings,
        progress: &mut dyn FnMut(&str, usize, usize),
    ) -> Result<bool, CheckError> {
        let opts = self.opts;
        progress("ground truth", trial, opts.trials);
        let t = self.truths(f, st, trial, tm)?;
        // The backward's environment: the forward's tensors and the cotangents `grad_<output>`
        // (sharing their storage until the backward writes them).
        let backward_env = || -> Result<Env, CheckError> {
            let mut env = f.native.clone();
            for (o, h) in &t.as_tensors {
                env.add(&format!("grad_{o}"), h.clone()).map_err(CheckError::Spec)?;
            }
            Ok(env)
        };
        let env_b = tm.time("backward", backward_env)?;
        if !opts.allow_non_finite {
            for d in &self.fwd.differentiable {
                if let Some((i, &x)) = t.truth.get(d).and_then(|g| g.iter().enumerate().find(|(_, x)| !x.is_finite())) {
                    return Err(non_finite(
                        format!("the ground-truth gradient of `{d}` (trial {trial})"),
                        x,
                        report::unravel(i, &f.input_shape[d]),
                        "the forward is not differentiable to a finite value on these inputs",
                    ));
                }
            }
        }
        progress("backward", trial, opts.trials);
        let Some((env_b, mut traced)) = self.run_backward(st, trial, env_b, &backward_env, tm)? else {
            return Ok(false);
        };
        progress("comparison", trial, opts.trials);
        let (samples, to_blame) = self.compare_gradients(f, st, trial, &env_b, &t, tm)?;
        if !to_blame.is_empty() {
            if traced.is_none() {
                traced = Some(self.rerun_traced(&backward_env, tm)?);
            }
            let (env_t, trace_t) = traced.as_ref().expect("made above");
            // Blame follows what the backward read from the forward's launches into them.
            let trace_t = &tm.time("blame", || trace_t.after_forward(f.trace, self.fwd.steps.len(), &self.fwd.outputs));
            tm.time("blame", || st.found.blame_worst(self.bwd, (env_t, trace_t), &to_blame, &samples));
        }
        if st.found.failure.is_some() {
            return Ok(false);
        }
        if !opts.blame_elements.is_empty() && trial + 1 == opts.trials {
            if traced.is_none() {
                traced = Some(self.rerun_traced(&backward_env, tm)?);
            }
            let (env_t, trace_t) = traced.as_ref().expect("made above");
            let trace_t = &trace_t.after_forward(f.trace, self.fwd.steps.len(), &self.fwd.outputs);
            let expected = |input: &str, e: usize| Ok(t.truth.get(input).map_or(0.0, |v| v[e]));
            st.found.explained = explain_elements(opts, self.bwd, (env_t, trace_t), &expected, trial)?;
        }
        Ok(true)
    }

    /// A trial's cotangents, the replays of the backward (the first trial), and the ground
    /// truth's gradients.
    fn truths(&self, f: &Forwarded, st: &mut Trials, trial: usize, tm: &mut Timings) -> Result<Truths, CheckError> {
        let (fwd, bwd, opts, exec) = (self.fwd, self.bwd, self.opts, self.exec);
        let mut rng_at = st.rng.clone();
        let drawn = tm.time("cotangents", || truth::draw_cotangents(&mut st.rng, f.native, fwd))?;
        let mut cot: HashMap<String, Vec<f64>> = drawn.into_iter().map(|(o, c, _)| (o, c)).collect();
        let cot_rms = rms(cot.values().flatten().copied());
        let replays = match (opts.precision, &st.replay_envs.0) {
            (Precision::F64, Some(env)) => {
                tm.time("replay of the backward in f64 (formula)", || replay(bwd, env, Mode::F64, &mut cot, exec))
            }
            _ => None,
        };
        let replays32 = match &st.replay_envs.1 {
            Some(env) => tm.time("replay of the backward in f32 (scale)", || replay(bwd, env, Mode::F32, &mut cot, exec)),
            None => None,
        };
        st.replay_envs = (None, None);
        let mut ground_notes = Vec::new();
        let gopts = GradOptions { precision: opts.precision, memory_budget: opts.memory_budget, ..GradOptions::default() };
        let by = opts.kernels_ground(exec);
        let truth =
            tm.time("ground truth", || ground::reverse(&fwd.steps, &st.records, f.truth_env, cot, &gopts, by, &mut ground_notes))?;
        if trial + 1 == opts.trials {
            // Only the ground truth reads the forward's records: the last one is done.
            st.records = Default::default();
        }
        if trial == 0 {
            st.notes.extend(ground_notes);
        }
        // The cotangents in the outputs' dtypes, drawn again from the same stream: made after
        // the replays and the ground truth, so that their f64 tensors and these are not held at
        // once.
        let as_tensors = tm.time("cotangents", || truth::draw_cotangent_tensors(&mut rng_at, f.native, fwd))?;
        Ok(Truths { truth, replays: (replays, replays32), cot_rms, as_tensors })
    }

    /// Runs the backward on `env_b`: the environment after it and, where recorded, who wrote
    /// what; `None` where the trials stop (it failed, but for a race: then it runs again with
    /// its races resolved in program order, and its gradients are provisional).
    ///
    /// On the reference, the backward records who wrote what (for blame) as it runs: the table
    /// comes from the store runs every launch logs anyway. On a GPU it runs untraced, and who
    /// wrote what costs a second, traced run of the same deterministic steps, made only when a
    /// report needs it: a failing gradient, elements asked about, a racy backward's
    /// provisional table.
    fn run_backward(
        &self,
        st: &mut Trials,
        trial: usize,
        mut env_b: Env,
        backward_env: &dyn Fn() -> Result<Env, CheckError>,
        tm: &mut Timings,
    ) -> Result<Option<Ran>, CheckError> {
        let (bwd, exec) = (self.bwd, self.exec);
        let mut traced = None;
        let noted = (trial == 0).then_some(("backward", &mut st.notes));
        let mut first_trace = (!exec.on_gpu()).then(Trace::default);
        let mut run = tm.time("backward", || steps::run(&mut env_b, &bwd.steps, Mode::Native, None, first_trace.as_mut(), noted, exec));
        if let (Ok(()), Some(t)) = (&run, first_trace) {
            traced = Some((env_b.clone(), t));
        }
        if run.is_err() {
            // A backward that fails may fail in more than one way (a race and an access out of
            // bounds); the run again on the reference's exact path gives the first error (in
            // program order), which is the one reported.
            env_b = backward_env()?;
            let mut t = Trace::default();
            run = tm.time("backward", || steps::run(&mut env_b, &bwd.steps, Mode::Exact, None, Some(&mut t), None, exec));
        }
        let Err(f) = run else { return Ok(Some((env_b, traced))) };
        let what = bwd.steps[f.step].describe();
        let e = match f.error {
            StepError::Spec(message) => return Err(CheckError::Backward { step: f.step, what, message }),
            StepError::Exec(e) => e,
        };
        st.found.findings.push(findings::of_error(&e, "backward", f.step, trial));
        st.found.failure = Some(Failure { step: f.step, what, message: e.to_string(), trial });
        // A racy backward still has gradients worth seeing: run it again with its races
        // resolved in program order, and show the table as provisional.
        if !matches!(*e, tilegrad_reference::ExecError::Race(_)) {
            return Ok(None);
        }
        env_b = backward_env()?;
        let mut t = Trace::default();
        if tm.time("backward", || steps::run(&mut env_b, &bwd.steps, Mode::ResolvingRaces, None, Some(&mut t), None, exec)).is_err() {
            return Ok(None);
        }
        st.found.provisional = true;
        Ok(Some((env_b.clone(), Some((env_b, t)))))
    }

    /// The backward run again from `backward_env`, recording who wrote what.
    fn rerun_traced(&self, backward_env: &dyn Fn() -> Result<Env, CheckError>, tm: &mut Timings) -> Result<(Env, Trace), CheckError> {
        let bwd = self.bwd;
        tm.time("blame", || {
            let mut env = backward_env()?;
            let mut t = Trace::default();
            steps::run(&mut env, &bwd.steps, Mode::Native, None, Some(&mut t), None, self.exec).map_err(|f| CheckError::Backward {
                step: f.step,
                what: bwd.steps[f.step].describe(),
                message: format!(
                    "the backward ran, then failed when run again to record its writers (is it deterministic?): {}",
                    f.error.message()
                ),
            })?;
            Ok((env, t))
        })
    }

    /// Each gradient compared with the ground truth (and the first trial's replays); a
    /// gradient of the wrong shape ends the comparisons with a failure. Returns each compared
    /// gradient's sample of wrong and right elements (blame's evidence), and the gradients whose
    /// worst element is to be blamed (gradient, element).
    fn compare_gradients(
        &self,
        f: &Forwarded,
        st: &mut Trials,
        trial: usize,
        env_b: &Env,
        t: &Truths,
        tm: &mut Timings,
    ) -> Result<(spectrum::Samples, Vec<(usize, usize)>), CheckError> {
        let (fwd, bwd, opts) = (self.fwd, self.bwd, self.opts);
        let (mut samples, mut to_blame) = (Vec::new(), Vec::new());
        for (gi, (input, gname)) in bwd.gradients.iter().enumerate() {
            let it_shape = &f.input_shape[input];
            let it_numel: usize = it_shape.iter().product();
            let Some(g) = env_b.tensor(gname) else {
                return Err(CheckError::Spec(format!(
                    "backward.gradients.{input} = `{gname}`: the backward defines no tensor `{gname}` (the gradient of input `{input}`)"
                )));
            };
            if bwd.steps.iter().all(|s| !step_writes(s, gname)) && !defined_by(&bwd.steps, gname) {
                return Err(CheckError::Spec(format!(
                    "backward.gradients.{input} = `{gname}`: no step of the backward writes `{gname}`, {}; a check cannot pass \
                     unless the backward produces the gradient it is compared on",
                    given_what(fwd, self.inputs, gname)
                )));
            }
            if g.shape() != &it_shape[..] {
                let message = format!("gradient `{gname}` has shape {:?}, input `{input}` has shape {:?}", g.shape(), it_shape);
                st.found.findings.push(findings::shape_mismatch(input, gname, message.clone(), bwd.steps.len(), trial));
                st.found.failure = Some(Failure { step: bwd.steps.len(), what: "gradients".into(), message, trial });
                break;
            }
            let zeros: Vec<f64>;
            let exp: &[f64] = match t.truth.get(input) {
                Some(t) => t,
                None => {
                    zeros = vec![0.0; it_numel];
                    &zeros
                }
            };
            let tol = opts.tolerance.unwrap_or_else(|| Tolerance::for_dtype(g.dtype(), self.bwd_tf32));
            let t_cmp = std::time::Instant::now();
            let (r64, r32) = (replayed(&t.replays.0, gname, it_numel), replayed(&t.replays.1, gname, it_numel));
            let got = |i: usize| g.get_f64(i);
            let tf32 = self.bwd_tf32 || self.fwd_tf32;
            let f32_pass = g.dtype() == DType::F32 && !tf32;
            let floor = match (&r64, &st.found.first[gi]) {
                (Some(r64), _) => verdict::elementwise_scale(r64, r32.as_deref(), &got, f32_pass, tol.atol),
                (None, Some((.., floor))) => *floor,
                (None, None) => 0.0,
            };
            let (mut r, w) = compare_tensor(input, gname, g, tol, exp, trial, floor);
            let mut badness = w.map_or(0.0, |(_, ratio)| ratio);
            if let Some(r64) = &r64 {
                let judged = verdict::Replayed { truth: exp, got: &got, r64, r32: r32.as_deref(), r32_of: r64, cot_rms: t.cot_rms };
                let (fo, ro) = judged.judge(g.dtype(), tf32);
                st.found.first[gi] = Some((fo.clone(), ro.clone(), floor));
                badness = badness.max(verdict::apply(&mut r, (fo, ro), opts.tolerance.is_some()));
            }
            tm.add("comparison", t_cmp.elapsed().as_secs_f64());
            // Which elements are wrong and which right, sampled: blame's evidence.
            let sample = match w.filter(|_| !r.passed) {
                Some(w) => tm.time("blame", || spectrum::Sample::compared(exp, got, tol, floor, w)),
                None => spectrum::Sample::all_right(it_numel),
            };
            samples.push((gname.clone(), sample));
            if st.found.gradients[gi].as_ref().is_none_or(|(_, b)| badness > *b) {
                if let (Some((w, _)), false) = (w, r.passed) {
                    to_blame.push((gi, w));
                }
                st.found.gradients[gi] = Some((r, badness));
            }
        }
        Ok((samples, to_blame))
    }
}
