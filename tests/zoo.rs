//! The kernel zoo against its f64 references, on the reference interpreter, at sizes that are not
//! multiples of the tiles.
//!
//! Tolerances are bounds on f32 rounding, as multiples of the unit roundoff u = 2^-24, applied to
//! `|got - expected| / scale` where `scale` is the magnitude of the computation (`|expected|` for
//! elementwise results, `sum |term|` for sums and dot products). A sum of n rounded terms in f32
//! errs by at most about (n + 1) u * sum |term| in any summation order; each bound below takes
//! that worst case with a factor 2 of margin, so a passing kernel is right to f32 accuracy and a
//! wrong lane (off by a whole term) fails by orders of magnitude.

use rand::rngs::StdRng;
use rand::SeedableRng;
use tilegrad::zoo::{self, F32_UNIT_ROUNDOFF as U};
use tilegrad_ir::{DType, DotPrecision};
use tilegrad_reference::{HostTensor, Memory, TensorId};

fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn zeros(mem: &mut Memory, name: &str, shape: &[usize]) -> TensorId {
    mem.add(name, HostTensor::zeros(DType::F32, shape))
}

/// Asserts `|got - expected| <= tol * scale` element by element, naming the worst element.
fn assert_close(what: &str, got: &[f64], expected: &[f64], scale: &[f64], tol: f64) {
    assert_eq!(got.len(), expected.len(), "{what}: length");
    let (abs, rel) = zoo::max_errors(got, expected, scale);
    if rel > tol {
        let worst = (0..got.len()).max_by(|&a, &b| {
            let ea = (got[a] - expected[a]).abs() / scale[a].abs().max(f64::MIN_POSITIVE);
            let eb = (got[b] - expected[b]).abs() / scale[b].abs().max(f64::MIN_POSITIVE);
            ea.partial_cmp(&eb).unwrap_or(std::cmp::Ordering::Greater)
        });
        let w = worst.unwrap_or(0);
        panic!("{what}: max scaled error {rel:e} > {tol:e} (max abs {abs:e}); worst at {w}: got {} expected {}", got[w], expected[w]);
    }
}

fn abs_of(v: &[f64]) -> Vec<f64> {
    v.iter().map(|x| x.abs()).collect()
}

#[test]
fn every_zoo_kernel_verifies() {
    for t in [16, 128, 1024] {
        zoo::vector_add(t).unwrap();
        zoo::copy(t).unwrap();
        zoo::l2_norm_partial(t).unwrap();
        zoo::l2_norm_finish(t).unwrap();
        zoo::atomic_sum(t).unwrap();
        zoo::segment_sum(t).unwrap();
    }
    zoo::rgb_to_grey(16, 32).unwrap();
    zoo::rgb_to_grey(1, 128).unwrap();
    for (r, d) in [(16, 128), (1, 16), (32, 64)] {
        zoo::weighted_sum_fwd(r, d).unwrap();
        zoo::weighted_sum_bwd(r, d).unwrap();
    }
    for p in [None, Some(DotPrecision::Ieee), Some(DotPrecision::Tf32)] {
        zoo::matmul(64, 64, 32, p).unwrap();
        zoo::matmul(16, 32, 16, p).unwrap();
    }
    zoo::softmax(16, 512).unwrap();
    zoo::softmax(1, 1024).unwrap();
}

#[test]
fn weighted_sum_forward_has_the_seed_structure() {
    // Block pointers lowered to boundary-masked loads with padding, one loop carrying the
    // accumulator and three block-pointer offsets (x: 2, weight: 1).
    let k = zoo::weighted_sum_fwd(16, 128).unwrap();
    let mut carried = Vec::new();
    k.walk(&mut |_, d: &tilegrad_ir::InstData| {
        if let tilegrad_ir::Op::For { max_iters, .. } = d.op {
            assert_eq!(max_iters, None);
            carried.push(d.args.len() - 3);
        }
    });
    assert_eq!(carried, vec![4]);
}

#[test]
fn tf32_rounding_is_round_to_nearest_even() {
    let ulp = 2f32.powi(-10); // tf32 spacing at 1.0
    assert_eq!(zoo::round_tf32(1.0), 1.0);
    assert_eq!(zoo::round_tf32(1.0 + ulp), 1.0 + ulp);
    assert_eq!(zoo::round_tf32(1.0 + 0.25 * ulp), 1.0); // below half: down
    assert_eq!(zoo::round_tf32(1.0 + 0.75 * ulp), 1.0 + ulp); // above half: up
    assert_eq!(zoo::round_tf32(1.0 + 0.5 * ulp), 1.0); // tie, to the even 1.0
    assert_eq!(zoo::round_tf32(1.0 + 1.5 * ulp), 1.0 + 2.0 * ulp); // tie, to the even 1 + 2 ulp
    assert_eq!(zoo::round_tf32(-(1.0 + 0.75 * ulp)), -(1.0 + ulp));
    assert_eq!(zoo::round_tf32(f32::INFINITY), f32::INFINITY);
    assert!(zoo::round_tf32(f32::NAN).is_nan());
}

#[test]
fn max_errors_catches_mismatches_and_nan() {
    assert_eq!(zoo::max_errors(&[1.0, 2.0], &[1.0, 2.0], &[1.0, 2.0]), (0.0, 0.0));
    let (a, r) = zoo::max_errors(&[1.0, 2.5], &[1.0, 2.0], &[1.0, 2.0]);
    assert_eq!((a, r), (0.5, 0.25));
    assert_eq!(zoo::max_errors(&[f64::NAN], &[1.0], &[1.0]).1, f64::INFINITY);
    assert_eq!(zoo::max_errors(&[1.0], &[1.0, 2.0], &[1.0, 2.0]).1, f64::INFINITY);
}

#[test]
fn vector_add_matches_reference() {
    for (n, block, seed) in [(1000, 256, 1), (37, 256, 2), (1000, 1024, 3)] {
        let mut r = rng(seed);
        let (xs, ys) = (zoo::uniform(&mut r, n), zoo::uniform(&mut r, n));
        let mut mem = Memory::new();
        let x = mem.add("x", HostTensor::from_f32(&[n], xs.clone()));
        let y = mem.add("y", HostTensor::from_f32(&[n], ys.clone()));
        let out = zeros(&mut mem, "out", &[n]);
        let k = zoo::vector_add(block).unwrap();
        let s = zoo::launch_vector_add(&k, &mut mem, x, y, out).unwrap();
        assert_eq!(s.programs, n.div_ceil(block) as u64);
        assert_eq!(s.elements_loaded, 2 * n as u64);
        assert_eq!(s.elements_stored, n as u64);
        let (xd, yd) = (f64s(&xs), f64s(&ys));
        let scale: Vec<f64> = xd.iter().zip(&yd).map(|(a, b)| a.abs() + b.abs()).collect();
        // One rounding of the exact sum: u.
        assert_close("vector_add", &mem[out].to_f64_vec(), &zoo::vector_add_ref(&xd, &yd), &scale, 2.0 * U);
    }
}

#[test]
fn copy_is_exact() {
    for (n, block, seed) in [(1000, 256, 4), (37, 256, 5)] {
        let xs = zoo::uniform(&mut rng(seed), n);
        let mut mem = Memory::new();
        let src = mem.add("src", HostTensor::from_f32(&[n], xs.clone()));
        let dst = mem.add("dst", HostTensor::from_f32(&[n], vec![7.0; n]));
        let k = zoo::copy(block).unwrap();
        zoo::launch_copy(&k, &mut mem, src, dst).unwrap();
        assert_eq!(mem[dst].as_f32().unwrap(), &xs[..]);
        assert_eq!(zoo::copy_ref(&f64s(&xs)), f64s(&xs));
    }
}

#[test]
fn rgb_to_grey_matches_reference() {
    for (h, w, seed) in [(67, 93, 6), (5, 3, 7)] {
        let px = zoo::uniform(&mut rng(seed), h * w * 3);
        let mut mem = Memory::new();
        let img = mem.add("img", HostTensor::from_f32(&[h, w, 3], px.clone()));
        let grey = zeros(&mut mem, "grey", &[h, w]);
        let k = zoo::rgb_to_grey(16, 32).unwrap();
        let s = zoo::launch_rgb_to_grey(&k, &mut mem, img, grey).unwrap();
        assert_eq!(s.programs, (h.div_ceil(16) * w.div_ceil(32)) as u64);
        assert_eq!(s.elements_stored, (h * w) as u64);
        let pd = f64s(&px);
        let scale: Vec<f64> = pd.chunks(3).map(|c| c.iter().zip(zoo::GREY_WEIGHTS).map(|(v, k)| (v * k as f64).abs()).sum()).collect();
        // Three rounded products and two rounded sums: 5u.
        assert_close("rgb_to_grey", &mem[grey].to_f64_vec(), &zoo::rgb_to_grey_ref(&pd, h, w), &scale, 10.0 * U);
    }
}

#[test]
fn weighted_sum_forward_matches_reference() {
    for (rows, d, rt, dt, seed) in [(1000, 300, 16, 128, 8), (17, 129, 16, 128, 9), (17, 129, 4, 16, 10)] {
        let mut r = rng(seed);
        let (xs, ws) = (zoo::uniform(&mut r, rows * d), zoo::uniform(&mut r, d));
        let mut mem = Memory::new();
        let x = mem.add("x", HostTensor::from_f32(&[rows, d], xs.clone()));
        let w = mem.add("weight", HostTensor::from_f32(&[d], ws.clone()));
        let out = zeros(&mut mem, "output", &[rows]);
        let k = zoo::weighted_sum_fwd(rt, dt).unwrap();
        let s = zoo::launch_weighted_sum_fwd(&k, &mut mem, x, w, out).unwrap();
        assert_eq!(s.programs, rows.div_ceil(rt) as u64);
        assert_eq!(s.max_trips.values().copied().collect::<Vec<_>>(), vec![d.div_ceil(dt) as u64]);
        let (xd, wd) = (f64s(&xs), f64s(&ws));
        let scale: Vec<f64> = (0..rows).map(|i| (0..d).map(|j| (xd[i * d + j] * wd[j]).abs()).sum()).collect();
        // d rounded products summed in f32: (d + 1)u.
        let tol = 2.0 * (d as f64 + 2.0) * U;
        assert_close("weighted_sum_fwd", &mem[out].to_f64_vec(), &zoo::weighted_sum_fwd_ref(&xd, &wd, rows, d), &scale, tol);
    }
}

#[test]
fn weighted_sum_backward_matches_reference() {
    for (rows, d, rt, dt, seed) in [(1000, 300, 16, 128, 11), (17, 129, 16, 128, 12), (17, 129, 4, 16, 13)] {
        let mut r = rng(seed);
        let (xs, ws, gs) = (zoo::uniform(&mut r, rows * d), zoo::uniform(&mut r, d), zoo::uniform(&mut r, rows));
        let mut mem = Memory::new();
        let x = mem.add("x", HostTensor::from_f32(&[rows, d], xs.clone()));
        let w = mem.add("weight", HostTensor::from_f32(&[d], ws.clone()));
        let g = mem.add("grad_output", HostTensor::from_f32(&[rows], gs.clone()));
        let gx = zeros(&mut mem, "grad_x", &[rows, d]);
        let tiles = rows.div_ceil(rt);
        let pgw = zeros(&mut mem, "partial_grad_weight", &[tiles, d]);
        let k = zoo::weighted_sum_bwd(rt, dt).unwrap();
        let s = zoo::launch_weighted_sum_bwd(&k, &mut mem, x, w, g, gx, pgw).unwrap();
        assert_eq!(s.programs, tiles as u64);
        assert_eq!(s.elements_stored, (rows * d + tiles * d) as u64);
        let (xd, wd, gd) = (f64s(&xs), f64s(&ws), f64s(&gs));
        let (gx_ref, gw_ref) = zoo::weighted_sum_bwd_ref(&xd, &wd, &gd, rows, d);
        // grad_x = g * w: one rounding.
        assert_close("grad_x", &mem[gx].to_f64_vec(), &gx_ref, &abs_of(&gx_ref), 2.0 * U);
        // grad_weight: f32 sums of `rt` products per tile, then the host sums tiles in f64.
        let gw = zoo::sum_partial_grad_weight(&mem[pgw]);
        let gw_scale: Vec<f64> = (0..d).map(|j| (0..rows).map(|i| (xd[i * d + j] * gd[i]).abs()).sum()).collect();
        assert_close("grad_weight", &gw, &gw_ref, &gw_scale, 2.0 * (rt as f64 + 2.0) * U);
    }
}

/// Runs the matmul kernel on random `[m, k] @ [k, n]`; returns (a, b, c) as f64.
fn run_matmul(m: usize, n: usize, k: usize, precision: Option<DotPrecision>, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f64>) {
    let mut r = rng(seed);
    let (a_s, b_s) = (zoo::uniform(&mut r, m * k), zoo::uniform(&mut r, k * n));
    let mut mem = Memory::new();
    let a = mem.add("a", HostTensor::from_f32(&[m, k], a_s.clone()));
    let b = mem.add("b", HostTensor::from_f32(&[k, n], b_s.clone()));
    let c = zeros(&mut mem, "c", &[m, n]);
    let kernel = zoo::matmul(64, 64, 32, precision).unwrap();
    let s = zoo::launch_matmul(&kernel, &mut mem, a, b, c).unwrap();
    assert_eq!(s.programs, (m.div_ceil(64) * n.div_ceil(64)) as u64);
    assert_eq!(s.elements_stored, (m * n) as u64);
    (a_s, b_s, mem[c].to_f64_vec())
}

#[test]
fn matmul_ieee_matches_f64_reference() {
    for (m, n, k, seed) in [(100, 70, 90, 14), (129, 65, 33, 15)] {
        let (a, b, c) = run_matmul(m, n, k, Some(DotPrecision::Ieee), seed);
        let (ad, bd) = (f64s(&a), f64s(&b));
        // Exact f32 products accumulated over K in f32: (K + 1)u of sum |a||b|.
        assert_close(
            "matmul ieee",
            &c,
            &zoo::matmul_ref(&ad, &bd, m, n, k),
            &zoo::matmul_scale(&ad, &bd, m, n, k),
            2.0 * (k as f64 + 2.0) * U,
        );
    }
}

#[test]
fn matmul_default_precision_is_tf32() {
    for (m, n, k, seed) in [(100, 70, 90, 16), (129, 65, 33, 17)] {
        let (a, b, c) = run_matmul(m, n, k, None, seed);
        let tf = |v: &[f32]| v.iter().map(|&x| zoo::round_tf32(x) as f64).collect::<Vec<f64>>();
        let (at, bt) = (tf(&a), tf(&b));
        // Products of tf32 values are exact in f32; only the f32 accumulation errs.
        let tol = 2.0 * (k as f64 + 2.0) * U;
        assert_close("matmul tf32", &c, &zoo::matmul_ref(&at, &bt, m, n, k), &zoo::matmul_scale(&at, &bt, m, n, k), tol);
        // And the operands really were rounded: against the exact product the error is that of
        // tf32 (about 2^-11 per operand), far above f32 accumulation.
        let (ad, bd) = (f64s(&a), f64s(&b));
        let (_, rel) = zoo::max_errors(&c, &zoo::matmul_ref(&ad, &bd, m, n, k), &zoo::matmul_scale(&ad, &bd, m, n, k));
        assert!(rel > tol, "tf32 result is as accurate as ieee ({rel:e} <= {tol:e}): operands not rounded");
    }
}

#[test]
fn softmax_matches_reference() {
    for (rows, cols, seed) in [(50, 300, 18), (3, 1000, 19)] {
        let xs = zoo::uniform(&mut rng(seed), rows * cols);
        let mut mem = Memory::new();
        let x = mem.add("x", HostTensor::from_f32(&[rows, cols], xs.clone()));
        let y = zeros(&mut mem, "y", &[rows, cols]);
        let k = zoo::softmax(16, cols.next_power_of_two()).unwrap();
        let s = zoo::launch_softmax(&k, &mut mem, x, y).unwrap();
        assert_eq!(s.programs, rows.div_ceil(16) as u64);
        assert_eq!(s.elements_stored, (rows * cols) as u64);
        let expected = zoo::softmax_ref(&f64s(&xs), rows, cols);
        // Subtraction, exp (its argument off by up to 2u), a sum of `cols` positive terms and a
        // division: about (cols + 6)u relative.
        assert_close("softmax", &mem[y].to_f64_vec(), &expected, &abs_of(&expected), 2.0 * (cols as f64 + 8.0) * U);
    }
}

#[test]
fn softmax_refuses_rows_wider_than_its_tile() {
    let mut mem = Memory::new();
    let x = mem.add("x", HostTensor::from_f32(&[2, 300], zoo::uniform(&mut rng(20), 600)));
    let y = zeros(&mut mem, "y", &[2, 300]);
    let k = zoo::softmax(16, 256).unwrap();
    assert!(zoo::launch_softmax(&k, &mut mem, x, y).is_err());
}

#[test]
fn l2_norm_two_kernels_match_reference() {
    // (n, first-stage block, second-stage block): the second stage loops over the partials in
    // several trips whenever partials > its block.
    for (n, b1, b2, seed) in [(1000, 256, 2, 21), (37, 256, 16, 22), (100_000, 256, 64, 23)] {
        let xs = zoo::uniform(&mut rng(seed), n);
        let parts = zoo::l2_norm_num_partials(n, b1);
        let mut mem = Memory::new();
        let x = mem.add("x", HostTensor::from_f32(&[n], xs.clone()));
        let partial = zeros(&mut mem, "partial", &[parts]);
        let out = zeros(&mut mem, "out", &[1]);
        let (k1, k2) = (zoo::l2_norm_partial(b1).unwrap(), zoo::l2_norm_finish(b2).unwrap());
        let (s1, s2) = zoo::launch_l2_norm((&k1, &k2), &mut mem, x, partial, out).unwrap();
        assert_eq!(s1.programs, parts as u64);
        assert_eq!(s2.programs, 1);
        assert_eq!(s2.max_trips.values().copied().collect::<Vec<_>>(), vec![parts.div_ceil(b2) as u64]);
        let xd = f64s(&xs);
        // Each partial: a sum of b1 squares (b1 + 1)u; the total of the partials adds parts u.
        let partial_ref: Vec<f64> = xd.chunks(b1).map(|c| c.iter().map(|v| v * v).sum()).collect();
        assert_close("partial", &mem[partial].to_f64_vec(), &partial_ref, &partial_ref, 2.0 * (b1 as f64 + 2.0) * U);
        let expected = [zoo::l2_norm_ref(&xd)];
        assert_close("l2_norm", &mem[out].to_f64_vec(), &expected, &expected, 2.0 * ((b1 + parts) as f64 + 3.0) * U);
    }
}

#[test]
fn atomic_sum_matches_reference() {
    for (n, block, seed) in [(1000, 256, 24), (37, 256, 25), (10_007, 64, 26)] {
        let xs = zoo::uniform(&mut rng(seed), n);
        let mut mem = Memory::new();
        let x = mem.add("x", HostTensor::from_f32(&[n], xs.clone()));
        let out = zeros(&mut mem, "out", &[1]);
        let k = zoo::atomic_sum(block).unwrap();
        let s = zoo::launch_atomic_sum(&k, &mut mem, x, out).unwrap();
        let programs = n.div_ceil(block);
        assert_eq!(s.programs, programs as u64);
        assert_eq!(s.elements_atomic, programs as u64);
        let xd = f64s(&xs);
        let scale = [xd.iter().map(|v| v.abs()).sum::<f64>()];
        // `block` terms per program, then one f32 addition per program.
        let tol = 2.0 * ((block + programs) as f64 + 2.0) * U;
        assert_close("atomic_sum", &mem[out].to_f64_vec(), &[zoo::atomic_sum_ref(&xd)], &scale, tol);
    }
}

#[test]
fn segment_sum_with_run_time_trip_counts() {
    for (segments, max_len, block, seed) in [(40, 700, 128, 27), (3, 50, 16, 28)] {
        let mut r = rng(seed);
        let (starts, lengths, total) = zoo::random_segments(&mut r, segments, max_len);
        let vs = zoo::uniform(&mut r, total);
        let mut mem = Memory::new();
        let v = mem.add("values", HostTensor::from_f32(&[total], vs.clone()));
        let st = mem.add("starts", HostTensor::from_i32(&[segments], starts.clone()));
        let ln = mem.add("lengths", HostTensor::from_i32(&[segments], lengths.clone()));
        // Poison the output: every segment, the empty ones too, must be written.
        let out = mem.add("out", HostTensor::from_f32(&[segments], vec![f32::NAN; segments]));
        let k = zoo::segment_sum(block).unwrap();
        let s = zoo::launch_segment_sum(&k, &mut mem, v, st, ln, out).unwrap();
        assert_eq!(s.programs, segments as u64);
        let longest = lengths.iter().copied().max().unwrap() as usize;
        assert_eq!(s.max_trips.values().copied().collect::<Vec<_>>(), vec![longest.div_ceil(block) as u64]);
        assert!(lengths.contains(&0));
        let vd = f64s(&vs);
        let scale: Vec<f64> =
            starts.iter().zip(&lengths).map(|(&s, &l)| vd[s as usize..(s + l) as usize].iter().map(|x| x.abs()).sum()).collect();
        let expected = zoo::segment_sum_ref(&vd, &starts, &lengths);
        // A sum of at most `longest` terms.
        assert_close("segment_sum", &mem[out].to_f64_vec(), &expected, &scale, 2.0 * (longest as f64 + 2.0) * U);
    }
}

#[test]
fn every_named_case_runs_within_tolerance() {
    assert!(!zoo::names().is_empty());
    for &name in zoo::names() {
        let run = zoo::run_case(name, 42).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(run.name, name);
        assert!(run.launches >= 1 && run.programs >= 1, "{name}: {run:?}");
        assert!(run.elements_loaded > 0, "{name}: {run:?}");
        assert!(!run.outputs.is_empty(), "{name}: {run:?}");
        assert!(run.max_rel_err.is_finite() && run.max_rel_err <= run.tolerance, "{name}: {run:?}");
        assert!(run.passed());
    }
}

#[test]
fn unknown_case_is_an_error() {
    let e = zoo::run_case("no_such_kernel", 0).unwrap_err();
    assert!(matches!(e, zoo::ZooError::UnknownCase(_)));
    assert!(e.to_string().contains("vector_add"));
}
