//! Host steps that use tensor values (`compute`, `cast`, `mean`, `logsumexp`, `max`,
//! `accumulate`): the ground truth's VJP of each against central finite differences of the
//! whole forward ([`gradcheck`]), including operands that a later step overwrites; a backward
//! written with them checked against the ground truth; and spec errors naming the key.

use std::path::PathBuf;
use tilegrad::check::{check_backward, gradcheck, Backward, BlameSite, CheckOptions, Dist, Forward, Inputs, KernelLaunch, Reduction, Step};
use tilegrad::spec::load;
use tilegrad_ir::triton::{convert, ConvertOptions};
use tilegrad_ir::DType;

fn reduce(op: Reduction, src: &str, axis: i64, dst: &str) -> Step {
    Step::Reduce { op, src: src.into(), axis, dst: dst.into() }
}

fn compute(dst: &str, expr: &str) -> Step {
    Step::compute(dst, expr).unwrap()
}

/// AD against central differences along a few random directions.
fn assert_gradcheck(name: &str, fwd: &Forward, inputs: &Inputs) {
    let opts = CheckOptions { trials: 3, ..CheckOptions::default() };
    let r = gradcheck(fwd, inputs, &opts, name).unwrap();
    assert!(r.passed && r.trials.len() == 3, "{r}");
    assert!(r.trials.iter().all(|t| t.ad.abs() > 1e-3), "{name}: a vacuous direction\n{r}");
}

const R: usize = 7;
const C: usize = 13;

/// `x` [R, C], `row` [C], `col` [R, 1] and a 0-d `s` (f32), `lab` [R, 1] (i64, with -100s).
fn inputs() -> Inputs {
    let u = Dist::Uniform { lo: -2.0, hi: 2.0 };
    Inputs::new()
        .constant_int("K", 3)
        .random("x", DType::F32, &[R, C], u)
        .random("row", DType::F32, &[C], u)
        .random("col", DType::F32, &[R, 1], u)
        .random("s", DType::F32, &[], u)
        .random("lab", DType::I64, &[R, 1], Dist::RandInt { lo: -101, hi: -98 })
}

#[test]
fn compute_with_broadcasting_and_every_function() {
    let e = "where(lab == -100, 0.0, x * s - row / (1.5 + abs(col)) + max(x, row) * min(col, s) + exp(-x * x) \
             + log(2 + tanh(x + col)) - sqrt(1 + row * row) * sigmoid(x - K) + (x > col) * x)";
    let fwd = Forward::new(&["x", "row", "col", "s"], &["y"]).step(compute("y", e));
    assert_gradcheck("compute", &fwd, &inputs());
    // A 0-d result: the cotangent of a scalar multiplied into a tensor and back.
    let fwd = Forward::new(&["x", "s"], &["z"]).step(compute("p", "x * s")).step(reduce(Reduction::Mean, "p", 0, "q")).step(Step::Sum {
        src: "q".into(),
        axis: 0,
        dst: "z".into(),
    });
    assert_gradcheck("0-d", &fwd, &inputs());
}

#[test]
fn cast_and_reductions() {
    let fwd = Forward::new(&["x"], &["a", "b", "c", "d"])
        .step(Step::Cast { src: "x".into(), dtype: DType::F16, dst: "h".into() })
        .step(compute("a", "h * h"))
        .step(reduce(Reduction::Mean, "x", 0, "b"))
        .step(reduce(Reduction::LogSumExp, "x", -1, "c"))
        .step(reduce(Reduction::Max, "h", 1, "d"));
    assert_gradcheck("reductions", &fwd, &inputs());
    // An integer cast carries no gradient.
    let fwd =
        Forward::new(&["x"], &["y"]).step(Step::Cast { src: "x".into(), dtype: DType::I32, dst: "i".into() }).step(compute("y", "x * i"));
    let g = tilegrad::check::ground_truth(&fwd, &inputs(), &CheckOptions::default()).unwrap();
    let (gx, x) = (g.gradients[0].1.to_f64_vec(), g.inputs.iter().find(|(n, _)| n == "x").unwrap().1.to_f64_vec());
    let cot = g.cotangents[0].1.to_f64_vec();
    for k in 0..gx.len() {
        assert_eq!(gx[k], cot[k] * (x[k] as i32) as f64, "element {k}");
    }
}

#[test]
fn accumulate_passes_the_cotangent_through_and_reduces_it_over_broadcast_axes() {
    let fwd = Forward::new(&["x", "row", "col", "s"], &["y"])
        .step(compute("y", "x * x"))
        .step(Step::Accumulate { src: "row".into(), dst: "y".into() })
        .step(compute("cs", "col * s"))
        .step(Step::Accumulate { src: "cs".into(), dst: "y".into() })
        .step(Step::Accumulate { src: "s".into(), dst: "y".into() });
    assert_gradcheck("accumulate", &fwd, &inputs());
    // Into an input: the input's gradient is the cotangent of its final contents.
    let fwd =
        Forward::new(&["x", "row"], &["x2"]).step(Step::Accumulate { src: "row".into(), dst: "x".into() }).step(compute("x2", "x * x"));
    assert_gradcheck("accumulate into an input", &fwd, &inputs());
}

/// The VJP reads the operands as they were when the step ran, not as later steps left them.
#[test]
fn operands_overwritten_later_are_read_as_they_were() {
    // `+=` overwrites `x` after the product, the logsumexp and the max read it.
    let fwd = Forward::new(&["x", "row"], &["p", "l", "m", "x"])
        .step(compute("p", "x * row"))
        .step(reduce(Reduction::LogSumExp, "x", 1, "l"))
        .step(reduce(Reduction::Max, "x", 0, "m"))
        .step(compute("t", "exp(x)"))
        .step(Step::Accumulate { src: "t".into(), dst: "x".into() });
    assert_gradcheck("overwritten by +=", &fwd, &inputs());
    // A kernel squares `x` in place after the product read it.
    let src = r#"
import triton
import triton.language as tl

@triton.jit
def square_inplace(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(x_ptr + offs, x * x, mask=offs < n)
"#;
    let k = convert(src, "square.py", "square_inplace", &ConvertOptions::with_constexprs(&[("BLOCK", 64)])).unwrap();
    let launch = KernelLaunch::new(k, &["cdiv(n, 64)"]).unwrap().arg("x_ptr", "v").unwrap().arg("n", "n").unwrap();
    let fwd = Forward::new(&["v", "w"], &["p", "v"]).step(compute("p", "v * w + sigmoid(v)")).step(Step::Launch(launch));
    let u = Dist::Uniform { lo: -2.0, hi: 2.0 };
    let ins = Inputs::new().constant_int("n", 100).random("v", DType::F32, &[100], u).random("w", DType::F32, &[100], u);
    assert_gradcheck("overwritten by a launch", &fwd, &ins);
}

#[test]
fn a_backward_with_host_steps_passes_and_a_wrong_one_fails() {
    // loss = mean((x * s - row)^2) over rows, then summed: a 0-d loss.
    let fwd = Forward::new(&["x", "s"], &["loss"])
        .step(compute("d", "x * s - row"))
        .step(compute("sq", "d * d"))
        .step(reduce(Reduction::Mean, "sq", 0, "per_col"))
        .step(Step::Sum { src: "per_col".into(), axis: 0, dst: "loss".into() });
    let bwd = |grad_x: &str| {
        Backward::new(&[("x", "grad_x"), ("s", "grad_s")])
            .step(compute("grad_x", grad_x))
            .step(compute("gxs", "2 * d * x / 7 * grad_loss"))
            .step(Step::Sum { src: "gxs".into(), axis: 0, dst: "gs1".into() })
            .step(Step::Sum { src: "gs1".into(), axis: 0, dst: "grad_s".into() })
    };
    let ins = inputs();
    let r = check_backward(&fwd, &bwd("2 * d * s / 7 * grad_loss"), &ins, &CheckOptions::default()).unwrap();
    assert!(r.passed, "{r}");
    // Forgetting the 0-d cotangent, or the mean's 1/7, is caught and blamed through the host step.
    for wrong in ["2 * d * s / 7", "2 * d * s * grad_loss"] {
        let r = check_backward(&fwd, &bwd(wrong), &ins, &CheckOptions::default()).unwrap();
        assert!(!r.passed, "{wrong}: {r}");
        let g = r.gradients.iter().find(|g| g.name == "x").unwrap();
        assert!(!g.passed && r.gradients.iter().find(|g| g.name == "s").unwrap().passed, "{wrong}: {r}");
    }
}

fn slice(src: &str, axis: i64, bounds: [Option<&str>; 3], dst: &str) -> Step {
    let e = |b: Option<&str>| b.map(|t| tilegrad::check::Expr::parse(t).unwrap());
    Step::Slice { src: src.into(), axis, start: e(bounds[0]), stop: e(bounds[1]), step: e(bounds[2]), dst: dst.into() }
}

fn names(n: &[&str]) -> Vec<String> {
    n.iter().map(|s| s.to_string()).collect()
}

/// Chunks (uneven: 13 columns in 3 chunks of 5, 5, 3), slices with a step and negative bounds,
/// and concatenations along either axis, one source twice: AD of the whole forward against
/// central differences.
#[test]
fn chunk_slice_and_cat_vjps_match_central_differences() {
    let fwd = Forward::new(&["x", "row", "col"], &["y", "z", "w"])
        .step(Step::Chunk { src: "x".into(), chunks: 3, axis: -1, dsts: names(&["a", "b", "c"]) })
        .step(slice("x", 0, [Some("1"), None, Some("2")], "odd"))
        .step(slice("row", 0, [Some("-4"), None, None], "tail"))
        .step(compute("p", "a * b + tanh(a)"))
        .step(Step::Cat { srcs: names(&["c", "p", "c"]), axis: -1, dst: "q".into() })
        .step(compute("y", "q * q * col"))
        .step(Step::Cat { srcs: names(&["odd", "x"]), axis: 0, dst: "z0".into() })
        .step(compute("z", "z0 ** 3"))
        .step(compute("w", "exp(tail) * tail"));
    assert_gradcheck("pieces", &fwd, &inputs());
}

/// The ground truth of `y = cat([b, a * a], -1)` with `a, b = x.chunk(2, -1)` against a plain
/// f64 loop: the cotangent moved back to the positions each element came from.
#[test]
fn chunk_and_cat_ground_truth_matches_a_plain_loop() {
    let fwd = Forward::new(&["x"], &["y"])
        .step(Step::Chunk { src: "x".into(), chunks: 2, axis: -1, dsts: names(&["a", "b"]) })
        .step(compute("aa", "a * a"))
        .step(Step::Cat { srcs: names(&["b", "aa"]), axis: 1, dst: "y".into() });
    let g = tilegrad::check::ground_truth(&fwd, &inputs(), &CheckOptions::default()).unwrap();
    let x = g.inputs.iter().find(|(n, _)| n == "x").unwrap().1.to_f64_vec();
    let (gx, cot) = (g.gradients[0].1.to_f64_vec(), g.cotangents[0].1.to_f64_vec());
    // a = x[:, :7], b = x[:, 7:]; y = [b (6 columns), a * a (7 columns)].
    for r in 0..R {
        for j in 0..C {
            let want = if j < 7 { cot[r * C + 6 + j] * 2.0 * x[r * C + j] } else { cot[r * C + j - 7] };
            assert_eq!(gx[r * C + j], want, "[{r}, {j}]");
        }
    }
}

/// `**` in `compute`: every operand kind as base and exponent, against central differences.
#[test]
fn powers_in_compute_match_central_differences() {
    let fwd = Forward::new(&["x", "row", "col", "s"], &["y"])
        .step(compute("y", "-x ** 2 + abs(row) ** 0.5 + (2 + sigmoid(x)) ** col - s ** 3 * (1 + x * x) ** -1 + 2 ** (x / 4) + x ** K"));
    assert_gradcheck("powers", &fwd, &inputs());
}

/// A count of the rows not ignored, `(lab != -100).sum().item()`, divides a masked sum: no
/// gradient flows through it, and the ground truth is the plain loop's.
#[test]
fn an_item_is_a_constant_of_later_steps_computed_from_data() {
    let fwd = Forward::new(&["x"], &["y"])
        .step(Step::item("valid", "sum(lab != -100)").unwrap())
        .step(compute("m", "where(lab == -100, 0.0, x * x)"))
        .step(Step::Sum { src: "m".into(), axis: 1, dst: "rows".into() })
        .step(Step::Sum { src: "rows".into(), axis: 0, dst: "total".into() })
        .step(Step::Scale { src: "total".into(), factor: tilegrad::check::Expr::parse("1 / valid").unwrap(), dst: "y".into() });
    assert_gradcheck("item", &fwd, &inputs());
    let g = tilegrad::check::ground_truth(&fwd, &inputs(), &CheckOptions::default()).unwrap();
    let x = g.inputs.iter().find(|(n, _)| n == "x").unwrap().1.to_f64_vec();
    let lab = g.inputs.iter().find(|(n, _)| n == "lab").unwrap().1.to_f64_vec();
    let (gx, cot) = (g.gradients[0].1.to_f64_vec(), g.cotangents[0].1.to_f64_vec()[0]);
    let valid = lab.iter().filter(|&&l| l != -100.0).count() as f64;
    assert!(valid > 0.0 && valid < R as f64, "the labels have ignored and kept rows: {lab:?}");
    for (k, &gk) in gx.iter().enumerate() {
        let want = if lab[k / C] == -100.0 { 0.0 } else { cot * 2.0 * x[k] / valid };
        assert!((gk - want).abs() <= 1e-12 * want.abs().max(1.0), "element {k}: {gk} vs {want}");
    }
}

// ---------------------------------------------------------------- specs

const KERNELS: &str = r#"import triton
import triton.language as tl

@triton.jit
def scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 3.0, mask=offs < n)

@triton.jit
def scale_bwd(gy_ptr, gx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(gx_ptr + offs, tl.load(gy_ptr + offs, mask=offs < n) * 3.0, mask=offs < n)

@triton.jit
def div_by(x_ptr, y_ptr, n, count, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) / count, mask=offs < n)
"#;

/// An MSE loss: a kernel, then host steps down to a 0-d loss; the backward scales the 0-d
/// cotangent on the host and runs the kernel's backward.
const MSE: &str = r#"
[kernels]
fwd = "k.py::scale"
bwd = "k.py::scale_bwd"

[constants]
n = 300

[inputs]
x = { shape = ["n"], init = "uniform(-2, 2)" }
t = { shape = ["n"], init = "uniform(-1, 1)" }
c = { shape = [7] }
lab = { shape = ["n"], dtype = "i64", init = "randint(0, 3)" }

[forward]
differentiable = ["x"]
outputs = ["loss"]
steps = [
  { alloc = "y", like = "x" },
  { launch = "fwd", grid = ["cdiv(n, 128)"], args = { x_ptr = "x", y_ptr = "y", n = "n", BLOCK = 128 } },
  { compute = "(y - t) * (y - t)", into = "sq" },
  { mean = "sq", axis = 0, into = "loss" },
]

[backward]
gradients = { x = "grad_x" }
steps = [
  { compute = "2 * (y - t) / n * grad_loss", into = "gy" },
  { alloc = "grad_x", like = "x" },
  { launch = "bwd", grid = ["cdiv(n, 128)"], args = { gy_ptr = "gy", gx_ptr = "grad_x", n = "n", BLOCK = 128 } },
]
"#;

fn write(tag: &str, spec: &str) -> PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("host-{tag}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("k.py"), KERNELS).unwrap();
    let p = dir.join("s.toml");
    std::fs::write(&p, spec).unwrap();
    p
}

#[test]
fn a_spec_with_host_steps_checks_and_a_wrong_backward_fails() {
    let s = load(&write("mse", MSE)).unwrap();
    match &s.forward.steps[2] {
        Step::Compute { expr, dtype: None, dst } => assert_eq!((expr.text(), dst.as_str()), ("(y - t) * (y - t)", "sq")),
        s => panic!("{s:?}"),
    }
    let r = check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &s.options).unwrap();
    assert!(r.passed, "{r}");
    let g = gradcheck(&s.forward, &s.inputs, &s.options, "mse").unwrap();
    assert!(g.passed, "{g}");
    let wrong = write("mse-wrong", &MSE.replace("/ n * grad_loss", "* grad_loss"));
    let s = load(&wrong).unwrap();
    let r = check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &s.options).unwrap();
    assert!(!r.passed, "{r}");
}

#[test]
fn spec_errors_name_the_key() {
    let step = r#"{ compute = "(y - t) * (y - t)", into = "sq" },"#;
    let mean = r#"{ mean = "sq", axis = 0, into = "loss" },"#;
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "unknown",
            step,
            r#"{ compute = "(y - tt) * (y - t)", into = "sq" },"#,
            "forward.steps[2].compute: `(y - tt) * (y - t)`: column 6: no tensor or constant named `tt`",
        ),
        (
            "broadcast",
            step,
            r#"{ compute = "(y - c) * (y - t)", into = "sq" },"#,
            "forward.steps[2].compute: `(y - c) * (y - t)`: column 4: shapes [300] and [7] do not broadcast",
        ),
        (
            "parse",
            step,
            r#"{ compute = "(y - t) * * (y - t)", into = "sq" },"#,
            "forward.steps[2].compute: `(y - t) * * (y - t)`: column 11: unexpected `*`",
        ),
        (
            "function",
            step,
            r#"{ compute = "sin(y)", into = "sq" },"#,
            "forward.steps[2].compute: `sin(y)`: column 1: unknown function `sin`",
        ),
        ("where", step, r#"{ compute = "where(y, y, t)", into = "sq" },"#, "column 1: the condition of `where` is f32, not a bool"),
        ("dtype", step, r#"{ compute = "y * t", dtype = "f8", into = "sq" },"#, "forward.steps[2].dtype: unknown dtype `f8`"),
        ("key", step, r#"{ compute = "y * t", axis = 0, into = "sq" },"#, "forward.steps[2].axis: unknown key"),
        ("into", step, r#"{ compute = "y * t" },"#, "forward.steps[2].into: missing"),
        ("twice", step, r#"{ compute = "y * t", into = "x" },"#, "forward.steps[2].into: tensor `x` is already defined"),
        ("int", mean, r#"{ mean = "lab", axis = 0, into = "loss" },"#, "forward.steps[3].mean: `lab` is i64: mean needs a float tensor"),
        ("lse-int", mean, r#"{ logsumexp = "lab", axis = 0, into = "loss" },"#, "forward.steps[3].logsumexp: `lab` is i64"),
        ("axis", mean, r#"{ mean = "sq", axis = 1, into = "loss" },"#, "forward.steps[3].axis: axis 1 of `sq`, which has shape [300]"),
        ("max-axis", mean, r#"{ max = "sq", axis = -2, into = "loss" },"#, "forward.steps[3].axis: axis -2"),
        ("cast", mean, r#"{ cast = "sq", into = "loss" },"#, "forward.steps[3].dtype: missing: the new dtype"),
        (
            "acc-into",
            mean,
            r#"{ accumulate = "sq", into = "nope" },"#,
            "forward.steps[3].into: no tensor `nope` here (`into` of `accumulate` names an existing tensor",
        ),
        (
            "acc-shape",
            mean,
            r#"{ accumulate = "c", into = "sq" },"#,
            "forward.steps[3].accumulate: `c` of shape [7] does not broadcast to `sq` of shape [300]",
        ),
        (
            "acc-dtype",
            mean,
            r#"{ accumulate = "sq", into = "lab" },"#,
            "forward.steps[3].accumulate: cannot add `sq` (f32) into `lab` (i64) in place",
        ),
        ("acc-key", mean, r#"{ accumulate = "sq", into = "y", axis = 0 },"#, "forward.steps[3].axis: unknown key"),
        ("two", mean, r#"{ mean = "sq", cast = "sq", axis = 0, into = "loss" },"#, "forward.steps[3]: a step has exactly one of"),
    ];
    for (tag, from, to, expect) in cases {
        assert!(MSE.contains(from), "{tag}: the case must change the spec");
        let p = write(tag, &MSE.replacen(from, to, 1));
        let e = load(&p).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains(expect), "{tag}: `{e}` lacks `{expect}`");
    }
    // A result's dtype and shape are known at load, for the steps after it.
    let ok = MSE.replacen(step, r#"{ compute = "where(lab == 1, 0.0, (y - t) * (y - t))", dtype = "f16", into = "sq" },"#, 1);
    let s = load(&write("typed", &ok)).unwrap();
    assert!(matches!(&s.forward.steps[2], Step::Compute { dtype: Some(DType::F16), .. }));
    // f32 into the f16 result in place is allowed (rounded to f16), as in torch.
    let also = ok.replacen(mean, r#"{ accumulate = "y", into = "sq" }, { mean = "sq", axis = 0, into = "loss" },"#, 1);
    let s = load(&write("typed2", &also)).unwrap();
    let r = check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &s.options).unwrap();
    assert!(!r.passed, "the backward ignores the masked rows and the accumulated y: {r}");
}

/// `examples/cross_entropy_mean.toml` (which `tests/specs.rs` checks with every example) with
/// the launcher's classic bugs in its host steps: dividing by every row instead of the rows not
/// ignored, and dropping the 0-d upstream gradient. Each fails, blamed through the host step on
/// the kernel's store.
#[test]
fn the_cross_entropy_example_fails_with_a_broken_host_step() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/cross_entropy_mean.toml");
    let good = load(&path).unwrap();
    let r = check_backward(&good.forward, good.backward.as_ref().unwrap(), &good.inputs, &good.options).unwrap();
    assert!(r.passed, "{r}");
    for (step, wrong) in [(0, "where(labels == IGNORE, 0.0, 1.0 / ROWS)"), (3, "grad_x_unit * 1.0")] {
        let mut bwd = good.backward.clone().unwrap();
        let Step::Compute { dst, .. } = &bwd.steps[step] else { panic!("step {step} is a compute") };
        bwd.steps[step] = Step::compute(&dst.clone(), wrong).unwrap();
        let r = check_backward(&good.forward, &bwd, &good.inputs, &good.options).unwrap();
        assert!(!r.passed, "{wrong}: {r}");
        let blame = r.gradients[0].worst.as_ref().and_then(|w| w.blame.as_ref()).expect("blamed");
        assert!(
            blame.via.iter().any(|v| v.starts_with("`grad_x = grad_x_unit * ") && v.contains("(step 3): from `grad_x_unit`[")),
            "{blame:?}"
        );
        assert!(
            blame.sites.iter().any(|s| matches!(s, BlameSite::Store { kernel, .. } if kernel == "liger_cross_entropy_bwd_kernel")),
            "{wrong}: {blame:?}"
        );
    }
    // A wrong term added in place is blamed too.
    let mut bwd = good.backward.clone().unwrap();
    bwd.steps.push(compute("extra", "x * 0.001"));
    bwd.steps.push(Step::Accumulate { src: "extra".into(), dst: "grad_x".into() });
    let r = check_backward(&good.forward, &bwd, &good.inputs, &good.options).unwrap();
    assert!(!r.passed, "{r}");
    let blame = r.gradients[0].worst.as_ref().and_then(|w| w.blame.as_ref()).expect("blamed");
    assert!(blame.via.iter().any(|v| v.starts_with("`grad_x += extra` (step 5): also from `extra`[")), "{blame:?}");
    assert!(blame.via.iter().any(|v| v.starts_with("`extra = x * 0.001` (step 4): from `x`[")), "{blame:?}");
}

/// A launcher that swaps the halves of its input (`chunk`, `cat`), runs a kernel on the result,
/// and averages a masked square over the rows not ignored, counted on the host (`item`); its
/// backward passes the count to a kernel as a runtime argument and puts the halves back with
/// slices and `cat`. The block size is a heuristic of the constants.
const PIECES: &str = r#"
[kernels]
fwd = "k.py::scale"
bwd = "k.py::scale_bwd"
div = "k.py::div_by"

[constants]
R = 7
C = 13
n = "R * C"
BLOCK = "128 if n > 64 else 2 ** 5"
IGNORE = -100

[inputs]
x = { shape = ["R", "C"], init = "uniform(-2, 2)" }
lab = { shape = ["R", 1], dtype = "i64", slices = [{ len = 2, init = "const(-100)" }, { len = 5, init = "randint(0, 5)" }] }

[forward]
differentiable = ["x"]
outputs = ["loss"]
steps = [
  { chunk = "x", chunks = 2, axis = -1, into = ["a", "b"] },
  { cat = ["b", "a"], axis = -1, into = "c" },
  { alloc = "y", like = "c" },
  { launch = "fwd", grid = ["cdiv(c.numel(), BLOCK)"], args = { x_ptr = "c", y_ptr = "y", n = "c.numel()", BLOCK = "BLOCK" } },
  { item = "sum(lab != IGNORE)", into = "valid" },
  { compute = "where(lab == IGNORE, 0.0, y ** 2)", into = "sq" },
  { sum = "sq", axis = 1, into = "rows" },
  { sum = "rows", axis = 0, into = "total" },
  { scale = "total", by = "1 / valid", into = "loss" },
]

[backward]
gradients = { x = "grad_x" }
steps = [
  { compute = "where(lab == IGNORE, 0.0, 2 * y) * grad_loss", into = "gy0" },
  { alloc = "gy", like = "gy0" },
  { launch = "div", grid = ["cdiv(n, BLOCK)"], args = { x_ptr = "gy0", y_ptr = "gy", n = "n", count = "valid", BLOCK = "BLOCK" } },
  { alloc = "gc", like = "c" },
  { launch = "bwd", grid = ["cdiv(n, BLOCK)"], args = { gy_ptr = "gy", gx_ptr = "gc", n = "n", BLOCK = "BLOCK" } },
  { slice = "gc", axis = -1, stop = "b.shape[1]", into = "gb" },
  { slice = "gc", axis = -1, start = "b.shape[1]", into = "ga" },
  { cat = ["ga", "gb"], axis = -1, into = "grad_x" },
]
"#;

#[test]
fn a_spec_with_chunks_slices_cat_and_an_item_checks_and_wrong_ones_fail() {
    let s = load(&write("pieces", PIECES)).unwrap();
    assert_eq!(s.inputs.constants.iter().find(|(n, _)| n == "BLOCK").unwrap().1, tilegrad::check::Scalar::Int(128));
    let descriptions: Vec<String> = s.backward.as_ref().unwrap().steps.iter().map(Step::describe).collect();
    assert_eq!(descriptions[5], "gb = gc[:b.shape[1]] along axis -1");
    assert_eq!(descriptions[7], "grad_x = torch.cat([ga, gb], -1)");
    assert_eq!(s.forward.steps[0].describe(), "a, b = x.chunk(2, -1)");
    assert_eq!(s.forward.steps[4].describe(), "valid = sum(lab != IGNORE).item()");
    let r = check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &s.options).unwrap();
    assert!(r.passed, "{r}");
    let g = gradcheck(&s.forward, &s.inputs, &s.options, "pieces").unwrap();
    assert!(g.passed, "{g}");
    // The halves put back in the wrong order, the count of every row instead of the rows kept,
    // and a slice one column off each fail.
    for (tag, from, to) in [
        ("order", r#"cat = ["ga", "gb"]"#, r#"cat = ["gb", "ga"]"#),
        ("count", r#"count = "valid""#, r#"count = "R""#),
        ("off", r#"start = "b.shape[1]", into = "ga""#, r#"start = "b.shape[1] - 1", stop = "-1", into = "ga""#),
    ] {
        assert!(PIECES.contains(from), "{tag}");
        let s = load(&write(&format!("pieces-{tag}"), &PIECES.replacen(from, to, 1))).unwrap();
        let r = check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &s.options).unwrap();
        assert!(!r.passed, "{tag}: {r}");
    }
    // The wrong order is blamed through the `cat` and the slice on the kernel's store.
    let s = load(&write("pieces-blame", &PIECES.replacen(r#"cat = ["ga", "gb"]"#, r#"cat = ["gb", "ga"]"#, 1))).unwrap();
    let r = check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &s.options).unwrap();
    let blame = r.gradients[0].worst.as_ref().and_then(|w| w.blame.as_ref()).expect("blamed");
    assert!(blame.via.iter().any(|v| v.starts_with("`grad_x = torch.cat([gb, ga], -1)` (step 7): from `g")), "{blame:?}");
    assert!(blame.sites.iter().any(|s| matches!(s, BlameSite::Store { kernel, .. } if kernel == "scale_bwd")), "{blame:?}");
}

#[test]
fn spec_errors_of_pieces_items_and_expressions_name_the_key_and_column() {
    let cases: &[(&str, &str, &str, &str)] = &[
        ("chunk-count", r#"into = ["a", "b"] }"#, r#"into = ["a", "b", "d"] }"#, "forward.steps[0].into: `x`.chunk(2, -1) of shape [7, 13] gives 2 chunks of sizes [7, 6]"),
        ("chunk-zero", "chunks = 2", "chunks = 0", "forward.steps[0].chunks: expected a positive integer"),
        ("chunk-axis", "chunks = 2, axis = -1", "chunks = 2, axis = 2", "forward.steps[0].axis: axis 2 of `x`, which has shape [7, 13]"),
        ("chunk-key", "chunks = 2,", "chunks = 2, dim = 1,", "forward.steps[0].dim: unknown key"),
        ("cat-shape", r#"cat = ["b", "a"], axis = -1"#, r#"cat = ["b", "x"], axis = 0"#, "forward.steps[1].cat: cat along axis 0: `x` has shape [7, 13], `b` [7, 6] (only axis 0 may differ)"),
        ("cat-unknown", r#"cat = ["b", "a"]"#, r#"cat = ["b", "nope"]"#, "forward.steps[1].cat[1]: no tensor `nope` here"),
        ("slice-step", r#"stop = "b.shape[1]", into"#, r#"stop = "b.shape[1]", step = 0, into"#, "backward.steps[5].step: the step of a slice must be positive"),
        ("slice-name", r#"stop = "b.shape[1]""#, r#"stop = "b.shape[1] + NOPE""#, "backward.steps[5].stop: `b.shape[1] + NOPE`: column 14: unknown name `NOPE`"),
        ("item-parse", "sum(lab != IGNORE)", "sum(lab != NOPE)", "forward.steps[4].item: `sum(lab != NOPE)`: column 12: no tensor or constant named `NOPE`"),
        ("item-mean", "sum(lab != IGNORE)", "mean(lab)", "forward.steps[4].item: `mean(lab)`: mean of a i64 expression"),
        ("item-float", "sum(lab != IGNORE)", "sum(a * a)", "forward.steps[4].item: `sum(a * a)` is a float computed from `a`, which depends on a differentiable input"),
        ("item-launch", "sum(lab != IGNORE)", "max(y)", "forward.steps[4].item: `max(y)` is a float computed from `y`"),
        ("item-twice", r#"into = "valid""#, r#"into = "R""#, "forward.steps[4].into: `R` is already defined"),
        ("item-shape", r#"{ alloc = "gy", like = "gy0" }"#, r#"{ alloc = "gy", shape = ["valid", "C"] }"#, "backward.steps[1].shape: `valid` uses `valid`, which `forward.steps[4].item` computes from data: a shape is fixed"),
        ("item-constexpr", r#"count = "valid", BLOCK = "BLOCK""#, r#"count = "valid", BLOCK = "valid * 32""#, "backward.steps[2].args.BLOCK: `valid * 32` uses `valid`, which an `item` step computes from data: it cannot bind the constexpr `BLOCK`"),
        ("conditional", r#""128 if n > 64 else 2 ** 5""#, r#""128 if n > 64 2 ** 5""#, "constants.BLOCK: `128 if n > 64 2 ** 5`: column 15: expected `else`"),
        ("pow-neg", "y ** 2", "lab ** -1", "forward.steps[5].compute: `where(lab == IGNORE, 0.0, lab ** -1)`: column 31: a power of i64"),
    ];
    for (tag, from, to, expect) in cases {
        assert!(PIECES.contains(from), "{tag}: the case must change the spec");
        let p = write(tag, &PIECES.replacen(from, to, 1));
        let e = load(&p).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains(expect), "{tag}: `{e}` lacks `{expect}`");
    }
    // A float item from tensors no differentiable input reaches is allowed (no gradient is lost),
    // and an integer one from a differentiable input too (a count).
    for (tag, text) in [("float-ok", "mean(lab * 1.5)"), ("count-ok", "sum(a > 0)")] {
        let p = write(tag, &PIECES.replacen("sum(lab != IGNORE)", text, 1));
        load(&p).unwrap_or_else(|e| panic!("{tag}: {e}"));
    }
}
