//! The engine checks itself: the AD gradient of every zoo launch (and of the special cases of
//! the design: loads after own stores, in-place accumulation, atomics, data-dependent loops
//! without `max_iters`, masked boundary tiles, max reductions) agrees with central finite
//! differences in f64 run through the reference interpreter, along random directions.

mod common;

use rand::{rngs::StdRng, Rng, SeedableRng};
use tilegrad::zoo;
use tilegrad_ad::fd::{fd_directional, fd_vjp, FdSpec};
use tilegrad_ad::{vjp, GradOptions};
use tilegrad_ir::{DType, KernelBuilder};
use tilegrad_reference::{HostTensor, Launch, Memory, TensorId};

fn rand_f32(r: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| r.gen_range(-1.0f32..1.0)).collect()
}

/// AD and finite differences agree on `<cot, J v>` for three random directions `v`.
fn check(name: &str, launch: &Launch, mem: &Memory, inputs: &[TensorId], outputs: &[TensorId], seed: u64) {
    let mut r = StdRng::seed_from_u64(seed);
    let cots: Vec<Vec<f64>> = outputs.iter().map(|&o| (0..mem.get(o).numel()).map(|_| r.gen_range(-1.0..1.0)).collect()).collect();
    let outs: Vec<(TensorId, Vec<f64>)> = outputs.iter().copied().zip(cots.iter().cloned()).collect();
    let grad = vjp(launch, mem, inputs, &outs, &GradOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let spec = FdSpec::new(launch, mem, inputs.to_vec(), outputs.to_vec());
    for trial in 0..3 {
        let dirs: Vec<Vec<f64>> = inputs.iter().map(|&i| (0..mem.get(i).numel()).map(|_| r.gen_range(-1.0..1.0)).collect()).collect();
        let fd = fd_directional(&spec, &cots, &dirs, 1e-6).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ad: f64 = grad.inputs.iter().zip(&dirs).map(|(g, v)| g.iter().zip(v).map(|(a, b)| a * b).sum::<f64>()).sum();
        let scale = ad.abs().max(fd.abs()).max(1e-3);
        assert!((ad - fd).abs() <= 1e-6 * scale, "{name}, direction {trial}: AD {ad} vs FD {fd}");
    }
}

#[test]
fn zoo_kernels_agree_with_finite_differences() {
    let mut r = StdRng::seed_from_u64(11);
    // vector add, copy
    let n = 1000;
    let k = zoo::vector_add(256).unwrap();
    let mut mem = Memory::new();
    let x = mem.add("x", HostTensor::from_f32(&[n], rand_f32(&mut r, n)));
    let y = mem.add("y", HostTensor::from_f32(&[n], rand_f32(&mut r, n)));
    let o = mem.add("out", HostTensor::zeros(DType::F32, &[n]));
    check("vector_add", &zoo::vector_add_launch(&k, &mem, x, y, o).unwrap(), &mem, &[x, y], &[o], 1);
    let k = zoo::copy(128).unwrap();
    check("copy", &zoo::copy_launch(&k, &mem, x, o).unwrap(), &mem, &[x], &[o], 2);

    // RGB to grey on a 2-D grid
    let (h, w) = (37, 45);
    let k = zoo::rgb_to_grey(16, 32).unwrap();
    let mut mem = Memory::new();
    let img = mem.add("img", HostTensor::from_f32(&[h, w, 3], rand_f32(&mut r, h * w * 3)));
    let grey = mem.add("grey", HostTensor::zeros(DType::F32, &[h, w]));
    check("rgb_to_grey", &zoo::rgb_to_grey_launch(&k, &mem, img, grey).unwrap(), &mem, &[img], &[grey], 3);

    // weighted sum forward and the user's backward kernel (itself a launch to differentiate)
    let (rows, d) = (100, 300);
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[rows, d], rand_f32(&mut r, rows * d)));
    let wt = mem.add("w", HostTensor::from_f32(&[d], rand_f32(&mut r, d)));
    let ot = mem.add("out", HostTensor::zeros(DType::F32, &[rows]));
    let gt = mem.add("g", HostTensor::from_f32(&[rows], rand_f32(&mut r, rows)));
    let gxt = mem.add("grad_x", HostTensor::zeros(DType::F32, &[rows, d]));
    let pt = mem.add("partial", HostTensor::zeros(DType::F32, &[rows.div_ceil(16), d]));
    let k = zoo::weighted_sum_fwd(16, 128).unwrap();
    check("weighted_sum_fwd", &zoo::weighted_sum_fwd_launch(&k, &mem, xt, wt, ot).unwrap(), &mem, &[xt, wt], &[ot], 4);
    let k = zoo::weighted_sum_bwd(16, 128).unwrap();
    let l = zoo::weighted_sum_bwd_launch(&k, &mem, xt, wt, gt, gxt, pt).unwrap();
    check("weighted_sum_bwd", &l, &mem, &[xt, wt, gt], &[gxt, pt], 5);

    // matmul (tf32 in the kernel; ground truth and differences are both f64/ieee)
    let (m, nn, kk) = (70, 45, 37);
    let k = zoo::matmul(32, 32, 16, None).unwrap();
    let mut mem = Memory::new();
    let a = mem.add("a", HostTensor::from_f32(&[m, kk], rand_f32(&mut r, m * kk)));
    let b = mem.add("b", HostTensor::from_f32(&[kk, nn], rand_f32(&mut r, kk * nn)));
    let c = mem.add("c", HostTensor::zeros(DType::F32, &[m, nn]));
    check("matmul", &zoo::matmul_launch(&k, &mem, a, b, c).unwrap(), &mem, &[a, b], &[c], 6);

    // softmax
    let (rows, cols) = (37, 300);
    let k = zoo::softmax(16, 512).unwrap();
    let mut mem = Memory::new();
    let x = mem.add("x", HostTensor::from_f32(&[rows, cols], rand_f32(&mut r, rows * cols)));
    let y = mem.add("y", HostTensor::zeros(DType::F32, &[rows, cols]));
    check("softmax", &zoo::softmax_launch(&k, &mem, x, y).unwrap(), &mem, &[x], &[y], 7);

    // L2 norm: both launches (partial sums, then a one-program loop over the partials)
    let n = 3000;
    let (kp, kf) = (zoo::l2_norm_partial(256).unwrap(), zoo::l2_norm_finish(64).unwrap());
    let mut mem = Memory::new();
    let x = mem.add("x", HostTensor::from_f32(&[n], rand_f32(&mut r, n)));
    let parts = zoo::l2_norm_num_partials(n, 256);
    let p = mem.add("partial", HostTensor::from_f32(&[parts], rand_f32(&mut r, parts).iter().map(|v| v.abs() + 0.5).collect()));
    let out = mem.add("out", HostTensor::zeros(DType::F32, &[1]));
    check("l2_norm_partial", &zoo::l2_norm_partial_launch(&kp, &mem, x, p).unwrap(), &mem, &[x], &[p], 8);
    check("l2_norm_finish", &zoo::l2_norm_finish_launch(&kf, &mem, p, out).unwrap(), &mem, &[p], &[out], 9);

    // atomic global sum (the output's initial value is an input too)
    let k = zoo::atomic_sum(128).unwrap();
    let mut mem = Memory::new();
    let x = mem.add("x", HostTensor::from_f32(&[n], rand_f32(&mut r, n)));
    let out = mem.add("out", HostTensor::from_f32(&[1], vec![0.25]));
    check("atomic_sum", &zoo::atomic_sum_launch(&k, &mem, x, out).unwrap(), &mem, &[x, out], &[out], 10);

    // segmented sums: a data-dependent loop with no max_iters
    let (starts, lengths, total) = zoo::random_segments(&mut r, 17, 200);
    let k = zoo::segment_sum(32).unwrap();
    let mut mem = Memory::new();
    let v = mem.add("values", HostTensor::from_f32(&[total], rand_f32(&mut r, total)));
    let s = mem.add("starts", HostTensor::from_i32(&[starts.len()], starts.clone()));
    let le = mem.add("lengths", HostTensor::from_i32(&[lengths.len()], lengths));
    let o = mem.add("out", HostTensor::zeros(DType::F32, &[starts.len()]));
    check("segment_sum", &zoo::segment_sum_launch(&k, &mem, v, s, le, o).unwrap(), &mem, &[v], &[o], 11);
}

/// A nonlinear in-place accumulation with a load after the program's own store and a loop:
/// `acc[i] = tanh(acc[i]) * x[i]` repeated three times through memory.
#[test]
fn in_place_accumulation_through_memory_in_a_loop() {
    let mut b = KernelBuilder::new("accumulate");
    let x = b.ptr_param("x", DType::F32);
    let acc = b.ptr_param("acc", DType::F32);
    let n = b.scalar_param("n", DType::I32);
    let pid = b.program_id(0);
    let bs = b.i32(32);
    let start = b.mul(pid, bs);
    let ar = b.arange(0, 32);
    let offs = b.add(start, ar);
    let mask = b.lt(offs, n);
    let px = b.add(x, offs);
    let pa = b.add(acc, offs);
    let xv = b.load(px, Some(mask), None);
    let zero = b.i32(0);
    let three = b.i32(3);
    let one = b.i32(1);
    b.for_range(zero, three, one, Some(3), &[], |b, _, _| {
        let a = b.load(pa, Some(mask), None);
        let t = b.tanh(a);
        let v = b.mul(t, xv);
        let s = b.add(v, a);
        b.store(pa, s, Some(mask));
        vec![]
    });
    let k = b.finish().unwrap();
    let mut r = StdRng::seed_from_u64(12);
    let nn = 77;
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[nn], rand_f32(&mut r, nn)));
    let at = mem.add("acc", HostTensor::from_f32(&[90], rand_f32(&mut r, 90)));
    let launch = Launch::new(&k, 3).arg("x", xt).arg("acc", at).arg("n", nn as i32);
    check("accumulate", &launch, &mem, &[xt, at], &[at], 13);

    // A full finite-difference VJP on this small case, element by element.
    let g: Vec<f64> = (0..90).map(|_| r.gen_range(-1.0..1.0)).collect();
    let grad = vjp(&launch, &mem, &[xt, at], &[(at, g.clone())], &GradOptions::default()).unwrap();
    let spec = FdSpec::new(&launch, &mem, vec![xt, at], vec![at]);
    let fd = fd_vjp(&spec, &[g], 1e-6).unwrap();
    for (which, (a, f)) in grad.inputs.iter().zip(&fd).enumerate() {
        for (i, (x, y)) in a.iter().zip(f).enumerate() {
            assert!((x - y).abs() <= 1e-6 * x.abs().max(y.abs()).max(1e-3), "input {which} element {i}: AD {x} vs FD {y}");
        }
    }
}

/// Nested loops, the inner one reading and writing memory, the outer carrying a value that is
/// finally stored over an input: AD agrees with finite differences with loop bodies kept and
/// with them recomputed.
#[test]
fn nested_loops_through_memory() {
    let k = common::nested_loops_through_memory();
    let mut r = StdRng::seed_from_u64(14);
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[48], rand_f32(&mut r, 48)));
    let at = mem.add("acc", HostTensor::from_f32(&[48], rand_f32(&mut r, 48)));
    let launch = Launch::new(&k, 3).arg("x", xt).arg("acc", at);
    check("nested", &launch, &mem, &[xt, at], &[xt, at], 15);
    // The same with every loop body recomputed in the reverse sweep.
    let g: Vec<Vec<f64>> = (0..2).map(|_| (0..48).map(|_| r.gen_range(-1.0..1.0)).collect()).collect();
    let outs = [(xt, g[0].clone()), (at, g[1].clone())];
    let re = vjp(&launch, &mem, &[xt, at], &outs, &GradOptions { tape_budget: 0, ..GradOptions::default() }).unwrap();
    let fd = fd_vjp(&FdSpec::new(&launch, &mem, vec![xt, at], vec![xt, at]), &g, 1e-6).unwrap();
    for (a, f) in re.inputs.iter().zip(&fd) {
        for (x, y) in a.iter().zip(f) {
            assert!((x - y).abs() <= 1e-6 * x.abs().max(y.abs()).max(1e-3), "AD {x} vs FD {y}");
        }
    }
}

/// Kernels written in Triton's Python, converted by the front end, differentiated: the weighted
/// sum (block pointers advanced in a loop) and the row softmax agree with finite differences.
#[test]
fn triton_source_kernels_agree_with_finite_differences() {
    use tilegrad_ir::triton::{convert, ConvertOptions};
    let load = |file: &str, name: &str, consts: &[(&str, i64)]| {
        let path = format!("{}/examples/triton/{file}", env!("CARGO_MANIFEST_DIR"));
        let src = std::fs::read_to_string(&path).unwrap();
        convert(&src, &path, name, &ConvertOptions::with_constexprs(consts)).unwrap_or_else(|e| panic!("{e}"))
    };
    let mut r = StdRng::seed_from_u64(16);
    let (rows, d) = (45, 200);
    let k = load("weighted_sum.py", "weighted_sum_fwd", &[("ROWS_TILE_SIZE", 16), ("D_TILE_SIZE", 64)]);
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[rows, d], rand_f32(&mut r, rows * d)));
    let wt = mem.add("w", HostTensor::from_f32(&[d], rand_f32(&mut r, d)));
    let ot = mem.add("out", HostTensor::zeros(DType::F32, &[rows]));
    check("triton weighted_sum_fwd", &zoo::weighted_sum_fwd_launch(&k, &mem, xt, wt, ot).unwrap(), &mem, &[xt, wt], &[ot], 17);

    let (rows, cols) = (20, 100);
    let k = load("softmax.py", "softmax", &[("BLOCK_ROWS", 16), ("BLOCK_COLS", 128)]);
    let mut mem = Memory::new();
    let x = mem.add("x", HostTensor::from_f32(&[rows, cols], rand_f32(&mut r, rows * cols)));
    let y = mem.add("y", HostTensor::zeros(DType::F32, &[rows, cols]));
    check("triton softmax", &zoo::softmax_launch(&k, &mem, x, y).unwrap(), &mem, &[x], &[y], 18);
}

/// Long loops under a small tape budget: carried values are kept at every k-th trip only and the
/// reverse runs the segments between them again (recursively, down to two checkpoints a level
/// with no budget at all). A `while` loop and a `for` loop with a nested one and a load per trip:
/// the gradient is bit-identical to the one kept whole, and agrees with finite differences.
#[test]
fn checkpointed_loop_tapes_give_the_same_gradient() {
    use tilegrad_ir::triton::{convert, ConvertOptions};
    let src = r#"
import triton
import triton.language as tl

@triton.jit
def trips(x_ptr, y_ptr, TRIPS, INNER, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    i = 0
    while i < TRIPS:
        x = tl.sin(x)
        i += 1
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in range(TRIPS // 16):
        w = tl.load(x_ptr + (offs + j) % BLOCK)
        for k in range(INNER):
            acc = acc * 0.5 + w * tl.sin(acc + x)
    tl.store(y_ptr + offs, acc + x)
"#;
    let k = convert(src, "trips.py", "trips", &ConvertOptions::with_constexprs(&[("BLOCK", 16)])).unwrap_or_else(|e| panic!("{e}"));
    let mut r = StdRng::seed_from_u64(37);
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[16], rand_f32(&mut r, 16)));
    let yt = mem.add("y", HostTensor::zeros(DType::F32, &[16]));
    let launch = Launch::new(&k, 1).arg("x_ptr", xt).arg("y_ptr", yt).arg("TRIPS", 1000i32).arg("INNER", 3i32);
    let g: Vec<f64> = (0..16).map(|_| r.gen_range(-1.0..1.0)).collect();
    let outs = [(yt, g.clone())];
    let grad =
        |tape_budget: usize| vjp(&launch, &mem, &[xt], &outs, &GradOptions { tape_budget, ..GradOptions::default() }).unwrap().inputs;
    // Kept whole (snapshots of every trip), thinned to a stride of 32 or so, two per level.
    let kept = grad(16 << 20);
    for budget in [4096, 0] {
        assert_eq!(grad(budget), kept, "tape budget {budget}");
    }
    let fd = fd_vjp(&FdSpec::new(&launch, &mem, vec![xt], vec![yt]), &[g], 1e-6).unwrap();
    for (i, (x, y)) in kept[0].iter().zip(&fd[0]).enumerate() {
        assert!((x - y).abs() <= 1e-5 * x.abs().max(y.abs()).max(1e-3), "x[{i}]: AD {x} vs FD {y}");
    }
    assert!(kept[0].iter().all(|&v| v != 0.0));
}
