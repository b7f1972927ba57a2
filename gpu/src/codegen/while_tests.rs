//! Loops end as the reference ends them: a `while` trip that leaves unchanged every carried
//! value the condition depends on (and memory, where the condition reads it) is the error "can
//! never end", and a `for` loop without `max_iters` whose bounds give more trips than the
//! reference's limit is refused before its first trip, each with the reference's text.

use super::*;
use tilegrad_ir::triton::{convert, ConstValue, ConvertOptions};

/// A reversed scan whose `start -= BLOCK` is missing: the condition depends on `start` alone;
/// `carry` changes and the body stores every trip. A loop whose condition reads memory. A loop
/// that carries its counter `i` (which decides) and a sum `acc` (which does not).
const KERNELS: &str = r#"
import triton
import triton.language as tl

@triton.jit
def stuck(dy_ptr, dx_ptr, n_cols, BLOCK: tl.constexpr):
    start = ((n_cols + BLOCK - 1) // BLOCK - 1) * BLOCK
    carry = 0.0
    while start >= 0:
        offs = start + tl.arange(0, BLOCK)
        dy = tl.load(dy_ptr + offs, mask=offs < n_cols, other=0.0)
        tl.store(dx_ptr + offs, tl.cumsum(dy, axis=0, reverse=True) + carry, mask=offs < n_cols)
        carry += tl.sum(dy, axis=0)

@triton.jit
def count_up(c_ptr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    while tl.load(c_ptr + pid) < 10:
        tl.store(c_ptr + pid, tl.load(c_ptr + pid) + 1)

@triton.jit
def moves(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = 0
    acc = 0.0
    while i < n:
        acc += tl.load(x_ptr + i)
        i += 1
    tl.store(y_ptr, acc)
"#;

fn kernel(name: &str) -> Kernel {
    let constexprs = vec![("BLOCK".to_string(), ConstValue::Int(32))];
    convert(KERNELS, "k.py", name, &ConvertOptions { constexprs, ..ConvertOptions::default() }).unwrap()
}

/// The lines of `source` that decide a loop never ends.
fn endless_checks(source: &str) -> Vec<&str> {
    source.lines().filter(|l| l.contains("__syncthreads_or(tg_changed")).collect()
}

#[test]
fn a_loop_whose_condition_inputs_stay_the_same_never_ends_whatever_it_stores() {
    let g = generate(&kernel("stuck")).unwrap();
    let checks = endless_checks(&g.source);
    assert_eq!(checks.len(), 1, "{checks:?}");
    assert!(!checks[0].contains("tg_nev"), "memory the condition does not read does not count: {}", checks[0]);
    // Nothing is compared: `carry` changes every trip but decides nothing, and `start`, which
    // the body never assigns, is not carried at all.
    assert_eq!(g.source.matches(") tg_changed").count(), 0, "{}", g.source);
    assert!(g.messages.contains(&tilegrad_reference::endless_while_message(false)), "{:?}", g.messages);
}

#[test]
fn a_loop_whose_condition_reads_memory_never_ends_only_when_memory_stays_too() {
    let g = generate(&kernel("count_up")).unwrap();
    let checks = endless_checks(&g.source);
    assert_eq!(checks.len(), 1, "{checks:?}");
    assert!(checks[0].contains("&& tg_nev == tg_ev"), "{}", checks[0]);
    assert!(g.messages.contains(&tilegrad_reference::endless_while_message(true)), "{:?}", g.messages);
}

#[test]
fn only_the_carried_values_the_condition_depends_on_are_compared() {
    let g = generate(&kernel("moves")).unwrap();
    assert_eq!(g.source.matches(") tg_changed").count(), 1, "`i`, not `acc`: {}", g.source);
    assert!(!endless_checks(&g.source)[0].contains("tg_nev"));
}

#[test]
fn a_for_loop_without_max_iters_is_refused_past_the_references_limit() {
    let src = r#"
import triton
import triton.language as tl

@triton.jit
def long(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    acc = 0.0
    for i in range(0, n):
        acc += tl.load(x_ptr + i)
    tl.store(y_ptr, acc)
"#;
    let constexprs = vec![("BLOCK".to_string(), ConstValue::Int(32))];
    let k = convert(src, "k.py", "long", &ConvertOptions { constexprs, ..ConvertOptions::default() }).unwrap();
    let g = generate(&k).unwrap();
    assert!(g.source.contains(&format!("> {}ULL && tid == 0)", tilegrad_reference::WHILE_LIMIT)), "{}", g.source);
    assert!(g.messages.contains(&tilegrad_reference::long_for_message()), "{:?}", g.messages);
}
