//! Random numbers carry no cotangent: the ground-truth gradient of the dropout example's forward
//! (`examples/triton/dropout.py`, `h = where(rand(seed, offsets) > p, x / (1 - p), 0) + residual`)
//! is the cotangent times the mask's scale for `x` and the cotangent itself for `residual`, with
//! the mask recomputed here by a plain Philox-4x32 (Triton's `tl.rand`).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tilegrad_ad::{vjp, GradOptions};
use tilegrad_ir::triton::{convert, ConvertOptions};
use tilegrad_ir::DType;
use tilegrad_reference::{HostTensor, Launch, Memory};

const DROPOUT: &str = include_str!("../../examples/triton/dropout.py");

/// `tl.rand(seed, offset)` for an i32 offset.
fn rand(seed: u64, offset: i32) -> f32 {
    let (mut c, mut k) = ([offset as u32, 0, 0, 0], [seed as u32, (seed >> 32) as u32]);
    for _ in 0..10 {
        let pb = 0xCD9E_8D57_u64 * c[2] as u64;
        let pa = 0xD251_1F53_u64 * c[0] as u64;
        c = [(pb >> 32) as u32 ^ c[1] ^ k[0], pb as u32, (pa >> 32) as u32 ^ c[3] ^ k[1], pa as u32];
        k = [k[0].wrapping_add(0x9E37_79B9), k[1].wrapping_add(0xBB67_AE85)];
    }
    let x = c[0] as i32;
    let x = if x < 0 { x.wrapping_neg() - 1 } else { x };
    x as f32 * (4.6566127342e-10_f64 as f32)
}

#[test]
fn dropout_gradient_is_the_mask_scale_and_the_residual_passes_through() {
    let (rows, n, stride, p) = (5usize, 100usize, 128usize, 0.25f32);
    let opts = ConvertOptions::with_constexprs(&[("BLOCK_N", 128)]);
    let opts = ConvertOptions {
        scalar_dtypes: vec![("seed".into(), DType::I64), ("p".into(), DType::F32)],
        pointer_dtypes: ["X", "RES", "H"].map(|n| (n.to_string(), DType::F32)).to_vec(),
        ..opts
    };
    let k = convert(DROPOUT, "dropout.py", "_dropout_add_fwd", &opts).unwrap();
    let mut r = StdRng::seed_from_u64(3);
    let mut draw = |len: usize| (0..len).map(|_| r.gen_range(-1.0f32..1.0)).collect::<Vec<f32>>();
    let (x, res, g) = (draw(rows * stride), draw(rows * stride), draw(rows * stride));
    for seed in [1_234_567_i64, (1 << 33) + 77] {
        let mut mem = Memory::new();
        let xt = mem.add("x", HostTensor::from_f32(&[rows, stride], x.clone()));
        let rt = mem.add("res", HostTensor::from_f32(&[rows, stride], res.clone()));
        let ht = mem.add("h", HostTensor::zeros(DType::F32, &[rows, stride]));
        let launch = Launch::new(&k, rows).arg("X", xt).arg("RES", rt).arg("H", ht).arg("stride", stride as i32);
        let launch = launch.arg("N", n as i32).arg("p", p).arg("seed", seed);
        let gv: Vec<f64> = g.iter().map(|&v| v as f64).collect();
        let grad = vjp(&launch, &mem, &[xt, rt], &[(ht, gv)], &GradOptions::default()).unwrap();
        let (mut kept, mut dropped) = (0, 0);
        for (i, &gv) in g.iter().enumerate() {
            let (row, col) = (i / stride, i % stride);
            let gi = if col < n { gv as f64 } else { 0.0 };
            let keep = col < n && rand(seed as u64, (row * stride + col) as i32) > p;
            let want = if keep { gi / (1.0 - p as f64) } else { 0.0 };
            assert!((grad.inputs[0][i] - want).abs() <= 1e-15, "grad_x[{row}, {col}]: {} vs {want}", grad.inputs[0][i]);
            assert_eq!(grad.inputs[1][i], gi, "grad_residual[{row}, {col}]");
            kept += keep as usize;
            dropped += (col < n && !keep) as usize;
        }
        // About a quarter dropped: the test is not vacuous.
        assert!(dropped > rows * n / 8 && kept > rows * n / 2, "seed {seed}: {kept} kept, {dropped} dropped");
        launch.run(&mut mem).unwrap();
        let h = mem[ht].as_f32().unwrap();
        let i = (0..n).find(|&c| rand(seed as u64, c as i32) > p).unwrap();
        assert_eq!(h[i], x[i] / (1.0 - p) + res[i]);
    }
}
