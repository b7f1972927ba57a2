//! The GPU backend against the reference interpreter, on every example spec, every broken
//! backward variant of `examples/` and every zoo kernel.
//!
//! - Everywhere: every kernel (as written, and promoted to f64 as the ground truth runs it)
//!   becomes CUDA C, or is one the GPU backend passes to the reference by design (its programs
//!   depend on their order); where NVRTC is installed, the CUDA C compiles.
//! - With a GPU: each check runs with `Backend::Compare`, so that every launch of it (the
//!   forward in the kernels' dtypes and in f64, the backward, its traced and race-resolving
//!   re-runs) runs on both backends, which must leave the same tensors bit for bit (f64 within
//!   1e-13 of the tensor's largest element, where CUDA's and libm's `exp`, `log` or `tanh` may
//!   differ in the last bit; VJP kernels' shadows within 1e-12, their atomics adding in the
//!   device's order) and fail with the same error at the same place; and the check's
//!   verdict must be the CPU's. The zoo's kernels run the same way and pass their plain-Rust
//!   f64 references on the GPU too.
//!
//! Without a GPU the second test says so and checks nothing; the CPU verdicts themselves are
//! tested by `tests/specs.rs`.
//!
//! `TILEGRAD_GPU_SPECS=A,B` runs the tests over every spec only on those whose label contains
//! one of the given pieces (a shorter run on a GPU lent for minutes).

use std::path::{Path, PathBuf};
use tilegrad::check::{check_backward, Backend, CheckOptions, Report, Step};
use tilegrad::spec::{self, KernelOverride, Spec};
use tilegrad_ir::{DType, Kernel};

mod cases;
use cases::CASES;
mod stuck_scan;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

/// Every spec of `examples/` and every broken variant, loaded: (label, spec).
fn all_specs() -> Vec<(String, Spec)> {
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(examples()).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "toml")).collect();
    files.sort();
    let mut out: Vec<(String, Spec)> =
        files.iter().map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), spec::load(p).unwrap())).collect();
    for (variant, spec_name, key, ..) in CASES {
        let o = [KernelOverride { key: key.to_string(), reference: format!("::{variant}") }];
        out.push((variant.to_string(), spec::load_with(&examples().join(format!("{spec_name}.toml")), &o).unwrap()));
    }
    if let Ok(only) = std::env::var("TILEGRAD_GPU_SPECS") {
        out.retain(|(label, _)| only.split(',').any(|piece| label.contains(piece)));
    }
    out
}

fn kernels(s: &Spec) -> Vec<Kernel> {
    let mut out: Vec<Kernel> = Vec::new();
    let steps = s.forward.steps.iter().chain(s.backward.iter().flat_map(|b| b.steps.iter()));
    for st in steps {
        if let Step::Launch(kl) = st {
            if !out.iter().any(|k| *k == *kl.kernel) {
                out.push((*kl.kernel).clone());
                out.push(tilegrad_ir::passes::promote_floats(&kl.kernel, DType::F64).unwrap());
                // Its VJP kernel (the ground truth with `--ground kernels`), where it has one.
                if let Ok(vk) = tilegrad_ad::vjp_kernel(&kl.kernel) {
                    out.push(vk.kernel);
                    // And computing in f32 (the ground truth at native precision).
                    out.push(tilegrad_ad::vjp_kernel_with(&kl.kernel, true, DType::F32).unwrap().kernel);
                }
            }
        }
    }
    out
}

/// Runs `f` on every item in its own thread and returns the error messages, in order.
fn all<T: Sync>(items: &[T], f: impl Fn(&T) -> Result<(), String> + Sync) -> Vec<String> {
    std::thread::scope(|s| {
        let handles: Vec<_> = items.iter().map(|it| s.spawn(|| f(it))).collect();
        handles.into_iter().filter_map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())).err()).collect()
    })
}

#[test]
fn every_kernel_becomes_cuda_c() {
    let specs = all_specs();
    let mut ks: Vec<(String, Kernel)> = Vec::new();
    for (label, s) in &specs {
        for k in kernels(s) {
            if !ks.iter().any(|(_, x)| *x == k) {
                ks.push((label.clone(), k));
            }
        }
    }
    let nvrtc = tilegrad_gpu::nvrtc_present();
    if !nvrtc {
        eprintln!("NVRTC is not installed: the generated CUDA C is not compiled");
    }
    let mut by_reference = 0;
    let failures = all(&ks, |(label, k)| {
        if tilegrad_gpu::codegen::needs_reference(k).is_some() {
            return Ok(());
        }
        // The forms a launch may use: the default blocks, the same blocks with more registers
        // (half as many an SM, taken where the default spills), and the largest blocks (as
        // `TILEGRAD_GPU_THREADS=1024` forces them).
        let err = |e: tilegrad_gpu::GpuError| format!("{label}: `{}`: {e}", k.name);
        let g = tilegrad_gpu::codegen::generate(k).map_err(err)?;
        let blocks = g.min_blocks as usize;
        let roomy = tilegrad_gpu::codegen::generate_with(k, g.threads as usize, Some((blocks / 2).max(1))).map_err(err)?;
        let large = tilegrad_gpu::codegen::generate_with(k, 1024, Some(1)).map_err(err)?;
        // VJP kernels run with float atomics in the hardware's order.
        let unordered = tilegrad_gpu::codegen::generate_ordered(k, false).map_err(err)?;
        let forms: Vec<&tilegrad_gpu::codegen::Generated> =
            if k.name.ends_with("_vjp") { vec![&g, &roomy, &large, &unordered] } else { vec![&g, &roomy, &large] };
        for g in forms {
            if !g.source.contains(tilegrad_gpu::codegen::ENTRY) || g.threads < 32 {
                return Err(format!("{label}: `{}`: no entry point", k.name));
            }
            // Placeholders settled after a loop body is emitted.
            if g.source.contains("TG_PARITY_") {
                return Err(format!("{label}: `{}`: an unsettled parity placeholder", k.name));
            }
            if nvrtc {
                tilegrad_gpu::compile_generated(k, g, "compute_90")
                    .map_err(|e| format!("{label}: `{}` ({} threads): {e}", k.name, g.threads))?;
            }
        }
        let bounds = |g: &tilegrad_gpu::codegen::Generated, b: usize| g.source.contains(&format!("__launch_bounds__({}, {b})", g.threads));
        // At most DEFAULT_THREADS a block, unless a thread's loops would pass the unroll limit:
        // then larger blocks, as many as fill an SM's 1024 threads.
        let grown = g.threads as usize > tilegrad_gpu::codegen::DEFAULT_THREADS;
        if (grown && (g.threads > 1024 || g.threads as usize * blocks > 1024))
            || roomy.threads != g.threads
            || large.threads < g.threads
            || !bounds(&g, blocks)
            || !bounds(&roomy, (blocks / 2).max(1))
            || !bounds(&large, 1)
        {
            return Err(format!(
                "{label}: `{}`: {} threads by default, {} roomy, {} large",
                k.name, g.threads, roomy.threads, large.threads
            ));
        }
        Ok(())
    });
    for (_, k) in &ks {
        by_reference += tilegrad_gpu::codegen::needs_reference(k).is_some() as usize;
    }
    assert!(failures.is_empty(), "{} of {} kernels:\n{}", failures.len(), ks.len(), failures.join("\n\n"));
    // Only the kernels whose programs take turns (locks, tickets) run on the reference.
    assert!(by_reference * 10 <= ks.len(), "{by_reference} of {} kernels would run on the reference", ks.len());
    eprintln!("{} kernels ({} of them by the reference, by design)", ks.len(), by_reference);
}

fn verdict(r: &Report) -> String {
    format!("passed {}, failure {:?}", r.passed, r.failure.as_ref().map(|f| (f.step, &f.message)))
}

#[test]
fn the_gpu_gives_the_reference_results_and_verdicts() {
    if let Err(why) = tilegrad_gpu::usable() {
        eprintln!("skipped: no usable GPU ({why})");
        return;
    }
    let specs = all_specs();
    let failures = all(&specs, |(label, s)| {
        let bwd = s.backward.as_ref().ok_or_else(|| format!("{label}: no backward"))?;
        let opts = CheckOptions { trials: 1, ..s.options.clone() };
        let cpu = check_backward(&s.forward, bwd, &s.inputs, &CheckOptions { backend: Backend::Cpu, ..opts.clone() })
            .map_err(|e| format!("{label}: cpu: {e}"))?;
        let both = check_backward(&s.forward, bwd, &s.inputs, &CheckOptions { backend: Backend::Compare, ..opts.clone() })
            .map_err(|e| format!("{label}: compare: {e}"))?;
        if !both.backend_mismatches.is_empty() {
            return Err(format!("{label}: {}", both.backend_mismatches.join("\n  ")));
        }
        let gpu = check_backward(&s.forward, bwd, &s.inputs, &CheckOptions { backend: Backend::Gpu, ..opts })
            .map_err(|e| format!("{label}: gpu: {e}"))?;
        if both.backend.contains("the GPU failed") || gpu.backend.contains("the GPU failed") {
            return Err(format!("{label}: {}", gpu.backend));
        }
        if verdict(&cpu) != verdict(&gpu) {
            return Err(format!("{label}: verdicts differ\n  cpu: {}\n  gpu: {}\n{gpu}", verdict(&cpu), verdict(&gpu)));
        }
        println!("{label}: {} ({})", if gpu.passed { "pass" } else { "fail" }, gpu.backend);
        Ok(())
    });
    assert!(failures.is_empty(), "{} of {} checks:\n{}", failures.len(), specs.len(), failures.join("\n\n"));
}

#[test]
fn the_zoo_runs_alike_on_both_backends() {
    if let Err(why) = tilegrad_gpu::usable() {
        eprintln!("skipped: no usable GPU ({why})");
        return;
    }
    for name in tilegrad::zoo::names() {
        let r = tilegrad::zoo::run_case_on(name, 7, Backend::Compare).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(r.backend_mismatches.is_empty(), "{name}: {}", r.backend_mismatches.join("\n"));
        assert!(r.passed() && r.launches > 0 && !r.backend.contains("the GPU failed"), "{name}: {r:?}");
        let on_gpu = tilegrad::zoo::run_case_on(name, 7, Backend::Gpu).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(on_gpu.passed(), "{name} on the GPU: {on_gpu:?}");
        println!("{name}: {}", on_gpu.backend);
    }
}

/// The example specs (not the broken variants), where a GPU is usable; else says so and gives
/// nothing.
fn example_specs_on_a_gpu() -> Option<Vec<(String, Spec)>> {
    if let Err(why) = tilegrad_gpu::usable() {
        eprintln!("skipped: no usable GPU ({why})");
        return None;
    }
    Some(all_specs().into_iter().filter(|(l, _)| l.ends_with(".toml")).collect())
}

/// The f64 ground truth by VJP kernels run on the GPU (`--backend gpu --ground kernels`) against
/// the CPU evaluator's, on every example spec whose kernels VJP kernels take: within 1e-12
/// normwise (atomics add in the device's order).
#[test]
fn vjp_kernels_on_the_gpu_give_the_cpu_ground_truth() {
    use tilegrad::check::{ground_truth, Ground};
    let Some(files) = example_specs_on_a_gpu() else { return };
    let failures = all(&files, |(label, s)| {
        let cpu = ground_truth(&s.forward, &s.inputs, &CheckOptions { backend: Backend::Cpu, ..s.options.clone() })
            .map_err(|e| format!("{label}: cpu: {e}"))?;
        let opts = CheckOptions { backend: Backend::Gpu, ground: Ground::Kernels, ..s.options.clone() };
        let gpu = match ground_truth(&s.forward, &s.inputs, &opts) {
            Ok(g) => g,
            Err(e) if e.to_string().contains("not take") => return Ok(()),
            Err(e) => return Err(format!("{label}: gpu: {e}")),
        };
        for ((n, w), (_, g)) in cpu.gradients.iter().zip(&gpu.gradients) {
            let (w, g) = (w.to_f64_vec(), g.to_f64_vec());
            let norm = w.iter().map(|x| x * x).sum::<f64>().sqrt();
            let diff = w.iter().zip(&g).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
            if diff > 1e-12 * norm + 1e-300 {
                return Err(format!("{label}: the gradient of `{n}` differs by {diff:e} (norm {norm:e})"));
            }
        }
        println!("{label}: agrees");
        Ok(())
    });
    assert!(failures.is_empty(), "{} of {} specs:\n{}", failures.len(), files.len(), failures.join("\n\n"));
}

/// Every VJP kernel launch of a check with `--ground kernels`, run by both backends
/// (`Backend::Compare`): with float atomics in the device's order, the shadows agree with the
/// reference's within rounding (1e-12 of each f64 tensor's largest element); with
/// `--deterministic` (program order), as plain launches do. Every example spec whose kernels
/// VJP kernels take.
#[test]
fn vjp_launches_run_alike_on_both_backends() {
    use tilegrad::check::Ground;
    let Some(files) = example_specs_on_a_gpu() else { return };
    let failures = all(&files, |(label, s)| {
        let bwd = s.backward.as_ref().ok_or_else(|| format!("{label}: no backward"))?;
        for deterministic in [false, true] {
            let opts = CheckOptions { trials: 1, backend: Backend::Compare, ground: Ground::Kernels, deterministic, ..s.options.clone() };
            let r = match check_backward(&s.forward, bwd, &s.inputs, &opts) {
                Ok(r) => r,
                Err(e) if e.to_string().contains("not take") => return Ok(()),
                Err(e) => return Err(format!("{label}: {e}")),
            };
            if !r.backend_mismatches.is_empty() {
                return Err(format!("{label} (deterministic {deterministic}): {}", r.backend_mismatches.join("\n  ")));
            }
        }
        println!("{label}: alike");
        Ok(())
    });
    assert!(failures.is_empty(), "{} of {} specs:\n{}", failures.len(), files.len(), failures.join("\n\n"));
}

/// VJP kernels' launches in batches of programs ([`CheckOptions::vjp_memory`]): with no memory
/// to spare, one program per launch, each launch running from its own first program (the device
/// counter and the tapes' slots start there), its loops keeping checkpoints and running each
/// segment again (loops inside loops on the device). With `--deterministic` the ground truth is
/// then the same bit for bit as one launch of every program.
#[test]
fn vjp_launches_in_batches_of_programs_give_the_same_ground_truth() {
    use tilegrad::check::{ground_truth, Ground};
    let Some(files) = example_specs_on_a_gpu() else { return };
    let looped = ["flash_attention.toml", "layer_norm.toml", "kl_div.toml"];
    let files: Vec<_> = files.into_iter().filter(|(l, _)| looped.contains(&l.as_str())).collect();
    assert_eq!(files.len(), looped.len());
    let failures = all(&files, |(label, s)| {
        let opts = CheckOptions { backend: Backend::Gpu, ground: Ground::Kernels, deterministic: true, ..s.options.clone() };
        let whole = ground_truth(&s.forward, &s.inputs, &opts).map_err(|e| format!("{label}: {e}"))?;
        let one = ground_truth(&s.forward, &s.inputs, &CheckOptions { vjp_memory: Some(0), ..opts.clone() })
            .map_err(|e| format!("{label}: one program per launch: {e}"))?;
        for ((n, w), (_, g)) in whole.gradients.iter().zip(&one.gradients) {
            let (w, g) = (w.to_f64_vec(), g.to_f64_vec());
            if !w.iter().any(|&x| x != 0.0) {
                return Err(format!("{label}: the gradient of `{n}` is zero"));
            }
            if let Some(i) = (0..w.len()).find(|&i| w[i].to_bits() != g[i].to_bits()) {
                return Err(format!(
                    "{label}: element {i} of the gradient of `{n}`: {:e} in one launch, {:e} one program per launch",
                    w[i], g[i]
                ));
            }
        }
        println!("{label}: the same");
        Ok(())
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `--deterministic`: VJP kernels on the GPU add in program order, so that two runs give the
/// same ground truth bit for bit, and so does the reference interpreter's run of the same VJP
/// kernels where the forward's ops round alike on both (no transcendental functions, whose f64
/// forms may differ by an ulp) and the GPU takes every launch's VJP kernel.
#[test]
fn deterministic_vjp_kernels_repeat_bit_for_bit() {
    use tilegrad::check::{ground_truth, Ground};
    use tilegrad_ir::{BinaryOp, Op, UnaryOp};
    let Some(files) = example_specs_on_a_gpu() else { return };
    let exact_ops = |s: &Spec| {
        let mut exact = true;
        for step in &s.forward.steps {
            if let Step::Launch(kl) = step {
                kl.kernel.walk(&mut |_, d| {
                    exact &= match d.op {
                        Op::Unary(u) => {
                            matches!(u, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Not | UnaryOp::Sqrt | UnaryOp::Floor | UnaryOp::Ceil)
                        }
                        Op::Binary(b) => b != BinaryOp::Pow,
                        _ => true,
                    }
                });
            }
        }
        exact
    };
    let bitwise = |label: &str, what: &str, a: &tilegrad::check::GroundTruth, b: &tilegrad::check::GroundTruth| -> Result<(), String> {
        for ((n, w), (_, g)) in a.gradients.iter().zip(&b.gradients) {
            let (w, g) = (w.to_f64_vec(), g.to_f64_vec());
            if let Some(i) = (0..w.len()).find(|&i| w[i].to_bits() != g[i].to_bits()) {
                return Err(format!("{label}: {what}: element {i} of the gradient of `{n}`: {:e} and {:e}", w[i], g[i]));
            }
        }
        Ok(())
    };
    let compared = std::sync::atomic::AtomicUsize::new(0);
    let failures = all(&files, |(label, s)| {
        let opts = |backend| CheckOptions { backend, ground: Ground::Kernels, deterministic: true, ..s.options.clone() };
        let cpu = match ground_truth(&s.forward, &s.inputs, &opts(Backend::Cpu)) {
            Ok(g) => g,
            Err(e) if e.to_string().contains("not take") => return Ok(()),
            Err(e) => return Err(format!("{label}: cpu: {e}")),
        };
        let run = || ground_truth(&s.forward, &s.inputs, &opts(Backend::Gpu)).map_err(|e| format!("{label}: gpu: {e}"));
        let (first, second) = (run()?, run()?);
        bitwise(label, "two GPU runs", &first, &second)?;
        // A launch that loads what it stored has the evaluator's ground truth on the GPU in
        // program order (`Executor::refuses_vjp_kernel`), the VJP kernel's on the CPU.
        if exact_ops(s) && first.notes.is_empty() {
            bitwise(label, "CPU and GPU", &cpu, &first)?;
            compared.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        println!("{label}: identical");
        Ok(())
    });
    assert!(failures.is_empty(), "{} of {} specs:\n{}", failures.len(), files.len(), failures.join("\n\n"));
    assert!(compared.into_inner() >= 5, "too few specs compared with the CPU");
}

/// The engine's self-check on the GPU (`gradcheck --backend gpu --ground kernels`): on every
/// example spec whose kernels VJP kernels take, the ground truth computed by VJP kernels on the
/// GPU agrees with central finite differences of the f64 forward, run on the GPU too.
#[test]
fn gradcheck_passes_on_the_gpu() {
    use tilegrad::check::{gradcheck, Ground};
    let Some(files) = example_specs_on_a_gpu() else { return };
    let checked = std::sync::atomic::AtomicUsize::new(0);
    let failures = all(&files, |(label, s)| {
        let opts = CheckOptions { backend: Backend::Gpu, ground: Ground::Kernels, trials: 2, ..s.options.clone() };
        let r = match gradcheck(&s.forward, &s.inputs, &opts, label) {
            Ok(r) => r,
            Err(e) if e.to_string().contains("not take") => return Ok(()),
            Err(e) => return Err(format!("{label}: {e}")),
        };
        checked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if !r.passed {
            return Err(format!("{label}: {r}"));
        }
        println!("{label}: {}", r.trials.iter().map(|t| format!("{:.1e}", t.rel_err)).collect::<Vec<_>>().join(" "));
        Ok(())
    });
    assert!(failures.is_empty(), "{} of {} specs:\n{}", failures.len(), files.len(), failures.join("\n\n"));
    let checked = checked.into_inner();
    assert!(checked * 10 >= files.len() * 9, "gradcheck ran on only {checked} of {} specs", files.len());
}

/// Float atomics in program order are logged per program, 2^15 entries by default: a launch
/// whose programs log more (here 40 trips of 1000 lanes each) runs again on the device with
/// longer logs, rather than going to the reference, and adds in the reference's order bit for
/// bit; one with more programs than their turns at adding in order afford (120 programs: 4.9M
/// adds) runs with the device's order, and says so, its sums within rounding of the reference's,
/// unless `exact_order` asks for program order whatever it costs.
#[test]
fn long_atomic_logs_stay_on_the_gpu() {
    use tilegrad_gpu::{Gpu, GpuOptions, RanOn};
    use tilegrad_ir::KernelBuilder;
    use tilegrad_reference::{HostTensor, Launch, Memory};
    if let Err(why) = tilegrad_gpu::usable() {
        eprintln!("skipped: no usable GPU ({why})");
        return;
    }
    const LANES: usize = 1024;
    const TRIPS: i32 = 40;
    // y[0..1000] += x[pid, t, 0..1000] * (t + 1) for t in 0..40
    let mut b = KernelBuilder::new("many_atomics");
    let x = b.ptr_param("x", DType::F32);
    let y = b.ptr_param("y", DType::F32);
    let pid = b.program_id(0);
    let lanes = b.arange(0, LANES as i64);
    let n = b.i32(1000);
    let mask = b.lt(lanes, n);
    let (z, hi, one) = (b.i32(0), b.i32(TRIPS), b.i32(1));
    b.for_range(z, hi, one, Some(64), &[], |b, t, _| {
        let row = b.i32(TRIPS * 1000);
        let base = b.mul(pid, row);
        let thousand = b.i32(1000);
        let tt = b.mul(t, thousand);
        let base = b.add(base, tt);
        let offs = b.add(base, lanes);
        let px = b.add(x, offs);
        let v = b.load(px, Some(mask), None);
        let t1 = b.add(t, one);
        let w = b.cast(t1, DType::F32);
        let v = b.mul(v, w);
        let py = b.add(y, lanes);
        b.atomic_add(py, v, Some(mask));
        vec![]
    });
    let k = b.finish().unwrap();
    let gpu = Gpu::new().unwrap();
    for programs in [37usize, 120] {
        let mut r = 0x2545f4914f6cdd1du64;
        let mut next = || {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            (r >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        let xs: Vec<f32> = (0..programs * TRIPS as usize * 1000).map(|_| next()).collect();
        let ys: Vec<f32> = (0..1000).map(|_| next()).collect();
        let mut mem = Memory::new();
        let xt = mem.add("x", HostTensor::from_f32(&[xs.len()], xs));
        let yt = mem.add("y", HostTensor::from_f32(&[1000], ys));
        let launch = Launch::new(&k, programs).arg("x", xt).arg("y", yt);
        let mut want = mem.clone();
        launch.run(&mut want).unwrap();
        if programs > 100 {
            // Program order whatever it costs: the programs take their turns (about 2 s here).
            let mut exact = mem.clone();
            let out = gpu.run(&launch, &mut exact, GpuOptions { races: true, ordered_atomics: true, exact_order: true }).unwrap();
            assert!(matches!(out.ran_on, RanOn::Gpu), "ran on {:?}", out.ran_on);
            let (w, g) = (want[yt].as_f32().unwrap(), exact[yt].as_f32().unwrap());
            assert!((0..1000).all(|i| w[i].to_bits() == g[i].to_bits()), "exact order: sums differ from the reference's");
        }
        let out = gpu.run(&launch, &mut mem, GpuOptions { races: true, ordered_atomics: true, exact_order: false }).unwrap();
        let (w, g) = (want[yt].as_f32().unwrap(), mem[yt].as_f32().unwrap());
        if programs < 100 {
            assert!(matches!(out.ran_on, RanOn::Gpu), "ran on {:?}", out.ran_on);
            let differ = (0..1000).filter(|&i| w[i].to_bits() != g[i].to_bits()).count();
            assert_eq!(differ, 0, "{differ} of 1000 sums differ from the reference's");
        } else {
            assert!(matches!(&out.ran_on, RanOn::GpuDeviceOrder(why) if why.contains("40960")), "ran on {:?}", out.ran_on);
            let scale: f32 = w.iter().map(|x| x.abs()).fold(0.0, f32::max);
            let worst = (0..1000).map(|i| (w[i] - g[i]).abs()).fold(0.0, f32::max);
            assert!(worst <= 1e-4 * scale, "sums differ by {worst} (largest {scale})");
        }
    }
}

/// Out-of-bounds lanes of loads, stores and `atomic_add`s fail with the reference's error, at
/// the same op, program and lane, in every flavor a launch compiles to (race marks or not,
/// float atomics in program order or the device's: VJP kernels run without marks, in the
/// device's order, where memory ops take a fast path unless a lane is out of bounds); and
/// where every lane is in bounds, each flavor leaves the reference's results.
#[test]
fn out_of_bounds_lanes_fail_alike_in_every_flavor() {
    use tilegrad_gpu::{Gpu, GpuOptions};
    use tilegrad_ir::KernelBuilder;
    use tilegrad_reference::{HostTensor, Launch, Memory};
    // y[i] = 2 x[i] and z[i % 300] += x[i] for i < limit, 256 lanes a program.
    let mut b = KernelBuilder::new("three_accesses");
    let x = b.ptr_param("x", DType::F32);
    let y = b.ptr_param("y", DType::F32);
    let z = b.ptr_param("z", DType::F32);
    let limit = b.scalar_param("limit", DType::I32);
    let offs = lanes_of_the_program(&mut b);
    let mask = b.lt(offs, limit);
    let px = b.add(x, offs);
    let v = b.load(px, Some(mask), None);
    let two = b.f32(2.0);
    let v2 = b.mul(v, two);
    let py = b.add(y, offs);
    b.store(py, v2, Some(mask));
    let m300 = b.i32(300);
    let zo = b.rem(offs, m300);
    let pz = b.add(z, zo);
    b.atomic_add(pz, v, Some(mask));
    let k = b.finish().unwrap();
    // The reference's side runs everywhere; the GPU's where one is usable, with these small
    // launches' kernels compiled quickly and optimised fully.
    let gpus = match tilegrad_gpu::usable() {
        Ok(()) => vec![Gpu::new().unwrap(), Gpu::new().unwrap().quick_compiles(false)],
        Err(why) => {
            eprintln!("GPU side skipped: no usable GPU ({why})");
            vec![]
        }
    };
    let flavors = [(true, true), (true, false), (false, true), (false, false)];
    let values = |n: usize, seed: u32| -> Vec<f32> {
        (0..n).map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 250.0 - 2.0).collect()
    };
    // Lengths of x, y, z: all in bounds; then x and y too short for lanes of program 4, z for
    // lanes of every program.
    for (nx, ny, nz, fails) in [(2000, 2000, 300, false), (1100, 2000, 300, true), (2000, 1201, 300, true), (2000, 2000, 250, true)] {
        for limit in [1900i64, 2000] {
            let mut mem = Memory::new();
            let xt = mem.add("x", HostTensor::from_f32(&[nx], values(nx, 1)));
            let yt = mem.add("y", HostTensor::from_f32(&[ny], values(ny, 2)));
            let zt = mem.add("z", HostTensor::from_f32(&[nz], vec![0.0; nz]));
            let launch = Launch::new(&k, 8).arg("x", xt).arg("y", yt).arg("z", zt).arg("limit", limit);
            let mut want = mem.clone();
            let reference = launch.run(&mut want).map(|_| ()).map_err(|e| e.to_string());
            assert_eq!(reference.is_err(), fails, "{nx} {ny} {nz}: {reference:?}");
            for (gpu, (races, ordered)) in gpus.iter().flat_map(|g| flavors.map(|f| (g, f))) {
                let mut got = mem.clone();
                let opts = GpuOptions { races, ordered_atomics: ordered, exact_order: false };
                let out = gpu.run(&launch, &mut got, opts).map(|_| ()).map_err(|e| e.to_string());
                assert_eq!(out, reference, "{nx} {ny} {nz} limit {limit}, races {races}, ordered {ordered}");
                if reference.is_ok() {
                    assert_eq!(got[yt].as_f32().unwrap(), want[yt].as_f32().unwrap(), "y: races {races}, ordered {ordered}");
                    let (g, w) = (got[zt].as_f32().unwrap(), want[zt].as_f32().unwrap());
                    // Six or seven adds an element, in some order: equal up to rounding.
                    assert!(g.iter().zip(w).all(|(a, b)| (a - b).abs() <= 1e-5 * (1.0 + b.abs())), "z: races {races}, ordered {ordered}");
                }
            }
        }
    }
}

/// With `quick_first` (the Python package's), a large launch of a kernel new to every cache
/// runs its quick form, compiled in line, while its optimised form compiles in the background;
/// once that is compiled, later launches take it without compiling again. Both give the
/// reference's results.
#[test]
fn quick_first_runs_the_quick_form_until_the_optimised_one_is_compiled() {
    use tilegrad_gpu::GpuOptions;
    use tilegrad_ir::KernelBuilder;
    use tilegrad_reference::{HostTensor, Launch, Memory};
    let Some(gpu) = a_gpu() else { return };
    gpu.quick_first(true);
    // y[i] = x[i] * x[i] + 1, 256 lanes a program, under a name (and so a source) no cache has.
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let name = format!("square_plus_one_{stamp}");
    let mut b = KernelBuilder::new(&name);
    let x = b.ptr_param("x", DType::F32);
    let y = b.ptr_param("y", DType::F32);
    let n = b.scalar_param("n", DType::I32);
    let offs = lanes_of_the_program(&mut b);
    let mask = b.lt(offs, n);
    let px = b.add(x, offs);
    let v = b.load(px, Some(mask), None);
    let sq = b.mul(v, v);
    let one = b.f32(1.0);
    let out = b.add(sq, one);
    let py = b.add(y, offs);
    b.store(py, out, Some(mask));
    let k = b.finish().unwrap();
    // More programs than any device has SMs: a large launch.
    let len = 1000 * 256 - 37;
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[len], (0..len).map(|i| ((i * 7919) % 1013) as f32 / 300.0 - 1.6).collect()));
    let yt = mem.add("y", HostTensor::from_f32(&[len], vec![f32::NAN; len]));
    let launch = Launch::new(&k, 1000).arg("x", xt).arg("y", yt).arg("n", len as i64);
    let mut want = mem.clone();
    launch.run(&mut want).unwrap();
    let start = std::time::Instant::now();
    let mut first = mem.clone();
    gpu.run(&launch, &mut first, GpuOptions::default()).unwrap();
    assert_eq!(first[yt].as_f32().unwrap(), want[yt].as_f32().unwrap(), "the quick form's results");
    tilegrad_gpu::wait_for_background_compiles(std::time::Duration::from_secs(60));
    let mine = |since| gpu.compiles_since(since).into_iter().filter(|c| c.what.starts_with(&name)).map(|c| c.what).collect::<Vec<_>>();
    // The two compile side by side: either may end first.
    let mut compiled = mine(start);
    compiled.sort();
    assert_eq!(compiled, [name.clone(), format!("{name}, compiled quickly")], "the quick form in line and the optimised one");
    let again = std::time::Instant::now();
    let mut second = mem.clone();
    gpu.run(&launch, &mut second, GpuOptions::default()).unwrap();
    assert_eq!(second[yt].as_f32().unwrap(), want[yt].as_f32().unwrap(), "the optimised form's results");
    assert!(mine(again).is_empty(), "the optimised form, compiled, is taken without a compile: {:?}", mine(again));
}

/// A program that loads an element another program stores is a race the device finds after the
/// launch (its marks of reads against its stamps of stores, 32-bit and 64-bit; in f32, and in
/// the f64 form the ground truth runs), and the
/// reference then reports, as it does alone; without it, a launch that reads, stores and adds
/// atomically runs on the device. (The check read its arguments one slot off, so that it
/// found no such race, and where a tensor was also updated atomically it looped over a device
/// address's worth of elements: 2 s of every layer norm backward of a thousand rows.)
#[test]
fn a_read_of_what_another_program_stores_is_found_on_the_device() {
    use tilegrad_gpu::{GpuOptions, RanOn};
    use tilegrad_ir::KernelBuilder;
    use tilegrad_reference::{HostTensor, Launch, Memory};
    let Some(gpu) = a_gpu() else { return };
    // x[i] = 2 x[i + shift] for the 256 lanes of each program, and z[i % 300] += x[i].
    let mut b = KernelBuilder::new("shifted_double");
    let x = b.ptr_param("x", DType::F32);
    let z = b.ptr_param("z", DType::F32);
    let shift = b.scalar_param("shift", DType::I32);
    let n = b.scalar_param("n", DType::I32);
    let offs = lanes_of_the_program(&mut b);
    let read = b.add(offs, shift);
    let in_range = b.lt(read, n);
    let px = b.add(x, read);
    let v = b.load(px, Some(in_range), None);
    let two = b.f32(2.0);
    let v2 = b.mul(v, two);
    let py = b.add(x, offs);
    b.store(py, v2, Some(in_range));
    let m300 = b.i32(300);
    let zo = b.rem(offs, m300);
    let pz = b.add(z, zo);
    b.atomic_add(pz, v, Some(in_range));
    let k = b.finish().unwrap();
    // Its f64 form too, as the ground truth's forward runs it.
    let k64 = tilegrad_ir::passes::promote_floats(&k, DType::F64).unwrap();
    let values: Vec<f32> = (0..2048).map(|i| ((i * 37 % 101) as f32) / 25.0 - 2.0).collect();
    let tensor = |wide: bool, v: Vec<f32>| match wide {
        true => HostTensor::from_f64(&[v.len()], v.iter().map(|&x| x as f64).collect()),
        false => HostTensor::from_f32(&[v.len()], v),
    };
    for (k, wide, ordered) in [(&k, false, true), (&k, false, false), (&k64, true, true), (&k64, true, false)] {
        for shift in [0i64, 1] {
            let mut mem = Memory::new();
            let xt = mem.add("x", tensor(wide, values.clone()));
            let zt = mem.add("z", tensor(wide, vec![0.0; 300]));
            let launch = Launch::new(k, 8).arg("x", xt).arg("z", zt).arg("shift", shift).arg("n", 2048i64);
            let mut want = mem.clone();
            let reference = launch.run(&mut want).map(|_| ()).map_err(|e| e.to_string());
            assert_eq!(reference.is_err(), shift == 1, "{reference:?}");
            let opts = GpuOptions { races: true, ordered_atomics: ordered, exact_order: false };
            // Timed once compiled, the fastest of three runs (the suite's other tests compile
            // and launch beside it).
            let _ = gpu.run(&launch, &mut mem.clone(), opts);
            let mut took = std::time::Duration::MAX;
            let (mut got, mut out) = (mem.clone(), Err(tilegrad_gpu::GpuError::Driver("not run".into())));
            for _ in 0..3 {
                got = mem.clone();
                let t = std::time::Instant::now();
                out = gpu.run(&launch, &mut got, opts);
                took = took.min(t.elapsed());
            }
            match &out {
                Ok(o) if shift == 0 => {
                    assert!(matches!(o.ran_on, RanOn::Gpu), "f64 {wide}, ordered {ordered}: {:?}", o.ran_on);
                    assert_eq!(got[xt].to_f64_vec(), want[xt].to_f64_vec(), "f64 {wide}, ordered {ordered}");
                }
                _ => {}
            }
            assert_eq!(out.map(|_| ()).map_err(|e| e.to_string()), reference, "f64 {wide}, ordered {ordered}, shift {shift}");
            assert!(took.as_secs_f64() < 1.0, "f64 {wide}, ordered {ordered}, shift {shift}: {took:?}");
        }
    }
}

/// A launch of 2^24 programs or more stamps its store marks in 64 bits (a form of its own, see
/// `Flavor::wide`): a batch of the last programs of such a grid (program ids past 2^24, which
/// 32-bit stamps cannot hold) writes on the device what the reference writes where each
/// stores twice to an element of its own, and where pairs of them store to one element, fails
/// as the reference does.
#[test]
fn store_marks_of_launches_past_2_24_programs_take_64_bits() {
    use tilegrad_gpu::GpuOptions;
    use tilegrad_ir::KernelBuilder;
    use tilegrad_reference::{HostTensor, Launch, Memory, Options};
    let gpu = a_gpu();
    // x[(pid - base) // per] = pid, then pid + 1
    let mut b = KernelBuilder::new("last_programs");
    let x = b.ptr_param("x", DType::I32);
    let base = b.scalar_param("base", DType::I32);
    let per = b.scalar_param("per", DType::I32);
    let pid = b.program_id(0);
    let from = b.sub(pid, base);
    let at = b.floordiv(from, per);
    let px = b.add(x, at);
    b.store(px, pid, None);
    // A program's second store of an element is no race: a stamp that dropped the program's
    // high bits would take it for another program's.
    let one = b.i32(1);
    let v1 = b.add(pid, one);
    b.store(px, v1, None);
    let k = b.finish().unwrap();
    let base = tilegrad_gpu::codegen::WIDE_PROGRAMS;
    let batch = base..base + 300;
    for per in [1i64, 2] {
        let mut mem = Memory::new();
        let xt = mem.add("x", HostTensor::from_i32(&[300], (0..300).map(|i| 7 * i - 1000).collect()));
        let opts = Options { programs: Some(batch.clone()), ..Options::default() };
        let launch = Launch::new(&k, (base + 300) as u32).options(opts).arg("x", xt).arg("base", base as i64).arg("per", per);
        let mut want = mem.clone();
        let reference = launch.run(&mut want).map(|_| ()).map_err(|e| e.to_string());
        assert_eq!(reference.is_err(), per == 2, "{reference:?}");
        let Some(gpu) = &gpu else { continue };
        let mut got = mem.clone();
        let out = gpu.run(&launch, &mut got, GpuOptions::default());
        assert_eq!(out.as_ref().map(|_| ()).map_err(|e| e.to_string()), reference, "{per} a element");
        if per == 1 {
            assert!(matches!(out.unwrap().ran_on, tilegrad_gpu::RanOn::Gpu));
            assert_eq!(got[xt].to_f64_vec(), want[xt].to_f64_vec());
        }
    }
}

/// The fuzzer's cumsum backward whose `while` never moves on (`tests/stuck_scan`): the GPU
/// finds it at its first trip, as the reference does, with the same error at the same place
/// (it ran to the 10^7-trip bound before the GPU followed the condition's inputs).
#[test]
fn a_stuck_while_loop_fails_on_the_gpu_as_on_the_cpu() {
    if let Err(why) = tilegrad_gpu::usable() {
        eprintln!("skipped: no usable GPU ({why})");
        return;
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gpu-stuck-scan");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("k.py"), stuck_scan::KERNELS).unwrap();
    std::fs::write(dir.join("s.toml"), stuck_scan::SPEC).unwrap();
    let s = spec::load(&dir.join("s.toml")).unwrap();
    let bwd = s.backward.as_ref().unwrap();
    let run = |backend| {
        let t = std::time::Instant::now();
        let r = check_backward(&s.forward, bwd, &s.inputs, &CheckOptions { backend, trials: 1, ..s.options.clone() }).unwrap();
        (r, t.elapsed())
    };
    let (cpu, _) = run(Backend::Cpu);
    // Timed warm: the first run's compiles wait on those of the suite's other tests.
    let _ = run(Backend::Gpu);
    let (gpu, took) = run(Backend::Gpu);
    let message = &gpu.failure.as_ref().expect("the backward fails").message;
    assert!(message.contains("k.py:19:5: kernel `scan_bwd_stuck`, op `while`, program (0, 0, 0)"), "{gpu}");
    assert!(message.contains("can never end"), "{gpu}");
    assert_eq!(verdict(&cpu), verdict(&gpu), "{gpu}");
    assert!(!gpu.backend.contains("the GPU failed"), "{}", gpu.backend);
    assert!(took.as_secs() < 60, "{took:?}");
}

/// A GPU, or `None` (the test then says so and checks nothing).
/// The element offsets of a program's 256 lanes: `program_id(0) * 256 + arange(0, 256)`.
fn lanes_of_the_program(b: &mut tilegrad_ir::KernelBuilder) -> tilegrad_ir::Value {
    let pid = b.program_id(0);
    let width = b.i32(256);
    let base = b.mul(pid, width);
    let lanes = b.arange(0, 256);
    b.add(base, lanes)
}

fn a_gpu() -> Option<tilegrad_gpu::Gpu> {
    match tilegrad_gpu::usable().and_then(|()| tilegrad_gpu::Gpu::new().map_err(|e| e.to_string())) {
        Ok(g) => Some(g),
        Err(why) => {
            eprintln!("skipped: no usable GPU ({why})");
            None
        }
    }
}

/// A device copy of f64 values (the buffer keeps it alive).
fn on_device(gpu: &tilegrad_gpu::Gpu, v: &[f64]) -> tilegrad_gpu::DeviceBuffer {
    let b = gpu.alloc_zeroed(v.len() * 8).unwrap();
    let t = tilegrad_gpu::DeviceTensor { name: "v".into(), dtype: DType::F64, numel: v.len(), addr: b.addr() };
    gpu.upload_tensor(&t, &tilegrad_reference::HostTensor::from_f64(&[v.len()], v.to_vec())).unwrap();
    b
}

/// The device's normal draws are the host's bit for bit, as f64 and rounded to f32, whatever
/// the length (odd ones end in half a Box-Muller pair) and the key.
#[test]
fn device_draws_are_the_host_draws_bit_for_bit() {
    let Some(gpu) = a_gpu() else { return };
    for (n, key) in [(1usize, 0u64), (7, 5), (1000, u64::MAX), (3_000_001, 42)] {
        let host = tilegrad::check::standard_normal(n, key);
        for f32 in [false, true] {
            let width = if f32 { 4 } else { 8 };
            let b = gpu.alloc_zeroed(n * width).unwrap();
            gpu.draw_normal(b.addr(), n, key, 0.0, 1.0, f32).unwrap();
            let dtype = if f32 { DType::F32 } else { DType::F64 };
            let t = tilegrad_gpu::DeviceTensor { name: "draw".into(), dtype, numel: n, addr: b.addr() };
            let got = gpu.download_tensor(&t).unwrap().to_f64_vec();
            let want: Vec<f64> = host.iter().map(|&x| if f32 { f64::from(x as f32) } else { x }).collect();
            let differ = got.iter().zip(&want).position(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(differ, None, "n {n}, key {key}, f32 {f32}: element {differ:?}");
        }
    }
}

/// Comparisons on the device give the host's reports: counts, maxima, the worst element and
/// the error map exactly, the norms to the order of their sums; passing and failing, with NaN
/// and infinite elements, with and without a replay and a computation in the kernels' dtypes.
#[test]
fn device_comparisons_are_the_host_comparisons() {
    use tilegrad::check::device_compare::{compare_on_device, Compared, Naming};
    use tilegrad::check::{compare_by, verdict, Tolerance};
    let Some(gpu) = a_gpu() else { return };
    let n = 300_007;
    let shape = [n / 7, 7];
    let e = tilegrad::check::standard_normal(n, 1);
    let noise = tilegrad::check::standard_normal(n, 2);
    let near: Vec<f64> = e.iter().zip(&noise).map(|(a, z)| a + 1e-7 * z).collect();
    let mut wrong = near.clone();
    for i in (0..n).step_by(997) {
        wrong[i] += 0.5;
    }
    let mut poisoned = near.clone();
    poisoned[12_345] = f64::NAN;
    poisoned[200_000] = f64::INFINITY;
    let r64: Vec<f64> = e.iter().zip(&noise).map(|(a, z)| a + 1e-13 * z).collect();
    let noisy: Vec<f64> = e.iter().zip(&noise).map(|(a, z)| a - 3e-3 * z).collect();
    let (de, dr, dn) = (on_device(&gpu, &e), on_device(&gpu, &r64), on_device(&gpu, &noisy));
    // A wrong backward's replays: the f64 one as wrong as it, the f32 one 3e-3 off that.
    let r64w: Vec<f64> = wrong.iter().zip(&noise).map(|(a, z)| a + 1e-13 * z).collect();
    let noisyw: Vec<f64> = r64w.iter().zip(&noise).map(|(a, z)| a - 3e-3 * z).collect();
    let (drw, dnw) = (on_device(&gpu, &r64w), on_device(&gpu, &noisyw));
    // `of_replay`: the noisy tensor is the backward replayed in f32, its gap measured from the
    // f64 replay (a check kept on the device); else the truth in the kernels' dtypes (Python's).
    for (label, got, dtype, replay, with_noisy, of_replay) in [
        ("f32 near, replay", &near, DType::F32, true, false, false),
        ("f32 wrong, replay", &wrong, DType::F32, true, false, false),
        ("f32 poisoned, plain", &poisoned, DType::F32, false, false, false),
        ("bf16 wrong, replay and noisy", &wrong, DType::BF16, true, true, false),
        ("bf16 wrong, replay and its f32 replay", &wrong, DType::BF16, true, true, true),
        ("f64 near, plain", &near, DType::F64, false, false, false),
    ] {
        let (r64, noisy, dr, dn) = if of_replay { (&r64w, &noisyw, &drw, &dnw) } else { (&r64, &noisy, &dr, &dn) };
        let noisy_of = if of_replay { r64 } else { &e };
        let tol = Tolerance::for_dtype(dtype, false);
        let dg = on_device(&gpu, got);
        let at = |i: usize| got[i];
        let nz = with_noisy.then_some(&noisy[..]);
        let floor = if replay {
            verdict::elementwise_scale(if with_noisy { noisy_of } else { r64 }, nz, &at, dtype == DType::F32, tol.atol)
        } else {
            0.0
        };
        let (host, host_worst) = compare_by("c", "t", dtype, &shape, tol, &e, at, 0, floor);
        let c = Compared {
            n,
            expected: de.addr(),
            got: dg.addr(),
            replay: replay.then(|| dr.addr()),
            noisy: with_noisy.then(|| dn.addr()),
            noisy_of_replay: of_replay,
            terms: None,
        };
        let naming = Naming { name: "c", tensor: "t", dtype, shape: &shape, trial: 0 };
        let dev = compare_on_device(&gpu, c, naming, tol, false).unwrap();
        let r = &dev.report;
        assert_eq!((r.passed, r.over_tolerance, r.nan, r.inf), (host.passed, host.over_tolerance, host.nan, host.inf), "{label}");
        assert_eq!(dev.worst, host_worst, "{label}");
        assert_eq!(format!("{:?}", r.worst), format!("{:?}", host.worst), "{label}");
        // As text: a NaN element makes the maps unequal as values.
        assert_eq!(format!("{:?}", r.error_map), format!("{:?}", host.error_map), "{label}");
        let same = |a: f64, b: f64| a.to_bits() == b.to_bits() || (a - b).abs() <= 1e-12 * a.abs().max(b.abs());
        assert!(same(r.max_abs_err, host.max_abs_err) && same(r.max_rel_err, host.max_rel_err), "{label}");
        assert!(
            same(r.normwise_rel_err, host.normwise_rel_err) || r.normwise_rel_err.is_nan() && host.normwise_rel_err.is_nan(),
            "{label}"
        );
        if replay {
            let judged = verdict::Replayed { truth: &e, got: &at, r64, r32: nz, r32_of: noisy_of, cot_rms: 1.0 }.judge(dtype, false);
            let (f, q) = dev.norms.expect("norms with a replay").judge(n, 1.0, dtype, false);
            assert!(same(f.error, judged.0.error) && same(q.units, judged.1.units), "{label}: {f:?} {q:?} against {judged:?}");
            assert_eq!((f.passed, q.passed), (judged.0.passed, judged.1.passed), "{label}");
        }
    }
}

/// A check that keeps its tensors on the device (`device_resident`, the default) gives the
/// report of the same check through host copies (`--host-copies`), on every example spec and
/// broken variant with the ground truth by VJP kernels, over two trials: the same verdicts,
/// failures, notes and errors, and the same figures within 1e-6 relatively (the VJP kernels'
/// f64 atomics add in the device's order, and the device adds its sums in another order).
/// A failing gradient's worst element gets the same blame. Checks it leaves to the host (host
/// steps, a failing forward, a backward that fails to run) give the host's report by
/// construction; the examples must mostly stay on the device.
#[test]
fn checks_kept_on_the_device_give_the_host_copies_reports() {
    use tilegrad::check::Ground;
    if let Err(why) = tilegrad_gpu::usable() {
        eprintln!("skipped: no usable GPU ({why})");
        return;
    }
    let specs = all_specs();
    let stayed = std::sync::atomic::AtomicUsize::new(0);
    let failures = all(&specs, |(label, s)| {
        let bwd = s.backward.as_ref().ok_or_else(|| format!("{label}: no backward"))?;
        let opts = CheckOptions { trials: 2, backend: Backend::Gpu, ground: Ground::Kernels, ..s.options.clone() };
        let dev = check_backward(&s.forward, bwd, &s.inputs, &opts);
        let aside = dev.as_ref().ok().and_then(|r| r.timings.phases.iter().find(|(p, _)| p.contains("stepped aside")).cloned());
        // Host steps keep a check on the device: sums, chunks and concatenations run there,
        // other host steps on copies of what they read (their transposes likewise).
        let host_steps_on_device =
            ["block_sum.toml", "swiglu_chunk.toml", "cross_entropy_fused.toml", "cross_entropy_item.toml", "cross_entropy_mean.toml"];
        if let (Some((why, _)), true) = (&aside, host_steps_on_device.contains(&label.as_str())) {
            return Err(format!("{label}: stepped aside: {why}"));
        }
        if let Some((why, _)) = aside {
            // Then the report is the one through host copies.
            println!("{label}: {} ({why})", dev.map_or_else(|e| e.to_string(), |r| verdict(&r)));
            return Ok(());
        }
        let host = check_backward(&s.forward, bwd, &s.inputs, &CheckOptions { device_resident: false, ..opts.clone() });
        let (host, dev) = match (host, dev) {
            (Ok(h), Ok(d)) => (h, d),
            (Err(h), Err(d)) if h.to_string() == d.to_string() => return Ok(()),
            (h, d) => return Err(format!("{label}: host {:?}\n  device {:?}", h.map(|r| verdict(&r)), d.map(|r| verdict(&r)))),
        };
        if !dev.backend.contains("tensors kept on the device") {
            println!("{label}: {} (through host copies)", verdict(&dev));
            return Ok(());
        }
        stayed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let same = same_reports(&host, &dev).map_err(|e| format!("{label}: {e}"));
        println!("{label}: {} (on the device{})", verdict(&dev), if same.is_err() { ", DIFFERS" } else { "" });
        same
    });
    let stayed = stayed.into_inner();
    println!("{stayed} of {} checks stayed on the device", specs.len());
    assert!(failures.is_empty(), "{} of {} checks:\n{}", failures.len(), specs.len(), failures.join("\n\n"));
    // All of them: most stay (a run narrowed by `TILEGRAD_GPU_SPECS` may hold few).
    let narrowed = std::env::var_os("TILEGRAD_GPU_SPECS").is_some();
    assert!(narrowed || stayed >= 20, "only {stayed} checks stayed on the device");
}

/// Elements asked about (`--blame-element`) keep a check on the device, and are explained as
/// through host copies: the same element, its true value within 1e-9, the same value checked,
/// the same writers and lines.
#[test]
fn elements_asked_about_are_explained_alike_on_the_device() {
    use tilegrad::check::Ground;
    if let Err(why) = tilegrad_gpu::usable() {
        eprintln!("skipped: no usable GPU ({why})");
        return;
    }
    let specs: Vec<(String, Spec)> = all_specs()
        .into_iter()
        .filter(|(l, _)| ["softmax.toml", "layer_norm.toml", "linear_tf32.toml", "softmax_bwd_broken_axis"].contains(&l.as_str()))
        .collect();
    let failures = all(&specs, |(label, s)| {
        let bwd = s.backward.as_ref().ok_or("no backward")?;
        let gname = bwd.gradients[0].1.clone();
        // Its middle element (the shape from a CPU check's report).
        let cpu =
            check_backward(&s.forward, bwd, &s.inputs, &CheckOptions { trials: 1, ..s.options.clone() }).map_err(|e| e.to_string())?;
        let shape = cpu.gradients[0].shape.clone();
        let index: Vec<usize> = shape.iter().map(|n| n / 2).collect();
        let opts = CheckOptions {
            trials: 2,
            backend: Backend::Gpu,
            ground: Ground::Kernels,
            blame_elements: vec![(gname.clone(), index)],
            ..s.options.clone()
        };
        let dev = check_backward(&s.forward, bwd, &s.inputs, &opts).map_err(|e| format!("{label}: {e}"))?;
        let host =
            check_backward(&s.forward, bwd, &s.inputs, &CheckOptions { device_resident: false, ..opts }).map_err(|e| e.to_string())?;
        if !dev.backend.contains("tensors kept on the device") {
            return Err(format!("{label}: not kept on the device ({})", dev.backend));
        }
        let (d, h) = (&dev.explained, &host.explained);
        let same = d.len() == 1
            && h.len() == 1
            && d[0].tensor == h[0].tensor
            && d[0].trial == h[0].trial
            && d[0].element.index == h[0].element.index
            && (d[0].element.expected - h[0].element.expected).abs() <= 1e-9 * h[0].element.expected.abs().max(1.0)
            && d[0].element.got == h[0].element.got
            && blamed_element(&d[0].element) == blamed_element(&h[0].element);
        println!("{label}: {} explained{}", d.len(), if same { "" } else { ", DIFFERS" });
        if same {
            Ok(())
        } else {
            Err(format!("{label}:\n  host   {h:?}\n  device {d:?}"))
        }
    });
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Two reports of one check agree: verdicts, failure, notes, and every compared tensor's
/// figures within 1e-6 relatively.
fn same_reports(a: &Report, b: &Report) -> Result<(), String> {
    if verdict(a) != verdict(b) {
        return Err(format!("verdicts differ: {} / {}", verdict(a), verdict(b)));
    }
    let notes = |r: &Report| r.notes.iter().map(|n| n.message.clone()).collect::<Vec<_>>();
    if notes(a) != notes(b) {
        return Err(format!("notes differ: {:?} / {:?}", notes(a), notes(b)));
    }
    let close = |x: f64, y: f64| x == y || (x - y).abs() <= 1e-6 * x.abs().max(y.abs()) || (x.is_nan() && y.is_nan());
    let tensors = |r: &Report| r.forward.iter().chain(&r.gradients).cloned().collect::<Vec<_>>();
    let (ta, tb) = (tensors(a), tensors(b));
    if ta.len() != tb.len() {
        return Err(format!("{} tensors compared / {}", ta.len(), tb.len()));
    }
    for (x, y) in ta.iter().zip(&tb) {
        let same = x.tensor == y.tensor
            && x.passed == y.passed
            && x.over_tolerance == y.over_tolerance
            && x.nan == y.nan
            && x.inf == y.inf
            && close(x.max_abs_err, y.max_abs_err)
            && close(x.max_rel_err, y.max_rel_err)
            && close(x.normwise_rel_err, y.normwise_rel_err)
            && match (&x.formula, &y.formula) {
                (Some(f), Some(g)) => f.passed == g.passed && (close(f.error, g.error) || f.error.max(g.error) < 1e-12),
                (None, None) => true,
                _ => false,
            }
            && match (&x.rounding, &y.rounding) {
                (Some(f), Some(g)) => f.passed == g.passed && close(f.units, g.units),
                (None, None) => true,
                _ => false,
            };
        if !same {
            return Err(format!("`{}` differs:\n  host   {x:?}\n  device {y:?}", x.tensor));
        }
        if blamed(x) != blamed(y) {
            return Err(format!("`{}`: blame differs:\n  host   {:?}\n  device {:?}", x.tensor, blamed(x), blamed(y)));
        }
    }
    Ok(())
}

/// A report's worst element and its blame (writers, and the slice's lines in their ranking), in
/// words.
fn blamed(r: &tilegrad::check::TensorReport) -> Option<String> {
    r.worst.as_ref().map(blamed_element)
}

/// An element and its blame, in words.
fn blamed_element(w: &tilegrad::check::Worst) -> String {
    let blame = w.blame.as_ref().map(|b| {
        let lines: Vec<&str> = b.slice.as_ref().map_or(Vec::new(), |s| s.lines.iter().map(|l| l.loc.as_str()).collect());
        format!("via {:?}, sites {:?}, lines {lines:?}", b.via, b.sites)
    });
    format!("element {:?}: {blame:?}", w.index)
}

/// An f64 `dot` of 64x64 tiles (67 KB of scratch a block, doubled) and a row sum: its scratch
/// in dynamic shared memory (where the device lets a block have that much) and in global
/// memory gives the reference's results bit for bit, over 5 programs of a 300x64 by 64x70
/// product (partial tiles masked).
#[test]
fn scratch_in_dynamic_shared_and_in_global_memory_gives_the_reference_results() {
    const DOT: &str = r#"
import triton
import triton.language as tl

@triton.jit
def mm(a_ptr, b_ptr, c_ptr, s_ptr, M, N, BM: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rk = tl.arange(0, BK)
    rn = tl.arange(0, BN)
    a = tl.load(a_ptr + rm[:, None] * BK + rk[None, :], mask=rm[:, None] < M, other=0.0)
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :], mask=rn[None, :] < N, other=0.0)
    c = tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], c, mask=(rm[:, None] < M) & (rn[None, :] < N))
    tl.store(s_ptr + rm, tl.sum(c * c, axis=1), mask=rm < M)
"#;
    use tilegrad_gpu::codegen::{generate, set_dynamic_shared_limit, ScratchIn};
    use tilegrad_ir::triton::{convert, ConstValue, ConvertOptions};
    use tilegrad_reference::{HostTensor, Launch, Memory};
    let Some(gpu) = a_gpu() else { return };
    let constexprs = [("BM", 64), ("BK", 64), ("BN", 64)].iter().map(|(n, v)| (n.to_string(), ConstValue::Int(*v))).collect();
    let ptrs = ["a_ptr", "b_ptr", "c_ptr", "s_ptr"].iter().map(|n| (n.to_string(), DType::F64)).collect();
    let k = convert(DOT, "mm.py", "mm", &ConvertOptions { constexprs, pointer_dtypes: ptrs, ..ConvertOptions::default() }).unwrap();
    let (m, n) = (300usize, 70usize);
    let mut r = 0x9e3779b97f4a7c15u64;
    let mut draw = |len: usize| -> Vec<f64> {
        (0..len)
            .map(|_| {
                r ^= r << 13;
                r ^= r >> 7;
                r ^= r << 17;
                (r >> 11) as f64 / (1u64 << 53) as f64 - 0.5
            })
            .collect()
    };
    let mut mem = Memory::new();
    let a = mem.add("a", HostTensor::from_f64(&[m * 64], draw(m * 64)));
    let b = mem.add("b", HostTensor::from_f64(&[64 * n], draw(64 * n)));
    let c = mem.add("c", HostTensor::from_f64(&[m * n], vec![0.0; m * n]));
    let s = mem.add("s", HostTensor::from_f64(&[m], vec![0.0; m]));
    let launch = Launch::new(&k, m.div_ceil(64))
        .arg("a_ptr", a)
        .arg("b_ptr", b)
        .arg("c_ptr", c)
        .arg("s_ptr", s)
        .arg("M", m as i64)
        .arg("N", n as i64);
    let mut want = mem.clone();
    launch.run(&mut want).unwrap();
    // The device's own limits (set by `Gpu::new`), then none: scratch in global memory. (A
    // test beside this one starting a `Gpu` sets the device's limits again: this one then
    // runs the shared form twice, which must agree all the same.)
    for limits in [true, false] {
        if !limits {
            set_dynamic_shared_limit(0, 0);
        }
        let g = generate(&k).unwrap();
        assert!(g.scratch_bytes > 96 * 1024, "{} bytes of scratch", g.scratch_bytes);
        let place = g.scratch_in;
        if !limits {
            assert_eq!(place, ScratchIn::Global);
        }
        eprintln!("scratch of {} bytes in {place:?}", g.scratch_bytes);
        let mut got = mem.clone();
        gpu.run(&launch, &mut got, tilegrad_gpu::GpuOptions::default()).unwrap();
        for t in [c, s] {
            let (w, g) = (want[t].as_f64().unwrap(), got[t].as_f64().unwrap());
            let differ = w.iter().zip(g).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
            assert_eq!(differ, 0, "scratch in {place:?}: {differ} elements differ from the reference's");
        }
    }
    drop(tilegrad_gpu::Gpu::new().unwrap());
}

/// The device's conversions between float dtypes are the host's bit for bit: widening exact,
/// narrowing to f32 rounded to nearest, to f16 and bf16 through f32 (ties, subnormals, overflow
/// to infinity, signed zeros), and the NaN fill of an `empty` allocation is NaN in every float
/// dtype.
#[test]
fn device_conversions_are_the_host_conversions() {
    use tilegrad_reference::{round_to, HostTensor};
    let Some(gpu) = a_gpu() else { return };
    let mut v: Vec<f64> = vec![0.0, -0.0, 1.0, -1.5, 65504.0, 65520.0, 65519.99, 1e6, -1e6, 3.4e38, 3.39e38, 1e-39, -1e-40];
    v.extend([6.0e-8, 5.96e-8, 2.98e-8, 2.99e-8, 6.1e-5, 6.09e-5, 1.0 + 1.0 / 1024.0 + 1.0 / 2048.0, 1.0 + 1.0 / 256.0]);
    v.extend([f64::INFINITY, f64::NEG_INFINITY, 1.0 + f64::EPSILON, 1.0 + 2f64.powi(-24), 1.0 + 2f64.powi(-24) + 2f64.powi(-40)]);
    let mut r = 0x2545f4914f6cdd1du64;
    for _ in 0..20000 {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        let m = (r >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
        v.push(m * 2f64.powi((r % 200) as i32 - 150));
    }
    let floats = [DType::F16, DType::BF16, DType::F32, DType::F64];
    for from in floats {
        let h = HostTensor::from_f64_as(from, &[v.len()], &v);
        let (src, _keep) = gpu.upload_new("src", &h).unwrap();
        for to in floats {
            let dst = gpu.alloc_zeroed(v.len() * tilegrad_gpu::device_bytes(to)).unwrap();
            gpu.convert(src.addr, from, dst.addr(), to, v.len()).unwrap();
            let t = tilegrad_gpu::DeviceTensor { name: "dst".into(), dtype: to, numel: v.len(), addr: dst.addr() };
            let got = gpu.download_tensor(&t).unwrap();
            let bad = (0..v.len()).find(|&i| got.get_f64(i).to_bits() != round_to(to, h.get_f64(i)).to_bits());
            assert!(bad.is_none(), "{from} to {to}: {:?} became {:?}", bad.map(|i| h.get_f64(i)), bad.map(|i| got.get_f64(i)));
        }
    }
    for d in floats {
        let b = gpu.alloc_zeroed(7 * tilegrad_gpu::device_bytes(d)).unwrap();
        gpu.fill_nan(b.addr(), d, 7).unwrap();
        let t = tilegrad_gpu::DeviceTensor { name: "nan".into(), dtype: d, numel: 7, addr: b.addr() };
        let got = gpu.download_tensor(&t).unwrap();
        assert!((0..7).all(|i| got.get_f64(i).is_nan()), "{d}");
    }
}

/// Max and min reductions give the reference's results bit for bit where picking shows: signed
/// zeros tied at the extreme (-0 < +0, wherever they are), NaNs among numbers (ignored), rows of
/// NaNs only (the last kept, by payload: the one place the order shows), infinities. Rows of
/// 2048 in blocks that hold them in whole registers (the path that folds each thread's
/// registers in order, then the warps'), one row a program (one output: the warps' partials
/// folded by shuffles) and four (several outputs), f32 and f64.
#[test]
fn max_and_min_reductions_pick_as_the_reference_where_order_shows() {
    const PICK: &str = r#"
import triton
import triton.language as tl

@triton.jit
def row_pick(x_ptr, mx_ptr, mn_ptr, R: tl.constexpr, C: tl.constexpr):
    r = tl.program_id(0) * R + tl.arange(0, R)
    c = tl.arange(0, C)
    x = tl.load(x_ptr + r[:, None] * C + c[None, :])
    tl.store(mx_ptr + r, tl.max(x, axis=1))
    tl.store(mn_ptr + r, tl.min(x, axis=1))
"#;
    use tilegrad_ir::triton::{convert, ConstValue, ConvertOptions};
    use tilegrad_reference::{HostTensor, Launch, Memory};
    let gpu = a_gpu();
    let (rows, cols) = (64usize, 2048usize);
    let mut s = 0x2545f4914f6cdd1du64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    // NaNs told apart by payload, so that which one a fold keeps shows.
    let nan = |k: u64| f64::from_bits(0x7ff8_0000_0000_0000 | (k & 0xffff) << 29);
    let mut x = Vec::with_capacity(rows * cols);
    for row in 0..rows {
        let at = |next: &mut dyn FnMut() -> u64| (next() % cols as u64) as usize;
        let mut v: Vec<f64> = (0..cols).map(|_| (next() >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0).collect();
        match row % 8 {
            0 => {}
            // The maximum a zero of both signs, at random places (the min likewise below).
            1 => {
                v.iter_mut().for_each(|e| *e = -e.abs() - 0.5);
                for k in 0..6 {
                    let i = at(&mut next);
                    v[i] = if (k + row / 8) % 2 == 0 { 0.0 } else { -0.0 };
                }
            }
            2 => v.iter_mut().enumerate().for_each(|(i, e)| *e = nan(i as u64 * 7 + row as u64)),
            3 => {
                for _ in 0..50 {
                    let i = at(&mut next);
                    v[i] = nan(next());
                }
            }
            4 => v[0] = nan(row as u64),
            5 => {
                v.iter_mut().for_each(|e| *e = if next() % 2 == 0 { 0.0 } else { -0.0 });
            }
            6 => {
                v.iter_mut().for_each(|e| *e = e.abs() + 0.5);
                for k in 0..6 {
                    let i = at(&mut next);
                    v[i] = if (k + row / 8) % 2 == 0 { -0.0 } else { 0.0 };
                }
            }
            _ => {
                for _ in 0..20 {
                    let (i, j, k) = (at(&mut next), at(&mut next), at(&mut next));
                    (v[i], v[j], v[k]) = (f64::INFINITY, f64::NEG_INFINITY, nan(next()));
                }
            }
        }
        x.extend(v);
    }
    for d in [DType::F32, DType::F64] {
        for r in [1usize, 4] {
            let constexprs = vec![("R".to_string(), ConstValue::Int(r as i64)), ("C".to_string(), ConstValue::Int(cols as i64))];
            let ptrs = ["x_ptr", "mx_ptr", "mn_ptr"].iter().map(|n| (n.to_string(), d)).collect();
            let k = convert(PICK, "pick.py", "row_pick", &ConvertOptions { constexprs, pointer_dtypes: ptrs, ..ConvertOptions::default() })
                .unwrap();
            let source = tilegrad_gpu::codegen::generate(&k).unwrap().source;
            let fold = if r == 1 { "tg_fold_warps<" } else { "tg_fold<" };
            assert!(source.contains(&format!("{fold}{}, true>(", if d == DType::F32 { "float" } else { "double" })), "{d} R={r}: {fold}");
            let tensor = |len: usize, v: &[f64]| match d {
                DType::F32 => HostTensor::from_f32(&[len], v.iter().map(|&e| e as f32).collect()),
                _ => HostTensor::from_f64(&[len], v.to_vec()),
            };
            let mut mem = Memory::new();
            let xt = mem.add("x", tensor(rows * cols, &x));
            let mx = mem.add("mx", tensor(rows, &vec![0.0; rows]));
            let mn = mem.add("mn", tensor(rows, &vec![0.0; rows]));
            let launch = Launch::new(&k, rows / r).arg("x_ptr", xt).arg("mx_ptr", mx).arg("mn_ptr", mn);
            let mut want = mem.clone();
            launch.run(&mut want).unwrap();
            // The reference itself: +0 is row 1's maximum and -0 row 6's minimum, both zeros
            // being there; the last NaN of row 2 (NaNs only) is its maximum and its minimum.
            let last_nan = x[2 * cols + cols - 1];
            let bits = |m: &Memory, t| -> Vec<u64> {
                match d {
                    DType::F32 => m[t].as_f32().unwrap().iter().map(|e| e.to_bits() as u64).collect(),
                    _ => m[t].as_f64().unwrap().iter().map(|e| e.to_bits()).collect(),
                }
            };
            let kept = |t, i: usize| bits(&want, t)[i];
            let as_d = |e: f64| if d == DType::F32 { (e as f32).to_bits() as u64 } else { e.to_bits() };
            assert_eq!((kept(mx, 1), kept(mn, 6)), (as_d(0.0), as_d(-0.0)), "{d}: rows 1 and 6");
            assert_eq!((kept(mx, 2), kept(mn, 2)), (as_d(last_nan), as_d(last_nan)), "{d}: row 2");
            let Some(gpu) = &gpu else { continue };
            let mut got = mem.clone();
            gpu.run(&launch, &mut got, tilegrad_gpu::GpuOptions::default()).unwrap();
            for t in [mx, mn] {
                let (w, g) = (bits(&want, t), bits(&got, t));
                let differ: Vec<usize> = (0..rows).filter(|&i| w[i] != g[i]).collect();
                assert!(differ.is_empty(), "{d} R={r}: rows {differ:?} differ: want {w:x?}, got {g:x?}");
            }
        }
    }
}
