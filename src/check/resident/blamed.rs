//! Blame of a failing gradient, or of the elements asked about, in a check kept on the device.
//! Which program and store wrote an element, and through which lines, is what the host's traced
//! passes tell: each launch's writers, and its tensors as they were before it ran (the slice
//! reruns one program on the reference). So the forward and the trial's backward run again,
//! traced, from the inputs and cotangents as the host draws them (the device's bits), through
//! host copies. The report's figures stay the device's; of the compared tensors, only a failing
//! gradient and its ground truth come to the host (the sample of wrong and right elements that
//! ranks the lines), and of an element asked about, its true value.

use super::env::Aside;
use crate::check::backend::Executor;
use crate::check::report::Explained;
use crate::check::spectrum::Samples;
use crate::check::steps::{self, Env, Mode, Trace};
use crate::check::{explain_elements, inputs::Keys, truth, Backward, CheckError, CheckOptions, Forward, Found, Inputs};

/// The forward as the host traced it: after it ran, and who wrote what.
pub(super) struct TracedForward {
    native: Env,
    trace: Trace,
}

/// The forward run on the inputs the host draws with `seed`, traced.
pub(super) fn traced_forward(fwd: &Forward, inputs: &Inputs, seed: u64, exec: &Executor) -> Result<TracedForward, Aside> {
    let mut native = inputs.materialise(seed).map_err(|e| e.to_string())?;
    let mut trace = Trace::default();
    steps::run(&mut native, &fwd.steps, Mode::Native, None, Some(&mut trace), None, exec)
        .map_err(|f| format!("the forward failed when run again to record its writers: {}", f.error.message()))?;
    tilegrad_reference::release_buffers();
    Ok(TracedForward { native, trace })
}

/// A trial's backward as the host traced it: after it ran, and who wrote what (the forward's
/// launches before its own).
pub(super) struct TracedBackward {
    env: Env,
    trace: Trace,
}

/// The backward run again, traced, on the forward `f` with the trial's cotangents drawn from
/// `keys` (the stream as the trial began).
pub(super) fn traced_backward(
    (fwd, bwd): (&Forward, &Backward),
    f: &TracedForward,
    keys: &mut Keys,
    exec: &Executor,
) -> Result<TracedBackward, Aside> {
    let mut env = f.native.clone();
    for (o, h) in truth::draw_cotangent_tensors(keys, &f.native, fwd).map_err(|e| e.to_string())? {
        env.add(&format!("grad_{o}"), h)?;
    }
    let mut t = Trace::default();
    steps::run(&mut env, &bwd.steps, Mode::Native, None, Some(&mut t), None, exec).map_err(|f| {
        format!("the backward ran, then failed when run again to record its writers (is it deterministic?): {}", f.error.message())
    })?;
    tilegrad_reference::release_buffers();
    Ok(TracedBackward { trace: t.after_forward(&f.trace, fwd.steps.len(), &fwd.outputs), env })
}

impl TracedBackward {
    /// Blames `to_blame` (gradient, worst element) of gradients whose reports in `found` are
    /// the traced trial's, with `samples` of every gradient that trial compared.
    pub(super) fn blame(&self, bwd: &Backward, samples: &Samples, to_blame: &[(usize, usize)], found: &mut Found) {
        found.blame_worst(bwd, (&self.env, &self.trace), to_blame, samples);
    }

    /// The elements [`crate::check::CheckOptions::blame_elements`] asks about, explained;
    /// `expected(input, e)`: the true gradient of `input` at flat element `e`.
    pub(super) fn explain(
        &self,
        opts: &CheckOptions,
        bwd: &Backward,
        expected: &dyn Fn(&str, usize) -> Result<f64, CheckError>,
        trial: usize,
    ) -> Result<Vec<Explained>, CheckError> {
        explain_elements(opts, bwd, (&self.env, &self.trace), expected, trial)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::spectrum::Sample;
    use crate::check::{check_backward, CheckOptions};
    use crate::spec::{load_with, KernelOverride};

    /// The passes run again, traced, from the inputs and the first trial's cotangents the host
    /// draws, blame a broken backward's worst element on the writers the host check blames
    /// (here on the CPU, which runs the same steps the device path hands to the host).
    #[test]
    fn blame_from_passes_traced_again_names_the_host_checks_writers() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/softplus.toml");
        let o = [KernelOverride { key: "bwd".into(), reference: "::softplus_bwd_broken_sign".into() }];
        let s = load_with(&path, &o).unwrap();
        let bwd = s.backward.as_ref().unwrap();
        let opts = CheckOptions { trials: 1, ..s.options.clone() };
        let host = check_backward(&s.forward, bwd, &s.inputs, &opts).unwrap();
        assert!(!host.passed);
        let g = host.gradients.iter().position(|r| !r.passed).expect("a failing gradient");
        let worst = host.gradients[g].worst.clone().unwrap();
        let sites = worst.blame.as_ref().map(|b| b.sites.clone()).unwrap();
        assert!(!sites.is_empty());

        let exec = opts.executor().unwrap();
        let traced = traced_forward(&s.forward, &s.inputs, opts.seed, &exec).unwrap();
        let mut unblamed = host.gradients[g].clone();
        unblamed.worst.as_mut().unwrap().blame = None;
        let mut found = Found::new(Vec::new(), bwd.gradients.len());
        found.gradients[g] = Some((unblamed, 1.0));
        let shape = &host.gradients[g].shape;
        let flat = worst.index.iter().zip(shape).fold(0, |a, (i, d)| a * d + i);
        let samples = vec![(bwd.gradients[g].1.clone(), Sample::all_right(shape.iter().product()))];
        let mut keys = truth::cotangent_rng(opts.seed);
        let tb = traced_backward((&s.forward, bwd), &traced, &mut keys, &exec).unwrap();
        tb.blame(bwd, &samples, &[(g, flat)], &mut found);
        let blamed = found.gradients[g].as_ref().and_then(|(r, _)| r.worst.as_ref()?.blame.clone()).expect("blamed");
        assert_eq!(blamed.sites, sites);
        assert!(blamed.slice.is_some_and(|s| !s.lines.is_empty()));
    }
}
