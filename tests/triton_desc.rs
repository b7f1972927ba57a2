//! The tensor-descriptor weighted sum (`examples/triton/weighted_sum_desc.py`) converted by the
//! Triton front end: it runs with the zoo's weighted-sum launch against the f64 reference on ragged
//! sizes, and its ground-truth gradient equals the block-pointer version's on the same data.

use rand::rngs::StdRng;
use rand::SeedableRng;
use tilegrad::zoo;
use tilegrad_ad::{vjp, GradOptions};
use tilegrad_ir::triton::{convert, ConvertOptions};
use tilegrad_ir::{DType, Kernel, Op};
use tilegrad_reference::{HostTensor, Memory};

const ROWS: usize = 1000;
const D: usize = 300;
const TILES: &[(&str, i64)] = &[("ROWS_TILE_SIZE", 16), ("D_TILE_SIZE", 128)];

fn kernel(file: &str) -> Kernel {
    let path = format!("{}/examples/triton/{file}", env!("CARGO_MANIFEST_DIR"));
    let src = std::fs::read_to_string(&path).unwrap();
    convert(&src, &path, "weighted_sum_fwd", &ConvertOptions::with_constexprs(TILES)).unwrap_or_else(|e| panic!("{e}"))
}

/// Random `x` `[ROWS, D]`, `weight` `[D]` and output cotangent `[ROWS]`.
fn data() -> (Vec<f32>, Vec<f32>, Vec<f64>) {
    let mut r = StdRng::seed_from_u64(0xde5c);
    let x = zoo::uniform(&mut r, ROWS * D);
    let w = zoo::uniform(&mut r, D);
    let g = zoo::uniform(&mut r, ROWS).into_iter().map(f64::from).collect();
    (x, w, g)
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

#[test]
fn descriptor_weighted_sum_matches_reference() {
    let k = kernel("weighted_sum_desc.py");
    // The descriptors are not carried: the loop carries only the accumulator.
    let mut carried = Vec::new();
    k.walk(&mut |_, d| {
        if let Op::For { .. } = d.op {
            carried.push(d.results.len());
        }
    });
    assert_eq!(carried, vec![1]);
    let (x, w, _) = data();
    let mut mem = Memory::new();
    let xi = mem.add("x", HostTensor::from_f32(&[ROWS, D], x.clone()));
    let wi = mem.add("w", HostTensor::from_f32(&[D], w.clone()));
    let o = mem.add("out", HostTensor::zeros(DType::F32, &[ROWS]));
    zoo::launch_weighted_sum_fwd(&k, &mut mem, xi, wi, o).unwrap();
    let got = mem.get(o).to_f64_vec();
    let expected = zoo::weighted_sum_fwd_ref(&f64s(&x), &f64s(&w), ROWS, D);
    let scale = expected.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert!((g - e).abs() <= 1e-5 * scale, "out[{i}]: got {g}, expected {e}");
    }
}

#[test]
fn descriptor_gradient_equals_block_pointer_gradient() {
    let (x, w, g) = data();
    let grads: Vec<_> = ["weighted_sum_desc.py", "weighted_sum.py"]
        .iter()
        .map(|file| {
            let k = kernel(file);
            let mut mem = Memory::new();
            let xi = mem.add("x", HostTensor::from_f32(&[ROWS, D], x.clone()));
            let wi = mem.add("w", HostTensor::from_f32(&[D], w.clone()));
            let o = mem.add("out", HostTensor::zeros(DType::F32, &[ROWS]));
            let launch = zoo::weighted_sum_fwd_launch(&k, &mem, xi, wi, o).unwrap();
            vjp(&launch, &mem, &[xi, wi], &[(o, g.clone())], &GradOptions::default()).unwrap()
        })
        .collect();
    assert_eq!(grads[0].inputs, grads[1].inputs);
    assert_eq!(grads[0].max_trips.values().copied().collect::<Vec<_>>(), vec![D.div_ceil(128) as u64]);
    // And both are the analytic gradient: grad_x = g w exactly, grad_w = x^T g up to summation order.
    let (gx, gw) = zoo::weighted_sum_bwd_ref(&f64s(&x), &f64s(&w), &g, ROWS, D);
    assert_eq!(grads[0].inputs[0], gx);
    let scale = gw.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    for (j, (a, e)) in grads[0].inputs[1].iter().zip(&gw).enumerate() {
        assert!((a - e).abs() <= 1e-12 * scale, "grad_w[{j}]: got {a}, expected {e}");
    }
}
