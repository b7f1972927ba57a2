//! What a comparison needs of tensors in device memory, reduced on the device so that only
//! figures come back: the largest values and gaps, the sums of squares of the verdicts, and the
//! elementwise tally (errors, counts over tolerance, NaNs, the worst element).
//!
//! Each rule is the host's (`tilegrad::check::report::compare_by`, `verdict::Replayed`), element
//! for element: the same tests of finiteness, the same operations rounded alone (the CUDA C is
//! compiled without contraction). Blocks reduce their elements in shared memory and the host adds
//! the blocks' partial figures in block order, so that sums differ from the host's only by the
//! order of their additions; maxima, counts and the worst element are the same.

use crate::device::driver;
use crate::{Gpu, GpuError};
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// Threads a block of the summary kernels.
const THREADS: u32 = 256;

/// Figures of a truth `e`, a tensor under test `g`, its f64 replay `r64` and a computation of
/// the truth in the kernels' dtypes `noisy` (each f64, contiguous, `n` elements). Sums run over
/// the elements where `e` is finite; missing tensors leave their figures 0.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Spread {
    /// `max |e|` over finite `e` (0 for none).
    pub max_expected: f64,
    /// `max |e - noisy|`.
    pub gap_noisy: f64,
    /// `max |r64 - g|`.
    pub gap_got: f64,
    /// `sum e^2`.
    pub truth_sq: f64,
    /// `sum (r64 - e)^2`.
    pub formula_sq: f64,
    /// `sum (e - g)^2`.
    pub rounding_sq: f64,
    /// `sum (e - noisy)^2`.
    pub noisy_sq: f64,
    /// `sum (r64 - g)^2`.
    pub replay_got_sq: f64,
}

/// The elementwise tally of `g` against `e` under a tolerance (see the host's `Tally`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Tallied {
    /// Largest `|g - e|` over finite pairs.
    pub max_abs: f64,
    /// Largest `|g - e| / max(|e|, floor)`.
    pub max_rel: f64,
    /// `sum (g - e)^2` and `sum e^2` over finite pairs.
    pub num: f64,
    /// See `num`.
    pub den: f64,
    /// Elements over their tolerance.
    pub over: u64,
    /// NaN and infinite elements of `g`.
    pub nan: u64,
    /// See `nan`.
    pub inf: u64,
    /// The first element of the largest ratio of error to tolerance, and the ratio.
    pub worst: Option<(u64, f64)>,
    /// NaN where a non-finite mismatch involved a NaN, else infinite where there was one.
    pub poison: Option<f64>,
}

/// The tolerance a [`Gpu::tally`] judges by: an element errs by at most
/// `atol * scale + rtol * |e|`; `floor` bounds the relative error's denominator from below.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TallyRule {
    /// Absolute tolerance, relative to `scale`.
    pub atol: f64,
    /// Relative tolerance.
    pub rtol: f64,
    /// What `atol` is relative to.
    pub scale: f64,
    /// The least denominator of relative errors.
    pub floor: f64,
}

pub(crate) const SOURCE: &str = r#"
typedef unsigned long long u64;
#define TG_T 256
__device__ double tg_sq(double a, double b) { double d = __dsub_rn(a, b); return __dmul_rn(d, d); }
extern "C" __global__ void tg_spread(const double* e, const double* g, const double* r64, const double* noisy, u64 n, double* out) {
    __shared__ double sh[8][TG_T];
    double v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        double ei = e[i], gi = g[i];
        bool fin = isfinite(ei);
        if (fin) { v[0] = fmax(v[0], fabs(ei)); v[3] = __dadd_rn(v[3], __dmul_rn(ei, ei)); v[5] = __dadd_rn(v[5], tg_sq(ei, gi)); }
        if (noisy) {
            double q = noisy[i];
            v[1] = fmax(v[1], fabs(__dsub_rn(ei, q)));
            if (fin) v[6] = __dadd_rn(v[6], tg_sq(ei, q));
        }
        if (r64) {
            double r = r64[i];
            v[2] = fmax(v[2], fabs(__dsub_rn(r, gi)));
            if (fin) { v[4] = __dadd_rn(v[4], tg_sq(r, ei)); v[7] = __dadd_rn(v[7], tg_sq(r, gi)); }
        }
    }
    for (int k = 0; k < 8; ++k) sh[k][threadIdx.x] = v[k];
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            for (int k = 0; k < 3; ++k) sh[k][threadIdx.x] = fmax(sh[k][threadIdx.x], sh[k][threadIdx.x + s]);
            for (int k = 3; k < 8; ++k) sh[k][threadIdx.x] = __dadd_rn(sh[k][threadIdx.x], sh[k][threadIdx.x + s]);
        }
        __syncthreads();
    }
    if (threadIdx.x < 8) out[blockIdx.x * 8 + threadIdx.x] = sh[threadIdx.x][0];
}
extern "C" __global__ void tg_tally(const double* e, const double* g, u64 n, double atol, double rtol, double scale, double floor_, double* outf, u64* outc) {
    __shared__ double shf[5][TG_T];
    __shared__ u64 shc[6][TG_T];
    double mabs = 0, mrel = 0, num = 0, den = 0, wr = -1;
    u64 over = 0, nan = 0, inf = 0, wi = 0, pnan = 0, pinf = 0;
    double tol0 = __dmul_rn(atol, scale);
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        double ei = e[i], gi = g[i];
        // isnan and isinf return some nonzero value, not 1.
        nan += isnan(gi) ? 1 : 0; inf += isinf(gi) ? 1 : 0;
        bool nonfinite = !isfinite(ei) ? !((isnan(gi) && isnan(ei)) || gi == ei) : !isfinite(gi);
        double d = fabs(__dsub_rn(gi, ei));
        double ratio = nonfinite ? __longlong_as_double(0x7ff0000000000000LL)
            : (!isfinite(ei) || d == 0.0) ? 0.0 : __ddiv_rn(d, __dadd_rn(tol0, __dmul_rn(rtol, fabs(ei))));
        if (nonfinite) { if (isnan(gi) || isnan(ei)) pnan = 1; else pinf = 1; }
        else if (isfinite(ei)) {
            mabs = fmax(mabs, d); mrel = fmax(mrel, __ddiv_rn(d, fmax(fabs(ei), floor_)));
            num = __dadd_rn(num, __dmul_rn(d, d)); den = __dadd_rn(den, __dmul_rn(ei, ei));
        }
        over += ratio > 1.0 ? 1 : 0;
        if (ratio > wr) { wr = ratio; wi = i; }
    }
    int t = threadIdx.x;
    shf[0][t] = mabs; shf[1][t] = mrel; shf[2][t] = num; shf[3][t] = den; shf[4][t] = wr;
    shc[0][t] = over; shc[1][t] = nan; shc[2][t] = inf; shc[3][t] = wi; shc[4][t] = pnan; shc[5][t] = pinf;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) {
            int u = t + s;
            shf[0][t] = fmax(shf[0][t], shf[0][u]); shf[1][t] = fmax(shf[1][t], shf[1][u]);
            shf[2][t] = __dadd_rn(shf[2][t], shf[2][u]); shf[3][t] = __dadd_rn(shf[3][t], shf[3][u]);
            bool take = shf[4][u] > shf[4][t] || (shf[4][u] == shf[4][t] && shf[4][u] >= 0 && shc[3][u] < shc[3][t]);
            if (take) { shf[4][t] = shf[4][u]; shc[3][t] = shc[3][u]; }
            shc[0][t] += shc[0][u]; shc[1][t] += shc[1][u]; shc[2][t] += shc[2][u];
            shc[4][t] |= shc[4][u]; shc[5][t] |= shc[5][u];
        }
        __syncthreads();
    }
    if (t < 5) outf[blockIdx.x * 5 + t] = shf[t][0];
    if (t < 6) outc[blockIdx.x * 6 + t] = shc[t][0];
}
"#;

impl Gpu {
    /// Blocks of a summary over `n` elements: enough to fill the device, each thread taking a
    /// few elements.
    pub(crate) fn summary_blocks(&self, n: usize) -> u32 {
        (n as u64).div_ceil(u64::from(THREADS) * 4).clamp(1, u64::from(self.sms()) * 8) as u32
    }

    /// The [`Spread`] of `e`, `g` and the optional `r64` and `noisy` (device addresses of `n`
    /// contiguous f64 values each, complete on the legacy default stream or this one).
    pub fn spread(&self, e: u64, g: u64, r64: Option<u64>, noisy: Option<u64>, n: usize) -> Result<Spread, GpuError> {
        let f = self.utility(SOURCE, "tg_spread")?;
        let s = &self.cuda()?.stream;
        let blocks = self.summary_blocks(n);
        let out = s.alloc_zeros::<f64>(blocks as usize * 8).map_err(driver)?;
        let (r64, noisy, n64) = (r64.unwrap_or(0), noisy.unwrap_or(0), n as u64);
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the addresses hold `n` f64 values by the caller's word (or are null where the
        // kernel does not read them); `out` holds 8 values a block.
        unsafe { s.launch_builder(&f).arg(&e).arg(&g).arg(&r64).arg(&noisy).arg(&n64).arg(&out).launch(cfg) }.map_err(driver)?;
        let v = s.clone_dtoh(&out).map_err(driver)?;
        let mut p = Spread::default();
        for b in v.chunks(8) {
            p.max_expected = p.max_expected.max(b[0]);
            p.gap_noisy = p.gap_noisy.max(b[1]);
            p.gap_got = p.gap_got.max(b[2]);
            p.truth_sq += b[3];
            p.formula_sq += b[4];
            p.rounding_sq += b[5];
            p.noisy_sq += b[6];
            p.replay_got_sq += b[7];
        }
        Ok(p)
    }

    /// The elementwise tally of `g` against `e` (device addresses of `n` contiguous f64 values)
    /// under `rule`.
    pub fn tally(&self, e: u64, g: u64, n: usize, rule: TallyRule) -> Result<Tallied, GpuError> {
        let f = self.utility(SOURCE, "tg_tally")?;
        let s = &self.cuda()?.stream;
        let blocks = self.summary_blocks(n);
        let outf = s.alloc_zeros::<f64>(blocks as usize * 5).map_err(driver)?;
        let outc = s.alloc_zeros::<u64>(blocks as usize * 6).map_err(driver)?;
        let n64 = n as u64;
        let TallyRule { atol, rtol, scale, floor } = rule;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: as in `spread`; `outf` and `outc` hold 5 and 6 values a block.
        unsafe {
            s.launch_builder(&f).arg(&e).arg(&g).arg(&n64).arg(&atol).arg(&rtol).arg(&scale).arg(&floor).arg(&outf).arg(&outc).launch(cfg)
        }
        .map_err(driver)?;
        let (fv, cv) = (s.clone_dtoh(&outf).map_err(driver)?, s.clone_dtoh(&outc).map_err(driver)?);
        Ok(fv.chunks(5).zip(cv.chunks(6)).fold(Tallied::default(), |mut t, (f, c)| {
            t.max_abs = t.max_abs.max(f[0]);
            t.max_rel = t.max_rel.max(f[1]);
            t.num += f[2];
            t.den += f[3];
            (t.over, t.nan, t.inf) = (t.over + c[0], t.nan + c[1], t.inf + c[2]);
            // A block of no elements reports the ratio -1; blocks come in index order within
            // a stride, so ties go to the lower index.
            if f[4] >= 0.0 && t.worst.is_none_or(|(i, w)| f[4] > w || f[4] == w && c[3] < i) {
                t.worst = Some((c[3], f[4]));
            }
            if c[4] != 0 {
                t.poison = Some(f64::NAN);
            } else if c[5] != 0 && t.poison.is_none() {
                t.poison = Some(f64::INFINITY);
            }
            t
        }))
    }

    /// Element `i` of the f64 tensor at device address `addr`.
    pub fn read_f64(&self, addr: u64, i: usize) -> Result<f64, GpuError> {
        self.bind()?;
        let mut v = [0u8; 8];
        // SAFETY: the caller's tensor holds more than `i` f64 values; the copy is synchronous.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut v[..], addr + 8 * i as u64) }.map_err(driver)?;
        Ok(f64::from_le_bytes(v))
    }

    /// Fills the device buffer at `addr` with `n` values `mean + sd * normal_at(key, i)` (see
    /// [`crate::draw`]), as f64 or, where `f32`, rounded to f32; complete when it returns.
    pub fn draw_normal(&self, addr: u64, n: usize, key: u64, mean: f64, sd: f64, f32: bool) -> Result<(), GpuError> {
        self.draw("tg_draw_normal", addr, n, key, (mean, sd), f32)
    }

    /// Fills the device buffer at `addr` with `n` values uniform on `[lo, hi)` keyed by `key`
    /// (see [`crate::draw::cuda_source`]), as f64 or, where `f32`, rounded to f32; complete when
    /// it returns.
    pub fn draw_uniform(&self, addr: u64, n: usize, key: u64, lo: f64, hi: f64, f32: bool) -> Result<(), GpuError> {
        self.draw("tg_draw_uniform", addr, n, key, (lo, hi), f32)
    }

    /// Runs draw kernel `name` with its two parameters.
    fn draw(&self, name: &str, addr: u64, n: usize, key: u64, (mean, sd): (f64, f64), f32: bool) -> Result<(), GpuError> {
        if n == 0 {
            return Ok(());
        }
        let f = self.utility(&crate::draw::cuda_source(), name)?;
        let s = &self.cuda()?.stream;
        let blocks = self.summary_blocks(n.div_ceil(2));
        let (n64, f32) = (n as u64, i32::from(f32));
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: `addr` holds `n` values of the dtype asked for, by the caller's word.
        unsafe { s.launch_builder(&f).arg(&addr).arg(&n64).arg(&key).arg(&mean).arg(&sd).arg(&f32).launch(cfg) }.map_err(driver)?;
        s.synchronize().map_err(driver)
    }
}
