//! Whole-process cost of `tilegrad check`, `grad` and `run` at training sizes, as ratios to the
//! work they do measured in-process in the same run:
//!
//! - `check` (one trial) over the sum of its parts, the engine's work measured by an in-process
//!   [`check_backward`]: the forward in the kernels' dtypes, the f64 gradient (the ground truth's
//!   forward and reverse sweep) and the backward run (its phases of those names); what `check`
//!   adds to them is drawing the inputs, comparing, blame, the process and its output;
//! - `check` with two trials over one;
//! - `grad` over [`ground_truth`], `run` over [`run_forward`];
//! - each command's peak RSS over its bound, 3x the bytes of the spec's tensors (inputs, outputs,
//!   gradients, in their dtypes) + 64 MiB.
//!
//! The specs are the examples with their sizes raised (`examples/*.toml`, constants replaced,
//! written under `target/bench-whole/`).
//! `cargo bench --bench whole` runs the sizes; `-- --scale K` multiplies the leading size
//! by K (e.g. 4, where memory allows, or 0.05 for a quick look); `-- --only NAME` picks examples.
//! The CLI binary is `release/tilegrad` under cargo's target directory (`CARGO_TARGET_DIR`, else
//! `target/`), built first: `cargo build --release`.
//!
//! `-- --backend gpu` measures the GPU check instead, at the sizes of [`GPU_CASES`]: `check
//! --backend gpu --ground kernels --trials 1` cold (an empty kernel cache of its own, NVRTC's
//! cache off), then warm, beside `check --backend cpu --trials 1` on the same host, each as one
//! process; it prints the wall times, the ratio of the CPU's to the warm GPU's, and both checks'
//! phases (`--timings`). The kernels' own time in Triton is the Python bench's
//! (`python/bench/cuda_check.py`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tilegrad::check::{check_backward, ground_truth, run_forward, CheckOptions};
use tilegrad::spec;

/// An example and its constants at the measured size.
struct Case {
    name: &'static str,
    spec: &'static str,
    /// (constant, value); the first is the one `--scale` multiplies.
    sizes: &'static [(&'static str, f64)],
}

const CASES: &[Case] = &[
    Case { name: "weighted_sum", spec: "weighted_sum.toml", sizes: &[("ROWS", 65536.0), ("D", 1024.0)] },
    Case { name: "softmax", spec: "softmax.toml", sizes: &[("ROWS", 16384.0), ("COLS", 1024.0)] },
    Case { name: "layer_norm", spec: "layer_norm.toml", sizes: &[("ROWS", 16384.0), ("COLS", 1024.0)] },
    Case { name: "vector_add", spec: "vector_add.toml", sizes: &[("N", 16_000_000.0)] },
    Case { name: "atomic_sum", spec: "atomic_sum.toml", sizes: &[("N", 16_000_000.0)] },
];

/// The GPU check's sizes: the examples at training sizes.
const GPU_CASES: &[Case] = &[
    Case { name: "weighted_sum", spec: "weighted_sum.toml", sizes: &[("ROWS", 65536.0), ("D", 1024.0)] },
    Case { name: "softmax", spec: "softmax.toml", sizes: &[("ROWS", 16384.0), ("COLS", 4096.0), ("BLOCK_ROWS", 1.0)] },
    Case { name: "layer_norm", spec: "layer_norm.toml", sizes: &[("ROWS", 16384.0), ("COLS", 4096.0)] },
    Case {
        name: "matmul",
        spec: "matmul.toml",
        sizes: &[("M", 2048.0), ("N", 2048.0), ("K", 2048.0), ("BLOCK_M", 64.0), ("BLOCK_N", 64.0)],
    },
    Case {
        name: "attention",
        spec: "flash_attention_causal.toml",
        sizes: &[("HEADS", 16.0), ("N_CTX", 8192.0), ("HEAD_DIM", 64.0), ("SM_SCALE", 0.125)],
    },
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The example's spec with its sizes set and its kernel paths made absolute, written into `dir`.
fn write_spec(c: &Case, scale: f64, dir: &Path) -> PathBuf {
    let examples = root().join("examples");
    let src = examples.join(c.spec);
    let mut t: toml::Table = std::fs::read_to_string(&src).expect("example spec").parse().expect("toml");
    let consts = t.get_mut("constants").and_then(|v| v.as_table_mut()).expect("[constants]");
    for (i, (k, v)) in c.sizes.iter().enumerate() {
        let v = if i == 0 { (v * scale).round().max(1.0) } else { *v };
        let v = if v.fract() == 0.0 { toml::Value::Integer(v as i64) } else { toml::Value::Float(v) };
        consts.insert(k.to_string(), v);
    }
    let abs = |v: &mut toml::Value| {
        if let toml::Value::String(r) = v {
            *r = examples.join(&*r).to_str().expect("utf-8 path").to_string();
        }
    };
    for (_, k) in t.get_mut("kernels").and_then(|v| v.as_table_mut()).expect("[kernels]").iter_mut() {
        match k {
            toml::Value::Table(kt) => kt.get_mut("kernel").into_iter().for_each(abs),
            v => abs(v),
        }
    }
    let p = dir.join(format!("{}.toml", c.name));
    std::fs::write(&p, toml::to_string(&t).expect("toml")).expect("write spec");
    p
}

/// The CLI binary: `release/tilegrad` under `CARGO_TARGET_DIR` when set, else the repository's
/// `target/`.
fn binary() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), PathBuf::from);
    let bin = target.join("release/tilegrad");
    assert!(bin.exists(), "build the CLI first: cargo build --release ({} is missing)", bin.display());
    bin
}

/// Runs the CLI; returns wall seconds and peak RSS in bytes (read from /proc while it runs).
fn cli(args: &[&str]) -> (f64, u64) {
    let bin = binary();
    let t = Instant::now();
    let mut child = Command::new(&bin).args(args).stdout(std::process::Stdio::null()).spawn().expect("spawn");
    let status_path = format!("/proc/{}/status", child.id());
    let mut peak = 0u64;
    loop {
        if let Ok(s) = std::fs::read_to_string(&status_path) {
            if let Some(kb) =
                s.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
            {
                peak = peak.max(kb * 1024);
            }
        }
        if let Some(st) = child.try_wait().expect("wait") {
            assert!(st.success() || st.code() == Some(1), "tilegrad {args:?}: {st}");
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    (t.elapsed().as_secs_f64(), peak)
}

fn secs<T>(f: impl FnOnce() -> T) -> (f64, T) {
    let t = Instant::now();
    let v = f();
    (t.elapsed().as_secs_f64(), v)
}

/// The bytes of the spec's tensors: inputs, outputs (and saved), gradients, in their dtypes.
fn tensor_bytes(inputs: &tilegrad::check::Named, outputs: &tilegrad::check::Named, diff: &[String]) -> u64 {
    let b = |t: &tilegrad_reference::HostTensor| (t.numel() * t.dtype().size_bytes()) as u64;
    let ins: u64 = inputs.iter().map(|(_, t)| b(t)).sum();
    let outs: u64 = outputs.iter().map(|(_, t)| b(t)).sum();
    let grads: u64 = inputs.iter().filter(|(n, _)| diff.contains(n)).map(|(_, t)| b(t)).sum();
    ins + outs + grads
}

/// A `check --timings` run: wall seconds and its phases (name, seconds).
/// `backend` is `cpu`, `gpu`, or `gpu-host-copies` (`--backend gpu --host-copies`).
fn timed_check(spec: &str, backend: &str, env: &[(&str, &Path)], cold: bool) -> (f64, Vec<(String, f64)>) {
    let mut cmd = Command::new(binary());
    let on = if backend == "cpu" { "cpu" } else { "gpu" };
    cmd.args(["check", spec, "--backend", on, "--trials", "1", "--timings"]);
    if on == "gpu" {
        cmd.args(["--ground", "kernels"]);
    }
    if backend == "gpu-host-copies" {
        cmd.arg("--host-copies");
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    if cold {
        cmd.env("CUDA_CACHE_DISABLE", "1");
    }
    let t = Instant::now();
    let out = cmd.output().expect("spawn");
    let wall = t.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() || out.status.code() == Some(1), "tilegrad check {spec} --backend {backend}: {text}");
    let phases = text
        .lines()
        .skip_while(|l| l.trim() != "timings")
        .skip(1)
        .filter_map(|l| {
            let (name, rest) = l.trim().rsplit_once(" s")?.0.rsplit_once(' ')?;
            Some((name.trim().to_string(), rest.trim().parse().ok()?))
        })
        .collect();
    (wall, phases)
}

/// `--backend gpu`: each case cold, warm, warm through host copies (`--host-copies`) and on the
/// CPU, with the phases of the warm GPU check and of the CPU's.
fn gpu_bench(only: &[String], scale: f64, specs: &Path) {
    println!("{:<13} {:>9} {:>9} {:>9} {:>9} {:>9}", "example", "cold s", "warm s", "copies s", "cpu s", "cpu/warm");
    let mut splits = Vec::new();
    for c in GPU_CASES.iter().filter(|c| only.is_empty() || only.iter().any(|o| c.name.contains(o.as_str()))) {
        let path = write_spec(c, scale, specs);
        let p = path.to_str().expect("utf-8 path");
        let cache = specs.join(format!("cache-{}", c.name));
        let _ = std::fs::remove_dir_all(&cache);
        let env = [("TILEGRAD_CACHE_DIR", cache.as_path())];
        let (cold, _) = timed_check(p, "gpu", &env, true);
        let (warm, gpu_phases) = timed_check(p, "gpu", &env, false);
        let (copies, _) = timed_check(p, "gpu-host-copies", &env, false);
        let (cpu, cpu_phases) = timed_check(p, "cpu", &[], false);
        println!("{:<13} {cold:>9.2} {warm:>9.2} {copies:>9.2} {cpu:>9.2} {:>9.2}", c.name, cpu / warm);
        splits.push((c.name, gpu_phases, cpu_phases));
        let _ = std::fs::remove_dir_all(&cache);
    }
    for (name, gpu, cpu) in splits {
        println!("\n{name}: phases, warm GPU / CPU (s)");
        for (phase, g) in &gpu {
            let c = cpu.iter().find(|(p, _)| p == phase).map_or("-".to_string(), |(_, s)| format!("{s:.3}"));
            println!("  {phase:<44} {g:>8.3} {c:>8}");
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut scale = 1.0;
    let mut only: Vec<String> = Vec::new();
    let mut backend = "cpu".to_string();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--scale" => {
                scale = args[i + 1].parse().expect("--scale K");
                i += 1;
            }
            "--only" => {
                only.push(args[i + 1].clone());
                i += 1;
            }
            "--backend" => {
                backend = args[i + 1].clone();
                i += 1;
            }
            _ => {} // `--bench` from cargo
        }
        i += 1;
    }
    let out = root().join("target/bench-whole/out");
    let specs = root().join("target/bench-whole");
    std::fs::create_dir_all(&out).expect("output folder");
    if backend == "gpu" {
        gpu_bench(&only, scale, &specs);
        let _ = std::fs::remove_dir_all(&specs);
        return;
    }
    assert_eq!(backend, "cpu", "--backend cpu or gpu");
    println!(
        "{:<13} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>7} {:>7} {:>8} {:>8} {:>10} {:>10} {:>6}",
        "example",
        "fwd s",
        "grad s",
        "bwd s",
        "check1 s",
        "check/sum",
        "check2/1",
        "grad x",
        "run x",
        "data MB",
        "bound MB",
        "check MB",
        "grad MB",
        "rss/bd"
    );
    for c in CASES.iter().filter(|c| only.is_empty() || only.iter().any(|o| c.name.contains(o.as_str()))) {
        let path = write_spec(c, scale, &specs);
        let s = spec::load(&path).expect("spec");
        let opts = CheckOptions { trials: 1, ..s.options.clone() };
        let bwd = s.backward.as_ref().expect("a backward");
        // In-process: the engine's parts of a check, and the work of `run` and `grad`.
        let r = check_backward(&s.forward, bwd, &s.inputs, &opts).expect("check");
        let phase = |names: &[&str]| r.timings.phases.iter().filter(|(p, _)| names.contains(&p.as_str())).map(|(_, t)| t).sum::<f64>();
        let (t_fwd, t_grad, t_bwd) =
            (phase(&["forward in the kernels' dtypes"]), phase(&["forward of the ground truth", "ground truth"]), phase(&["backward"]));
        drop(r);
        let (t_run, (ins, outs)) = secs(|| run_forward(&s.forward, &s.inputs, opts.seed).expect("forward"));
        let data = tensor_bytes(&ins, &outs, &s.forward.differentiable);
        drop((ins, outs));
        let (t_gt, _) = secs(|| ground_truth(&s.forward, &s.inputs, &opts).expect("ground truth"));
        let bound = 3 * data + (64 << 20);
        let p = path.to_str().expect("utf-8 path");
        let (c1, m1) = cli(&["check", p, "--trials", "1"]);
        let (c2, _) = cli(&["check", p, "--trials", "2"]);
        let (g, mg) = cli(&["grad", p, "--out", out.to_str().expect("utf-8")]);
        let (rn, _) = cli(&["run", p, "--out", out.to_str().expect("utf-8")]);
        let mb = |b: u64| b as f64 / (1 << 20) as f64;
        println!(
            "{:<13} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>9.2} {:>9.2} {:>7.2} {:>7.2} {:>8.0} {:>8.0} {:>10.0} {:>10.0} {:>6.2}",
            c.name,
            t_fwd,
            t_grad,
            t_bwd,
            c1,
            c1 / (t_fwd + t_grad + t_bwd),
            c2 / c1,
            g / t_gt,
            rn / t_run,
            mb(data),
            mb(bound),
            mb(m1),
            mb(mg),
            m1 as f64 / bound as f64
        );
    }
    let _ = std::fs::remove_dir_all(Path::new(&specs));
}
