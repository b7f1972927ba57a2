//! Errors in spec files name the file, the key and what was expected; nothing panics.

use std::path::PathBuf;
use tilegrad::spec::{load, load_with, KernelOverride};

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

CONFIGS = [triton.Config({'BLOCK': 64}), triton.Config({'BLOCK': 256}, num_warps=8)]

@triton.autotune(configs=CONFIGS, key=['n'])
@triton.jit
def scale_tuned(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 3.0, mask=offs < n)

@triton.jit
def scale_bwd_wrong(gy_ptr, gx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(gx_ptr + offs, tl.load(gy_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)
"#;

const GOOD: &str = r#"
[kernels]
fwd = "k.py::scale"
bwd = "k.py::scale_bwd"

[constants]
n = 1000

[inputs]
x = { shape = ["n"], init = "uniform(-2, 2)" }

[forward]
outputs = ["y"]
steps = [
  { alloc = "y", like = "x" },
  { launch = "fwd", grid = "cdiv(n, 128)", args = { x_ptr = "x", y_ptr = "y", n = "n", BLOCK = 128 } },
]

[backward]
gradients = { x = "grad_x" }
steps = [
  { alloc = "grad_x", like = "x" },
  { launch = "bwd", grid = ["cdiv(n, 128)"], args = { gy_ptr = "grad_y", gx_ptr = "grad_x", n = "n", BLOCK = 128 } },
]
"#;

/// Writes `spec` (and the kernels) into a fresh folder and returns the spec's path.
fn write(tag: &str, spec: &str) -> PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("spec-{tag}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("k.py"), KERNELS).unwrap();
    let p = dir.join("s.toml");
    std::fs::write(&p, spec).unwrap();
    p
}

#[test]
fn a_good_spec_checks_and_a_replaced_kernel_fails() {
    let p = write("good", GOOD);
    let s = load(&p).unwrap();
    assert_eq!(s.name, "s");
    assert_eq!(s.forward.differentiable, vec!["x".to_string()]);
    let r = tilegrad::check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &s.options).unwrap();
    assert!(r.passed, "{r}");
    let s = load_with(&p, &[KernelOverride { key: "bwd".into(), reference: "::scale_bwd_wrong".into() }]).unwrap();
    let r = tilegrad::check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &s.options).unwrap();
    assert!(!r.passed);
    assert!((r.gradients[0].max_rel_err - 1.0 / 3.0).abs() < 1e-6, "{r}");
}

#[test]
fn errors_name_file_key_and_expectation() {
    let cases: &[(&str, &str, &str, &str)] = &[
        ("toml", "fwd = \"k.py::scale\"", "fwd = k.py::scale", "-: line 3, column 7"),
        ("topkey", "[kernels]", "[kernel]", "kernel: unknown key"),
        ("kname", "k.py::scale_bwd\"", "k.py::nope\"", "kernels.bwd: "),
        ("file", "fwd = \"k.py::scale\"", "fwd = \"missing.py::scale\"", "kernels.fwd: "),
        ("dtype", "init = \"uniform(-2, 2)\"", "dtype = \"float8\"", "inputs.x.dtype: unknown dtype `float8`"),
        ("dist", "uniform(-2, 2)", "uniform(2, -2)", "inputs.x.init: `uniform(2, -2)`"),
        ("shape", "shape = [\"n\"]", "shape = [\"m\"]", "inputs.x.shape: shape `m`: column 1: unknown name `m`"),
        ("grid", "grid = \"cdiv(n, 128)\"", "grid = \"cdiv(n 128)\"", "forward.steps[1].grid: `cdiv(n 128)`: column 8"),
        ("launch", "launch = \"fwd\"", "launch = \"fwdd\"", "forward.steps[1].launch: no kernel `fwdd`"),
        ("param", "x_ptr = \"x\", y_ptr", "x = \"x\", y_ptr", "forward.steps[1].args.x: kernel `scale` has no parameter `x`"),
        (
            "missing",
            "x_ptr = \"x\", y_ptr = \"y\", n = \"n\", BLOCK = 128 }",
            "x_ptr = \"x\", y_ptr = \"y\", BLOCK = 128 }",
            "missing argument `n`",
        ),
        ("step", "{ alloc = \"y\", like = \"x\" }", "{ alloc = \"y\", sum = \"x\" }", "forward.steps[0]: a step has exactly one of"),
        ("like", "{ alloc = \"y\", like = \"x\" }", "{ alloc = \"y\", like = \"z\" }", "forward.steps[0].like: no tensor `z`"),
        (
            "twice",
            "{ alloc = \"grad_x\", like = \"x\" }",
            "{ alloc = \"x\", like = \"x\" }",
            "backward.steps[0]: tensor `x` is already defined",
        ),
        ("outputs", "outputs = [\"y\"]", "outputs = [\"q\"]", "forward.outputs: `q` is not a tensor"),
        ("noout", "outputs = [\"y\"]", "outputs = 3", "forward.outputs: expected an array of strings"),
        (
            "axis",
            "{ alloc = \"grad_x\", like = \"x\" },",
            "{ alloc = \"grad_x\", like = \"x\" }, { sum = \"grad_x\", axis = 1, into = \"g\" },",
            "backward.steps[1].axis: axis 1",
        ),
        ("triton", "BLOCK = 128 } },\n]\n\n[backward]", "BLOCK = 100 } },\n]\n\n[backward]", "forward.steps[1].launch: kernel `fwd`"),
    ];
    for (tag, from, to, expect) in cases {
        assert!(GOOD.contains(from), "{tag}: the case must change the spec");
        let p = write(tag, &GOOD.replacen(from, to, 1));
        let e = load(&p).map(|_| ()).unwrap_err().to_string();
        assert!(e.starts_with(&p.display().to_string()), "{tag}: {e}");
        assert!(e.contains(expect), "{tag}: `{e}` lacks `{expect}`");
    }
}

#[test]
fn autotune_configs_are_picked_by_index() {
    let tuned = GOOD.replace("fwd = \"k.py::scale\"", "fwd = { kernel = \"k.py::scale_tuned\", config = 1 }");
    let ok = tuned.replace(
        "grid = \"cdiv(n, 128)\", args = { x_ptr = \"x\", y_ptr = \"y\", n = \"n\", BLOCK = 128 }",
        "grid = \"cdiv(n, 256)\", args = { x_ptr = \"x\", y_ptr = \"y\", n = \"n\" }",
    );
    assert_ne!(ok, tuned);
    let s = load(&write("tuned", &ok)).unwrap();
    let r = tilegrad::check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &s.options).unwrap();
    assert!(r.passed, "{r}");
    match &s.forward.steps[1] {
        tilegrad::check::Step::Launch(l) => {
            assert_eq!(l.kernel.param("BLOCK").map(|p| format!("{:?}", p.kind)), Some("Constexpr(I32, Int(256))".into()))
        }
        s => panic!("{s:?}"),
    }
    // The launch contradicts the config.
    let e = load(&write("tuned-conflict", &tuned)).unwrap_err().to_string();
    assert!(e.contains("forward.steps[1].args.BLOCK: 128, but the kernel's autotune config sets BLOCK = 256"), "{e}");
    // No such config; no configs at all.
    let e = load(&write("tuned-range", &ok.replace("config = 1", "config = 2"))).unwrap_err().to_string();
    assert!(e.contains("kernels.fwd.config: config 2 of `scale_tuned`, which has 2"), "{e}");
    let e = load(&write("untuned", &ok.replace("scale_tuned", "scale"))).unwrap_err().to_string();
    assert!(e.contains("has no @triton.autotune configs"), "{e}");
}

#[test]
fn inputs_can_come_from_npy_files() {
    let x: Vec<f32> = (0..1000).map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0).collect();
    let spec = GOOD.replace("x = { shape = [\"n\"], init = \"uniform(-2, 2)\" }", "x = { file = \"x.npy\" }");
    let p = write("npy", &spec);
    tilegrad::npy::write(&p.with_file_name("x.npy"), &tilegrad_reference::HostTensor::from_f32(&[1000], x.clone())).unwrap();
    let s = load(&p).unwrap();
    let gt = tilegrad::check::ground_truth(&s.forward, &s.inputs, &s.options).unwrap();
    assert_eq!(gt.inputs[0].1.as_f32().unwrap(), &x[..]);
    assert_eq!(gt.outputs[0].1.as_f32().unwrap(), &x.iter().map(|v| v * 3.0).collect::<Vec<_>>()[..]);
    let r = tilegrad::check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &s.options).unwrap();
    assert!(r.passed, "{r}");
    // A dtype that contradicts the file, and a file that is not there.
    let p2 = write("npy-dtype", &spec.replace("file = \"x.npy\"", "file = \"x.npy\", dtype = \"f64\""));
    std::fs::copy(p.with_file_name("x.npy"), p2.with_file_name("x.npy")).unwrap();
    let e = load(&p2).unwrap_err().to_string();
    assert!(e.contains("inputs.x.dtype: f64, but") && e.contains("holds f32"), "{e}");
    let e = load(&write("npy-missing", &spec.replace("x.npy", "nope.npy"))).unwrap_err().to_string();
    assert!(e.contains("inputs.x.file: ") && e.contains("nope.npy"), "{e}");
}

#[test]
fn inputs_can_be_drawn_per_slice() {
    // The first 990 elements normal, the last 10 a constant: drawn as written, and checked.
    let spec = GOOD.replace(
        "x = { shape = [\"n\"], init = \"uniform(-2, 2)\" }",
        "x = { shape = [\"n\"], slices = [{ len = \"n - 10\", init = \"normal(0, 1)\" }, { len = 10, init = \"const(7.5)\" }] }",
    );
    let p = write("slices", &spec);
    let s = load(&p).unwrap();
    let gt = tilegrad::check::ground_truth(&s.forward, &s.inputs, &s.options).unwrap();
    let x = gt.inputs[0].1.as_f32().unwrap();
    assert_eq!(x.len(), 1000);
    assert!(x[990..].iter().all(|&v| v == 7.5), "{:?}", &x[990..]);
    assert!(x[..990].iter().all(|&v| v != 7.5 && v.abs() < 8.0));
    let mean = x[..990].iter().map(|&v| v as f64).sum::<f64>() / 990.0;
    assert!(mean.abs() < 0.15, "{mean}");
    let r = tilegrad::check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &s.options).unwrap();
    assert!(r.passed, "{r}");

    // Along the last axis of a matrix, integers exact.
    let spec2 = GOOD
        .replace("n = 1000", "n = 1000\nR = 4\nC = 250")
        .replace(
            "x = { shape = [\"n\"], init = \"uniform(-2, 2)\" }",
            "x = { shape = [\"n\"] }\nlab = { shape = [\"R\", \"C\"], dtype = \"i64\", axis = -1, slices = [{ len = 240, init = \"randint(0, 50)\" }, { len = \"C - 240\", init = \"const(-100)\" }] }",
        );
    let s = load(&write("slices-2d", &spec2)).unwrap();
    let gt = tilegrad::check::ground_truth(&s.forward, &s.inputs, &s.options).unwrap();
    let lab = gt.inputs.iter().find(|(n, _)| n == "lab").unwrap().1.as_i64().unwrap().to_vec();
    for r in 0..4 {
        let row = &lab[r * 250..(r + 1) * 250];
        assert!(row[..240].iter().all(|&v| (0..50).contains(&v)), "row {r}");
        assert!(row[240..].iter().all(|&v| v == -100), "row {r}");
    }
    assert!(lab.iter().filter(|&&v| v >= 0).collect::<std::collections::BTreeSet<_>>().len() > 40);

    // Errors name the key.
    for (tag, from, to, expect) in [
        ("sum", "len = 10,", "len = 11,", "inputs.x.slices: the slices' lengths add up to 1001"),
        ("both", "slices = [", "init = \"normal\", slices = [", "inputs.x: give `init` or `slices`, not both"),
        ("dist", "const(7.5)", "uniform(3, 1)", "inputs.x.slices[1].init: "),
        ("len", "len = 10,", "len = \"m\",", "inputs.x.slices[1].len: `m`"),
        ("axis", "slices = [", "axis = 1, slices = [", "inputs.x.axis: axis 1 of shape [1000]"),
        ("key", "len = 10,", "len = 10, count = 3,", "inputs.x.slices[1].count: unknown key"),
    ] {
        assert!(spec.contains(from), "{tag}");
        let e = load(&write(&format!("slices-{tag}"), &spec.replacen(from, to, 1))).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains(expect), "{tag}: `{e}` lacks `{expect}`");
    }
    let e = load(&write("slices-axis-alone", &GOOD.replace("init = \"uniform(-2, 2)\"", "axis = 0"))).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("inputs.x.axis: `axis` goes with `slices`"), "{e}");
}

/// `tilegrad check` on `spec`: exit status and stderr.
fn check_cli(tag: &str, spec: &str) -> (i32, String) {
    let p = write(tag, spec);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tilegrad")).args(["check", p.to_str().unwrap()]).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_missing_backward_or_gradient_names_its_key() {
    // Found by the mutation campaign: these named neither the table nor the key.
    let no_backward = &GOOD[..GOOD.find("[backward]").unwrap()];
    let cases = [
        (no_backward.to_string(), "s.toml: backward: missing table"),
        (GOOD.replace("gradients = { x = \"grad_x\" }", "gradients = { }"), "s.toml: backward.gradients: "),
        (GOOD.replace("gradients = { x = \"grad_x\" }", "gradients = { x = \"grad_q\" }"), "s.toml: backward.gradients.x = `grad_q`: "),
    ];
    for (i, (spec, expect)) in cases.iter().enumerate() {
        let (code, err) = check_cli(&format!("gradient-key-{i}"), spec);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(expect), "expected `{expect}` in: {err}");
    }
}
