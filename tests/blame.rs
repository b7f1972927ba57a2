//! Blame that leads to the bug's line: for broken backwards whose bug is not on the line of the
//! store (two assignments above it, in a loop accumulator, in a helper function, in an earlier
//! launch, an overflowing `exp`, a wrong mask), the report's data-flow slice of the worst element
//! names the line carrying `# BUG:`, among at most a dozen lines, in the text report and in JSON.

use tilegrad::check::{check_backward, Backward, CheckOptions, Dist, Forward, Inputs, KernelLaunch, Report, Slice, Step};
use tilegrad_ir::triton::{convert, ConvertOptions};
use tilegrad_ir::{DType, Kernel};

/// Forwards and broken backwards. Each `_broken_` kernel carries one `# BUG:` line.
const SRC: &str = r#"import triton
import triton.language as tl


@triton.jit
def cube_scaled(x_ptr, w_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    w = tl.load(w_ptr + offs, mask=m)
    tl.store(y_ptr + offs, x * x * x * w, mask=m)


@triton.jit
def cube_scaled_bwd_broken_far(x_ptr, w_ptr, gy_ptr, gx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    w = tl.load(w_ptr + offs, mask=m)
    gy = tl.load(gy_ptr + offs, mask=m)
    x2 = x * x * 2.0  # BUG: d(x^3)/dx is 3 x^2, not 2 x^2
    scaled = x2 * w
    gx = scaled * gy
    tl.store(gx_ptr + offs, gx, mask=m)


@triton.jit
def _dcube(x):
    return 3.0 * x + x  # BUG: 3 x + x instead of 3 x * x


@triton.jit
def cube_scaled_bwd_broken_helper(x_ptr, w_ptr, gy_ptr, gx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    w = tl.load(w_ptr + offs, mask=m)
    gy = tl.load(gy_ptr + offs, mask=m)
    tl.store(gx_ptr + offs, _dcube(x) * w * gy, mask=m)


@triton.jit
def cube_scaled_bwd_stage_one_broken(w_ptr, gy_ptr, t_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    w = tl.load(w_ptr + offs, mask=m)
    gy = tl.load(gy_ptr + offs, mask=m)
    tl.store(t_ptr + offs, gy + w, mask=m)  # BUG: the cotangent is added to the weight, not multiplied


@triton.jit
def cube_scaled_bwd_stage_two(x_ptr, t_ptr, gx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    t = tl.load(t_ptr + offs, mask=m)
    gx = 3.0 * x * x * t
    tl.store(gx_ptr + offs, gx, mask=m)


@triton.jit
def weighted_rows(x_ptr, w_ptr, y_ptr, R, C, BLOCK_C: tl.constexpr):
    r = tl.program_id(0)
    acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        x = tl.load(x_ptr + r * C + cols, mask=cols < C, other=0.0)
        w = tl.load(w_ptr + cols, mask=cols < C, other=0.0)
        acc += x * w
    tl.store(y_ptr + r, tl.sum(acc, axis=0))


@triton.jit
def weighted_rows_bwd_w_broken_acc(x_ptr, gy_ptr, gw_ptr, R, C, BLOCK_C: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for r in range(0, R):
        gy = tl.load(gy_ptr + r)
        x = tl.load(x_ptr + r * C + cols, mask=cols < C, other=0.0)
        acc += gy * x * x  # BUG: the row's x enters twice
    total = acc * 1.0
    tl.store(gw_ptr + cols, total, mask=cols < C)


@triton.jit
def weighted_rows_bwd_x(w_ptr, gy_ptr, gx_ptr, R, C, BLOCK_C: tl.constexpr):
    r = tl.program_id(0)
    gy = tl.load(gy_ptr + r)
    for c0 in range(0, C, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        w = tl.load(w_ptr + cols, mask=cols < C, other=0.0)
        tl.store(gx_ptr + r * C + cols, gy * w, mask=cols < C)


@triton.jit
def gate(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    tl.store(y_ptr + offs, tl.sigmoid(x), mask=m)


@triton.jit
def gate_bwd_broken_exp(x_ptr, gy_ptr, gx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    gy = tl.load(gy_ptr + offs, mask=m)
    e = tl.exp(x)  # BUG: overflows for x > 88; sigmoid must be computed from exp(-|x|)
    s = e / (1.0 + e)
    ds = s * (1.0 - s)
    tl.store(gx_ptr + offs, ds * gy, mask=m)


@triton.jit
def lower_rows(x_ptr, y_ptr, R, C, BLOCK_C: tl.constexpr):
    r = tl.program_id(0)
    cols = tl.arange(0, BLOCK_C)
    x = tl.load(x_ptr + r * C + cols, mask=cols < C, other=0.0)
    keep = cols <= r
    tl.store(y_ptr + r, tl.sum(tl.where(keep, x * x, 0.0), axis=0))


@triton.jit
def lower_rows_bwd_broken_mask(x_ptr, gy_ptr, gx_ptr, R, C, BLOCK_C: tl.constexpr):
    r = tl.program_id(0)
    cols = tl.arange(0, BLOCK_C)
    x = tl.load(x_ptr + r * C + cols, mask=cols < C, other=0.0)
    gy = tl.load(gy_ptr + r)
    keep = cols < r  # BUG: off by one, the diagonal is dropped
    g = 2.0 * x * gy
    gx = tl.where(keep, g, 0.0)
    tl.store(gx_ptr + r * C + cols, gx, mask=cols < C)
"#;

/// The source written to a file, so that reports quote its lines.
fn source_file() -> String {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("blame");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("broken_bwd.py");
    if std::fs::read_to_string(&p).ok().as_deref() != Some(SRC) {
        // Written beside and renamed, so that a test reading the file never sees half of it.
        let part = dir.join(format!("broken_bwd.py.{:?}", std::thread::current().id()));
        std::fs::write(&part, SRC).unwrap();
        std::fs::rename(&part, &p).unwrap();
    }
    p.display().to_string()
}

/// The line of `SRC` (1-based) carrying `# BUG:` inside `def name` (or in a helper it names).
fn bug_line(name: &str) -> u32 {
    let lines: Vec<&str> = SRC.lines().collect();
    let def = lines.iter().position(|l| l.starts_with(&format!("def {name}("))).unwrap();
    let end = def + 1 + lines[def + 1..].iter().position(|l| l.starts_with("def ") || l.starts_with('@')).unwrap_or(lines.len() - def - 1);
    (def..end).find(|&i| lines[i].contains("# BUG:")).map(|i| i as u32 + 1).unwrap_or_else(|| panic!("no BUG line in {name}"))
}

fn k(name: &str, consts: &[(&str, i64)]) -> Kernel {
    convert(SRC, &source_file(), name, &ConvertOptions::with_constexprs(consts)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn launch(kernel: Kernel, grid: &str, args: &[(&str, &str)]) -> Step {
    let mut l = KernelLaunch::new(kernel, &[grid]).unwrap();
    for (p, v) in args {
        l = l.arg(p, v).unwrap();
    }
    Step::Launch(l)
}

fn run(f: &Forward, b: &Backward, i: &Inputs) -> Report {
    let r = check_backward(f, b, i, &CheckOptions { trials: 1, ..CheckOptions::default() }).unwrap();
    assert!(!r.passed, "{r}");
    assert!(r.failure.is_none(), "{r}");
    r
}

/// The slice of the worst element of the failing gradient of `input`.
fn slice<'r>(r: &'r Report, input: &str) -> &'r Slice {
    let g = r.gradients.iter().find(|g| g.name == input).unwrap();
    assert!(!g.passed, "{r}");
    g.worst.as_ref().and_then(|w| w.blame.as_ref()).and_then(|b| b.slice.as_ref()).unwrap_or_else(|| panic!("no slice:\n{r}"))
}

/// The lines (of the source file) a slice names: its lines, and the first non-finite value.
fn named(s: &Slice) -> Vec<u32> {
    let file = source_file();
    let mut out: Vec<u32> = s
        .lines
        .iter()
        .filter_map(|l| l.loc.strip_prefix(&format!("{file}:")).and_then(|r| r.split(':').next()).and_then(|n| n.parse().ok()))
        .collect();
    if let Some(n) = &s.nonfinite {
        if let Some(at) = n.find(&format!("{file}:")) {
            let rest = &n[at + file.len() + 1..];
            out.extend(rest.split(':').next().and_then(|l| l.parse::<u32>().ok()));
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The bug's line is named, with its source text, among at most a dozen lines; JSON carries it.
fn assert_points_at(r: &Report, input: &str, variant: &str) {
    let s = slice(r, input);
    let bug = bug_line(variant);
    let lines = named(s);
    assert!(lines.contains(&bug), "`{variant}`: the bug's line {bug} is not among {lines:?}\n{r}");
    assert!(lines.len() <= 12, "`{variant}`: {} lines named\n{r}", lines.len());
    let text = r.to_string();
    assert!(text.contains(&format!("broken_bwd.py:{bug} ")) || text.contains(&format!("broken_bwd.py:{bug}:")), "{text}");
    assert!(text.lines().any(|l| l.contains("# BUG:")), "the bug's source line is quoted:\n{text}");
    let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    let g = json["gradients"].as_array().unwrap().iter().find(|g| g["name"] == input).unwrap();
    let jl = g["worst"]["blame"]["slice"]["lines"].as_array().unwrap();
    assert_eq!(jl.len(), s.lines.len());
    assert!(jl.iter().all(|l| l["loc"].is_string() && l["op"].is_string() && l["source"].is_string()), "{json}");
}

fn cube_case(bwd: Vec<Step>, extra: Option<Step>) -> (Forward, Backward, Inputs) {
    let fwd = Forward::new(&["x"], &["y"]).step(Step::alloc("y", &["n"], DType::F32).unwrap()).step(launch(
        k("cube_scaled", &[("BLOCK", 128)]),
        "cdiv(n, 128)",
        &[("x_ptr", "x"), ("w_ptr", "w"), ("y_ptr", "y"), ("n", "n")],
    ));
    let mut b = Backward::new(&[("x", "grad_x")]).step(Step::alloc("grad_x", &["n"], DType::F32).unwrap());
    if let Some(e) = extra {
        b = b.step(e);
    }
    for s in bwd {
        b = b.step(s);
    }
    let inputs = Inputs::new().constant_int("n", 1000).random("x", DType::F32, &[1000], Dist::Normal { mean: 0.0, std: 1.5 }).random(
        "w",
        DType::F32,
        &[1000],
        Dist::Normal { mean: 1.0, std: 0.5 },
    );
    (fwd, b, inputs)
}

fn cube_bwd(name: &str) -> Step {
    launch(
        k(name, &[("BLOCK", 128)]),
        "cdiv(n, 128)",
        &[("x_ptr", "x"), ("w_ptr", "w"), ("gy_ptr", "grad_y"), ("gx_ptr", "grad_x"), ("n", "n")],
    )
}

#[test]
fn a_bug_two_assignments_above_the_store_is_named() {
    let (f, b, i) = cube_case(vec![cube_bwd("cube_scaled_bwd_broken_far")], None);
    let r = run(&f, &b, &i);
    assert_points_at(&r, "x", "cube_scaled_bwd_broken_far");
    // The element's values are shown: the store's value is the reported one.
    let s = slice(&r, "x");
    let got = r.gradients[0].worst.as_ref().unwrap().got;
    assert!(s.lines.iter().any(|l| l.value.is_some_and(|v| (v - got).abs() <= 1e-6 * got.abs().max(1.0))), "{r}");
}

#[test]
fn a_bug_in_a_helper_function_is_named_at_its_own_line() {
    let (f, b, i) = cube_case(vec![cube_bwd("cube_scaled_bwd_broken_helper")], None);
    let r = run(&f, &b, &i);
    assert_points_at(&r, "x", "_dcube");
}

#[test]
fn a_bug_in_an_earlier_launch_is_followed_there() {
    let stage1 = launch(
        k("cube_scaled_bwd_stage_one_broken", &[("BLOCK", 128)]),
        "cdiv(n, 128)",
        &[("w_ptr", "w"), ("gy_ptr", "grad_y"), ("t_ptr", "t"), ("n", "n")],
    );
    let stage2 = launch(
        k("cube_scaled_bwd_stage_two", &[("BLOCK", 64)]),
        "cdiv(n, 64)",
        &[("x_ptr", "x"), ("t_ptr", "t"), ("gx_ptr", "grad_x"), ("n", "n")],
    );
    let (f, b, i) = cube_case(vec![stage1, stage2], Some(Step::alloc("t", &["n"], DType::F32).unwrap()));
    let r = run(&f, &b, &i);
    assert_points_at(&r, "x", "cube_scaled_bwd_stage_one_broken");
    let s = slice(&r, "x");
    // The line of the later launch that read the intermediate says who wrote what it read.
    assert!(
        s.lines.iter().any(|l| l.kernel == "cube_scaled_bwd_stage_two"
            && l.note.as_deref().is_some_and(|n| n.contains("`t`") && n.contains("cube_scaled_bwd_stage_one_broken"))),
        "{r}"
    );
    assert!(s.lines.iter().any(|l| l.kernel == "cube_scaled_bwd_stage_one_broken" && l.step == 2), "{r}");
}

#[test]
fn a_bug_in_a_loop_accumulator_is_named_not_the_loop_header() {
    let fwd = Forward::new(&["x", "w"], &["y"]).step(Step::alloc("y", &["R"], DType::F32).unwrap()).step(launch(
        k("weighted_rows", &[("BLOCK_C", 32)]),
        "R",
        &[("x_ptr", "x"), ("w_ptr", "w"), ("y_ptr", "y"), ("R", "R"), ("C", "C")],
    ));
    let bwd = Backward::new(&[("x", "grad_x"), ("w", "grad_w")])
        .step(Step::alloc("grad_x", &["R", "C"], DType::F32).unwrap())
        .step(Step::alloc("grad_w", &["C"], DType::F32).unwrap())
        .step(launch(
            k("weighted_rows_bwd_x", &[("BLOCK_C", 32)]),
            "R",
            &[("w_ptr", "w"), ("gy_ptr", "grad_y"), ("gx_ptr", "grad_x"), ("R", "R"), ("C", "C")],
        ))
        .step(launch(
            k("weighted_rows_bwd_w_broken_acc", &[("BLOCK_C", 32)]),
            "cdiv(C, 32)",
            &[("x_ptr", "x"), ("gy_ptr", "grad_y"), ("gw_ptr", "grad_w"), ("R", "R"), ("C", "C")],
        ));
    let inputs = Inputs::new()
        .constant_int("R", 37)
        .constant_int("C", 90)
        .random("x", DType::F32, &[37, 90], Dist::Normal { mean: 0.0, std: 1.0 })
        .random("w", DType::F32, &[90], Dist::Normal { mean: 0.0, std: 1.0 });
    let r = run(&fwd, &bwd, &inputs);
    assert!(r.gradients[0].passed, "{r}");
    assert_points_at(&r, "w", "weighted_rows_bwd_w_broken_acc");
    let s = slice(&r, "w");
    assert!(!s.lines.iter().any(|l| l.source.starts_with("for ")), "the loop header is not a line of the slice:\n{r}");
}

#[test]
fn an_overflowing_exp_is_named_with_its_operand() {
    let fwd = Forward::new(&["x"], &["y"]).step(Step::alloc("y", &["n"], DType::F32).unwrap()).step(launch(
        k("gate", &[("BLOCK", 128)]),
        "cdiv(n, 128)",
        &[("x_ptr", "x"), ("y_ptr", "y"), ("n", "n")],
    ));
    let bwd = Backward::new(&[("x", "grad_x")]).step(Step::alloc("grad_x", &["n"], DType::F32).unwrap()).step(launch(
        k("gate_bwd_broken_exp", &[("BLOCK", 128)]),
        "cdiv(n, 128)",
        &[("x_ptr", "x"), ("gy_ptr", "grad_y"), ("gx_ptr", "grad_x"), ("n", "n")],
    ));
    let inputs = Inputs::new().constant_int("n", 700).random("x", DType::F32, &[700], Dist::Normal { mean: 0.0, std: 60.0 });
    let r = run(&fwd, &bwd, &inputs);
    assert!(r.gradients[0].nan > 0, "{r}");
    assert_points_at(&r, "x", "gate_bwd_broken_exp");
    let s = slice(&r, "x");
    let n = s.nonfinite.as_deref().unwrap_or_else(|| panic!("no non-finite origin:\n{r}"));
    assert!(n.starts_with("`exp` at ") && n.contains(&format!("broken_bwd.py:{}:", bug_line("gate_bwd_broken_exp"))), "{n}");
    // Its operand, the x that overflowed (above ln(f32::MAX) = 88.7).
    let x: f64 = n.split("exp(").nth(1).and_then(|r| r.split(')').next()).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{n}"));
    assert!(x > 88.7, "{n}");
    assert_eq!(s.lines[0].note.as_deref(), Some("first non-finite value"), "{r}");
    // The JSON finding carries the same origin.
    let f = r.findings.iter().find(|f| f.name.as_deref() == Some("x")).unwrap_or_else(|| panic!("no finding for x:\n{r}"));
    assert_eq!(f.origin.as_deref(), Some(n), "{r}");
}

#[test]
fn a_wrong_mask_is_named_as_what_decided_the_element() {
    let fwd = Forward::new(&["x"], &["y"]).step(Step::alloc("y", &["R"], DType::F32).unwrap()).step(launch(
        k("lower_rows", &[("BLOCK_C", 64)]),
        "R",
        &[("x_ptr", "x"), ("y_ptr", "y"), ("R", "R"), ("C", "C")],
    ));
    let bwd = Backward::new(&[("x", "grad_x")]).step(Step::alloc("grad_x", &["R", "C"], DType::F32).unwrap()).step(launch(
        k("lower_rows_bwd_broken_mask", &[("BLOCK_C", 64)]),
        "R",
        &[("x_ptr", "x"), ("gy_ptr", "grad_y"), ("gx_ptr", "grad_x"), ("R", "R"), ("C", "C")],
    ));
    let inputs = Inputs::new().constant_int("R", 50).constant_int("C", 50).random("x", DType::F32, &[50, 50], Dist::default());
    let r = run(&fwd, &bwd, &inputs);
    assert_points_at(&r, "x", "lower_rows_bwd_broken_mask");
    let s = slice(&r, "x");
    let w = r.gradients[0].worst.as_ref().unwrap();
    assert_eq!(w.index[0], w.index[1], "the worst element is on the dropped diagonal:\n{r}");
    assert!(s.decided_by.iter().any(|d| d.starts_with("`where`") && d.contains("condition false")), "{r}");
    assert_eq!(s.lines[0].role, "mask", "a mask comes first when the element looks masked wrongly:\n{r}");
}
