//! Conditional expressions on runtime values evaluate one side, as Python and Triton do: a
//! chunked recurrence that reads the previous row only where `i > 0` converts to an IR `if` (no
//! `where` evaluating both sides), runs on the reference interpreter without an out-of-bounds
//! finding and matches a plain f64 loop; the same kernel with a condition that lets row `-1` be
//! read is an out-of-bounds finding at the load's line.

use tilegrad_ir::triton::{convert, ConvertOptions};
use tilegrad_ir::{Kernel, Op};
use tilegrad_reference::{ExecError, HostTensor, Launch, Memory};

/// `y[i, c] = x[i, c] + decay * y[i - 1, c]` within chunks of `BT` rows (the state restarts at
/// each chunk), one program per column, the previous row read back from `y`.
const RECURRENCE: &str = r#"
import triton
import triton.language as tl

@triton.jit
def chunk_recurrence(x_ptr, y_ptr, T, decay, H: tl.constexpr, BT: tl.constexpr):
    c = tl.program_id(0)
    for i in range(T):
        prev = tl.load(y_ptr + (i - 1) * H + c) if i % BT > 0 else 0.0
        y = tl.load(x_ptr + i * H + c) + decay * prev
        tl.store(y_ptr + i * H + c, y)
"#;

/// The line of the load of the previous row in [`RECURRENCE`].
const PREV_LINE: u32 = 9;

fn kernel(src: &str) -> Kernel {
    let mut opts = ConvertOptions::with_constexprs(&[("H", 3), ("BT", 4)]);
    opts.scalar_dtypes = vec![("decay".into(), tilegrad_ir::DType::F32)];
    convert(src, "rec.py", "chunk_recurrence", &opts).unwrap_or_else(|e| panic!("{e}"))
}

fn count(k: &Kernel, f: impl Fn(&Op) -> bool) -> usize {
    let mut n = 0;
    k.walk(&mut |_, d| n += f(&d.op) as usize);
    n
}

/// Runs the kernel over `t` rows of 3 columns; the memory and the result.
fn run(k: &Kernel, x: &[f32], t: usize) -> (Result<(), ExecError>, Vec<f32>) {
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f32(&[t, 3], x.to_vec()));
    let yt = mem.add("y", HostTensor::from_f32(&[t, 3], vec![f32::NAN; t * 3]));
    let r = Launch::new(k, 3).arg("x_ptr", xt).arg("y_ptr", yt).arg("T", t as i64).arg("decay", 0.5f64).run(&mut mem).map(|_| ());
    (r, mem.get(yt).as_f32().unwrap_or_default().to_vec())
}

#[test]
fn a_guarded_load_of_the_previous_row_runs_only_where_python_evaluates_it() {
    let k = kernel(RECURRENCE);
    assert!(count(&k, |o| matches!(o, Op::If { .. })) >= 1, "{k}");
    assert_eq!(count(&k, |o| matches!(o, Op::Where)), 0, "both sides evaluated:\n{k}");
    let t = 10;
    let x: Vec<f32> = (0..t * 3).map(|j| ((j * 7 % 11) as f32 - 5.0) / 4.0).collect();
    let (r, y) = run(&k, &x, t);
    r.unwrap_or_else(|e| panic!("{e}"));
    // Independent reference: the recurrence in f64.
    let mut want = vec![0.0f64; t * 3];
    for c in 0..3 {
        for i in 0..t {
            let prev = if i % 4 > 0 { want[(i - 1) * 3 + c] } else { 0.0 };
            want[i * 3 + c] = x[i * 3 + c] as f64 + 0.5 * prev;
        }
    }
    for (j, (&g, &w)) in y.iter().zip(&want).enumerate() {
        assert!((g as f64 - w).abs() <= 1e-6 * w.abs().max(1.0), "y[{j}] = {g}, expected {w}");
    }
}

#[test]
fn a_condition_that_lets_row_minus_one_be_read_is_out_of_bounds() {
    let broken = RECURRENCE.replace("if i % BT > 0 else", "if i % BT >= 0 else");
    let k = kernel(&broken);
    let (r, _) = run(&k, &[1.0; 12], 4);
    match r {
        Err(ExecError::OutOfBounds { site, offset, .. }) => {
            assert_eq!(site.loc.line, PREV_LINE, "at the load of the previous row");
            assert!(offset < 0, "row -1 is before the tensor: offset {offset}");
        }
        other => panic!("expected an out-of-bounds read, got {other:?}"),
    }
}

#[test]
fn sides_of_different_types_and_tile_conditions_are_refused_as_triton_refuses_them() {
    let err = |src: &str| match convert(src, "rec.py", "chunk_recurrence", &ConvertOptions::with_constexprs(&[("H", 3), ("BT", 4)])) {
        Err(tilegrad_ir::IrError::Parse { error, .. }) => (error.line, error.col, error.message),
        other => panic!("expected an error, got {other:?}"),
    };
    // An int literal is i32 on its own: Triton asserts both sides have one type.
    let (line, col, m) = err(&RECURRENCE.replace("else 0.0", "else 0"));
    assert_eq!((line, col), (PREV_LINE, 16), "{m}");
    assert!(m.contains("different types") && m.contains("i32"), "{m}");
    // A tile condition: Triton's `scf.if` takes a scalar.
    let tile = RECURRENCE.replace(
        "prev = tl.load(y_ptr + (i - 1) * H + c) if i % BT > 0 else 0.0",
        "prev = tl.load(y_ptr + (i - 1) * H + c) if tl.arange(0, 4) > 0 else 0.0",
    );
    let (line, _, m) = err(&tile);
    assert_eq!(line, PREV_LINE);
    assert!(m.contains("tl.where"), "{m}");
}

/// In the Python package's f64-promoted ground truth every pointer is f64, so a load on one side
/// is f64 where the literal `0.0` on the other is f32 by Triton's rules: the literal is promoted
/// with it (the run it stands for has both sides f32), not refused as two types.
#[test]
fn a_literal_side_is_promoted_with_a_promoted_load() {
    let mut opts = ConvertOptions::with_constexprs(&[("H", 3), ("BT", 4)]);
    opts.scalar_dtypes = vec![("decay".into(), tilegrad_ir::DType::F64)];
    opts.pointer_dtypes = vec![("x_ptr".into(), tilegrad_ir::DType::F64), ("y_ptr".into(), tilegrad_ir::DType::F64)];
    let e = convert(RECURRENCE, "rec.py", "chunk_recurrence", &opts).expect_err("f64 pointers in a run that is not promoted");
    assert!(e.to_string().contains("different types, f64 and f32"), "{e}");
    opts.promoted = true;
    let k = convert(RECURRENCE, "rec.py", "chunk_recurrence", &opts).unwrap_or_else(|e| panic!("{e}"));
    let t = 9;
    let x: Vec<f64> = (0..t * 3).map(|j| ((j * 5 % 13) as f64 - 6.0) / 3.0).collect();
    let mut mem = Memory::new();
    let xt = mem.add("x", HostTensor::from_f64(&[t, 3], x.clone()));
    let yt = mem.add("y", HostTensor::from_f64(&[t, 3], vec![f64::NAN; t * 3]));
    Launch::new(&k, 3).arg("x_ptr", xt).arg("y_ptr", yt).arg("T", t as i64).arg("decay", 0.5f64).run(&mut mem).unwrap();
    let y = mem.get(yt).to_f64_vec();
    for i in 0..t {
        for c in 0..3 {
            let prev = if i % 4 > 0 { y[(i - 1) * 3 + c] } else { 0.0 };
            assert_eq!(y[i * 3 + c], x[i * 3 + c] + 0.5 * prev, "row {i}, column {c}");
        }
    }
}
