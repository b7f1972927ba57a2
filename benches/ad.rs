//! Speed of the f64 ground-truth gradient (forward + reverse) of whole launches, next to the
//! reference interpreter's forward run of the same launch (the yardstick: the gradient
//! should cost at most a few forwards). Workloads: weighted sum 4096x512 and 65536x1024, row
//! softmax 4096x1024, matmul 512^3 and 1024^3 (the large ones with a longer measurement time).
//!
//! `--summary` prints only the table (medians); `--only NAME` (a substring, repeatable) selects
//! workloads, `--reps N` the summary's runs; `--grad-only` runs one gradient of each selected
//! workload and nothing else, `--setup-only` only builds them (the two give peak-memory
//! measurements and their baseline).

use criterion::Criterion;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};
use tilegrad::zoo;
use tilegrad_ad::{vjp, GradOptions};
use tilegrad_ir::DType;
use tilegrad_reference::{HostTensor, Memory};

/// A workload: its name, one gradient, one reference forward.
type Case = (String, Box<dyn FnMut()>, Box<dyn FnMut()>);

/// A workload's selector name, whether it is large (fewer samples), and its constructor.
type Entry = (&'static str, bool, fn() -> Case);

fn rand_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.gen_range(-1.0f32..1.0)).collect()
}

/// (name, gradient, forward) closures for the weighted sum at `rows` x `d`.
fn weighted_sum(rows: usize, d: usize) -> Case {
    let k = Box::leak(Box::new(zoo::weighted_sum_fwd(16, 128).expect("zoo kernel")));
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[rows, d], rand_f32(rows * d, 1)));
    let wt = mem.add("w", HostTensor::from_f32(&[d], rand_f32(d, 2)));
    let ot = mem.add("out", HostTensor::zeros(DType::F32, &[rows]));
    // The output cotangents are built once: the gradient timing does not include copying them.
    let outs = vec![(ot, rand_f32(rows, 3).iter().map(|&v| v as f64).collect::<Vec<f64>>())];
    let launch = zoo::weighted_sum_fwd_launch(k, &mem, xt, wt, ot).expect("launch");
    let (l2, mut m2) = (launch.clone(), mem.clone());
    (
        format!("weighted_sum_{rows}x{d}"),
        Box::new(move || {
            vjp(&launch, &mem, &[xt, wt], &outs, &GradOptions::default()).expect("gradient");
        }),
        Box::new(move || {
            l2.run(&mut m2).expect("forward");
        }),
    )
}

/// Softmax 4096x1024 (16 rows per program).
fn softmax() -> Case {
    let (rows, cols) = (4096, 1024);
    let k = Box::leak(Box::new(zoo::softmax(16, 1024).expect("zoo kernel")));
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[rows, cols], rand_f32(rows * cols, 4)));
    let yt = mem.add("y", HostTensor::zeros(DType::F32, &[rows, cols]));
    let outs = vec![(yt, rand_f32(rows * cols, 5).iter().map(|&v| v as f64).collect::<Vec<f64>>())];
    let launch = zoo::softmax_launch(k, &mem, xt, yt).expect("launch");
    let (l2, mut m2) = (launch.clone(), mem.clone());
    (
        "softmax_4096x1024".into(),
        Box::new(move || {
            vjp(&launch, &mem, &[xt], &outs, &GradOptions::default()).expect("gradient");
        }),
        Box::new(move || {
            l2.run(&mut m2).expect("forward");
        }),
    )
}

/// Matmul `s`^3 (64x64x32 tiles).
fn matmul(s: usize) -> Case {
    let k = Box::leak(Box::new(zoo::matmul(64, 64, 32, None).expect("zoo kernel")));
    let mut mem = Memory::new();
    let at = mem.add("a", HostTensor::from_f32(&[s, s], rand_f32(s * s, 6)));
    let bt = mem.add("b", HostTensor::from_f32(&[s, s], rand_f32(s * s, 7)));
    let ct = mem.add("c", HostTensor::zeros(DType::F32, &[s, s]));
    let outs = vec![(ct, rand_f32(s * s, 8).iter().map(|&v| v as f64).collect::<Vec<f64>>())];
    let launch = zoo::matmul_launch(k, &mem, at, bt, ct).expect("launch");
    let (l2, mut m2) = (launch.clone(), mem.clone());
    (
        format!("matmul_{s}"),
        Box::new(move || {
            vjp(&launch, &mem, &[at, bt], &outs, &GradOptions::default()).expect("gradient");
        }),
        Box::new(move || {
            l2.run(&mut m2).expect("forward");
        }),
    )
}

/// Every workload: (name, gradient, forward, large). Large ones take fewer samples.
fn workloads() -> Vec<Entry> {
    vec![
        ("weighted_sum_4096x512", false, || weighted_sum(4096, 512)),
        ("softmax_4096x1024", false, softmax),
        ("matmul_512", false, || matmul(512)),
        ("weighted_sum_65536x1024", true, || weighted_sum(65536, 1024)),
        ("matmul_1024", true, || matmul(1024)),
    ]
}

/// The workloads selected by `--only NAME` (substring; repeatable), or all of them.
fn selected() -> Vec<Entry> {
    let args: Vec<String> = std::env::args().collect();
    let only: Vec<&String> = args.windows(2).filter(|w| w[0] == "--only").map(|w| &w[1]).collect();
    workloads().into_iter().filter(|(n, _, _)| only.is_empty() || only.iter().any(|o| n.contains(o.as_str()))).collect()
}

fn bench(c: &mut Criterion) {
    for (_, large, make) in selected() {
        let (name, mut grad, mut fwd) = make();
        let mut g = c.benchmark_group(name);
        g.sample_size(10).measurement_time(Duration::from_secs(if large { 20 } else { 5 }));
        g.bench_function("gradient_f64", |b| b.iter(&mut grad));
        g.bench_function("reference_forward", |b| b.iter(&mut fwd));
        g.finish();
    }
}

/// Times of `reps` runs of `grad` and of `fwd`, interleaved (a gradient, then a forward), so
/// that both see the same machine conditions; one warm-up run of each first.
fn interleaved(grad: &mut dyn FnMut(), fwd: &mut dyn FnMut(), reps: usize) -> (Vec<f64>, Vec<f64>) {
    let time = |f: &mut dyn FnMut()| {
        let s = Instant::now();
        f();
        s.elapsed().as_secs_f64()
    };
    grad();
    fwd();
    let (mut tg, mut tf) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        tg.push(time(grad));
        tf.push(time(fwd));
    }
    tg.sort_by(f64::total_cmp);
    tf.sort_by(f64::total_cmp);
    (tg, tf)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--setup-only") {
        // Build the selected workloads and nothing else (the baseline of a peak-memory
        // measurement).
        let cases: Vec<Case> = selected().into_iter().map(|(_, _, make)| make()).collect();
        std::hint::black_box(&cases);
        return;
    }
    if args.iter().any(|a| a == "--grad-only") {
        // One gradient of each selected workload, nothing else (for peak-memory measurements).
        for (_, _, make) in selected() {
            let (_, mut grad, _) = make();
            grad();
        }
        return;
    }
    if !args.iter().any(|a| a == "--summary") {
        // Criterion parses the command line unless it holds this bench's own options.
        let own = args.iter().any(|a| a == "--only" || a == "--reps");
        let mut crit = if own { Criterion::default() } else { Criterion::default().configure_from_args() };
        bench(&mut crit);
        crit.final_summary();
    }
    let reps = args.windows(2).find(|w| w[0] == "--reps").and_then(|w| w[1].parse().ok()).unwrap_or(5);
    println!("\nsummary (median and minimum of {reps} interleaved runs)");
    println!("{:<26} {:>12} {:>12} {:>8} {:>12} {:>12} {:>8}", "workload", "gradient", "forward", "ratio", "min grad", "min fwd", "ratio");
    for (_, large, make) in selected() {
        let (name, mut grad, mut fwd) = make();
        let r = if large { reps.min(3) } else { reps };
        let (tg, tf) = interleaved(&mut grad, &mut fwd, r);
        let (mg, mf) = (tg[tg.len() / 2], tf[tf.len() / 2]);
        println!(
            "{:<26} {:>10.1}ms {:>10.1}ms {:>7.1}x {:>10.1}ms {:>10.1}ms {:>7.1}x",
            name,
            mg * 1e3,
            mf * 1e3,
            mg / mf,
            tg[0] * 1e3,
            tf[0] * 1e3,
            tg[0] / tf[0]
        );
    }
}
