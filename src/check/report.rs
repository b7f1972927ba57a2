//! Reports: how far each gradient (and each forward output) is from the ground truth, the worst
//! element, and who wrote it. A plain-text table for people ([`std::fmt::Display`]) and JSON for
//! machines (serde). The table and its verdict lines fit 100 columns for names and shapes of
//! the usual lengths (each column is as wide as its contents); blame lines carry source paths.
//!
//! An element passes when `|got - expected| <= atol * scale + rtol * |expected|`, where `scale`
//! is the largest expected magnitude in its tensor (1 when all are zero): `atol` absorbs the
//! rounding error of sums whose terms cancel, which is proportional to the terms, not to the
//! result. Default tolerances by dtype (see [`Tolerance::for_dtype`]):
//!
//! | dtype | rtol | atol |
//! |---|---|---|
//! | f64 | 1e-9 | 1e-11 |
//! | f32 | 1e-4 | 1e-5 |
//! | f32 with a tf32 `dot` in the kernels | 1e-2 | 1e-3 |
//! | f16 | 1e-2 | 1e-3 |
//! | bf16 | 5e-2 | 5e-3 |
//! | integers (saved indices) | 0 | 0 |
//!
//! A correct f32 backward with reductions of a few thousand terms passes (blocked f32 sums err by
//! about `sqrt(n)` units of roundoff, 1e-6 relative at n = 4096); an element off by 1e-3 relative
//! fails.
//!
//! Where those defaults are loose (f16, bf16, a tf32 `dot`), an elementwise tolerance alone would
//! hide real bugs, so the tolerance is also *calibrated* to the kernel (see [`Calibration`]): the
//! ground truth is evaluated a second time in the kernels' own dtypes, its normwise distance to
//! the f64 truth is the rounding noise a correct computation in those dtypes has, and a gradient
//! whose normwise error lies far outside it fails. An explicit `rtol`/`atol` turns calibration off.
//!
//! # JSON (`--json`), schema version [`SCHEMA_VERSION`]
//!
//! A [`Report`] serialises with these fields: `schema_version`, `name`, `passed`, `seed`,
//! `trials`, `precision`, `forward` and `gradients` (arrays of [`TensorReport`]),
//! `gradients_provisional` (the gradient table comes from a backward run again with its races
//! resolved in program order, after the race failed the check), `failure` (why the backward could
//! not run: a [`Failure`]), `timings` (seconds per phase: `phases`, an array of
//! `[name, seconds]`; on the GPU backend, `compiles`: NVRTC's compiles, each with `what`,
//! `seconds`, `ended` and `waited`, see [`CompileTime`]) and `findings`: one [`Finding`] per reason the check failed, each with a
//! `kind` (see [`FindingKind`]: `wrong_value`, `non_finite`, `never_written`, `race`,
//! `out_of_bounds`, `loop_bound`, `runtime_error`, `shape_mismatch`), the pass (`forward` or
//! `backward`), the tensor, the element's multi-index, the program ids and the source locations
//! (`file`, `line`, `col`, `kernel`, `op`) as fields. Floats that are not finite are the strings
//! `"NaN"`, `"inf"` and `"-inf"` (JSON has no such numbers); every other float is a number.

use super::chunked;
use serde::{Serialize, Serializer};
use std::fmt;
use tilegrad_ir::DType;

/// The version of the JSON form of a [`Report`]; it changes when a field changes meaning or goes.
pub const SCHEMA_VERSION: u32 = 2;

/// A float as JSON: a number when finite, else the string `"NaN"`, `"inf"` or `"-inf"`.
fn float<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    if x.is_finite() {
        s.serialize_f64(*x)
    } else if x.is_nan() {
        s.serialize_str("NaN")
    } else if *x > 0.0 {
        s.serialize_str("inf")
    } else {
        s.serialize_str("-inf")
    }
}

/// An optional float as JSON (see [`float`]).
fn opt_float<S: Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match x {
        Some(x) => float(x, s),
        None => s.serialize_none(),
    }
}

/// Tolerances of a comparison (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Tolerance {
    /// Relative to the element's expected value.
    pub rtol: f64,
    /// Relative to the largest expected magnitude of the tensor.
    pub atol: f64,
}

impl Tolerance {
    /// The default for a tensor of `dtype`; `tf32` when the kernels computing it use a tf32 `dot`
    /// on f32 operands.
    pub fn for_dtype(dtype: DType, tf32: bool) -> Tolerance {
        let (rtol, atol) = match dtype {
            DType::F64 => (1e-9, 1e-11),
            DType::F32 if tf32 => (1e-2, 1e-3),
            DType::F16 => (1e-2, 1e-3),
            DType::BF16 => (5e-2, 5e-3),
            DType::F32 => (1e-4, 1e-5),
            DType::I1 | DType::I32 | DType::I64 => (0.0, 0.0),
        };
        Tolerance { rtol, atol }
    }
}

/// Where a value came from: the steps it went through after the kernels wrote it, and the writers.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Blame {
    /// Host steps between the kernels' writes and the compared tensor, outermost first.
    pub via: Vec<String>,
    /// Who wrote the element (or the elements it was computed from).
    pub sites: Vec<BlameSite>,
    /// The source lines through which the element's value was computed (see [`Slice`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slice: Option<Slice>,
}

/// One writer of a blamed element.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BlameSite {
    /// A store or `atomic_add` of a kernel.
    Store {
        /// Step of the pass (0-based) that launched the kernel.
        step: usize,
        /// Kernel name.
        kernel: String,
        /// Op mnemonic (`store`, `atomic_add`).
        op: String,
        /// Source location of the op (file:line:col).
        loc: String,
        /// Where the stored value was computed, when on another line than the store.
        value_loc: Option<String>,
        /// Where the address (pointer arithmetic) was computed, when on another line.
        address_loc: Option<String>,
        /// Program ids that wrote the blamed elements (at most 4 listed).
        programs: Vec<[u32; 3]>,
        /// Blamed elements written by this op.
        elements: usize,
    },
    /// Several programs added to the element atomically.
    ManyPrograms {
        /// Step of the pass that launched the kernel.
        step: usize,
        /// Kernel name.
        kernel: String,
        /// Source location of the op.
        loc: String,
    },
    /// No program wrote the element.
    NeverWritten {
        /// The tensor.
        tensor: String,
        /// The first such element's multi-index.
        index: Vec<usize>,
        /// How many of the blamed elements were never written.
        elements: usize,
        /// What it was initialised with (`NaN` for an empty allocation, `zero`).
        init: String,
    },
    /// The element is part of a tensor the pass was given, not one it computed.
    Given {
        /// The tensor.
        tensor: String,
    },
}

impl fmt::Display for Blame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for v in &self.via {
            writeln!(f, "      via {v}")?;
        }
        for s in &self.sites {
            match s {
                BlameSite::Store { step, kernel, op, loc, value_loc, address_loc, programs, elements } => {
                    let p: Vec<String> = programs.iter().map(|p| format!("({}, {}, {})", p[0], p[1], p[2])).collect();
                    let more = if *elements > programs.len() { format!(" ({elements} elements)") } else { String::new() };
                    writeln!(f, "      written by `{op}` at {loc} (kernel `{kernel}`, step {step}), program {}{more}", p.join(", "))?;
                    let from: Vec<String> = [("value", value_loc), ("address", address_loc)]
                        .iter()
                        .filter_map(|(what, l)| l.as_ref().map(|l| format!("{what} computed at {l}")))
                        .collect();
                    if !from.is_empty() {
                        writeln!(f, "        {}", from.join("; "))?;
                    }
                }
                BlameSite::ManyPrograms { step, kernel, loc } => {
                    writeln!(f, "      added to by several programs at {loc} (kernel `{kernel}`, step {step})")?
                }
                BlameSite::NeverWritten { tensor, index, elements, init } => writeln!(
                    f,
                    "      never written: `{tensor}`{index:?} kept its initial value ({init}){}",
                    if *elements > 1 {
                        format!("; {elements} of the elements it was computed from were never written")
                    } else {
                        String::new()
                    }
                )?,
                BlameSite::Given { tensor } => writeln!(f, "      taken unchanged from the given tensor `{tensor}`")?,
            }
        }
        if let Some(s) = &self.slice {
            write!(f, "{s}")?;
        }
        Ok(())
    }
}

pub use super::error_map::{ErrorMap, Judged};
pub use super::slice::{Slice, SliceLine};

/// The worst element of a comparison.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Worst {
    /// Multi-index.
    pub index: Vec<usize>,
    /// Ground truth.
    #[serde(serialize_with = "float")]
    pub expected: f64,
    /// What the checked code produced.
    #[serde(serialize_with = "float")]
    pub got: f64,
    /// Who wrote it.
    pub blame: Option<Blame>,
}

/// One compared tensor.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TensorReport {
    /// For a gradient, the differentiable input; for a forward output, the output.
    pub name: String,
    /// The tensor compared (the backward's gradient tensor, or the output).
    pub tensor: String,
    /// Its dtype.
    pub dtype: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Tolerances applied.
    pub tolerance: Tolerance,
    /// Largest `|got - expected|`: NaN when some element is NaN where a finite value is
    /// expected, infinite when some is infinite.
    #[serde(serialize_with = "float")]
    pub max_abs_err: f64,
    /// Largest `|got - expected| / max(|expected|, (atol / rtol) * scale)` (NaN and infinite as
    /// `max_abs_err`).
    #[serde(serialize_with = "float")]
    pub max_rel_err: f64,
    /// `||got - expected||_2 / ||expected||_2`: NaN or infinite as `max_abs_err`, never a
    /// small number computed over the finite elements alone.
    #[serde(serialize_with = "float")]
    pub normwise_rel_err: f64,
    /// Elements over tolerance.
    pub over_tolerance: usize,
    /// NaN elements in `got`.
    pub nan: usize,
    /// Infinite elements in `got`.
    pub inf: usize,
    /// The calibrated normwise tolerance, where the tolerance was calibrated to the kernel (the
    /// Python package's tensors; the Rust check judges [`TensorReport::formula`] and
    /// [`TensorReport::rounding`] instead).
    pub calibration: Option<Calibration>,
    /// Formula: the pass replayed with every float in f64 against the truth.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub formula: Option<Formula>,
    /// Rounding: the pass as written against the truth, in units of roundoff.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub rounding: Option<Rounding>,
    /// The element furthest over (or closest to) its tolerance.
    pub worst: Option<Worst>,
    /// Where the elements over tolerance are (`None` when none is).
    pub error_map: Option<ErrorMap>,
    /// The cotangent trial (0-based) this comparison comes from (the worst trial).
    pub trial: usize,
    /// Every element within tolerance.
    pub passed: bool,
}

/// A tolerance calibrated to the kernel: how far from the f64 ground truth a correct computation
/// in the kernels' own dtypes lands, and the normwise error a gradient may have.
///
/// Distances are normwise, relative to the f64 ground truth's norm, and measured against the
/// ground truth rounded to the gradient's dtype (the best a backward can store). `noise` is the
/// distance of the ground truth evaluated in the kernels' dtypes (the forward's ops rounded as the
/// kernels round them), for the same cotangent: a correct hand-written backward makes errors of
/// the same kind and size. `limit = max(3 * noise, half a unit of roundoff of the dtype)`. A
/// gradient whose `error` exceeds the limit fails even when every element is within the
/// elementwise tolerance.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Calibration {
    /// Distance of the ground truth computed in the kernels' dtypes.
    #[serde(serialize_with = "float")]
    pub noise: f64,
    /// The distance a gradient may have.
    #[serde(serialize_with = "float")]
    pub limit: f64,
    /// Distance of the checked gradient.
    #[serde(serialize_with = "float")]
    pub error: f64,
    /// `limit / error`: at least 1 passes, below 1 fails.
    #[serde(serialize_with = "float")]
    pub margin: f64,
}

/// Is the pass the derivative (the formula), whatever its dtypes? Its replay with every float
/// in f64 against the truth (see [`super::verdict`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Formula {
    /// `||replay - truth|| / scale` (normwise, relative to the scale of what was computed).
    #[serde(rename = "formula_error", serialize_with = "float")]
    pub error: f64,
    /// The largest error f64 rounding explains.
    #[serde(rename = "formula_limit", serialize_with = "float")]
    pub limit: f64,
    /// Within the limit.
    #[serde(rename = "formula_passed")]
    pub passed: bool,
}

/// Is the pass's rounding what its dtypes allow? Its normwise error against the truth in units
/// of roundoff of its dtype (see [`super::verdict`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rounding {
    /// `||got - truth|| / (u * scale)`.
    #[serde(rename = "rounding_units", serialize_with = "float")]
    pub units: f64,
    /// The units a correct pass in this dtype stays within.
    #[serde(rename = "rounding_budget", serialize_with = "float")]
    pub budget: f64,
    /// Whose roundoff: the dtype, or `tf32`.
    #[serde(rename = "rounding_of")]
    pub of: String,
    /// Within the budget.
    #[serde(rename = "rounding_passed")]
    pub passed: bool,
}

/// The backward could not produce gradients (a verdict: the check fails).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Failure {
    /// Step of the backward (0-based).
    pub step: usize,
    /// The step.
    pub what: String,
    /// What went wrong, with kernel, op, source location and program id.
    pub message: String,
    /// The cotangent trial.
    pub trial: usize,
}

/// What kind of failure a [`Finding`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// Elements of a compared tensor are outside the tolerance (or the normwise error is over
    /// its calibrated limit).
    WrongValue,
    /// Elements of a compared tensor are NaN or infinite where the ground truth is finite.
    NonFinite,
    /// The worst element of a compared tensor was never written by the pass.
    NeverWritten,
    /// Two programs (or two lanes of one store) access one element without ordering.
    Race,
    /// An unmasked lane accessed memory outside its tensor.
    OutOfBounds,
    /// A loop ran more iterations than its bound.
    LoopBound,
    /// Something undefined happened at run time (integer division by zero, ...).
    RuntimeError,
    /// A gradient tensor's shape is not its input's.
    ShapeMismatch,
    /// The formula is right (the exact replay agrees) but the rounding is beyond its dtype's
    /// budget ([`super::verdict`]).
    Precision,
    /// A forward launch accessed memory outside a tensor (a defect of the user's forward).
    ForwardOutOfBounds,
    /// Two programs of a forward launch access one element without ordering.
    ForwardRace,
    /// A loop of a forward launch ran more iterations than its bound.
    ForwardLoopBound,
    /// Something undefined happened in a forward launch (integer division by zero, ...).
    ForwardRuntimeError,
    /// A note (a failure only in strict mode): a launch's results depend on masked-off lanes of
    /// loads without `other`, which read 0 on Triton's GPU backends but are documented as
    /// undefined.
    MaskedLanes,
    /// A note: programs conflict on an element with an outcome that does not depend on their
    /// order (the same bits stored; a load of an element no store changed).
    SameValueRace,
    /// A note, never a failure: the ground truth of a forward launch was computed by the
    /// evaluator on the host because its VJP kernel was refused (`--ground kernels`).
    GroundByEvaluator,
}

impl FindingKind {
    /// Whether a note of this kind fails a strict check: what a launch relies on that Triton does
    /// not promise does; how the ground truth was computed does not.
    pub fn fails_when_strict(self) -> bool {
        !matches!(self, FindingKind::GroundByEvaluator)
    }
}

/// A source location in a finding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Location {
    /// Source file.
    pub file: String,
    /// Line, from 1.
    pub line: u32,
    /// Column, from 1.
    pub col: u32,
    /// Kernel.
    pub kernel: String,
    /// Op mnemonic.
    pub op: String,
}

/// One reason a check failed, as fields (the JSON report's `findings`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    /// What kind of failure.
    pub kind: FindingKind,
    /// `forward` (a forward output or saved tensor against the ground truth's forward) or
    /// `backward`.
    pub pass: &'static str,
    /// For a compared tensor: the differentiable input (gradients) or the output (forward).
    pub name: Option<String>,
    /// The tensor concerned.
    pub tensor: Option<String>,
    /// The element (multi-index; for races and out-of-bounds accesses the flat offset).
    pub element: Option<Vec<i64>>,
    /// Ground truth at the element.
    #[serde(serialize_with = "opt_float")]
    pub expected: Option<f64>,
    /// The value found at the element.
    #[serde(serialize_with = "opt_float")]
    pub got: Option<f64>,
    /// How many elements are affected, where known.
    pub count: Option<usize>,
    /// The cotangent trial.
    pub trial: Option<usize>,
    /// Step of the pass (0-based), where one step is concerned.
    pub step: Option<usize>,
    /// Program ids concerned.
    pub programs: Vec<[u32; 3]>,
    /// Source locations concerned (the writing store; both accesses of a race).
    pub locations: Vec<Location>,
    /// For a NaN or infinite value: where it came from (an element never written, its memory
    /// allocated empty; the first op that made it from finite operands; a load that read it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// The same in words.
    pub message: String,
}

/// The outcome of a check.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// Version of the JSON form ([`SCHEMA_VERSION`]).
    pub schema_version: u32,
    /// Name of the check.
    pub name: String,
    /// Everything within tolerance and the backward ran cleanly.
    pub passed: bool,
    /// Seed of the random inputs and cotangents.
    pub seed: u64,
    /// Random cotangent trials.
    pub trials: usize,
    /// Precision of the ground truth (`f64` or `native`).
    pub precision: String,
    /// The forward's outputs: the kernels in their dtypes against the ground truth's forward.
    pub forward: Vec<TensorReport>,
    /// One per differentiable input: the backward's gradient against the ground truth.
    pub gradients: Vec<TensorReport>,
    /// The gradient table comes from the backward run again with its races resolved in program
    /// order (the highest program id's store wins), after a race failed the check.
    pub gradients_provisional: bool,
    /// Why the backward failed to run, if it did.
    pub failure: Option<Failure>,
    /// The forward launch that failed as it would on a GPU (out of bounds, a race, a loop past
    /// its bound), if one did: a defect of the forward, so no gradient was compared.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forward_failure: Option<Failure>,
    /// Every reason the check failed, as fields.
    pub findings: Vec<Finding>,
    /// What the kernels rely on that Triton does not promise, though its GPU backends do it
    /// (masked-off lanes read as 0; conflicts whose outcome does not depend on the order of
    /// programs): not failures, unless the check is strict (then each is also a finding); and
    /// launches whose ground truth the evaluator computed ([`FindingKind::GroundByEvaluator`]),
    /// never failures.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<Finding>,
    /// Notes fail the check ([`super::CheckOptions::strict`]).
    pub strict: bool,
    /// Elements asked about ([`super::CheckOptions::blame_elements`]), with their blame.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub explained: Vec<Explained>,
    /// Seconds spent per phase of the check (printed by `--timings`).
    pub timings: Timings,
    /// Where the launches ran: `cpu`, or the GPU and the launches it passed to the reference.
    pub backend: String,
    /// With [`super::Backend::Compare`]: launches whose GPU run differed from the reference's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub backend_mismatches: Vec<String>,
}

/// Wall-clock seconds per phase of a check, in the order the phases first ran (a phase that runs
/// once per trial is summed over the trials).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Timings {
    /// `(phase, seconds)`.
    pub phases: Vec<(String, f64)>,
    /// NVRTC's compiles on the GPU backend, in the order they ended: they run in the background,
    /// beside the phases, whose seconds include only the waits for them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub compiles: Vec<CompileTime>,
}

/// One NVRTC compile of a check (see [`Timings::compiles`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CompileTime {
    /// The kernel, "in f64" for the ground truth's forms, or the fixed CUDA C compiled.
    pub what: String,
    /// Seconds NVRTC took.
    pub seconds: f64,
    /// When it ended, in seconds from the check's start.
    pub ended: f64,
    /// Seconds the check waited for it.
    pub waited: f64,
}

impl CompileTime {
    /// `c`, in seconds from `start`.
    pub fn of(c: &tilegrad_gpu::Compile, start: std::time::Instant) -> CompileTime {
        CompileTime {
            what: c.what.clone(),
            seconds: (c.ended - c.started).as_secs_f64(),
            ended: (c.ended.saturating_duration_since(start)).as_secs_f64(),
            waited: c.waited.as_secs_f64(),
        }
    }
}

impl Timings {
    /// Adds `seconds` to `phase`.
    pub fn add(&mut self, phase: &str, seconds: f64) {
        match self.phases.iter_mut().find(|(p, _)| p == phase) {
            Some((_, s)) => *s += seconds,
            None => self.phases.push((phase.to_string(), seconds)),
        }
    }

    /// Runs `f` as (part of) `phase`.
    pub fn time<T>(&mut self, phase: &str, f: impl FnOnce() -> T) -> T {
        let t = std::time::Instant::now();
        let out = f();
        self.add(phase, t.elapsed().as_secs_f64());
        out
    }

    /// Total seconds.
    pub fn total(&self) -> f64 {
        self.phases.iter().map(|(_, s)| s).sum()
    }
}

impl fmt::Display for Timings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.total();
        writeln!(f, "timings")?;
        for (p, s) in &self.phases {
            writeln!(f, "  {p:<40} {s:>9.3} s {:>5.1}%", if total > 0.0 { 100.0 * s / total } else { 0.0 })?;
        }
        writeln!(f, "  {:<40} {total:>9.3} s", "total")?;
        if !self.compiles.is_empty() {
            writeln!(f, "NVRTC compiles, beside the phases          seconds  ended at    waited")?;
            for c in &self.compiles {
                writeln!(f, "  {:<40} {:>7.3} s {:>7.3} s {:>7.3} s", c.what, c.seconds, c.ended, c.waited)?;
            }
        }
        Ok(())
    }
}

/// An element of a gradient asked about: its values in the last trial, and who computed it how.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Explained {
    /// The gradient tensor.
    pub tensor: String,
    /// The trial (0-based).
    pub trial: usize,
    /// The element, its values and its blame.
    pub element: Worst,
}

impl Finding {
    /// A finding of `kind` in `pass` with every other field empty.
    pub fn new(kind: FindingKind, pass: &'static str) -> Finding {
        Finding {
            kind,
            pass,
            name: None,
            tensor: None,
            element: None,
            expected: None,
            got: None,
            count: None,
            trial: None,
            step: None,
            programs: Vec::new(),
            locations: Vec::new(),
            origin: None,
            message: String::new(),
        }
    }
}

impl Report {
    /// A report from its compared tensors and the failure of the backward, if any (for front
    /// ends that run the passes themselves, as the Python package does): `passed` and the
    /// findings follow from them.
    pub fn new(
        name: String,
        seed: u64,
        trials: usize,
        precision: String,
        forward: Vec<TensorReport>,
        gradients: Vec<TensorReport>,
        failure: Option<Failure>,
    ) -> Report {
        let passed = failure.is_none() && forward.iter().all(|r| r.passed) && gradients.iter().all(|r| r.passed);
        let mut findings: Vec<Finding> = forward.iter().filter_map(|r| super::findings::of_tensor("forward", r)).collect();
        findings.extend(failure.as_ref().map(super::findings::of_failure));
        findings.extend(gradients.iter().filter_map(|r| super::findings::of_tensor("backward", r)));
        Report {
            schema_version: SCHEMA_VERSION,
            name,
            passed,
            seed,
            trials,
            precision,
            forward,
            gradients,
            gradients_provisional: false,
            failure,
            forward_failure: None,
            findings,
            notes: Vec::new(),
            strict: false,
            explained: Vec::new(),
            timings: Timings::default(),
            backend: "cpu".into(),
            backend_mismatches: Vec::new(),
        }
    }

    /// The report with `notes` ([`Report::notes`]); `strict` makes each a finding that fails it.
    pub fn with_notes(mut self, notes: Vec<Finding>, strict: bool) -> Report {
        self.strict = strict;
        let failing: Vec<Finding> = notes.iter().filter(|n| strict && n.kind.fails_when_strict()).cloned().collect();
        if !failing.is_empty() {
            self.passed = false;
            self.findings.extend(failing);
        }
        self.notes = notes;
        self
    }

    /// The report as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("reports serialise")
    }
}

/// Notes as a list, each message's first line a bullet and the rest indented under it.
fn notes_list(f: &mut fmt::Formatter<'_>, notes: &[&Finding]) -> fmt::Result {
    for n in notes {
        let mut lines = n.message.lines();
        writeln!(f, "  - {}", lines.next().unwrap_or_default())?;
        for l in lines {
            writeln!(f, "    {l}")?;
        }
    }
    Ok(())
}

/// The table's header; each column is as wide as its header or its widest cell, so that a table
/// of the usual names and shapes fits in 100 columns.
const COLUMNS: [&str; 12] =
    ["", "tensor", "shape", "dtype", "max abs", "max rel", "norm rel", "over tol", "nan/inf", "rtol", "atol", "result"];
/// The columns aligned right (numbers); the others align left.
const RIGHT: [bool; 12] = [false, false, false, false, true, true, true, true, true, false, false, false];
/// Spaces before each column: groups of names, errors, tolerances and the result.
const GAP: [usize; 12] = [2, 1, 1, 1, 2, 1, 1, 1, 1, 2, 1, 2];

fn table(f: &mut fmt::Formatter<'_>, first: &str, rows: &[TensorReport]) -> fmt::Result {
    let mut header = COLUMNS.map(String::from);
    header[0] = first.to_string();
    let cells: Vec<[String; 12]> = rows
        .iter()
        .map(|r| {
            [
                r.name.clone(),
                r.tensor.clone(),
                format!("{:?}", r.shape),
                r.dtype.clone(),
                format!("{:.3e}", r.max_abs_err),
                format!("{:.3e}", r.max_rel_err),
                format!("{:.3e}", r.normwise_rel_err),
                r.over_tolerance.to_string(),
                (r.nan + r.inf).to_string(),
                format!("{:.0e}", r.tolerance.rtol),
                format!("{:.0e}", r.tolerance.atol),
                (if r.passed { "ok" } else { "FAIL" }).to_string(),
            ]
        })
        .collect();
    let mut width: [usize; 12] = std::array::from_fn(|i| header[i].len());
    for row in &cells {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    for row in std::iter::once(&header).chain(&cells) {
        let mut line = String::new();
        for (i, c) in row.iter().enumerate() {
            let pad = " ".repeat(width[i] - c.chars().count());
            line.push_str(&" ".repeat(GAP[i]));
            if RIGHT[i] {
                line.push_str(&pad);
                line.push_str(c);
            } else {
                line.push_str(c);
                line.push_str(&pad);
            }
        }
        writeln!(f, "{}", line.trim_end())?;
    }
    for r in rows {
        if let Some((formula, rounding)) = verdict_lines(r) {
            writeln!(f, "    `{}`: {formula}", r.tensor)?;
            writeln!(f, "    {:w$}  {rounding}", "", w = r.tensor.chars().count() + 2)?;
        }
    }
    for r in rows {
        if let Some(c) = &r.calibration {
            writeln!(
                f,
                "    `{}` ({}): calibrated normwise tolerance {:.2e} against the truth rounded to {}",
                r.tensor, r.dtype, c.limit, r.dtype
            )?;
            writeln!(
                f,
                "      (the truth computed in the kernels' dtypes is off by {:.2e}); error {:.2e}, {}",
                c.noise,
                c.error,
                match c.margin {
                    m if m.is_nan() || m == 0.0 => "a NaN or infinite element".to_string(),
                    m if m >= 1.0 => format!("{m:.1}x within"),
                    m => format!("{:.1}x over", 1.0 / m),
                }
            )?;
        }
    }
    let mut shown: Vec<(&str, &[usize])> = Vec::new();
    for r in rows.iter().filter(|r| !r.passed) {
        if let Some(w) = &r.worst {
            // One tensor that is the gradient of two inputs (`grad_x` and `grad_y` both `g`):
            // its worst element is explained once.
            if shown.contains(&(r.tensor.as_str(), w.index.as_slice())) {
                continue;
            }
            shown.push((&r.tensor, &w.index));
            let what = format!("    worst element of `{}`: {:?}", r.tensor, w.index);
            element_line(f, &what, w, r.trial)?;
            if let Some(b) = &w.blame {
                write!(f, "{b}")?;
            }
        }
        if let Some(m) = &r.error_map {
            write!(f, "{}", m.text(&r.tensor))?;
        }
    }
    Ok(())
}

/// `what` (an element) with its expected and got values: one line where it fits 100 columns, else
/// the values on a line of their own.
fn element_line(f: &mut fmt::Formatter<'_>, what: &str, w: &Worst, trial: usize) -> fmt::Result {
    let values = format!("expected {:e}, got {:e} (trial {trial})", w.expected, w.got);
    if what.chars().count() + 1 + values.chars().count() <= 100 {
        writeln!(f, "{what} {values}")
    } else {
        let indent = what.len() - what.trim_start().len() + 2;
        writeln!(f, "{what}\n{:indent$}{values}", "")
    }
}

/// The formula and rounding verdicts of a compared tensor in words, one line each.
fn verdict_lines(r: &TensorReport) -> Option<(String, String)> {
    let (fo, ro) = (r.formula.as_ref()?, r.rounding.as_ref()?);
    let formula = if fo.passed {
        format!("formula: the exact replay agrees ({:.1e} of the scale)", fo.error)
    } else {
        format!("formula: WRONG even in exact arithmetic (replay off by {:.2e} of the scale)", fo.error)
    };
    let rounding = match (ro.passed, fo.passed) {
        (true, _) => format!("rounding: {:.2} u of {} (budget {} u)", ro.units, ro.of, ro.budget),
        (false, true) => format!("rounding: the formula is right; the {} rounding is {:.1} u (budget {} u)", ro.of, ro.units, ro.budget),
        (false, false) => format!("rounding: {} u of {}", units(ro.units), ro.of),
    };
    Some((formula, rounding))
}

/// Units of roundoff for people: `7.1`, or `1.27e6` past a thousand.
fn units(u: f64) -> String {
    if u < 1000.0 {
        format!("{u:.1}")
    } else {
        format!("{u:.2e}")
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "check `{}`: {} (seed {}, {} cotangent trial{}, ground truth {})",
            self.name,
            if self.passed { "PASS" } else { "FAIL" },
            self.seed,
            self.trials,
            if self.trials == 1 { "" } else { "s" },
            self.precision
        )?;
        if self.backend != "cpu" {
            writeln!(f, "backend: {}", self.backend)?;
        }
        for m in &self.backend_mismatches {
            writeln!(f, "GPU/reference mismatch: {m}")?;
        }
        if !self.forward.is_empty() {
            writeln!(f, "forward outputs and saved tensors (kernels in their dtypes vs the ground truth's forward)")?;
            table(f, "output", &self.forward)?;
        }
        if let Some(fl) = &self.forward_failure {
            writeln!(f, "forward failed at step {} ({}): a defect of the forward (a kernel or its launch), as on a GPU", fl.step, fl.what)?;
            for l in fl.message.lines() {
                writeln!(f, "  {l}")?;
            }
        }
        if let Some(fl) = &self.failure {
            writeln!(f, "backward failed at step {} ({}), trial {}:", fl.step, fl.what, fl.trial)?;
            for l in fl.message.lines() {
                writeln!(f, "  {l}")?;
            }
        }
        if !self.gradients.is_empty() {
            if self.gradients_provisional {
                writeln!(
                    f,
                    "gradients (backward vs ground truth; provisional: the backward run again with its races resolved in program order)"
                )?;
            } else {
                writeln!(f, "gradients (backward vs ground truth)")?;
            }
            table(f, "input", &self.gradients)?;
        }
        let (strict, always): (Vec<&Finding>, Vec<&Finding>) = self.notes.iter().partition(|n| n.kind.fails_when_strict());
        if !strict.is_empty() {
            let how = if self.strict { "failures: the check is strict" } else { "not failures; --strict makes them failures" };
            writeln!(f, "notes ({how})")?;
            notes_list(f, &strict)?;
        }
        if !always.is_empty() {
            writeln!(f, "notes on the ground truth (not failures)")?;
            notes_list(f, &always)?;
        }
        for x in &self.explained {
            let w = &x.element;
            element_line(f, &format!("  element `{}`{:?}:", x.tensor, w.index), w, x.trial)?;
            if let Some(b) = &w.blame {
                write!(f, "{b}")?;
            }
        }
        Ok(())
    }
}

/// Compares `got` with `expected`; returns the report (without blame), the flat index of the
/// worst element and how far over its tolerance it is (error / tolerance; infinite for NaN).
#[allow(clippy::too_many_arguments)]
pub fn compare(
    name: &str,
    tensor: &str,
    dtype: DType,
    shape: &[usize],
    tol: Tolerance,
    expected: &[f64],
    got: &[f64],
    trial: usize,
) -> (TensorReport, Option<(usize, f64)>) {
    assert_eq!(expected.len(), got.len(), "compared tensors have one length");
    compare_by(name, tensor, dtype, shape, tol, expected, |i| got[i], trial, 0.0)
}

/// [`compare`] with the checked values read element by element (`got(i)` for `i` in
/// `0..expected.len()`), so that a tensor in its own dtype needs no f64 copy; `terms` is the
/// size of what was computed where terms cancel (the scale `atol` is relative to is the larger
/// of it and the largest expected value).
#[allow(clippy::too_many_arguments)]
pub fn compare_by(
    name: &str,
    tensor: &str,
    dtype: DType,
    shape: &[usize],
    tol: Tolerance,
    expected: &[f64],
    got: impl Fn(usize) -> f64 + Sync,
    trial: usize,
    terms: f64,
) -> (TensorReport, Option<(usize, f64)>) {
    let n = expected.len();
    let (scale, floor) = scale_and_floor(chunked::max(n, |i| if expected[i].is_finite() { expected[i].abs() } else { 0.0 }), terms, tol);
    let tally = chunked::fold(n, |r| Tally::of(r, expected, &got, tol, scale, floor), Tally::then).unwrap_or_default();
    let values = tally.worst.map(|(i, _)| (expected[i], got(i)));
    tallied(Head { name, tensor, dtype, shape, tol, trial }, tally, values, || {
        error_map_of(shape, expected, &got, |e, g| judge(e, g, tol, scale))
    })
}

/// The scale `atol` is relative to (the largest finite expected value, at least `terms`; 1 where
/// both are 0) and the least denominator of relative errors.
pub(crate) fn scale_and_floor(max_expected: f64, terms: f64, tol: Tolerance) -> (f64, f64) {
    let scale = max_expected.max(terms);
    let scale = if scale > 0.0 { scale } else { 1.0 };
    (scale, if tol.rtol > 0.0 { tol.atol / tol.rtol * scale } else { 0.0 })
}

/// What names a compared tensor in its report.
pub(crate) struct Head<'a> {
    pub name: &'a str,
    pub tensor: &'a str,
    pub dtype: DType,
    pub shape: &'a [usize],
    pub tol: Tolerance,
    pub trial: usize,
}

/// The report of a comparison from its [`Tally`]: `values` are the expected and checked values
/// of the worst element, and `error_map` maps the elements where some are over tolerance.
pub(crate) fn tallied(
    h: Head,
    tally: Tally,
    values: Option<(f64, f64)>,
    error_map: impl FnOnce() -> ErrorMap,
) -> (TensorReport, Option<(usize, f64)>) {
    let Tally { max_abs, max_rel, num, den, over, nan, inf, worst, poison } = tally;
    let (mut max_abs, mut max_rel) = (max_abs, max_rel);
    let mut normwise = if den > 0.0 { (num / den).sqrt() } else { num.sqrt() };
    if let Some(p) = poison {
        (max_abs, max_rel, normwise) = (p, p, p);
    }
    let report = TensorReport {
        name: h.name.to_string(),
        tensor: h.tensor.to_string(),
        dtype: h.dtype.to_string(),
        shape: h.shape.to_vec(),
        tolerance: h.tol,
        max_abs_err: max_abs,
        max_rel_err: max_rel,
        normwise_rel_err: normwise,
        over_tolerance: over,
        nan,
        inf,
        calibration: None,
        formula: None,
        rounding: None,
        worst: worst.zip(values).map(|((i, _), (expected, got))| Worst { index: unravel(i, h.shape), expected, got, blame: None }),
        error_map: (over > 0).then(error_map),
        trial: h.trial,
        passed: over == 0,
    };
    (report, worst)
}

/// A comparison's figures over a run of elements ([`compare_by`]).
#[derive(Default)]
pub(crate) struct Tally {
    pub max_abs: f64,
    pub max_rel: f64,
    pub num: f64,
    pub den: f64,
    pub over: usize,
    pub nan: usize,
    pub inf: usize,
    /// The first element of the largest ratio to its tolerance.
    pub worst: Option<(usize, f64)>,
    /// A mismatch involving a non-finite value makes every metric NaN (a NaN on either side) or
    /// infinite, never a small number computed over the finite elements alone.
    pub poison: Option<f64>,
}

impl Tally {
    fn of(r: std::ops::Range<usize>, expected: &[f64], got: &impl Fn(usize) -> f64, tol: Tolerance, scale: f64, floor: f64) -> Tally {
        let mut t = Tally::default();
        for i in r {
            let (e, g) = (expected[i], got(i));
            t.nan += g.is_nan() as usize;
            t.inf += g.is_infinite() as usize;
            let Judged { ratio, nonfinite, nan: with_nan } = judge(e, g, tol, scale);
            if nonfinite {
                let p = if with_nan { f64::NAN } else { f64::INFINITY };
                t.poison = Some(if t.poison.is_some_and(f64::is_nan) { f64::NAN } else { p });
            } else if e.is_finite() {
                let d = (g - e).abs();
                t.max_abs = t.max_abs.max(d);
                t.max_rel = t.max_rel.max(d / e.abs().max(floor));
                t.num += d * d;
                t.den += e * e;
            }
            t.over += (ratio > 1.0) as usize;
            if t.worst.is_none_or(|(_, w)| ratio > w) {
                t.worst = Some((i, ratio));
            }
        }
        t
    }

    /// This run's tally followed by the next run's.
    fn then(self, b: Tally) -> Tally {
        let worst = match (self.worst, b.worst) {
            (Some(a), Some(w)) if w.1 > a.1 => Some(w),
            (None, w) => w,
            (a, _) => a,
        };
        // NaN once any run had a NaN (a sequential pass keeps it), else infinite if any.
        let nan = self.poison.is_some_and(f64::is_nan) || b.poison.is_some_and(f64::is_nan);
        let poison = if nan { Some(f64::NAN) } else { b.poison.or(self.poison) };
        Tally {
            max_abs: self.max_abs.max(b.max_abs),
            max_rel: self.max_rel.max(b.max_rel),
            num: self.num + b.num,
            den: self.den + b.den,
            over: self.over + b.over,
            nan: self.nan + b.nan,
            inf: self.inf + b.inf,
            worst,
            poison,
        }
    }
}

/// The comparison's test of one element: `|got - expected|` over its tolerance (`atol` relative
/// to `scale`), infinite where a non-finite value on either side is not matched exactly.
pub fn judge(e: f64, g: f64, tol: Tolerance, scale: f64) -> Judged {
    let nonfinite = if !e.is_finite() { !(g.is_nan() && e.is_nan() || g == e) } else { !g.is_finite() };
    let d = (g - e).abs();
    let ratio = if nonfinite {
        f64::INFINITY
    } else if !e.is_finite() || d == 0.0 {
        0.0
    } else {
        d / (tol.atol * scale + tol.rtol * e.abs())
    };
    Judged { ratio, nonfinite, nan: nonfinite && (g.is_nan() || e.is_nan()) }
}

/// The [`ErrorMap`] of a comparison ([`judge`] on each element); a tensor whose shape does not
/// hold the values is mapped as 1-D.
pub(crate) fn error_map_of(
    shape: &[usize],
    expected: &[f64],
    got: &(impl Fn(usize) -> f64 + Sync),
    judge: impl Fn(f64, f64) -> Judged + Sync,
) -> ErrorMap {
    let flat = [expected.len()];
    let shape = if shape.iter().product::<usize>() == expected.len() { shape } else { &flat };
    ErrorMap::build(shape, |i| judge(expected[i], got(i)), |i| (expected[i], got(i)))
}

/// The multi-index of flat element `i` of a row-major tensor of `shape`.
pub fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for a in (0..shape.len()).rev() {
        let n = shape[a].max(1);
        idx[a] = i % n;
        i /= n;
    }
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(expected: &[f64], got: &[f64]) -> TensorReport {
        compare("x", "grad_x", DType::F32, &[expected.len()], Tolerance::for_dtype(DType::F32, false), expected, got, 0).0
    }

    #[test]
    fn compiles_are_listed_beside_the_phases_and_not_in_their_total() {
        let mut t = Timings::default();
        t.add("forward", 0.25);
        t.add("backward", 0.5);
        assert!(!t.to_string().contains("NVRTC"));
        assert!(!serde_json::to_string(&t).unwrap().contains("compiles"));
        t.compiles.push(CompileTime { what: "layer_norm_fwd in f64".into(), seconds: 1.25, ended: 1.5, waited: 0.375 });
        let text = t.to_string();
        let line = text.lines().find(|l| l.contains("layer_norm_fwd in f64")).unwrap();
        let figures: Vec<&str> = line.split_whitespace().filter(|w| w.parse::<f64>().is_ok()).collect();
        assert_eq!(figures, ["1.250", "1.500", "0.375"]);
        assert!(text.contains("total") && text.contains("0.750 s"), "{text}");
        assert_eq!(t.total(), 0.75);
        let json: serde_json::Value = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(json["compiles"][0]["waited"], 0.375);
        assert_eq!(json["compiles"][0]["what"], "layer_norm_fwd in f64");
    }

    #[test]
    fn f32_rounding_passes_and_a_relative_error_of_1e_minus_3_fails() {
        let e: Vec<f64> = (0..100).map(|i| ((i * 37 % 101) as f64 - 50.0) / 7.0).collect();
        let rounded: Vec<f64> = e.iter().map(|&x| x as f32 as f64).collect();
        assert!(run(&e, &rounded).passed);
        let mut bad = rounded.clone();
        bad[42] = e[42] * (1.0 + 1e-3);
        let r = run(&e, &bad);
        assert!(!r.passed);
        assert_eq!(r.over_tolerance, 1);
        assert_eq!(r.worst.as_ref().unwrap().index, vec![42]);
        assert!((r.max_rel_err - 1e-3).abs() < 1e-6, "{}", r.max_rel_err);
    }

    #[test]
    fn nan_and_inf_are_counted_and_fail() {
        let e = [1.0, 2.0, 3.0];
        let r = run(&e, &[1.0, f64::NAN, f64::INFINITY]);
        assert_eq!((r.nan, r.inf, r.over_tolerance), (1, 1, 2));
        // NaN shows in every metric: none looks small because NaN elements were left out.
        assert!(r.max_abs_err.is_nan() && r.max_rel_err.is_nan() && r.normwise_rel_err.is_nan(), "{r:?}");
        assert_eq!(r.worst.unwrap().index, vec![1]);
        let r = run(&e, &[1.0, 2.0, f64::INFINITY]);
        assert!(r.max_abs_err == f64::INFINITY && r.normwise_rel_err == f64::INFINITY, "{r:?}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!((json["max_abs_err"].as_str(), json["worst"]["got"].as_str()), (Some("inf"), Some("inf")));
        // A NaN expected value is matched only by NaN.
        assert!(run(&[f64::NAN, 1.0], &[f64::NAN, 1.0]).passed);
        assert!(!run(&[f64::NAN, 1.0], &[0.0, 1.0]).passed);
    }

    #[test]
    fn the_text_fits_100_columns_and_aligns_its_columns() {
        let e: Vec<f64> = (0..300 * 300).map(|i| ((i * 37 % 101) as f64 - 50.0) / 7.0).collect();
        let half: Vec<f64> = e.iter().map(|x| x / 2.0).collect();
        let (mut bad, _) =
            compare("weight", "grad_weight", DType::BF16, &[300, 300], Tolerance::for_dtype(DType::BF16, false), &e, &half, 1);
        bad.formula = Some(Formula { error: 0.5, limit: 2.4e-7, passed: false });
        bad.rounding = Some(Rounding { units: 6.9e6, budget: 4.0, of: "bf16".into(), passed: false });
        bad.calibration = Some(Calibration { noise: 1.2e-3, limit: 3.6e-3, error: 0.5, margin: 7.2e-3 });
        let (mut good, _) = compare("x", "grad_x", DType::F32, &[300, 300], Tolerance::for_dtype(DType::F32, false), &e, &e, 0);
        good.nan = 12345;
        let r = Report::new("rms_norm".into(), 0, 2, "f64".into(), Vec::new(), vec![good, bad], None);
        let text = r.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.iter().all(|l| l.chars().count() <= 100), "{text}");
        assert!(text.contains("WRONG even in exact arithmetic") && text.contains("calibrated normwise tolerance"), "{text}");
        // Header and rows: each column ends (numbers) or starts (names) at one position.
        let (header, x, w) = (lines[2], lines[3], lines[4]);
        assert!(
            header.starts_with("  input  tensor      shape      dtype") && w.starts_with("  weight grad_weight [300, 300] bf16"),
            "{text}"
        );
        for col in ["max abs", "norm rel", "nan/inf"] {
            let end = header.find(col).unwrap() + col.len();
            assert!(x.as_bytes()[end] == b' ' && x.as_bytes()[end - 1] != b' ', "{col}:\n{text}");
        }
        assert!(x.ends_with(" ok") && w.ends_with(" FAIL") && w.contains(" 5e-2 5e-3 "), "{text}");
        assert!(x.split_whitespace().any(|c| c == "12345"), "{text}");
    }

    #[test]
    fn unravel_is_row_major() {
        assert_eq!(unravel(0, &[3, 4, 5]), vec![0, 0, 0]);
        assert_eq!(unravel(59, &[3, 4, 5]), vec![2, 3, 4]);
        assert_eq!(unravel(27, &[3, 4, 5]), vec![1, 1, 2]);
    }
}
