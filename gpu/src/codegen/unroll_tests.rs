//! Loops over a thread's registers: unrolled fully up to [`UNROLLED_REGISTERS`] a value, a few
//! at a time past it (in blocks grown for large tiles, past half as many), so that the code
//! NVRTC unrolls stops growing with the tile.

use super::*;
use tilegrad_ir::triton::{convert, ConstValue, ConvertOptions};

const SOFTMAX: &str = r#"
import triton
import triton.language as tl

@triton.jit
def rows_softmax(x_ptr, y_ptr, R: tl.constexpr, C: tl.constexpr):
    r = tl.program_id(0) * R + tl.arange(0, R)
    c = tl.arange(0, C)
    x = tl.load(x_ptr + r[:, None] * C + c[None, :])
    e = tl.exp(x - tl.max(x, axis=1)[:, None])
    tl.store(y_ptr + r[:, None] * C + c[None, :], e / tl.sum(e, axis=1)[:, None])
"#;

/// The row softmax over `rows` x `cols` tiles.
fn softmax(rows: i64, cols: i64) -> Kernel {
    let constexprs = vec![("R".to_string(), ConstValue::Int(rows)), ("C".to_string(), ConstValue::Int(cols))];
    convert(SOFTMAX, "softmax.py", "rows_softmax", &ConvertOptions { constexprs, ..ConvertOptions::default() }).unwrap()
}

/// The loops over registers of a generated source: (trip count, unrolled fully, ops merged in
/// it).
fn register_loops(source: &str) -> Vec<(usize, bool, usize)> {
    let mut out = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find("#pragma unroll") {
        rest = &rest[at + "#pragma unroll".len()..];
        let (pragma, after) = rest.split_once('\n').unwrap();
        // `for (int j = 0; j < 32; ++j)`: the trip count after `<`.
        let cond = after.split(';').nth(1).unwrap();
        let Some(n) = cond.split('<').nth(1).and_then(|n| n.trim().parse::<usize>().ok()) else { continue };
        if after.starts_with("for (int j ") || after.starts_with("for (int jw ") || after.starts_with("for (int o ") {
            let line = after.lines().next().unwrap_or("");
            out.push((n, pragma.trim().is_empty(), line.matches("{ const int e = ").count().max(1)));
        }
    }
    out
}

/// Op bodies NVRTC emits for a source's registers: one for each register written out
/// (`{ const int j = 3; ...`), and for each op of a loop the trip count where it is unrolled
/// fully, [`PARTIAL_UNROLL`] otherwise (the kernels here are f32).
fn unrolled_bodies(source: &str) -> usize {
    let written_out = source.matches("{ const int j = ").count();
    let looped: usize = register_loops(source).iter().map(|&(n, full, ops)| ops * if full { n } else { n.min(PARTIAL_UNROLL) }).sum();
    written_out + looped
}

#[test]
fn registers_within_the_limit_are_written_out_and_past_it_looped() {
    // 1 x 1024 in a VJP kernel's 256 threads: 4 registers a value, written out one block each.
    let vjp = Flavor::VJP;
    let g = generate_flavor_unrolling(&softmax(1, 1024), vjp, UNROLLED_REGISTERS).unwrap();
    assert_eq!(g.threads, 256);
    assert!(!g.source.contains("for (int j = 0;"), "a loop over registers left");
    for j in 0..STRAIGHT_REGISTERS {
        assert!(g.source.contains(&format!("{{ const int j = {j}; {{ const int e = tid + j * 256;")), "register {j}");
    }
    assert!(!g.source.contains(&format!("{{ const int j = {STRAIGHT_REGISTERS};")));
    // 1 x 4096: 16 registers a value, a loop unrolled fully (its row index, of one register,
    // written out).
    let g = generate_flavor_unrolling(&softmax(1, 4096), Flavor::default(), UNROLLED_REGISTERS).unwrap();
    assert!(g.source.contains("#pragma unroll\nfor (int j = 0; j < 16; ++j)"));
    assert!(!g.source.contains("{ const int j = 4;"));
}

#[test]
fn loops_over_more_registers_than_the_limit_are_unrolled_a_few_at_a_time() {
    // 8 x 4096: 32 registers a value even in 1024-thread blocks.
    let g = generate_flavor_unrolling(&softmax(8, 4096), Flavor::default(), UNROLLED_REGISTERS).unwrap();
    assert_eq!(g.threads, 1024);
    let loops = register_loops(&g.source);
    assert!(loops.iter().any(|&(n, full, _)| n == 32 && !full), "{loops:?}");
    assert!(loops.iter().all(|&(n, full, _)| !full || n <= UNROLLED_REGISTERS / 2), "{loops:?}");
    assert!(g.source.contains(&format!("#pragma unroll {PARTIAL_UNROLL}\nfor (int j = 0; j < 32; ++j)")));
    // Its f64 form (the ground truth's) loops an iteration a register, and only there.
    let wide = tilegrad_ir::passes::promote_floats(&softmax(8, 4096), DType::F64).unwrap();
    let g64 = generate_flavor_unrolling(&wide, Flavor::default(), UNROLLED_REGISTERS).unwrap();
    assert!(g64.source.contains(&format!("#pragma unroll {PARTIAL_UNROLL_F64}\nfor (int j = 0; j < 32; ++j)")));
    assert!(!g64.source.contains(&format!("#pragma unroll {PARTIAL_UNROLL}\n")));
    let full = |s: &str| register_loops(s).iter().filter(|l| l.1).map(|l| l.0).collect::<Vec<_>>();
    assert_eq!(full(&g64.source), full(&g.source), "the loops unrolled fully are the same");
}

#[test]
fn what_nvrtc_unrolls_stops_growing_with_the_tile() {
    let bodies = |rows, cols| {
        unrolled_bodies(&generate_flavor_unrolling(&softmax(rows, cols), Flavor::default(), UNROLLED_REGISTERS).unwrap().source)
    };
    // 16 registers a value (1 x 4096 in 256 threads): the most unrolled fully.
    let at_limit = bodies(1, 4096);
    for (rows, cols) in [(2, 4096), (4, 4096), (8, 4096), (16, 4096), (8, 16384), (64, 4096)] {
        assert!(bodies(rows, cols) <= at_limit, "{rows}x{cols}: {} bodies, {at_limit} at the limit", bodies(rows, cols));
    }
    // Unrolled fully, as before the limit, it grew with the tile: 8 times the elements, about 8
    // times the bodies.
    let full = |rows| unrolled_bodies(&generate_flavor_unrolling(&softmax(rows, 4096), Flavor::default(), usize::MAX).unwrap().source);
    assert!(full(64) > 7 * full(8) && full(8) > 5 * at_limit, "{} {} {at_limit}", full(64), full(8));
}

#[test]
fn tiles_within_the_limit_generate_the_same_code_as_before() {
    for (rows, cols) in [(1, 4096), (16, 64), (1, 128)] {
        let k = softmax(rows, cols);
        let a = generate_flavor_unrolling(&k, Flavor::default(), UNROLLED_REGISTERS).unwrap();
        let b = generate_flavor_unrolling(&k, Flavor::default(), usize::MAX).unwrap();
        assert_eq!((a.threads, a.min_blocks), (b.threads, b.min_blocks));
        assert!(a.source == b.source, "{rows}x{cols}: the code differs");
    }
}

#[test]
fn blocks_grow_before_loops_stop_being_unrolled() {
    assert_eq!(block_shape(1024, 16), (128, 6, 16));
    assert_eq!(block_shape(4096, 16), (256, 4, 16));
    // 64 registers a value at 256 threads: 1024 threads hold 16 each, unrolled 8 at most.
    assert_eq!(block_shape(16384, 16), (1024, 1, 8));
    assert_eq!(block_shape(32768, 16), (1024, 1, 8));
    assert_eq!(block_shape(32768, usize::MAX), (256, 4, usize::MAX));
}

/// Kernels without marks (VJP kernels, in f64) hold half the elements a thread that others do,
/// in blocks of up to 512 threads with twice the registers each; tiles too large for that take
/// the plain kernels' shape.
#[test]
fn vjp_kernels_take_twice_the_threads_with_twice_the_registers() {
    let plain = Flavor::default();
    let vjp = Flavor::VJP;
    let at = |k: &Kernel, f: Flavor| {
        let g = generate_flavor_unrolling(k, f, UNROLLED_REGISTERS).unwrap();
        (g.threads, g.min_blocks)
    };
    // 32 x 64 = 2048 elements: 256 threads of 8, or 512 of 4 (one block an SM asked).
    let k = softmax(32, 64);
    assert_eq!(at(&k, plain), (256, 4));
    assert_eq!(at(&k, vjp), (512, 1));
    // 16 x 64 = 1024: 128 threads (6 blocks), or 256 (2 blocks).
    let k = softmax(16, 64);
    assert_eq!(at(&k, plain), (128, 6));
    assert_eq!(at(&k, vjp), (256, 2));
    // 8 x 4096: past what 512 threads hold within the limit, the plain shape (its blocks an
    // SM depend on the shared memory another test may be setting: threads only).
    let k = softmax(8, 4096);
    assert_eq!(at(&k, vjp).0, at(&k, plain).0);
}

/// Cross entropy's forward in the style of fused-loss kernels: two passes over a row of
/// logits, exponentials, divisions and a gradient stored, a 4096-wide tile.
const CROSS_ENTROPY: &str = r#"
import triton
import triton.language as tl

@triton.jit
def ce_fwd(x_ptr, dx_ptr, y_ptr, loss_ptr, n_cols, n_rows, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    y = tl.load(y_ptr + row)
    m = float("-inf")
    d = 0.0
    for i in range(0, n_cols, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * n_cols + offs, mask=offs < n_cols, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x))
        d = d * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new))
        m = m_new
    for i in range(0, n_cols, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * n_cols + offs, mask=offs < n_cols, other=float("-inf"))
        p = tl.exp(x - m) / d
        g = tl.where(offs == y, p - 1.0, p) / n_rows
        tl.store(dx_ptr + row * n_cols + offs, g, mask=offs < n_cols)
    x_y = tl.load(x_ptr + row * n_cols + y)
    tl.store(loss_ptr + row, (m + tl.log(d) - x_y) / n_rows)
"#;

/// Kernel `name` of a cross-entropy source, over 4096-wide tiles (i64 labels, f32 scalars).
fn cross_entropy(source: &str, name: &str) -> Kernel {
    let opts = ConvertOptions {
        constexprs: vec![("BLOCK".to_string(), ConstValue::Int(4096))],
        pointer_dtypes: vec![("y_ptr".to_string(), DType::I64)],
        scalar_dtypes: ["eps", "z_scale"].iter().map(|n| (n.to_string(), DType::F32)).collect(),
        ..ConvertOptions::default()
    };
    convert(source, "ce.py", name, &opts).unwrap()
}

/// A forward whose tile values would take a thread over [`UNROLLED_WORK`] registers in all gets
/// twice the threads, half the registers each; the row softmax of the same tile, within it,
/// keeps its block; VJP kernels keep theirs.
#[test]
fn a_forward_with_much_work_an_element_takes_more_threads() {
    let ce = cross_entropy(CROSS_ENTROPY, "ce_fwd");
    assert!(thread_work(&ce, 256) > UNROLLED_WORK && thread_work(&ce, 512) <= UNROLLED_WORK, "{}", thread_work(&ce, 256));
    let g = generate_flavor_unrolling(&ce, Flavor::default(), UNROLLED_REGISTERS).unwrap();
    assert_eq!((g.threads, g.min_blocks), (512, 2));
    // Every loop over a value's 8 registers still unrolled fully.
    assert!(register_loops(&g.source).iter().all(|&(n, full, _)| full && n <= 8), "{:?}", register_loops(&g.source));
    let sm = softmax(1, 4096);
    assert!(thread_work(&sm, 256) <= UNROLLED_WORK);
    assert_eq!(generate_flavor_unrolling(&sm, Flavor::default(), UNROLLED_REGISTERS).unwrap().threads, 256);
    let vjp = Flavor::VJP;
    assert_eq!(generate_flavor_unrolling(&ce, vjp, UNROLLED_REGISTERS).unwrap().threads, 512);
    // With the budget as large as the work, the block it had.
    assert_eq!(spread(&ce, 4096, block_shape(4096, UNROLLED_REGISTERS), usize::MAX).0, 256);
}

/// [`CROSS_ENTROPY`] with label smoothing and a z-loss, as fused-loss libraries write it: more
/// work an element in both passes.
const CROSS_ENTROPY_SMOOTHED: &str = r#"
import triton
import triton.language as tl

@triton.jit
def ce_smooth_fwd(x_ptr, y_ptr, loss_ptr, n_cols, n_rows, eps, z_scale, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    y = tl.load(y_ptr + row)
    if y == -100:
        for i in range(0, n_cols, BLOCK):
            offs = i + tl.arange(0, BLOCK)
            tl.store(x_ptr + row * n_cols + offs, 0.0, mask=offs < n_cols)
        return
    m = float("-inf")
    d = 0.0
    x_sum = 0.0
    for i in range(0, n_cols, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * n_cols + offs, mask=offs < n_cols, other=float("-inf"))
        x_sum += tl.sum(tl.where(offs < n_cols, -eps * x, 0.0))
        m_new = tl.maximum(m, tl.max(x))
        d = d * tl.exp2((m - m_new) * 1.4426950408889634) + tl.sum(tl.exp2((x - m_new) * 1.4426950408889634))
        m = m_new
    lse = m + tl.log(d)
    x_y = tl.load(x_ptr + row * n_cols + y)
    for i in range(0, n_cols, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * n_cols + offs, mask=offs < n_cols, other=float("-inf"))
        p = tl.exp2((x - m) * 1.4426950408889634) / d
        g = (p + 2 * z_scale * lse * p - eps) / n_rows
        g = tl.where(offs == y, g - (1.0 - eps * n_cols) / n_rows, g)
        tl.store(x_ptr + row * n_cols + offs, g, mask=offs < n_cols)
    loss = lse - x_y
    loss = loss * (1.0 - eps * n_cols) + x_sum + eps * n_cols * lse
    tl.store(loss_ptr + row, (loss + z_scale * lse * lse) / n_rows)
"#;

/// A VJP kernel whose tile values would take a thread over [`UNROLLED_VJP_WORK`] elements in
/// all (the smoothed cross entropy's, with its early return and its gradient written over its
/// logits) gets twice the threads, its loops still unrolled fully; the plain cross entropy's,
/// within it, keeps its 512.
#[test]
fn a_vjp_kernel_with_much_work_an_element_takes_more_threads() {
    let vjp = Flavor::VJP;
    let heavy = tilegrad_ad::vjp_kernel(&cross_entropy(CROSS_ENTROPY_SMOOTHED, "ce_smooth_fwd")).unwrap().kernel;
    assert!(thread_work(&heavy, 512) > UNROLLED_VJP_WORK, "{}", thread_work(&heavy, 512));
    let g = generate_flavor_unrolling(&heavy, vjp, UNROLLED_REGISTERS).unwrap();
    assert_eq!((g.threads, g.min_blocks), (1024, 1));
    assert!(register_loops(&g.source).iter().all(|&(n, full, _)| full && n <= 4), "{:?}", register_loops(&g.source));
    let plain = tilegrad_ad::vjp_kernel(&cross_entropy(CROSS_ENTROPY, "ce_fwd")).unwrap().kernel;
    assert!(thread_work(&plain, 512) <= UNROLLED_VJP_WORK, "{}", thread_work(&plain, 512));
    assert_eq!(generate_flavor_unrolling(&plain, vjp, UNROLLED_REGISTERS).unwrap().threads, 512);
}
