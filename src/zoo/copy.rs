//! Copy: the simplest masked load/store kernel, one `BLOCK`-lane tile per program.

use super::{grid_for, tile};
use tilegrad_ir::{DType, IrError, Kernel, KernelBuilder};
use tilegrad_reference::{ExecError, Launch, LaunchSummary, Memory, TensorId};

/// `dst[i] = src[i]` over `n` f32 elements, `block` lanes per program.
///
/// Parameters: `src_ptr`, `dst_ptr`, `n` (i32), `BLOCK` (constexpr).
pub fn copy(block: usize) -> Result<Kernel, IrError> {
    let mut b = KernelBuilder::new("copy");
    let src = b.ptr_param("src_ptr", DType::F32);
    let dst = b.ptr_param("dst_ptr", DType::F32);
    let n = b.scalar_param("n", DType::I32);
    let block_v = b.constexpr("BLOCK", block as i64);
    let (offs, mask) = super::block_offsets(&mut b, block_v, block, n);
    let ps = b.add(src, offs);
    let v = b.load(ps, Some(mask), None);
    let pd = b.add(dst, offs);
    b.store(pd, v, Some(mask));
    b.finish()
}

/// Reference: the input itself.
pub fn copy_ref(x: &[f64]) -> Vec<f64> {
    x.to_vec()
}

/// The launch of [`copy`] from `src` to `dst` (f32, same number of elements).
pub fn copy_launch<'k>(kernel: &'k Kernel, mem: &Memory, src: TensorId, dst: TensorId) -> Result<Launch<'k>, ExecError> {
    let n = mem.get(src).numel();
    let block = tile(kernel, "BLOCK")?;
    Ok(Launch::new(kernel, grid_for(n, block)).arg("src_ptr", src).arg("dst_ptr", dst).arg("n", n))
}

/// Launches [`copy`] from `src` to `dst` (f32, same number of elements).
pub fn launch_copy(kernel: &Kernel, mem: &mut Memory, src: TensorId, dst: TensorId) -> Result<LaunchSummary, ExecError> {
    copy_launch(kernel, mem, src, dst)?.run(mem)
}
