//! Conversions between device tensors for checks whose tensors stay on the device: a tensor
//! converted between float dtypes as the host converts it (widened to f64 for comparisons and
//! the ground truth, to f32 for the replay that measures roundings, a drawn cotangent rounded
//! to f16 or bf16), a sum over one axis and its transpose (a broadcast along it), copies of
//! the pieces of a tensor along one axis (a chunk, a concatenation, and in f64 their
//! transposes, added), and an allocation filled with NaN (an `empty` allocation, as the
//! reference poisons one).

use crate::device::driver;
use crate::{Gpu, GpuError};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use tilegrad_ir::DType;

/// Threads a block of the conversion kernel.
const THREADS: u32 = 256;

/// The kernels after the generated kernels' prelude (its f16/bf16 rounding and storage bits):
/// `tg_convert` reads values of one float dtype (0 f16, 1 bf16: 16-bit storage; 2 f32; 3 f64)
/// exactly as f64 and writes them in another as the host's `round_to` does: f64 as is, f32
/// rounded to nearest, f16 and bf16 through f32 (`half`'s rounding of that f32, to nearest
/// even); and `tg_sum_axis`, a sum over one axis as the host sums it: each result from 0 adding
/// the axis' elements in order in f64 (rounded alone: the CUDA C is compiled without
/// contraction), then rounded once to the result's dtype. Grid-stride loops.
const KERNELS: &str = r#"
__device__ __forceinline__ double tg_read(const void* p, int k, u64 i) {
    switch (k) {
        case 0: return (double)tg_h2f(((const u16*)p)[i]);
        case 1: return (double)tg_bf2f(((const u16*)p)[i]);
        case 2: return (double)((const float*)p)[i];
        default: return ((const double*)p)[i];
    }
}
__device__ __forceinline__ void tg_write(void* p, int k, u64 i, double x) {
    const float f = __double2float_rn(x);
    switch (k) {
        case 0: ((u16*)p)[i] = tg_f2h(tg_f16((double)f)); break;
        case 1: ((u16*)p)[i] = tg_f2bf(tg_bf16((double)f)); break;
        case 2: ((float*)p)[i] = f; break;
        default: ((double*)p)[i] = x;
    }
}
extern "C" __global__ void tg_convert(const void* src, int sk, void* dst, int dk, u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) tg_write(dst, dk, i, tg_read(src, sk, i));
}
extern "C" __global__ void tg_sum_axis(const void* src, void* dst, int f64, u64 outer, u64 n, u64 inner) {
    u64 total = outer * inner;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (u64)gridDim.x * blockDim.x) {
        u64 o = e / inner, j = e % inner;
        double acc = 0.0;
        for (u64 k = 0; k < n; ++k) {
            u64 at = (o * n + k) * inner + j;
            acc = __dadd_rn(acc, f64 ? ((const double*)src)[at] : (double)((const float*)src)[at]);
        }
        if (f64) ((double*)dst)[e] = acc; else ((float*)dst)[e] = __double2float_rn(acc);
    }
}
extern "C" __global__ void tg_broadcast_add(const double* src, double* dst, u64 outer, u64 n, u64 inner) {
    u64 total = outer * n * inner;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (u64)gridDim.x * blockDim.x) {
        u64 o = e / (n * inner), j = e % inner;
        dst[e] = __dadd_rn(dst[e], src[o * inner + j]);
    }
}
extern "C" __global__ void tg_copy_along(const void* src, void* dst, int size, int add, u64 outer, u64 len, u64 inner, u64 n_src, u64 src_at, u64 n_dst, u64 dst_at) {
    u64 total = outer * len * inner;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (u64)gridDim.x * blockDim.x) {
        u64 o = e / (len * inner), r = e % (len * inner);
        u64 s = (o * n_src + src_at) * inner + r, d = (o * n_dst + dst_at) * inner + r;
        if (add) { ((double*)dst)[d] = __dadd_rn(((double*)dst)[d], ((const double*)src)[s]); continue; }
        switch (size) {
            case 8: ((u64*)dst)[d] = ((const u64*)src)[s]; break;
            case 4: ((u32*)dst)[d] = ((const u32*)src)[s]; break;
            case 2: ((u16*)dst)[d] = ((const u16*)src)[s]; break;
            default: ((unsigned char*)dst)[d] = ((const unsigned char*)src)[s];
        }
    }
}
"#;

/// Where a piece lies along one axis of two tensors of `outer x n x inner` elements (`n` their
/// own): `len` positions from `src_at` in the source's axis of `n_src`, to `dst_at` in the
/// destination's of `n_dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Along {
    /// Elements before the axis (the product of the extents before it).
    pub outer: usize,
    /// Elements after the axis.
    pub inner: usize,
    /// Positions of the piece.
    pub len: usize,
    /// The source's extent along the axis.
    pub n_src: usize,
    /// The piece's first position in the source.
    pub src_at: usize,
    /// The destination's extent along the axis.
    pub n_dst: usize,
    /// The piece's first position in the destination.
    pub dst_at: usize,
}

/// The CUDA C of the conversions: the prelude, then [`KERNELS`].
pub(crate) fn source() -> &'static str {
    static SOURCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SOURCE.get_or_init(|| crate::codegen::prelude() + KERNELS)
}

/// The kind `tg_convert` reads or writes `d` as.
fn kind(d: DType) -> Option<i32> {
    match d {
        DType::F16 => Some(0),
        DType::BF16 => Some(1),
        DType::F32 => Some(2),
        DType::F64 => Some(3),
        _ => None,
    }
}

/// The bits an `empty` float allocation is filled with, in 32-bit words: `0x7ff80000` is a NaN
/// as an f32 and, twice, as an f64.
const NAN_WORD: u32 = 0x7ff8_0000;

impl Gpu {
    /// Writes the `n` values of `dtype` at device address `src` as f64 values at `dst` (both
    /// valid for them), exactly. Complete when it returns.
    pub fn widen_to_f64(&self, src: u64, dtype: DType, dst: u64, n: usize) -> Result<(), GpuError> {
        self.convert(src, dtype, dst, DType::F64, n)
    }

    /// Writes the `n` float values of `from` at device address `src` as values of `to` at
    /// `dst` (both valid for them), as the host's `round_to` converts them (see `KERNELS`);
    /// the same dtype is copied. Integer dtypes are an error. Complete when it returns.
    pub fn convert(&self, src: u64, from: DType, dst: u64, to: DType, n: usize) -> Result<(), GpuError> {
        let (Some(sk), Some(dk)) = (kind(from), kind(to)) else {
            return Err(GpuError::Driver(format!("converting {from} to {to} on the device: only float dtypes are converted there")));
        };
        if from == to {
            return self.copy_on_device(dst, src, n * crate::device_bytes(from));
        }
        if n == 0 {
            return Ok(());
        }
        let f = self.utility(source(), "tg_convert")?;
        let s = &self.cuda()?.stream;
        let blocks = self.summary_blocks(n);
        let n64 = n as u64;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: `src` holds `n` values of `from` and `dst` room for `n` values of `to`, by the
        // caller's word.
        unsafe { s.launch_builder(&f).arg(&src).arg(&sk).arg(&dst).arg(&dk).arg(&n64).launch(cfg) }.map_err(driver)?;
        s.synchronize().map_err(driver)
    }

    /// Sums the `outer x n x inner` values of `dtype` (f32 or f64) at `src` over their middle
    /// axis into the `outer x inner` values of `dtype` at `dst`, as the host's `sum` step does
    /// (see `KERNELS`). Complete when it returns.
    #[allow(clippy::too_many_arguments)]
    pub fn sum_axis(&self, src: u64, dtype: DType, dst: u64, outer: usize, n: usize, inner: usize) -> Result<(), GpuError> {
        if !matches!(dtype, DType::F32 | DType::F64) {
            return Err(GpuError::Driver(format!("summing {dtype} on the device: only f32 and f64 are summed there")));
        }
        let total = (outer * inner) as u64;
        if total == 0 {
            return Ok(());
        }
        let f = self.utility(source(), "tg_sum_axis")?;
        let s = &self.cuda()?.stream;
        let blocks = total.div_ceil(u64::from(THREADS)).clamp(1, u64::from(self.sms()) * 8) as u32;
        let (f64, outer, n, inner) = (i32::from(dtype == DType::F64), outer as u64, n as u64, inner as u64);
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: `src` holds `outer * n * inner` values of `dtype` and `dst` room for
        // `outer * inner`, by the caller's word.
        unsafe { s.launch_builder(&f).arg(&src).arg(&dst).arg(&f64).arg(&outer).arg(&n).arg(&inner).launch(cfg) }.map_err(driver)?;
        s.synchronize().map_err(driver)
    }

    /// Adds to each of the `outer x n x inner` f64 values at `dst` the value of the `outer x
    /// inner` f64 values at `src` that has its outer and inner index (the transpose of a sum
    /// over the middle axis). Complete when it returns.
    pub fn broadcast_add(&self, src: u64, dst: u64, outer: usize, n: usize, inner: usize) -> Result<(), GpuError> {
        let total = (outer * n * inner) as u64;
        if total == 0 {
            return Ok(());
        }
        let f = self.utility(source(), "tg_broadcast_add")?;
        let s = &self.cuda()?.stream;
        let blocks = total.div_ceil(u64::from(THREADS)).clamp(1, u64::from(self.sms()) * 8) as u32;
        let (outer, n, inner) = (outer as u64, n as u64, inner as u64);
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: `src` holds `outer * inner` f64 values and `dst` `outer * n * inner`, by the
        // caller's word.
        unsafe { s.launch_builder(&f).arg(&src).arg(&dst).arg(&outer).arg(&n).arg(&inner).launch(cfg) }.map_err(driver)?;
        s.synchronize().map_err(driver)
    }

    /// Copies the piece `at` of the values of `dtype` at `src` into its place at `dst` (a chunk,
    /// a slice of step 1, a part of a concatenation), or with `add` (f64 only) adds it there.
    /// Complete when it returns.
    pub fn copy_along(&self, src: u64, dst: u64, dtype: DType, at: Along, add: bool) -> Result<(), GpuError> {
        if add && dtype != DType::F64 {
            return Err(GpuError::Driver(format!("adding {dtype} pieces on the device: only f64 is added there")));
        }
        let total = (at.outer * at.len * at.inner) as u64;
        if total == 0 {
            return Ok(());
        }
        let f = self.utility(source(), "tg_copy_along")?;
        let s = &self.cuda()?.stream;
        let blocks = total.div_ceil(u64::from(THREADS)).clamp(1, u64::from(self.sms()) * 8) as u32;
        let (size, add) = (crate::device_bytes(dtype) as i32, i32::from(add));
        let w = |v: usize| v as u64;
        let (outer, len, inner, n_src, src_at, n_dst, dst_at) =
            (w(at.outer), w(at.len), w(at.inner), w(at.n_src), w(at.src_at), w(at.n_dst), w(at.dst_at));
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: `src` holds `outer * n_src * inner` values of `dtype` and `dst` `outer * n_dst
        // * inner`, with the piece inside both, by the caller's word.
        unsafe {
            s.launch_builder(&f)
                .arg(&src)
                .arg(&dst)
                .arg(&size)
                .arg(&add)
                .arg(&outer)
                .arg(&len)
                .arg(&inner)
                .arg(&n_src)
                .arg(&src_at)
                .arg(&n_dst)
                .arg(&dst_at)
                .launch(cfg)
        }
        .map_err(driver)?;
        s.synchronize().map_err(driver)
    }

    /// Fills the `n` values of `dtype` at device address `addr` with NaN (the float dtypes: f16
    /// and bf16 with their quiet NaN, as the host stores an f32 NaN in them). Complete when it
    /// returns.
    pub fn fill_nan(&self, addr: u64, dtype: DType, n: usize) -> Result<(), GpuError> {
        let (word, half) = match dtype {
            DType::F32 => (n, None),
            DType::F64 => (2 * n, None),
            // The host's f32 NaN stored as f16 and bf16.
            DType::F16 => (n, Some(half::f16::from_f32(f32::NAN).to_bits())),
            DType::BF16 => (n, Some(half::bf16::from_f32(f32::NAN).to_bits())),
            d => return Err(GpuError::Driver(format!("filling {d} with NaN on the device: only floats are filled there"))),
        };
        if word == 0 {
            return Ok(());
        }
        self.bind()?;
        let s = &self.cuda()?.stream;
        // SAFETY: `addr` holds `n` values of `dtype` by the caller's word; the fill is ordered on
        // the stream and waited for.
        let r = unsafe {
            match half {
                Some(h) => cudarc::driver::sys::cuMemsetD16Async(addr, h, word, s.cu_stream()),
                None => cudarc::driver::sys::cuMemsetD32Async(addr, NAN_WORD, word, s.cu_stream()),
            }
        };
        r.result().map_err(driver)?;
        s.synchronize().map_err(driver)
    }
}

#[cfg(test)]
mod tests {
    use super::NAN_WORD;

    #[test]
    fn the_fill_word_is_a_nan_as_f32_and_twice_as_f64() {
        assert!(f32::from_bits(NAN_WORD).is_nan());
        assert!(f64::from_bits((u64::from(NAN_WORD) << 32) | u64::from(NAN_WORD)).is_nan());
        // The host's f32 NaN stored as f16 and bf16: quiet NaNs.
        assert_eq!(half::f16::from_f32(f32::NAN).to_bits(), 0x7e00);
        assert_eq!(half::bf16::from_f32(f32::NAN).to_bits(), 0x7fc0);
    }
}
