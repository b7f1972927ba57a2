//! Ground-truth gradients of whole launches against analytic gradients in f64: zoo kernels,
//! in-place updates, loads after a program's own stores, atomics, data-dependent loops, max
//! reductions, masked boundary tiles; races rejected; results independent of the thread count.

mod common;

use rand::{rngs::StdRng, Rng, SeedableRng};
use tilegrad::zoo;
use tilegrad_ad::{vjp, AdError, GradOptions};
use tilegrad_ir::{DType, KernelBuilder, Value};
use tilegrad_reference::{HostTensor, Launch, Memory};

fn rand_vec(r: &mut StdRng, n: usize) -> Vec<f64> {
    (0..n).map(|_| r.gen_range(-1.0..1.0)).collect()
}

fn f32s(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

/// Values of the f32 tensor as f64 (what the kernel actually reads).
fn as_read(v: &[f64]) -> Vec<f64> {
    v.iter().map(|&x| x as f32 as f64).collect()
}

#[track_caller]
fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1e-300f64, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * scale, "{what}[{i}]: got {g}, want {w} (tol {tol} x {scale})");
    }
    assert!(want.iter().any(|&w| w != 0.0), "{what}: vacuous (all-zero expectation)");
}

#[test]
fn weighted_sum_gradient_equals_the_analytic_gradient() {
    let mut r = StdRng::seed_from_u64(1);
    for (rows, d) in [(1000, 300), (17, 129)] {
        let (x, w, g) = (rand_vec(&mut r, rows * d), rand_vec(&mut r, d), rand_vec(&mut r, rows));
        let k = zoo::weighted_sum_fwd(16, 128).unwrap();
        let mut mem = Memory::new();
        let xt = mem.add("x", HostTensor::from_f32(&[rows, d], f32s(&x)));
        let wt = mem.add("w", HostTensor::from_f32(&[d], f32s(&w)));
        let ot = mem.add("out", HostTensor::zeros(DType::F32, &[rows]));
        let launch = zoo::weighted_sum_fwd_launch(&k, &mem, xt, wt, ot).unwrap();
        let grad = vjp(&launch, &mem, &[xt, wt], &[(ot, g.clone())], &GradOptions::default()).unwrap();
        let (x, w) = (as_read(&x), as_read(&w));
        let gx: Vec<f64> = (0..rows * d).map(|i| g[i / d] * w[i % d]).collect();
        let gw: Vec<f64> = (0..d).map(|j| (0..rows).map(|i| x[i * d + j] * g[i]).sum()).collect();
        // grad_x is one product per element: bit-exact. grad_w sums per row tile then over
        // tiles, the analytic sum runs over rows: equal up to f64 rounding of the order.
        assert_eq!(grad.inputs[0], gx, "grad_x exact");
        assert_close("grad_w", &grad.inputs[1], &gw, 1e-13);
        assert_eq!(grad.max_trips.values().copied().collect::<Vec<_>>(), vec![d.div_ceil(128) as u64]);
    }
}

#[test]
fn matmul_and_softmax_gradients() {
    let mut r = StdRng::seed_from_u64(2);
    let (m, n, kk) = (70, 45, 37);
    let (a, b, g) = (rand_vec(&mut r, m * kk), rand_vec(&mut r, kk * n), rand_vec(&mut r, m * n));
    let k = zoo::matmul(32, 32, 16, None).unwrap();
    let mut mem = Memory::new();
    let at = mem.add("a", HostTensor::from_f32(&[m, kk], f32s(&a)));
    let bt = mem.add("b", HostTensor::from_f32(&[kk, n], f32s(&b)));
    let ct = mem.add("c", HostTensor::zeros(DType::F32, &[m, n]));
    let launch = zoo::matmul_launch(&k, &mem, at, bt, ct).unwrap();
    let grad = vjp(&launch, &mem, &[at, bt], &[(ct, g.clone())], &GradOptions::default()).unwrap();
    let (a, b) = (as_read(&a), as_read(&b));
    // dA = G B^T, dB = A^T G (the ground truth ignores tf32: it is exact f64).
    let ga: Vec<f64> = (0..m * kk).map(|i| (0..n).map(|j| g[(i / kk) * n + j] * b[(i % kk) * n + j]).sum()).collect();
    let gb: Vec<f64> = (0..kk * n).map(|i| (0..m).map(|p| a[p * kk + i / n] * g[p * n + i % n]).sum()).collect();
    assert_close("dA", &grad.inputs[0], &ga, 1e-12);
    assert_close("dB", &grad.inputs[1], &gb, 1e-12);

    let (rows, cols) = (37, 300);
    let (x, gy) = (rand_vec(&mut r, rows * cols), rand_vec(&mut r, rows * cols));
    let k = zoo::softmax(16, 512).unwrap();
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[rows, cols], f32s(&x)));
    let yt = mem.add("y", HostTensor::zeros(DType::F32, &[rows, cols]));
    let launch = zoo::softmax_launch(&k, &mem, xt, yt).unwrap();
    let grad = vjp(&launch, &mem, &[xt], &[(yt, gy.clone())], &GradOptions::default()).unwrap();
    let x = as_read(&x);
    let mut gx = vec![0.0; rows * cols];
    for i in 0..rows {
        let row = &x[i * cols..(i + 1) * cols];
        let mx = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = row.iter().map(|v| (v - mx).exp()).collect();
        let s: f64 = e.iter().sum();
        let y: Vec<f64> = e.iter().map(|v| v / s).collect();
        let dot: f64 = (0..cols).map(|j| y[j] * gy[i * cols + j]).sum();
        for j in 0..cols {
            gx[i * cols + j] = y[j] * (gy[i * cols + j] - dot);
        }
    }
    assert_close("softmax dx", &grad.inputs[0], &gx, 1e-12);
}

/// `x[i] = 2 * x[i] + y[i]` in place, masked at the end.
#[test]
fn in_place_update_and_masked_boundary_tile() {
    let mut b = KernelBuilder::new("axpy_in_place");
    let x = b.ptr_param("x", DType::F32);
    let y = b.ptr_param("y", DType::F32);
    let n = b.scalar_param("n", DType::I32);
    let (offs, mask) = lanes(&mut b, 64, n);
    let px = b.add(x, offs);
    let py = b.add(y, offs);
    let xv = b.load(px, Some(mask), None);
    let yv = b.load(py, Some(mask), None);
    let two = b.f32(2.0);
    let t = b.mul(xv, two);
    let s = b.add(t, yv);
    b.store(px, s, Some(mask));
    let k = b.finish().unwrap();
    let mut r = StdRng::seed_from_u64(3);
    let len = 150; // x has 200 elements: 150..200 are never touched and pass through
    let (xs, ys, g) = (rand_vec(&mut r, 200), rand_vec(&mut r, 200), rand_vec(&mut r, 200));
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[200], f32s(&xs)));
    let yt = mem.add("y", HostTensor::from_f32(&[200], f32s(&ys)));
    let launch = Launch::new(&k, 3).arg("x", xt).arg("y", yt).arg("n", len as i32);
    let grad = vjp(&launch, &mem, &[xt, yt], &[(xt, g.clone())], &GradOptions::default()).unwrap();
    let gx: Vec<f64> = (0..200).map(|i| if i < len { 2.0 * g[i] } else { g[i] }).collect();
    let gy: Vec<f64> = (0..200).map(|i| if i < len { g[i] } else { 0.0 }).collect();
    assert_eq!(grad.inputs[0], gx);
    assert_eq!(grad.inputs[1], gy);
}

fn lanes(b: &mut KernelBuilder, block: usize, n: Value) -> (Value, Value) {
    let pid = b.program_id(0);
    let bs = b.i32(block as i32);
    let start = b.mul(pid, bs);
    let ar = b.arange(0, block as i64);
    let offs = b.add(start, ar);
    let mask = b.lt(offs, n);
    (offs, mask)
}

/// y = 3x is stored, read back, squared and stored again: y = 9x^2, dy/dx = 18x.
#[test]
fn load_after_own_store() {
    let mut b = KernelBuilder::new("store_load");
    let x = b.ptr_param("x", DType::F32);
    let y = b.ptr_param("y", DType::F32);
    let n = b.scalar_param("n", DType::I32);
    let (offs, mask) = lanes(&mut b, 32, n);
    let px = b.add(x, offs);
    let py = b.add(y, offs);
    let v = b.load(px, Some(mask), None);
    let three = b.f32(3.0);
    let t = b.mul(v, three);
    b.store(py, t, Some(mask));
    let w = b.load(py, Some(mask), None);
    let sq = b.mul(w, w);
    b.store(py, sq, Some(mask));
    let k = b.finish().unwrap();
    let mut r = StdRng::seed_from_u64(4);
    let nn = 70;
    let (xs, g) = (rand_vec(&mut r, nn), rand_vec(&mut r, nn));
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[nn], f32s(&xs)));
    let yt = mem.add("y", HostTensor::from_f32(&[nn], vec![5.0; nn]));
    let launch = Launch::new(&k, 3).arg("x", xt).arg("y", yt).arg("n", nn as i32);
    let grad = vjp(&launch, &mem, &[xt, yt], &[(yt, g.clone())], &GradOptions::default()).unwrap();
    let xs = as_read(&xs);
    let want: Vec<f64> = (0..nn).map(|i| 18.0 * xs[i] * g[i]).collect();
    assert_close("dx", &grad.inputs[0], &want, 1e-15);
    // y's initial contents are overwritten before being read: no gradient.
    assert!(grad.inputs[1].iter().all(|&v| v == 0.0));
}

#[test]
fn atomic_sum_and_data_dependent_loops() {
    let mut r = StdRng::seed_from_u64(5);
    let n = 1000;
    let (xs, g0) = (rand_vec(&mut r, n), 0.75);
    let k = zoo::atomic_sum(128).unwrap();
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[n], f32s(&xs)));
    let ot = mem.add("out", HostTensor::from_f32(&[1], vec![0.5]));
    let launch = zoo::atomic_sum_launch(&k, &mem, xt, ot).unwrap();
    let grad = vjp(&launch, &mem, &[xt, ot], &[(ot, vec![g0])], &GradOptions::default()).unwrap();
    assert_eq!(grad.inputs[0], vec![g0; n]);
    // out = out0 + sum: the initial value passes its cotangent through.
    assert_eq!(grad.inputs[1], vec![g0]);

    // Segment sums: one program per segment, a loop whose trip count is read from memory and
    // that has no max_iters: the bound is inferred from the run.
    let (starts, lengths, total) = zoo::random_segments(&mut r, 23, 300);
    let vals = rand_vec(&mut r, total);
    let g = rand_vec(&mut r, starts.len());
    let k = zoo::segment_sum(64).unwrap();
    let mut mem = Memory::new();
    let vt = mem.add("values", HostTensor::from_f32(&[total], f32s(&vals)));
    let st = mem.add("starts", HostTensor::from_i32(&[starts.len()], starts.clone()));
    let lt = mem.add("lengths", HostTensor::from_i32(&[lengths.len()], lengths.clone()));
    let ot = mem.add("out", HostTensor::zeros(DType::F32, &[starts.len()]));
    let launch = zoo::segment_sum_launch(&k, &mem, vt, st, lt, ot).unwrap();
    let grad = vjp(&launch, &mem, &[vt], &[(ot, g.clone())], &GradOptions::default()).unwrap();
    let mut want = vec![0.0; total];
    for (s, (&a, &l)) in starts.iter().zip(&lengths).enumerate() {
        for v in &mut want[a as usize..(a + l) as usize] {
            *v += g[s];
        }
    }
    assert_eq!(grad.inputs[0], want);
    let longest = lengths.iter().map(|&l| (l as u64).div_ceil(64)).max().unwrap();
    assert_eq!(grad.max_trips.values().copied().max(), Some(longest));
}

/// out[r] = max_j x[r, j] over distinct values: the gradient is one-hot at the argmax.
#[test]
fn max_reduction_sends_the_gradient_to_the_maximum() {
    let mut b = KernelBuilder::new("rowmax");
    let x = b.ptr_param("x", DType::F32);
    let out = b.ptr_param("out", DType::F32);
    let cols = b.scalar_param("cols", DType::I32);
    let pid = b.program_id(0);
    let ar = b.arange(0, 64);
    let m = b.lt(ar, cols);
    let base = b.mul(pid, cols);
    let offs = b.add(base, ar);
    let p = b.add(x, offs);
    let ninf = b.f32(f32::NEG_INFINITY);
    let v = b.load(p, Some(m), Some(ninf));
    let mx = b.max(v, Some(0), false);
    let po = b.add(out, pid);
    b.store(po, mx, None);
    let k = b.finish().unwrap();
    let mut r = StdRng::seed_from_u64(6);
    let (rows, c) = (9, 50);
    let (xs, g) = (rand_vec(&mut r, rows * c), rand_vec(&mut r, rows));
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[rows, c], f32s(&xs)));
    let ot = mem.add("out", HostTensor::zeros(DType::F32, &[rows]));
    let launch = Launch::new(&k, rows).arg("x", xt).arg("out", ot).arg("cols", c as i32);
    let grad = vjp(&launch, &mem, &[xt], &[(ot, g.clone())], &GradOptions::default()).unwrap();
    for i in 0..rows {
        let row = &xs[i * c..(i + 1) * c];
        let am = (0..c).fold(0, |best, j| if row[j] > row[best] { j } else { best });
        for j in 0..c {
            assert_eq!(grad.inputs[0][i * c + j], if j == am { g[i] } else { 0.0 }, "row {i} col {j}");
        }
    }
}

#[test]
fn a_racy_launch_is_an_error_naming_the_race() {
    let mut b = KernelBuilder::new("racy");
    let x = b.ptr_param("x", DType::F32);
    let out = b.ptr_param("out", DType::F32);
    let pid = b.program_id(0);
    let p = b.add(x, pid);
    let v = b.load(p, None, None);
    b.store(out, v, None);
    let k = b.finish().unwrap();
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[4], vec![1.0, 2.0, 3.0, 4.0]));
    let ot = mem.add("out", HostTensor::zeros(DType::F32, &[1]));
    let launch = Launch::new(&k, 4).arg("x", xt).arg("out", ot);
    let e = vjp(&launch, &mem, &[xt], &[(ot, vec![1.0])], &GradOptions::default()).unwrap_err();
    assert!(matches!(e, AdError::Exec(_)), "{e}");
    assert!(e.to_string().contains("race: two programs store to `out`[0]"), "{e}");
}

#[test]
fn gradients_do_not_depend_on_the_thread_count() {
    let mut r = StdRng::seed_from_u64(7);
    let (rows, d) = (333, 200);
    let (x, w, g) = (rand_vec(&mut r, rows * d), rand_vec(&mut r, d), rand_vec(&mut r, rows));
    let run = |threads: usize| {
        rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap().install(|| {
            let k = zoo::weighted_sum_fwd(16, 64).unwrap();
            let mut mem = Memory::new();
            let xt = mem.add("x", HostTensor::from_f32(&[rows, d], f32s(&x)));
            let wt = mem.add("w", HostTensor::from_f32(&[d], f32s(&w)));
            let ot = mem.add("out", HostTensor::zeros(DType::F32, &[rows]));
            let launch = zoo::weighted_sum_fwd_launch(&k, &mem, xt, wt, ot).unwrap();
            let opts = GradOptions { chunk_programs: Some(5), ..GradOptions::default() };
            vjp(&launch, &mem, &[xt, wt], &[(ot, g.clone())], &opts).unwrap().inputs
        })
    };
    let one = run(1);
    assert_eq!(one, run(2));
    assert_eq!(one, run(3));
}

#[test]
fn bad_specs_are_clear_errors() {
    let k = zoo::vector_add(64).unwrap();
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[10], vec![1.0; 10]));
    let yt = mem.add("y", HostTensor::from_f32(&[10], vec![2.0; 10]));
    let ot = mem.add("out", HostTensor::zeros(DType::F32, &[10]));
    let other = mem.add("unrelated", HostTensor::zeros(DType::F32, &[3]));
    let launch = zoo::vector_add_launch(&k, &mem, xt, yt, ot).unwrap();
    let o = GradOptions::default();
    let e = vjp(&launch, &mem, &[other], &[(ot, vec![1.0; 10])], &o).unwrap_err();
    assert_eq!(e.to_string(), "input tensor `unrelated` is not an argument of the launch of `vector_add`");
    let e = vjp(&launch, &mem, &[xt], &[(ot, vec![1.0; 3])], &o).unwrap_err();
    assert_eq!(e.to_string(), "cotangent of output `out` has 3 elements, the tensor has 10");

    let k = zoo::segment_sum(64).unwrap();
    let mut mem = Memory::new();
    let vt = mem.add("values", HostTensor::from_f32(&[4], vec![1.0; 4]));
    let st = mem.add("starts", HostTensor::from_i32(&[2], vec![0, 2]));
    let lt = mem.add("lengths", HostTensor::from_i32(&[2], vec![2, 2]));
    let ot = mem.add("out", HostTensor::zeros(DType::F32, &[2]));
    let launch = zoo::segment_sum_launch(&k, &mem, vt, st, lt, ot).unwrap();
    let e = vjp(&launch, &mem, &[st], &[(ot, vec![1.0; 2])], &o).unwrap_err();
    assert_eq!(e.to_string(), "input tensor `starts` is i32, not a float tensor");
}

/// Within the tape budget loop bodies are kept, beyond it recomputed from the taped carried
/// values: both give bit-identical gradients (here on a nested loop through memory too).
#[test]
fn recomputing_loop_bodies_gives_the_same_gradient() {
    let mut r = StdRng::seed_from_u64(8);
    let (rows, d) = (100, 300);
    let (x, w, g) = (rand_vec(&mut r, rows * d), rand_vec(&mut r, d), rand_vec(&mut r, rows));
    let k = zoo::weighted_sum_fwd(16, 64).unwrap();
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[rows, d], f32s(&x)));
    let wt = mem.add("w", HostTensor::from_f32(&[d], f32s(&w)));
    let ot = mem.add("out", HostTensor::zeros(DType::F32, &[rows]));
    let launch = zoo::weighted_sum_fwd_launch(&k, &mem, xt, wt, ot).unwrap();
    let kept = vjp(&launch, &mem, &[xt, wt], &[(ot, g.clone())], &GradOptions::default()).unwrap();
    let recomputed = GradOptions { tape_budget: 0, ..GradOptions::default() };
    let re = vjp(&launch, &mem, &[xt, wt], &[(ot, g.clone())], &recomputed).unwrap();
    assert_eq!(kept.inputs, re.inputs);

    // A matmul, whose loop body reads pointer tiles computed before the loop and read nowhere
    // after it (the recomputed body needs them in the reverse sweep).
    let (m, n, kk) = (37, 45, 70);
    let k = zoo::matmul(16, 16, 16, None).unwrap();
    let mut mem = Memory::new();
    let at = mem.add("a", HostTensor::from_f32(&[m, kk], f32s(&rand_vec(&mut r, m * kk))));
    let bt = mem.add("b", HostTensor::from_f32(&[kk, n], f32s(&rand_vec(&mut r, kk * n))));
    let ct = mem.add("c", HostTensor::zeros(DType::F32, &[m, n]));
    let launch = zoo::matmul_launch(&k, &mem, at, bt, ct).unwrap();
    let gc = [(ct, rand_vec(&mut r, m * n))];
    let kept = vjp(&launch, &mem, &[at, bt], &gc, &GradOptions::default()).unwrap();
    let re = vjp(&launch, &mem, &[at, bt], &gc, &recomputed).unwrap();
    assert_eq!(kept.inputs, re.inputs);
    assert!(kept.inputs.iter().all(|g| g.iter().any(|&v| v != 0.0)));

    // Nested loops, the inner one reading and writing memory.
    let k = common::nested_loops_through_memory();
    let (xs, accs) = (rand_vec(&mut r, 48), rand_vec(&mut r, 48));
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[48], f32s(&xs)));
    let at = mem.add("acc", HostTensor::from_f32(&[48], f32s(&accs)));
    let launch = Launch::new(&k, 3).arg("x", xt).arg("acc", at);
    let (gx, ga) = (rand_vec(&mut r, 48), rand_vec(&mut r, 48));
    let outs = [(xt, gx), (at, ga)];
    let kept = vjp(&launch, &mem, &[xt, at], &outs, &GradOptions::default()).unwrap();
    let re = vjp(&launch, &mem, &[xt, at], &outs, &recomputed).unwrap();
    assert_eq!(kept.inputs, re.inputs);
    assert!(kept.inputs[0].iter().any(|&v| v != 0.0) && kept.inputs[1].iter().any(|&v| v != 0.0));
}

/// Native precision evaluates the kernel's own dtypes (f32 here): its gradient is within f32
/// rounding of the f64 ground truth, and differs from it (so the option is not a no-op).
#[test]
fn native_precision_gradient_is_close_to_the_f64_one() {
    let mut r = StdRng::seed_from_u64(9);
    let (rows, cols) = (37, 300);
    let (x, gy) = (rand_vec(&mut r, rows * cols), rand_vec(&mut r, rows * cols));
    let k = zoo::softmax(16, 512).unwrap();
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[rows, cols], f32s(&x)));
    let yt = mem.add("y", HostTensor::zeros(DType::F32, &[rows, cols]));
    let launch = zoo::softmax_launch(&k, &mem, xt, yt).unwrap();
    let outs = [(yt, gy)];
    let exact = vjp(&launch, &mem, &[xt], &outs, &GradOptions::default()).unwrap();
    let native = GradOptions { precision: tilegrad_ad::Precision::Native, ..GradOptions::default() };
    let approx = vjp(&launch, &mem, &[xt], &outs, &native).unwrap();
    assert_close("native softmax dx", &approx.inputs[0], &exact.inputs[0], 1e-5);
    assert_ne!(approx.inputs[0], exact.inputs[0]);
}

#[test]
fn the_benchmarked_zoo_kernels_validate_themselves() {
    // Their gradients need no separate reference run (see `KernelFacts::self_checking`).
    use tilegrad_ad::graph::KernelGraph;
    let facts = |k: &tilegrad_ir::Kernel| {
        let slots: Vec<Option<u32>> = k
            .params
            .iter()
            .scan(0u32, |n, p| {
                Some(matches!(p.kind, tilegrad_ir::ParamKind::Ptr(_)).then(|| {
                    *n += 1;
                    *n - 1
                }))
            })
            .collect();
        KernelGraph::build(k, &slots).facts(k)
    };
    for k in [zoo::weighted_sum_fwd(16, 128).unwrap(), zoo::softmax(16, 1024).unwrap(), zoo::matmul(64, 64, 32, None).unwrap()] {
        assert!(facts(&k).self_checking, "{}", k.name);
    }
}
