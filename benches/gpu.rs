//! Kernel times of the GPU backend beside Triton's own, on the forward kernels of `examples/`
//! at training sizes: the weighted sum (65536x1024), matmul (2048^3, 64x64x32 tiles, `ieee`
//! dots) and a row softmax (16384x4096, one row per program).
//!
//! `cargo bench --bench gpu [-- --triton FILE.json] [--reps N] [--only NAME]` on a machine with a GPU. Each
//! kernel runs (after a warm-up) `reps` times with the device's race marks off and on; the
//! fastest run of each counts, from CUDA events. `FILE.json` holds Triton's milliseconds for the
//! same kernels, launched with the same block sizes, as `benches/gpu_triton.py` writes it; the
//! table then has the ratios. Without a GPU it says so and exits.
//!
//! `--grad` times the f64 ground truth instead: each forward's VJP kernel
//! ([`tilegrad_ad::vjp_kernel`]) launched on the GPU for a random cotangent of its output,
//! beside Triton's hand-written backward kernel where `FILE.json` has one (`<name>_bwd`); and
//! the whole gradient call (copies to f64, shadows and tapes, transfers, the launch, reading
//! the gradients back) once, with the bytes of the tensors it allocates on the device, also as
//! a multiple of the data (the launch's f32 tensors and the inputs' gradients, in f32).
//! `--f32` times VJP kernels computing in f32 (`tilegrad_ad::vjp_kernel_with`).

use tilegrad_gpu::{Gpu, GpuOptions};
use tilegrad_ir::triton::{convert, ConstValue, ConvertOptions};
use tilegrad_reference::{HostTensor, Launch, Memory, TensorId};

struct Case {
    name: &'static str,
    file: &'static str,
    kernel: &'static str,
    constexprs: Vec<(&'static str, i64)>,
    /// Tensors: name and shape (f32, random in [-1, 1)).
    tensors: Vec<(&'static str, Vec<usize>)>,
    /// Scalar arguments.
    scalars: Vec<(&'static str, i64)>,
    grid: [u32; 3],
}

fn cases() -> Vec<Case> {
    let (rows, d) = (65536usize, 1024usize);
    let n = 2048usize;
    let (sr, sc) = (16384usize, 4096usize);
    vec![
        Case {
            name: "weighted_sum",
            file: "weighted_sum.py",
            kernel: "weighted_sum_fwd",
            constexprs: vec![("ROWS_TILE_SIZE", 16), ("D_TILE_SIZE", 64)],
            tensors: vec![("x_ptr", vec![rows, d]), ("weight_ptr", vec![d]), ("output_ptr", vec![rows])],
            scalars: vec![
                ("x_stride_row", d as i64),
                ("x_stride_dim", 1),
                ("weight_stride_dim", 1),
                ("output_stride_row", 1),
                ("ROWS", rows as i64),
                ("D", d as i64),
            ],
            grid: [(rows / 16) as u32, 1, 1],
        },
        Case {
            name: "matmul",
            file: "matmul.py",
            kernel: "matmul",
            constexprs: vec![("BLOCK_M", 64), ("BLOCK_N", 64), ("BLOCK_K", 32)],
            tensors: vec![("a_ptr", vec![n, n]), ("b_ptr", vec![n, n]), ("c_ptr", vec![n, n])],
            scalars: vec![
                ("M", n as i64),
                ("N", n as i64),
                ("K", n as i64),
                ("stride_am", n as i64),
                ("stride_ak", 1),
                ("stride_bk", n as i64),
                ("stride_bn", 1),
                ("stride_cm", n as i64),
                ("stride_cn", 1),
            ],
            grid: [(n / 64) as u32, (n / 64) as u32, 1],
        },
        Case {
            name: "softmax",
            file: "softmax.py",
            kernel: "softmax",
            constexprs: vec![("BLOCK_ROWS", 1), ("BLOCK_COLS", sc as i64)],
            tensors: vec![("x_ptr", vec![sr, sc]), ("y_ptr", vec![sr, sc])],
            scalars: vec![("x_row_stride", sc as i64), ("y_row_stride", sc as i64), ("n_rows", sr as i64), ("n_cols", sc as i64)],
            grid: [sr as u32, 1, 1],
        },
    ]
}

/// Uniform in [-1, 1), from a fixed xorshift stream.
fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mut triton: Option<serde_json::Value> = None;
    let mut reps = 20;
    let mut only: Option<String> = None;
    let mut grad = false;
    let mut f32_grad = false;
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--triton" => {
                let text = std::fs::read_to_string(&args[i + 1]).expect("readable --triton file");
                triton = Some(serde_json::from_str(&text).expect("JSON"));
                i += 1;
            }
            "--only" => {
                only = Some(args[i + 1].clone());
                i += 1;
            }
            "--grad" => grad = true,
            "--f32" => f32_grad = true,
            "--reps" => {
                reps = args[i + 1].parse().expect("--reps N");
                i += 1;
            }
            _ => {}
        }
        i += 1;
    }
    let gpu = match Gpu::new() {
        Ok(g) => g,
        Err(e) => {
            println!("skipped: {e}");
            return;
        }
    };
    println!("device: {}", gpu.describe());
    if grad {
        println!("VJP kernels computing in {}", if f32_grad { "f32" } else { "f64" });
        println!(
            "{:<14} {:>13} {:>12} {:>12} {:>9} {:>9} {:>12} {:>12} {:>9}",
            "kernel", "triton bwd ms", "vjp ms", "+races ms", "ratio", "+races", "call s", "device MB", "/ data"
        );
    } else {
        println!("{:<14} {:>12} {:>12} {:>12} {:>9} {:>9}", "kernel", "triton ms", "gpu ms", "+races ms", "ratio", "+races");
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/triton");
    for c in cases() {
        let path = dir.join(c.file);
        let src = std::fs::read_to_string(&path).expect("example source");
        let opts = ConvertOptions {
            constexprs: c.constexprs.iter().map(|(n, v)| (n.to_string(), ConstValue::Int(*v))).collect(),
            ..ConvertOptions::default()
        };
        let k = convert(&src, &path.display().to_string(), c.kernel, &opts).unwrap_or_else(|e| panic!("{e}"));
        let mut mem = Memory::new();
        let ids: Vec<(&str, TensorId)> = c
            .tensors
            .iter()
            .enumerate()
            .map(|(j, (n, shape))| {
                let numel = shape.iter().product();
                (*n, mem.add(n, HostTensor::from_f32(shape, random(numel, j as u64 + 1))))
            })
            .collect();
        let mut launch = Launch::new(&k, c.grid);
        for (n, id) in &ids {
            launch = launch.arg(n, *id);
        }
        for (n, v) in &c.scalars {
            launch = launch.arg(n, *v);
        }
        for (n, v) in &c.constexprs {
            launch = launch.arg(n, *v);
        }
        let time = |races: bool, mem: &mut Memory| {
            gpu.time(&launch, mem, GpuOptions { races, ..GpuOptions::default() }, reps).unwrap_or_else(|e| panic!("{}: {e}", c.name)) * 1e3
        };
        if let Some(o) = &only {
            if o != c.name {
                continue;
            }
        }
        if grad {
            let float = if f32_grad { tilegrad_ir::DType::F32 } else { tilegrad_ir::DType::F64 };
            time_gradient(&gpu, &c, &k, &launch, &mut mem, &ids, reps, triton.as_ref(), float);
            continue;
        }
        eprintln!("{}: {}", c.name, gpu.describe_kernel(&k, Default::default()).unwrap_or_else(|e| e.to_string()));
        let plain = time(false, &mut mem);
        let marked = time(true, &mut mem);
        let t = triton.as_ref().and_then(|j| j.get(c.name)).and_then(|v| v.as_f64());
        let ratio = |x: f64| t.map_or("-".to_string(), |t| format!("{:.2}x", x / t));
        println!(
            "{:<14} {:>12} {:>12.3} {:>12.3} {:>9} {:>9}",
            c.name,
            t.map_or("-".to_string(), |t| format!("{t:.3}")),
            plain,
            marked,
            ratio(plain),
            ratio(marked)
        );
    }
}

/// The `--grad` row of one case: the VJP kernel's launch time (fastest of `reps`, race marks off
/// and on) and one whole gradient call.
#[allow(clippy::too_many_arguments)]
fn time_gradient(
    gpu: &Gpu,
    c: &Case,
    k: &tilegrad_ir::Kernel,
    launch: &Launch,
    mem: &mut Memory,
    ids: &[(&str, TensorId)],
    reps: usize,
    triton: Option<&serde_json::Value>,
    float: tilegrad_ir::DType,
) {
    use tilegrad_ad::vjp_kernel::{gradient_by_kernel, vjp_kernel_with, TapeBounds};
    use tilegrad_ad::AdError;
    let vk = vjp_kernel_with(k, true, float).unwrap_or_else(|e| panic!("{}: {e}", c.name));
    // The forward, for its trip counts (and the output it leaves is not read: the VJP kernel
    // recomputes it).
    let fwd = gpu
        .run(launch, &mut mem.clone(), GpuOptions { races: false, ..GpuOptions::default() })
        .unwrap_or_else(|e| panic!("{}: {e}", c.name));
    let (out_name, out) = *ids.last().expect("an output");
    let n = mem.get(out).numel();
    let cot: Vec<f64> = random(n, 99).into_iter().map(f64::from).collect();
    let inputs: Vec<TensorId> = ids[..ids.len() - 1].iter().map(|(_, t)| *t).collect();
    let outputs = vec![(out, cot)];
    let gpu_err = |e: tilegrad_gpu::GpuError| AdError::Spec(e.to_string());
    let (mut plain, mut marked, mut bytes) = (0.0, 0.0, 0usize);
    let mut timed = |l: &Launch, m: &mut Memory| -> Result<(), AdError> {
        bytes = (0..m.len() as u32)
            .map(|i| {
                let t = m.get(TensorId(i));
                t.numel() * tilegrad_reference::storage_bytes(t.dtype())
            })
            .sum();
        // Atomics in the hardware's order, as the check runs VJP kernels.
        plain =
            gpu.time(l, &mut m.clone(), GpuOptions { races: false, ordered_atomics: false, exact_order: false }, reps).map_err(gpu_err)?
                * 1e3;
        marked =
            gpu.time(l, &mut m.clone(), GpuOptions { races: true, ordered_atomics: false, exact_order: false }, reps).map_err(gpu_err)?
                * 1e3;
        Ok(())
    };
    gradient_by_kernel(&vk, launch, mem, &inputs, &outputs, TapeBounds { max_trips: &fwd.summary.max_trips, memory: u64::MAX }, &mut timed)
        .unwrap_or_else(|e| panic!("{}: {e}", c.name));
    let start = std::time::Instant::now();
    let mut once = |l: &Launch, m: &mut Memory| {
        gpu.run(l, m, GpuOptions { races: false, ordered_atomics: false, exact_order: false }).map(|_| ()).map_err(gpu_err)
    };
    let g = gradient_by_kernel(
        &vk,
        launch,
        mem,
        &inputs,
        &outputs,
        TapeBounds { max_trips: &fwd.summary.max_trips, memory: u64::MAX },
        &mut once,
    )
    .unwrap_or_else(|e| panic!("{}: {e}", c.name));
    let call = start.elapsed().as_secs_f64();
    let data: usize =
        ids.iter().map(|(_, t)| mem.get(*t).numel() * 4).sum::<usize>() + inputs.iter().map(|t| mem.get(*t).numel() * 4).sum::<usize>();
    assert!(g.iter().all(|v| v.iter().all(|x| x.is_finite())) && g.iter().any(|v| v.iter().any(|&x| x != 0.0)), "{}: gradient", c.name);
    let t = triton.and_then(|j| j.get(format!("{}_bwd", c.name))).and_then(|v| v.as_f64());
    let ratio = |x: f64| t.map_or("-".to_string(), |t| format!("{:.2}x", x / t));
    eprintln!(
        "{}: VJP kernel {}; output `{out_name}`",
        c.name,
        gpu.describe_kernel(&vk.kernel, tilegrad_gpu::codegen::Flavor { ordered: false, marks: false }).unwrap_or_else(|e| e.to_string())
    );
    println!(
        "{:<14} {:>13} {:>12.3} {:>12.3} {:>9} {:>9} {:>12.2} {:>12.0} {:>8.2}x",
        c.name,
        t.map_or("-".to_string(), |t| format!("{t:.3}")),
        plain,
        marked,
        ratio(plain),
        ratio(marked),
        call,
        bytes as f64 / 1e6,
        bytes as f64 / data as f64
    );
}
