//! Global sum with `atomic_add`: each program sums its masked block and adds the result into one
//! scalar `out[0]`. The interpreter sums the contributions in a deterministic order.

use super::{grid_for, tile};
use tilegrad_ir::{DType, IrError, Kernel, KernelBuilder};
use tilegrad_reference::{ExecError, Launch, LaunchSummary, Memory, TensorId};

/// `out[0] += sum(x[pid*BLOCK .. (pid+1)*BLOCK])` for every program (`out` must start at 0).
///
/// Parameters: `x_ptr`, `out_ptr`, `n` (i32), `BLOCK` (constexpr).
pub fn atomic_sum(block: usize) -> Result<Kernel, IrError> {
    let mut b = KernelBuilder::new("atomic_sum");
    let x = b.ptr_param("x_ptr", DType::F32);
    let out = b.ptr_param("out_ptr", DType::F32);
    let n = b.scalar_param("n", DType::I32);
    let block_v = b.constexpr("BLOCK", block as i64);
    let (offs, mask) = super::block_offsets(&mut b, block_v, block, n);
    let px = b.add(x, offs);
    let zf = b.f32(0.0);
    let v = b.load(px, Some(mask), Some(zf));
    let s = b.sum(v, None, false);
    b.atomic_add(out, s, None);
    b.finish()
}

/// Reference: the sum of `x`, in f64.
pub fn atomic_sum_ref(x: &[f64]) -> f64 {
    x.iter().sum()
}

/// The launch of [`atomic_sum`] on `x` (f32, taken flat), adding into `out[0]` (f32).
pub fn atomic_sum_launch<'k>(kernel: &'k Kernel, mem: &Memory, x: TensorId, out: TensorId) -> Result<Launch<'k>, ExecError> {
    let n = mem.get(x).numel();
    let block = tile(kernel, "BLOCK")?;
    Ok(Launch::new(kernel, grid_for(n, block)).arg("x_ptr", x).arg("out_ptr", out).arg("n", n))
}

/// Launches [`atomic_sum`] on `x` (f32, taken flat), adding into `out[0]` (f32).
pub fn launch_atomic_sum(kernel: &Kernel, mem: &mut Memory, x: TensorId, out: TensorId) -> Result<LaunchSummary, ExecError> {
    atomic_sum_launch(kernel, mem, x, out)?.run(mem)
}
