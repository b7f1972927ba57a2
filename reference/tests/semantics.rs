//! Launch semantics of the reference interpreter and its error messages: loads after own stores,
//! in-place updates, masks and `other`, atomics, races of every kind, out-of-bounds lanes, loop
//! bounds, argument checking, and determinism across thread counts.

use rand::{Rng, SeedableRng};
use tilegrad_ir::{DType, KernelBuilder, Value};
use tilegrad_reference::{ExecError, HostTensor, Launch, Memory, Options, RaceKind, RaceMode};

fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.gen_range(-1.0f32..1.0)).collect()
}

/// Offsets `pid * block + arange(block)` and the mask `offs < n`.
fn lanes(b: &mut KernelBuilder, block: usize, n: Value) -> (Value, Value) {
    let pid = b.program_id(0);
    let bs = b.i32(block as i32);
    let start = b.mul(pid, bs);
    let ar = b.arange(0, block as i64);
    let offs = b.add(start, ar);
    let mask = b.lt(offs, n);
    (offs, mask)
}

/// y[i] = x[i] * 2 + 1, masked.
fn scale_kernel(block: usize) -> tilegrad_ir::Kernel {
    let mut b = KernelBuilder::new("scale");
    let x = b.ptr_param("x", DType::F32);
    let y = b.ptr_param("y", DType::F32);
    let n = b.scalar_param("n", DType::I32);
    let (offs, mask) = lanes(&mut b, block, n);
    let px = b.add(x, offs);
    let v = b.load(px, Some(mask), None);
    let two = b.f32(2.0);
    let one = b.f32(1.0);
    let v2 = b.mul(v, two);
    let v3 = b.add(v2, one);
    let py = b.add(y, offs);
    b.store(py, v3, Some(mask));
    b.finish().unwrap()
}

#[test]
fn masked_elementwise_matches_loop() {
    let k = scale_kernel(64);
    for n in [1usize, 63, 64, 65, 1000] {
        let xs = rand_vec(n, n as u64);
        let mut mem = Memory::new();
        let x = mem.add("x", HostTensor::from_f32(&[n], xs.clone()));
        let y = mem.add("y", HostTensor::zeros(DType::F32, &[n]));
        let s = Launch::new(&k, n.div_ceil(64)).arg("x", x).arg("y", y).arg("n", n as i32).run(&mut mem).unwrap();
        assert_eq!(s.elements_loaded, n as u64);
        assert_eq!(s.elements_stored, n as u64);
        let got = mem[y].as_f32().unwrap();
        for i in 0..n {
            assert_eq!(got[i], xs[i] * 2.0 + 1.0, "element {i} of {n}");
        }
    }
}

#[test]
fn out_of_bounds_names_kernel_op_line_program_lane_and_offset() {
    let k = scale_kernel(64);
    let n = 100;
    let mut mem = Memory::new();
    let x = mem.add("x", HostTensor::from_f32(&[n], rand_vec(n, 1)));
    let y = mem.add("y", HostTensor::zeros(DType::F32, &[n]));
    // Claims 128 elements: program 1's lanes 36.. read past x's 100 elements.
    let e = Launch::new(&k, 2).arg("x", x).arg("y", y).arg("n", 128).run(&mut mem).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, ExecError::OutOfBounds { offset: 100, .. }), "{msg}");
    assert!(msg.contains("kernel `scale`"), "{msg}");
    assert!(msg.contains("op `load`"), "{msg}");
    assert!(msg.contains("semantics.rs:"), "{msg}");
    assert!(msg.contains("program (1, 0, 0)"), "{msg}");
    assert!(msg.contains("offset 100"), "{msg}");
    assert!(msg.contains("lane [36]"), "{msg}");
    // Nothing was written.
    assert!(mem[y].as_f32().unwrap().iter().all(|&v| v == 0.0));
}

#[test]
fn masked_off_lanes_may_point_anywhere_and_read_other() {
    let mut b = KernelBuilder::new("shifted");
    let x = b.ptr_param("x", DType::F32);
    let y = b.ptr_param("y", DType::F32);
    let n = b.scalar_param("n", DType::I32);
    let (offs, mask) = lanes(&mut b, 32, n);
    let big = b.i32(1 << 20);
    let far = b.add(offs, big);
    // Lanes beyond n point far outside x; they are masked, so they read `other`.
    let sel = b.where_(mask, offs, far);
    let px = b.add(x, sel);
    let other = b.f32(-7.5);
    let v = b.load(px, Some(mask), Some(other));
    let py = b.add(y, offs);
    let m2 = b.i32(64);
    let mask2 = b.lt(offs, m2);
    b.store(py, v, Some(mask2));
    let k = b.finish().unwrap();
    let xs = rand_vec(40, 3);
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[40], xs.clone()));
    let yt = mem.add("y", HostTensor::zeros(DType::F32, &[64]));
    Launch::new(&k, 2).arg("x", xt).arg("y", yt).arg("n", 40).run(&mut mem).unwrap();
    let got = mem[yt].as_f32().unwrap();
    for i in 0..64 {
        let want = if i < 40 { xs[i] } else { -7.5 };
        assert_eq!(got[i], want, "lane {i}");
    }
}

/// Each program writes its block of y, then reads it back (load after own store), doubles it and
/// writes it again; x is updated in place.
#[test]
fn loads_see_own_earlier_stores_and_in_place_updates() {
    let mut b = KernelBuilder::new("twice");
    let x = b.ptr_param("x", DType::F32);
    let y = b.ptr_param("y", DType::F32);
    let n = b.scalar_param("n", DType::I32);
    let (offs, mask) = lanes(&mut b, 16, n);
    let px = b.add(x, offs);
    let v = b.load(px, Some(mask), None);
    let py = b.add(y, offs);
    let three = b.f32(3.0);
    let v3 = b.mul(v, three);
    b.store(py, v3, Some(mask));
    let w = b.load(py, Some(mask), None);
    let w2 = b.add(w, w);
    b.store(py, w2, Some(mask));
    // In place: x[i] += 1, and a reload sees it.
    let one = b.f32(1.0);
    let v1 = b.add(v, one);
    b.store(px, v1, Some(mask));
    let again = b.load(px, Some(mask), None);
    let sum = b.add(again, w2);
    let last = b.add(py, offs); // y[2*i]: only in bounds for small i; masked below
    let lim = b.i32(8);
    let small = b.lt(offs, lim);
    let _ = (sum, last, small);
    b.store(py, sum, Some(mask));
    let k = b.finish().unwrap();
    let n = 37;
    let xs = rand_vec(n, 4);
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[n], xs.clone()));
    let yt = mem.add("y", HostTensor::zeros(DType::F32, &[n]));
    Launch::new(&k, 3).arg("x", xt).arg("y", yt).arg("n", n as i32).run(&mut mem).unwrap();
    let (gx, gy) = (mem[xt].as_f32().unwrap(), mem[yt].as_f32().unwrap());
    for i in 0..n {
        assert_eq!(gx[i], xs[i] + 1.0);
        let w2 = (xs[i] * 3.0) + (xs[i] * 3.0);
        assert_eq!(gy[i], (xs[i] + 1.0) + w2);
    }
}

/// Every program loads, adds and stores one shared accumulator: right when run sequentially,
/// wrong on a GPU. It must be reported as a race, not silently summed.
#[test]
fn shared_accumulator_without_atomics_is_a_race() {
    let mut b = KernelBuilder::new("bad_sum");
    let x = b.ptr_param("x", DType::F32);
    let out = b.ptr_param("out", DType::F32);
    let n = b.scalar_param("n", DType::I32);
    let (offs, mask) = lanes(&mut b, 16, n);
    let px = b.add(x, offs);
    let v = b.load(px, Some(mask), None);
    let s = b.sum(v, None, false);
    let acc = b.load(out, None, None);
    let t = b.add(acc, s);
    b.store(out, t, None);
    let k = b.finish().unwrap();
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[40], rand_vec(40, 5)));
    let ot = mem.add("out", HostTensor::zeros(DType::F32, &[1]));
    let e = Launch::new(&k, 3).arg("x", xt).arg("out", ot).arg("n", 40).run(&mut mem).unwrap_err();
    let ExecError::Race(r) = &e else { panic!("expected a race, got {e}") };
    assert_eq!(r.kind, RaceKind::WriteWrite);
    assert_eq!(r.tensor, "out");
    assert_eq!(r.offset, 0);
    assert_eq!(r.first.pid, [0, 0, 0]);
    assert_eq!(r.second.pid, [1, 0, 0]);
    assert!(e.to_string().contains("two programs store to `out`[0]"), "{e}");

    // In warn mode the launch completes and lists the races.
    let s = Launch::new(&k, 3)
        .arg("x", xt)
        .arg("out", ot)
        .arg("n", 40)
        .options(Options { races: RaceMode::Warn, ..Options::default() })
        .run(&mut mem)
        .unwrap();
    assert!(s.races.iter().any(|r| r.kind == RaceKind::WriteWrite));
    assert!(s.races.iter().any(|r| r.kind == RaceKind::ReadWrite));
}

#[test]
fn reading_what_another_program_writes_is_a_race() {
    // Program p writes y[p] and reads y[p + 1].
    let mut b = KernelBuilder::new("neighbour");
    let y = b.ptr_param("y", DType::F32);
    let pid = b.program_id(0);
    let one = b.i32(1);
    let nxt = b.add(pid, one);
    let pn = b.add(y, nxt);
    let v = b.load(pn, None, None);
    let pp = b.add(y, pid);
    b.store(pp, v, None);
    let k = b.finish().unwrap();
    let mut mem = Memory::new();
    let yt = mem.add("y", HostTensor::from_f32(&[5], rand_vec(5, 6)));
    let e = Launch::new(&k, 4).arg("y", yt).run(&mut mem).unwrap_err();
    let ExecError::Race(r) = &e else { panic!("expected a race, got {e}") };
    assert_eq!(r.kind, RaceKind::ReadWrite);
    assert_eq!(r.offset, 1);
    assert_eq!((r.first.pid[0], r.second.pid[0]), (1, 0));
    assert_eq!(r.first.op, "store");
    assert_eq!(r.second.op, "load");
}

#[test]
fn one_store_writing_an_element_twice_is_a_race() {
    let mut b = KernelBuilder::new("dup");
    let y = b.ptr_param("y", DType::F32);
    let ar = b.arange(0, 8);
    let two = b.i32(2);
    let half = b.floordiv(ar, two);
    let p = b.add(y, half);
    let v = b.cast(ar, DType::F32);
    b.store(p, v, None);
    let k = b.finish().unwrap();
    let mut mem = Memory::new();
    let yt = mem.add("y", HostTensor::zeros(DType::F32, &[4]));
    let e = Launch::new(&k, 1).arg("y", yt).run(&mut mem).unwrap_err();
    let ExecError::Race(r) = &e else { panic!("expected a race, got {e}") };
    assert_eq!(r.kind, RaceKind::DuplicateLanes);
    assert!(e.to_string().contains("two lanes of one store write `y`[0]"), "{e}");
}

fn atomic_sum_kernel() -> tilegrad_ir::Kernel {
    let mut b = KernelBuilder::new("atomic_sum");
    let x = b.ptr_param("x", DType::F32);
    let out = b.ptr_param("out", DType::F32);
    let n = b.scalar_param("n", DType::I32);
    let (offs, mask) = lanes(&mut b, 16, n);
    let px = b.add(x, offs);
    let v = b.load(px, Some(mask), None);
    let s = b.sum(v, None, false);
    b.atomic_add(out, s, None);
    b.finish().unwrap()
}

#[test]
fn atomic_add_sums_in_program_order_for_any_thread_count() {
    let k = atomic_sum_kernel();
    let n = 1000;
    let xs = rand_vec(n, 7);
    let run = |threads: usize, chunk: usize| -> f32 {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let mut mem = Memory::new();
            let xt = mem.add("x", HostTensor::from_f32(&[n], xs.clone()));
            let ot = mem.add("out", HostTensor::from_f32(&[1], vec![0.5]));
            Launch::new(&k, n.div_ceil(16))
                .arg("x", xt)
                .arg("out", ot)
                .arg("n", n as i32)
                .options(Options { chunk_programs: chunk, ..Options::default() })
                .run(&mut mem)
                .unwrap();
            mem[ot].as_f32().unwrap()[0]
        })
    };
    let a = run(1, 4096);
    assert_eq!(a.to_bits(), run(2, 4096).to_bits());
    assert_eq!(a.to_bits(), run(4, 3).to_bits());
    let want: f64 = 0.5 + xs.iter().map(|&v| v as f64).sum::<f64>();
    assert!((a as f64 - want).abs() < 1e-4, "{a} vs {want}");
}

#[test]
fn loading_an_atomically_updated_element_from_another_program_is_a_race() {
    let mut b = KernelBuilder::new("atomic_then_read");
    let out = b.ptr_param("out", DType::F32);
    let one = b.f32(1.0);
    b.atomic_add(out, one, None);
    let v = b.load(out, None, None);
    let _ = v;
    let k = b.finish().unwrap();
    let mut mem = Memory::new();
    let ot = mem.add("out", HostTensor::zeros(DType::F32, &[1]));
    // One program: fine, and it sees its own contribution.
    Launch::new(&k, 1).arg("out", ot).run(&mut mem).unwrap();
    assert_eq!(mem[ot].as_f32().unwrap()[0], 1.0);
    let e = Launch::new(&k, 2).arg("out", ot).run(&mut mem).unwrap_err();
    assert!(matches!(&e, ExecError::Race(r) if r.kind == RaceKind::ReadWrite), "{e}");
}

#[test]
fn dynamic_loop_and_max_iters_bound() {
    // out[0] = sum_{i < n} i, computed with a loop whose trip count is a runtime scalar.
    let build = |max_iters: Option<u32>| {
        let mut b = KernelBuilder::new("tri");
        let out = b.ptr_param("out", DType::I32);
        let n = b.scalar_param("n", DType::I32);
        let zero = b.i32(0);
        let one = b.i32(1);
        let r = b.for_range(zero, n, one, max_iters, &[zero], |b, i, c| vec![b.add(c[0], i)]);
        b.store(out, r[0], None);
        b.finish().unwrap()
    };
    let k = build(None);
    let mut mem = Memory::new();
    let ot = mem.add("out", HostTensor::zeros(DType::I32, &[1]));
    let s = Launch::new(&k, 1).arg("out", ot).arg("n", 10).run(&mut mem).unwrap();
    assert_eq!(mem[ot].as_i32().unwrap()[0], 45);
    assert_eq!(s.max_trips.values().copied().collect::<Vec<_>>(), vec![10]);

    let k = build(Some(8));
    let e = Launch::new(&k, 1).arg("out", ot).arg("n", 10).run(&mut mem).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, ExecError::LoopBound { trips: 10, max_iters: 8, .. }), "{msg}");
    assert!(msg.contains("op `for`") && msg.contains("loop ran 10 iterations, more than its max_iters = 8"), "{msg}");
    // Within the bound it runs.
    Launch::new(&k, 1).arg("out", ot).arg("n", 8).run(&mut mem).unwrap();
    assert_eq!(mem[ot].as_i32().unwrap()[0], 28);
}

#[test]
fn a_for_loop_of_more_trips_than_the_limit_is_refused_before_its_first() {
    // `for i in range(0, n)` with n past 10^7 and no `max_iters`: an error at once, not hours.
    let mut b = KernelBuilder::new("long");
    let out = b.ptr_param("out", DType::I64);
    let n = b.scalar_param("n", DType::I64);
    let (zero, one) = (b.i64(0), b.i64(1));
    let r = b.for_range(zero, n, one, None, &[zero], |b, i, c| vec![b.add(c[0], i)]);
    b.store(out, r[0], None);
    let k = b.finish().unwrap();
    let mut mem = Memory::new();
    let ot = mem.add("out", HostTensor::zeros(DType::I64, &[1]));
    let t = std::time::Instant::now();
    let e = Launch::new(&k, 1).arg("out", ot).arg("n", 1i64 << 40).run(&mut mem).unwrap_err();
    assert!(e.to_string().contains("op `for`") && e.to_string().contains("more than 10000000 trips"), "{e}");
    assert!(e.to_string().contains(&tilegrad_reference::long_for_message()), "{e}");
    assert!(t.elapsed().as_secs() < 5);
    // A loop within it runs.
    Launch::new(&k, 1).arg("out", ot).arg("n", 1000i64).run(&mut mem).unwrap();
    assert_eq!(mem[ot].as_i64().unwrap()[0], 1000 * 999 / 2);
}

#[test]
fn argument_errors_are_clear() {
    let k = scale_kernel(64);
    let mut mem = Memory::new();
    let x = mem.add("x", HostTensor::from_f32(&[4], rand_vec(4, 8)));
    let xi = mem.add("xi", HostTensor::from_i32(&[4], vec![1, 2, 3, 4]));
    let y = mem.add("y", HostTensor::zeros(DType::F32, &[4]));

    let e = Launch::new(&k, 1).arg("x", x).arg("y", y).run(&mut mem).unwrap_err();
    assert_eq!(e.to_string(), "kernel `scale`, argument `n`: missing argument");

    let e = Launch::new(&k, 1).arg("x", xi).arg("y", y).arg("n", 4).run(&mut mem).unwrap_err();
    assert_eq!(e.to_string(), "kernel `scale`, argument `x`: expected a tensor of f32, got `xi` of i32");

    let e = Launch::new(&k, 1).arg("x", x).arg("y", y).arg("n", 4.5f32).run(&mut mem).unwrap_err();
    assert_eq!(e.to_string(), "kernel `scale`, argument `n`: expected a i32 scalar, got 4.5");

    let e = Launch::new(&k, 1).arg("x", x).arg("y", y).arg("n", 4).arg("z", 1).run(&mut mem).unwrap_err();
    assert!(e.to_string().starts_with("kernel `scale`, argument `z`: the kernel has no such parameter"), "{e}");

    let e = Launch::new(&k, 1).arg("x", 3).arg("y", y).arg("n", 4).run(&mut mem).unwrap_err();
    assert!(e.to_string().contains("expected a tensor of f32, got the scalar 3"), "{e}");

    let e = Launch::new(&k, (0, 1)).arg("x", x).arg("y", y).arg("n", 4).run(&mut mem).unwrap_err();
    assert!(e.to_string().contains("bad grid [0, 1, 1]"), "{e}");
}

#[test]
fn constexpr_arguments_must_match_the_binding() {
    let mut b = KernelBuilder::new("cx");
    let out = b.ptr_param("out", DType::I32);
    let blk = b.constexpr("BLOCK", 16);
    b.store(out, blk, None);
    let k = b.finish().unwrap();
    let mut mem = Memory::new();
    let ot = mem.add("out", HostTensor::zeros(DType::I32, &[1]));
    Launch::new(&k, 1).arg("out", ot).run(&mut mem).unwrap();
    assert_eq!(mem[ot].as_i32().unwrap()[0], 16);
    Launch::new(&k, 1).arg("out", ot).arg("BLOCK", 16).run(&mut mem).unwrap();
    let e = Launch::new(&k, 1).arg("out", ot).arg("BLOCK", 32).run(&mut mem).unwrap_err();
    assert!(e.to_string().contains("built with BLOCK = 16, the launch passes 32"), "{e}");
}

#[test]
fn integer_division_by_zero_is_an_error_with_location() {
    let mut b = KernelBuilder::new("divz");
    let out = b.ptr_param("out", DType::I32);
    let d = b.scalar_param("d", DType::I32);
    let ar = b.arange(0, 4);
    let q = b.floordiv(ar, d);
    let p = b.add(out, ar);
    b.store(p, q, None);
    let k = b.finish().unwrap();
    let mut mem = Memory::new();
    let ot = mem.add("out", HostTensor::zeros(DType::I32, &[4]));
    let e = Launch::new(&k, 1).arg("out", ot).arg("d", 0).run(&mut mem).unwrap_err();
    assert!(e.to_string().contains("op `floordiv`") && e.to_string().contains("integer division by zero"), "{e}");
    Launch::new(&k, 1).arg("out", ot).arg("d", -3).run(&mut mem).unwrap();
    assert_eq!(mem[ot].as_i32().unwrap(), &[0, 0, 0, -1]);
}

#[test]
fn if_else_on_scalar_and_num_programs() {
    // Even programs write +pid, odd programs write -num_programs.
    let mut b = KernelBuilder::new("branch");
    let out = b.ptr_param("out", DType::I32);
    let pid = b.program_id(0);
    let two = b.i32(2);
    let r = b.rem(pid, two);
    let zero = b.i32(0);
    let even = b.eq(r, zero);
    let v = b.if_else(
        even,
        |_| vec![pid],
        |b| {
            let np = b.num_programs(0);
            vec![b.neg(np)]
        },
    );
    let p = b.add(out, pid);
    b.store(p, v[0], None);
    let k = b.finish().unwrap();
    let mut mem = Memory::new();
    let ot = mem.add("out", HostTensor::zeros(DType::I32, &[5]));
    Launch::new(&k, 5).arg("out", ot).run(&mut mem).unwrap();
    assert_eq!(mem[ot].as_i32().unwrap(), &[0, -5, 2, -5, 4]);
}

#[test]
fn two_dimensional_grid_program_ids() {
    let mut b = KernelBuilder::new("grid2");
    let out = b.ptr_param("out", DType::I32);
    let p0 = b.program_id(0);
    let p1 = b.program_id(1);
    let g0 = b.num_programs(0);
    let row = b.mul(p1, g0);
    let idx = b.add(row, p0);
    let hundred = b.i32(100);
    let v = b.mul(p1, hundred);
    let v = b.add(v, p0);
    let p = b.add(out, idx);
    b.store(p, v, None);
    let k = b.finish().unwrap();
    let mut mem = Memory::new();
    let ot = mem.add("out", HostTensor::zeros(DType::I32, &[6]));
    Launch::new(&k, (3, 2)).arg("out", ot).run(&mut mem).unwrap();
    assert_eq!(mem[ot].as_i32().unwrap(), &[0, 1, 2, 100, 101, 102]);
}

#[test]
fn f16_tensors_compute_in_f16() {
    let mut b = KernelBuilder::new("h");
    let x = b.ptr_param("x", DType::F16);
    let y = b.ptr_param("y", DType::F16);
    let ar = b.arange(0, 4);
    let px = b.add(x, ar);
    let v = b.load(px, None, None);
    let eps = b.constant(1e-4, DType::F16);
    let w = b.add(v, eps);
    let py = b.add(y, ar);
    b.store(py, w, None);
    let k = b.finish().unwrap();
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f64_as(DType::F16, &[4], &[1.0, 2.0, 1e-3, -1.0]));
    let yt = mem.add("y", HostTensor::zeros(DType::F16, &[4]));
    Launch::new(&k, 1).arg("x", xt).arg("y", yt).run(&mut mem).unwrap();
    let got = mem[yt].as_f32().unwrap();
    assert_eq!(got[0], 1.0); // 1 + 1e-4 rounds back to 1 in f16
    assert_eq!(got[1], 2.0);
    let want = half::f16::from_f32(half::f16::from_f64(1e-3).to_f32() + half::f16::from_f64(1e-4).to_f32()).to_f32();
    assert_eq!(got[2], want);
}

#[test]
fn aliased_parameters_share_one_tensor() {
    // x and y are the same tensor: program p reads x[p] and writes y[p] (in place through an alias).
    let mut b = KernelBuilder::new("alias");
    let x = b.ptr_param("x", DType::F32);
    let y = b.ptr_param("y", DType::F32);
    let pid = b.program_id(0);
    let px = b.add(x, pid);
    let v = b.load(px, None, None);
    let w = b.mul(v, v);
    let py = b.add(y, pid);
    b.store(py, w, None);
    let k = b.finish().unwrap();
    let xs = rand_vec(6, 9);
    let mut mem = Memory::new();
    let t = mem.add("t", HostTensor::from_f32(&[6], xs.clone()));
    Launch::new(&k, 6).arg("x", t).arg("y", t).run(&mut mem).unwrap();
    let got = mem[t].as_f32().unwrap();
    for i in 0..6 {
        assert_eq!(got[i], xs[i] * xs[i]);
    }
    // With a shift, program p reads what program p+1 writes: a race through the alias.
    let mut b = KernelBuilder::new("alias_shift");
    let x = b.ptr_param("x", DType::F32);
    let y = b.ptr_param("y", DType::F32);
    let pid = b.program_id(0);
    let one = b.i32(1);
    let q = b.add(pid, one);
    let px = b.add(x, q);
    let v = b.load(px, None, None);
    let py = b.add(y, pid);
    b.store(py, v, None);
    let k = b.finish().unwrap();
    let e = Launch::new(&k, 5).arg("x", t).arg("y", t).run(&mut mem).unwrap_err();
    assert!(matches!(&e, ExecError::Race(r) if r.kind == RaceKind::ReadWrite && r.tensor == "t"), "{e}");
}

/// Large outputs reuse buffers released by earlier launches; elements no program stores must
/// still come out with their initial values (contiguous stores: interval ownership; strided
/// stores: the per-element owner table).
#[test]
fn reused_output_buffers_keep_unstored_elements() {
    let n = 200_000;
    let k = scale_kernel(1024);
    let xs = rand_vec(n, 10);
    // Every launch leaves its replaced output buffer to the next ones.
    let mut mem = Memory::new();
    let x = mem.add("x", HostTensor::from_f32(&[n], xs.clone()));
    for round in 0..3 {
        let y = mem.add("y", HostTensor::from_f32(&[n], vec![7.0 + round as f32; n]));
        let half = n / 2 + round * 1000;
        Launch::new(&k, n.div_ceil(1024)).arg("x", x).arg("y", y).arg("n", half as i32).run(&mut mem).unwrap();
        let got = mem[y].as_f32().unwrap();
        for i in [0, half - 1, half, half + 1, n - 1] {
            let want = if i < half { xs[i] * 2.0 + 1.0 } else { 7.0 + round as f32 };
            assert_eq!(got[i], want, "round {round}, element {i}");
        }
        assert!(got[half..].iter().all(|&v| v == 7.0 + round as f32), "round {round}");
    }
    // Strided stores (every other element): too many runs for intervals.
    let mut b = KernelBuilder::new("evens");
    let y = b.ptr_param("y", DType::F32);
    let m = b.scalar_param("m", DType::I32);
    let (offs, mask) = lanes(&mut b, 1024, m);
    let two = b.i32(2);
    let even = b.mul(offs, two);
    let p = b.add(y, even);
    let v = b.cast(offs, DType::F32);
    b.store(p, v, Some(mask));
    let k = b.finish().unwrap();
    for round in 0..3 {
        let y = mem.add("y", HostTensor::from_f32(&[n], vec![-3.0 - round as f32; n]));
        Launch::new(&k, (n / 2).div_ceil(1024)).arg("y", y).arg("m", (n / 2) as i32).run(&mut mem).unwrap();
        for (i, &got) in mem[y].as_f32().unwrap().iter().enumerate() {
            let want = if i % 2 == 0 { (i / 2) as f32 } else { -3.0 - round as f32 };
            assert_eq!(got, want, "round {round}, element {i}");
        }
    }
}

/// y[i] = sum over the masked tile `x[pid*block .. pid*block + block]` (lanes past `n` masked off,
/// no `other`), stored to every lane of the program's tile (masked).
fn tile_sum_kernel(block: usize) -> tilegrad_ir::Kernel {
    let mut b = KernelBuilder::new("tile_sum");
    let x = b.ptr_param("x", DType::F32);
    let y = b.ptr_param("y", DType::F32);
    let n = b.scalar_param("n", DType::I32);
    let (offs, mask) = lanes(&mut b, block, n);
    let px = b.add(x, offs);
    let v = b.load(px, Some(mask), None);
    let s = b.sum(v, None, false);
    let z = b.zeros(&[block], DType::F32);
    let s = b.add(z, s);
    let py = b.add(y, offs);
    b.store(py, s, Some(mask));
    b.finish().unwrap()
}

#[test]
fn poisoned_masked_loads_read_nan_only_when_asked() {
    let k = tile_sum_kernel(16);
    let n = 40; // the last tile has 8 masked-off lanes
    let xs = rand_vec(n, 3);
    let run = |poison: u64| {
        let mut mem = Memory::new();
        let x = mem.add("x", HostTensor::from_f32(&[n], xs.clone()));
        let y = mem.add("y", HostTensor::zeros(DType::F32, &[n]));
        let opts = Options { poison_masked_loads: poison, ..Options::default() };
        Launch::new(&k, 3).arg("x", x).arg("y", y).arg("n", n as i32).options(opts).run(&mut mem).unwrap();
        mem[y].as_f32().unwrap().to_vec()
    };
    let (plain, poisoned) = (run(0), run(tilegrad_reference::POISON_ALL));
    let last: f32 = xs[32..].iter().sum();
    assert!((plain[39] - last).abs() < 1e-5, "{} vs {last}", plain[39]);
    // Full tiles are unaffected; the ragged tile's reduction sees the undefined lanes.
    assert_eq!(&plain[..32], &poisoned[..32]);
    assert!(poisoned[32..].iter().all(|v| v.is_nan()));
}

#[test]
fn recorded_writers_name_program_and_store() {
    let k = scale_kernel(16);
    let n = 40;
    let mut mem = Memory::new();
    let x = mem.add("x", HostTensor::from_f32(&[n], rand_vec(n, 4)));
    let y = mem.add("y", HostTensor::zeros(DType::F32, &[n + 5]));
    let opts = Options { record_writers: true, ..Options::default() };
    let s = Launch::new(&k, 3).arg("x", x).arg("y", y).arg("n", n as i32).options(opts).run(&mut mem).unwrap();
    assert_eq!(s.writers.len(), 1);
    let w = &s.writers[0];
    assert_eq!(w.tensor, y);
    let mut store = None;
    k.walk(&mut |i, d| {
        if d.op.mnemonic() == "store" {
            store = Some(i);
        }
    });
    let store = store.unwrap();
    for e in 0..n {
        assert_eq!(w.of(e), Some(((e / 16) as u32, store)), "element {e}");
    }
    for e in n..n + 5 {
        assert_eq!(w.of(e), None, "element {e}");
    }
    // Without the option nothing is recorded.
    let s = Launch::new(&k, 3).arg("x", x).arg("y", y).arg("n", n as i32).run(&mut mem).unwrap();
    assert!(s.writers.is_empty());
}

#[test]
fn the_fast_path_records_the_writers_the_exact_path_records() {
    let k = scale_kernel(16);
    let n = 40;
    let mut mem = Memory::new();
    let x = mem.add("x", HostTensor::from_f32(&[n], rand_vec(n, 4)));
    let y = mem.add("y", HostTensor::zeros(DType::F32, &[n + 5]));
    let run = |races: RaceMode, mem: &mut Memory| {
        let opts = Options { record_writers: true, races, ..Options::default() };
        Launch::new(&k, 3).arg("x", x).arg("y", y).arg("n", n as i32).options(opts).run(mem).unwrap().writers
    };
    // Races as errors take the fast path; as warnings, the exact one.
    let fast = run(RaceMode::Error, &mut mem.clone());
    let exact = run(RaceMode::Warn, &mut mem);
    assert_eq!(fast.len(), 1);
    for e in 0..n + 5 {
        assert_eq!(fast[0].of(e), exact[0].of(e), "element {e}");
    }
}

#[test]
fn check_reports_what_run_reports_and_leaves_memory_unchanged() {
    // Large enough for pooled output buffers (a check recycles its discarded results).
    let k = scale_kernel(64);
    let n = 70_001;
    let mut mem = Memory::new();
    let x = mem.add("x", HostTensor::from_f32(&[n], rand_vec(n, 9)));
    let y = mem.add("y", HostTensor::from_f32(&[n], rand_vec(n, 10)));
    let before = mem.clone();
    let launch = Launch::new(&k, n.div_ceil(64)).arg("x", x).arg("y", y).arg("n", n as i32);
    let checked = launch.check(&mem).unwrap();
    assert_eq!(mem[y], before[y]);
    assert_eq!(mem[x], before[x]);
    let mut ran = mem.clone();
    assert_eq!(launch.run(&mut ran).unwrap(), checked);
    // A check after a run (reused buffers) still leaves memory alone, and a run after checks
    // still writes every element.
    assert_eq!(launch.check(&mem).unwrap(), checked);
    assert_eq!(mem[y], before[y]);
    let mut again = mem.clone();
    launch.run(&mut again).unwrap();
    assert_eq!(again[y], ran[y]);

    // Out of bounds: the same error as a run, with its location.
    let bad = Launch::new(&k, 2).arg("x", x).arg("y", y).arg("n", 128);
    let small = {
        let mut m = Memory::new();
        m.add("x", HostTensor::from_f32(&[100], rand_vec(100, 1)));
        m.add("y", HostTensor::zeros(DType::F32, &[100]));
        m
    };
    let e = bad.check(&small).unwrap_err();
    let mut m2 = small.clone();
    assert_eq!(e.to_string(), bad.run(&mut m2).unwrap_err().to_string());
    assert!(matches!(e, ExecError::OutOfBounds { offset: 100, .. }), "{e}");
    assert!(e.to_string().contains("semantics.rs:"), "{e}");
}

#[test]
fn check_reports_races_as_run_does() {
    let mut b = KernelBuilder::new("bad_sum");
    let x = b.ptr_param("x", DType::F32);
    let out = b.ptr_param("out", DType::F32);
    let n = b.scalar_param("n", DType::I32);
    let (offs, mask) = lanes(&mut b, 16, n);
    let px = b.add(x, offs);
    let v = b.load(px, Some(mask), None);
    let s = b.sum(v, None, false);
    let acc = b.load(out, None, None);
    let t = b.add(acc, s);
    b.store(out, t, None);
    let k = b.finish().unwrap();
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[40], rand_vec(40, 5)));
    let ot = mem.add("out", HostTensor::zeros(DType::F32, &[1]));
    let launch = Launch::new(&k, 3).arg("x", xt).arg("out", ot).arg("n", 40);
    let e = launch.check(&mem).unwrap_err();
    let ExecError::Race(r) = &e else { panic!("expected a race, got {e}") };
    assert_eq!((r.kind, r.offset, r.first.pid, r.second.pid), (RaceKind::WriteWrite, 0, [0, 0, 0], [1, 0, 0]));
    let mut m2 = mem.clone();
    assert_eq!(e.to_string(), launch.run(&mut m2).unwrap_err().to_string());
    let warn = launch.options(Options { races: RaceMode::Warn, ..Options::default() });
    let s = warn.check(&mem).unwrap();
    assert_eq!(s, warn.run(&mut m2).unwrap());
    assert!(s.races.iter().any(|r| r.kind == RaceKind::ReadWrite));
    assert_eq!(mem[ot].as_f32().unwrap(), &[0.0]);
}

/// `Options::programs`: only that batch of the grid's programs runs (a 2-D grid, its programs by
/// linear id, axis 0 fastest), `program_id` and `num_programs` those of the whole grid; a range
/// past the grid is an argument error.
#[test]
fn a_batch_of_programs_runs_alone() {
    let mut b = KernelBuilder::new("ids");
    let y = b.ptr_param("y", DType::I32);
    let (p0, p1) = (b.program_id(0), b.program_id(1));
    let n0 = b.num_programs(0);
    let lin = b.mul(p1, n0);
    let lin = b.add(lin, p0);
    let hundred = b.i32(100);
    let v = b.mul(p1, hundred);
    let v = b.add(v, p0);
    let py = b.add(y, lin);
    b.store(py, v, None);
    let k = b.finish().unwrap();
    let run = |programs: Option<std::ops::Range<u64>>| {
        let mut mem = Memory::new();
        let y = mem.add("y", HostTensor::from_i32(&[12], vec![-1; 12]));
        let opts = Options { programs, ..Options::default() };
        let s = Launch::new(&k, [4u32, 3, 1]).arg("y", y).options(opts).run(&mut mem).map(|s| s.programs);
        (s, mem[y].as_i32().unwrap().to_vec())
    };
    let (s, got) = run(Some(5..9));
    assert_eq!(s.unwrap(), 4);
    let want: Vec<i32> = (0..12).map(|i| if (5..9).contains(&i) { (i / 4) * 100 + i % 4 } else { -1 }).collect();
    assert_eq!(got, want);
    assert_eq!(run(None).1, (0..12).map(|i| (i / 4) * 100 + i % 4).collect::<Vec<_>>());
    assert_eq!(run(Some(3..3)).1, vec![-1; 12]);
    let e = run(Some(10..13)).0.unwrap_err().to_string();
    assert!(e.contains("programs 10..13") && e.contains("grid of 12"), "{e}");
}
