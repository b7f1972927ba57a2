//! L2 norm in two kernels, the safe way to do a global reduction without atomics: each program
//! of the first writes the sum of squares of its block to its own slot of `partial`; one program
//! of the second loops over the partials (a trip count known only at run time) and writes
//! `sqrt(total)`.

use super::{grid_for, tile};
use tilegrad_ir::{DType, IrError, Kernel, KernelBuilder};
use tilegrad_reference::{ExecError, Launch, LaunchSummary, Memory, TensorId};

/// First stage: `partial[pid] = sum(x[pid*BLOCK .. (pid+1)*BLOCK]^2)`.
///
/// Parameters: `x_ptr`, `partial_ptr`, `n` (i32), `BLOCK` (constexpr).
pub fn l2_norm_partial(block: usize) -> Result<Kernel, IrError> {
    let mut b = KernelBuilder::new("l2_norm_partial");
    let x = b.ptr_param("x_ptr", DType::F32);
    let partial = b.ptr_param("partial_ptr", DType::F32);
    let n = b.scalar_param("n", DType::I32);
    let block_v = b.constexpr("BLOCK", block as i64);
    let (offs, mask) = super::block_offsets(&mut b, block_v, block, n);
    let px = b.add(x, offs);
    let zf = b.f32(0.0);
    let v = b.load(px, Some(mask), Some(zf));
    let sq = b.mul(v, v);
    let s = b.sum(sq, None, false);
    let pid = b.program_id(0);
    let p = b.add(partial, pid);
    b.store(p, s, None);
    b.finish()
}

/// Second stage, one program: `out[0] = sqrt(sum(partial[..num_partials]))`, reading the
/// partials in chunks of `block` in a loop of `cdiv(num_partials, BLOCK)` trips.
///
/// Parameters: `partial_ptr`, `out_ptr`, `num_partials` (i32), `BLOCK` (constexpr).
pub fn l2_norm_finish(block: usize) -> Result<Kernel, IrError> {
    let mut b = KernelBuilder::new("l2_norm_finish");
    let partial = b.ptr_param("partial_ptr", DType::F32);
    let out = b.ptr_param("out_ptr", DType::F32);
    let num = b.scalar_param("num_partials", DType::I32);
    let block_v = b.constexpr("BLOCK", block as i64);
    let lanes = b.arange(0, block as i64);
    let acc0 = b.zeros(&[block], DType::F32);
    let zero = b.i32(0);
    let one = b.i32(1);
    let trips = b.cdiv(num, block_v);
    let acc = b.for_range(zero, trips, one, None, &[acc0], |b, i, c| {
        let start = b.mul(i, block_v);
        let offs = b.add(start, lanes);
        let mask = b.lt(offs, num);
        let p = b.add(partial, offs);
        let zf = b.f32(0.0);
        let v = b.load(p, Some(mask), Some(zf));
        vec![b.add(c[0], v)]
    });
    let total = b.sum(acc[0], None, false);
    let norm = b.sqrt(total);
    b.store(out, norm, None);
    b.finish()
}

/// The number of partials [`l2_norm_partial`] with tiles of `block` writes for `n` elements (the
/// length of the `partial` tensor).
pub fn l2_norm_num_partials(n: usize, block: usize) -> usize {
    n.div_ceil(block).max(1)
}

/// Reference: `sqrt(sum x^2)` in f64.
pub fn l2_norm_ref(x: &[f64]) -> f64 {
    x.iter().map(|v| v * v).sum::<f64>().sqrt()
}

/// The launch of [`l2_norm_partial`] on `x` (f32, any shape, taken flat) writing `partial` (f32,
/// [`l2_norm_num_partials`] elements).
pub fn l2_norm_partial_launch<'k>(kernel: &'k Kernel, mem: &Memory, x: TensorId, partial: TensorId) -> Result<Launch<'k>, ExecError> {
    let n = mem.get(x).numel();
    let block = tile(kernel, "BLOCK")?;
    Ok(Launch::new(kernel, grid_for(n, block)).arg("x_ptr", x).arg("partial_ptr", partial).arg("n", n))
}

/// Launches [`l2_norm_partial`] on `x` (f32, any shape, taken flat) writing `partial` (f32,
/// [`l2_norm_num_partials`] elements).
pub fn launch_l2_norm_partial(kernel: &Kernel, mem: &mut Memory, x: TensorId, partial: TensorId) -> Result<LaunchSummary, ExecError> {
    l2_norm_partial_launch(kernel, mem, x, partial)?.run(mem)
}

/// The launch of [`l2_norm_finish`] (one program) over all of `partial`, writing `out[0]`.
pub fn l2_norm_finish_launch<'k>(kernel: &'k Kernel, mem: &Memory, partial: TensorId, out: TensorId) -> Result<Launch<'k>, ExecError> {
    let num = mem.get(partial).numel();
    Ok(Launch::new(kernel, 1u32).arg("partial_ptr", partial).arg("out_ptr", out).arg("num_partials", num))
}

/// Launches [`l2_norm_finish`] (one program) over all of `partial`, writing `out[0]`.
pub fn launch_l2_norm_finish(kernel: &Kernel, mem: &mut Memory, partial: TensorId, out: TensorId) -> Result<LaunchSummary, ExecError> {
    l2_norm_finish_launch(kernel, mem, partial, out)?.run(mem)
}

/// Both stages: the summaries of the two launches.
pub fn launch_l2_norm(
    kernels: (&Kernel, &Kernel),
    mem: &mut Memory,
    x: TensorId,
    partial: TensorId,
    out: TensorId,
) -> Result<(LaunchSummary, LaunchSummary), ExecError> {
    let first = launch_l2_norm_partial(kernels.0, mem, x, partial)?;
    let second = launch_l2_norm_finish(kernels.1, mem, partial, out)?;
    Ok((first, second))
}
