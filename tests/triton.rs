//! The Triton examples of `examples/triton/` converted by the Triton front end and run on the
//! reference interpreter with the zoo's launch helpers, against the zoo's f64 references and the
//! zoo's builder kernels, on random data at sizes that are not multiples of the tiles.

use rand::rngs::StdRng;
use rand::SeedableRng;
use tilegrad::zoo;
use tilegrad_ir::triton::{convert, ConvertOptions};
use tilegrad_ir::{DType, DotPrecision, Kernel};
use tilegrad_reference::{HostTensor, Memory, TensorId};

fn kernel(file: &str, name: &str, consts: &[(&str, i64)]) -> Kernel {
    let path = format!("{}/examples/triton/{file}", env!("CARGO_MANIFEST_DIR"));
    let src = std::fs::read_to_string(&path).unwrap();
    convert(&src, &path, name, &ConvertOptions::with_constexprs(consts)).unwrap_or_else(|e| panic!("{e}"))
}

fn data(seed: u64, n: usize) -> Vec<f32> {
    zoo::uniform(&mut StdRng::seed_from_u64(seed), n)
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn out(mem: &Memory, id: TensorId) -> Vec<f64> {
    mem.get(id).to_f64_vec()
}

/// `|got - expected| <= 1e-5 * max(scale, 1)` for every element.
fn close(what: &str, got: &[f64], expected: &[f64]) {
    assert_eq!(got.len(), expected.len(), "{what}: length");
    let scale = expected.iter().fold(1.0f64, |m, x| m.max(x.abs()));
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!((g - e).abs() <= 1e-5 * scale, "{what}[{i}]: got {g}, expected {e}");
    }
}

#[test]
fn vector_add_matches_reference_and_zoo() {
    let n = 1000;
    let (x, y) = (data(1, n), data(2, n));
    let expected = zoo::vector_add_ref(&f64s(&x), &f64s(&y));
    for k in [kernel("vector_add.py", "vector_add", &[("BLOCK", 128)]), zoo::vector_add(128).unwrap()] {
        let mut mem = Memory::new();
        let xi = mem.add("x", HostTensor::from_f32(&[n], x.clone()));
        let yi = mem.add("y", HostTensor::from_f32(&[n], y.clone()));
        let o = mem.add("out", HostTensor::zeros(DType::F32, &[n]));
        zoo::launch_vector_add(&k, &mut mem, xi, yi, o).unwrap();
        close("vector_add", &out(&mem, o), &expected);
    }
}

#[test]
fn copy_matches_reference() {
    let n = 777;
    let x = data(3, n);
    let k = kernel("copy.py", "copy", &[("BLOCK", 64)]);
    let mut mem = Memory::new();
    let s = mem.add("src", HostTensor::from_f32(&[n], x.clone()));
    let d = mem.add("dst", HostTensor::zeros(DType::F32, &[n]));
    zoo::launch_copy(&k, &mut mem, s, d).unwrap();
    assert_eq!(out(&mem, d), zoo::copy_ref(&f64s(&x)));
}

#[test]
fn rgb_to_grey_matches_reference() {
    let (h, w) = (37, 53);
    let img = data(4, h * w * 3);
    let k = kernel("grey.py", "rgb_to_grey", &[("BLOCK_H", 16), ("BLOCK_W", 32)]);
    let mut mem = Memory::new();
    let i = mem.add("img", HostTensor::from_f32(&[h, w, 3], img.clone()));
    let g = mem.add("grey", HostTensor::zeros(DType::F32, &[h, w]));
    zoo::launch_rgb_to_grey(&k, &mut mem, i, g).unwrap();
    close("grey", &out(&mem, g), &zoo::rgb_to_grey_ref(&f64s(&img), h, w));
}

#[test]
fn weighted_sum_fwd_matches_reference() {
    let (rows, d) = (45, 300);
    let (x, wt) = (data(5, rows * d), data(6, d));
    let k = kernel("weighted_sum.py", "weighted_sum_fwd", &[("ROWS_TILE_SIZE", 16), ("D_TILE_SIZE", 64)]);
    let mut mem = Memory::new();
    let xi = mem.add("x", HostTensor::from_f32(&[rows, d], x.clone()));
    let wi = mem.add("w", HostTensor::from_f32(&[d], wt.clone()));
    let o = mem.add("out", HostTensor::zeros(DType::F32, &[rows]));
    zoo::launch_weighted_sum_fwd(&k, &mut mem, xi, wi, o).unwrap();
    close("weighted_sum", &out(&mem, o), &zoo::weighted_sum_fwd_ref(&f64s(&x), &f64s(&wt), rows, d));
}

#[test]
fn matmul_with_helper_matches_reference_and_zoo() {
    let (m, n, kk) = (45, 37, 70);
    let (a, b) = (data(7, m * kk), data(8, kk * n));
    let expected = zoo::matmul_ref(&f64s(&a), &f64s(&b), m, n, kk);
    let consts = [("BLOCK_M", 16), ("BLOCK_N", 16), ("BLOCK_K", 32)];
    for k in [kernel("matmul.py", "matmul", &consts), zoo::matmul(16, 16, 32, Some(DotPrecision::Ieee)).unwrap()] {
        let mut mem = Memory::new();
        let ai = mem.add("a", HostTensor::from_f32(&[m, kk], a.clone()));
        let bi = mem.add("b", HostTensor::from_f32(&[kk, n], b.clone()));
        let c = mem.add("c", HostTensor::zeros(DType::F32, &[m, n]));
        zoo::launch_matmul(&k, &mut mem, ai, bi, c).unwrap();
        close("matmul", &out(&mem, c), &expected);
    }
}

#[test]
fn l2_norm_two_kernels_match_reference() {
    let n = 1234;
    let x = data(9, n);
    let k1 = kernel("l2_norm.py", "l2_norm_partial", &[("BLOCK", 128)]);
    let k2 = kernel("l2_norm.py", "l2_norm_finish", &[("BLOCK", 4)]);
    let mut mem = Memory::new();
    let xi = mem.add("x", HostTensor::from_f32(&[n], x.clone()));
    let p = mem.add("partial", HostTensor::zeros(DType::F32, &[zoo::l2_norm_num_partials(n, 128)]));
    let o = mem.add("out", HostTensor::zeros(DType::F32, &[1]));
    zoo::launch_l2_norm((&k1, &k2), &mut mem, xi, p, o).unwrap();
    close("l2_norm", &out(&mem, o), &[zoo::l2_norm_ref(&f64s(&x))]);
}

#[test]
fn atomic_sum_matches_reference() {
    let n = 999;
    let x = data(10, n);
    let k = kernel("atomic_sum.py", "atomic_sum", &[("BLOCK", 64)]);
    let mut mem = Memory::new();
    let xi = mem.add("x", HostTensor::from_f32(&[n], x.clone()));
    let o = mem.add("out", HostTensor::zeros(DType::F32, &[1]));
    zoo::launch_atomic_sum(&k, &mut mem, xi, o).unwrap();
    close("atomic_sum", &out(&mem, o), &[zoo::atomic_sum_ref(&f64s(&x))]);
}

#[test]
fn softmax_matches_reference() {
    let (rows, cols) = (29, 50);
    let x = data(11, rows * cols);
    let k = kernel("softmax.py", "softmax", &[("BLOCK_ROWS", 4), ("BLOCK_COLS", 64)]);
    let mut mem = Memory::new();
    let xi = mem.add("x", HostTensor::from_f32(&[rows, cols], x.clone()));
    let y = mem.add("y", HostTensor::zeros(DType::F32, &[rows, cols]));
    zoo::launch_softmax(&k, &mut mem, xi, y).unwrap();
    close("softmax", &out(&mem, y), &zoo::softmax_ref(&f64s(&x), rows, cols));
}
