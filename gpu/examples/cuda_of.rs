//! Prints the CUDA C the GPU backend generates for a kernel, and compiles it with NVRTC where it
//! is installed, writing the PTX to `--ptx OUT.ptx` when given:
//! `cargo run -p tilegrad-gpu --example cuda_of -- FILE.tgir [--ptx OUT.ptx]`, or for Triton
//! source `... -- FILE.py KERNEL [NAME=INT ...] [--ptx OUT.ptx]` (integer constexprs);
//! `--threads N:B` generates the form with at most N threads a block and B blocks an SM; `--vjp`
//! generates the kernel's VJP kernel (`tilegrad_ad::vjp_kernel`) instead, with float atomics in
//! the hardware's order and no race marks, as VJP kernels run (`--f32`: the f32 VJP kernel).

use tilegrad_ir::triton::{convert, ConstValue, ConvertOptions};

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let ptx_out = args.iter().position(|a| a == "--ptx").map(|i| {
        let out = args.get(i + 1).cloned().expect("--ptx OUT.ptx");
        args.drain(i..i + 2);
        out
    });
    let threads = args.iter().position(|a| a == "--threads").map(|i| {
        let v = args.get(i + 1).cloned().expect("--threads N:B");
        args.drain(i..i + 2);
        let (n, b) = v.split_once(':').expect("--threads N:B");
        (n.parse::<usize>().expect("N"), b.parse::<usize>().expect("B"))
    });
    let vjp = args.iter().position(|a| a == "--vjp").map(|i| args.remove(i)).is_some();
    let f32_vjp = args.iter().position(|a| a == "--f32").map(|i| args.remove(i)).is_some();
    let path = args.first().cloned().expect("usage: cuda_of FILE.tgir | FILE.py KERNEL [NAME=INT ...]");
    let text = std::fs::read_to_string(&path).expect("readable file");
    let k = if path.ends_with(".py") {
        let kernel = args.get(1).expect("the kernel's name after a .py file");
        let constexprs = args[2..]
            .iter()
            .map(|a| {
                let (n, v) = a.split_once('=').expect("NAME=INT");
                (n.to_string(), ConstValue::Int(v.parse().expect("an integer constexpr")))
            })
            .collect();
        let opts = ConvertOptions { constexprs, ..ConvertOptions::default() };
        convert(&text, &path, kernel, &opts).unwrap_or_else(|e| panic!("{e}"))
    } else {
        tilegrad_ir::text::parse_kernel(&text, &path).unwrap_or_else(|e| panic!("{e}"))
    };
    let k = match (vjp, f32_vjp) {
        (false, _) => k,
        (true, false) => tilegrad_ad::vjp_kernel(&k).unwrap_or_else(|e| panic!("{e}")).kernel,
        (true, true) => tilegrad_ad::vjp_kernel_with(&k, true, tilegrad_ir::DType::F32).unwrap_or_else(|e| panic!("{e}")).kernel,
    };
    // VJP kernels run as checks run them: atomics in the hardware's order, no race marks.
    let flavor = if vjp { tilegrad_gpu::codegen::Flavor::VJP } else { tilegrad_gpu::codegen::Flavor::default() };
    let generated = match threads {
        Some((n, b)) => tilegrad_gpu::codegen::generate_full(&k, n, Some(b), flavor),
        None => tilegrad_gpu::codegen::generate_flavor(&k, flavor),
    };
    let generated = match generated {
        Ok(g) => g,
        Err(e) => {
            eprintln!("{e}");
            return;
        }
    };
    println!("{}", generated.source);
    if tilegrad_gpu::nvrtc_present() {
        match tilegrad_gpu::compile_generated(&k, &generated, "compute_90") {
            Ok(ptx) => {
                eprintln!("compiled: {} bytes of PTX", ptx.len());
                if let Some(out) = ptx_out {
                    std::fs::write(&out, ptx).expect("writable PTX file");
                }
            }
            Err(e) => eprintln!("{e}"),
        }
    }
}
