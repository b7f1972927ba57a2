//! Kernel times of the GPU backend beside Triton's own, on the forward kernels of `examples/`
//! at training sizes: the weighted sum (65536x1024), matmul (2048^3, 64x64x32 tiles, `ieee`
//! dots), a row softmax (16384x4096, one row per program), and the others below.
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
//!
//! `--compile [--unroll N,M,...]` times NVRTC instead: each forward kernel (with race marks, as a
//! check's forward runs) and its f64 VJP kernel (as `--ground kernels` runs it) compiled to the
//! device's machine code at full optimisation, with loops over up to N registers of a value
//! unrolled fully (`tilegrad_gpu::codegen::UNROLLED_REGISTERS`, the default; a large N unrolls
//! every loop, as before that limit), on as many threads as the host has cores (`--jobs N`: on
//! N), no cache used
//! (`CUDA_CACHE_DISABLE=1` turns NVRTC's own off). Besides the three above: the softmax with 4
//! rows a program (16384-element tiles) and a layer norm of 8 rows of 4096 a program
//! (`layer_norm_rows`), whose tiles are the largest the examples use at training sizes, and the
//! causal attention (16 heads x 8192 x 64, 32x16 tiles), whose VJP kernel's loop is the longest;
//! the fused cross entropy (4096 rows of 32000 logits in 4096-wide tiles, the most work an
//! element of the examples' forwards); and, compiled only, a 4096-wide RMS-norm backward
//! ([`compile_only`]).
//!
//! `--source DIR [--unroll N,...]` writes the CUDA C of those kernels to `DIR` instead (no GPU
//! needed), for reading what NVRTC is given or timing it with other options. With both,
//! `--kernel FILE::NAME [--constexpr NAME=VALUE]... [--pointer NAME=DTYPE]...` takes a Triton
//! kernel of one's own instead (and its f64 VJP kernel).

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
    /// Float scalar arguments.
    floats: Vec<(&'static str, f64)>,
    /// Integer tensors (i64): name, elements, and the bound their values are drawn below.
    labels: Vec<(&'static str, usize, i64)>,
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
            floats: vec![],
            labels: vec![],
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
            floats: vec![],
            labels: vec![],
            grid: [(n / 64) as u32, (n / 64) as u32, 1],
        },
        Case {
            name: "softmax",
            file: "softmax.py",
            kernel: "softmax",
            constexprs: vec![("BLOCK_ROWS", 1), ("BLOCK_COLS", sc as i64)],
            tensors: vec![("x_ptr", vec![sr, sc]), ("y_ptr", vec![sr, sc])],
            scalars: vec![("x_row_stride", sc as i64), ("y_row_stride", sc as i64), ("n_rows", sr as i64), ("n_cols", sc as i64)],
            floats: vec![],
            labels: vec![],
            grid: [sr as u32, 1, 1],
        },
        Case {
            name: "softmax_4rows",
            file: "softmax.py",
            kernel: "softmax",
            constexprs: vec![("BLOCK_ROWS", 4), ("BLOCK_COLS", sc as i64)],
            tensors: vec![("x_ptr", vec![sr, sc]), ("y_ptr", vec![sr, sc])],
            scalars: vec![("x_row_stride", sc as i64), ("y_row_stride", sc as i64), ("n_rows", sr as i64), ("n_cols", sc as i64)],
            floats: vec![],
            labels: vec![],
            grid: [(sr / 4) as u32, 1, 1],
        },
        Case {
            name: "layer_norm",
            file: "layer_norm.py",
            kernel: "layer_norm_rows",
            constexprs: vec![("BLOCK_M", 8), ("BLOCK_N", sc as i64)],
            tensors: vec![("x_ptr", vec![sr, sc]), ("w_ptr", vec![sc]), ("b_ptr", vec![sc]), ("y_ptr", vec![sr, sc])],
            scalars: vec![("n_rows", sr as i64), ("n_cols", sc as i64), ("x_row_stride", sc as i64), ("y_row_stride", sc as i64)],
            floats: vec![("eps", 1e-5)],
            labels: vec![],
            grid: [(sr / 8) as u32, 1, 1],
        },
        attention_causal(),
        cross_entropy(),
    ]
}

/// The causal attention of `examples/flash_attention_causal.toml` at 16 heads x 8192 x 64.
fn attention_causal() -> Case {
    let (heads, ctx, d) = (16usize, 8192usize, 64usize);
    let mut scalars = Vec::new();
    for t in ["q", "k", "v", "o"] {
        let [h, m, e] = [(ctx * d) as i64, d as i64, 1];
        let names: [&'static str; 3] = match t {
            "q" => ["stride_qh", "stride_qm", "stride_qd"],
            "k" => ["stride_kh", "stride_kn", "stride_kd"],
            "v" => ["stride_vh", "stride_vn", "stride_vd"],
            _ => ["stride_oh", "stride_om", "stride_od"],
        };
        scalars.extend(names.into_iter().zip([h, m, e]));
    }
    scalars.push(("N_CTX", ctx as i64));
    let shape = vec![heads, ctx, d];
    Case {
        name: "attention",
        file: "flash_attention_causal.py",
        kernel: "attn_fwd_causal",
        constexprs: vec![("HEAD_DIM", d as i64), ("BLOCK_M", 32), ("BLOCK_N", 16)],
        tensors: vec![("q_ptr", shape.clone()), ("k_ptr", shape.clone()), ("v_ptr", shape.clone()), ("o_ptr", shape)],
        scalars,
        floats: vec![("sm_scale", 0.125)],
        labels: vec![],
        grid: [(ctx / 32) as u32, heads as u32, 1],
    }
}

/// The fused cross entropy (`examples/cross_entropy_fused.toml`): a row of 32000 logits a
/// program, in two passes of 4096-wide tiles, the gradient stored by the forward; 4096 rows,
/// labels i64.
fn cross_entropy() -> Case {
    let (rows, cols) = (4096usize, 32000usize);
    Case {
        name: "cross_entropy",
        file: "cross_entropy_fused.py",
        kernel: "cross_entropy_fwd_grad_kernel",
        constexprs: vec![("BLOCK_SIZE", 4096)],
        tensors: vec![("X_ptr", vec![rows, cols]), ("DX_ptr", vec![rows, cols]), ("loss_ptr", vec![rows])],
        scalars: vec![
            ("X_stride", cols as i64),
            ("DX_stride", cols as i64),
            ("n_cols", cols as i64),
            ("n_non_ignore", rows as i64),
            ("ignore_index", -100),
        ],
        floats: vec![],
        labels: vec![("Y_ptr", rows, cols as i64)],
        grid: [rows as u32, 1, 1],
    }
}

/// The case's kernel, converted from its example's Triton source (float scalars as f32).
fn kernel_of(c: &Case) -> tilegrad_ir::Kernel {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/triton").join(c.file);
    let src = std::fs::read_to_string(&path).expect("example source");
    let opts = ConvertOptions {
        constexprs: c.constexprs.iter().map(|(n, v)| (n.to_string(), ConstValue::Int(*v))).collect(),
        scalar_dtypes: c.floats.iter().map(|(n, _)| (n.to_string(), tilegrad_ir::DType::F32)).collect(),
        pointer_dtypes: c.labels.iter().map(|(n, _, _)| (n.to_string(), tilegrad_ir::DType::I64)).collect(),
        ..ConvertOptions::default()
    };
    convert(&src, &path.display().to_string(), c.kernel, &opts).unwrap_or_else(|e| panic!("{e}"))
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
    let mut compile = false;
    let mut source: Option<std::path::PathBuf> = None;
    let mut jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut unroll = vec![tilegrad_gpu::codegen::UNROLLED_REGISTERS];
    let mut extra = Extra::default();
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
            "--compile" => compile = true,
            "--source" => {
                source = Some(args[i + 1].clone().into());
                i += 1;
            }
            "--jobs" => {
                jobs = args[i + 1].parse().expect("--jobs N");
                i += 1;
            }
            "--unroll" => {
                unroll = args[i + 1].split(',').map(|n| n.parse().expect("--unroll N,M,...")).collect();
                i += 1;
            }
            "--kernel" => {
                extra.kernel = Some(args[i + 1].clone());
                i += 1;
            }
            "--constexpr" => {
                extra.constexprs.push(args[i + 1].clone());
                i += 1;
            }
            "--pointer" => {
                extra.pointers.push(args[i + 1].clone());
                i += 1;
            }
            "--reps" => {
                reps = args[i + 1].parse().expect("--reps N");
                i += 1;
            }
            _ => {}
        }
        i += 1;
    }
    if let Some(dir) = source {
        write_sources(&dir, &unroll, only.as_deref(), &extra);
        return;
    }
    let gpu = match Gpu::new() {
        Ok(g) => g,
        Err(e) => {
            println!("skipped: {e}");
            return;
        }
    };
    println!("device: {}", gpu.describe());
    if compile {
        compile_times(&gpu, &unroll, only.as_deref(), jobs, &extra);
        return;
    }
    if grad {
        println!("VJP kernels computing in {}", if f32_grad { "f32" } else { "f64" });
        println!(
            "{:<14} {:>13} {:>12} {:>12} {:>9} {:>9} {:>12} {:>12} {:>9}",
            "kernel", "triton bwd ms", "vjp ms", "+races ms", "ratio", "+races", "call s", "device MB", "/ data"
        );
    } else {
        println!("{:<14} {:>12} {:>12} {:>12} {:>9} {:>9}", "kernel", "triton ms", "gpu ms", "+races ms", "ratio", "+races");
    }
    for c in cases() {
        let k = kernel_of(&c);
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
        for (j, &(n, len, bound)) in c.labels.iter().enumerate() {
            let vals = random(len, 50 + j as u64).into_iter().map(|x| ((f64::from(x) + 1.0) / 2.0 * bound as f64) as i64);
            let t = mem.add(n, HostTensor::from_i64(&[len], vals.map(|v| v.clamp(0, bound - 1)).collect()));
            launch = launch.arg(n, t);
        }
        for (n, v) in &c.scalars {
            launch = launch.arg(n, *v);
        }
        for (n, v) in &c.floats {
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
        gpu.describe_kernel(&vk.kernel, tilegrad_gpu::codegen::Flavor::VJP).unwrap_or_else(|e| e.to_string())
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

/// The kernels `--compile` times, for the forward and the f64 VJP kernel of each case: name,
/// form, kernel, flavour.
fn compiled_kernels(
    only: Option<&str>,
    extra: &Extra,
) -> Vec<(&'static str, &'static str, tilegrad_ir::Kernel, tilegrad_gpu::codegen::Flavor)> {
    use tilegrad_gpu::codegen::Flavor;
    let mut out = Vec::new();
    if let Some(k) = extra.convert() {
        match tilegrad_ad::vjp_kernel(&k) {
            Ok(v) => out.push(("kernel", "vjp f64", v.kernel, Flavor::VJP)),
            Err(e) => eprintln!("{}: no VJP kernel: {e}", k.name),
        }
        out.push(("kernel", "forward", k, Flavor::default()));
        return out;
    }
    for c in cases().into_iter().filter(|c| only.is_none_or(|o| o == c.name)) {
        let k = kernel_of(&c);
        let vk = tilegrad_ad::vjp_kernel(&k).unwrap_or_else(|e| panic!("{}: {e}", c.name)).kernel;
        out.push((c.name, "forward", k, Flavor::default()));
        out.push((c.name, "vjp f64", vk, Flavor::VJP));
    }
    for (name, k) in compile_only().into_iter().filter(|(n, _)| only.is_none_or(|o| o == *n)) {
        out.push((name, "forward", k, Flavor::default()));
    }
    out
}

/// `--kernel FILE::NAME` (with `--constexpr NAME=VALUE` and `--pointer NAME=DTYPE`, each
/// repeatable): a Triton kernel of one's own for `--compile` and `--source`, instead of the
/// cases (a VALUE is an int, a float, `True`/`False`, a string in single quotes, or a dtype as
/// `tl.float16`).
#[derive(Default)]
struct Extra {
    kernel: Option<String>,
    constexprs: Vec<String>,
    pointers: Vec<String>,
}

impl Extra {
    fn convert(&self) -> Option<tilegrad_ir::Kernel> {
        let (file, name) = self.kernel.as_deref()?.rsplit_once("::").expect("--kernel FILE::NAME");
        let src = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("--kernel {file}: {e}"));
        let pair = |s: &String| s.split_once('=').map(|(n, v)| (n.to_string(), v.to_string())).expect("NAME=VALUE");
        let constexprs = self.constexprs.iter().map(pair).map(|(n, v)| {
            let value = match (v.parse::<i64>(), v.parse::<f64>(), v.as_str()) {
                (Ok(i), ..) => ConstValue::Int(i),
                (_, Ok(f), _) => ConstValue::Float(f),
                (.., "True") => ConstValue::Bool(true),
                (.., "False") => ConstValue::Bool(false),
                (.., q) if q.starts_with('\'') => ConstValue::Str(q.trim_matches('\'').to_string()),
                (.., d) => ConstValue::DType(d.trim_start_matches("tl.").to_string()),
            };
            (n, value)
        });
        let pointers = self.pointers.iter().map(pair).map(|(n, d)| {
            let dtype = tilegrad_ir::DType::from_name(&d).unwrap_or_else(|| panic!("--pointer {n}={d}: not a dtype"));
            (n, dtype)
        });
        let opts = ConvertOptions { constexprs: constexprs.collect(), pointer_dtypes: pointers.collect(), ..ConvertOptions::default() };
        Some(convert(&src, file, name, &opts).unwrap_or_else(|e| panic!("{e}")))
    }
}

/// Kernels `--compile` and `--source` take besides the cases (their launches are not timed):
/// the RMS norm's backward over rows of 4096 (`examples/rms_norm.toml`), which a check launches
/// with race marks.
fn compile_only() -> Vec<(&'static str, tilegrad_ir::Kernel)> {
    use tilegrad_ir::DType;
    let convert_one = |file: &str, kernel: &str, constexprs: Vec<(&str, ConstValue)>, pointers: Vec<(&str, DType)>| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/triton").join(file);
        let src = std::fs::read_to_string(&path).expect("example source");
        let opts = ConvertOptions {
            constexprs: constexprs.into_iter().map(|(n, v)| (n.to_string(), v)).collect(),
            pointer_dtypes: pointers.into_iter().map(|(n, d)| (n.to_string(), d)).collect(),
            ..ConvertOptions::default()
        };
        convert(&src, &path.display().to_string(), kernel, &opts).unwrap_or_else(|e| panic!("{e}"))
    };
    vec![(
        "rms_norm_bwd",
        convert_one(
            "rms_norm_bwd.py",
            "_rms_norm_backward_kernel",
            vec![
                ("BLOCK_SIZE", ConstValue::Int(4096)),
                ("offset", ConstValue::Float(0.0)),
                ("X_dtype", ConstValue::DType("float32".into())),
            ],
            vec![],
        ),
    )]
}

/// `--source DIR`: the CUDA C of each kernel `--compile` times, written to `DIR/NAME.FORM.UNROLL.cu`
/// (no GPU needed), to read what NVRTC is given.
fn write_sources(dir: &std::path::Path, unroll: &[usize], only: Option<&str>, extra: &Extra) {
    std::fs::create_dir_all(dir).expect("--source DIR");
    for (name, what, k, flavor) in compiled_kernels(only, extra) {
        for &n in unroll {
            let g = tilegrad_gpu::codegen::generate_flavor_unrolling(&k, flavor, n).unwrap_or_else(|e| panic!("{name}: {e}"));
            let file = dir.join(format!("{name}.{}.{n}.cu", what.replace(' ', "_")));
            std::fs::write(&file, &g.source).expect("writable --source DIR");
            println!("{} ({} threads, {} B)", file.display(), g.threads, g.source.len());
        }
    }
}

/// The `--compile` table: NVRTC's seconds for each case's forward and f64 VJP kernel with loops
/// over up to each of `unroll` registers unrolled fully, compiled side by side on `threads`
/// threads (`--jobs N`; by default as many as the host has cores; 1 times each alone).
fn compile_times(gpu: &Gpu, unroll: &[usize], only: Option<&str>, threads: usize, extra: &Extra) {
    use tilegrad_gpu::codegen::generate_flavor_unrolling;
    let mut jobs = Vec::new();
    for (name, what, k, flavor) in compiled_kernels(only, extra) {
        for &n in unroll {
            jobs.push((name, what, k.clone(), flavor, n));
        }
    }
    // The slowest first, so that the side-by-side compiles end together.
    jobs.sort_by_key(|j| std::cmp::Reverse(j.4));
    let threads = threads.clamp(1, jobs.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let rows = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((name, what, k, flavor, n)) = jobs.get(i) else { break };
                let g = generate_flavor_unrolling(k, *flavor, *n).unwrap_or_else(|e| panic!("{name}: {e}"));
                let secs = gpu.compile_seconds(k, &g).map_or_else(|e| format!("{e}"), |t| format!("{t:.2}"));
                let row = format!("{name:<14} {what:<8} {n:>8} {:>8} {:>10} {secs:>9}", g.threads, g.source.len());
                println!("{row}");
                rows.lock().expect("rows").push((*name, *what, *n, row));
            });
        }
    });
    println!("{:<14} {:<8} {:>8} {:>8} {:>10} {:>9}", "kernel", "form", "unrolled", "threads", "source B", "nvrtc s");
    let mut rows = rows.into_inner().expect("rows");
    rows.sort_by_key(|r| (r.0, r.1, r.2));
    for (.., r) in rows {
        println!("{r}");
    }
}
