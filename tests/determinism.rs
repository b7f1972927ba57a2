//! The reference interpreter's results do not depend on the number of threads or on how the grid
//! is chunked: every zoo launch gives bit-identical outputs on 1, 2 and 3 threads.

use rand::{Rng, SeedableRng};
use tilegrad::zoo;
use tilegrad_ir::DType;
use tilegrad_reference::{HostTensor, Launch, Memory, Options};

fn rand_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.gen_range(-1.0f32..1.0)).collect()
}

/// Runs `f` on a pool of `threads` threads.
fn on_threads<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap().install(f)
}

#[test]
fn softmax_matmul_and_atomic_sum_are_bitwise_identical_across_thread_counts() {
    let (rows, cols) = (333, 200);
    let x = rand_f32(rows * cols, 1);
    let softmax = |threads| {
        on_threads(threads, || {
            let k = zoo::softmax(16, 256).unwrap();
            let mut mem = Memory::new();
            let xt = mem.add("x", HostTensor::from_f32(&[rows, cols], x.clone()));
            let yt = mem.add("y", HostTensor::zeros(DType::F32, &[rows, cols]));
            zoo::launch_softmax(&k, &mut mem, xt, yt).unwrap();
            mem[yt].as_f32().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        })
    };
    let (m, n, kk) = (97, 130, 70);
    let (a, b) = (rand_f32(m * kk, 2), rand_f32(kk * n, 3));
    let matmul = |threads| {
        on_threads(threads, || {
            let k = zoo::matmul(32, 32, 16, None).unwrap();
            let mut mem = Memory::new();
            let at = mem.add("a", HostTensor::from_f32(&[m, kk], a.clone()));
            let bt = mem.add("b", HostTensor::from_f32(&[kk, n], b.clone()));
            let ct = mem.add("c", HostTensor::zeros(DType::F32, &[m, n]));
            zoo::launch_matmul(&k, &mut mem, at, bt, ct).unwrap();
            mem[ct].as_f32().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        })
    };
    let xs = rand_f32(50_000, 4);
    let atomic = |threads: usize, chunk: usize| {
        on_threads(threads, || {
            let k = zoo::atomic_sum(128).unwrap();
            let mut mem = Memory::new();
            let xt = mem.add("x", HostTensor::from_f32(&[xs.len()], xs.clone()));
            let ot = mem.add("out", HostTensor::zeros(DType::F32, &[1]));
            Launch::new(&k, xs.len().div_ceil(128))
                .arg("x_ptr", xt)
                .arg("out_ptr", ot)
                .arg("n", xs.len() as i32)
                .options(Options { chunk_programs: chunk, ..Options::default() })
                .run(&mut mem)
                .unwrap();
            mem[ot].as_f32().unwrap()[0].to_bits()
        })
    };
    let (s1, m1, a1) = (softmax(1), matmul(1), atomic(1, 4096));
    for t in [2, 3] {
        assert_eq!(s1, softmax(t), "softmax on {t} threads");
        assert_eq!(m1, matmul(t), "matmul on {t} threads");
        assert_eq!(a1, atomic(t, 7), "atomic sum on {t} threads, chunks of 7 programs");
    }
    // Not vacuous: the outputs are real values.
    assert!(s1.iter().any(|&b| f32::from_bits(b) > 0.001));
    assert!(f32::from_bits(a1).abs() > 0.0);
}
