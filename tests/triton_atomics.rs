//! `while` loops and the atomics beyond `atomic_add` (`atomic_max/min/and/or/xor/xchg/cas`),
//! written in Triton as kernel libraries write them: converted by the front end, printed and
//! parsed back, run on the reference interpreter against plain-Rust references (histogram-style
//! `atomic_max`, tickets from the old values of `atomic_add`, a compare-and-swap counter, a
//! spin-lock guarded accumulation that is exact with its lock and a race without it), and, where
//! differentiable, AD against finite differences; refusals and errors keep their line:column; a
//! `while` that can never end is an error at its first idle iteration, and only such a loop.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tilegrad_ad::fd::{fd_directional, FdSpec};
use tilegrad_ad::{vjp, GradOptions};
use tilegrad_ir::triton::{convert, ConvertOptions};
use tilegrad_ir::{DType, Kernel, Op};
use tilegrad_reference::{HostTensor, Launch, Memory};

fn kernel(src: &str, name: &str, consts: &[(&str, i64)], ptrs: &[(&str, DType)]) -> Kernel {
    let mut opts = ConvertOptions::with_constexprs(consts);
    opts.pointer_dtypes = ptrs.iter().map(|&(n, d)| (n.to_string(), d)).collect();
    let k = convert(src, "k.py", name, &opts).unwrap_or_else(|e| panic!("{e}"));
    // The text form round-trips.
    let text = k.to_string();
    let back = tilegrad_ir::text::parse_kernel(&text, "k.tgir").unwrap_or_else(|e| panic!("{e}\n{text}"));
    let mut canon = k.clone();
    canon.canonicalize();
    assert_eq!(back.to_string(), canon.to_string());
    k
}

fn count(k: &Kernel, f: impl Fn(&Op) -> bool) -> usize {
    let mut n = 0;
    k.walk(&mut |_, d| n += f(&d.op) as usize);
    n
}

const HIST: &str = r#"
import triton
import triton.language as tl

@triton.jit
def bin_max(x_ptr, bin_ptr, best_ptr, best_idx_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    b = tl.load(bin_ptr + offs, mask=mask)
    tl.atomic_max(best_ptr + b, x, mask=mask)
    tl.atomic_min(best_idx_ptr + b, offs, mask=mask, sem="relaxed", scope="gpu")
"#;

#[test]
fn atomic_max_and_min_per_bin_match_a_plain_loop() {
    let k = kernel(HIST, "bin_max", &[("BLOCK", 32)], &[("bin_ptr", DType::I32), ("best_idx_ptr", DType::I32)]);
    assert_eq!(count(&k, |o| matches!(o, Op::AtomicRmw { .. })), 2);
    let (n, bins) = (1000usize, 37usize);
    let mut r = StdRng::seed_from_u64(1);
    let x: Vec<f32> = (0..n).map(|_| r.gen_range(-5.0..5.0)).collect();
    let b: Vec<i32> = (0..n).map(|_| r.gen_range(0..bins as i32)).collect();
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[n], x.clone()));
    let bt = mem.add("bin", HostTensor::from_i32(&[n], b.clone()));
    let best = mem.add("best", HostTensor::from_f32(&[bins], vec![f32::NEG_INFINITY; bins]));
    let idx = mem.add("idx", HostTensor::from_i32(&[bins], vec![i32::MAX; bins]));
    Launch::new(&k, n.div_ceil(32) as u32)
        .arg("x_ptr", xt)
        .arg("bin_ptr", bt)
        .arg("best_ptr", best)
        .arg("best_idx_ptr", idx)
        .arg("n", n as i64)
        .run(&mut mem)
        .unwrap();
    let (mut eb, mut ei) = (vec![f32::NEG_INFINITY; bins], vec![i32::MAX; bins]);
    for i in 0..n {
        let j = b[i] as usize;
        eb[j] = eb[j].max(x[i]);
        ei[j] = ei[j].min(i as i32);
    }
    assert_eq!(mem.get(best).as_f32().unwrap(), &eb[..]);
    assert_eq!(mem.get(idx).as_i32().unwrap(), &ei[..]);
}

const TICKETS: &str = r#"
import triton
import triton.language as tl

@triton.jit
def tickets(counter_ptr, flags_ptr, out_ptr, xor_ptr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    t = tl.atomic_add(counter_ptr, 1)
    tl.store(out_ptr + pid, t)
    # Compare-and-swap increments: retry until no other program got in between (the first
    # guess read atomically: a plain load of it would race with the other programs' updates).
    old = tl.atomic_or(counter_ptr + 1, 0)
    seen = tl.atomic_cas(counter_ptr + 1, old, old + 2)
    while seen != old:
        old = seen
        seen = tl.atomic_cas(counter_ptr + 1, old, old + 2)
    lanes = tl.arange(0, BLOCK)
    tl.atomic_or(flags_ptr + lanes, tl.where(pid % 3 == lanes % 3, pid % 5 + 1, 0))
    tl.atomic_xor(xor_ptr, pid * 7 + 1)
"#;

#[test]
fn old_values_follow_program_order_and_cas_counts_exactly() {
    let k = kernel(
        TICKETS,
        "tickets",
        &[("BLOCK", 8)],
        &[("counter_ptr", DType::I32), ("flags_ptr", DType::I32), ("out_ptr", DType::I32), ("xor_ptr", DType::I64)],
    );
    assert_eq!(count(&k, |o| matches!(o, Op::While { .. })), 1);
    assert_eq!(count(&k, |o| matches!(o, Op::AtomicCas)), 2);
    let p = 23usize;
    let mut mem = Memory::new();
    let c = mem.add("counter", HostTensor::from_i32(&[2], vec![5, 100]));
    let f = mem.add("flags", HostTensor::from_i32(&[8], vec![0; 8]));
    let o = mem.add("out", HostTensor::from_i32(&[p], vec![-1; p]));
    let x = mem.add("xor", HostTensor::from_i64(&[1], vec![12345]));
    Launch::new(&k, p as u32).arg("counter_ptr", c).arg("flags_ptr", f).arg("out_ptr", o).arg("xor_ptr", x).run(&mut mem).unwrap();
    // The old value of atomic_add: tickets in program order.
    assert_eq!(mem.get(o).as_i32().unwrap(), &(5..5 + p as i32).collect::<Vec<_>>()[..]);
    assert_eq!(mem.get(c).as_i32().unwrap(), &[5 + p as i32, 100 + 2 * p as i32]);
    let mut flags = [0i32; 8];
    let mut xr = 12345i64;
    for pid in 0..p as i32 {
        for (l, fl) in flags.iter_mut().enumerate() {
            *fl |= if pid % 3 == l as i32 % 3 { pid % 5 + 1 } else { 0 };
        }
        xr ^= (pid * 7 + 1) as i64;
    }
    assert_eq!(mem.get(f).as_i32().unwrap(), &flags[..]);
    assert_eq!(mem.get(x).as_i64().unwrap(), &[xr]);
}

/// How `locked_sum` guards its read-modify-write of the shared rows.
#[derive(Clone, Copy, Debug)]
enum Guard {
    /// No lock: the accumulation races.
    None,
    /// `while tl.atomic_cas(lock, 0, 1) == 1: pass` ... `tl.atomic_xchg(lock, 0)`.
    Cas,
    /// A test-and-set lock: `while tl.atomic_xchg(lock, 1) == 1: pass` ... `tl.atomic_xchg(lock, 0)`.
    Xchg,
}

/// Partial sums of rows accumulated into `GROUPS` shared rows under a spin lock, with a
/// `count` flag telling the first writer, as in Triton's layer-norm backward tutorial.
fn locked_source(guard: Guard) -> String {
    let (acquire, release) = match guard {
        Guard::None => ("", ""),
        Guard::Cas => ("    while tl.atomic_cas(lock, 0, 1) == 1:\n        pass\n", "    tl.atomic_xchg(lock, 0)\n"),
        Guard::Xchg => ("    while tl.atomic_xchg(lock, 1) == 1:\n        pass\n", "    tl.atomic_xchg(lock, 0)\n"),
    };
    format!(
        r#"
import triton
import triton.language as tl

@triton.jit
def locked_sum(x_ptr, out_ptr, lock_ptr, n, GROUPS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + pid * n + offs, mask=mask, other=0.0)
    g = pid % GROUPS
    lock = lock_ptr + g
    count_ptr = lock_ptr + GROUPS + g
{acquire}    count = tl.load(count_ptr)
    if count == 0:
        tl.atomic_xchg(count_ptr, 1)
    else:
        x += tl.load(out_ptr + g * n + offs, mask=mask)
    tl.store(out_ptr + g * n + offs, x, mask=mask)
    tl.debug_barrier()
{release}"#
    )
}

fn run_locked(guard: Guard) -> (Result<(), String>, Vec<f32>, Vec<f32>) {
    let k = kernel(&locked_source(guard), "locked_sum", &[("GROUPS", 4), ("BLOCK", 64)], &[("lock_ptr", DType::I32)]);
    let (rows, n, groups) = (29usize, 50usize, 4usize);
    let mut r = StdRng::seed_from_u64(7);
    let x: Vec<f32> = (0..rows * n).map(|_| r.gen_range(-1.0..1.0)).collect();
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[rows, n], x.clone()));
    let out = mem.add("partial", HostTensor::from_f32(&[groups, n], vec![f32::NAN; groups * n]));
    let locks = mem.add("locks", HostTensor::from_i32(&[2 * groups], vec![0; 2 * groups]));
    let res = Launch::new(&k, rows as u32)
        .arg("x_ptr", xt)
        .arg("out_ptr", out)
        .arg("lock_ptr", locks)
        .arg("n", n as i64)
        .run(&mut mem)
        .map(|_| ())
        .map_err(|e| e.to_string());
    // The f32 sum in program order, the order the reference acquires the locks in.
    let mut expected = vec![0f32; groups * n];
    let mut first = vec![true; groups];
    for row in 0..rows {
        let g = row % groups;
        for c in 0..n {
            let v = x[row * n + c];
            expected[g * n + c] = if first[g] { v } else { expected[g * n + c] + v };
        }
        first[g] = false;
    }
    (res, mem.get(out).as_f32().unwrap().to_vec(), expected)
}

#[test]
fn spin_lock_guarded_accumulation_is_exact_and_racy_without_the_lock() {
    for guard in [Guard::Cas, Guard::Xchg] {
        let (res, got, expected) = run_locked(guard);
        res.unwrap_or_else(|e| panic!("{guard:?}: {e}"));
        assert_eq!(got, expected, "{guard:?}");
    }
    let (res, _, _) = run_locked(Guard::None);
    let e = res.expect_err("without the lock the accumulation races");
    assert!(e.contains("race") && e.contains("partial") && e.contains("k.py:"), "{e}");
}

const EXCHANGED_NOT_RELEASED: &str = r#"
import triton
import triton.language as tl

@triton.jit
def flagged(flag_ptr, x_ptr):
    pid = tl.program_id(0)
    tl.atomic_xchg(flag_ptr, pid + 1)
    tl.store(x_ptr, pid * 1.0)
"#;

#[test]
fn an_exchange_never_set_back_orders_nothing() {
    // Each program changes the flag and keeps it changed: no critical section, so the two
    // stores to x still race.
    let k = kernel(EXCHANGED_NOT_RELEASED, "flagged", &[], &[("flag_ptr", DType::I32)]);
    let mut mem = Memory::new();
    let f = mem.add("flag", HostTensor::from_i32(&[1], vec![0]));
    let x = mem.add("x", HostTensor::zeros(DType::F32, &[1]));
    let e = Launch::new(&k, 2).arg("flag_ptr", f).arg("x_ptr", x).run(&mut mem).unwrap_err().to_string();
    assert!(e.contains("race") && e.contains("`x`") && e.contains("k.py:9:"), "{e}");
}

const NEVER_RELEASED: &str = r#"
import triton
import triton.language as tl

@triton.jit
def stuck(lock_ptr, x_ptr):
    pid = tl.program_id(0)
    while tl.atomic_cas(lock_ptr, 0, 1) == 1:
        pass
    tl.store(x_ptr + pid, 1.0)
"#;

#[test]
fn a_lock_never_released_is_an_error_not_a_hang() {
    let k = kernel(NEVER_RELEASED, "stuck", &[], &[("lock_ptr", DType::I32)]);
    let mut mem = Memory::new();
    let l = mem.add("lock", HostTensor::from_i32(&[1], vec![0]));
    let x = mem.add("x", HostTensor::zeros(DType::F32, &[3]));
    let e = Launch::new(&k, 3).arg("lock_ptr", l).arg("x_ptr", x).run(&mut mem).unwrap_err().to_string();
    assert!(e.contains("k.py:8:5") && e.contains("can never end") && e.contains("(1, 0, 0)"), "{e}");
}

const NEWTON: &str = r#"
import triton
import triton.language as tl

@triton.jit
def cube_root(x_ptr, y_ptr, steps_ptr, n, BLOCK: tl.constexpr):
    # Newton iterations for y^3 = x, until the largest update of the block is small.
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=1.0)
    y = x * 0.5 + 0.5
    delta = 1.0
    it = 0
    while delta > 1e-6:
        y_new = y - (y * y * y - x) / (3.0 * y * y)
        delta = tl.max(tl.abs(y_new - y), axis=0)
        y = y_new
        it += 1
    tl.store(y_ptr + offs, y, mask=mask)
    tl.store(steps_ptr + pid, it)
"#;

#[test]
fn while_loop_with_a_runtime_condition_converges_and_differentiates() {
    let k = kernel(NEWTON, "cube_root", &[("BLOCK", 16)], &[("steps_ptr", DType::I32)]);
    let n = 45usize;
    let mut r = StdRng::seed_from_u64(3);
    let x: Vec<f32> = (0..n).map(|_| r.gen_range(0.5..3.0)).collect();
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[n], x.clone()));
    let yt = mem.add("y", HostTensor::zeros(DType::F32, &[n]));
    let st = mem.add("steps", HostTensor::from_i32(&[3], vec![0; 3]));
    let launch = Launch::new(&k, 3).arg("x_ptr", xt).arg("y_ptr", yt).arg("steps_ptr", st).arg("n", n as i64);
    let mut run = mem.clone();
    launch.run(&mut run).unwrap();
    for (i, (&y, &xv)) in run.get(yt).as_f32().unwrap().iter().zip(&x).enumerate() {
        assert!((y as f64 - (xv as f64).cbrt()).abs() < 1e-5, "y[{i}] = {y}, cbrt = {}", (xv as f64).cbrt());
    }
    assert!(run.get(st).as_i32().unwrap().iter().all(|&s| (3..40).contains(&s)));
    // The gradient of the iterated map (not of cbrt: the loop stops at a tolerance) against
    // central finite differences of the same launch in f64.
    let cot: Vec<f64> = (0..n).map(|_| r.gen_range(-1.0..1.0)).collect();
    let grad = vjp(&launch, &mem, &[xt], &[(yt, cot.clone())], &GradOptions::default()).unwrap();
    let expected: Vec<f64> = x.iter().zip(&cot).map(|(&v, c)| c / (3.0 * (v as f64).cbrt().powi(2))).collect();
    for (g, e) in grad.inputs[0].iter().zip(&expected) {
        assert!((g - e).abs() < 1e-3 * e.abs().max(1e-3), "{g} vs {e}");
    }
    let spec = FdSpec::new(&launch, &mem, vec![xt], vec![yt]);
    let dir: Vec<f64> = (0..n).map(|_| r.gen_range(-1.0..1.0)).collect();
    let fd = fd_directional(&spec, &[cot], std::slice::from_ref(&dir), 1e-6).unwrap();
    let ad: f64 = grad.inputs[0].iter().zip(&dir).map(|(a, b)| a * b).sum();
    assert!((ad - fd).abs() <= 1e-6 * ad.abs().max(fd.abs()), "AD {ad} vs FD {fd}");
}

#[test]
fn differentiating_order_dependent_atomics_is_refused_with_the_line() {
    let k = kernel(HIST, "bin_max", &[("BLOCK", 32)], &[("bin_ptr", DType::I32), ("best_idx_ptr", DType::I32)]);
    let n = 40usize;
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[n], (0..n).map(|i| (i as f32 * 0.37).sin()).collect()));
    let bt = mem.add("bin", HostTensor::from_i32(&[n], (0..n as i32).map(|i| i % 5).collect()));
    let best = mem.add("best", HostTensor::from_f32(&[5], vec![-9.0; 5]));
    let idx = mem.add("idx", HostTensor::from_i32(&[5], vec![1000; 5]));
    let launch = Launch::new(&k, 2).arg("x_ptr", xt).arg("bin_ptr", bt).arg("best_ptr", best).arg("best_idx_ptr", idx).arg("n", n as i64);
    let e = vjp(&launch, &mem, &[xt], &[(best, vec![1.0; 5])], &GradOptions::default()).unwrap_err().to_string();
    assert!(e.contains("atomic_max") && e.contains("k.py:12:5") && e.contains("order"), "{e}");
}

#[test]
fn conversion_errors_point_at_the_source() {
    let bad = |body: &str| {
        let src = format!("import triton\nimport triton.language as tl\n\n@triton.jit\ndef k(x_ptr, i_ptr):\n{body}");
        let opts = ConvertOptions { pointer_dtypes: vec![("i_ptr".into(), DType::I32)], ..ConvertOptions::default() };
        convert(&src, "k.py", "k", &opts).unwrap_err().to_string()
    };
    let e = bad("    while True:\n        pass\n");
    assert!(e.contains("k.py:6:11") && e.contains("always true"), "{e}");
    let e = bad("    tl.atomic_and(x_ptr, 1)\n");
    assert!(e.contains("k.py:6:5") && e.contains("integers"), "{e}");
    let e = bad("    tl.atomic_max(i_ptr, 1, sem=\"seq\")\n");
    assert!(e.contains("k.py:6:29") && e.contains("acq_rel"), "{e}");
    let e = bad("    i = 0\n    while i < 3:\n        i += 1\n    else:\n        pass\n");
    assert!(e.contains("while ... else"), "{e}");
    // Triton converts neither operand of a compare-and-swap: a float compare value on an i32
    // lock, an i64 new value, a tile of floats are refused at the operand.
    for (call, col, found) in [
        ("tl.atomic_cas(i_ptr, 0.0, 1)", 32, "`cmp` of `tl.atomic_cas` must have the pointer's element type i32, found f32"),
        ("tl.atomic_cas(i_ptr, 0, 4294967296)", 35, "`val` of `tl.atomic_cas` must have the pointer's element type i32, found i64"),
        (
            "tl.atomic_cas(i_ptr + tl.arange(0, 4), tl.full((4,), 0, tl.int32), tl.zeros((4,), tl.float32))",
            78,
            "`val` of `tl.atomic_cas` must have the pointer's element type i32, found f32[4]",
        ),
    ] {
        let e = bad(&format!("    old = {call}\n"));
        assert!(e.contains(&format!("k.py:6:{col}:")) && e.contains(found), "{call}: {e}");
    }
    // Nor does it broadcast them: `cmp` and `val` have the pointer's shape (a scalar beside a
    // block of pointers, a block beside one pointer, a [1, 4] beside [4, 1]), refused at the
    // operand.
    for (call, col, found) in [
        (
            "tl.atomic_cas(i_ptr + tl.arange(0, 4), 0, tl.full((4,), 1, tl.int32))",
            50,
            "`cmp` of `tl.atomic_cas` must have the pointer's shape [4], found i32 ",
        ),
        (
            "tl.atomic_cas(i_ptr + tl.arange(0, 4), tl.full((4,), 0, tl.int32), 1)",
            78,
            "`val` of `tl.atomic_cas` must have the pointer's shape [4], found i32 ",
        ),
        (
            "tl.atomic_cas(i_ptr, tl.full((4,), 0, tl.int32), tl.full((4,), 1, tl.int32))",
            32,
            "`cmp` of `tl.atomic_cas` must have the pointer's shape [], found i32[4]",
        ),
        (
            "tl.atomic_cas(i_ptr + tl.arange(0, 4)[:, None], tl.full((1, 4), 0, tl.int32), tl.full((4, 4), 1, tl.int32))",
            59,
            "`cmp` of `tl.atomic_cas` must have the pointer's shape [4, 1], found i32[1, 4]",
        ),
    ] {
        let e = bad(&format!("    old = {call}\n"));
        assert!(e.contains(&format!("k.py:6:{col}:")) && e.contains(found), "{call}: {e}");
    }
    // The read-modify-writes convert their value to the element type, as Triton does.
    let src = "import triton\nimport triton.language as tl\n\n@triton.jit\ndef k(i_ptr):\n    tl.atomic_add(i_ptr, 2.75)\n    tl.atomic_xchg(i_ptr, 1.0)\n";
    let k = kernel(src, "k", &[], &[("i_ptr", DType::I32)]);
    let mut mem = Memory::new();
    let i = mem.add("i", HostTensor::from_i32(&[1], vec![5]));
    Launch::new(&k, 1).arg("i_ptr", i).run(&mut mem).unwrap();
    assert_eq!(mem.get(i).as_i32().unwrap(), &[1]);
}

const PROGRESS: &str = r#"
import triton
import triton.language as tl

@triton.jit
def count_up(c_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # The condition reads what the body stores: one trip's store is the next trip's condition.
    pid = tl.program_id(0)
    while tl.load(c_ptr + pid) < 10:
        tl.store(c_ptr + pid, tl.load(c_ptr + pid) + 1)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(c_ptr + pid).to(tl.float32), mask=offs < n)

@triton.jit
def settle(x_ptr, y_ptr, t_ptr, n, LIMIT: tl.constexpr, BLOCK: tl.constexpr):
    # The condition reads `done` only, which stays 0 for several trips while `acc` (which
    # decides it) grows; every trip stores new values.
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + pid * n + offs, mask=mask, other=0.0)
    acc = 0.0
    done = 0
    trips = 0
    while done == 0:
        acc += tl.sum(x * x, axis=0)
        tl.store(y_ptr + pid * n + offs, x * acc, mask=mask)
        done = (acc > LIMIT).to(tl.int32)
        trips += 1
    tl.store(t_ptr + pid, trips)

@triton.jit
def suffix_sum_stuck(DY, DX, stride, n_cols, BLOCK: tl.constexpr):
    # A reversed scan over column blocks whose `start -= BLOCK` is missing: `carry` and the
    # stored values change every trip, `start` (all the condition reads) never does.
    row = tl.program_id(0).to(tl.int64)
    DY += row * stride
    DX += row * stride
    start = ((n_cols + BLOCK - 1) // BLOCK - 1) * BLOCK
    carry = 0.0
    while start >= 0:
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < n_cols
        dy = tl.load(DY + offsets, mask=mask, other=0.0)
        tl.store(DX + offsets, tl.cumsum(dy, axis=0, reverse=True) + carry, mask=mask)
        carry += tl.sum(dy, axis=0)
"#;

#[test]
fn a_while_whose_condition_reads_what_its_body_stores_runs_to_its_end() {
    // After the first trip each store repeats the last one's element with a new value: memory
    // changes though the log does not grow.
    let k = kernel(PROGRESS, "count_up", &[("BLOCK", 16)], &[("c_ptr", DType::I32)]);
    let mut r = StdRng::seed_from_u64(7);
    let (progs, n) = (5usize, 70usize);
    let c0: Vec<i32> = (0..progs).map(|_| r.gen_range(-30..14)).collect();
    let mut mem = Memory::new();
    let c = mem.add("c", HostTensor::from_i32(&[progs], c0.clone()));
    let y = mem.add("y", HostTensor::zeros(DType::F32, &[n]));
    Launch::new(&k, progs as u32).arg("c_ptr", c).arg("y_ptr", y).arg("n", n as i64).run(&mut mem).unwrap();
    let want: Vec<i32> = c0.iter().map(|&v| v.max(10)).collect();
    assert_eq!(mem.get(c).as_i32().unwrap(), &want[..]);
    let wy: Vec<f32> = (0..n).map(|e| want[e / 16] as f32).collect();
    assert_eq!(mem.get(y).as_f32().unwrap(), &wy[..]);
}

#[test]
fn a_while_whose_condition_waits_on_another_carried_value_ends_when_it_does() {
    let k = kernel(PROGRESS, "settle", &[("BLOCK", 32), ("LIMIT", 200)], &[("t_ptr", DType::I32)]);
    let mut r = StdRng::seed_from_u64(8);
    let (progs, n, limit) = (4usize, 27usize, 200.0f32);
    // Halves: the squares and their sums are exact in f32, in any order.
    let x: Vec<f32> = (0..progs * n).map(|_| r.gen_range(-3..=3) as f32 * 0.5).collect();
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[progs * n], x.clone()));
    let y = mem.add("y", HostTensor::zeros(DType::F32, &[progs * n]));
    let t = mem.add("t", HostTensor::zeros(DType::I32, &[progs]));
    Launch::new(&k, progs as u32).arg("x_ptr", xt).arg("y_ptr", y).arg("t_ptr", t).arg("n", n as i64).run(&mut mem).unwrap();
    let (mut wy, mut wt) = (vec![0.0f32; progs * n], vec![0i32; progs]);
    for p in 0..progs {
        let row = &x[p * n..(p + 1) * n];
        let s: f32 = row.iter().map(|v| v * v).sum();
        assert!(s > 0.0 && s * 3.0 < limit, "row {p}: {s} takes fewer than four trips");
        let mut acc = 0.0f32;
        while acc <= limit {
            acc += s;
            wt[p] += 1;
        }
        for (j, v) in row.iter().enumerate() {
            wy[p * n + j] = v * acc;
        }
    }
    assert_eq!(mem.get(t).as_i32().unwrap(), &wt[..]);
    assert_eq!(mem.get(y).as_f32().unwrap(), &wy[..]);
}

#[test]
fn a_while_whose_condition_no_trip_changes_is_an_error_at_once() {
    // It stored new values every trip until its 10^7-trip bound (minutes); now its first trip
    // shows that the condition can never change.
    let k = kernel(PROGRESS, "suffix_sum_stuck", &[("BLOCK", 32)], &[("DY", DType::F32), ("DX", DType::F32)]);
    let (rows, cols) = (3usize, 75usize);
    let mut mem = Memory::new();
    let dy = mem.add("dy", HostTensor::from_f32(&[rows, cols], (0..rows * cols).map(|i| (i % 7) as f32 - 3.0).collect()));
    let dx = mem.add("dx", HostTensor::zeros(DType::F32, &[rows, cols]));
    let t0 = std::time::Instant::now();
    let e = Launch::new(&k, rows as u32)
        .arg("DY", dy)
        .arg("DX", dx)
        .arg("stride", cols as i64)
        .arg("n_cols", cols as i64)
        .run(&mut mem)
        .unwrap_err()
        .to_string();
    assert!(e.contains("k.py:41:5") && e.contains("`suffix_sum_stuck`") && e.contains("op `while`"), "{e}");
    assert!(e.contains("program (0, 0, 0)") && e.contains("can never end") && e.contains("step that moves the loop on"), "{e}");
    assert!(t0.elapsed().as_secs() < 60, "{:?}", t0.elapsed());
}
