//! Naive tiled matmul `C = A @ B`: a 2-D grid of `BLOCK_M` x `BLOCK_N` output tiles, a loop over
//! `K` in steps of `BLOCK_K` carrying the f32 accumulator through `dot`, masked loads with
//! `other = 0` at the ragged edges and a masked store.

use super::{dims, grid_for, tile};
use tilegrad_ir::{DType, DotPrecision, IrError, Kernel, KernelBuilder};
use tilegrad_reference::{ExecError, Launch, LaunchSummary, Memory, TensorId};

/// The matmul kernel. `precision` is `dot`'s `input_precision`; `None` keeps Triton's default
/// (tf32 for f32 operands).
///
/// Parameters: `a_ptr`, `b_ptr`, `c_ptr`, `M`, `N`, `K`, `stride_am`, `stride_ak`, `stride_bk`,
/// `stride_bn`, `stride_cm`, `stride_cn` (i32), `BLOCK_M`, `BLOCK_N`, `BLOCK_K` (constexpr). Grid:
/// `(cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))`.
pub fn matmul(block_m: usize, block_n: usize, block_k: usize, precision: Option<DotPrecision>) -> Result<Kernel, IrError> {
    let mut b = KernelBuilder::new("matmul");
    let a = b.ptr_param("a_ptr", DType::F32);
    let bb = b.ptr_param("b_ptr", DType::F32);
    let c = b.ptr_param("c_ptr", DType::F32);
    let m = b.scalar_param("M", DType::I32);
    let n = b.scalar_param("N", DType::I32);
    let k = b.scalar_param("K", DType::I32);
    let s_am = b.scalar_param("stride_am", DType::I32);
    let s_ak = b.scalar_param("stride_ak", DType::I32);
    let s_bk = b.scalar_param("stride_bk", DType::I32);
    let s_bn = b.scalar_param("stride_bn", DType::I32);
    let s_cm = b.scalar_param("stride_cm", DType::I32);
    let s_cn = b.scalar_param("stride_cn", DType::I32);
    let bm = b.constexpr("BLOCK_M", block_m as i64);
    let bn = b.constexpr("BLOCK_N", block_n as i64);
    let bk = b.constexpr("BLOCK_K", block_k as i64);

    let pid_m = b.program_id(0);
    let pid_n = b.program_id(1);
    let m0 = b.mul(pid_m, bm);
    let n0 = b.mul(pid_n, bn);
    let ar_m = b.arange(0, block_m as i64);
    let ar_n = b.arange(0, block_n as i64);
    let offs_m = b.add(m0, ar_m);
    let offs_n = b.add(n0, ar_n);
    let rk = b.arange(0, block_k as i64);
    let om = b.expand_dims(offs_m, 1); // [BLOCK_M, 1]
    let on = b.expand_dims(offs_n, 0); // [1, BLOCK_N]
    let m_ok = b.lt(om, m);
    let n_ok = b.lt(on, n);
    let a_rows = b.mul(om, s_am);
    let b_cols = b.mul(on, s_bn);

    let acc0 = b.zeros(&[block_m, block_n], DType::F32);
    let zero = b.i32(0);
    let one = b.i32(1);
    let k_tiles = b.cdiv(k, bk);
    let acc = b.for_range(zero, k_tiles, one, None, &[acc0], |b, kt, carried| {
        let k0 = b.mul(kt, bk);
        let offs_k = b.add(k0, rk);
        let ok_row = b.expand_dims(offs_k, 0); // [1, BLOCK_K]
        let ok_col = b.expand_dims(offs_k, 1); // [BLOCK_K, 1]
        let a_k = b.mul(ok_row, s_ak);
        let a_offs = b.add(a_rows, a_k); // [BLOCK_M, BLOCK_K]
        let a_ptrs = b.add(a, a_offs);
        let ak_ok = b.lt(ok_row, k);
        let a_mask = b.and(m_ok, ak_ok);
        let zf = b.f32(0.0);
        let a_tile = b.load(a_ptrs, Some(a_mask), Some(zf));
        let b_k = b.mul(ok_col, s_bk);
        let b_offs = b.add(b_k, b_cols); // [BLOCK_K, BLOCK_N]
        let b_ptrs = b.add(bb, b_offs);
        let bk_ok = b.lt(ok_col, k);
        let b_mask = b.and(bk_ok, n_ok);
        let b_tile = b.load(b_ptrs, Some(b_mask), Some(zf));
        let next = match precision {
            Some(p) => b.dot_with(a_tile, b_tile, Some(carried[0]), p),
            None => b.dot(a_tile, b_tile, Some(carried[0])),
        };
        vec![next]
    });

    let c_rows = b.mul(om, s_cm);
    let c_cols = b.mul(on, s_cn);
    let c_offs = b.add(c_rows, c_cols);
    let c_ptrs = b.add(c, c_offs);
    let c_mask = b.and(m_ok, n_ok);
    b.store(c_ptrs, acc[0], Some(c_mask));
    b.finish()
}

/// Rounds an f32 to tf32 (10 explicit mantissa bits), round to nearest, ties to even, on the bit
/// pattern: what tensor cores do to f32 operands of `dot` at tf32 precision. NaN and infinities
/// pass through.
pub fn round_tf32(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    let bits = x.to_bits();
    let lsb = (bits >> 13) & 1;
    let rounded = bits.wrapping_add(0x0fff + lsb) & !0x1fff;
    f32::from_bits(rounded)
}

/// Reference: `a` `[m, k]` times `b` `[k, n]`, row-major, in f64.
pub fn matmul_ref(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    c
}

/// The magnitude of each output of [`matmul_ref`]: `sum_p |a[i, p] * b[p, j]|`, the scale of its
/// rounding error.
pub fn matmul_scale(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let abs = |v: &[f64]| v.iter().map(|x| x.abs()).collect::<Vec<f64>>();
    matmul_ref(&abs(a), &abs(b), m, n, k)
}

/// The launch of [`matmul`]: `a` `[M, K]`, `b` `[K, N]`, writing `c` `[M, N]`.
pub fn matmul_launch<'k>(kernel: &'k Kernel, mem: &Memory, a: TensorId, b: TensorId, c: TensorId) -> Result<Launch<'k>, ExecError> {
    let sa = dims(kernel, mem, a, "a_ptr", 2)?;
    let sb = dims(kernel, mem, b, "b_ptr", 2)?;
    dims(kernel, mem, c, "c_ptr", 2)?;
    let (bm, bn) = (tile(kernel, "BLOCK_M")?, tile(kernel, "BLOCK_N")?);
    let (ta, tb, tc) = (mem.get(a), mem.get(b), mem.get(c));
    Ok(Launch::new(kernel, (grid_for(sa[0], bm), grid_for(sb[1], bn)))
        .arg("a_ptr", a)
        .arg("b_ptr", b)
        .arg("c_ptr", c)
        .arg("M", sa[0])
        .arg("N", sb[1])
        .arg("K", sa[1])
        .arg("stride_am", ta.stride(0))
        .arg("stride_ak", ta.stride(1))
        .arg("stride_bk", tb.stride(0))
        .arg("stride_bn", tb.stride(1))
        .arg("stride_cm", tc.stride(0))
        .arg("stride_cn", tc.stride(1)))
}

/// Launches [`matmul`]: `a` `[M, K]`, `b` `[K, N]`, writing `c` `[M, N]`.
pub fn launch_matmul(kernel: &Kernel, mem: &mut Memory, a: TensorId, b: TensorId, c: TensorId) -> Result<LaunchSummary, ExecError> {
    matmul_launch(kernel, mem, a, b, c)?.run(mem)
}
