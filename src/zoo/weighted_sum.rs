//! Weighted sum `out[r] = sum_d x[r, d] * w[d]` and its hand-written backward, with block
//! pointers: the kernels of the CS336 notebook that tilegrad's design starts from.
//!
//! The forward walks the `D` dimension in tiles, advancing the block pointers of `x` and `w` inside
//! the loop (their offsets are loop-carried values, as `advance` produces new pointers). The
//! backward writes `grad_x` tile by tile and a partial `grad_weight` per row tile into a
//! `[n_row_tiles, D]` buffer that the host reduces over its first axis.

use super::{dims, grid_for, tile};
use tilegrad_ir::{DType, IrError, Kernel, KernelBuilder, Padding};
use tilegrad_reference::{ExecError, HostTensor, Launch, LaunchSummary, Memory, TensorId};

/// The forward kernel, `rows_tile` rows per program, `D` walked in tiles of `d_tile`.
///
/// Parameters (in the notebook's order): `x_ptr`, `weight_ptr`, `output_ptr`, `x_stride_row`,
/// `x_stride_dim`, `weight_stride_dim`, `output_stride_row`, `ROWS`, `D` (i32),
/// `ROWS_TILE_SIZE`, `D_TILE_SIZE` (constexpr).
pub fn weighted_sum_fwd(rows_tile: usize, d_tile: usize) -> Result<Kernel, IrError> {
    let mut b = KernelBuilder::new("weighted_sum_fwd");
    let x = b.ptr_param("x_ptr", DType::F32);
    let w = b.ptr_param("weight_ptr", DType::F32);
    let out = b.ptr_param("output_ptr", DType::F32);
    let sx_r = b.scalar_param("x_stride_row", DType::I32);
    let sx_d = b.scalar_param("x_stride_dim", DType::I32);
    let sw_d = b.scalar_param("weight_stride_dim", DType::I32);
    let so_r = b.scalar_param("output_stride_row", DType::I32);
    let rows = b.scalar_param("ROWS", DType::I32);
    let d = b.scalar_param("D", DType::I32);
    let rt = b.constexpr("ROWS_TILE_SIZE", rows_tile as i64);
    let dt = b.constexpr("D_TILE_SIZE", d_tile as i64);

    let row_tile_idx = b.program_id(0);
    let row0 = b.mul(row_tile_idx, rt);
    let zero = b.i32(0);
    let x_bp = b.make_block_ptr(x, &[rows, d], &[sx_r, sx_d], &[row0, zero], &[rows_tile, d_tile], &[1, 0]);
    let w_bp = b.make_block_ptr(w, &[d], &[sw_d], &[zero], &[d_tile], &[0]);
    let o_bp = b.make_block_ptr(out, &[rows], &[so_r], &[row0], &[rows_tile], &[0]);

    let acc0 = b.zeros(&[rows_tile], DType::F32);
    let n_tiles = b.cdiv(d, dt);
    let one = b.i32(1);
    let mut init = vec![acc0];
    init.extend_from_slice(&x_bp.offsets);
    init.extend_from_slice(&w_bp.offsets);
    let fin = b.for_range(zero, n_tiles, one, None, &init, |b, _i, c| {
        let x_cur = x_bp.with_offsets(&c[1..3]);
        let w_cur = w_bp.with_offsets(&c[3..4]);
        let x_tile = b.load_block(&x_cur, &[0, 1], Padding::Zero); // [ROWS_TILE, D_TILE]
        let w_tile = b.load_block(&w_cur, &[0], Padding::Zero); // [D_TILE]
        let w_row = b.expand_dims(w_tile, 0); // w[None, :]
        let weighted = b.mul(x_tile, w_row);
        let part = b.sum(weighted, Some(1), false);
        let acc = b.add(c[0], part);
        let z = b.i32(0);
        let x_next = b.advance(&x_cur, &[z, dt]);
        let w_next = b.advance(&w_cur, &[dt]);
        let mut next = vec![acc];
        next.extend_from_slice(&x_next.offsets);
        next.extend_from_slice(&w_next.offsets);
        next
    });
    b.store_block(&o_bp, fin[0], &[0]);
    b.finish()
}

/// The backward kernel: `grad_x[r, d] = grad_output[r] * w[d]`, and per row tile `t`,
/// `partial_grad_weight[t, d] = sum_{r in t} x[r, d] * grad_output[r]`.
///
/// Parameters: `x_ptr`, `weight_ptr`, `grad_output_ptr`, `grad_x_ptr`,
/// `partial_grad_weight_ptr`, `stride_xr`, `stride_xd`, `stride_wd`, `stride_gr`, `stride_gxr`,
/// `stride_gxd`, `stride_gwb`, `stride_gwd`, `NUM_ROWS`, `D` (i32), `ROWS_TILE_SIZE`,
/// `D_TILE_SIZE` (constexpr). The grid must have one program per row tile: the partial buffer has
/// `num_programs(0)` rows.
pub fn weighted_sum_bwd(rows_tile: usize, d_tile: usize) -> Result<Kernel, IrError> {
    let mut b = KernelBuilder::new("weighted_sum_bwd");
    let x = b.ptr_param("x_ptr", DType::F32);
    let w = b.ptr_param("weight_ptr", DType::F32);
    let g = b.ptr_param("grad_output_ptr", DType::F32);
    let gx = b.ptr_param("grad_x_ptr", DType::F32);
    let pgw = b.ptr_param("partial_grad_weight_ptr", DType::F32);
    let s_xr = b.scalar_param("stride_xr", DType::I32);
    let s_xd = b.scalar_param("stride_xd", DType::I32);
    let s_wd = b.scalar_param("stride_wd", DType::I32);
    let s_gr = b.scalar_param("stride_gr", DType::I32);
    let s_gxr = b.scalar_param("stride_gxr", DType::I32);
    let s_gxd = b.scalar_param("stride_gxd", DType::I32);
    let s_gwb = b.scalar_param("stride_gwb", DType::I32);
    let s_gwd = b.scalar_param("stride_gwd", DType::I32);
    let rows = b.scalar_param("NUM_ROWS", DType::I32);
    let d = b.scalar_param("D", DType::I32);
    let rt = b.constexpr("ROWS_TILE_SIZE", rows_tile as i64);
    let dt = b.constexpr("D_TILE_SIZE", d_tile as i64);

    let row_tile_idx = b.program_id(0);
    let n_row_tiles = b.num_programs(0);
    let row0 = b.mul(row_tile_idx, rt);
    let zero = b.i32(0);
    let g_bp = b.make_block_ptr(g, &[rows], &[s_gr], &[row0], &[rows_tile], &[0]);
    let x_bp = b.make_block_ptr(x, &[rows, d], &[s_xr, s_xd], &[row0, zero], &[rows_tile, d_tile], &[1, 0]);
    let w_bp = b.make_block_ptr(w, &[d], &[s_wd], &[zero], &[d_tile], &[0]);
    let gx_bp = b.make_block_ptr(gx, &[rows, d], &[s_gxr, s_gxd], &[row0, zero], &[rows_tile, d_tile], &[1, 0]);
    let pgw_bp = b.make_block_ptr(pgw, &[n_row_tiles, d], &[s_gwb, s_gwd], &[row_tile_idx, zero], &[1, d_tile], &[1, 0]);

    let grad_out = b.load_block(&g_bp, &[0], Padding::Zero); // [ROWS_TILE]
    let grad_col = b.expand_dims(grad_out, 1); // grad_output[:, None]
    let n_tiles = b.cdiv(d, dt);
    let one = b.i32(1);
    let init: Vec<_> = [&x_bp, &w_bp, &gx_bp, &pgw_bp].iter().flat_map(|bp| bp.offsets.iter().copied()).collect();
    b.for_range(zero, n_tiles, one, None, &init, |b, _i, c| {
        let x_cur = x_bp.with_offsets(&c[0..2]);
        let w_cur = w_bp.with_offsets(&c[2..3]);
        let gx_cur = gx_bp.with_offsets(&c[3..5]);
        let pgw_cur = pgw_bp.with_offsets(&c[5..7]);

        let w_tile = b.load_block(&w_cur, &[0], Padding::Zero);
        let w_row = b.expand_dims(w_tile, 0); // weight[None, :]
        let gx_tile = b.mul(grad_col, w_row); // [ROWS_TILE, D_TILE]
        b.store_block(&gx_cur, gx_tile, &[0, 1]);

        let x_tile = b.load_block(&x_cur, &[0, 1], Padding::Zero);
        let prod = b.mul(x_tile, grad_col);
        let gw_tile = b.sum(prod, Some(0), true); // [1, D_TILE]
        b.store_block(&pgw_cur, gw_tile, &[1]);

        let z = b.i32(0);
        let x_next = b.advance(&x_cur, &[z, dt]);
        let w_next = b.advance(&w_cur, &[dt]);
        let gx_next = b.advance(&gx_cur, &[z, dt]);
        let pgw_next = b.advance(&pgw_cur, &[z, dt]);
        [x_next, w_next, gx_next, pgw_next].iter().flat_map(|bp| bp.offsets.iter().copied()).collect()
    });
    b.finish()
}

/// Reference forward: `x` is `[rows, d]` row-major.
pub fn weighted_sum_fwd_ref(x: &[f64], w: &[f64], rows: usize, d: usize) -> Vec<f64> {
    (0..rows).map(|r| (0..d).map(|j| x[r * d + j] * w[j]).sum()).collect()
}

/// Reference backward: `(grad_x, grad_weight)` with `grad_x = g[:, None] * w[None, :]` and
/// `grad_weight = x^T g`.
pub fn weighted_sum_bwd_ref(x: &[f64], w: &[f64], g: &[f64], rows: usize, d: usize) -> (Vec<f64>, Vec<f64>) {
    let mut gx = vec![0.0; rows * d];
    let mut gw = vec![0.0; d];
    for r in 0..rows {
        for j in 0..d {
            gx[r * d + j] = g[r] * w[j];
            gw[j] += x[r * d + j] * g[r];
        }
    }
    (gx, gw)
}

/// The host half of the backward: sums the `[n_row_tiles, D]` partial buffer over its first axis
/// (in f64), giving `grad_weight` (`[D]`).
pub fn sum_partial_grad_weight(partial: &HostTensor) -> Vec<f64> {
    let d = partial.shape().last().copied().unwrap_or(1).max(1);
    let mut out = vec![0.0; d];
    for (i, v) in partial.to_f64_vec().into_iter().enumerate() {
        out[i % d] += v;
    }
    out
}

/// The launch of [`weighted_sum_fwd`]: `x` `[ROWS, D]`, `weight` `[D]`, writing `output` `[ROWS]`.
pub fn weighted_sum_fwd_launch<'k>(
    kernel: &'k Kernel,
    mem: &Memory,
    x: TensorId,
    weight: TensorId,
    output: TensorId,
) -> Result<Launch<'k>, ExecError> {
    let s = dims(kernel, mem, x, "x_ptr", 2)?;
    dims(kernel, mem, weight, "weight_ptr", 1)?;
    dims(kernel, mem, output, "output_ptr", 1)?;
    let rt = tile(kernel, "ROWS_TILE_SIZE")?;
    let (tx, tw, to) = (mem.get(x), mem.get(weight), mem.get(output));
    Ok(Launch::new(kernel, grid_for(s[0], rt))
        .arg("x_ptr", x)
        .arg("weight_ptr", weight)
        .arg("output_ptr", output)
        .arg("x_stride_row", tx.stride(0))
        .arg("x_stride_dim", tx.stride(1))
        .arg("weight_stride_dim", tw.stride(0))
        .arg("output_stride_row", to.stride(0))
        .arg("ROWS", s[0])
        .arg("D", s[1]))
}

/// Launches [`weighted_sum_fwd`]: `x` `[ROWS, D]`, `weight` `[D]`, writing `output` `[ROWS]`.
pub fn launch_weighted_sum_fwd(
    kernel: &Kernel,
    mem: &mut Memory,
    x: TensorId,
    weight: TensorId,
    output: TensorId,
) -> Result<LaunchSummary, ExecError> {
    weighted_sum_fwd_launch(kernel, mem, x, weight, output)?.run(mem)
}

/// The launch of [`weighted_sum_bwd`] with one program per row tile: `x` `[ROWS, D]`, `weight` `[D]`,
/// `grad_output` `[ROWS]`, writing `grad_x` `[ROWS, D]` and `partial_grad_weight`
/// `[cdiv(ROWS, ROWS_TILE_SIZE), D]` (reduce it with [`sum_partial_grad_weight`]).
pub fn weighted_sum_bwd_launch<'k>(
    kernel: &'k Kernel,
    mem: &Memory,
    x: TensorId,
    weight: TensorId,
    grad_output: TensorId,
    grad_x: TensorId,
    partial_grad_weight: TensorId,
) -> Result<Launch<'k>, ExecError> {
    let s = dims(kernel, mem, x, "x_ptr", 2)?;
    dims(kernel, mem, weight, "weight_ptr", 1)?;
    dims(kernel, mem, grad_output, "grad_output_ptr", 1)?;
    dims(kernel, mem, grad_x, "grad_x_ptr", 2)?;
    dims(kernel, mem, partial_grad_weight, "partial_grad_weight_ptr", 2)?;
    let rt = tile(kernel, "ROWS_TILE_SIZE")?;
    let (tx, tw, tg, tgx, tp) = (mem.get(x), mem.get(weight), mem.get(grad_output), mem.get(grad_x), mem.get(partial_grad_weight));
    Ok(Launch::new(kernel, grid_for(s[0], rt))
        .arg("x_ptr", x)
        .arg("weight_ptr", weight)
        .arg("grad_output_ptr", grad_output)
        .arg("grad_x_ptr", grad_x)
        .arg("partial_grad_weight_ptr", partial_grad_weight)
        .arg("stride_xr", tx.stride(0))
        .arg("stride_xd", tx.stride(1))
        .arg("stride_wd", tw.stride(0))
        .arg("stride_gr", tg.stride(0))
        .arg("stride_gxr", tgx.stride(0))
        .arg("stride_gxd", tgx.stride(1))
        .arg("stride_gwb", tp.stride(0))
        .arg("stride_gwd", tp.stride(1))
        .arg("NUM_ROWS", s[0])
        .arg("D", s[1]))
}

/// Launches [`weighted_sum_bwd`] with one program per row tile: `x` `[ROWS, D]`, `weight` `[D]`,
/// `grad_output` `[ROWS]`, writing `grad_x` `[ROWS, D]` and `partial_grad_weight`
/// `[cdiv(ROWS, ROWS_TILE_SIZE), D]` (reduce it with [`sum_partial_grad_weight`]).
pub fn launch_weighted_sum_bwd(
    kernel: &Kernel,
    mem: &mut Memory,
    x: TensorId,
    weight: TensorId,
    grad_output: TensorId,
    grad_x: TensorId,
    partial_grad_weight: TensorId,
) -> Result<LaunchSummary, ExecError> {
    weighted_sum_bwd_launch(kernel, mem, x, weight, grad_output, grad_x, partial_grad_weight)?.run(mem)
}
