//! Prints the CUDA C the GPU backend generates for a text-IR kernel (`.tgir`), and compiles it
//! with NVRTC where it is installed, writing the PTX to `OUT.ptx` when given:
//! `cargo run -p tilegrad-gpu --example cuda_of -- FILE.tgir [OUT.ptx]`.

fn main() {
    let path = std::env::args().nth(1).expect("usage: cuda_of FILE.tgir");
    let text = std::fs::read_to_string(&path).expect("readable file");
    let k = tilegrad_ir::text::parse_kernel(&text, &path).unwrap_or_else(|e| panic!("{e}"));
    match tilegrad_gpu::codegen::generate(&k) {
        Ok(g) => println!("{}", g.source),
        Err(e) => eprintln!("{e}"),
    }
    if tilegrad_gpu::nvrtc_present() {
        match tilegrad_gpu::compile_only(&k, "compute_90") {
            Ok(ptx) => {
                eprintln!("compiled: {} bytes of PTX", ptx.len());
                if let Some(out) = std::env::args().nth(2) {
                    std::fs::write(&out, ptx).expect("writable PTX file");
                }
            }
            Err(e) => eprintln!("{e}"),
        }
    }
}
