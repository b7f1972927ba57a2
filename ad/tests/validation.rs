//! Launches the engine validates itself (no tensor both loaded and written, no address computed
//! from floats): out-of-bounds lanes, store races between programs, one store writing an
//! element twice and loops beyond their `max_iters` are still the reference's errors, and
//! launches without them (strided stores interleaved across programs included) differentiate
//! to the analytic gradient.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tilegrad_ad::graph::KernelGraph;
use tilegrad_ad::{vjp, AdError, GradOptions};
use tilegrad_ir::{DType, Kernel, KernelBuilder, Value};
use tilegrad_reference::{ExecError, HostTensor, Launch, Memory, RaceKind};

/// `y[so] = x[offs]^2` on lanes `offs = p*B + arange(B) < n`, where `so` is built from
/// (builder, pid, lanes, offs).
fn squares(block: usize, store_offs: impl Fn(&mut KernelBuilder, Value, Value, Value) -> Value) -> Kernel {
    let mut b = KernelBuilder::new("squares");
    let x = b.ptr_param("x", DType::F64);
    let y = b.ptr_param("y", DType::F64);
    let n = b.scalar_param("n", DType::I32);
    let pid = b.program_id(0);
    let bs = b.i32(block as i32);
    let start = b.mul(pid, bs);
    let lanes = b.arange(0, block as i64);
    let offs = b.add(start, lanes);
    let m = b.lt(offs, n);
    let px = b.add(x, offs);
    let zero = b.f64(0.0);
    let v = b.load(px, Some(m), Some(zero));
    let v2 = b.mul(v, v);
    let so = store_offs(&mut b, pid, lanes, offs);
    let py = b.add(y, so);
    b.store(py, v2, Some(m));
    b.finish().unwrap()
}

fn random(n: usize, seed: u64) -> Vec<f64> {
    let mut r = StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.gen_range(-1.0..1.0)).collect()
}

/// The gradient of `x` for `y`'s cotangent `cy`, launched on `ceil(n / block)` programs.
fn grad(k: &Kernel, n: usize, x_len: usize, y_len: usize, block: usize) -> (Vec<f64>, Vec<f64>, Result<Vec<f64>, AdError>) {
    let xs = random(x_len, 1);
    let cy = random(y_len, 2);
    let mut mem = Memory::new();
    let x = mem.add("x", HostTensor::from_f64(&[x_len], xs.clone()));
    let y = mem.add("y", HostTensor::zeros(DType::F64, &[y_len]));
    let launch = Launch::new(k, n.div_ceil(block)).arg("x", x).arg("y", y).arg("n", n as i32);
    let g = vjp(&launch, &mem, &[x], &[(y, cy.clone())], &GradOptions::default()).map(|mut g| g.inputs.remove(0));
    (xs, cy, g)
}

#[test]
fn gather_scatter_kernels_validate_themselves_and_in_place_or_float_steered_kernels_do_not() {
    let facts = |k: &Kernel, slots: &[Option<u32>]| KernelGraph::build(k, slots).facts(k);
    let k = squares(8, |_, _, _, offs| offs);
    assert!(facts(&k, &[Some(0), Some(1), None]).self_checking);
    // x and y bound to one tensor: programs load what others may store.
    assert!(!facts(&k, &[Some(0), Some(0), None]).self_checking);
    // A store masked by a float comparison: the f64 ground truth and the kernel's f32 could
    // disagree on the lanes.
    let mut b = KernelBuilder::new("relu_store");
    let x = b.ptr_param("x", DType::F32);
    let y = b.ptr_param("y", DType::F32);
    let r = b.arange(0, 8);
    let px = b.add(x, r);
    let v = b.load(px, None, None);
    let z = b.f32(0.0);
    let pos = b.gt(v, z);
    let py = b.add(y, r);
    b.store(py, v, Some(pos));
    let k = b.finish().unwrap();
    assert!(!facts(&k, &[Some(0), Some(1)]).self_checking);
}

#[test]
fn an_out_of_bounds_load_is_the_reference_error() {
    // x is 5 elements short of n: the last program's unmasked lanes read past it.
    let k = squares(16, |_, _, _, offs| offs);
    let (_, _, g) = grad(&k, 100, 95, 100, 16);
    match g {
        Err(AdError::Exec(ExecError::OutOfBounds { tensor, offset, site, .. })) => {
            assert_eq!((tensor.as_str(), offset, site.pid), ("x", 95, [5, 0, 0]));
        }
        other => panic!("expected an out-of-bounds error, got {other:?}"),
    }
}

#[test]
fn programs_storing_one_element_race() {
    // Every program stores y[arange(B)].
    let k = squares(16, |_, _, lanes, _| lanes);
    match grad(&k, 100, 100, 16, 16).2 {
        Err(AdError::Exec(ExecError::Race(r))) => {
            assert_eq!((r.kind, r.tensor.as_str(), r.first.pid, r.second.pid), (RaceKind::WriteWrite, "y", [0, 0, 0], [1, 0, 0]))
        }
        other => panic!("expected a race, got {other:?}"),
    }
}

#[test]
fn one_store_writing_an_element_twice_races() {
    // Lanes 2j and 2j+1 of one program store y[offs // 2].
    let k = squares(16, |b, _, _, offs| {
        let two = b.i32(2);
        b.floordiv(offs, two)
    });
    match grad(&k, 100, 100, 50, 16).2 {
        Err(AdError::Exec(ExecError::Race(r))) => assert_eq!(r.kind, RaceKind::DuplicateLanes),
        other => panic!("expected a race, got {other:?}"),
    }
}

#[test]
fn interleaved_strided_stores_do_not_race_and_differentiate_exactly() {
    // Program p stores lane l at y[l * G + p]: every run is one element, and the runs of all
    // programs interleave without sharing an element. n = 101 leaves a partial last program.
    let (n, block) = (101usize, 16usize);
    let g = n.div_ceil(block);
    let k = squares(block, |b, pid, lanes, _| {
        let gv = b.i32(g as i32);
        let s = b.mul(lanes, gv);
        b.add(s, pid)
    });
    let (xs, cy, grad_x) = grad(&k, n, n, g * block, block);
    let grad_x = grad_x.unwrap();
    for (e, (&gx, &x)) in grad_x.iter().zip(&xs).enumerate() {
        let (p, l) = (e / block, e % block);
        let want = 2.0 * x * cy[l * g + p];
        assert_eq!(gx, want, "x[{e}]");
    }
    assert!(grad_x.iter().any(|&v| v != 0.0));
}

#[test]
fn a_loop_beyond_its_max_iters_is_the_reference_error() {
    let mut b = KernelBuilder::new("bounded");
    let x = b.ptr_param("x", DType::F64);
    let y = b.ptr_param("y", DType::F64);
    let trips = b.scalar_param("trips", DType::I32);
    let r = b.arange(0, 8);
    let acc0 = b.zeros(&[8], DType::F64);
    let (lo, one) = (b.i32(0), b.i32(1));
    let out = b.for_range(lo, trips, one, Some(2), &[acc0], |b, it, c| {
        let eight = b.i32(8);
        let base = b.mul(it, eight);
        let o = b.add(base, r);
        let p = b.add(x, o);
        let v = b.load(p, None, None);
        vec![b.add(c[0], v)]
    });
    let py = b.add(y, r);
    b.store(py, out[0], None);
    let k = b.finish().unwrap();
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f64(&[24], random(24, 3)));
    let yt = mem.add("y", HostTensor::zeros(DType::F64, &[8]));
    let run = |t: i32| {
        let launch = Launch::new(&k, 1).arg("x", xt).arg("y", yt).arg("trips", t);
        vjp(&launch, &mem, &[xt], &[(yt, random(8, 4))], &GradOptions::default())
    };
    // Within the bound: every loaded element gets the cotangent of its lane.
    let g = run(2).unwrap();
    let cy = random(8, 4);
    assert_eq!(g.inputs[0][..16], [cy.clone(), cy].concat()[..]);
    assert!(g.inputs[0][16..].iter().all(|&v| v == 0.0));
    match run(3) {
        Err(AdError::Exec(ExecError::LoopBound { trips: 3, max_iters: 2, .. })) => {}
        other => panic!("expected a loop-bound error, got {other:?}"),
    }
}

#[test]
fn programs_storing_one_element_race_unless_they_store_the_same_value() {
    // Every program stores y[arange(8)] = x[arange(8)]^2 (+ pid * bias): with no bias the same
    // bits from each (deterministic on a GPU: the last store's cotangent flows back once, as with
    // one program); with a bias the result depends on the order, a race.
    let kernel = |bias: f64| {
        let mut b = KernelBuilder::new("shared_store");
        let x = b.ptr_param("x", DType::F64);
        let y = b.ptr_param("y", DType::F64);
        let r = b.arange(0, 8);
        let px = b.add(x, r);
        let v = b.load(px, None, None);
        let v2 = b.mul(v, v);
        let pid = b.program_id(0);
        let pf = b.cast(pid, DType::F64);
        let bias = b.f64(bias);
        let shift = b.mul(pf, bias);
        let v2 = b.add(v2, shift);
        let py = b.add(y, r);
        b.store(py, v2, None);
        b.finish().unwrap()
    };
    let k = kernel(0.0);
    assert!(KernelGraph::build(&k, &[Some(0), Some(1)]).facts(&k).self_checking);
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f64(&[8], random(8, 5)));
    let yt = mem.add("y", HostTensor::zeros(DType::F64, &[8]));
    for programs in [1, 3] {
        let launch = Launch::new(&k, programs).arg("x", xt).arg("y", yt);
        let g = vjp(&launch, &mem, &[xt], &[(yt, random(8, 6))], &GradOptions::default()).unwrap();
        let want: Vec<f64> = random(8, 5).iter().zip(random(8, 6)).map(|(x, c)| 2.0 * x * c).collect();
        assert_eq!(g.inputs[0], want, "{programs} programs");
    }
    let k = kernel(1.0);
    let launch = Launch::new(&k, 3).arg("x", xt).arg("y", yt);
    match vjp(&launch, &mem, &[xt], &[(yt, random(8, 6))], &GradOptions::default()) {
        Err(AdError::Exec(ExecError::Race(r))) => {
            assert_eq!((r.kind, r.first.pid, r.second.pid), (RaceKind::WriteWrite, [0, 0, 0], [1, 0, 0]))
        }
        other => panic!("expected a race, got {other:?}"),
    }
}

#[test]
fn an_out_of_bounds_masked_store_is_the_reference_error() {
    // y is 3 elements short: the last program's active lanes 13.. write past it.
    let k = squares(16, |_, _, _, offs| offs);
    match grad(&k, 100, 100, 97, 16).2 {
        Err(AdError::Exec(ExecError::OutOfBounds { tensor, offset, site, .. })) => {
            assert_eq!((tensor.as_str(), offset, site.pid), ("y", 97, [6, 0, 0]));
        }
        other => panic!("expected an out-of-bounds error, got {other:?}"),
    }
}
