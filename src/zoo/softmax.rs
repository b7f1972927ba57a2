//! Row softmax, max-subtracted: `BLOCK_ROWS` rows per program, each whole row in one tile of
//! `BLOCK_COLS >= n_cols` lanes; lanes past the row read `-inf`, so they add nothing to the max
//! or to the sum of exponentials.

use super::{dims, grid_for, tile};
use tilegrad_ir::{DType, IrError, Kernel, KernelBuilder};
use tilegrad_reference::{ExecError, Launch, LaunchSummary, Memory, TensorId};

/// The softmax kernel. `block_cols` must be at least the number of columns it is launched on
/// (use `n_cols.next_power_of_two()`).
///
/// Parameters: `x_ptr`, `y_ptr`, `x_row_stride`, `y_row_stride`, `n_rows`, `n_cols` (i32),
/// `BLOCK_ROWS`, `BLOCK_COLS` (constexpr).
pub fn softmax(block_rows: usize, block_cols: usize) -> Result<Kernel, IrError> {
    let mut b = KernelBuilder::new("softmax");
    let x = b.ptr_param("x_ptr", DType::F32);
    let y = b.ptr_param("y_ptr", DType::F32);
    let sx = b.scalar_param("x_row_stride", DType::I32);
    let sy = b.scalar_param("y_row_stride", DType::I32);
    let n_rows = b.scalar_param("n_rows", DType::I32);
    let n_cols = b.scalar_param("n_cols", DType::I32);
    let br = b.constexpr("BLOCK_ROWS", block_rows as i64);
    b.constexpr("BLOCK_COLS", block_cols as i64);

    let pid = b.program_id(0);
    let row0 = b.mul(pid, br);
    let ar_r = b.arange(0, block_rows as i64);
    let rows = b.add(row0, ar_r);
    let cols = b.arange(0, block_cols as i64);
    let rows2 = b.expand_dims(rows, 1); // [BLOCK_ROWS, 1]
    let cols2 = b.expand_dims(cols, 0); // [1, BLOCK_COLS]
    let r_ok = b.lt(rows2, n_rows);
    let c_ok = b.lt(cols2, n_cols);
    let mask = b.and(r_ok, c_ok);

    let xr = b.mul(rows2, sx);
    let x_offs = b.add(xr, cols2);
    let px = b.add(x, x_offs);
    let neg_inf = b.f32(f32::NEG_INFINITY);
    let xv = b.load(px, Some(mask), Some(neg_inf));
    let row_max = b.max(xv, Some(1), true);
    let z = b.sub(xv, row_max);
    let num = b.exp(z);
    let den = b.sum(num, Some(1), true);
    let out = b.div(num, den);

    let yr = b.mul(rows2, sy);
    let y_offs = b.add(yr, cols2);
    let py = b.add(y, y_offs);
    b.store(py, out, Some(mask));
    b.finish()
}

/// Reference: softmax of each row of `x` (`[rows, cols]` row-major), in f64.
pub fn softmax_ref(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; rows * cols];
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = row.iter().map(|v| (v - m).exp()).collect();
        let s: f64 = e.iter().sum();
        for (c, v) in e.iter().enumerate() {
            out[r * cols + c] = v / s;
        }
    }
    out
}

/// The launch of [`softmax`] on `x` (`[rows, cols]`) writing `y` (same shape). Fails with an argument
/// error when the kernel's `BLOCK_COLS` is smaller than the row.
pub fn softmax_launch<'k>(kernel: &'k Kernel, mem: &Memory, x: TensorId, y: TensorId) -> Result<Launch<'k>, ExecError> {
    let s = dims(kernel, mem, x, "x_ptr", 2)?;
    dims(kernel, mem, y, "y_ptr", 2)?;
    let (br, bc) = (tile(kernel, "BLOCK_ROWS")?, tile(kernel, "BLOCK_COLS")?);
    if bc < s[1] {
        return Err(ExecError::Argument {
            kernel: kernel.name.clone(),
            param: "BLOCK_COLS".into(),
            message: format!("rows of {} columns do not fit one tile of {bc}", s[1]),
        });
    }
    let (tx, ty) = (mem.get(x), mem.get(y));
    Ok(Launch::new(kernel, grid_for(s[0], br))
        .arg("x_ptr", x)
        .arg("y_ptr", y)
        .arg("x_row_stride", tx.stride(0))
        .arg("y_row_stride", ty.stride(0))
        .arg("n_rows", s[0])
        .arg("n_cols", s[1]))
}

/// Launches [`softmax`] on `x` (`[rows, cols]`) writing `y` (same shape). Fails with an argument
/// error when the kernel's `BLOCK_COLS` is smaller than the row.
pub fn launch_softmax(kernel: &Kernel, mem: &mut Memory, x: TensorId, y: TensorId) -> Result<LaunchSummary, ExecError> {
    softmax_launch(kernel, mem, x, y)?.run(mem)
}
