//! The float atomics a program logs at least, known before a run (each loop's body counted
//! once): what decides ahead of a launch that program order would take too long (see
//! `Gpu::run_place`).

use super::*;
use tilegrad_ir::triton::{convert, ConvertOptions};

/// Two float `atomic_add`s of a row of `BLOCK` outside loops (one under a branch); one inside a
/// loop.
const KERNELS: &str = r#"
import triton
import triton.language as tl

@triton.jit
def rows(x_ptr, gw_ptr, gb_ptr, n, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + tl.program_id(0) * n + cols, mask=cols < n, other=0.0)
    tl.atomic_add(gw_ptr + cols, x * x, mask=cols < n)
    if tl.program_id(0) > 0:
        tl.atomic_add(gb_ptr + cols, x, mask=cols < n)

@triton.jit
def looped(x_ptr, gw_ptr, n, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    for r in range(0, 4):
        x = tl.load(x_ptr + r * n + cols, mask=cols < n, other=0.0)
        tl.atomic_add(gw_ptr + cols, x, mask=cols < n)
"#;

fn generated(name: &str) -> Generated {
    let k = convert(KERNELS, "atomics.py", name, &ConvertOptions::with_constexprs(&[("BLOCK", 128)])).unwrap();
    generate_ordered(&k, true).unwrap()
}

#[test]
fn float_atomics_are_counted_ahead_with_each_loop_body_once() {
    let rows = generated("rows");
    assert!(rows.float_atomics);
    assert_eq!(rows.log_per_program, 256);
    let looped = generated("looped");
    assert!(looped.float_atomics);
    assert_eq!(looped.log_per_program, 128);
}

#[test]
fn a_programs_log_is_added_through_a_shared_tile() {
    let g = generated("rows");
    let s = &g.source;
    // Read into shared memory by the whole block, then scanned there; never scanned in global
    // memory by every thread.
    assert!(s.contains("__shared__ u64 tg_lt_own[1536]") || s.contains("u64* tg_lt = (u64*)scr"), "{s}");
    assert!(s.contains("tg_lt[q] = TG_LOG[3 * (u64)q0 + q]"), "{s}");
    assert!(s.contains("const u64* le = tg_lt + 3 * q;"), "{s}");
    assert!(!s.contains("const u64* le = TG_LOG + 3 * (u64)q;"), "{s}");
    // Each entry names the thread that adds it: the others skip it at one comparison.
    assert!(s.contains("if ((u32)(le[1] >> 32) != (u32)tid) continue;"), "{s}");
    assert!(s.contains("le[1] = act ? (1ULL | ((((u64)(tg_b1 + off) / 4) % 32) << 32)) : ~0ULL;"), "{s}");
    // Every thread loops over the tiles alike: the count is thread 0's.
    assert!(s.contains("tg_sh_n = tg_alen"), "{s}");
}
