//! Conversions between device tensors for checks whose tensors stay on the device: a tensor
//! widened to f64 (what comparisons and the ground truth read) and an allocation filled with
//! NaN (an `empty` allocation, as the reference poisons one).

use crate::device::driver;
use crate::{Gpu, GpuError};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use tilegrad_ir::DType;

/// Threads a block of the conversion kernel.
const THREADS: u32 = 256;

/// f32 values widened to f64 (exactly), and a sum over one axis as the host sums it: each
/// result from 0 adding the axis' elements in order in f64 (rounded alone: the CUDA C is
/// compiled without contraction), then rounded once to the result's dtype. Grid-stride loops.
pub(crate) const SOURCE: &str = r#"
typedef unsigned long long u64;
extern "C" __global__ void tg_widen_f32(const float* src, double* dst, u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) dst[i] = (double)src[i];
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
"#;

/// The bits an `empty` float allocation is filled with, in 32-bit words: `0x7ff80000` is a NaN
/// as an f32 and, twice, as an f64.
const NAN_WORD: u32 = 0x7ff8_0000;

impl Gpu {
    /// Writes the `n` values of `dtype` at device address `src` as f64 values at `dst` (both
    /// valid for them): f32 widened exactly, f64 copied. Other dtypes are an error. Complete
    /// when it returns.
    pub fn widen_to_f64(&self, src: u64, dtype: DType, dst: u64, n: usize) -> Result<(), GpuError> {
        match dtype {
            DType::F64 => return self.copy_on_device(dst, src, n * 8),
            DType::F32 => {}
            d => return Err(GpuError::Driver(format!("widening {d} to f64 on the device: only f32 and f64 are widened there"))),
        }
        if n == 0 {
            return Ok(());
        }
        let f = self.utility(SOURCE, "tg_widen_f32")?;
        let s = &self.cuda()?.stream;
        let blocks = self.summary_blocks(n);
        let n64 = n as u64;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: `src` holds `n` f32 values and `dst` room for `n` f64 values, by the caller's
        // word.
        unsafe { s.launch_builder(&f).arg(&src).arg(&dst).arg(&n64).launch(cfg) }.map_err(driver)?;
        s.synchronize().map_err(driver)
    }

    /// Sums the `outer x n x inner` values of `dtype` (f32 or f64) at `src` over their middle
    /// axis into the `outer x inner` values of `dtype` at `dst`, as the host's `sum` step does
    /// (see [`SOURCE`]). Complete when it returns.
    #[allow(clippy::too_many_arguments)]
    pub fn sum_axis(&self, src: u64, dtype: DType, dst: u64, outer: usize, n: usize, inner: usize) -> Result<(), GpuError> {
        if !matches!(dtype, DType::F32 | DType::F64) {
            return Err(GpuError::Driver(format!("summing {dtype} on the device: only f32 and f64 are summed there")));
        }
        let total = (outer * inner) as u64;
        if total == 0 {
            return Ok(());
        }
        let f = self.utility(SOURCE, "tg_sum_axis")?;
        let s = &self.cuda()?.stream;
        let blocks = total.div_ceil(u64::from(THREADS)).clamp(1, u64::from(self.sms()) * 8) as u32;
        let (f64, outer, n, inner) = (i32::from(dtype == DType::F64), outer as u64, n as u64, inner as u64);
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: `src` holds `outer * n * inner` values of `dtype` and `dst` room for
        // `outer * inner`, by the caller's word.
        unsafe { s.launch_builder(&f).arg(&src).arg(&dst).arg(&f64).arg(&outer).arg(&n).arg(&inner).launch(cfg) }.map_err(driver)?;
        s.synchronize().map_err(driver)
    }

    /// Fills the `n` values of `dtype` at device address `addr` with NaN (f32 and f64 only).
    /// Complete when it returns.
    pub fn fill_nan(&self, addr: u64, dtype: DType, n: usize) -> Result<(), GpuError> {
        let words = match dtype {
            DType::F32 => n,
            DType::F64 => 2 * n,
            d => return Err(GpuError::Driver(format!("filling {d} with NaN on the device: only f32 and f64 are filled there"))),
        };
        if words == 0 {
            return Ok(());
        }
        self.bind()?;
        let s = &self.cuda()?.stream;
        // SAFETY: `addr` holds `n` values of `dtype` by the caller's word; the fill is ordered on
        // the stream and waited for.
        let r = unsafe { cudarc::driver::sys::cuMemsetD32Async(addr, NAN_WORD, words, s.cu_stream()) };
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
    }
}
