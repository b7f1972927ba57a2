//! The bodies of the libFuzzer targets, one function per parser. Each takes arbitrary bytes; an
//! error is a fine outcome, a panic (or an abort) is what libFuzzer reports. Where a parser has
//! an inverse (the text IR printer, the `.npy` writer), what parses must come back the same.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The text IR parser; what parses prints, and the print parses back and prints the same.
pub fn text_ir(data: &[u8]) {
    let Ok(text) = tilegrad_ir::source_text(data.to_vec(), "fuzz.tgir") else { return };
    let Ok(kernels) = tilegrad_ir::text::parse(&text, "fuzz.tgir") else { return };
    let printed = tilegrad_ir::text::print_module(&kernels);
    let again =
        tilegrad_ir::text::parse(&printed, "fuzz.tgir").unwrap_or_else(|e| panic!("printed IR does not parse back: {e}\n{printed}"));
    assert_eq!(tilegrad_ir::text::print_module(&again), printed, "printed IR parses back to different IR");
}

/// The `.npy` reader; what reads writes back and reads the same.
pub fn npy(data: &[u8]) {
    let Ok(t) = tilegrad::npy::parse(data) else { return };
    let path = scratch().join(format!("again-{}.npy", std::process::id()));
    tilegrad::npy::write(&path, &t).expect("writing a tensor that was read");
    let again = tilegrad::npy::read(&path).expect("reading what was written");
    assert_eq!((again.shape(), again.dtype()), (t.shape(), t.dtype()), "the round trip changed the array");
    // Compared as printed: every NaN alike.
    assert_eq!(format!("{:?}", again.data()), format!("{:?}", t.data()), "the round trip changed the data");
}

/// The Triton front end: the `@triton.jit` functions of a file, each converted with the block
/// sizes of the examples bound.
pub fn triton(data: &[u8]) {
    let Ok(text) = tilegrad_ir::source_text(data.to_vec(), "fuzz.py") else { return };
    let Ok(names) = tilegrad_ir::triton::kernels(&text, "fuzz.py") else { return };
    let options = tilegrad_ir::triton::ConvertOptions::with_constexprs(&[("BLOCK", 64), ("BLOCK_SIZE", 64), ("BLOCK_N", 64)]);
    for k in names {
        let _ = tilegrad_ir::triton::convert(&text, "fuzz.py", &k, &options);
    }
}

/// The spec loader, on a spec beside a copy of the example kernels (so that `triton/...`
/// references resolve and convert).
pub fn spec_toml(data: &[u8]) {
    let path = scratch().join(format!("fuzz-{}.toml", std::process::id()));
    std::fs::write(&path, data).expect("writing the spec");
    let _ = tilegrad::spec::load(&path);
}

/// A folder holding a copy of the examples (made once per process).
fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("tilegrad-fuzz-{}", std::process::id()));
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        for sub in ["", "triton"] {
            std::fs::create_dir_all(dir.join(sub)).expect("creating the scratch folder");
            for e in std::fs::read_dir(examples.join(sub)).expect("reading the examples").flatten() {
                if e.path().is_file() {
                    std::fs::copy(e.path(), dir.join(sub).join(e.file_name())).expect("copying an example");
                }
            }
        }
        dir
    })
}
