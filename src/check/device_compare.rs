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
    /// The ground truth computed in the kernels' dtypes (with a replay only).
    pub noisy: Option<u64>,
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
    let spread = gpu.spread(c.expected, c.got, c.replay, c.noisy, c.n).map_err(dev)?;
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
    let mut fetched = Ok(());
    let head = Head { name: at.name, tensor: at.tensor, dtype: at.dtype, shape: at.shape, tol, trial: at.trial };
    let (report, worst) = report::tallied(head, tally, values, || {
        let (e, g) = match (download(gpu, c.expected, c.n), download(gpu, c.got, c.n)) {
            (Ok(e), Ok(g)) => (e, g),
            (Err(err), _) | (_, Err(err)) => {
                fetched = Err(dev(err));
                (vec![0.0; c.n], vec![0.0; c.n])
            }
        };
        report::error_map_of(at.shape, &e, &|i| g[i], |x, y| report::judge(x, y, tol, scale))
    });
    fetched?;
    let norms = c.replay.map(|_| norms_of(&spread, c.noisy.is_some(), verdict::unit_roundoff(at.dtype, tf32)));
    Ok(DeviceComparison { report, worst, norms, terms })
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

/// `n` f64 values at device address `addr`, on the host.
fn download(gpu: &Gpu, addr: u64, n: usize) -> Result<Vec<f64>, tilegrad_gpu::GpuError> {
    let t = tilegrad_gpu::DeviceTensor { name: "compared".into(), dtype: DType::F64, numel: n, addr };
    Ok(gpu.download_tensor(&t)?.to_f64_vec())
}
