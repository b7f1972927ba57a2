//! Comparisons of tensors in device memory (the Python package's CUDA tensors): the figures of
//! [`report::compare_by`] and of the formula and rounding verdicts reduced on the device
//! ([`tilegrad_gpu::Gpu::spread`], [`tilegrad_gpu::Gpu::tally`]), so that only figures come to
//! the host; the worst element's two values, and every element only where some are over their
//! tolerance (the report's error map).

use super::report::{self, Head, Tally, TensorReport, Tolerance};
use super::verdict::{self, Norms};
use super::CheckError;
use tilegrad_gpu::{Gpu, Spread, TallyRule};
use tilegrad_ir::DType;

/// The tensors of one comparison: device addresses of contiguous f64 values, `n` each.
#[derive(Clone, Copy, Debug)]
pub struct Compared {
    /// Elements of each.
    pub n: usize,
    /// The ground truth.
    pub expected: u64,
    /// The tensor under test.
    pub got: u64,
    /// Its replay with every float in f64 (then the verdicts are judged too).
    pub replay: Option<u64>,
    /// The ground truth computed in the kernels' dtypes (with a replay only), or with
    /// `noisy_of_replay` the replay computed in f32: its gap is then measured from the replay
    /// (as the host's `Replayed::r32_of`), else from the truth.
    pub noisy: Option<u64>,
    /// See `noisy`.
    pub noisy_of_replay: bool,
    /// Without a replay: the least scale `atol` is relative to, as an earlier trial's replay
    /// measured it ([`DeviceComparison::terms`]; a check replays its first trial only).
    pub terms: Option<f64>,
}

/// A comparison's report, its worst element (index, how far over its tolerance) and, with a
/// replay, the norms its verdicts judge ([`Norms::judge`]).
pub struct DeviceComparison {
    /// The report, without verdicts.
    pub report: TensorReport,
    /// The worst element.
    pub worst: Option<(usize, f64)>,
    /// The verdicts' norms, where a replay was given.
    pub norms: Option<Norms>,
    /// The least scale `atol` was relative to ([`verdict::elementwise_scale`]).
    pub terms: f64,
    /// Both tensors on the host (expected, got), where the comparison fetched them: those
    /// with elements over their tolerance, for the report's error map.
    pub elements: Option<(Vec<f64>, Vec<f64>)>,
}

/// What names the tensor in its report.
pub struct Naming<'a> {
    /// The check's name.
    pub name: &'a str,
    /// The tensor's name.
    pub tensor: &'a str,
    /// The tensor's dtype.
    pub dtype: DType,
    /// Its shape.
    pub shape: &'a [usize],
    /// The trial.
    pub trial: usize,
}

/// Compares `c.got` with `c.expected` on the device as the host compares them: with a replay,
/// the elementwise tolerance's scale includes the gap between the replays
/// ([`verdict::elementwise_scale`]) and the verdicts' norms are returned; without one, the plain
/// comparison. A computation in the kernels' dtypes without a replay (the calibrated
/// tolerance) is the host's only.
pub fn compare_on_device(gpu: &Gpu, c: Compared, at: Naming, tol: Tolerance, tf32: bool) -> Result<DeviceComparison, CheckError> {
    let dev = |e: tilegrad_gpu::GpuError| CheckError::Unsupported(format!("comparing `{}` on the device: {e}", at.tensor));
    if c.noisy.is_some() && c.replay.is_none() {
        return Err(CheckError::Unsupported("the calibrated tolerance compares on the host".into()));
    }
    let mut spread = gpu.spread(c.expected, c.got, c.replay, c.noisy, c.n).map_err(dev)?;
    if let (Some(r64), Some(noisy), true) = (c.replay, c.noisy, c.noisy_of_replay) {
        // The gap between the replays (over elements where the replay is finite: the truth
        // compared is finite everywhere).
        let gap = gpu.spread(r64, r64, None, Some(noisy), c.n).map_err(dev)?;
        (spread.gap_noisy, spread.noisy_sq) = (gap.gap_noisy, gap.noisy_sq);
    }
    let f32_pass = at.dtype == DType::F32 && !tf32;
    let terms = match (c.replay, c.noisy) {
        (Some(_), Some(_)) => verdict::scale_of_gap(spread.gap_noisy, tol.atol),
        (Some(_), None) if f32_pass => verdict::scale_of_gap(spread.gap_got, tol.atol),
        (Some(_), None) => 0.0,
        (None, _) => c.terms.unwrap_or(0.0),
    };
    let (scale, floor) = report::scale_and_floor(spread.max_expected, terms, tol);
    let rule = TallyRule { atol: tol.atol, rtol: tol.rtol, scale, floor };
    let t = gpu.tally(c.expected, c.got, c.n, rule).map_err(dev)?;
    let worst = t.worst.map(|(i, r)| (i as usize, r));
    let values = match worst {
        Some((i, _)) => Some((gpu.read_f64(c.expected, i).map_err(dev)?, gpu.read_f64(c.got, i).map_err(dev)?)),
        None => None,
    };
    let tally = Tally {
        max_abs: t.max_abs,
        max_rel: t.max_rel,
        num: t.num,
        den: t.den,
        over: t.over as usize,
        nan: t.nan as usize,
        inf: t.inf as usize,
        worst,
        poison: t.poison,
    };
    // Only a failing comparison maps its elements: both tensors then come to the host.
    let mut fetched = Ok(None);
    let head = Head { name: at.name, tensor: at.tensor, dtype: at.dtype, shape: at.shape, tol, trial: at.trial };
    let (report, worst) = report::tallied(head, tally, values, || match fetch(gpu, &c) {
        Ok((e, g)) => {
            let map = report::error_map_of(at.shape, &e, &|i| g[i], |x, y| report::judge(x, y, tol, scale));
            fetched = Ok(Some((e, g)));
            map
        }
        Err(err) => {
            fetched = Err(dev(err));
            // Discarded: the comparison fails with the error.
            report::error_map_of(&[0], &[], &|_| 0.0, |x, y| report::judge(x, y, tol, scale))
        }
    });
    let elements = fetched?;
    let norms = c.replay.map(|_| norms_of(&spread, c.noisy.is_some(), verdict::unit_roundoff(at.dtype, tf32)));
    Ok(DeviceComparison { report, worst, norms, terms, elements })
}

/// Both tensors of a comparison on the host: (expected, got).
pub(crate) fn fetch(gpu: &Gpu, c: &Compared) -> Result<(Vec<f64>, Vec<f64>), tilegrad_gpu::GpuError> {
    Ok((gpu.download_f64(c.expected, c.n)?, gpu.download_f64(c.got, c.n)?))
}

/// The verdicts' norms from the device's sums ([`verdict::Replayed::judge`]'s): the gap is the
/// truth's distance to its computation in the kernels' dtypes where there is one, else the
/// replay's to the pass where the pass computes in f32.
fn norms_of(s: &Spread, noisy: bool, u: f64) -> Norms {
    let gap = if noisy {
        s.noisy_sq.sqrt()
    } else if u == verdict::unit_roundoff(DType::F32, false) {
        s.replay_got_sq.sqrt()
    } else {
        0.0
    };
    Norms {
        truth: s.truth_sq.sqrt(),
        formula: s.formula_sq.sqrt(),
        rounding: s.rounding_sq.sqrt(),
        gap: if gap.is_finite() { gap } else { 0.0 },
    }
}
