//! Vector add: the first Triton tutorial kernel. `BLOCK` lanes per program, the last program
//! masked.

use super::{grid_for, tile};
use tilegrad_ir::{DType, IrError, Kernel, KernelBuilder};
use tilegrad_reference::{ExecError, Launch, LaunchSummary, Memory, TensorId};

/// `out = x + y` over `n` f32 elements, `block` lanes per program (a power of two).
///
/// Parameters: `x_ptr`, `y_ptr`, `out_ptr`, `n` (i32), `BLOCK` (constexpr).
pub fn vector_add(block: usize) -> Result<Kernel, IrError> {
    let mut b = KernelBuilder::new("vector_add");
    let x = b.ptr_param("x_ptr", DType::F32);
    let y = b.ptr_param("y_ptr", DType::F32);
    let out = b.ptr_param("out_ptr", DType::F32);
    let n = b.scalar_param("n", DType::I32);
    let block_v = b.constexpr("BLOCK", block as i64);
    let (offs, mask) = super::block_offsets(&mut b, block_v, block, n);
    let px = b.add(x, offs);
    let py = b.add(y, offs);
    let xv = b.load(px, Some(mask), None);
    let yv = b.load(py, Some(mask), None);
    let s = b.add(xv, yv);
    let po = b.add(out, offs);
    b.store(po, s, Some(mask));
    b.finish()
}

/// Reference: `x + y`.
pub fn vector_add_ref(x: &[f64], y: &[f64]) -> Vec<f64> {
    x.iter().zip(y).map(|(a, b)| a + b).collect()
}

/// The launch of [`vector_add`] on `x`, `y` (f32, `n` elements) writing `out`.
pub fn vector_add_launch<'k>(kernel: &'k Kernel, mem: &Memory, x: TensorId, y: TensorId, out: TensorId) -> Result<Launch<'k>, ExecError> {
    let n = mem.get(x).numel();
    let block = tile(kernel, "BLOCK")?;
    Ok(Launch::new(kernel, grid_for(n, block)).arg("x_ptr", x).arg("y_ptr", y).arg("out_ptr", out).arg("n", n))
}

/// Launches [`vector_add`] on `x`, `y` (f32, `n` elements) writing `out`.
pub fn launch_vector_add(kernel: &Kernel, mem: &mut Memory, x: TensorId, y: TensorId, out: TensorId) -> Result<LaunchSummary, ExecError> {
    vector_add_launch(kernel, mem, x, y, out)?.run(mem)
}
