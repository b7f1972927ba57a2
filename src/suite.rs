//! Gradient checks in a user's own `cargo test`: a [`GradCase`] bundles a forward, a backward,
//! inputs and options, and its assertions print the whole report when they fail.
//!
//! ```no_run
//! use tilegrad::suite::GradCase;
//!
//! #[test]
//! fn softmax_backward_is_right() {
//!     GradCase::from_spec("examples/softmax.toml").unwrap().seed(7).trials(3).assert_passes();
//! }
//! ```

use crate::check::{check_backward_with, Backward, CheckError, CheckOptions, Forward, Inputs, Report, Tolerance};
use crate::spec::{self, KernelOverride};
use std::path::Path;

/// One gradient check.
#[derive(Clone, Debug)]
pub struct GradCase {
    name: String,
    forward: Forward,
    backward: Backward,
    inputs: Inputs,
    options: CheckOptions,
}

impl GradCase {
    /// A check of `backward` against `forward` on `inputs`, with default options.
    pub fn new(name: &str, forward: Forward, backward: Backward, inputs: Inputs) -> GradCase {
        GradCase { name: name.to_string(), forward, backward, inputs, options: CheckOptions::default() }
    }

    /// The check a spec file describes (with its `[check]` options).
    pub fn from_spec(path: impl AsRef<Path>) -> Result<GradCase, spec::SpecError> {
        GradCase::from_spec_with(path, &[])
    }

    /// The check a spec file describes, with kernels replaced: `(key, "FILE::NAME" or "::NAME")`.
    pub fn from_spec_with(path: impl AsRef<Path>, kernels: &[(&str, &str)]) -> Result<GradCase, spec::SpecError> {
        let path = path.as_ref();
        let ov: Vec<KernelOverride> =
            kernels.iter().map(|(k, r)| KernelOverride { key: k.to_string(), reference: r.to_string() }).collect();
        let s = spec::load_with(path, &ov)?;
        let backward = s.backward.ok_or_else(|| spec::SpecError {
            file: path.display().to_string(),
            key: "backward".into(),
            message: "missing: a gradient check needs a backward".into(),
        })?;
        Ok(GradCase { name: s.name, forward: s.forward, backward, inputs: s.inputs, options: s.options })
    }

    /// Seed of inputs and cotangents.
    pub fn seed(mut self, seed: u64) -> GradCase {
        self.options.seed = seed;
        self
    }

    /// Random cotangent trials.
    pub fn trials(mut self, n: usize) -> GradCase {
        self.options.trials = n;
        self
    }

    /// Tolerances for every compared tensor (instead of the defaults by dtype).
    pub fn tolerance(mut self, rtol: f64, atol: f64) -> GradCase {
        self.options.tolerance = Some(Tolerance { rtol, atol });
        self
    }

    /// All options.
    pub fn options(mut self, options: CheckOptions) -> GradCase {
        self.options = options;
        self
    }

    /// Runs the check.
    pub fn run(&self) -> Result<Report, CheckError> {
        check_backward_with(&self.forward, &self.backward, &self.inputs, &self.options, &self.name, &mut |_, _, _| {})
    }

    /// Runs the check and panics, printing the report, unless it passes.
    #[track_caller]
    pub fn assert_passes(&self) -> Report {
        match self.run() {
            Ok(r) if r.passed => r,
            Ok(r) => panic!("gradient check `{}` failed:\n{r}", self.name),
            Err(e) => panic!("gradient check `{}` could not run: {e}", self.name),
        }
    }

    /// Runs the check and panics, printing the report, if it passes (for tests of broken
    /// backwards); returns the report for further assertions.
    #[track_caller]
    pub fn assert_fails(&self) -> Report {
        match self.run() {
            Ok(r) if !r.passed => r,
            Ok(r) => panic!("gradient check `{}` passed, but a failure was expected:\n{r}", self.name),
            Err(e) => panic!("gradient check `{}` could not run: {e}", self.name),
        }
    }
}
