//! More Triton examples of `examples/triton/`: layer norm (the tutorial's fused forward, looping
//! over column blocks, and a one-tile-per-row version over BLOCK_M rows) and a flash-attention
//! forward with an online softmax over key blocks. Each is converted by the Triton front end, run
//! on the reference interpreter at sizes that are not multiples of the tiles against a plain-Rust
//! f64 reference, and its ground-truth gradient (`tilegrad_ad::vjp`) is checked against central
//! finite differences along random directions.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tilegrad_ad::fd::{fd_directional, FdSpec};
use tilegrad_ad::{vjp, GradOptions};
use tilegrad_ir::triton::{convert, ConvertOptions};
use tilegrad_ir::{DType, Kernel};
use tilegrad_reference::{HostTensor, Launch, Memory, TensorId};

/// Converts `name` of `examples/triton/{file}` with these constexprs and f32 scalars.
fn kernel(file: &str, name: &str, consts: &[(&str, i64)], f32_scalars: &[&str]) -> Kernel {
    let path = format!("{}/examples/triton/{file}", env!("CARGO_MANIFEST_DIR"));
    let src = std::fs::read_to_string(&path).unwrap();
    let mut opts = ConvertOptions::with_constexprs(consts);
    opts.scalar_dtypes = f32_scalars.iter().map(|s| (s.to_string(), DType::F32)).collect();
    convert(&src, &path, name, &opts).unwrap_or_else(|e| panic!("{e}"))
}

fn rand_f32(r: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| r.gen_range(lo..hi)).collect()
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// `|got - expected| <= tol * max(scale, 1)` for every element, where `scale` is the largest
/// expected magnitude: f32 kernels against f64 references, with `tol` a few hundred f32 ulps.
fn close(what: &str, got: &[f64], expected: &[f64], tol: f64) {
    assert_eq!(got.len(), expected.len(), "{what}: length");
    let scale = expected.iter().fold(1.0f64, |m, x| m.max(x.abs()));
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!((g - e).abs() <= tol * scale, "{what}[{i}]: got {g}, expected {e}");
    }
}

/// AD and central finite differences (f64, step 1e-6) agree on `<cot, J v>` for two random
/// directions `v`, to 1e-6 relative; the gradient of every input is non-zero and so is each
/// directional derivative (so that a kernel whose outputs ignore an input cannot pass).
fn check(name: &str, launch: &Launch, mem: &Memory, inputs: &[TensorId], outputs: &[TensorId], seed: u64) {
    let mut r = StdRng::seed_from_u64(seed);
    let cots: Vec<Vec<f64>> = outputs.iter().map(|&o| (0..mem.get(o).numel()).map(|_| r.gen_range(-1.0..1.0)).collect()).collect();
    let outs: Vec<(TensorId, Vec<f64>)> = outputs.iter().copied().zip(cots.iter().cloned()).collect();
    let grad = vjp(launch, mem, inputs, &outs, &GradOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
    for (g, &i) in grad.inputs.iter().zip(inputs) {
        assert_eq!(g.len(), mem.get(i).numel(), "{name}: gradient length of {}", mem.name(i));
        assert!(g.iter().all(|x| x.is_finite()), "{name}: non-finite gradient of {}", mem.name(i));
        assert!(g.iter().any(|&x| x.abs() > 1e-9), "{name}: zero gradient of {}", mem.name(i));
    }
    let spec = FdSpec::new(launch, mem, inputs.to_vec(), outputs.to_vec());
    for trial in 0..2 {
        let dirs: Vec<Vec<f64>> = inputs.iter().map(|&i| (0..mem.get(i).numel()).map(|_| r.gen_range(-1.0..1.0)).collect()).collect();
        let fd = fd_directional(&spec, &cots, &dirs, 1e-6).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ad: f64 = grad.inputs.iter().zip(&dirs).map(|(g, v)| g.iter().zip(v).map(|(a, b)| a * b).sum::<f64>()).sum();
        assert!(fd.abs() > 1e-3, "{name}, direction {trial}: directional derivative {fd} too small to test");
        let scale = ad.abs().max(fd.abs());
        assert!((ad - fd).abs() <= 1e-6 * scale, "{name}, direction {trial}: AD {ad} vs FD {fd}");
    }
}

// ---------------------------------------------------------------- layer norm

const EPS: f32 = 1e-5;

/// Row-wise layer norm in f64: `(y, mean, rstd)`.
fn layer_norm_ref(x: &[f64], w: &[f64], b: &[f64], rows: usize, cols: usize, eps: f64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut y, mut means, mut rstds) = (vec![0.0; rows * cols], vec![0.0; rows], vec![0.0; rows]);
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let mean = row.iter().sum::<f64>() / cols as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cols as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        for c in 0..cols {
            y[r * cols + c] = (row[c] - mean) * rstd * w[c] + b[c];
        }
        (means[r], rstds[r]) = (mean, rstd);
    }
    (y, means, rstds)
}

/// Random layer-norm data: rows with different offsets and spreads, weights around 1.
fn layer_norm_data(rows: usize, cols: usize, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut r = StdRng::seed_from_u64(seed);
    let mut x = rand_f32(&mut r, rows * cols, -1.0, 1.0);
    for row in x.chunks_mut(cols) {
        let (off, spread) = (r.gen_range(-2.0f32..2.0), r.gen_range(0.5f32..2.0));
        row.iter_mut().for_each(|v| *v = *v * spread + off);
    }
    (x, rand_f32(&mut r, cols, 0.5, 1.5), rand_f32(&mut r, cols, -1.0, 1.0))
}

struct LayerNormMem {
    mem: Memory,
    x: TensorId,
    w: TensorId,
    b: TensorId,
    y: TensorId,
    mean: TensorId,
    rstd: TensorId,
}

fn layer_norm_mem(x: &[f32], w: &[f32], b: &[f32], rows: usize, cols: usize) -> LayerNormMem {
    let mut mem = Memory::new();
    let x = mem.add("x", HostTensor::from_f32(&[rows, cols], x.to_vec()));
    let w = mem.add("w", HostTensor::from_f32(&[cols], w.to_vec()));
    let b = mem.add("b", HostTensor::from_f32(&[cols], b.to_vec()));
    let y = mem.add("y", HostTensor::zeros(DType::F32, &[rows, cols]));
    let mean = mem.add("mean", HostTensor::zeros(DType::F32, &[rows]));
    let rstd = mem.add("rstd", HostTensor::zeros(DType::F32, &[rows]));
    LayerNormMem { mem, x, w, b, y, mean, rstd }
}

/// The tutorial-style kernel: one program per row.
fn layer_norm_fwd_launch<'k>(k: &'k Kernel, m: &LayerNormMem, rows: usize, cols: usize) -> Launch<'k> {
    Launch::new(k, rows)
        .arg("x_ptr", m.x)
        .arg("y_ptr", m.y)
        .arg("w_ptr", m.w)
        .arg("b_ptr", m.b)
        .arg("mean_ptr", m.mean)
        .arg("rstd_ptr", m.rstd)
        .arg("stride", m.mem.get(m.x).stride(0))
        .arg("N", cols)
        .arg("eps", EPS)
}

/// The tile kernel: one program per `block_m` rows.
fn layer_norm_rows_launch<'k>(k: &'k Kernel, m: &LayerNormMem, rows: usize, cols: usize, block_m: usize) -> Launch<'k> {
    Launch::new(k, rows.div_ceil(block_m))
        .arg("x_ptr", m.x)
        .arg("y_ptr", m.y)
        .arg("w_ptr", m.w)
        .arg("b_ptr", m.b)
        .arg("n_rows", rows)
        .arg("n_cols", cols)
        .arg("x_row_stride", m.mem.get(m.x).stride(0))
        .arg("y_row_stride", m.mem.get(m.y).stride(0))
        .arg("eps", EPS)
}

#[test]
fn layer_norm_fwd_matches_reference() {
    let (rows, cols) = (37, 300);
    let (x, w, b) = layer_norm_data(rows, cols, 1);
    let (ey, em, er) = layer_norm_ref(&f64s(&x), &f64s(&w), &f64s(&b), rows, cols, EPS as f64);
    // one block per row (512), and three blocks of 128 with a ragged last one
    for block in [512, 128] {
        let k = kernel("layer_norm.py", "layer_norm_fwd", &[("BLOCK_SIZE", block)], &["eps"]);
        let mut m = layer_norm_mem(&x, &w, &b, rows, cols);
        let l = layer_norm_fwd_launch(&k, &m, rows, cols);
        l.run(&mut m.mem).unwrap();
        close(&format!("layer_norm_fwd/{block} y"), &m.mem.get(m.y).to_f64_vec(), &ey, 1e-5);
        close(&format!("layer_norm_fwd/{block} mean"), &m.mem.get(m.mean).to_f64_vec(), &em, 1e-5);
        close(&format!("layer_norm_fwd/{block} rstd"), &m.mem.get(m.rstd).to_f64_vec(), &er, 1e-5);
    }
}

#[test]
fn layer_norm_rows_matches_reference() {
    let (rows, cols) = (37, 300);
    let (x, w, b) = layer_norm_data(rows, cols, 2);
    let (ey, _, _) = layer_norm_ref(&f64s(&x), &f64s(&w), &f64s(&b), rows, cols, EPS as f64);
    let k = kernel("layer_norm.py", "layer_norm_rows", &[("BLOCK_M", 8), ("BLOCK_N", 512)], &["eps"]);
    let mut m = layer_norm_mem(&x, &w, &b, rows, cols);
    let l = layer_norm_rows_launch(&k, &m, rows, cols, 8);
    l.run(&mut m.mem).unwrap();
    close("layer_norm_rows y", &m.mem.get(m.y).to_f64_vec(), &ey, 1e-5);
}

#[test]
fn layer_norm_gradients_agree_with_finite_differences() {
    let (rows, cols) = (37, 300);
    let (x, w, b) = layer_norm_data(rows, cols, 3);
    for block in [512, 128] {
        let k = kernel("layer_norm.py", "layer_norm_fwd", &[("BLOCK_SIZE", block)], &["eps"]);
        let m = layer_norm_mem(&x, &w, &b, rows, cols);
        let l = layer_norm_fwd_launch(&k, &m, rows, cols);
        check(&format!("layer_norm_fwd/{block}"), &l, &m.mem, &[m.x, m.w, m.b], &[m.y, m.mean, m.rstd], 10 + block as u64);
    }
    let k = kernel("layer_norm.py", "layer_norm_rows", &[("BLOCK_M", 8), ("BLOCK_N", 512)], &["eps"]);
    let m = layer_norm_mem(&x, &w, &b, rows, cols);
    let l = layer_norm_rows_launch(&k, &m, rows, cols, 8);
    check("layer_norm_rows", &l, &m.mem, &[m.x, m.w, m.b], &[m.y], 11);
}

// ---------------------------------------------------------------- flash attention

/// `softmax(q k^T * scale) v` in f64 for `[n, d]` row-major q, k, v.
fn attention_ref(q: &[f64], k: &[f64], v: &[f64], n: usize, d: usize, scale: f64) -> Vec<f64> {
    let mut out = vec![0.0; n * d];
    for i in 0..n {
        let s: Vec<f64> = (0..n).map(|j| (0..d).map(|c| q[i * d + c] * k[j * d + c]).sum::<f64>() * scale).collect();
        let mx = s.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x));
        let p: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
        let l: f64 = p.iter().sum();
        for c in 0..d {
            out[i * d + c] = (0..n).map(|j| p[j] * v[j * d + c]).sum::<f64>() / l;
        }
    }
    out
}

struct AttnMem {
    mem: Memory,
    q: TensorId,
    k: TensorId,
    v: TensorId,
    o: TensorId,
}

fn attention_mem(n: usize, d: usize, seed: u64) -> (AttnMem, [Vec<f32>; 3]) {
    let mut r = StdRng::seed_from_u64(seed);
    // scores of a few units, so that the softmax is neither flat nor one-hot
    let (q, k, v) = (rand_f32(&mut r, n * d, -1.0, 1.0), rand_f32(&mut r, n * d, -1.0, 1.0), rand_f32(&mut r, n * d, -1.0, 1.0));
    let mut mem = Memory::new();
    let qi = mem.add("q", HostTensor::from_f32(&[n, d], q.clone()));
    let ki = mem.add("k", HostTensor::from_f32(&[n, d], k.clone()));
    let vi = mem.add("v", HostTensor::from_f32(&[n, d], v.clone()));
    let o = mem.add("out", HostTensor::zeros(DType::F32, &[n, d]));
    (AttnMem { mem, q: qi, k: ki, v: vi, o }, [q, k, v])
}

fn attention_launch<'k>(kern: &'k Kernel, m: &AttnMem, n: usize, block_m: usize, sm_scale: f32) -> Launch<'k> {
    let t = |id: TensorId, dim: usize| m.mem.get(id).stride(dim);
    Launch::new(kern, n.div_ceil(block_m))
        .arg("q_ptr", m.q)
        .arg("k_ptr", m.k)
        .arg("v_ptr", m.v)
        .arg("o_ptr", m.o)
        .arg("sm_scale", sm_scale)
        .arg("stride_qm", t(m.q, 0))
        .arg("stride_qd", t(m.q, 1))
        .arg("stride_kn", t(m.k, 0))
        .arg("stride_kd", t(m.k, 1))
        .arg("stride_vn", t(m.v, 0))
        .arg("stride_vd", t(m.v, 1))
        .arg("stride_om", t(m.o, 0))
        .arg("stride_od", t(m.o, 1))
        .arg("N_CTX", n)
}

const ATTN_CONSTS: [(&str, i64); 3] = [("HEAD_DIM", 32), ("BLOCK_M", 32), ("BLOCK_N", 16)];

#[test]
fn flash_attention_matches_reference() {
    let (n, d) = (100, 32);
    // 1/sqrt(d) as usual, and a larger scale that makes the running max change between blocks
    for (seed, sm_scale) in [(20, 1.0 / (d as f32).sqrt()), (21, 1.5)] {
        let kern = kernel("flash_attention.py", "attn_fwd", &ATTN_CONSTS, &["sm_scale"]);
        let (mut m, [q, k, v]) = attention_mem(n, d, seed);
        let l = attention_launch(&kern, &m, n, 32, sm_scale);
        l.run(&mut m.mem).unwrap();
        let expected = attention_ref(&f64s(&q), &f64s(&k), &f64s(&v), n, d, sm_scale as f64);
        close(&format!("attn_fwd scale {sm_scale}"), &m.mem.get(m.o).to_f64_vec(), &expected, 1e-5);
    }
}

#[test]
fn flash_attention_gradients_agree_with_finite_differences() {
    let (n, d) = (100, 32);
    let kern = kernel("flash_attention.py", "attn_fwd", &ATTN_CONSTS, &["sm_scale"]);
    let (m, _) = attention_mem(n, d, 22);
    let l = attention_launch(&kern, &m, n, 32, 1.5);
    check("attn_fwd", &l, &m.mem, &[m.q, m.k, m.v], &[m.o], 23);
}
