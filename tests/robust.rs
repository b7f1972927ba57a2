//! Hostile and careless inputs: deep or long expressions, overflowing sizes and arithmetic,
//! oversized requests, integers that do not fit, and files that are not UTF-8 are clear errors
//! with their location (spec key, line:column), from the library and as exit status 2 from the
//! command line; never a panic, an abort or a silently wrong input.

use std::path::{Path, PathBuf};
use std::process::Command;
use tilegrad::spec::{load, SpecError};
use tilegrad_reference::Data;

mod stuck_scan;

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
def copy_index(i_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(o_ptr + offs, tl.load(i_ptr + offs, mask=offs < n).to(tl.float32), mask=offs < n)
"#;

const SPEC: &str = r#"
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
  { launch = "fwd", grid = ["cdiv(n, 128)"], args = { x_ptr = "x", y_ptr = "y", n = "n", BLOCK = 128 } },
]

[backward]
gradients = { x = "grad_x" }
steps = [
  { alloc = "grad_x", like = "x" },
  { launch = "bwd", grid = ["cdiv(n, 128)"], args = { gy_ptr = "grad_y", gx_ptr = "grad_x", n = "n", BLOCK = 128 } },
]
"#;

/// Writes `spec` and `kernels` (bytes) into a fresh folder; returns the spec's path.
fn write(tag: &str, spec: &[u8], kernels: &[u8]) -> PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("robust-{tag}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("k.py"), kernels).unwrap();
    let p = dir.join("s.toml");
    std::fs::write(&p, spec).unwrap();
    p
}

/// `SPEC` with `from` replaced by `to` (which must occur).
fn variant(from: &str, to: &str) -> String {
    assert!(SPEC.contains(from), "{from}");
    SPEC.replacen(from, to, 1)
}

fn load_err(tag: &str, spec: &str) -> SpecError {
    match load(&write(tag, spec.as_bytes(), KERNELS.as_bytes())) {
        Ok(_) => panic!("{tag}: expected an error"),
        Err(e) => e,
    }
}

fn tilegrad(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tilegrad")).args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `tilegrad check` on `spec` exits 2 and says `expect`, without a panic.
fn cli_rejects(spec: &Path, expect: &str) {
    let (code, err) = tilegrad(&["check", spec.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(expect) && !err.contains("panicked"), "expected `{expect}` in: {err}");
}

#[test]
fn deep_and_long_spec_expressions() {
    // 33,000 terms evaluate; 8,900 nested parentheses are an error at the key and column.
    let long = vec!["1"; 33_000].join(" + ");
    let p = write("long", variant("n = 1000", &format!("n = \"{long}\"")).as_bytes(), KERNELS.as_bytes());
    let s = load(&p).unwrap();
    assert_eq!(s.inputs.constants[0].1, tilegrad::check::Scalar::Int(33_000));
    let deep = format!("{}1000{}", "(".repeat(8_900), ")".repeat(8_900));
    let spec = variant("n = 1000", &format!("n = \"{deep}\""));
    let e = load_err("deep", &spec);
    assert_eq!(e.key, "constants.n", "{e}");
    assert!(e.message.contains("column 65: expression nested deeper than 64 levels"), "{e}");
    cli_rejects(&write("deep", spec.as_bytes(), KERNELS.as_bytes()), "constants.n: ");
}

#[test]
fn overflowing_integer_arithmetic_in_specs() {
    for (expr, what) in [("(-9223372036854775807 - 1) // -1", "integer overflow"), ("9223372036854775807 * 2", "integer overflow")] {
        let spec = variant("n = 1000", &format!("n = 1000\nbig = \"{expr}\""));
        let e = load_err("ovf", &spec);
        assert_eq!(e.key, "constants.big", "{e}");
        assert!(e.message.contains(what), "{e}");
        cli_rejects(&write("ovf", spec.as_bytes(), KERNELS.as_bytes()), what);
    }
    // Python: -2^63 % -1 == 0.
    let p = write("mod", variant("n = 1000", "n = \"1000 + (-9223372036854775807 - 1) % -1\"").as_bytes(), KERNELS.as_bytes());
    assert_eq!(load(&p).unwrap().inputs.constants[0].1, tilegrad::check::Scalar::Int(1000));
}

#[test]
fn uniform_bounds_that_are_infinite_or_overflow_the_width() {
    let spec = variant("uniform(-2, 2)", "uniform(-inf, inf)");
    let e = load_err("inf", &spec);
    assert_eq!(e.key, "inputs.x.init", "{e}");
    assert!(e.message.contains("the bounds must be finite"), "{e}");
    cli_rejects(&write("inf", spec.as_bytes(), KERNELS.as_bytes()), "inputs.x.init");
    // The library refuses them too.
    let inputs = tilegrad::check::Inputs::new().random(
        "x",
        tilegrad_ir::DType::F32,
        &[4],
        tilegrad::check::Dist::Uniform { lo: f64::NEG_INFINITY, hi: f64::INFINITY },
    );
    let s = load(&write("inf-lib", SPEC.as_bytes(), KERNELS.as_bytes())).unwrap();
    let e = tilegrad::check::run_forward(&s.forward, &inputs, 0).unwrap_err();
    assert!(e.to_string().contains("the bounds must be finite"), "{e}");
    // A width that overflows f64 still draws finite values in range, spread over it.
    let p = write(
        "wide",
        variant(
            "x = { shape = [\"n\"], init = \"uniform(-2, 2)\" }",
            "x = { shape = [\"n\"], dtype = \"f64\", init = \"uniform(-1e308, 1e308)\" }",
        )
        .as_bytes(),
        KERNELS.as_bytes(),
    );
    let s = load(&p).unwrap();
    let (inputs, _) = tilegrad::check::run_forward(&s.forward, &s.inputs, 3).unwrap();
    let x = inputs.iter().find(|(n, _)| n == "x").unwrap().1.as_f64().unwrap().to_vec();
    assert_eq!(x.len(), 1000);
    assert!(x.iter().all(|v| v.is_finite() && (-1e308..1e308).contains(v)), "{x:?}");
    let (neg, big) = (x.iter().filter(|v| **v < 0.0).count(), x.iter().filter(|v| v.abs() > 1e307).count());
    assert!((400..600).contains(&neg) && big > 800, "{neg} negative, {big} above 1e307");
}

#[test]
fn uniform_bounds_past_the_dtypes_range_are_refused_not_drawn_as_infinity() {
    for (dtype, bounds) in [("f32", "uniform(-1e39, 1e39)"), ("f16", "uniform(0, 70000)"), ("f32", "uniform(-1e308, 1e308)")] {
        let spec = variant(
            "x = { shape = [\"n\"], init = \"uniform(-2, 2)\" }",
            &format!("x = {{ shape = [\"n\"], dtype = \"{dtype}\", init = \"{bounds}\" }}"),
        );
        let p = write("dtype-range", spec.as_bytes(), KERNELS.as_bytes());
        for cmd in ["check", "run", "grad"] {
            let out = ["--out", env!("CARGO_TARGET_TMPDIR")];
            let args: Vec<&str> =
                [cmd, p.to_str().unwrap()].into_iter().chain(if cmd == "check" { &[][..] } else { &out[..] }.iter().copied()).collect();
            let (code, err) = tilegrad(&args);
            assert_eq!(code, 2, "{cmd} {bounds}: {err}");
            assert!(err.contains("inputs.x.init") && err.contains("round to infinity"), "{cmd} {bounds}: {err}");
        }
    }
}

/// `tilegrad <args>` under an address-space limit of `kib` KiB (`ulimit -v`): exit code and stderr.
fn tilegrad_limited(kib: u64, args: &[&str]) -> (i32, String) {
    let cmd = format!("ulimit -v {kib} && exec \"$0\" \"$@\"");
    let out = Command::new("sh").arg("-c").arg(cmd).arg(env!("CARGO_BIN_EXE_tilegrad")).args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn inputs_past_the_address_space_limit_are_refused_up_front_not_aborted() {
    let two = variant(
        "x = { shape = [\"n\"], init = \"uniform(-2, 2)\" }",
        "x = { shape = [\"m\"], init = \"uniform(-2, 2)\" }\nz = { shape = [\"m\"], init = \"uniform(-2, 2)\" }",
    )
    .replace("n = 1000", "n = 1000\nm = 700000000");
    let p = write("rlimit-two", two.as_bytes(), KERNELS.as_bytes());
    // 2.6 GiB each fits a 4 GiB address space alone, not together.
    let (code, err) = tilegrad_limited(4 << 20, &["run", p.to_str().unwrap(), "--out", env!("CARGO_TARGET_TMPDIR")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("the inputs need 5.2 GiB of memory together") && err.contains("available"), "{err}");
    let one = variant("n = 1000", "n = 3000000000");
    let p = write("rlimit-one", one.as_bytes(), KERNELS.as_bytes());
    let (code, err) = tilegrad_limited(4 << 20, &["run", p.to_str().unwrap(), "--out", env!("CARGO_TARGET_TMPDIR")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("inputs.x") && err.contains("needs 11.2 GiB of memory"), "{err}");
}

#[test]
fn a_loop_that_stores_one_tile_every_trip_forever_is_a_located_error_in_bounded_memory() {
    let py = KERNELS.replace(
        "@triton.jit\ndef scale_bwd",
        "@triton.jit\ndef spin(x_ptr, y_ptr, n, BLOCK: tl.constexpr):\n    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n    \
         x = tl.load(x_ptr + offs, mask=offs < n)\n    i = 0\n    while i < n:\n        tl.store(y_ptr + offs, x, mask=offs < n)\n        \
         i += 0\n\n@triton.jit\ndef scale_bwd",
    );
    let spec = SPEC.replace("fwd = \"k.py::scale\"", "fwd = \"k.py::spin\"");
    let p = write("spin-store", spec.as_bytes(), py.as_bytes());
    // Under 2 GiB of address space: the store log no longer grows a trip at a time.
    let (code, err) = tilegrad_limited(2 << 20, &["run", p.to_str().unwrap(), "--out", env!("CARGO_TARGET_TMPDIR")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("k.py:") && err.contains("op `while`") && err.contains("can never end"), "{err}");
}

/// Loops of many trips carrying a tile: `x = x * c` (the evaluator's tape) and `x = sin(x)`
/// (a VJP kernel's tape, whose reverse needs every trip's `x`).
const LONG_LOOPS: &str = r#"import triton
import triton.language as tl

@triton.jit
def trips(src_ptr, dst_ptr, n, TRIPS, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(src_ptr + offs, mask=offs < n, other=0.0)
    i = 0
    while i < TRIPS:
        x = x * 1.0000001
        i += 1
    tl.store(dst_ptr + offs, x, mask=offs < n)

@triton.jit
def sin_trips(src_ptr, dst_ptr, n, TRIPS, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(src_ptr + offs, mask=offs < n, other=0.0)
    i = 0
    while i < TRIPS:
        x = tl.sin(x)
        i += 1
    tl.store(dst_ptr + offs, x, mask=offs < n)

@triton.jit
def copy(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)
"#;

/// A spec launching `kernel` of [`LONG_LOOPS`] for `trips` trips on 128 elements (its backward
/// a copy: a wrong gradient, so a verdict of failure).
fn long_loop_spec(kernel: &str, trips: u64) -> String {
    format!(
        r#"
[kernels]
fwd = "k.py::{kernel}"
bwd = "k.py::copy"

[inputs]
x = {{ shape = [128], init = "normal" }}

[forward]
outputs = ["y"]
steps = [
  {{ alloc = "y", like = "x" }},
  {{ launch = "fwd", grid = [1], args = {{ src_ptr = "x", dst_ptr = "y", n = 128, TRIPS = {trips}, BLOCK = 128 }} }},
]

[backward]
gradients = {{ x = "grad_x" }}
steps = [
  {{ alloc = "grad_x", like = "x" }},
  {{ launch = "bwd", grid = [1], args = {{ src_ptr = "grad_y", dst_ptr = "grad_x", n = 128, BLOCK = 128 }} }},
]
"#
    )
}

/// The ground truth of long loops stays within its budgets: the evaluator's tape (4e5 trips of
/// a [128] tile took 450 MB and aborted under 512 MiB; now about 10 MB) and a VJP kernel's tape
/// under `--vjp-memory` (2e5 trips: 1.6 GB at the default budget for a 205 MB tape, 0.6 GB at
/// 64 MiB; now 0.2 GB and 10 MB). Release builds only: the loops take a minute in a debug build
/// (`checkpointed_loop_tapes_give_the_same_gradient` checks the same code on 1,000 trips).
#[test]
fn long_loops_get_a_verdict_within_their_memory_budget() {
    if cfg!(debug_assertions) {
        eprintln!("skipped in a debug build: 4e5 loop trips in the reference take a minute there");
        return;
    }
    let tape = write("long-loop", long_loop_spec("trips", 400_000).as_bytes(), LONG_LOOPS.as_bytes());
    let sin = write("long-sin", long_loop_spec("sin_trips", 200_000).as_bytes(), LONG_LOOPS.as_bytes());
    let (tape, sin) = (tape.to_str().unwrap(), sin.to_str().unwrap());
    for args in [&["check", tape][..], &["check", sin, "--ground", "kernels"], &["check", sin, "--ground", "kernels", "--vjp-memory", "64"]]
    {
        let (code, err) = tilegrad_limited(512 << 10, args);
        assert_eq!(code, 1, "{args:?}: {err}");
    }
}

#[test]
fn trial_counts_of_zero_or_past_the_limit_are_refused_by_every_command() {
    let p = write("trials", SPEC.as_bytes(), KERNELS.as_bytes());
    for cmd in ["check", "gradcheck"] {
        for (trials, expect) in [("0", "at least one cotangent trial"), ("18446744073709551615", "at most 100000")] {
            let (code, err) = tilegrad(&[cmd, p.to_str().unwrap(), "--trials", trials]);
            assert_eq!(code, 2, "{cmd} --trials {trials}: {err}");
            assert!(err.contains(expect), "{cmd} --trials {trials}: {err}");
        }
    }
}

#[test]
fn oversized_tensors_say_what_was_asked_and_what_is_available() {
    for (from, to, key) in [
        ("x = { shape = [\"n\"]", "x = { shape = [1000000000000]", "inputs.x.shape"),
        ("{ alloc = \"y\", like = \"x\" }", "{ alloc = \"y\", shape = [\"n\", 1000000000], dtype = \"f64\" }", "forward.steps[0].shape"),
    ] {
        let spec = variant(from, to);
        let e = load_err("huge", &spec);
        assert_eq!(e.key, key, "{e}");
        assert!(e.message.contains("needs 3.6 TiB of memory") || e.message.contains("needs 7.3 TiB of memory"), "{e}");
        assert!(e.message.contains("is available") || e.message.contains("no allocation"), "{e}");
        cli_rejects(&write("huge", spec.as_bytes(), KERNELS.as_bytes()), key);
    }
}

#[test]
fn shapes_whose_element_count_overflows_are_errors_not_wrapped() {
    for shape in ["[3, 6148914691236517206]", "[4294967296, 4294967296]", "[0, 4294967296, 4294967296]"] {
        let spec = variant("x = { shape = [\"n\"]", &format!("x = {{ shape = {shape}"));
        let e = load_err("wrap", &spec);
        assert_eq!(e.key, "inputs.x.shape", "{e}");
        assert!(e.message.contains("fit 64 bits"), "{e}");
        cli_rejects(&write("wrap", spec.as_bytes(), KERNELS.as_bytes()), "inputs.x.shape");
        let (code, err) =
            tilegrad(&["run", write("wrap", spec.as_bytes(), KERNELS.as_bytes()).to_str().unwrap(), "--out", "/nonexistent/x"]);
        assert_eq!(code, 2, "{err}");
    }
    // The library refuses them as well, before drawing anything.
    let inputs = tilegrad::check::Inputs::new().random("x", tilegrad_ir::DType::F32, &[3, 6_148_914_691_236_517_206], Default::default());
    let s = load(&write("wrap-lib", SPEC.as_bytes(), KERNELS.as_bytes())).unwrap();
    let e = tilegrad::check::run_forward(&s.forward, &inputs, 0).unwrap_err();
    assert!(e.to_string().contains("fit 64 bits"), "{e}");
}

/// A spec whose input `i` is an integer tensor with `init`, copied to a float output.
fn int_spec(dtype: &str, init: &str) -> String {
    SPEC.replace("fwd = \"k.py::scale\"", "fwd = \"k.py::copy_index\"")
        .replace(
            "x = { shape = [\"n\"], init = \"uniform(-2, 2)\" }",
            &format!(
                "x = {{ shape = [\"n\"], init = \"uniform(-2, 2)\" }}\ni = {{ shape = [\"n\"], dtype = \"{dtype}\", init = \"{init}\" }}"
            ),
        )
        .replace("args = { x_ptr = \"x\", y_ptr = \"y\"", "args = { i_ptr = \"i\", o_ptr = \"y\"")
}

#[test]
fn integer_inputs_are_exact_and_in_range() {
    for (dtype, init, frag) in [
        ("i32", "const(5e9)", "outside the range of i32"),
        ("i32", "const(5000000000)", "outside the range of i32"),
        ("i32", "randint(0, 4294967296)", "outside the range of i32"),
        ("i64", "randint(9223372036854775000, 9223372036854775808)", "integer bounds that fit 64 bits"),
        ("i64", "const(1e19)", "outside the range of i64"),
        ("i64", "const(2.5)", "use an integer distribution"),
        ("bool", "const(2)", "outside the range of i1"),
    ] {
        let spec = int_spec(dtype, init);
        let e = load_err("int", &spec);
        assert_eq!(e.key, "inputs.i.init", "{dtype} {init}: {e}");
        assert!(e.message.contains(frag), "{dtype} {init}: {e}");
        cli_rejects(&write("int", spec.as_bytes(), KERNELS.as_bytes()), "inputs.i.init");
    }
    // Draws near 2^63 stay in their range and are exact.
    let (lo, hi) = (9_223_372_036_854_675_807i64, 9_223_372_036_854_775_807i64);
    let s = load(&write("i64", int_spec("i64", &format!("randint({lo}, {hi})")).as_bytes(), KERNELS.as_bytes())).unwrap();
    let (inputs, _) = tilegrad::check::run_forward(&s.forward, &s.inputs, 1).unwrap();
    let Data::I64(v) = inputs.iter().find(|(n, _)| n == "i").unwrap().1.data().clone() else { panic!("i64 storage") };
    assert!(v.iter().all(|x| (lo..hi).contains(x)), "{v:?}");
    assert!(v.iter().any(|x| x % 2 != 0) && v.iter().collect::<std::collections::HashSet<_>>().len() > 990, "draws are exact integers");
    // An exact i64 constant above 2^53, and i32 extremes.
    let s = load(&write("c64", int_spec("i64", "const(9007199254740993)").as_bytes(), KERNELS.as_bytes())).unwrap();
    let (inputs, _) = tilegrad::check::run_forward(&s.forward, &s.inputs, 1).unwrap();
    assert_eq!(inputs.iter().find(|(n, _)| n == "i").unwrap().1.as_i64().unwrap()[0], 9_007_199_254_740_993);
    let s = load(&write("c32", int_spec("i32", "randint(-2147483648, 2147483648)").as_bytes(), KERNELS.as_bytes())).unwrap();
    let (inputs, _) = tilegrad::check::run_forward(&s.forward, &s.inputs, 1).unwrap();
    let v = inputs.iter().find(|(n, _)| n == "i").unwrap().1.as_i32().unwrap().to_vec();
    assert!(v.iter().any(|&x| x < -1_000_000_000) && v.iter().any(|&x| x > 1_000_000_000), "{v:?}");
}

#[test]
fn files_that_are_not_utf8_are_errors_at_the_first_bad_byte() {
    // The spec.
    let mut spec = SPEC.as_bytes().to_vec();
    let at = spec.windows(4).position(|w| w == b"1000").unwrap();
    spec[at + 2] = 0xff; // line 7, column 7
    let p = write("utf8-spec", &spec, KERNELS.as_bytes());
    let e = load(&p).unwrap_err();
    assert_eq!(e.key, "-", "{e}");
    assert!(e.message.contains("line 7, column 7: the file is not valid UTF-8 (byte 0xff)"), "{e}");
    cli_rejects(&p, "line 7, column 7");
    // The Triton source.
    let mut py = KERNELS.as_bytes().to_vec();
    let at = py.windows(5).position(|w| w == b"3.0, ").unwrap();
    py[at] = 0xc3; // a lead byte without its continuation: line 7
    let p = write("utf8-py", SPEC.as_bytes(), &py);
    let e = load(&p).unwrap_err();
    assert_eq!(e.key, "kernels.fwd", "{e}");
    assert!(e.message.contains("k.py:7:") && e.message.contains("not valid UTF-8 (byte 0xc3)"), "{e}");
    let col = at - KERNELS[..at].rfind('\n').unwrap();
    assert!(e.message.contains(&format!("k.py:7:{col}:")), "{col}: {e}");
    cli_rejects(&p, &format!("k.py:7:{col}:"));
    let (code, err) = tilegrad(&["ir", &format!("{}::scale", p.with_file_name("k.py").display()), "--const", "BLOCK=16"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&format!("k.py:7:{col}: the file is not valid UTF-8")), "{err}");
    // A text-IR file.
    let tgir = p.with_file_name("k.tgir");
    std::fs::write(&tgir, b"kernel k() {\n  \xe2\x82\n}\n").unwrap();
    let (code, err) = tilegrad(&["ir", tgir.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("k.tgir:2:3: the file is not valid UTF-8"), "{err}");
}

#[test]
fn deep_triton_expressions_exit_2_with_the_line() {
    let deep = format!("{}x{}", "tl.abs(".repeat(2_900), ")".repeat(2_900));
    let py = KERNELS.replace(
        "* 3.0, mask=offs < n)\n\n@triton.jit\ndef scale_bwd",
        &format!("* 3.0, mask=offs < n)\n    x = 1.0\n    y = {deep}\n\n@triton.jit\ndef scale_bwd"),
    );
    let p = write("deep-py", SPEC.as_bytes(), py.as_bytes());
    let e = load(&p).unwrap_err();
    assert!(e.message.contains("k.py:9:") && e.message.contains("nested deeper than 200 levels"), "{e}");
    cli_rejects(&p, "nested deeper than 200 levels");
    // A sum of 7,400 terms is fine.
    let long = vec!["1.0"; 7_400].join(" + ");
    let py = KERNELS.replace(
        "* 3.0, mask=offs < n)\n\n@triton.jit\ndef scale_bwd",
        &format!("* ({long}) / 2466.6666666666665, mask=offs < n)\n\n@triton.jit\ndef scale_bwd"),
    );
    let s = load(&write("long-py", SPEC.as_bytes(), py.as_bytes())).unwrap();
    let r = tilegrad::check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &s.options).unwrap();
    assert!(r.passed, "{r}");
    // A 150,000-term sum at module level, outside every kernel: too deep to read (its syntax
    // tree is walked and dropped recursively), refused with its line, not a stack overflow.
    let chain = vec!["1"; 150_000].join(" + ");
    let py = format!("ACC = {chain}\n{KERNELS}");
    let p = write("chain-module", SPEC.as_bytes(), py.as_bytes());
    let e = load(&p).unwrap_err();
    assert!(e.message.contains("k.py:1:7") && e.message.contains("nested deeper than 20000 levels"), "{e}");
    cli_rejects(&p, "nested deeper than 20000 levels");
}

#[test]
fn a_backward_loop_that_never_moves_on_fails_the_check_at_its_line_at_once() {
    // It ran to the 10^7-trip bound (over 5 minutes; 1.5 GB a program before stores that
    // repeat their elements replaced each other); now its first trip shows the condition's
    // only input, `start`, never changes.
    let p = write("scan-stuck", stuck_scan::SPEC.as_bytes(), stuck_scan::KERNELS.as_bytes());
    let t0 = std::time::Instant::now();
    let out = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 1048576 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_tilegrad"))
        .args(["check", p.to_str().unwrap()])
        .env("RAYON_NUM_THREADS", "2")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("k.py:19:5: kernel `scan_bwd_stuck`, op `while`, program (0, 0, 0)"), "{text}");
    assert!(text.contains("can never end"), "{text}");
    assert!(t0.elapsed().as_secs() < 120, "{:?}", t0.elapsed());
}

#[test]
fn a_uint8_npy_input_is_refused_at_its_key_not_read_as_bool() {
    let p = write(
        "npy-u1",
        SPEC.replace("x = { shape = [\"n\"], init = \"uniform(-2, 2)\" }", "x = { file = \"x.npy\" }").as_bytes(),
        KERNELS.as_bytes(),
    );
    let mut npy = b"\x93NUMPY\x01\x00v\x00{'descr': '|u1', 'fortran_order': False, 'shape': (1000,), }".to_vec();
    npy.resize(10 + 0x76, b' ');
    npy[10 + 0x75] = b'\n';
    npy.extend((0..1000).map(|i| (i % 256) as u8));
    std::fs::write(p.with_file_name("x.npy"), npy).unwrap();
    for cmd in ["check", "run"] {
        let (code, err) = tilegrad(&[cmd, p.to_str().unwrap(), "--out", env!("CARGO_TARGET_TMPDIR")][..if cmd == "check" { 2 } else { 4 }]);
        assert_eq!(code, 2, "{cmd}: {err}");
        assert!(err.contains("inputs.x.file") && err.contains("unsupported dtype `|u1` (uint8)"), "{cmd}: {err}");
    }
}

#[test]
fn a_grid_past_the_program_limit_is_refused_by_every_command_naming_kernel_and_grid() {
    let huge = variant("grid = [\"cdiv(n, 128)\"], args = { x_ptr", "grid = [2147483647], args = { x_ptr");
    let p = write("grid", huge.as_bytes(), KERNELS.as_bytes());
    let out = p.with_file_name("out");
    for args in
        [vec!["check"], vec!["gradcheck"], vec!["grad", "--out", out.to_str().unwrap()], vec!["run", "--out", out.to_str().unwrap()]]
    {
        let mut argv = args.clone();
        argv.insert(1, p.to_str().unwrap());
        let t = std::time::Instant::now();
        let (code, err) = tilegrad(&argv);
        assert_eq!(code, 2, "{args:?}: {err}");
        for expect in ["kernel `scale` on grid [2147483647, 1, 1]", "2147483647 programs", "--max-programs", "forward step 1"] {
            assert!(err.contains(expect), "{args:?}: expected `{expect}` in: {err}");
        }
        assert!(t.elapsed().as_secs() < 20, "{args:?} refused at once");
    }
    // The limit is an option: a grid of 5,000 programs under a limit of 4,000, then of 5,000.
    let p = write(
        "grid-limit",
        variant("grid = [\"cdiv(n, 128)\"], args = { x_ptr", "grid = [5000], args = { x_ptr").as_bytes(),
        KERNELS.as_bytes(),
    );
    let (code, err) = tilegrad(&["check", p.to_str().unwrap(), "--max-programs", "4000"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("more than the 4000 a launch may run"), "{err}");
    let (code, err) = tilegrad(&["check", p.to_str().unwrap(), "--max-programs", "5000"]);
    assert_eq!(code, 0, "{err}");
}
