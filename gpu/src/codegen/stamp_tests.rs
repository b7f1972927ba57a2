//! A marked form stamps its store marks in 32 or in 64 bits, never both behind a branch: the
//! width is its flavor's ([`Flavor::wide`]), from the launch's programs.

use super::*;
use tilegrad_ir::KernelBuilder;

/// `y[i] = 2 x[i]` over 256-wide tiles.
fn doubled() -> Kernel {
    let mut b = KernelBuilder::new("doubled");
    let x = b.ptr_param("x", DType::F32);
    let y = b.ptr_param("y", DType::F32);
    let pid = b.program_id(0);
    let width = b.i32(256);
    let base = b.mul(pid, width);
    let lanes = b.arange(0, 256);
    let offs = b.add(base, lanes);
    let px = b.add(x, offs);
    let v = b.load(px, None, None);
    let two = b.f32(2.0);
    let v2 = b.mul(v, two);
    let py = b.add(y, offs);
    b.store(py, v2, None);
    b.finish().unwrap()
}

#[test]
fn a_form_stamps_its_store_marks_in_one_width() {
    let narrow32 = "atomicExch((u32*)tg_w";
    let wide64 = "atomicExch((unsigned long long*)(tg_w";
    let k = doubled();
    let narrow = generate_flavor(&k, Flavor::default().for_programs((1 << 24) - 1)).unwrap();
    assert!(!narrow.wide && narrow.source.contains(narrow32) && !narrow.source.contains(wide64));
    let wide = generate_flavor(&k, Flavor::default().for_programs(1 << 24)).unwrap();
    assert!(wide.wide && wide.source.contains(wide64) && !wide.source.contains(narrow32));
    assert!(!narrow.source.contains("TG_WIDE") && !wide.source.contains("TG_WIDE"));
    // Programs not known yet take the narrow form (a wide launch compiles its own); forms
    // without marks have no stamps to widen.
    assert!(!Flavor::default().for_programs(u64::MAX).wide);
    assert!(!Flavor { marks: false, ..Flavor::default() }.for_programs(1 << 30).wide);
}
