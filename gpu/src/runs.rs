//! Who wrote each element of a tensor, read off a launch's marks on the device: the runs of
//! consecutive elements with one writer (program, instruction) are found there, so that only
//! their starts come to the host instead of every element's marks (at 67M elements, 0.8 GB of
//! marks against a few thousand runs for a kernel that writes rows).
//!
//! The rule is [`tilegrad_reference::Writers::from_elements`]'s over the writer of each element
//! as `device::writers_of` reads it: the storing program and instruction where an element was
//! stored, else its atomic updater (or `MANY`) and the last atomic's instruction, else `NONE`.

use crate::device::driver;
use crate::{Gpu, GpuError};
use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};
use tilegrad_reference::{TensorId, Writers};

/// The most runs read off the device; a tensor with more is read element by element.
const MAX_RUNS: usize = 1 << 22;

pub(crate) const SOURCE: &str = r#"
typedef unsigned long long u64;
typedef unsigned int u32;
__device__ void tg_writer_at(const u32* w, const u32* a, const u32* wi, const u64* ak, u64 e, int wide, u32 none, u32 many, u32* p, u32* ins) {
    u32 st = !w ? 0 : (wide ? w[2 * e + 1] : (w[e] >> 8));
    u32 ae = a ? a[e] : 0;
    if (st != 0) { *p = st - 1; *ins = (wi ? wi[e] : 0) - 1; }
    else if (ae != 0) { u64 key = ak ? ak[e] : 0; *p = ae == many ? many : ae - 1; *ins = (u32)(key & 0xffff); }
    else { *p = none; *ins = none; }
    if (*p == none) *ins = none;
}
extern "C" __global__ void tg_writer_runs(const u32* w, const u32* a, const u32* wi, const u64* ak, u64 n, int wide, u32 none, u32 many,
                                          u32* count, u64* out_e, u32* out_p, u32* out_i, u64 cap) {
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (u64)gridDim.x * blockDim.x) {
        u32 p, i;
        tg_writer_at(w, a, wi, ak, e, wide, none, many, &p, &i);
        bool start = e == 0;
        if (!start) {
            u32 q, j;
            tg_writer_at(w, a, wi, ak, e - 1, wide, none, many, &q, &j);
            start = q != p || j != i;
        }
        if (start) {
            u32 slot = atomicAdd(count, 1u);
            if (slot < cap) { out_e[slot] = e; out_p[slot] = p; out_i[slot] = i; }
        }
    }
}
"#;

/// A tensor's marks ([`crate::device`]'s `Marks`): store stamps, atomic updaters, storing
/// instructions, atomic keys; each absent where the launch keeps none.
pub(crate) type MarkBuffers<'a> =
    (Option<&'a CudaSlice<u32>>, Option<&'a CudaSlice<u32>>, Option<&'a CudaSlice<u32>>, Option<&'a CudaSlice<u64>>);

/// A mark buffer's device address, or null.
fn addr<T>(s: &cudarc::driver::CudaStream, b: Option<&CudaSlice<T>>) -> u64 {
    b.map_or(0, |b| b.device_ptr(s).0)
}

impl Gpu {
    /// The [`Writers`] of tensor `t` (`n` elements) from its marks (`w`: store stamps, 64-bit
    /// where `wide`; `a`: atomic updaters; `wi`: storing instructions; `ak`: atomic keys), or
    /// `None` where it has more runs than are read off the device.
    pub(crate) fn writer_runs(&self, t: TensorId, n: usize, (w, a, wi, ak): MarkBuffers, wide: bool) -> Result<Option<Writers>, GpuError> {
        if n == 0 {
            return Ok(Some(Writers::from_elements(t, std::iter::empty())));
        }
        let f = self.utility(SOURCE, "tg_writer_runs")?;
        let s = &self.cuda()?.stream;
        let cap = n.min(MAX_RUNS);
        let count = s.alloc_zeros::<u32>(1).map_err(driver)?;
        let (oe, op, oi) = (
            s.alloc_zeros::<u64>(cap).map_err(driver)?,
            s.alloc_zeros::<u32>(cap).map_err(driver)?,
            s.alloc_zeros::<u32>(cap).map_err(driver)?,
        );
        let (pw, pa, pwi, pak) = (addr(s, w), addr(s, a), addr(s, wi), addr(s, ak));
        let (n64, wide, cap64) = (n as u64, i32::from(wide), cap as u64);
        let blocks = (n as u64).div_ceil(256 * 4).clamp(1, u64::from(self.sms()) * 8) as u32;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the marks hold `n` elements (`w` 2n words where wide) or are null; the outputs
        // hold `cap` entries and the kernel writes no more.
        unsafe {
            s.launch_builder(&f)
                .arg(&pw)
                .arg(&pa)
                .arg(&pwi)
                .arg(&pak)
                .arg(&n64)
                .arg(&wide)
                .arg(&Writers::NONE)
                .arg(&Writers::MANY)
                .arg(&count)
                .arg(&oe)
                .arg(&op)
                .arg(&oi)
                .arg(&cap64)
                .launch(cfg)
        }
        .map_err(driver)?;
        let runs = s.clone_dtoh(&count).map_err(driver)?[0] as usize;
        if runs > cap {
            return Ok(None);
        }
        let (e, p, i) = (s.clone_dtoh(&oe.slice(0..runs)), s.clone_dtoh(&op.slice(0..runs)), s.clone_dtoh(&oi.slice(0..runs)));
        let (e, p, i) = (e.map_err(driver)?, p.map_err(driver)?, i.map_err(driver)?);
        let mut all: Vec<(usize, u32, u32)> = (0..runs).map(|k| (e[k] as usize, p[k], i[k])).collect();
        all.sort_unstable_by_key(|r| r.0);
        Ok(Some(Writers::from_runs(t, n, all)))
    }
}
