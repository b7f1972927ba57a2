//! Speed of the reference interpreter on the workloads the project is measured on, next to plain
//! Rust loops computing the same results (single-threaded f32, the natural hand-written
//! baseline), and to the published times of Triton's own CPU interpreter (`TRITON_INTERPRET=1`,
//! Triton 3.8, on a 2-core machine of the kind this project runs on).
//!
//! After the criterion groups, a summary table gives the median of repeated runs and the ratios.

use criterion::{criterion_group, Criterion};
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::time::{Duration, Instant};
use tilegrad::zoo;
use tilegrad_ir::DType;
use tilegrad_reference::{HostTensor, Memory};

const ROWS: usize = 4096;
const D: usize = 512;
const MM: usize = 512;
const SM_ROWS: usize = 4096;
const SM_COLS: usize = 1024;

fn rand_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.gen_range(-1.0f32..1.0)).collect()
}

/// One workload: a prepared memory and a closure that runs the launch(es) on it.
struct Workload {
    name: &'static str,
    /// Triton interpreter time for the same launch, seconds.
    triton_s: f64,
    run: Box<dyn FnMut()>,
    plain: Box<dyn FnMut()>,
}

fn weighted_sum_fwd() -> Workload {
    let k = zoo::weighted_sum_fwd(16, 128).expect("zoo kernel");
    let (x, w) = (rand_f32(ROWS * D, 1), rand_f32(D, 2));
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[ROWS, D], x.clone()));
    let wt = mem.add("w", HostTensor::from_f32(&[D], w.clone()));
    let ot = mem.add("out", HostTensor::zeros(DType::F32, &[ROWS]));
    let mut out = vec![0f32; ROWS];
    Workload {
        name: "weighted_sum_fwd",
        triton_s: 4.0,
        run: Box::new(move || {
            zoo::launch_weighted_sum_fwd(&k, &mut mem, xt, wt, ot).expect("launch");
        }),
        plain: Box::new(move || {
            for r in 0..ROWS {
                let row = &x[r * D..(r + 1) * D];
                out[r] = row.iter().zip(&w).map(|(a, b)| a * b).sum();
            }
            black_box(&out);
        }),
    }
}

fn weighted_sum_bwd() -> Workload {
    let k = zoo::weighted_sum_bwd(16, 128).expect("zoo kernel");
    let (x, w, g) = (rand_f32(ROWS * D, 3), rand_f32(D, 4), rand_f32(ROWS, 5));
    let tiles = ROWS.div_ceil(16);
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[ROWS, D], x.clone()));
    let wt = mem.add("w", HostTensor::from_f32(&[D], w.clone()));
    let gt = mem.add("g", HostTensor::from_f32(&[ROWS], g.clone()));
    let gxt = mem.add("grad_x", HostTensor::zeros(DType::F32, &[ROWS, D]));
    let pt = mem.add("partial", HostTensor::zeros(DType::F32, &[tiles, D]));
    let (mut gx, mut part) = (vec![0f32; ROWS * D], vec![0f32; tiles * D]);
    Workload {
        name: "weighted_sum_bwd",
        triton_s: 7.4,
        run: Box::new(move || {
            zoo::launch_weighted_sum_bwd(&k, &mut mem, xt, wt, gt, gxt, pt).expect("launch");
        }),
        plain: Box::new(move || {
            part.iter_mut().for_each(|p| *p = 0.0);
            for r in 0..ROWS {
                let t = r / 16;
                for d in 0..D {
                    gx[r * D + d] = g[r] * w[d];
                    part[t * D + d] += x[r * D + d] * g[r];
                }
            }
            black_box((&gx, &part));
        }),
    }
}

fn matmul() -> Workload {
    let k = zoo::matmul(64, 64, 32, None).expect("zoo kernel");
    let (a, b) = (rand_f32(MM * MM, 6), rand_f32(MM * MM, 7));
    let mut mem = Memory::new();
    let at = mem.add("a", HostTensor::from_f32(&[MM, MM], a.clone()));
    let bt = mem.add("b", HostTensor::from_f32(&[MM, MM], b.clone()));
    let ct = mem.add("c", HostTensor::zeros(DType::F32, &[MM, MM]));
    let mut c = vec![0f32; MM * MM];
    Workload {
        name: "matmul_512",
        triton_s: 3.1,
        run: Box::new(move || {
            zoo::launch_matmul(&k, &mut mem, at, bt, ct).expect("launch");
        }),
        plain: Box::new(move || {
            c.iter_mut().for_each(|v| *v = 0.0);
            for i in 0..MM {
                let row = &mut c[i * MM..(i + 1) * MM];
                for kk in 0..MM {
                    let x = a[i * MM + kk];
                    row.iter_mut().zip(&b[kk * MM..(kk + 1) * MM]).for_each(|(o, &y)| *o += x * y);
                }
            }
            black_box(&c);
        }),
    }
}

fn softmax() -> Workload {
    let k = zoo::softmax(16, SM_COLS).expect("zoo kernel");
    let x = rand_f32(SM_ROWS * SM_COLS, 8);
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[SM_ROWS, SM_COLS], x.clone()));
    let yt = mem.add("y", HostTensor::zeros(DType::F32, &[SM_ROWS, SM_COLS]));
    let mut y = vec![0f32; SM_ROWS * SM_COLS];
    Workload {
        name: "softmax_4096x1024",
        triton_s: 1.2,
        run: Box::new(move || {
            zoo::launch_softmax(&k, &mut mem, xt, yt).expect("launch");
        }),
        plain: Box::new(move || {
            for r in 0..SM_ROWS {
                let (xr, yr) = (&x[r * SM_COLS..(r + 1) * SM_COLS], &mut y[r * SM_COLS..(r + 1) * SM_COLS]);
                let m = xr.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut s = 0.0;
                for (o, &v) in yr.iter_mut().zip(xr) {
                    *o = (v - m).exp();
                    s += *o;
                }
                yr.iter_mut().for_each(|o| *o /= s);
            }
            black_box(&y);
        }),
    }
}

fn workloads() -> Vec<Workload> {
    vec![weighted_sum_fwd(), weighted_sum_bwd(), matmul(), softmax()]
}

fn bench(c: &mut Criterion) {
    for mut w in workloads() {
        let mut g = c.benchmark_group(w.name);
        g.sample_size(10).measurement_time(Duration::from_secs(3));
        g.bench_function("interpreter", |b| b.iter(&mut w.run));
        g.bench_function("plain_rust", |b| b.iter(&mut w.plain));
        g.finish();
    }
}

fn median(mut f: impl FnMut(), reps: usize) -> f64 {
    f();
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn summary() {
    println!("\nsummary (median of 9 runs; {} threads)", rayon::current_num_threads());
    println!("{:<20} {:>12} {:>12} {:>14} {:>16}", "workload", "interpreter", "plain rust", "vs plain rust", "faster than Triton");
    for mut w in workloads() {
        let ti = median(&mut w.run, 9);
        let tp = median(&mut w.plain, 9);
        println!("{:<20} {:>10.2}ms {:>10.2}ms {:>13.1}x {:>15.0}x", w.name, ti * 1e3, tp * 1e3, ti / tp, w.triton_s / ti);
    }
}

criterion_group!(benches, bench);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `--summary` skips criterion and prints only the table.
    if !args.iter().any(|a| a == "--summary") {
        benches();
        Criterion::default().configure_from_args().final_summary();
    }
    summary();
}
