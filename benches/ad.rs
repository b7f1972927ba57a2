//! Speed of the f64 ground-truth gradient (forward + reverse) of whole launches, next to the
//! reference interpreter's forward run of the same launch (the yardstick: the gradient
//! should cost at most a few forwards). `--summary` prints only the table.

use criterion::{criterion_group, Criterion};
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};
use tilegrad::zoo;
use tilegrad_ad::{vjp, GradOptions};
use tilegrad_ir::DType;
use tilegrad_reference::{HostTensor, Memory};

fn rand_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.gen_range(-1.0f32..1.0)).collect()
}

/// (name, gradient, forward) closures for the weighted sum at `rows` x `d`.
#[allow(clippy::type_complexity)]
fn weighted_sum(rows: usize, d: usize) -> (String, Box<dyn FnMut()>, Box<dyn FnMut()>) {
    let k = Box::leak(Box::new(zoo::weighted_sum_fwd(16, 128).expect("zoo kernel")));
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[rows, d], rand_f32(rows * d, 1)));
    let wt = mem.add("w", HostTensor::from_f32(&[d], rand_f32(d, 2)));
    let ot = mem.add("out", HostTensor::zeros(DType::F32, &[rows]));
    let g: Vec<f64> = rand_f32(rows, 3).iter().map(|&v| v as f64).collect();
    let launch = zoo::weighted_sum_fwd_launch(k, &mem, xt, wt, ot).expect("launch");
    let (l2, mut m2) = (launch.clone(), mem.clone());
    (
        format!("weighted_sum_{rows}x{d}"),
        Box::new(move || {
            vjp(&launch, &mem, &[xt, wt], &[(ot, g.clone())], &GradOptions::default()).expect("gradient");
        }),
        Box::new(move || {
            l2.run(&mut m2).expect("forward");
        }),
    )
}

/// Softmax 4096x1024 (16 rows per program) and matmul 512^3 (64x64x32 tiles).
#[allow(clippy::type_complexity)]
fn others() -> Vec<(String, Box<dyn FnMut()>, Box<dyn FnMut()>)> {
    let mut out: Vec<(String, Box<dyn FnMut()>, Box<dyn FnMut()>)> = Vec::new();
    let (rows, cols) = (4096, 1024);
    let k = Box::leak(Box::new(zoo::softmax(16, 1024).expect("zoo kernel")));
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[rows, cols], rand_f32(rows * cols, 4)));
    let yt = mem.add("y", HostTensor::zeros(DType::F32, &[rows, cols]));
    let g: Vec<f64> = rand_f32(rows * cols, 5).iter().map(|&v| v as f64).collect();
    let launch = zoo::softmax_launch(k, &mem, xt, yt).expect("launch");
    let (l2, mut m2) = (launch.clone(), mem.clone());
    out.push((
        "softmax_4096x1024".into(),
        Box::new(move || {
            vjp(&launch, &mem, &[xt], &[(yt, g.clone())], &GradOptions::default()).expect("gradient");
        }),
        Box::new(move || {
            l2.run(&mut m2).expect("forward");
        }),
    ));
    let s = 512;
    let k = Box::leak(Box::new(zoo::matmul(64, 64, 32, None).expect("zoo kernel")));
    let mut mem = Memory::new();
    let at = mem.add("a", HostTensor::from_f32(&[s, s], rand_f32(s * s, 6)));
    let bt = mem.add("b", HostTensor::from_f32(&[s, s], rand_f32(s * s, 7)));
    let ct = mem.add("c", HostTensor::zeros(DType::F32, &[s, s]));
    let g: Vec<f64> = rand_f32(s * s, 8).iter().map(|&v| v as f64).collect();
    let launch = zoo::matmul_launch(k, &mem, at, bt, ct).expect("launch");
    let (l2, mut m2) = (launch.clone(), mem.clone());
    out.push((
        "matmul_512".into(),
        Box::new(move || {
            vjp(&launch, &mem, &[at, bt], &[(ct, g.clone())], &GradOptions::default()).expect("gradient");
        }),
        Box::new(move || {
            l2.run(&mut m2).expect("forward");
        }),
    ));
    out
}

fn bench(c: &mut Criterion) {
    let (name, mut grad, mut fwd) = weighted_sum(4096, 512);
    let mut g = c.benchmark_group(name);
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    g.bench_function("gradient_f64", |b| b.iter(&mut grad));
    g.bench_function("reference_forward", |b| b.iter(&mut fwd));
    g.finish();
}

fn median(f: &mut dyn FnMut(), reps: usize) -> f64 {
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

criterion_group!(benches, bench);

fn main() {
    if !std::env::args().any(|a| a == "--summary") {
        benches();
        Criterion::default().configure_from_args().final_summary();
    }
    println!("\nsummary (median of 5 runs)");
    println!("{:<24} {:>12} {:>12} {:>8}", "workload", "gradient", "forward", "ratio");
    let mut all = vec![weighted_sum(4096, 512)];
    all.extend(others());
    for (name, mut grad, mut fwd) in all {
        let (tg, tf) = (median(&mut grad, 3), median(&mut fwd, 3));
        println!("{:<24} {:>10.1}ms {:>10.1}ms {:>7.1}x", name, tg * 1e3, tf * 1e3, tg / tf);
    }
}
