//! Segmented sum: a loop whose trip count each program reads from memory. Program `s` loads its
//! segment's `start` and `length` through scalar pointers and loops
//! `for i in range(0, cdiv(length, BLOCK))` with no `max_iters`: the bound tilegrad has to infer.

use super::{dims, tile};
use tilegrad_ir::{DType, IrError, Kernel, KernelBuilder};
use tilegrad_reference::{ExecError, Launch, LaunchSummary, Memory, TensorId};

/// `out[s] = sum(values[starts[s] .. starts[s] + lengths[s]])`, one program per segment.
///
/// Parameters: `values_ptr` (f32), `starts_ptr`, `lengths_ptr` (i32), `out_ptr` (f32), `BLOCK`
/// (constexpr).
pub fn segment_sum(block: usize) -> Result<Kernel, IrError> {
    let mut b = KernelBuilder::new("segment_sum");
    let values = b.ptr_param("values_ptr", DType::F32);
    let starts = b.ptr_param("starts_ptr", DType::I32);
    let lengths = b.ptr_param("lengths_ptr", DType::I32);
    let out = b.ptr_param("out_ptr", DType::F32);
    let block_v = b.constexpr("BLOCK", block as i64);
    let pid = b.program_id(0);
    let p_start = b.add(starts, pid);
    let start = b.load(p_start, None, None);
    let p_len = b.add(lengths, pid);
    let len = b.load(p_len, None, None);
    let seg = b.add(values, start); // scalar pointer to the segment
    let lanes = b.arange(0, block as i64);
    let acc0 = b.zeros(&[block], DType::F32);
    let zero = b.i32(0);
    let one = b.i32(1);
    let trips = b.cdiv(len, block_v);
    let acc = b.for_range(zero, trips, one, None, &[acc0], |b, i, c| {
        let base = b.mul(i, block_v);
        let offs = b.add(base, lanes);
        let mask = b.lt(offs, len);
        let p = b.add(seg, offs);
        let zf = b.f32(0.0);
        let v = b.load(p, Some(mask), Some(zf));
        vec![b.add(c[0], v)]
    });
    let total = b.sum(acc[0], None, false);
    let po = b.add(out, pid);
    b.store(po, total, None);
    b.finish()
}

/// Reference: the sum of each segment, in f64.
pub fn segment_sum_ref(values: &[f64], starts: &[i32], lengths: &[i32]) -> Vec<f64> {
    starts.iter().zip(lengths).map(|(&s, &l)| values[s as usize..(s + l) as usize].iter().sum()).collect()
}

/// The launch of [`segment_sum`] with one program per segment (`starts`, `lengths`: i32 `[S]`;
/// `values`: f32; `out`: f32 `[S]`).
pub fn segment_sum_launch<'k>(
    kernel: &'k Kernel,
    mem: &Memory,
    values: TensorId,
    starts: TensorId,
    lengths: TensorId,
    out: TensorId,
) -> Result<Launch<'k>, ExecError> {
    let s = dims(kernel, mem, lengths, "lengths_ptr", 1)?;
    tile(kernel, "BLOCK")?;
    if s[0] == 0 {
        return Err(ExecError::Argument {
            kernel: kernel.name.clone(),
            param: "lengths_ptr".into(),
            message: "no segments to launch".into(),
        });
    }
    Ok(Launch::new(kernel, s[0]).arg("values_ptr", values).arg("starts_ptr", starts).arg("lengths_ptr", lengths).arg("out_ptr", out))
}

/// Launches [`segment_sum`] with one program per segment (`starts`, `lengths`: i32 `[S]`;
/// `values`: f32; `out`: f32 `[S]`).
pub fn launch_segment_sum(
    kernel: &Kernel,
    mem: &mut Memory,
    values: TensorId,
    starts: TensorId,
    lengths: TensorId,
    out: TensorId,
) -> Result<LaunchSummary, ExecError> {
    segment_sum_launch(kernel, mem, values, starts, lengths, out)?.run(mem)
}
