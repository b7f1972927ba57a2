//! Verdicts that can be trusted: a wrong backward never passes because the comparison was
//! vacuous (the gradient is the cotangent itself, the ground truth is NaN, the tolerance is
//! looser than the kernel's rounding), a correct backward never fails because the ground truth
//! turned a masked-off lane's infinity into NaN, and a failed check reports NaN as NaN and its
//! reasons as fields.

use std::path::{Path, PathBuf};
use tilegrad::check::{CheckError, Dist, FindingKind};
use tilegrad::spec::{load, load_with, KernelOverride};
use tilegrad::CheckOptions;

/// Writes the kernels and the spec into a fresh folder; returns the spec's path.
fn write(tag: &str, kernels: &str, spec: &str) -> PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("trust-{tag}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("k.py"), kernels).unwrap();
    let p = dir.join("s.toml");
    std::fs::write(&p, spec).unwrap();
    p
}

fn check(p: &Path, bwd: Option<&str>) -> Result<tilegrad::Report, CheckError> {
    let overrides: Vec<KernelOverride> =
        bwd.map(|b| KernelOverride { key: "bwd".into(), reference: format!("::{b}") }).into_iter().collect();
    let s = load_with(p, &overrides).unwrap();
    tilegrad::check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &s.options)
}

const INPLACE: &str = r#"import triton
import triton.language as tl

@triton.jit
def double_inplace(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2.0, mask=m)

@triton.jit
def double_bwd_into(gy_ptr, gx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(gx_ptr + offs, tl.load(gy_ptr + offs, mask=m) * 3.0, mask=m)

@triton.jit
def double_bwd_inplace(gy_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(gy_ptr + offs, tl.load(gy_ptr + offs, mask=m) * 2.0, mask=m)
"#;

/// The cotangent of an in-place output named as the gradient, while the backward writes its
/// gradient elsewhere, is an error naming the spec key; a backward that updates the cotangent
/// in place (as in-place backward kernels do) is checked as usual.
#[test]
fn a_gradient_the_backward_never_writes_is_an_error() {
    let spec = r#"
[kernels]
fwd = "k.py::double_inplace"
bwd = "k.py::double_bwd_into"
inplace = "k.py::double_bwd_inplace"
[constants]
n = 1000
[inputs]
x = { shape = ["n"], init = "uniform(-2, 2)" }
[forward]
outputs = ["x"]
steps = [{ launch = "fwd", grid = ["cdiv(n, 128)"], args = { x_ptr = "x", n = "n", BLOCK = 128 } }]
[backward]
gradients = { x = "grad_x" }
steps = [
  { alloc = "elsewhere", like = "x" },
  { launch = "bwd", grid = ["cdiv(n, 128)"], args = { gy_ptr = "grad_x", gx_ptr = "elsewhere", n = "n", BLOCK = 128 } },
]
"#;
    let p = write("inplace", INPLACE, spec);
    let e = check(&p, None).unwrap_err().to_string();
    assert!(e.contains("backward.gradients.x") && e.contains("cotangent of output `x`"), "{e}");

    let inplace = spec.replace(
        "steps = [\n  { alloc = \"elsewhere\", like = \"x\" },\n  { launch = \"bwd\", grid = [\"cdiv(n, 128)\"], args = { gy_ptr = \"grad_x\", gx_ptr = \"elsewhere\", n = \"n\", BLOCK = 128 } },\n]",
        "steps = [{ launch = \"inplace\", grid = [\"cdiv(n, 128)\"], args = { gy_ptr = \"grad_x\", n = \"n\", BLOCK = 128 } }]",
    );
    assert_ne!(inplace, spec);
    let p = write("inplace-ok", INPLACE, &inplace);
    let r = check(&p, None).unwrap();
    assert!(r.passed, "{r}");
    // The same in-place backward with the wrong factor fails.
    let wrong = INPLACE.replace("tl.load(gy_ptr + offs, mask=m) * 2.0", "tl.load(gy_ptr + offs, mask=m) * 2.5");
    let p = write("inplace-wrong", &wrong, &inplace);
    let r = check(&p, None).unwrap();
    assert!(!r.passed && r.gradients[0].over_tolerance == 1000, "{r}");
}

const SQRT: &str = r#"import triton
import triton.language as tl

@triton.jit
def root(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.sqrt(tl.load(x_ptr + offs, mask=m)), mask=m)

@triton.jit
def root_bwd_wrong(x_ptr, gy_ptr, gx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(gx_ptr + offs, tl.load(gy_ptr + offs, mask=m) * 7.0, mask=m)
"#;

fn sqrt_spec(init: &str) -> String {
    format!(
        r#"
[kernels]
fwd = "k.py::root"
bwd = "k.py::root_bwd_wrong"
[constants]
n = 300
[inputs]
x = {{ shape = ["n"], init = "{init}" }}
[forward]
outputs = ["y"]
steps = [{{ alloc = "y", like = "x" }}, {{ launch = "fwd", grid = ["cdiv(n, 128)"], args = {{ x_ptr = "x", y_ptr = "y", n = "n", BLOCK = 128 }} }}]
[backward]
gradients = {{ x = "grad_x" }}
steps = [
  {{ alloc = "grad_x", like = "x" }},
  {{ launch = "bwd", grid = ["cdiv(n, 128)"], args = {{ x_ptr = "x", gy_ptr = "grad_y", gx_ptr = "grad_x", n = "n", BLOCK = 128 }} }},
]
"#
    )
}

/// Non-finite inputs and a non-finite ground truth are usage errors naming the tensor and the
/// element (a wrong backward used to pass against a NaN ground truth); asked for explicitly, the
/// check runs, and the wrong backward still fails on the finite elements.
#[test]
fn non_finite_inputs_and_ground_truth_are_usage_errors() {
    // The square root of negative inputs: NaN forward and ground truth.
    let p = write("nan-truth", SQRT, &sqrt_spec("uniform(-1, 1)"));
    match check(&p, None) {
        Err(CheckError::NonFinite(m)) => assert!(m.contains("forward output `y`") && m.contains("NaN"), "{m}"),
        other => panic!("expected a non-finite error, got {other:?}"),
    }
    // x = 0 somewhere: sqrt is finite there, its derivative is not.
    let p = write("inf-grad", SQRT, &sqrt_spec("randint(0, 3)"));
    match check(&p, None) {
        Err(CheckError::NonFinite(m)) => assert!(m.contains("ground-truth gradient of `x`") && m.contains("inf"), "{m}"),
        other => panic!("expected a non-finite error, got {other:?}"),
    }
    let s = load(&p).unwrap();
    let opts = CheckOptions { allow_non_finite: true, ..s.options.clone() };
    let r = tilegrad::check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &opts).unwrap();
    assert!(!r.passed, "{r}");

    // NaN among the inputs themselves, from the library.
    let s = load(&write("nan-input", SQRT, &sqrt_spec("uniform(1, 2)"))).unwrap();
    let mut inputs = s.inputs.clone();
    inputs.tensors.clear();
    let inputs = inputs.random("x", tilegrad_ir::DType::F32, &[300], Dist::Normal { mean: 0.0, std: f64::NAN });
    match tilegrad::check_backward(&s.forward, s.backward.as_ref().unwrap(), &inputs, &s.options) {
        Err(CheckError::NonFinite(m)) => assert!(m.contains("input `x`") && m.contains("[0]"), "{m}"),
        other => panic!("expected a non-finite error, got {other:?}"),
    }
}

const KL: &str = r#"import triton
import triton.language as tl

@triton.jit
def kl_rows(x_ptr, q_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    # Per element p * (log p - q), p = softmax(x) of the row, q a log-probability. Padded lanes
    # load -inf: their p is 0, their log p is -inf, their term 0 * (-inf - -inf) is NaN, never stored.
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=m, other=float("-inf"))
    q = tl.load(q_ptr + row * n_cols + cols, mask=m, other=float("-inf"))
    mx = tl.max(x, axis=0)
    logp = x - mx - tl.log(tl.sum(tl.exp(x - mx), axis=0))
    p = tl.exp(logp)
    tl.store(out_ptr + row * n_cols + cols, p * (logp - q), mask=m)

@triton.jit
def kl_rows_bwd(x_ptr, q_ptr, g_ptr, gx_ptr, gq_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=m, other=float("-inf"))
    q = tl.load(q_ptr + row * n_cols + cols, mask=m, other=0.0)
    g = tl.load(g_ptr + row * n_cols + cols, mask=m, other=0.0)
    mx = tl.max(x, axis=0)
    logp = x - mx - tl.log(tl.sum(tl.exp(x - mx), axis=0))
    p = tl.exp(logp)
    a = tl.where(m, g * p * (logp - q + 1.0), 0.0)
    tl.store(gx_ptr + row * n_cols + cols, a - p * tl.sum(a, axis=0), mask=m)
    tl.store(gq_ptr + row * n_cols + cols, -g * p, mask=m)

@triton.jit
def kl_rows_bwd_broken(x_ptr, q_ptr, g_ptr, gx_ptr, gq_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=m, other=float("-inf"))
    q = tl.load(q_ptr + row * n_cols + cols, mask=m, other=0.0)
    g = tl.load(g_ptr + row * n_cols + cols, mask=m, other=0.0)
    mx = tl.max(x, axis=0)
    logp = x - mx - tl.log(tl.sum(tl.exp(x - mx), axis=0))
    p = tl.exp(logp)
    a = tl.where(m, g * p * (logp - q), 0.0)
    tl.store(gx_ptr + row * n_cols + cols, a - p * tl.sum(a, axis=0), mask=m)
    tl.store(gq_ptr + row * n_cols + cols, -g * p, mask=m)
"#;

/// Masked-off lanes whose forward values are infinite or NaN get a zero cotangent, and a zero
/// cotangent contributes exactly zero: the ground truth stays finite and a correct backward
/// passes (it used to fail with `expected NaN`); a wrong one fails on finite values.
#[test]
fn masked_lanes_with_infinite_values_do_not_poison_the_ground_truth() {
    let spec = r#"
[kernels]
fwd = "k.py::kl_rows"
bwd = "k.py::kl_rows_bwd"
[constants]
ROWS = 37
COLS = 100
[inputs]
x = { shape = ["ROWS", "COLS"], init = "normal(0, 2)" }
q = { shape = ["ROWS", "COLS"], init = "uniform(-6, -3)" }
[forward]
outputs = ["out"]
steps = [{ alloc = "out", like = "x" }, { launch = "fwd", grid = ["ROWS"], args = { x_ptr = "x", q_ptr = "q", out_ptr = "out", n_cols = "COLS", BLOCK = 128 } }]
[backward]
gradients = { x = "grad_x", q = "grad_q" }
steps = [
  { alloc = "grad_x", like = "x" },
  { alloc = "grad_q", like = "q" },
  { launch = "bwd", grid = ["ROWS"], args = { x_ptr = "x", q_ptr = "q", g_ptr = "grad_out", gx_ptr = "grad_x", gq_ptr = "grad_q", n_cols = "COLS", BLOCK = 128 } },
]
"#;
    let p = write("kl", KL, spec);
    let r = check(&p, None).unwrap();
    assert!(r.passed, "{r}");
    let r = check(&p, Some("kl_rows_bwd_broken")).unwrap();
    assert!(!r.passed, "{r}");
    let gx = &r.gradients[0];
    assert!(!gx.passed && gx.worst.as_ref().unwrap().expected.is_finite() && gx.nan == 0, "{r}");
    assert!(r.gradients[1].passed, "{r}");
}

const LN: &str = r#"import triton
import triton.language as tl

@triton.jit
def ln_fwd(x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < n_cols
    mask = (rows[:, None] < n_rows) & cmask[None, :]
    offs = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / n_cols
    xc = tl.where(mask, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    y = xc * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)

@triton.jit
def ln_bwd(x_ptr, w_ptr, dy_ptr, dx_ptr, n_rows, n_cols, eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < n_cols
    mask = (rows[:, None] < n_rows) & cmask[None, :]
    offs = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / n_cols
    xc = tl.where(mask, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / n_cols + eps)
    xhat = xc * rstd[:, None]
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    wdy = dy * w[None, :]
    c1 = tl.sum(xhat * wdy, axis=1) / n_cols
    c2 = tl.sum(wdy, axis=1) / n_cols
    dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
    tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
"#;

fn ln_spec(dtype: &str) -> String {
    format!(
        r#"
[kernels]
fwd = "k.py::ln_fwd"
bwd = "k.py::ln_bwd"
[constants]
ROWS = 203
COLS = 1000
EPS = 1e-5
[inputs]
x = {{ shape = ["ROWS", "COLS"], dtype = "{dtype}", init = "normal(0.5, 2)" }}
w = {{ shape = ["COLS"], dtype = "{dtype}", init = "uniform(0.5, 1.5)" }}
b = {{ shape = ["COLS"], dtype = "{dtype}", init = "uniform(-1, 1)" }}
[forward]
differentiable = ["x"]
outputs = ["y"]
steps = [{{ alloc = "y", like = "x" }}, {{ launch = "fwd", grid = ["cdiv(ROWS, 4)"], args = {{ x_ptr = "x", w_ptr = "w", b_ptr = "b", y_ptr = "y", n_rows = "ROWS", n_cols = "COLS", eps = "EPS", BLOCK_M = 4, BLOCK_N = 1024 }} }}]
[backward]
gradients = {{ x = "grad_x" }}
steps = [
  {{ alloc = "grad_x", like = "x" }},
  {{ launch = "bwd", grid = ["cdiv(ROWS, 4)"], args = {{ x_ptr = "x", w_ptr = "w", dy_ptr = "grad_y", dx_ptr = "grad_x", n_rows = "ROWS", n_cols = "COLS", eps = "EPS", BLOCK_M = 4, BLOCK_N = 1024 }} }},
]
"#
    )
}

/// A layer-norm backward dividing one mean by the block size instead of the row length (a 2.4%
/// error in one term) fails on the formula line in every dtype, f16 and bf16 included, where the
/// elementwise defaults alone let it pass (in bf16 it is a third of a unit of roundoff): the
/// backward replayed in exact arithmetic is not the derivative. Its rounding is within budget.
/// The correct backward passes both lines in every dtype. A tolerance the user gives replaces the
/// rounding verdict, not the formula's.
#[test]
fn a_wrong_term_fails_the_formula_line_in_every_dtype() {
    for dtype in ["f32", "f16", "bf16"] {
        // The broken backward: the correct one with the mean of `xhat * wdy` over the block.
        let bwd = &LN[LN.find("@triton.jit\ndef ln_bwd(").unwrap()..];
        let broken = bwd
            .replace("def ln_bwd(", "def ln_bwd_block_mean(")
            .replace("c1 = tl.sum(xhat * wdy, axis=1) / n_cols", "c1 = tl.sum(xhat * wdy, axis=1) / BLOCK_N");
        assert!(broken.contains("/ BLOCK_N"), "the bug was not seeded");
        let kernels = format!("{LN}\n{broken}");
        let p = write(&format!("ln-{dtype}"), &kernels, &ln_spec(dtype));
        let r = check(&p, None).unwrap();
        assert!(r.passed, "{dtype}: {r}");
        let (f, ro) = (r.gradients[0].formula.clone().unwrap(), r.gradients[0].rounding.clone().unwrap());
        assert!(f.passed && ro.passed && ro.units < 2.0, "{dtype}: {f:?} {ro:?}");
        let bad = check(&p, Some("ln_bwd_block_mean")).unwrap();
        let f = bad.gradients[0].formula.clone().unwrap();
        assert!(!bad.passed && !f.passed && f.error > 1e-4, "{dtype}: {bad}");
        assert!(bad.to_string().contains("WRONG even in exact arithmetic"), "{bad}");
        // Explicit tolerances replace the rounding verdict; the formula still fails the bug.
        let s = load_with(&p, &[KernelOverride { key: "bwd".into(), reference: "::ln_bwd_block_mean".into() }]).unwrap();
        let loose = CheckOptions { tolerance: Some(tilegrad::check::Tolerance { rtol: 0.1, atol: 0.1 }), ..s.options.clone() };
        let r = tilegrad::check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &loose).unwrap();
        assert!(!r.passed && r.gradients[0].over_tolerance == 0, "{r}");
    }
}

/// A racy backward fails with the race as a finding (kind, tensor, programs, both source
/// lines), and its gradients are still compared, run again with the race resolved in program
/// order and marked provisional; the JSON says all of it as fields, NaN as "NaN".
#[test]
fn a_race_keeps_the_gradient_table_and_findings_carry_fields() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/layer_norm.toml");
    let s = load_with(&dir, &[KernelOverride { key: "bwd".into(), reference: "::layer_norm_rows_bwd_broken_race".into() }]).unwrap();
    let r = tilegrad::check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &s.options).unwrap();
    assert!(!r.passed && r.failure.is_some(), "{r}");
    assert!(r.gradients_provisional && r.gradients.len() == 3, "{r}");
    assert!(r.to_string().contains("provisional"), "{r}");
    let race = r.findings.iter().find(|f| f.kind == FindingKind::Race).expect("a race finding");
    assert_eq!(race.tensor.as_deref(), Some("grad_w"));
    assert_eq!(race.programs.len(), 2, "{race:?}");
    assert!(race.locations.iter().all(|l| l.file.ends_with("layer_norm_bwd.py") && l.line == 66), "{race:?}");
    // grad_x and grad_b are right, grad_w (lost updates resolved in program order) is not.
    assert!(r.gradients[0].passed && !r.gradients[1].passed && r.gradients[2].passed, "{r}");
    let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert_eq!(json["schema_version"], tilegrad::check::SCHEMA_VERSION);
    assert_eq!(json["findings"][0]["kind"], "race");
    assert_eq!(json["findings"][0]["locations"][0]["line"], 66);
    assert_eq!(json["gradients_provisional"], true);

    // A never-written element: NaN shown as NaN, counted, and a finding of its own kind.
    let s = load_with(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/weighted_sum.toml"),
        &[KernelOverride { key: "bwd".into(), reference: "::weighted_sum_bwd_broken_no_advance".into() }],
    )
    .unwrap();
    let r = tilegrad::check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &s.options).unwrap();
    let w = &r.gradients[1];
    assert!(w.max_abs_err.is_nan() && w.normwise_rel_err.is_nan() && w.nan > 0, "{r}");
    let f = r.findings.iter().find(|f| f.tensor.as_deref() == Some("grad_w")).unwrap();
    assert!(matches!(f.kind, FindingKind::NeverWritten | FindingKind::NonFinite), "{f:?}");
    let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert_eq!(json["gradients"][1]["max_abs_err"], "NaN");
    assert!(r.to_string().contains("NaN"), "{r}");
}
