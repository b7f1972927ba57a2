//! Batched evaluation (several program instances per evaluation, values held per program or
//! shared) gives the gradient of one-program-at-a-time evaluation and of finite differences,
//! also when programs of one batch take different trip counts and branches (the batch is then
//! split), on sizes that are not multiples of the tiles, with random non-zero data.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tilegrad_ad::fd::{fd_vjp, FdSpec};
use tilegrad_ad::{vjp, GradOptions};
use tilegrad_ir::{DType, Kernel, KernelBuilder};
use tilegrad_reference::{HostTensor, Launch, Memory};

/// Per program `p` (lanes `offs = p*B + arange(B)`, masked to `offs < n`), with `q = p / group`:
/// `acc = sum over it < q % 3 + 1 of x[it, offs] * w[arange(B)]` (a trip count per group of
/// programs; `w` is the same tile in every program), then `y[offs] = exp(acc)` for even `q`,
/// `acc * acc * s` otherwise (a branch per group), with `s` a runtime scalar.
fn divergent(block: usize, group: i32) -> Kernel {
    let mut b = KernelBuilder::new("divergent");
    let x = b.ptr_param("x", DType::F64);
    let w = b.ptr_param("w", DType::F64);
    let y = b.ptr_param("y", DType::F64);
    let n = b.scalar_param("n", DType::I32);
    let s = b.scalar_param("s", DType::F64);
    let pid = b.program_id(0);
    let bs = b.i32(block as i32);
    let start = b.mul(pid, bs);
    let r = b.arange(0, block as i64);
    let offs = b.add(start, r);
    let m = b.lt(offs, n);
    let g = b.i32(group);
    let q = b.floordiv(pid, g);
    let three = b.i32(3);
    let rem = b.rem(q, three);
    let one = b.i32(1);
    let trips = b.add(rem, one);
    let zero = b.i32(0);
    let acc0 = b.zeros(&[block], DType::F64);
    let acc = b.for_range(zero, trips, one, Some(3), &[acc0], |b, it, c| {
        let row = b.mul(it, n);
        let o = b.add(offs, row);
        let px = b.add(x, o);
        let zf = b.f64(0.0);
        let xv = b.load(px, Some(m), Some(zf));
        let pw = b.add(w, r);
        let wv = b.load(pw, None, None);
        let p = b.mul(xv, wv);
        vec![b.add(c[0], p)]
    });
    let two = b.i32(2);
    let parity = b.rem(q, two);
    let even = b.eq(parity, zero);
    let out = b.if_else(
        even,
        |b| vec![b.exp(acc[0])],
        |b| {
            let sq = b.mul(acc[0], acc[0]);
            vec![b.mul(sq, s)]
        },
    );
    let py = b.add(y, offs);
    b.store(py, out[0], Some(m));
    b.finish().unwrap()
}

#[test]
fn divergent_trip_counts_and_branches_in_one_batch() {
    // Control flow changing with every program, and in groups of 4 (batches of 5 then hold
    // agreeing and disagreeing programs).
    for group in [1, 4] {
        divergent_case(group);
    }
}

fn divergent_case(group: i32) {
    let (n, block) = (203usize, 16usize);
    let k = divergent(block, group);
    let mut rng = StdRng::seed_from_u64(3);
    let xs: Vec<f64> = (0..3 * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let ws: Vec<f64> = (0..block).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let cy: Vec<f64> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let mut mem = Memory::new();
    let x = mem.add("x", HostTensor::from_f64(&[3, n], xs.clone()));
    let w = mem.add("w", HostTensor::from_f64(&[block], ws.clone()));
    let y = mem.add("y", HostTensor::zeros(DType::F64, &[n]));
    let launch = Launch::new(&k, n.div_ceil(block)).arg("x", x).arg("w", w).arg("y", y).arg("n", n as i32).arg("s", 0.75f64);
    let grad = |batch: Option<usize>| {
        let opts = GradOptions { batch_programs: batch, ..GradOptions::default() };
        vjp(&launch, &mem, &[x, w], &[(y, cy.clone())], &opts).unwrap()
    };
    let one = grad(Some(1));
    assert_eq!(one.max_trips.values().copied().max(), Some(3));
    // Batches of every size, including ones that cut the grid unevenly and the default.
    for batch in [Some(2), Some(3), Some(5), Some(64), None] {
        let g = grad(batch);
        assert_eq!(g.max_trips, one.max_trips);
        for (t, (a, b)) in g.inputs.iter().zip(&one.inputs).enumerate() {
            for (e, (p, q)) in a.iter().zip(b).enumerate() {
                assert!((p - q).abs() <= 1e-12 * q.abs().max(1.0), "batch {batch:?}, input {t}[{e}]: {p} vs {q}");
            }
        }
    }
    // Finite differences agree.
    let spec = FdSpec::new(&launch, &mem, [x, w], [y]);
    let fd = fd_vjp(&spec, std::slice::from_ref(&cy), 1e-6).unwrap();
    let g = grad(None);
    for (t, (a, b)) in g.inputs.iter().zip(&fd).enumerate() {
        for (e, (p, q)) in a.iter().zip(b).enumerate() {
            assert!((p - q).abs() <= 1e-6 * q.abs().max(1.0), "input {t}[{e}]: AD {p}, FD {q}");
        }
    }
    // Not vacuous: every program contributed (x rows beyond a program's trip count stay zero).
    assert!(g.inputs[0][..n].iter().all(|&v| v != 0.0));
    assert!(g.inputs[1].iter().all(|&v| v != 0.0));
}

#[test]
fn batched_results_do_not_depend_on_threads_or_chunks() {
    let (n, block) = (1000usize, 32usize);
    let k = divergent(block, 3);
    let mut rng = StdRng::seed_from_u64(4);
    let xs: Vec<f64> = (0..3 * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let ws: Vec<f64> = (0..block).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let cy: Vec<f64> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let mut mem = Memory::new();
    let x = mem.add("x", HostTensor::from_f64(&[3, n], xs));
    let w = mem.add("w", HostTensor::from_f64(&[block], ws));
    let y = mem.add("y", HostTensor::zeros(DType::F64, &[n]));
    let launch = Launch::new(&k, n.div_ceil(block)).arg("x", x).arg("w", w).arg("y", y).arg("n", n as i32).arg("s", -1.25f64);
    let run = |threads: usize, chunk: Option<usize>| {
        let opts = GradOptions { chunk_programs: chunk, batch_programs: Some(8), ..GradOptions::default() };
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let g = pool.install(|| vjp(&launch, &mem, &[x, w], &[(y, cy.clone())], &opts)).unwrap();
        g.inputs.concat().iter().map(|v| v.to_bits()).collect::<Vec<u64>>()
    };
    let base = run(1, None);
    for (threads, chunk) in [(2, None), (3, Some(5)), (2, Some(1))] {
        assert_eq!(run(threads, chunk), base, "{threads} threads, chunks of {chunk:?}");
    }
}
