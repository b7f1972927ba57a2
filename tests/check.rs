//! `check_backward` as a library: verdicts, tolerances, blame, host steps in forward and backward,
//! the ground truth and the finite-difference self-check, and the errors a wrong description gets.
//! Kernels are Triton source written here, so each test shows the line it expects to be blamed.

use tilegrad::check::{
    check_backward, gradcheck, ground_truth, Backend, Backward, BlameSite, CheckError, CheckOptions, Dist, FindingKind, Forward, Inputs,
    KernelLaunch, Precision, Step,
};
use tilegrad::suite::GradCase;
use tilegrad_ir::triton::{convert, ConvertOptions};
use tilegrad_ir::{DType, Kernel};

/// `y = x * x * s` forward, a row-sum forward, and backwards for them. Line numbers matter: the
/// tests below expect blame at them.
const SRC: &str = r#"import triton
import triton.language as tl

@triton.jit
def square(x_ptr, y_ptr, n, s, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, x * x * s, mask=offs < n)

@triton.jit
def square_bwd(x_ptr, gy_ptr, gx_ptr, n, s, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    gy = tl.load(gy_ptr + offs, mask=offs < n)
    tl.store(gx_ptr + offs, 2.0 * x * gy * s, mask=offs < n)

@triton.jit
def square_bwd_unmasked_tail(x_ptr, gy_ptr, gx_ptr, n, s, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    gy = tl.load(gy_ptr + offs, mask=offs < n)
    tl.store(gx_ptr + offs, 2.0 * x * gy * s, mask=offs < n - 1)

@triton.jit
def row_sum(x_ptr, out_ptr, R, C, BLOCK_C: tl.constexpr):
    r = tl.program_id(0)
    acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        acc += tl.load(x_ptr + r * C + cols, mask=cols < C, other=0.0)
    tl.store(out_ptr + r, tl.sum(acc, axis=0))

@triton.jit
def col_sum(x_ptr, out_ptr, R, C, BLOCK_C: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for r in range(0, R):
        acc += tl.load(x_ptr + r * C + cols, mask=cols < C, other=0.0)
    tl.store(out_ptr + cols, acc, mask=cols < C)

@triton.jit
def col_sum_sloppy(x_ptr, out_ptr, R, C, BLOCK_C: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for r in range(0, R):
        acc += tl.load(x_ptr + r * C + cols, mask=cols < C)
    tl.store(out_ptr + cols, tl.sum(acc, axis=0) + acc * 0.0, mask=cols < C)

@triton.jit
def broadcast_rows(g_ptr, gx_ptr, R, C, BLOCK_C: tl.constexpr):
    r = tl.program_id(0)
    g = tl.load(g_ptr + r)
    for c0 in range(0, C, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        tl.store(gx_ptr + r * C + cols, g + tl.zeros((BLOCK_C,), dtype=tl.float32), mask=cols < C)

@triton.jit
def row_sum_tail(x_ptr, out_ptr, R, C, BLOCK_C: tl.constexpr):
    r = tl.program_id(0)
    acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        acc += tl.load(x_ptr + r * C + cols, mask=cols < C)
    tl.store(out_ptr + r, tl.sum(acc, axis=0))

@triton.jit
def halo_square(x_ptr, y_ptr, n, s, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * (BLOCK - 2) + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(y_ptr + offs, x * x * s, mask=offs < n)
"#;

const SQUARE_BWD_STORE_LINE: u32 = 15;
const SLOPPY_LOAD_LINE: u32 = 46;
const SLOPPY_STORE_LINE: u32 = 47;
const ROW_SUM_TAIL_LOAD_LINE: u32 = 63;

fn k(name: &str, consts: &[(&str, i64)]) -> Kernel {
    let mut o = ConvertOptions::with_constexprs(consts);
    o.scalar_dtypes = vec![("s".into(), DType::F32)];
    convert(SRC, "kernels.py", name, &o).unwrap_or_else(|e| panic!("{e}"))
}

fn launch(kernel: Kernel, grid: &str, args: &[(&str, &str)]) -> Step {
    let mut l = KernelLaunch::new(kernel, &[grid]).unwrap();
    for (p, v) in args {
        l = l.arg(p, v).unwrap();
    }
    Step::Launch(l)
}

fn square_case(bwd_kernel: &str, n: i64) -> (Forward, Backward, Inputs) {
    let fwd = Forward::new(&["x"], &["y"]).step(Step::alloc("y", &["n"], DType::F32).unwrap()).step(launch(
        k("square", &[("BLOCK", 64)]),
        "cdiv(n, 64)",
        &[("x_ptr", "x"), ("y_ptr", "y"), ("n", "n"), ("s", "s")],
    ));
    let bwd = Backward::new(&[("x", "grad_x")]).step(Step::alloc("grad_x", &["n"], DType::F32).unwrap()).step(launch(
        k(bwd_kernel, &[("BLOCK", 64)]),
        "cdiv(n, 64)",
        &[("x_ptr", "x"), ("gy_ptr", "grad_y"), ("gx_ptr", "grad_x"), ("n", "n"), ("s", "s")],
    ));
    let inputs = Inputs::new().constant_int("n", n).constant_float("s", 0.75).random("x", DType::F32, &[n as usize], Dist::default());
    (fwd, bwd, inputs)
}

#[test]
fn a_correct_backward_passes_with_small_errors() {
    let (f, b, i) = square_case("square_bwd", 1000);
    let r = check_backward(&f, &b, &i, &CheckOptions { trials: 3, ..CheckOptions::default() }).unwrap();
    assert!(r.passed, "{r}");
    assert_eq!(r.trials, 3);
    let g = &r.gradients[0];
    assert_eq!((g.name.as_str(), g.tensor.as_str(), g.shape.as_slice()), ("x", "grad_x", &[1000][..]));
    // The backward is replayed on the first trial; whichever trial's table is kept carries its
    // verdicts.
    let (f, ro) = (g.formula.as_ref().expect("formula"), g.rounding.as_ref().expect("rounding"));
    assert!(f.passed && f.error < 1e-15 && ro.passed && ro.units <= 1.0, "{f:?} {ro:?}");
    assert!(g.max_rel_err < 1e-6 && g.max_abs_err > 0.0, "{r}");
    assert_eq!(r.forward[0].over_tolerance, 0);
}

#[test]
fn an_unwritten_element_fails_with_never_written_blame() {
    let (f, b, i) = square_case("square_bwd_unmasked_tail", 1000);
    let r = check_backward(&f, &b, &i, &CheckOptions::default()).unwrap();
    assert!(!r.passed);
    let g = &r.gradients[0];
    assert_eq!((g.nan, g.over_tolerance), (1, 1), "{r}");
    let w = g.worst.as_ref().unwrap();
    assert_eq!(w.index, vec![999]);
    assert!(w.got.is_nan());
    let blame = w.blame.as_ref().unwrap();
    assert!(
        matches!(&blame.sites[..], [BlameSite::NeverWritten { tensor, index, init, .. }] if tensor == "grad_x" && index == &vec![999] && init == "NaN"),
        "{r}"
    );
    assert!(r.to_string().contains("never written"), "{r}");
    let origin = r.findings[0].origin.as_deref().unwrap_or_default();
    assert!(origin.contains("`grad_x`[999] was never written") && origin.contains("allocated empty"), "{origin}");
}

#[test]
fn an_element_off_by_1e_minus_3_fails_and_is_blamed_on_its_store() {
    // The backward, then the gradient scaled on the host by 1 + 1e-3: every element is off by 1e-3.
    let (f, mut b, i) = square_case("square_bwd", 777);
    b.steps.push(Step::Scale { src: "grad_x".into(), factor: "1.001".parse_expr(), dst: "grad_x_scaled".into() });
    b.gradients = vec![("x".into(), "grad_x_scaled".into())];
    let r = GradCase::new("scaled", f.clone(), b, i.clone()).assert_fails();
    let g = &r.gradients[0];
    // Elements whose gradient is tiny next to the largest are within the absolute tolerance.
    assert!(g.over_tolerance > 500, "{r}");
    assert!((g.max_rel_err - 1e-3).abs() < 1e-5, "{r}");
    let blame = g.worst.as_ref().unwrap().blame.as_ref().unwrap();
    assert!(blame.via[0].contains("grad_x_scaled"), "{r}");
    match &blame.sites[..] {
        [BlameSite::Store { kernel, op, loc, programs, .. }] => {
            assert_eq!((kernel.as_str(), op.as_str()), ("square_bwd", "store"));
            assert!(loc.starts_with(&format!("kernels.py:{SQUARE_BWD_STORE_LINE}:")), "{loc}");
            let e = g.worst.as_ref().unwrap().index[0];
            assert_eq!(programs, &vec![[(e / 64) as u32, 0, 0]]);
        }
        s => panic!("{s:?}"),
    }
    // A scale within f32 rounding passes.
    let (_, mut b, _) = square_case("square_bwd", 777);
    b.steps.push(Step::Scale { src: "grad_x".into(), factor: "1.0000002".parse_expr(), dst: "g2".into() });
    b.gradients = vec![("x".into(), "g2".into())];
    GradCase::new("rounding", f, b, i).assert_passes();
}

trait ParseExpr {
    fn parse_expr(&self) -> tilegrad::check::Expr;
}
impl ParseExpr for str {
    fn parse_expr(&self) -> tilegrad::check::Expr {
        tilegrad::check::Expr::parse(self).unwrap()
    }
}

/// out[r] = sum_c x[r, c]; backward grad_x[r, c] = grad_out[r] (one program per row).
fn row_sum_case(rows: i64, cols: i64) -> (Forward, Backward, Inputs) {
    let args = [("x_ptr", "x"), ("out_ptr", "out"), ("R", "R"), ("C", "C")];
    let fwd = Forward::new(&["x"], &["out"]).step(Step::alloc("out", &["R"], DType::F32).unwrap()).step(launch(
        k("row_sum", &[("BLOCK_C", 128)]),
        "R",
        &args,
    ));
    let bwd = Backward::new(&[("x", "grad_x")]).step(Step::alloc("grad_x", &["R", "C"], DType::F32).unwrap()).step(launch(
        k("broadcast_rows", &[("BLOCK_C", 128)]),
        "R",
        &[("g_ptr", "grad_out"), ("gx_ptr", "grad_x"), ("R", "R"), ("C", "C")],
    ));
    let i = Inputs::new().constant_int("R", rows).constant_int("C", cols).random(
        "x",
        DType::F32,
        &[rows as usize, cols as usize],
        Dist::default(),
    );
    (fwd, bwd, i)
}

#[test]
fn long_f32_reductions_pass_in_forward_and_backward() {
    // The forward sums 4099 f32 terms per row; the forward check compares it with f64.
    let (f, b, i) = row_sum_case(37, 4099);
    let r = check_backward(&f, &b, &i, &CheckOptions::default()).unwrap();
    assert!(r.passed, "{r}");
    assert!(r.forward[0].max_abs_err > 0.0, "f32 rounding is visible: {r}");
    // Swapped: out[r, c] = x[r] forward, whose backward sums 4099 f32 terms per row.
    let fwd = Forward::new(&["x"], &["out"]).step(Step::alloc("out", &["R", "C"], DType::F32).unwrap()).step(launch(
        k("broadcast_rows", &[("BLOCK_C", 128)]),
        "R",
        &[("g_ptr", "x"), ("gx_ptr", "out"), ("R", "R"), ("C", "C")],
    ));
    let bwd = Backward::new(&[("x", "grad_x")]).step(Step::alloc("grad_x", &["R"], DType::F32).unwrap()).step(launch(
        k("row_sum", &[("BLOCK_C", 128)]),
        "R",
        &[("x_ptr", "grad_out"), ("out_ptr", "grad_x"), ("R", "R"), ("C", "C")],
    ));
    let i = Inputs::new().constant_int("R", 37).constant_int("C", 4099).random("x", DType::F32, &[37], Dist::default());
    let r = check_backward(&fwd, &bwd, &i, &CheckOptions { trials: 4, ..CheckOptions::default() }).unwrap();
    assert!(r.passed, "{r}");
    assert!(r.gradients[0].max_abs_err > 0.0, "f32 rounding is visible: {r}");
}

#[test]
fn masked_lanes_read_as_zero_and_are_noted() {
    // col_sum_sloppy loads without `other` and reduces over the tile: wrong whatever its
    // masked-off lanes hold. They read 0, as on Triton's GPU backends (no NaN), and a note names
    // the load its results depend on.
    let bwd_as_fwd = |kname: &str| {
        Backward::new(&[("x", "grad_x")]).step(Step::alloc("grad_x", &["C"], DType::F32).unwrap()).step(launch(
            k(kname, &[("BLOCK_C", 32)]),
            "cdiv(C, 32)",
            &[("x_ptr", "grad_out"), ("out_ptr", "grad_x"), ("R", "1"), ("C", "C")],
        ))
    };
    // Forward: identity copy of a [C] vector through col_sum with R = 1.
    let fwd = Forward::new(&["x"], &["out"]).step(Step::alloc("out", &["C"], DType::F32).unwrap()).step(launch(
        k("col_sum", &[("BLOCK_C", 32)]),
        "cdiv(C, 32)",
        &[("x_ptr", "x"), ("out_ptr", "out"), ("R", "1"), ("C", "C")],
    ));
    let i = Inputs::new().constant_int("C", 45).random("x", DType::F32, &[45], Dist::default());
    let ok = check_backward(&fwd, &bwd_as_fwd("col_sum"), &i, &CheckOptions::default()).unwrap();
    assert!(ok.passed, "{ok}");
    let bad = check_backward(&fwd, &bwd_as_fwd("col_sum_sloppy"), &i, &CheckOptions::default()).unwrap();
    assert!(!bad.passed, "{bad}");
    let g = &bad.gradients[0];
    assert_eq!(g.nan, 0, "masked-off lanes read 0: {bad}");
    match &g.worst.as_ref().unwrap().blame.as_ref().unwrap().sites[..] {
        [BlameSite::Store { loc, .. }] => assert!(loc.starts_with(&format!("kernels.py:{SLOPPY_STORE_LINE}:")), "{loc}"),
        s => panic!("{s:?}"),
    }
    match &bad.notes[..] {
        [n] => {
            assert_eq!((n.kind, n.pass, n.step), (FindingKind::MaskedLanes, "backward", Some(1)), "{bad}");
            assert_eq!(n.locations.iter().map(|l| l.line).collect::<Vec<_>>(), [SLOPPY_LOAD_LINE], "{bad}");
            // Only the ragged last tile (columns 32..45) reads masked-off lanes.
            assert!(n.element.as_ref().is_some_and(|e| e[0] >= 32), "{bad}");
        }
        n => panic!("one note expected: {n:?}"),
    }
    assert!(ok.notes.is_empty(), "`other=0.0` relies on nothing: {ok}");
}

#[test]
fn a_tail_loaded_without_other_and_summed_passes_with_a_note() {
    // row_sum_tail sums each row's ragged last tile loaded without `other`: right on Triton's GPU
    // backends (the lanes read 0). The check passes and notes the load; strict fails it.
    let (rows, cols) = (37usize, 300usize);
    let fwd = Forward::new(&["x"], &["y"]).step(Step::alloc("y", &["R"], DType::F32).unwrap()).step(launch(
        k("row_sum_tail", &[("BLOCK_C", 128)]),
        "R",
        &[("x_ptr", "x"), ("out_ptr", "y"), ("R", "R"), ("C", "C")],
    ));
    let bwd = Backward::new(&[("x", "grad_x")]).step(Step::alloc("grad_x", &["R * C"], DType::F32).unwrap()).step(launch(
        k("broadcast_rows", &[("BLOCK_C", 128)]),
        "R",
        &[("g_ptr", "grad_y"), ("gx_ptr", "grad_x"), ("R", "R"), ("C", "C")],
    ));
    let i = Inputs::new().constant_int("R", rows as i64).constant_int("C", cols as i64).random(
        "x",
        DType::F32,
        &[rows * cols],
        Dist::Normal { mean: 0.5, std: 2.0 },
    );
    let r = check_backward(&fwd, &bwd, &i, &CheckOptions::default()).unwrap();
    assert!(r.passed, "{r}");
    match &r.notes[..] {
        [n] => {
            assert_eq!((n.kind, n.pass), (FindingKind::MaskedLanes, "forward"), "{r}");
            assert_eq!(n.locations.iter().map(|l| l.line).collect::<Vec<_>>(), [ROW_SUM_TAIL_LOAD_LINE], "{r}");
            assert!(n.got.is_some_and(f64::is_nan) && n.expected.is_some_and(f64::is_finite), "{r}");
        }
        n => panic!("one note expected: {n:?}"),
    }
    assert!(r.to_string().contains("reads masked-off lanes"), "{r}");
    let strict = check_backward(&fwd, &bwd, &i, &CheckOptions { strict: true, ..CheckOptions::default() }).unwrap();
    assert!(!strict.passed && strict.findings.iter().any(|f| f.kind == FindingKind::MaskedLanes), "{strict}");
}

#[test]
fn overlapping_tiles_storing_the_same_values_are_noted_and_differentiated_once() {
    // halo_square's tiles of 16 start every 14 elements: neighbours store the same two elements
    // with the same bits. Not a race; the ground truth sends each element's cotangent back once
    // (through the store that lands last), so the plain backward passes.
    let n = 100;
    let (_, bwd, inputs) = square_case("square_bwd", n);
    let fwd = Forward::new(&["x"], &["y"]).step(Step::alloc("y", &["n"], DType::F32).unwrap()).step(launch(
        k("halo_square", &[("BLOCK", 16)]),
        "cdiv(n - 2, 14)",
        &[("x_ptr", "x"), ("y_ptr", "y"), ("n", "n"), ("s", "s")],
    ));
    let r = check_backward(&fwd, &bwd, &inputs, &CheckOptions::default()).unwrap();
    assert!(r.passed, "{r}");
    match &r.notes[..] {
        [n] => assert_eq!((n.kind, n.pass, n.count, n.element.clone()), (FindingKind::SameValueRace, "forward", Some(12), Some(vec![14]))),
        n => panic!("one note expected: {n:?}"),
    }
    // The ground truth against a plain loop: d(s x^2)/dx = 2 s x, once per element.
    let gt = ground_truth(&fwd, &inputs, &CheckOptions::default()).unwrap();
    let (x, c, g) = (gt.inputs[0].1.to_f64_vec(), gt.cotangents[0].1.to_f64_vec(), gt.gradients[0].1.to_f64_vec());
    for e in 0..n as usize {
        approx::assert_relative_eq!(g[e], 2.0 * 0.75 * x[e] * c[e], max_relative = 1e-12);
    }
}

#[test]
fn host_steps_in_the_forward_are_differentiated() {
    // y = reshape(2.5 * x) summed over axis 1 of a [R, C] view: grad_x[i] = 2.5 * g[i / C].
    let fwd = Forward::new(&["x"], &["y"])
        .step(Step::Scale { src: "x".into(), factor: "2.5".parse_expr(), dst: "x2".into() })
        .step(Step::Reshape { src: "x2".into(), shape: vec!["R".parse_expr(), "C".parse_expr()], dst: "x3".into() })
        .step(Step::Sum { src: "x3".into(), axis: -1, dst: "y".into() });
    let i = Inputs::new().constant_int("R", 7).constant_int("C", 5).random("x", DType::F32, &[35], Dist::Uniform { lo: -2.0, hi: 2.0 });
    let gt = ground_truth(&fwd, &i, &CheckOptions::default()).unwrap();
    let g = gt.cotangents[0].1.to_f64_vec();
    let gx = gt.gradients[0].1.to_f64_vec();
    for e in 0..35 {
        assert_eq!(gx[e], 2.5 * g[e / 5], "element {e}");
    }
    assert!(gradcheck(&fwd, &i, &CheckOptions::default(), "host").unwrap().passed);
    // The same in native precision.
    let n = ground_truth(&fwd, &i, &CheckOptions { precision: Precision::Native, ..CheckOptions::default() }).unwrap();
    assert_eq!(n.gradients[0].1.to_f64_vec(), gx);
}

#[test]
fn native_precision_ground_truth_agrees() {
    let (f, b, i) = square_case("square_bwd", 300);
    let r = check_backward(&f, &b, &i, &CheckOptions { precision: Precision::Native, ..CheckOptions::default() }).unwrap();
    assert!(r.passed, "{r}");
    assert_eq!(r.precision, "native");
}

#[test]
fn a_too_small_grid_leaves_zeros_and_a_later_launch_overwrites_an_earlier_one() {
    let (f, _, i) = square_case("square_bwd", 200);
    let b = Backward::new(&[("x", "grad_x")]).step(Step::zeros("grad_x", &["n"], DType::F32).unwrap()).step(launch(
        k("square_bwd", &[("BLOCK", 64)]),
        "cdiv(n, 64)",
        &[("x_ptr", "x"), ("gy_ptr", "grad_y"), ("gx_ptr", "grad_x"), ("n", "n"), ("s", "s")],
    ));
    // A grid of one program covers only 64 elements; the rest keep their zeros.
    let mut short = b.clone();
    if let Step::Launch(l) = &mut short.steps[1] {
        l.grid = vec!["1".parse_expr()];
    }
    let r = check_backward(&f, &short, &i, &CheckOptions::default()).unwrap();
    assert!(!r.passed);
    let g = &r.gradients[0];
    assert_eq!(g.over_tolerance, 200 - 64, "{r}");
    assert!(
        matches!(&g.worst.as_ref().unwrap().blame.as_ref().unwrap().sites[..], [BlameSite::NeverWritten { init, .. }] if init == "zero")
    );
    // Two launches writing the same elements of grad_x one after the other: not a race (launches
    // are ordered); the second's values are the result.
    let twice = b.clone().step(launch(
        k("square_bwd", &[("BLOCK", 64)]),
        "cdiv(n, 64)",
        &[("x_ptr", "x"), ("gy_ptr", "grad_y"), ("gx_ptr", "grad_x"), ("n", "n"), ("s", "s")],
    ));
    let r = check_backward(&f, &twice, &i, &CheckOptions::default()).unwrap();
    assert!(r.passed, "{r}");
}

#[test]
fn descriptions_that_do_not_fit_are_errors() {
    let (f, b, i) = square_case("square_bwd", 100);
    let e = |r: Result<tilegrad::Report, CheckError>| r.unwrap_err().to_string();
    // A gradient for an input that is not differentiable.
    let mut b2 = b.clone();
    b2.gradients.push(("n".into(), "grad_x".into()));
    assert!(e(check_backward(&f, &b2, &i, &CheckOptions::default())).contains("not a differentiable input"));
    // An unknown tensor in a backward launch names the step and the tensor.
    let b3 = Backward::new(&[("x", "grad_x")]).step(Step::alloc("grad_x", &["n"], DType::F32).unwrap()).step(launch(
        k("square_bwd", &[("BLOCK", 64)]),
        "cdiv(n, 64)",
        &[("x_ptr", "x"), ("gy_ptr", "grad_q"), ("gx_ptr", "grad_x"), ("n", "n"), ("s", "s")],
    ));
    let m = e(check_backward(&f, &b3, &i, &CheckOptions::default()));
    assert!(m.contains("backward step 1") && m.contains("`grad_q`"), "{m}");
    // A missing argument.
    let b4 = Backward::new(&[("x", "grad_x")]).step(Step::alloc("grad_x", &["n"], DType::F32).unwrap()).step(launch(
        k("square_bwd", &[("BLOCK", 64)]),
        "cdiv(n, 64)",
        &[("x_ptr", "x"), ("gy_ptr", "grad_y"), ("gx_ptr", "grad_x"), ("n", "n")],
    ));
    assert!(e(check_backward(&f, &b4, &i, &CheckOptions::default())).contains("`s`"));
    // A forward that reads out of bounds is a defect of the forward: a failed check naming the
    // forward step and line, with a `forward_out_of_bounds` finding.
    let bad_fwd = Forward::new(&["x"], &["y"]).step(Step::alloc("y", &["n"], DType::F32).unwrap()).step(launch(
        k("square", &[("BLOCK", 64)]),
        "cdiv(n, 64)",
        &[("x_ptr", "x"), ("y_ptr", "y"), ("n", "n + 10"), ("s", "s")],
    ));
    let r = check_backward(&bad_fwd, &b, &i, &CheckOptions::default()).unwrap();
    let m = r.to_string();
    assert!(!r.passed && m.contains("forward failed at step 1") && m.contains("kernels.py:7:") && m.contains("out-of-bounds"), "{m}");
    match &r.findings[..] {
        [f] => {
            assert_eq!((f.kind, f.pass, f.step, f.element.clone()), (FindingKind::ForwardOutOfBounds, "forward", Some(1), Some(vec![100])))
        }
        f => panic!("{f:?}"),
    }
    // Without a usable GPU, `--backend gpu` says why; `auto` runs on the CPU and says why.
    if let Err(why) = tilegrad_gpu::usable() {
        let m = e(check_backward(&f, &b, &i, &CheckOptions { backend: Backend::Gpu, ..CheckOptions::default() }));
        assert!(m.contains("--backend gpu: no usable GPU") && m.contains(&why), "{m}");
        let r = check_backward(&f, &b, &i, &CheckOptions { backend: Backend::Auto, ..CheckOptions::default() }).unwrap();
        assert!(r.passed && r.backend.starts_with("cpu (--backend auto: ") && r.backend.contains(&why), "{r}");
    }
    // A gradient of the wrong shape is a verdict.
    let b5 = Backward::new(&[("x", "g")]).step(Step::alloc("g", &["n + 1"], DType::F32).unwrap());
    let r = check_backward(&f, &b5, &i, &CheckOptions::default()).unwrap();
    assert!(!r.passed && r.failure.as_ref().unwrap().message.contains("shape"), "{r}");
}

#[test]
fn reports_serialise_to_json() {
    let (f, b, i) = square_case("square_bwd_unmasked_tail", 130);
    let r = check_backward(&f, &b, &i, &CheckOptions::default()).unwrap();
    let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert_eq!(v["passed"], false);
    assert_eq!(v["gradients"][0]["nan"], 1);
    assert_eq!(v["gradients"][0]["worst"]["index"][0], 129);
    assert_eq!(v["gradients"][0]["worst"]["blame"]["sites"][0]["kind"], "never_written");
}

#[test]
fn a_forward_that_leaves_an_output_unwritten_is_a_usage_error_and_saved_tensors_are_checked() {
    // The forward covers n - 5 elements of its output.
    let (_, b, i) = square_case("square_bwd", 300);
    let short = Forward::new(&["x"], &["y"]).step(Step::alloc("y", &["n"], DType::F32).unwrap()).step(launch(
        k("square", &[("BLOCK", 64)]),
        "cdiv(n, 64)",
        &[("x_ptr", "x"), ("y_ptr", "y"), ("n", "n - 5"), ("s", "s")],
    ));
    let m = check_backward(&short, &b, &i, &CheckOptions::default()).unwrap_err().to_string();
    assert!(m.contains("forward step 0") && m.contains("element [295] of `y` is never written"), "{m}");
    // A saved tensor is compared with the ground truth's forward but gets no cotangent: the
    // backward need not account for it.
    let (f, b, i) = square_case("square_bwd", 300);
    let f = f.step(Step::Scale { src: "y".into(), factor: "2".parse_expr(), dst: "y2".into() }).saved(&["y2"]);
    let r = check_backward(&f, &b, &i, &CheckOptions::default()).unwrap();
    assert!(r.passed, "{r}");
    assert_eq!(r.forward.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), vec!["y", "y2"]);
    // As an output it would get a cotangent, which this backward ignores.
    let mut f2 = f.clone();
    f2.saved.clear();
    f2.outputs.push("y2".into());
    assert!(!check_backward(&f2, &b, &i, &CheckOptions::default()).unwrap().passed);
}
