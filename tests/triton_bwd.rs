//! Hand-written Triton backward kernels (`examples/triton/*_bwd.py`) for every forward example of
//! `examples/triton/`, checked against tilegrad's ground truth, with deliberately broken variants.
//!
//! Each test converts forward and backward kernels with the Triton front end (f32 pointers, i32
//! scalars except the f32 ones named below), draws random non-zero inputs and a random non-zero
//! cotangent at sizes that are not multiples of the tiles, computes the ground-truth gradient of
//! the forward launch(es) with `tilegrad_ad::vjp` (in f64), runs the correct backward on the
//! reference interpreter plus its host steps in plain Rust, and requires every gradient element to
//! satisfy `|got - exp| <= 1e-4 |exp| + 1e-5 max|exp|`. Every broken variant must fail as the
//! last column of the table of broken variants below says (the test reads that table): the
//! reference run stops with `ExecError::OutOfBounds` or `ExecError::Race` at the given line, or the
//! run succeeds and some gradient element is NaN (never written: buffers allocated "empty" are
//! filled with NaN) or more than 10x over that tolerance. `broken_variants_differ_in_one_marked_line`
//! checks that each broken variant differs from its correct kernel in exactly one line of the body,
//! the line marked `# BUG:` and given in the table, so that a checker can be held to blaming it.
//!
//! # Backward launches
//!
//! Tensors are contiguous row-major; a stride is `stride(t, d)` in elements. Cotangents are named
//! `grad_<output>`; `empty` buffers are NaN-filled, `zeros` zero-filled. Grid axes are listed
//! `(g0, g1)`. Constexprs are the same in forward and backward unless given.
//!
//! | forward (file, test sizes) | backward (file) | grid | allocations, host steps |
//! | --- | --- | --- | --- |
//! | `vector_add` (vector_add.py): x, y [n] -> out; n = 1000, BLOCK = 128 | `vector_add_bwd` (vector_add_bwd.py) | `cdiv(n, BLOCK)` | grad_x, grad_y empty [n] |
//! | `copy` (copy.py): src [n] -> dst; n = 777, BLOCK = 64 | `copy_bwd` (copy_bwd.py) | `cdiv(n, BLOCK)` | grad_src empty [n] |
//! | `rgb_to_grey` (grey.py): img [H, W, 3] -> grey [H, W]; H = 53, W = 37, BLOCK_H = 16, BLOCK_W = 32 | `rgb_to_grey_bwd` (grey_bwd.py) | `(cdiv(H, BLOCK_H), cdiv(W, BLOCK_W))` | grad_img empty [H, W, 3] |
//! | `weighted_sum_fwd` (weighted_sum.py): x [ROWS, D], w [D] -> output [ROWS]; ROWS = 45, D = 300, ROWS_TILE_SIZE = 16, D_TILE_SIZE = 64 | `weighted_sum_bwd` (weighted_sum_bwd.py) | `cdiv(ROWS, ROWS_TILE_SIZE)` | grad_x empty [ROWS, D], partial_grad_w empty [cdiv(ROWS, ROWS_TILE_SIZE), D]; grad_w = partial_grad_w.sum(axis 0) |
//! | `weighted_sum_fwd` (weighted_sum_desc.py, tensor descriptors): as above | `weighted_sum_desc_bwd` (weighted_sum_desc_bwd.py) | as above | as above |
//! | `matmul` (matmul.py): a [M, K], b [K, N] -> c [M, N]; M = 45, N = 37, K = 70, BLOCK_M = BLOCK_N = 16, BLOCK_K = 32 | two launches: `matmul_bwd_da` then `matmul_bwd_db` (matmul_bwd.py) | da: `(cdiv(M, BLOCK_M), cdiv(K, BLOCK_K))`; db: `(cdiv(K, BLOCK_K), cdiv(N, BLOCK_N))` | grad_a empty [M, K], grad_b empty [K, N] |
//! | `l2_norm_partial` then `l2_norm_finish` (l2_norm.py): x [n] -> partial [cdiv(n, 128)] -> out [1]; n = 1234, BLOCK = 128 then 4 | `l2_norm_bwd` (l2_norm_bwd.py), BLOCK = 128, reads the saved out | `cdiv(n, BLOCK)` | grad_x empty [n] |
//! | `atomic_sum` (atomic_sum.py): x [n] -> out [1] (zeros); n = 999, BLOCK = 64 | `atomic_sum_bwd` (atomic_sum_bwd.py) | `cdiv(n, BLOCK)` | grad_x empty [n] |
//! | `softmax` (softmax.py): x [rows, cols] -> y; rows = 29, cols = 50, BLOCK_ROWS = 4, BLOCK_COLS = 64 | `softmax_bwd` (softmax_bwd.py), reads the saved y | `cdiv(rows, BLOCK_ROWS)` | grad_x empty [rows, cols] |
//! | `layer_norm_rows` (layer_norm.py): x [rows, cols], w, b [cols] -> y; rows = 37, cols = 300, BLOCK_M = 8, BLOCK_N = 512, eps = 1e-5 (f32) | `layer_norm_rows_bwd` (layer_norm_bwd.py), recomputes mean and rstd | `cdiv(rows, BLOCK_M)` | grad_x empty [rows, cols]; grad_w, grad_b zeros [cols] (atomic_add) |
//! | `layer_norm_fwd` (layer_norm.py): x [rows, N], w, b [N] -> y, mean, rstd [rows] (only y has a cotangent); rows = 37, N = 300, BLOCK_SIZE = 128, eps = 1e-5 (f32) | `layer_norm_bwd` (layer_norm_bwd.py), reads the saved mean and rstd | `rows` | grad_x empty [rows, N], partial_grad_w, partial_grad_b empty [rows, N]; grad_w = partial_grad_w.sum(axis 0), grad_b = partial_grad_b.sum(axis 0) |
//! | `attn_fwd` (flash_attention.py): q, k, v [N_CTX, HEAD_DIM] -> o; N_CTX = 100, HEAD_DIM = 32, BLOCK_M = 32, BLOCK_N = 16, sm_scale = 0.7 (f32) | `attn_bwd` (flash_attention_bwd.py), reads the saved o | `cdiv(N_CTX, BLOCK_M)` | grad_q empty [N_CTX, HEAD_DIM]; grad_k, grad_v zeros [N_CTX, HEAD_DIM] (atomic_add) |
//!
//! Arguments (parameter = tensor, or scalar expression):
//!
//! - `vector_add_bwd`: grad_out_ptr = grad_out, grad_x_ptr = grad_x, grad_y_ptr = grad_y, n = n.
//! - `copy_bwd`: grad_dst_ptr = grad_dst, grad_src_ptr = grad_src, n = n.
//! - `rgb_to_grey_bwd`: grad_grey_ptr = grad_grey, grad_img_ptr = grad_img, H, W, stride_ih =
//!   stride(grad_img, 0) = 3 W, stride_iw = stride(grad_img, 1) = 3, stride_ic = stride(grad_img,
//!   2) = 1, stride_gh = stride(grad_grey, 0) = W, stride_gw = stride(grad_grey, 1) = 1.
//! - `weighted_sum_bwd`: x_ptr = x, weight_ptr = w, grad_output_ptr = grad_output, grad_x_ptr =
//!   grad_x, partial_grad_weight_ptr = partial_grad_w, stride_xr = D, stride_xd = 1, stride_wd = 1,
//!   stride_gr = 1, stride_gxr = D, stride_gxd = 1, stride_gwb = D, stride_gwd = 1, NUM_ROWS = ROWS,
//!   D = D.
//! - `weighted_sum_desc_bwd`: the same parameters and arguments as `weighted_sum_bwd`.
//! - `matmul_bwd_da`: b_ptr = b, grad_c_ptr = grad_c, grad_a_ptr = grad_a, M, N, K, stride_bk = N,
//!   stride_bn = 1, stride_gcm = N, stride_gcn = 1, stride_gam = K, stride_gak = 1.
//! - `matmul_bwd_db`: a_ptr = a, grad_c_ptr = grad_c, grad_b_ptr = grad_b, M, N, K, stride_am = K,
//!   stride_ak = 1, stride_gcm = N, stride_gcn = 1, stride_gbk = N, stride_gbn = 1.
//! - `l2_norm_bwd`: x_ptr = x, out_ptr = out (saved forward output), grad_out_ptr = grad_out,
//!   grad_x_ptr = grad_x, n = n.
//! - `atomic_sum_bwd`: grad_out_ptr = grad_out, grad_x_ptr = grad_x, n = n.
//! - `softmax_bwd`: y_ptr = y (saved), grad_y_ptr = grad_y, grad_x_ptr = grad_x, y_row_stride =
//!   grad_y_row_stride = grad_x_row_stride = cols, n_rows = rows, n_cols = cols.
//! - `layer_norm_rows_bwd`: x_ptr = x, w_ptr = w, grad_y_ptr = grad_y, grad_x_ptr = grad_x,
//!   grad_w_ptr = grad_w, grad_b_ptr = grad_b, n_rows = rows, n_cols = cols, x_row_stride =
//!   grad_y_row_stride = grad_x_row_stride = cols, eps = 1e-5 (f32).
//! - `layer_norm_bwd`: x_ptr = x, w_ptr = w, mean_ptr = mean (saved), rstd_ptr = rstd (saved),
//!   grad_y_ptr = grad_y, grad_x_ptr = grad_x, partial_grad_w_ptr = partial_grad_w,
//!   partial_grad_b_ptr = partial_grad_b, stride = N, N = N.
//! - `attn_bwd`: q_ptr = q, k_ptr = k, v_ptr = v, o_ptr = o (saved), grad_o_ptr = grad_o, grad_q_ptr
//!   = grad_q, grad_k_ptr = grad_k, grad_v_ptr = grad_v, sm_scale = 0.7 (f32), stride_qm =
//!   stride_kn = stride_vn = stride_om = HEAD_DIM, stride_qd = stride_kd = stride_vd = stride_od =
//!   1 (grad_q, grad_k, grad_v and grad_o use the strides of q, k, v and o), N_CTX.
//!
//! # Broken variants
//!
//! Each replaces the correct kernel of its name prefix (for matmul, the other launch stays
//! correct); the bug is the one line marked `# BUG:`, at the line given (in the file of its
//! backward). Outcome (what the test requires): `OOB at L` = `ExecError::OutOfBounds` reported at
//! line L of the same file, `race at L` = `ExecError::Race` whose second access is at line L (the
//! reported line is the access, which differs from the bug line when the bug is in a mask or a
//! pointer set up earlier), `wrong` = all gradients finite, some element off by more than 10x the
//! tolerance, `NaN` = some element never written.
//!
//! | variant | line | bug class | what is wrong | outcome |
//! | --- | --- | --- | --- | --- |
//! | `vector_add_bwd_broken_mask` | 25 | missing boundary mask | load of grad_out without mask | OOB at 25 |
//! | `vector_add_bwd_broken_off_by_one` | 34 | wrong boundary mask | `offs < n - 1`: last element unwritten | NaN |
//! | `vector_add_bwd_broken_tile_start` | 43 | wrong index (tile start) | `pid + arange` without `* BLOCK`: programs overlap, storing the same values (not a race); most elements are never written | NaN |
//! | `copy_bwd_broken_mask` | 25 | missing boundary mask | store of grad_src without mask | OOB at 25 |
//! | `copy_bwd_broken_shift` | 33 | wrong index | grad_dst read at `offs + 1` | wrong |
//! | `copy_bwd_broken_accumulate` | 42 | accumulates into an unzeroed buffer | adds the initial grad_src (allocated empty) | NaN |
//! | `rgb_to_grey_bwd_broken_transpose` | 38 | transposed index | grad_grey strides swapped | wrong |
//! | `rgb_to_grey_bwd_broken_channel_stride` | 57 | wrong stride | blue channel at `2 * stride_iw` instead of `2 * stride_ic` | OOB at 57 |
//! | `rgb_to_grey_bwd_broken_col_mask` | 67 | missing boundary mask | mask on rows only | OOB at 68 |
//! | `weighted_sum_bwd_broken_partial_row` | 93 | partial buffer overwritten instead of one row per program | partial block pointer at row 0 | race at 102 |
//! | `weighted_sum_bwd_broken_no_advance` | 154 | forgotten accumulation across tiles | partial block pointer not advanced over D | NaN |
//! | `weighted_sum_bwd_broken_boundary` | 195 | missing boundary check | grad_x store checks dim 0 only | OOB at 195 |
//! | `weighted_sum_desc_bwd_broken_partial_row` | 78 | partial buffer overwritten instead of one row per program | partial stored at row 0 | race at 78 |
//! | `weighted_sum_desc_bwd_broken_tile_offset` | 108 | wrong index (tile start) | column offset `i`, not `i * D_TILE_SIZE` | NaN |
//! | `weighted_sum_desc_bwd_broken_stride` | 134 | wrong stride | grad_output descriptor with x's row stride | OOB at 140 |
//! | `matmul_bwd_da_broken_transpose` | 65 | transposed index | b read with its strides swapped | wrong |
//! | `matmul_bwd_da_broken_accumulate` | 86 | forgotten accumulation across tiles | `tl.dot` without the accumulator | wrong |
//! | `matmul_bwd_db_broken_mask` | 102 | missing boundary mask | a^T tile not masked on M | OOB at 103 |
//! | `l2_norm_bwd_broken_scale` | 30 | dropped scale factor | `1 / norm` dropped | wrong |
//! | `l2_norm_bwd_broken_factor_two` | 41 | dropped scale factor | the 1/2 of the square root's derivative dropped | wrong |
//! | `l2_norm_bwd_broken_norm_index` | 50 | wrong index | scalar norm read at `out_ptr + pid` | OOB at 50 |
//! | `atomic_sum_bwd_broken_mask` | 25 | missing boundary mask | store of grad_x without mask | OOB at 25 |
//! | `atomic_sum_bwd_broken_mean` | 33 | extra scale factor | cotangent divided by n | wrong |
//! | `atomic_sum_bwd_broken_block_mask` | 41 | wrong boundary mask | `offs < BLOCK`: only program 0 writes | NaN |
//! | `softmax_bwd_broken_row_mask` | 29 | missing boundary mask | row bound `n_rows + BLOCK_ROWS` | OOB at 30 |
//! | `softmax_bwd_broken_axis` | 45 | transposed reduction | `sum(grad_y * y)` over axis 0 | wrong |
//! | `softmax_bwd_broken_no_dot` | 59 | dropped term | `y * grad_y` only | wrong |
//! | `softmax_bwd_broken_row_step` | 66 | grid stride error | rows two apart: the odd rows never written | NaN |
//! | `layer_norm_rows_bwd_broken_race` | 66 | race (shared accumulator without atomics) | load-add-store of grad_w | race at 66 |
//! | `layer_norm_rows_bwd_broken_mean_scale` | 88 | dropped scale factor | `1 / n_cols` of c2 dropped | wrong |
//! | `layer_norm_rows_bwd_broken_var_mask` | 105 | missing mask in a reduction | padded columns enter the variance | wrong |
//! | `layer_norm_bwd_broken_accumulate` | 178 | forgotten accumulation across tiles | `_c1 =` instead of `_c1 +=` | wrong |
//! | `layer_norm_bwd_broken_partial_row` | 230 | partial buffer overwritten instead of one row per program | partial_grad_w stored at row 0 | race at 230 |
//! | `layer_norm_bwd_broken_mask` | 261 | missing boundary mask | x loaded without mask in the last column block | OOB at 261 |
//! | `layer_norm_bwd_broken_no_tail` | 296 | masked tail never stored | the columns past the last full block left unwritten | NaN |
//! | `attn_bwd_broken_sm_scale` | 108 | dropped scale factor | grad_q stored without `* sm_scale` | wrong |
//! | `attn_bwd_broken_key_mask` | 134 | wrong boundary mask | key mask on the tile-local index: padded keys in the softmax denominator | wrong |
//! | `attn_bwd_broken_race` | 196 | race (shared accumulator without atomics) | load-add-store of grad_v | race at 196 |
//! | `attn_bwd_broken_dq_accumulate` | 246 | forgotten accumulation across tiles | `tl.dot` for grad_q without the accumulator | wrong |

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tilegrad_ad::{vjp, GradOptions};
use tilegrad_ir::triton::{convert, ConvertOptions};
use tilegrad_ir::{DType, Kernel};
use tilegrad_reference::{ExecError, HostTensor, Launch, Memory, TensorId};

// ---------------------------------------------------------------- shared helpers

/// One gradient per differentiable input, in f64.
type Grads = Vec<Vec<f64>>;

/// Converts `name` of `examples/triton/{file}` with these constexprs and f32 scalars (f32
/// pointers, i32 for every other scalar).
fn kernel(file: &str, name: &str, consts: &[(&str, i64)], f32_scalars: &[&str]) -> Kernel {
    let path = format!("{}/examples/triton/{file}", env!("CARGO_MANIFEST_DIR"));
    let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut opts = ConvertOptions::with_constexprs(consts);
    opts.scalar_dtypes = f32_scalars.iter().map(|s| (s.to_string(), DType::F32)).collect();
    convert(&src, &path, name, &opts).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// `n` random values with magnitudes in [0.25, 1) and random signs: never zero.
fn nonzero(r: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| r.gen_range(0.25f32..1.0) * if r.gen::<bool>() { 1.0 } else { -1.0 }).collect()
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn cdiv(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

/// A gradient buffer allocated "empty": poisoned with NaN, so that an element no program writes
/// shows up.
fn empty(shape: &[usize]) -> HostTensor {
    HostTensor::from_f32(shape, vec![f32::NAN; shape.iter().product()])
}

fn zeros(shape: &[usize]) -> HostTensor {
    HostTensor::zeros(DType::F32, shape)
}

/// Host step: the sum over axis 0 of a `[rows, cols]` buffer.
fn sum_rows(t: &HostTensor) -> Vec<f64> {
    let (rows, cols) = (t.shape()[0], t.shape()[1]);
    let v = t.to_f64_vec();
    (0..cols).map(|c| (0..rows).map(|r| v[r * cols + c]).sum()).collect()
}

/// Ground truth: `tilegrad_ad::vjp` of one launch for cotangents of its outputs.
fn truth(launch: &Launch, mem: &Memory, inputs: &[TensorId], outputs: &[(TensorId, &[f32])]) -> Grads {
    let outs: Vec<(TensorId, Vec<f64>)> = outputs.iter().map(|(t, c)| (*t, f64s(c))).collect();
    let g = vjp(launch, mem, inputs, &outs, &GradOptions::default()).unwrap_or_else(|e| panic!("{}: {e}", launch.kernel().name));
    g.inputs
}

/// How a deliberately broken backward must fail: the last column of the table of broken variants
/// in this file's documentation.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Outcome {
    /// `OOB at L`: the reference run fails with [`ExecError::OutOfBounds`] at line `L` of the
    /// backward's file, in the broken kernel.
    OutOfBounds(u32),
    /// `race at L`: the reference run fails with [`ExecError::Race`] whose second access is at
    /// line `L`, in the broken kernel.
    Race(u32),
    /// `wrong`: the run succeeds, every gradient element is finite, and some element is off by
    /// more than 10x the tolerance.
    Wrong,
    /// `NaN`: the run succeeds and some gradient element is NaN (never written).
    NaN,
}

/// One row of the table of broken variants in this file's documentation.
struct Row {
    name: String,
    /// Line of the bug in the backward's file.
    line: usize,
    outcome: Outcome,
}

/// The table of broken variants in this file's documentation.
fn table() -> Vec<Row> {
    let rows = include_str!("triton_bwd.rs").lines().filter_map(|l| {
        let cells: Vec<&str> = l.strip_prefix("//! | `")?.split('|').map(str::trim).collect();
        let name = cells[0].trim_end_matches('`');
        if !name.contains("_broken_") {
            return None;
        }
        let at = |s: &str| s.parse::<u32>().unwrap_or_else(|_| panic!("{name}: bad line in `{}`", cells[4]));
        let outcome = match cells[4].split_once(" at ") {
            Some(("OOB", l)) => Outcome::OutOfBounds(at(l)),
            Some(("race", l)) => Outcome::Race(at(l)),
            _ if cells[4] == "wrong" => Outcome::Wrong,
            _ if cells[4] == "NaN" => Outcome::NaN,
            _ => panic!("{name}: unknown outcome `{}`", cells[4]),
        };
        Some(Row { name: name.to_string(), line: cells[1].parse().unwrap(), outcome })
    });
    rows.collect()
}

/// The worst element of `got` against `expected`: `(ratio, index)` where ratio is
/// `|got - exp| / (1e-4 |exp| + 1e-5 max|exp|)` (infinite for a non-finite `got`): at most 1 is
/// within f32 tolerance.
fn worst(got: &[f64], expected: &[f64]) -> (f64, usize) {
    assert_eq!(got.len(), expected.len(), "gradient length");
    let scale = expected.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let mut w = (0.0, 0);
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        let r = if g.is_finite() { (g - e).abs() / (1e-4 * e.abs() + 1e-5 * scale) } else { f64::INFINITY };
        if r > w.0 {
            w = (r, i);
        }
    }
    w
}

/// Runs the correct backward `correct` and each broken variant through `run` (which converts the
/// named kernel(s), allocates, launches on the reference interpreter, does the host steps and
/// returns one gradient per input, in the order of `names`), and checks them against `truth`.
fn verify(names: &[&str], truth: &Grads, run: impl Fn(&str) -> Result<Grads, ExecError>, correct: &str, broken: &[&str]) {
    assert_eq!(truth.len(), names.len());
    for (n, t) in names.iter().zip(truth) {
        assert!(t.iter().all(|x| x.is_finite()) && t.iter().any(|&x| x != 0.0), "{correct}: ground truth of {n} is zero or not finite");
    }
    let got = run(correct).unwrap_or_else(|e| panic!("{correct}: {e}"));
    assert_eq!(got.len(), names.len(), "{correct}: number of gradients");
    for ((n, g), t) in names.iter().zip(&got).zip(truth) {
        let (r, i) = worst(g, t);
        assert!(r <= 1.0, "{correct}: {n}[{i}] = {} but the ground truth is {} ({r:.1} x the tolerance)", g[i], t[i]);
        eprintln!("{correct}: {n} within {r:.3} x the tolerance");
    }
    let table = table();
    for &b in broken {
        let row = table.iter().find(|r| r.name == b).unwrap_or_else(|| panic!("{b} is not in the table of broken variants"));
        match (run(b), row.outcome) {
            (Err(e @ ExecError::OutOfBounds { .. }), Outcome::OutOfBounds(line)) => {
                let ExecError::OutOfBounds { site, .. } = &e else { unreachable!() };
                assert!(site.kernel == b && site.loc.line == line, "{b}: expected out of bounds at line {line}, got {e}");
                eprintln!("{b}: fails as expected: {e}");
            }
            (Err(ExecError::Race(race)), Outcome::Race(line)) => {
                let s = &race.second;
                assert!(s.kernel == b && s.loc.line == line, "{b}: expected a race at line {line}, got {race}");
                eprintln!("{b}: fails as expected: {race}");
            }
            (Ok(got), outcome @ (Outcome::Wrong | Outcome::NaN)) => {
                let r: Vec<(f64, usize)> = got.iter().zip(truth).map(|(g, t)| worst(g, t)).collect();
                let (k, &(ratio, i)) = r.iter().enumerate().max_by(|a, b| a.1 .0.total_cmp(&b.1 .0)).unwrap();
                let nan = got.iter().flatten().any(|x| !x.is_finite());
                assert_eq!(nan, outcome == Outcome::NaN, "{b}: expected {outcome:?}, got {}[{i}] = {}", names[k], got[k][i]);
                assert!(ratio > 10.0, "{b}: expected a wrong gradient, but every gradient is within {ratio:.2} x the tolerance");
                eprintln!(
                    "{b}: {outcome:?} as expected: {}[{i}] = {} vs {} ({ratio:.3e} x the tolerance)",
                    names[k], got[k][i], truth[k][i]
                );
            }
            (Ok(_), o) => panic!("{b}: expected {o:?}, but the backward ran"),
            (Err(err), o) => panic!("{b}: expected {o:?}, got {err}"),
        }
    }
}

/// The body (the lines after the signature, up to the next decorator) of `@triton.jit def name`
/// in `src`, with the 1-based line number of its first line.
fn body<'s>(src: &'s str, name: &str) -> (usize, Vec<&'s str>) {
    let lines: Vec<&str> = src.lines().collect();
    let def = lines.iter().position(|l| l.starts_with(&format!("def {name}("))).unwrap_or_else(|| panic!("no kernel {name}"));
    let start = def + lines[def..].iter().position(|l| l.trim_end().ends_with("):")).unwrap() + 1;
    let end = start + lines[start..].iter().position(|l| l.starts_with('@')).unwrap_or(lines.len() - start);
    let mut b = lines[start..end].to_vec();
    while b.last().is_some_and(|l| l.trim().is_empty()) {
        b.pop();
    }
    (start + 1, b)
}

/// Every broken variant differs from its correct kernel (the name before `_broken_`) in exactly
/// one line of the body, and that line carries a `# BUG:` comment: a checker that blames a line
/// can be held to it. Returns `(variant, line number)` for each.
fn bug_lines(file: &str) -> Vec<(String, usize)> {
    let path = format!("{}/examples/triton/{file}", env!("CARGO_MANIFEST_DIR"));
    let src = std::fs::read_to_string(&path).unwrap();
    let names: Vec<&str> = src.lines().filter_map(|l| l.strip_prefix("def ")?.split('(').next()).collect();
    let mut out = Vec::new();
    for name in names.iter().filter(|n| n.contains("_broken_")) {
        let correct = &name[..name.find("_broken_").unwrap()];
        let ((_, good), (first, bad)) = (body(&src, correct), body(&src, name));
        assert_eq!(good.len(), bad.len(), "{name}: not the same number of lines as {correct}");
        let diff: Vec<usize> = (0..good.len()).filter(|&i| good[i] != bad[i]).collect();
        assert_eq!(diff.len(), 1, "{name}: differs from {correct} in lines {diff:?} of the body");
        assert!(bad[diff[0]].contains("# BUG: "), "{name}: the differing line has no `# BUG: ` comment: {}", bad[diff[0]]);
        let without = bad[diff[0]].split("  # BUG: ").next().unwrap();
        assert_ne!(without.trim_end(), good[diff[0]].trim_end(), "{name}: only the comment differs");
        out.push((name.to_string(), first + diff[0]));
    }
    out
}

#[test]
fn broken_variants_differ_in_one_marked_line() {
    let files = [
        "vector_add_bwd.py",
        "copy_bwd.py",
        "grey_bwd.py",
        "weighted_sum_bwd.py",
        "weighted_sum_desc_bwd.py",
        "matmul_bwd.py",
        "l2_norm_bwd.py",
        "atomic_sum_bwd.py",
        "softmax_bwd.py",
        "layer_norm_bwd.py",
        "flash_attention_bwd.py",
    ];
    let table: Vec<(String, usize)> = table().into_iter().map(|r| (r.name, r.line)).collect();
    let mut found = Vec::new();
    for f in files {
        let lines = bug_lines(f);
        assert!(lines.len() >= 3, "{f}: {} broken variants", lines.len());
        for (name, line) in &lines {
            eprintln!("{f}:{line}: {name}");
        }
        found.extend(lines);
    }
    assert_eq!(found, table, "the table of broken variants in the documentation is out of date");
}

// ---------------------------------------------------------------- elementwise

#[test]
fn vector_add_bwd() {
    let (n, block) = (1000, 128);
    let mut r = StdRng::seed_from_u64(1);
    let (x, y, cot) = (nonzero(&mut r, n), nonzero(&mut r, n), nonzero(&mut r, n));
    let fwd = kernel("vector_add.py", "vector_add", &[("BLOCK", block as i64)], &[]);
    let mut mem = Memory::new();
    let (xi, yi) = (mem.add("x", HostTensor::from_f32(&[n], x)), mem.add("y", HostTensor::from_f32(&[n], y)));
    let out = mem.add("out", zeros(&[n]));
    let l = Launch::new(&fwd, cdiv(n, block)).arg("x_ptr", xi).arg("y_ptr", yi).arg("out_ptr", out).arg("n", n);
    let t = truth(&l, &mem, &[xi, yi], &[(out, &cot[..])]);
    let run = |name: &str| -> Result<Grads, ExecError> {
        let k = kernel("vector_add_bwd.py", name, &[("BLOCK", block as i64)], &[]);
        let mut m = Memory::new();
        let g = m.add("grad_out", HostTensor::from_f32(&[n], cot.clone()));
        let (gx, gy) = (m.add("grad_x", empty(&[n])), m.add("grad_y", empty(&[n])));
        Launch::new(&k, cdiv(n, block)).arg("grad_out_ptr", g).arg("grad_x_ptr", gx).arg("grad_y_ptr", gy).arg("n", n).run(&mut m)?;
        Ok(vec![m.get(gx).to_f64_vec(), m.get(gy).to_f64_vec()])
    };
    verify(
        &["grad_x", "grad_y"],
        &t,
        run,
        "vector_add_bwd",
        &["vector_add_bwd_broken_mask", "vector_add_bwd_broken_off_by_one", "vector_add_bwd_broken_tile_start"],
    );
}

#[test]
fn copy_bwd() {
    let (n, block) = (777, 64);
    let mut r = StdRng::seed_from_u64(2);
    let (x, cot) = (nonzero(&mut r, n), nonzero(&mut r, n));
    let fwd = kernel("copy.py", "copy", &[("BLOCK", block as i64)], &[]);
    let mut mem = Memory::new();
    let src = mem.add("src", HostTensor::from_f32(&[n], x));
    let dst = mem.add("dst", zeros(&[n]));
    let l = Launch::new(&fwd, cdiv(n, block)).arg("src_ptr", src).arg("dst_ptr", dst).arg("n", n);
    let t = truth(&l, &mem, &[src], &[(dst, &cot[..])]);
    let run = |name: &str| -> Result<Grads, ExecError> {
        let k = kernel("copy_bwd.py", name, &[("BLOCK", block as i64)], &[]);
        let mut m = Memory::new();
        let g = m.add("grad_dst", HostTensor::from_f32(&[n], cot.clone()));
        let gs = m.add("grad_src", empty(&[n]));
        Launch::new(&k, cdiv(n, block)).arg("grad_dst_ptr", g).arg("grad_src_ptr", gs).arg("n", n).run(&mut m)?;
        Ok(vec![m.get(gs).to_f64_vec()])
    };
    verify(&["grad_src"], &t, run, "copy_bwd", &["copy_bwd_broken_mask", "copy_bwd_broken_shift", "copy_bwd_broken_accumulate"]);
}

#[test]
fn rgb_to_grey_bwd() {
    let (h, w, bh, bw) = (53, 37, 16, 32);
    let consts = [("BLOCK_H", bh as i64), ("BLOCK_W", bw as i64)];
    let mut r = StdRng::seed_from_u64(3);
    let (img, cot) = (nonzero(&mut r, h * w * 3), nonzero(&mut r, h * w));
    let fwd = kernel("grey.py", "rgb_to_grey", &consts, &[]);
    let mut mem = Memory::new();
    let ii = mem.add("img", HostTensor::from_f32(&[h, w, 3], img));
    let gi = mem.add("grey", zeros(&[h, w]));
    let (ti, tg) = (mem.get(ii).strides(), mem.get(gi).strides());
    let l = Launch::new(&fwd, (cdiv(h, bh) as u32, cdiv(w, bw) as u32))
        .arg("img_ptr", ii)
        .arg("grey_ptr", gi)
        .arg("H", h)
        .arg("W", w)
        .arg("stride_ih", ti[0])
        .arg("stride_iw", ti[1])
        .arg("stride_ic", ti[2])
        .arg("stride_gh", tg[0])
        .arg("stride_gw", tg[1]);
    let t = truth(&l, &mem, &[ii], &[(gi, &cot[..])]);
    let run = |name: &str| -> Result<Grads, ExecError> {
        let k = kernel("grey_bwd.py", name, &consts, &[]);
        let mut m = Memory::new();
        let g = m.add("grad_grey", HostTensor::from_f32(&[h, w], cot.clone()));
        let gimg = m.add("grad_img", empty(&[h, w, 3]));
        let (ti, tg) = (m.get(gimg).strides(), m.get(g).strides());
        Launch::new(&k, (cdiv(h, bh) as u32, cdiv(w, bw) as u32))
            .arg("grad_grey_ptr", g)
            .arg("grad_img_ptr", gimg)
            .arg("H", h)
            .arg("W", w)
            .arg("stride_ih", ti[0])
            .arg("stride_iw", ti[1])
            .arg("stride_ic", ti[2])
            .arg("stride_gh", tg[0])
            .arg("stride_gw", tg[1])
            .run(&mut m)?;
        Ok(vec![m.get(gimg).to_f64_vec()])
    };
    verify(
        &["grad_img"],
        &t,
        run,
        "rgb_to_grey_bwd",
        &["rgb_to_grey_bwd_broken_transpose", "rgb_to_grey_bwd_broken_channel_stride", "rgb_to_grey_bwd_broken_col_mask"],
    );
}

// ---------------------------------------------------------------- block pointers, dot

/// The weighted sum with block pointers or tensor descriptors: forward `weighted_sum_fwd` of
/// `fwd_file`, backward `correct` of `bwd_file` (same parameters in both versions).
fn weighted_sum_case(fwd_file: &str, bwd_file: &str, correct: &str, broken: &[&str]) {
    let (rows, d, rt, dt) = (45, 300, 16, 64);
    let consts = [("ROWS_TILE_SIZE", rt as i64), ("D_TILE_SIZE", dt as i64)];
    let mut r = StdRng::seed_from_u64(4);
    let (x, w, cot) = (nonzero(&mut r, rows * d), nonzero(&mut r, d), nonzero(&mut r, rows));
    let fwd = kernel(fwd_file, "weighted_sum_fwd", &consts, &[]);
    let mut mem = Memory::new();
    let xi = mem.add("x", HostTensor::from_f32(&[rows, d], x.clone()));
    let wi = mem.add("w", HostTensor::from_f32(&[d], w.clone()));
    let out = mem.add("output", zeros(&[rows]));
    let l = Launch::new(&fwd, cdiv(rows, rt))
        .arg("x_ptr", xi)
        .arg("weight_ptr", wi)
        .arg("output_ptr", out)
        .arg("x_stride_row", d)
        .arg("x_stride_dim", 1)
        .arg("weight_stride_dim", 1)
        .arg("output_stride_row", 1)
        .arg("ROWS", rows)
        .arg("D", d);
    let t = truth(&l, &mem, &[xi, wi], &[(out, &cot[..])]);
    let run = |name: &str| -> Result<Grads, ExecError> {
        let k = kernel(bwd_file, name, &consts, &[]);
        let mut m = Memory::new();
        let xi = m.add("x", HostTensor::from_f32(&[rows, d], x.clone()));
        let wi = m.add("w", HostTensor::from_f32(&[d], w.clone()));
        let g = m.add("grad_output", HostTensor::from_f32(&[rows], cot.clone()));
        let gx = m.add("grad_x", empty(&[rows, d]));
        let pw = m.add("partial_grad_w", empty(&[cdiv(rows, rt), d]));
        Launch::new(&k, cdiv(rows, rt))
            .arg("x_ptr", xi)
            .arg("weight_ptr", wi)
            .arg("grad_output_ptr", g)
            .arg("grad_x_ptr", gx)
            .arg("partial_grad_weight_ptr", pw)
            .arg("stride_xr", d)
            .arg("stride_xd", 1)
            .arg("stride_wd", 1)
            .arg("stride_gr", 1)
            .arg("stride_gxr", d)
            .arg("stride_gxd", 1)
            .arg("stride_gwb", d)
            .arg("stride_gwd", 1)
            .arg("NUM_ROWS", rows)
            .arg("D", d)
            .run(&mut m)?;
        Ok(vec![m.get(gx).to_f64_vec(), sum_rows(m.get(pw))])
    };
    verify(&["grad_x", "grad_w"], &t, run, correct, broken);
}

#[test]
fn weighted_sum_bwd() {
    weighted_sum_case(
        "weighted_sum.py",
        "weighted_sum_bwd.py",
        "weighted_sum_bwd",
        &["weighted_sum_bwd_broken_partial_row", "weighted_sum_bwd_broken_no_advance", "weighted_sum_bwd_broken_boundary"],
    );
}

#[test]
fn weighted_sum_desc_bwd() {
    weighted_sum_case(
        "weighted_sum_desc.py",
        "weighted_sum_desc_bwd.py",
        "weighted_sum_desc_bwd",
        &["weighted_sum_desc_bwd_broken_partial_row", "weighted_sum_desc_bwd_broken_tile_offset", "weighted_sum_desc_bwd_broken_stride"],
    );
}

#[test]
fn matmul_bwd() {
    let (mm, nn, kk) = (45, 37, 70);
    let (bm, bn, bk) = (16, 16, 32);
    let consts = [("BLOCK_M", bm as i64), ("BLOCK_N", bn as i64), ("BLOCK_K", bk as i64)];
    let mut r = StdRng::seed_from_u64(5);
    let (a, b, cot) = (nonzero(&mut r, mm * kk), nonzero(&mut r, kk * nn), nonzero(&mut r, mm * nn));
    let fwd = kernel("matmul.py", "matmul", &consts, &[]);
    let mut mem = Memory::new();
    let ai = mem.add("a", HostTensor::from_f32(&[mm, kk], a.clone()));
    let bi = mem.add("b", HostTensor::from_f32(&[kk, nn], b.clone()));
    let c = mem.add("c", zeros(&[mm, nn]));
    let l = Launch::new(&fwd, (cdiv(mm, bm) as u32, cdiv(nn, bn) as u32))
        .arg("a_ptr", ai)
        .arg("b_ptr", bi)
        .arg("c_ptr", c)
        .arg("M", mm)
        .arg("N", nn)
        .arg("K", kk)
        .arg("stride_am", kk)
        .arg("stride_ak", 1)
        .arg("stride_bk", nn)
        .arg("stride_bn", 1)
        .arg("stride_cm", nn)
        .arg("stride_cn", 1);
    let t = truth(&l, &mem, &[ai, bi], &[(c, &cot[..])]);
    // A variant names the kernel it replaces; the other launch is the correct one.
    let run = |name: &str| -> Result<Grads, ExecError> {
        let (da_name, db_name) = if name.starts_with("matmul_bwd_db") { ("matmul_bwd_da", name) } else { (name, "matmul_bwd_db") };
        let (da, db) = (kernel("matmul_bwd.py", da_name, &consts, &[]), kernel("matmul_bwd.py", db_name, &consts, &[]));
        let mut m = Memory::new();
        let ai = m.add("a", HostTensor::from_f32(&[mm, kk], a.clone()));
        let bi = m.add("b", HostTensor::from_f32(&[kk, nn], b.clone()));
        let g = m.add("grad_c", HostTensor::from_f32(&[mm, nn], cot.clone()));
        let (ga, gb) = (m.add("grad_a", empty(&[mm, kk])), m.add("grad_b", empty(&[kk, nn])));
        Launch::new(&da, (cdiv(mm, bm) as u32, cdiv(kk, bk) as u32))
            .arg("b_ptr", bi)
            .arg("grad_c_ptr", g)
            .arg("grad_a_ptr", ga)
            .arg("M", mm)
            .arg("N", nn)
            .arg("K", kk)
            .arg("stride_bk", nn)
            .arg("stride_bn", 1)
            .arg("stride_gcm", nn)
            .arg("stride_gcn", 1)
            .arg("stride_gam", kk)
            .arg("stride_gak", 1)
            .run(&mut m)?;
        Launch::new(&db, (cdiv(kk, bk) as u32, cdiv(nn, bn) as u32))
            .arg("a_ptr", ai)
            .arg("grad_c_ptr", g)
            .arg("grad_b_ptr", gb)
            .arg("M", mm)
            .arg("N", nn)
            .arg("K", kk)
            .arg("stride_am", kk)
            .arg("stride_ak", 1)
            .arg("stride_gcm", nn)
            .arg("stride_gcn", 1)
            .arg("stride_gbk", nn)
            .arg("stride_gbn", 1)
            .run(&mut m)?;
        Ok(vec![m.get(ga).to_f64_vec(), m.get(gb).to_f64_vec()])
    };
    verify(
        &["grad_a", "grad_b"],
        &t,
        run,
        "matmul_bwd_da",
        &["matmul_bwd_da_broken_transpose", "matmul_bwd_da_broken_accumulate", "matmul_bwd_db_broken_mask"],
    );
}

// ---------------------------------------------------------------- global reductions

#[test]
fn l2_norm_bwd() {
    let (n, block, finish_block) = (1234, 128, 4);
    let parts = cdiv(n, block);
    let mut r = StdRng::seed_from_u64(6);
    let (x, cot) = (nonzero(&mut r, n), nonzero(&mut r, 1));
    let k1 = kernel("l2_norm.py", "l2_norm_partial", &[("BLOCK", block as i64)], &[]);
    let k2 = kernel("l2_norm.py", "l2_norm_finish", &[("BLOCK", finish_block)], &[]);
    let mut mem = Memory::new();
    let xi = mem.add("x", HostTensor::from_f32(&[n], x.clone()));
    let p = mem.add("partial", zeros(&[parts]));
    let out = mem.add("out", zeros(&[1]));
    let l1 = Launch::new(&k1, parts).arg("x_ptr", xi).arg("partial_ptr", p).arg("n", n);
    let l2 = Launch::new(&k2, 1).arg("partial_ptr", p).arg("out_ptr", out).arg("num_partials", parts);
    // the ground truth through both launches: out's cotangent to partial's, then to x's
    let mut after1 = mem.clone();
    l1.run(&mut after1).unwrap();
    let gp = truth(&l2, &after1, &[p], &[(out, &cot[..])]).remove(0);
    let gp: Vec<(TensorId, Vec<f64>)> = vec![(p, gp)];
    let t = vjp(&l1, &mem, &[xi], &gp, &GradOptions::default()).unwrap().inputs;
    // the saved forward output
    l2.run(&mut after1).unwrap();
    let norm = after1.get(out).to_f64_vec()[0] as f32;
    let run = |name: &str| -> Result<Grads, ExecError> {
        let k = kernel("l2_norm_bwd.py", name, &[("BLOCK", block as i64)], &[]);
        let mut m = Memory::new();
        let xi = m.add("x", HostTensor::from_f32(&[n], x.clone()));
        let o = m.add("out", HostTensor::from_f32(&[1], vec![norm]));
        let g = m.add("grad_out", HostTensor::from_f32(&[1], cot.clone()));
        let gx = m.add("grad_x", empty(&[n]));
        Launch::new(&k, cdiv(n, block))
            .arg("x_ptr", xi)
            .arg("out_ptr", o)
            .arg("grad_out_ptr", g)
            .arg("grad_x_ptr", gx)
            .arg("n", n)
            .run(&mut m)?;
        Ok(vec![m.get(gx).to_f64_vec()])
    };
    verify(
        &["grad_x"],
        &t,
        run,
        "l2_norm_bwd",
        &["l2_norm_bwd_broken_scale", "l2_norm_bwd_broken_factor_two", "l2_norm_bwd_broken_norm_index"],
    );
}

#[test]
fn atomic_sum_bwd() {
    let (n, block) = (999, 64);
    let mut r = StdRng::seed_from_u64(7);
    let (x, cot) = (nonzero(&mut r, n), nonzero(&mut r, 1));
    let fwd = kernel("atomic_sum.py", "atomic_sum", &[("BLOCK", block as i64)], &[]);
    let mut mem = Memory::new();
    let xi = mem.add("x", HostTensor::from_f32(&[n], x));
    let out = mem.add("out", zeros(&[1]));
    let l = Launch::new(&fwd, cdiv(n, block)).arg("x_ptr", xi).arg("out_ptr", out).arg("n", n);
    let t = truth(&l, &mem, &[xi], &[(out, &cot[..])]);
    let run = |name: &str| -> Result<Grads, ExecError> {
        let k = kernel("atomic_sum_bwd.py", name, &[("BLOCK", block as i64)], &[]);
        let mut m = Memory::new();
        let g = m.add("grad_out", HostTensor::from_f32(&[1], cot.clone()));
        let gx = m.add("grad_x", empty(&[n]));
        Launch::new(&k, cdiv(n, block)).arg("grad_out_ptr", g).arg("grad_x_ptr", gx).arg("n", n).run(&mut m)?;
        Ok(vec![m.get(gx).to_f64_vec()])
    };
    verify(
        &["grad_x"],
        &t,
        run,
        "atomic_sum_bwd",
        &["atomic_sum_bwd_broken_mask", "atomic_sum_bwd_broken_mean", "atomic_sum_bwd_broken_block_mask"],
    );
}

// ---------------------------------------------------------------- row-wise: softmax, layer norm

#[test]
fn softmax_bwd() {
    let (rows, cols, br, bc) = (29, 50, 4, 64);
    let consts = [("BLOCK_ROWS", br as i64), ("BLOCK_COLS", bc as i64)];
    let mut r = StdRng::seed_from_u64(8);
    let x: Vec<f32> = nonzero(&mut r, rows * cols).iter().map(|v| 3.0 * v).collect();
    let cot = nonzero(&mut r, rows * cols);
    let fwd = kernel("softmax.py", "softmax", &consts, &[]);
    let mut mem = Memory::new();
    let xi = mem.add("x", HostTensor::from_f32(&[rows, cols], x));
    let y = mem.add("y", zeros(&[rows, cols]));
    let l = Launch::new(&fwd, cdiv(rows, br))
        .arg("x_ptr", xi)
        .arg("y_ptr", y)
        .arg("x_row_stride", cols)
        .arg("y_row_stride", cols)
        .arg("n_rows", rows)
        .arg("n_cols", cols);
    let t = truth(&l, &mem, &[xi], &[(y, &cot[..])]);
    let mut saved = mem.clone();
    l.run(&mut saved).unwrap();
    let y_saved = saved.get(y).clone();
    let run = |name: &str| -> Result<Grads, ExecError> {
        let k = kernel("softmax_bwd.py", name, &consts, &[]);
        let mut m = Memory::new();
        let yi = m.add("y", y_saved.clone());
        let g = m.add("grad_y", HostTensor::from_f32(&[rows, cols], cot.clone()));
        let gx = m.add("grad_x", empty(&[rows, cols]));
        Launch::new(&k, cdiv(rows, br))
            .arg("y_ptr", yi)
            .arg("grad_y_ptr", g)
            .arg("grad_x_ptr", gx)
            .arg("y_row_stride", cols)
            .arg("grad_y_row_stride", cols)
            .arg("grad_x_row_stride", cols)
            .arg("n_rows", rows)
            .arg("n_cols", cols)
            .run(&mut m)?;
        Ok(vec![m.get(gx).to_f64_vec()])
    };
    verify(&["grad_x"], &t, run, "softmax_bwd", &["softmax_bwd_broken_row_mask", "softmax_bwd_broken_axis", "softmax_bwd_broken_no_dot"]);
}

const EPS: f32 = 1e-5;

/// Layer-norm data: rows with different offsets and spreads, weights around 1.
fn layer_norm_data(rows: usize, cols: usize, seed: u64) -> [Vec<f32>; 4] {
    let mut r = StdRng::seed_from_u64(seed);
    let mut x = nonzero(&mut r, rows * cols);
    for row in x.chunks_mut(cols) {
        let (off, spread) = (r.gen_range(-2.0f32..2.0), r.gen_range(0.5f32..2.0));
        row.iter_mut().for_each(|v| *v = *v * spread + off);
    }
    let w: Vec<f32> = nonzero(&mut r, cols).iter().map(|v| 1.0 + 0.5 * v).collect();
    let b = nonzero(&mut r, cols);
    let cot = nonzero(&mut r, rows * cols);
    [x, w, b, cot]
}

#[test]
fn layer_norm_rows_bwd() {
    let (rows, cols, bm, bn) = (37, 300, 8, 512);
    let consts = [("BLOCK_M", bm as i64), ("BLOCK_N", bn as i64)];
    let [x, w, b, cot] = layer_norm_data(rows, cols, 9);
    let fwd = kernel("layer_norm.py", "layer_norm_rows", &consts, &["eps"]);
    let mut mem = Memory::new();
    let xi = mem.add("x", HostTensor::from_f32(&[rows, cols], x.clone()));
    let wi = mem.add("w", HostTensor::from_f32(&[cols], w.clone()));
    let bi = mem.add("b", HostTensor::from_f32(&[cols], b));
    let y = mem.add("y", zeros(&[rows, cols]));
    let l = Launch::new(&fwd, cdiv(rows, bm))
        .arg("x_ptr", xi)
        .arg("y_ptr", y)
        .arg("w_ptr", wi)
        .arg("b_ptr", bi)
        .arg("n_rows", rows)
        .arg("n_cols", cols)
        .arg("x_row_stride", cols)
        .arg("y_row_stride", cols)
        .arg("eps", EPS);
    let t = truth(&l, &mem, &[xi, wi, bi], &[(y, &cot[..])]);
    let run = |name: &str| -> Result<Grads, ExecError> {
        let k = kernel("layer_norm_bwd.py", name, &consts, &["eps"]);
        let mut m = Memory::new();
        let xi = m.add("x", HostTensor::from_f32(&[rows, cols], x.clone()));
        let wi = m.add("w", HostTensor::from_f32(&[cols], w.clone()));
        let g = m.add("grad_y", HostTensor::from_f32(&[rows, cols], cot.clone()));
        let gx = m.add("grad_x", empty(&[rows, cols]));
        let (gw, gb) = (m.add("grad_w", zeros(&[cols])), m.add("grad_b", zeros(&[cols])));
        Launch::new(&k, cdiv(rows, bm))
            .arg("x_ptr", xi)
            .arg("w_ptr", wi)
            .arg("grad_y_ptr", g)
            .arg("grad_x_ptr", gx)
            .arg("grad_w_ptr", gw)
            .arg("grad_b_ptr", gb)
            .arg("n_rows", rows)
            .arg("n_cols", cols)
            .arg("x_row_stride", cols)
            .arg("grad_y_row_stride", cols)
            .arg("grad_x_row_stride", cols)
            .arg("eps", EPS)
            .run(&mut m)?;
        Ok(vec![m.get(gx).to_f64_vec(), m.get(gw).to_f64_vec(), m.get(gb).to_f64_vec()])
    };
    verify(
        &["grad_x", "grad_w", "grad_b"],
        &t,
        run,
        "layer_norm_rows_bwd",
        &["layer_norm_rows_bwd_broken_race", "layer_norm_rows_bwd_broken_mean_scale", "layer_norm_rows_bwd_broken_var_mask"],
    );
}

#[test]
fn layer_norm_fwd_bwd() {
    let (rows, cols, block) = (37, 300, 128);
    let consts = [("BLOCK_SIZE", block)];
    let [x, w, b, cot] = layer_norm_data(rows, cols, 10);
    let fwd = kernel("layer_norm.py", "layer_norm_fwd", &consts, &["eps"]);
    let mut mem = Memory::new();
    let xi = mem.add("x", HostTensor::from_f32(&[rows, cols], x.clone()));
    let wi = mem.add("w", HostTensor::from_f32(&[cols], w.clone()));
    let bi = mem.add("b", HostTensor::from_f32(&[cols], b));
    let y = mem.add("y", zeros(&[rows, cols]));
    let mean = mem.add("mean", zeros(&[rows]));
    let rstd = mem.add("rstd", zeros(&[rows]));
    let l = Launch::new(&fwd, rows)
        .arg("x_ptr", xi)
        .arg("y_ptr", y)
        .arg("w_ptr", wi)
        .arg("b_ptr", bi)
        .arg("mean_ptr", mean)
        .arg("rstd_ptr", rstd)
        .arg("stride", cols)
        .arg("N", cols)
        .arg("eps", EPS);
    // mean and rstd are saved for the backward, not used by the loss: only y has a cotangent
    let t = truth(&l, &mem, &[xi, wi, bi], &[(y, &cot[..])]);
    let mut saved = mem.clone();
    l.run(&mut saved).unwrap();
    let (mean_saved, rstd_saved) = (saved.get(mean).clone(), saved.get(rstd).clone());
    let run = |name: &str| -> Result<Grads, ExecError> {
        let k = kernel("layer_norm_bwd.py", name, &consts, &[]);
        let mut m = Memory::new();
        let xi = m.add("x", HostTensor::from_f32(&[rows, cols], x.clone()));
        let wi = m.add("w", HostTensor::from_f32(&[cols], w.clone()));
        let mi = m.add("mean", mean_saved.clone());
        let ri = m.add("rstd", rstd_saved.clone());
        let g = m.add("grad_y", HostTensor::from_f32(&[rows, cols], cot.clone()));
        let gx = m.add("grad_x", empty(&[rows, cols]));
        let (pw, pb) = (m.add("partial_grad_w", empty(&[rows, cols])), m.add("partial_grad_b", empty(&[rows, cols])));
        Launch::new(&k, rows)
            .arg("x_ptr", xi)
            .arg("w_ptr", wi)
            .arg("mean_ptr", mi)
            .arg("rstd_ptr", ri)
            .arg("grad_y_ptr", g)
            .arg("grad_x_ptr", gx)
            .arg("partial_grad_w_ptr", pw)
            .arg("partial_grad_b_ptr", pb)
            .arg("stride", cols)
            .arg("N", cols)
            .run(&mut m)?;
        Ok(vec![m.get(gx).to_f64_vec(), sum_rows(m.get(pw)), sum_rows(m.get(pb))])
    };
    verify(
        &["grad_x", "grad_w", "grad_b"],
        &t,
        run,
        "layer_norm_bwd",
        &["layer_norm_bwd_broken_accumulate", "layer_norm_bwd_broken_partial_row", "layer_norm_bwd_broken_mask"],
    );
}

// ---------------------------------------------------------------- flash attention

#[test]
fn attn_bwd() {
    let (n, d, bm, bn) = (100, 32, 32, 16);
    let sm_scale = 0.7f32;
    let consts = [("HEAD_DIM", d as i64), ("BLOCK_M", bm as i64), ("BLOCK_N", bn as i64)];
    let mut r = StdRng::seed_from_u64(11);
    let (q, k, v, cot) = (nonzero(&mut r, n * d), nonzero(&mut r, n * d), nonzero(&mut r, n * d), nonzero(&mut r, n * d));
    let fwd = kernel("flash_attention.py", "attn_fwd", &consts, &["sm_scale"]);
    let mut mem = Memory::new();
    let qi = mem.add("q", HostTensor::from_f32(&[n, d], q.clone()));
    let ki = mem.add("k", HostTensor::from_f32(&[n, d], k.clone()));
    let vi = mem.add("v", HostTensor::from_f32(&[n, d], v.clone()));
    let o = mem.add("o", zeros(&[n, d]));
    let l = Launch::new(&fwd, cdiv(n, bm))
        .arg("q_ptr", qi)
        .arg("k_ptr", ki)
        .arg("v_ptr", vi)
        .arg("o_ptr", o)
        .arg("sm_scale", sm_scale)
        .arg("stride_qm", d)
        .arg("stride_qd", 1)
        .arg("stride_kn", d)
        .arg("stride_kd", 1)
        .arg("stride_vn", d)
        .arg("stride_vd", 1)
        .arg("stride_om", d)
        .arg("stride_od", 1)
        .arg("N_CTX", n);
    let t = truth(&l, &mem, &[qi, ki, vi], &[(o, &cot[..])]);
    let mut saved = mem.clone();
    l.run(&mut saved).unwrap();
    let o_saved = saved.get(o).clone();
    let run = |name: &str| -> Result<Grads, ExecError> {
        let kern = kernel("flash_attention_bwd.py", name, &consts, &["sm_scale"]);
        let mut m = Memory::new();
        let qi = m.add("q", HostTensor::from_f32(&[n, d], q.clone()));
        let ki = m.add("k", HostTensor::from_f32(&[n, d], k.clone()));
        let vi = m.add("v", HostTensor::from_f32(&[n, d], v.clone()));
        let oi = m.add("o", o_saved.clone());
        let g = m.add("grad_o", HostTensor::from_f32(&[n, d], cot.clone()));
        let gq = m.add("grad_q", empty(&[n, d]));
        let (gk, gv) = (m.add("grad_k", zeros(&[n, d])), m.add("grad_v", zeros(&[n, d])));
        Launch::new(&kern, cdiv(n, bm))
            .arg("q_ptr", qi)
            .arg("k_ptr", ki)
            .arg("v_ptr", vi)
            .arg("o_ptr", oi)
            .arg("grad_o_ptr", g)
            .arg("grad_q_ptr", gq)
            .arg("grad_k_ptr", gk)
            .arg("grad_v_ptr", gv)
            .arg("sm_scale", sm_scale)
            .arg("stride_qm", d)
            .arg("stride_qd", 1)
            .arg("stride_kn", d)
            .arg("stride_kd", 1)
            .arg("stride_vn", d)
            .arg("stride_vd", 1)
            .arg("stride_om", d)
            .arg("stride_od", 1)
            .arg("N_CTX", n)
            .run(&mut m)?;
        Ok(vec![m.get(gq).to_f64_vec(), m.get(gk).to_f64_vec(), m.get(gv).to_f64_vec()])
    };
    verify(
        &["grad_q", "grad_k", "grad_v"],
        &t,
        run,
        "attn_bwd",
        &["attn_bwd_broken_sm_scale", "attn_bwd_broken_key_mask", "attn_bwd_broken_race", "attn_bwd_broken_dq_accumulate"],
    );
}
