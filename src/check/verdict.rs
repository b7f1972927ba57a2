//! Formula or rounding: the two questions a compared tensor answers (see "Verdicts" in the
//! design notes).
//!
//! - **Formula.** The pass is replayed with every float computed in f64 (kernels promoted, host
//!   steps in f64, on the ground truth's own f64 forward and cotangents): it then differs from the
//!   ground truth only by f64 rounding, whatever the kernels' dtypes, unless it computes another
//!   function. `||replay - truth|| <= FORMULA_LIMIT * scale` passes.
//! - **Rounding.** The pass as written against the truth, normwise, in units of roundoff `u` of
//!   the tensor's dtype (of tf32 where a tf32 `dot` computes an f32 tensor), within a per-dtype
//!   budget ([`rounding_budget`]).
//!
//! Cancellation: where terms cancel (a KL divergence at its minimum, a gradient that is 0 in
//! exact arithmetic), a result far smaller than its terms carries rounding errors of the terms'
//! size even when computed right. The pass is replayed a second time with every float in f32
//! (the same operations, uniformly rounded; the pass itself where it computes in f32): the gap
//! between the two replays is the error the computation has in f32. A 16-bit pass may err by a
//! few units of its roundoff of the result *plus* a few times that gap, as a library kernel that
//! computes in f32 and rounds its inputs and results to 16 bits does; one that accumulates a long
//! sum in 16 bits errs far beyond both. The formula is judged relative to the truth's norm, with
//! a floor of the cotangent's root-mean-square per element (a gradient's natural unit), so that a
//! gradient that is 0 in exact arithmetic is not judged against its own f64 rounding noise.

use super::chunked;
use super::report::{Formula, Rounding, TensorReport};
use tilegrad_ir::DType;

/// How far (relative to the scale) a replay may differ from the truth: both compute in f64,
/// through different formulas (the truth differentiates the forward, the replay is the user's
/// backward), and kernels write constants to 7 or 8 significant digits (`1.44269504` for
/// 1/ln 2) and the interpreters approximate `exp2` and friends as GPUs do: differences far
/// below f32 roundoff that no kernel in f32 or narrower can show. A wrong term of relative size
/// 1e-6 is past it.
pub const FORMULA_LIMIT: f64 = 1.0 / (1u64 << 22) as f64;

/// The formula's limit for a replay whose tensors stay f32 between launches (the kernels
/// computing in f64): the Python package's fallback where the user's host code cannot run on
/// f64 tensors (a table of Triton dtypes without f64). Each store rounds to f32 (half a unit of
/// f32's roundoff), host code computes in f32: 16 units of f32's roundoff, still far below the
/// roundoff of the 16-bit dtypes whose one-term bugs the replay is there to find.
pub const FORMULA_LIMIT_F32_STORAGE: f64 = 1.0 / (1u64 << 20) as f64;

impl Formula {
    /// The verdict against `limit` instead of the one it was judged with.
    pub fn against(self, limit: f64) -> Formula {
        Formula { passed: self.error <= limit, limit, ..self }
    }
}

/// Unit roundoff of a dtype (of tf32 for an f32 tensor a tf32 `dot` computes).
pub fn unit_roundoff(d: DType, tf32: bool) -> f64 {
    match d {
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        DType::F32 if tf32 => 2f64.powi(-11),
        DType::F32 => 2f64.powi(-24),
        _ => 2f64.powi(-53),
    }
}

/// The normwise error a tensor of dtype `d` may have, in units of its roundoff (see
/// [`unit_roundoff`]): set from measurement on published-style kernels (docs/verdicts.md).
pub fn rounding_budget(d: DType, tf32: bool) -> f64 {
    match d {
        DType::F16 | DType::BF16 => 4.0,
        DType::F32 if tf32 => 4.0,
        _ => 16.0,
    }
}

/// `||a - b||_2` over the elements where `truth` is finite (where it is not, the elementwise
/// comparison judges: NaN matches only NaN, an infinity only itself).
fn dist(truth: &[f64], a: impl Fn(usize) -> f64 + Sync, b: impl Fn(usize) -> f64 + Sync) -> f64 {
    let sq = |i: usize| if truth[i].is_finite() { (a(i) - b(i)).powi(2) } else { 0.0 };
    chunked::sum(truth.len(), sq).sqrt()
}

/// What a tensor's verdicts compare: the truth, the pass as written (`got`), its f64 replay, and
/// its f32 replay (`None` where the pass computes in f32 or wider already: then `got` is it).
pub struct Replayed<'a> {
    /// The ground truth.
    pub truth: &'a [f64],
    /// The pass as written, element by element.
    pub got: &'a (dyn Fn(usize) -> f64 + Sync),
    /// Its replay with every float in f64.
    pub r64: &'a [f64],
    /// Its replay with every float in f32, where it differs from the pass as written.
    pub r32: Option<&'a [f64]>,
    /// What `r32` is the coarser computation of: `r64` (the CLI), or the truth where `r32` is
    /// the ground truth computed in the kernels' dtypes (the Python package).
    pub r32_of: &'a [f64],
    /// Root-mean-square of the cotangents per element (1 for the forward's outputs).
    pub cot_rms: f64,
}

impl Replayed<'_> {
    /// The gap between the f32 and the f64 replays (see the module docs): the pass itself
    /// stands for its f32 replay where it rounds as f32 (`u`).
    fn gap(&self, u: f64) -> f64 {
        let g = match self.r32 {
            Some(r) => dist(self.truth, |i| self.r32_of[i], |i| r[i]),
            None if u == unit_roundoff(DType::F32, false) => dist(self.truth, |i| self.r64[i], self.got),
            None => 0.0,
        };
        if g.is_finite() {
            g
        } else {
            0.0
        }
    }

    /// Both verdicts for a tensor of dtype `d`.
    pub fn judge(&self, d: DType, tf32: bool) -> (Formula, Rounding) {
        let u = unit_roundoff(d, tf32);
        let norms = Norms {
            truth: dist(self.truth, |i| self.truth[i], |_| 0.0),
            formula: dist(self.truth, |i| self.r64[i], |i| self.truth[i]),
            rounding: dist(self.truth, |i| self.truth[i], self.got),
            gap: self.gap(u),
        };
        norms.judge(self.truth.len(), self.cot_rms, d, tf32)
    }
}

/// The norms the verdicts compare (each over the elements where the truth is finite): of the
/// truth, of the replay's distance to it (formula), of the pass's distance to it (rounding),
/// and the gap between the f32 and f64 replays (0 where not finite or not measured).
#[derive(Clone, Copy, Debug)]
pub struct Norms {
    /// `||truth||`.
    pub truth: f64,
    /// `||r64 - truth||`.
    pub formula: f64,
    /// `||truth - got||`.
    pub rounding: f64,
    /// `||r32_of - r32||`.
    pub gap: f64,
}

impl Norms {
    /// Both verdicts for a tensor of `n` elements of dtype `d`, whose cotangents have this
    /// root-mean-square per element.
    pub fn judge(&self, n: usize, cot_rms: f64, d: DType, tf32: bool) -> (Formula, Rounding) {
        let u = unit_roundoff(d, tf32);
        let formula_scale = self.truth.max(cot_rms * (n as f64).sqrt());
        let formula = Formula {
            error: self.formula / formula_scale.max(f64::MIN_POSITIVE),
            limit: FORMULA_LIMIT,
            passed: self.formula <= FORMULA_LIMIT * formula_scale,
        };
        let unit = u * self.truth + self.gap;
        let units = if self.rounding == 0.0 { 0.0 } else { self.rounding / unit.max(f64::MIN_POSITIVE) };
        let budget = rounding_budget(d, tf32);
        let of = if tf32 && d == DType::F32 { "tf32".to_string() } else { d.to_string() };
        (formula, Rounding { units, budget, of, passed: units <= budget })
    }
}

/// Records the formula and rounding verdicts in `r` and fails it where they fail (the rounding
/// only without `user_tolerance`: a tolerance the user gives replaces it). Returns how far over
/// (or within) its limits the tensor is, as a ratio (1: at a limit; infinite for NaN).
pub fn apply(r: &mut TensorReport, (formula, rounding): (Formula, Rounding), user_tolerance: bool) -> f64 {
    let mut badness = formula.error / formula.limit;
    r.passed &= formula.passed;
    if !user_tolerance {
        r.passed &= rounding.passed;
        badness = badness.max(rounding.units / rounding.budget);
    }
    r.formula = Some(formula);
    r.rounding = Some(rounding);
    if badness.is_nan() {
        f64::INFINITY
    } else {
        badness
    }
}

/// How many times the largest gap between a tensor's f32 and f64 replays an element may err by
/// under the elementwise tolerances (see [`elementwise_scale`]).
pub const GAP_FACTOR: f64 = 16.0;

/// The scale the elementwise `atol` is relative to, at least: [`GAP_FACTOR`] times the largest
/// gap between the tensor's f32 replay (`r32`, or `got` where it computes in f32) and its f64
/// one, over `atol`; so that an element may err by what the computation itself has in f32.
pub fn elementwise_scale(r64: &[f64], r32: Option<&[f64]>, got: &(dyn Fn(usize) -> f64 + Sync), f32_pass: bool, atol: f64) -> f64 {
    let n = r64.len();
    let gap = match r32 {
        Some(r) => chunked::max(n, |i| (r64[i] - r[i]).abs()),
        None if f32_pass => chunked::max(n, |i| (r64[i] - got(i)).abs()),
        None => 0.0,
    };
    scale_of_gap(gap, atol)
}

/// [`elementwise_scale`] of the largest gap between the f32 and f64 replays.
pub fn scale_of_gap(gap: f64, atol: f64) -> f64 {
    if gap.is_finite() && atol > 0.0 {
        GAP_FACTOR * gap / atol
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judge(truth: &[f64], got: &[f64], r64: &[f64], r32: Option<&[f64]>, d: DType) -> (Formula, Rounding) {
        let g = |i: usize| got[i];
        Replayed { truth, got: &g, r64, r32, r32_of: r64, cot_rms: 1.0 }.judge(d, false)
    }

    #[test]
    fn a_right_formula_rounded_to_bf16_passes_and_a_wrong_term_fails_the_formula() {
        let truth: Vec<f64> = (0..1000).map(|i| ((i as f64) * 0.37).sin() * 3.0).collect();
        let rounded: Vec<f64> = truth.iter().map(|&x| tilegrad_reference::round_to(DType::BF16, x)).collect();
        let r32: Vec<f64> = truth.iter().map(|&x| x as f32 as f64).collect();
        let (f, r) = judge(&truth, &rounded, &truth, Some(&r32), DType::BF16);
        assert!(f.passed && r.passed, "{f:?} {r:?}");
        assert!(r.units > 0.1 && r.units < 1.0, "half a unit at most, normwise: {r:?}");
        // A term of relative size 1e-6 missing: far below bf16's roundoff, found by the replay.
        let wrong: Vec<f64> = truth.iter().map(|x| x * (1.0 + 1e-6)).collect();
        let wrong32: Vec<f64> = wrong.iter().map(|&x| x as f32 as f64).collect();
        let (f, r) = judge(&truth, &rounded, &wrong, Some(&wrong32), DType::BF16);
        assert!(f.error > 5e-7, "{f:?}");
        assert!(!f.passed && r.passed, "{f:?} {r:?}");
    }

    #[test]
    fn rounding_beyond_the_budget_fails_and_cancellation_is_judged_against_the_f32_gap() {
        let truth: Vec<f64> = (0..512).map(|i| ((i as f64) * 0.11).cos()).collect();
        let r32: Vec<f64> = truth.iter().map(|&x| x as f32 as f64).collect();
        let u = unit_roundoff(DType::BF16, false);
        let noisy: Vec<f64> = truth.iter().enumerate().map(|(i, x)| x + if i % 2 == 0 { 40.0 } else { -40.0 } * u * x.abs()).collect();
        let (_, r) = judge(&truth, &noisy, &truth, Some(&r32), DType::BF16);
        assert!(!r.passed && r.units > 30.0, "{r:?}");
        // A result of 1e-12 from terms whose f32 computation errs by 1e-8: a bf16 result off by
        // 3e-8 is within a few units of that.
        let tiny = vec![1e-12; 64];
        let r32: Vec<f64> = tiny.iter().map(|x| x + 1e-8).collect();
        let got: Vec<f64> = tiny.iter().map(|x| x + 3e-8).collect();
        let (f, r) = judge(&tiny, &got, &tiny, Some(&r32), DType::BF16);
        assert!(f.passed && r.passed && r.units < 4.0, "{f:?} {r:?}");
        // A gradient exactly 0 in exact arithmetic, 1e-19 by the truth's own f64 rounding.
        let zero = vec![0.0; 64];
        let (f, _) = judge(&vec![1e-19; 64], &zero, &zero, None, DType::F32);
        assert!(f.passed, "{f:?}");
    }
}
