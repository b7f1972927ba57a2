//! The examples written in the style of public kernel libraries (`examples/rms_norm*.toml`,
//! `cross_entropy*.toml`, `activation*.toml`, `rope*.toml`): each exercises Python surface that
//! such libraries use (float, bool, string, `None` and dtype constexprs; `triton.jit` applied as a
//! call; libdevice under a guarded import; helpers imported from a sibling module; `min`/`max`
//! on tensors; early `return` under a runtime `if`).
//!
//! - Each forward, converted from its unedited source and run by the reference interpreter,
//!   matches a plain-Rust f64 reference at sizes that are not multiples of its blocks.
//! - Each forward's ground-truth gradient agrees with central finite differences (`gradcheck`),
//!   its correct backward passes, and each seeded bug (`# BUG:` line) fails naming the gradient
//!   it corrupts.
//! - The spec errors of the new bindings (strings, `None`, dtypes, `jit = true`).

use std::path::{Path, PathBuf};
use std::process::Command;
use tilegrad::check::{check_backward, gradcheck, CheckOptions};
use tilegrad::spec::{self, KernelOverride};
use tilegrad_reference::HostTensor;

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(format!("{name}.toml"))
}

/// Named tensors as f64 values and shapes.
type Inputs = Vec<(String, Vec<f64>, Vec<usize>)>;

/// The forward's inputs and outputs, by name, as f64.
fn forward(name: &str) -> (Inputs, Vec<(String, Vec<f64>)>) {
    let s = spec::load(&example(name)).unwrap_or_else(|e| panic!("{e}"));
    let (i, o) = tilegrad::check::run_forward(&s.forward, &s.inputs, 0).unwrap_or_else(|e| panic!("{name}: {e}"));
    let f = |t: &HostTensor| t.to_f64_vec();
    (i.iter().map(|(n, t)| (n.clone(), f(t), t.shape().to_vec())).collect(), o.iter().map(|(n, t)| (n.clone(), f(t))).collect())
}

fn get<'a, T>(v: &'a [(String, Vec<f64>, T)], n: &str) -> &'a [f64] {
    &v.iter().find(|x| x.0 == n).unwrap_or_else(|| panic!("no `{n}`")).1
}

fn out<'a>(v: &'a [(String, Vec<f64>)], n: &str) -> &'a [f64] {
    &v.iter().find(|x| x.0 == n).unwrap_or_else(|| panic!("no output `{n}`")).1
}

/// `|got - expected| <= tol * max(1, max|expected|)` everywhere, and the data is not trivial.
fn close(what: &str, got: &[f64], expected: &[f64], tol: f64) {
    assert_eq!(got.len(), expected.len(), "{what}: length");
    assert!(expected.iter().filter(|x| x.abs() > 1e-6).count() > expected.len() / 2, "{what}: mostly zero reference");
    let scale = expected.iter().fold(1.0f64, |m, x| m.max(x.abs()));
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!((g - e).abs() <= tol * scale, "{what}[{i}]: got {g}, expected {e}");
    }
}

// ---------------------------------------------------------------- forwards against references

#[test]
fn rms_norm_forward_matches_reference() {
    for (name, rows, cols, offset, tol) in [("rms_norm", 37, 300, 0.0, 1e-5), ("rms_norm_f16", 19, 200, 1.0, 4e-3)] {
        let (i, o) = forward(name);
        let (x, w) = (get(&i, "x"), get(&i, "w"));
        let (mut y, mut rstd) = (vec![0.0; rows * cols], vec![0.0; rows]);
        for r in 0..rows {
            let row = &x[r * cols..(r + 1) * cols];
            let rs = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / cols as f64 + 1e-6).sqrt();
            rstd[r] = rs;
            for c in 0..cols {
                y[r * cols + c] = row[c] * rs * (offset + w[c]);
            }
        }
        close(&format!("{name} y"), out(&o, "y"), &y, tol);
        close(&format!("{name} rstd"), out(&o, "rstd"), &rstd, 1e-5);
    }
}

#[test]
fn cross_entropy_forward_matches_reference_with_ignored_rows() {
    for (name, rows, cols, mean) in [("cross_entropy", 40, 300, true), ("cross_entropy_sum", 23, 77, false)] {
        let (i, o) = forward(name);
        let (x, labels) = (get(&i, "x"), get(&i, "labels"));
        assert!(labels.iter().filter(|&&l| l == -100.0).count() >= 5, "{name}: the labels must ignore some rows");
        let loss: Vec<f64> = (0..rows)
            .map(|r| {
                if labels[r] == -100.0 {
                    return 0.0;
                }
                let row = &x[r * cols..(r + 1) * cols];
                let m = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
                let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
                let l = lse - row[labels[r] as usize];
                if mean {
                    l / rows as f64
                } else {
                    l
                }
            })
            .collect();
        let got = out(&o, "loss");
        for r in 0..rows {
            if labels[r] == -100.0 {
                assert_eq!(got[r], 0.0, "{name}: ignored row {r} stores exactly zero");
            }
        }
        close(&format!("{name} loss"), got, &loss, 1e-5);
    }
}

#[test]
fn activation_forwards_match_reference() {
    let gelu = |x: f64| 0.5 * x * (1.0 + (0.7978845608028654 * (x + 0.044715 * x * x * x)).tanh());
    for (name, f, tol) in [
        ("activation", &(|x: f64| if x >= 0.0 { x } else { 0.1 * x }) as &dyn Fn(f64) -> f64, 1e-6),
        ("activation_relu6", &|x: f64| x.clamp(0.0, 6.0), 1e-6),
        ("activation_gelu_bf16", &gelu, 8e-3),
        ("activation_identity", &|x: f64| x, 0.0),
    ] {
        let (i, o) = forward(name);
        let y: Vec<f64> = get(&i, "x").iter().map(|&x| f(x)).collect();
        close(name, out(&o, "y"), &y, tol);
    }
}

#[test]
fn rope_forward_matches_reference() {
    for (name, tol) in [("rope", 2e-3), ("rope_self", 1e-6)] {
        let (i, o) = forward(name);
        let (q, qs) = (get(&i, "q"), &i.iter().find(|x| x.0 == "q").unwrap().2);
        let (cos, sin, seq) = (get(&i, "cos"), get(&i, "sin"), i.iter().find(|x| x.0 == "cos").unwrap().2[0]);
        let (t, h, d) = (qs[0], qs[1], qs[2]);
        let half = d / 2;
        let mut y = vec![0.0; q.len()];
        for ti in 0..t {
            let s = ti % seq;
            for hi in 0..h {
                let base = (ti * h + hi) * d;
                for c in 0..half {
                    let (x1, x2) = (q[base + c], q[base + half + c]);
                    let (co, si) = (cos[s * half + c], sin[s * half + c]);
                    y[base + c] = x1 * co - x2 * si;
                    y[base + half + c] = x2 * co + x1 * si;
                }
            }
        }
        close(name, out(&o, "out"), &y, tol);
    }
}

// ---------------------------------------------------------------- checks, gradchecks, seeded bugs

const SPECS: &[&str] = &[
    "rms_norm",
    "rms_norm_f16",
    "cross_entropy",
    "cross_entropy_sum",
    "activation",
    "activation_relu6",
    "activation_gelu_bf16",
    "activation_identity",
    "rope",
    "rope_self",
];

#[test]
fn correct_backwards_pass_and_ground_truths_match_finite_differences() {
    for name in SPECS {
        let s = spec::load(&example(name)).unwrap_or_else(|e| panic!("{e}"));
        let r = check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &CheckOptions::default()).unwrap();
        assert!(r.passed && r.gradients.len() == s.forward.differentiable.len(), "{name}:\n{r}");
        let g = gradcheck(&s.forward, &s.inputs, &CheckOptions::default(), name).unwrap();
        assert!(g.passed && !g.trials.is_empty(), "{name}:\n{g}");
    }
}

/// Spec, broken variant of its `bwd`, the gradient tensor the report must name as failing (and
/// the one it must not).
const BROKEN: &[(&str, &str, &str, Option<&str>)] = &[
    ("rms_norm", "_rms_norm_backward_kernel_broken_dw", "grad_w", Some("grad_x")),
    ("rms_norm_f16", "_rms_norm_backward_kernel_broken_no_offset", "grad_x", Some("grad_w")),
    ("cross_entropy", "liger_cross_entropy_bwd_kernel_broken_ignored", "grad_x", None),
    ("cross_entropy", "liger_cross_entropy_bwd_kernel_broken_reduction", "grad_x", None),
    ("activation", "_activation_bwd_broken_slope", "grad_x", None),
    ("activation_gelu_bf16", "_activation_bwd_broken_gelu", "grad_x", None),
    ("rope", "_rope_backward_broken_sign", "grad_q", None),
];

#[test]
fn seeded_bugs_fail_naming_the_right_gradient() {
    for &(name, variant, bad, good) in BROKEN {
        let o = [KernelOverride { key: "bwd".into(), reference: format!("::{variant}") }];
        let s = spec::load_with(&example(name), &o).unwrap_or_else(|e| panic!("{e}"));
        let r = check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &CheckOptions::default()).unwrap();
        assert!(!r.passed, "{name} with {variant} passes:\n{r}");
        let failed: Vec<&str> = r.gradients.iter().filter(|g| !g.passed).map(|g| g.tensor.as_str()).collect();
        assert!(failed.contains(&bad), "{name} with {variant}: failing {failed:?}, expected {bad}\n{r}");
        if let Some(g) = good {
            assert!(!failed.contains(&g), "{name} with {variant}: {g} should pass\n{r}");
        }
    }
    // The ignored rows of the broken cross entropy are never written: the report says so.
    let o = [KernelOverride { key: "bwd".into(), reference: "::liger_cross_entropy_bwd_kernel_broken_ignored".into() }];
    let s = spec::load_with(&example("cross_entropy"), &o).unwrap();
    let r = check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &CheckOptions::default()).unwrap();
    assert!(r.to_string().contains("never written"), "{r}");
}

// ---------------------------------------------------------------- spec errors of the new bindings

/// Writes `text` as a spec beside the examples' kernels (in a fresh temporary directory holding a
/// copy of `examples/triton`) and loads it.
fn load_text(tag: &str, text: &str) -> Result<spec::Spec, String> {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("surface-spec-{tag}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("triton")).unwrap();
    for e in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/triton")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.join("triton").join(p.file_name().unwrap())).unwrap();
    }
    let p = dir.join("s.toml");
    std::fs::write(&p, text).unwrap();
    let r = spec::load(&p).map_err(|e| e.to_string());
    let _ = std::fs::remove_dir_all(&dir);
    r
}

const ACT: &str = r#"
[kernels]
fwd = "triton/activation.py::activation_fwd"
[inputs]
x = { shape = [100] }
[forward]
outputs = ["y"]
steps = [
  { alloc = "y", like = "x" },
  { launch = "fwd", grid = [1], args = { X = "x", Y = "y", n_elements = 100, BLOCK = 128, ACTIVATION = ACT } },
]
"#;

#[test]
fn spec_bindings_of_strings_none_and_dtypes() {
    assert!(load_text("ok", &ACT.replace("ACT }", "\"'relu6'\" }")).is_ok());
    assert!(load_text("none", &ACT.replace("ACT }", "\"None\" }")).is_ok());
    let e = load_text("bare", &ACT.replace("ACT }", "\"relu6\" }")).unwrap_err();
    assert!(e.contains("args.ACTIVATION") && e.contains("unknown name `relu6`") && e.contains("written quoted"), "{e}");
    let e = load_text("noparam", &ACT.replace("ACT }", "\"'relu6'\", MODE = \"'x'\" }")).unwrap_err();
    assert!(e.contains("args.MODE") && e.contains("no constexpr parameter `MODE`"), "{e}");
    let e = load_text("runtime", &ACT.replace("ACT }", "\"'relu6'\" }").replace("n_elements = 100", "n_elements = \"tl.float16\""))
        .unwrap_err();
    assert!(e.contains("args.n_elements") && e.contains("no constexpr parameter"), "{e}");
    // A float bound to a float constexpr is a value, not the old "has no value" error.
    assert!(load_text("float", &ACT.replace("ACT }", "\"'leaky_relu'\", negative_slope = 0.2 }")).is_ok());
    // A kernel under an unknown decorator needs `jit = true`.
    let wrapped = "import triton\nimport triton.language as tl\nfrom somewhere import my_decorator\n\n@my_decorator\ndef k(X, Y, n_elements, BLOCK: tl.constexpr):\n    offs = tl.arange(0, BLOCK)\n    tl.store(Y + offs, tl.load(X + offs, mask=offs < n_elements), mask=offs < n_elements)\n";
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("surface-jit");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("k.py"), wrapped).unwrap();
    let spec_text = |jit: &str| {
        format!("[kernels]\nfwd = {{ kernel = \"k.py::k\"{jit} }}\n[inputs]\nx = {{ shape = [100] }}\n[forward]\noutputs = [\"y\"]\nsteps = [\n  {{ alloc = \"y\", like = \"x\" }},\n  {{ launch = \"fwd\", grid = [1], args = {{ X = \"x\", Y = \"y\", n_elements = 100, BLOCK = 128 }} }},\n]\n")
    };
    std::fs::write(dir.join("s.toml"), spec_text("")).unwrap();
    let e = spec::load(&dir.join("s.toml")).unwrap_err().to_string();
    assert!(e.contains("kernels.fwd") && e.contains("@my_decorator") && e.contains("jit = true"), "{e}");
    std::fs::write(dir.join("s.toml"), spec_text(", jit = true")).unwrap();
    assert!(spec::load(&dir.join("s.toml")).is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------- spec: cotangents, arange, None

#[test]
fn cotangents_per_output_and_arange_inputs() {
    let text = ACT
        .replace("ACT }", "\"'leaky_relu'\", negative_slope = 0.25 }")
        .replace("x = { shape = [100] }", "x = { shape = [100], init = \"arange(-5, 0.1)\" }")
        .replace("outputs = [\"y\"]", "outputs = [\"y\"]\ncotangents = { y = \"const(1)\" }");
    let s = load_text("cot", &text).unwrap_or_else(|e| panic!("{e}"));
    let g = tilegrad::check::ground_truth(&s.forward, &s.inputs, &CheckOptions::default()).unwrap();
    let x = g.inputs.iter().find(|(n, _)| n == "x").unwrap().1.to_f64_vec();
    for (i, v) in x.iter().enumerate() {
        assert!((v - (-5.0 + 0.1 * i as f64)).abs() < 1e-6, "x[{i}] = {v}");
    }
    let cot = g.cotangents.iter().find(|(n, _)| n == "y").unwrap().1.to_f64_vec();
    assert!(cot.iter().all(|&c| c == 1.0));
    // With a cotangent of ones the gradient is the activation's derivative.
    let grad = g.gradients.iter().find(|(n, _)| n == "x").unwrap().1.to_f64_vec();
    for (xi, gi) in x.iter().zip(&grad) {
        let want = if *xi >= 0.0 { 1.0 } else { 0.25 };
        assert!((gi - want).abs() < 1e-12, "x = {xi}: {gi}");
    }
    // Errors: an unknown output, a bad distribution, a file of the wrong shape.
    let e = load_text("cot-bad", &text.replace("cotangents = { y = ", "cotangents = { z = ")).unwrap_err();
    assert!(e.contains("forward.cotangents.z") && e.contains("not an output"), "{e}");
    let e = load_text("cot-dist", &text.replace("const(1)", "poisson(1)")).unwrap_err();
    assert!(e.contains("forward.cotangents.y") && e.contains("arange"), "{e}");
    let labels = text.replace("init = \"arange(-5, 0.1)\"", "init = \"arange(3, 2, 7)\", dtype = \"i32\"");
    let s = load_text("arange-mod", &labels.replace("cotangents = { y = \"const(1)\" }", "")).map(|s| s.inputs);
    // An i32 x cannot feed a float kernel, but the input itself materialises as a cycling ramp.
    let inputs = s.unwrap_or_else(|e| panic!("{e}"));
    let env = tilegrad::check::run_forward(&tilegrad::check::Forward::new(&[], &[]), &inputs, 0).unwrap().0;
    let v = env.iter().find(|(n, _)| n == "x").unwrap().1.to_f64_vec();
    assert_eq!(&v[..6], &[3.0, 5.0, 0.0, 2.0, 4.0, 6.0]);
}

#[test]
fn none_for_an_optional_pointer_folds_its_branch() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("surface-none");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("k.py"),
        "import triton\nimport triton.language as tl\n\n@triton.jit\ndef _bias_act(X, B, Y, n, BLOCK: tl.constexpr):\n    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n    m = offs < n\n    x = tl.load(X + offs, mask=m)\n    if B is not None:\n        x = x + tl.load(B + offs, mask=m)\n    tl.store(Y + offs, x * x, mask=m)\n",
    )
    .unwrap();
    let spec_text = |b: &str| {
        format!("[kernels]\nfwd = \"k.py::_bias_act\"\n[inputs]\nx = {{ shape = [50] }}\nb = {{ shape = [50] }}\n[forward]\ndifferentiable = [\"x\"]\noutputs = [\"y\"]\ncotangents = {{ y = \"const(1)\" }}\nsteps = [\n  {{ alloc = \"y\", like = \"x\" }},\n  {{ launch = \"fwd\", grid = [2], args = {{ X = \"x\", B = {b}, Y = \"y\", n = 50, BLOCK = 32 }} }},\n]\n")
    };
    for (b, with_bias) in [("\"None\"", false), ("\"b\"", true)] {
        std::fs::write(dir.join("s.toml"), spec_text(b)).unwrap();
        let s = spec::load(&dir.join("s.toml")).unwrap_or_else(|e| panic!("{e}"));
        let g = tilegrad::check::ground_truth(&s.forward, &s.inputs, &CheckOptions::default()).unwrap();
        let x = g.inputs.iter().find(|(n, _)| n == "x").unwrap().1.to_f64_vec();
        let bias = g.inputs.iter().find(|(n, _)| n == "b").unwrap().1.to_f64_vec();
        let grad = g.gradients.iter().find(|(n, _)| n == "x").unwrap().1.to_f64_vec();
        for i in 0..50 {
            let v = x[i] + if with_bias { bias[i] } else { 0.0 };
            assert!((grad[i] - 2.0 * v).abs() < 1e-9, "bias {with_bias}, [{i}]: {} vs {}", grad[i], 2.0 * v);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cli_ir_names_pointers_and_binds_every_constexpr_kind() {
    let bin = env!("CARGO_BIN_EXE_tilegrad");
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/triton/activation.py");
    let k = format!("{}::activation_fwd", file.display());
    let run = |extra: &[&str]| {
        let o = Command::new(bin).arg("ir").arg(&k).args(extra).output().unwrap();
        (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let (code, out, err) =
        run(&["--ptr", "X=f16", "--ptr", "Y=bf16", "--const", "ACTIVATION=relu6", "--const", "negative_slope=0.2", "--const", "BLOCK=128"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("ptr<f16>") && out.contains("ptr<bf16>") && out.contains("min") && out.contains("max"), "{out}");
    // Without --ptr, `Y` is a scalar: the error says how to make it a pointer, at its line.
    let (code, _, err) = run(&["--const", "BLOCK=128"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("activation.py:25:32") && err.contains("--ptr NAME=DTYPE"), "{err}");
    let (code, _, err) = run(&["--ptr", "X=f8", "--const", "BLOCK=128"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("unknown dtype `f8`"), "{err}");
}
