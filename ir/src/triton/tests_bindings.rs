//! Module-level names bound as Python binds them: version switches decided by the Triton version
//! of the options, environment switches by the options' environment, device checks by its
//! capability, `try`/`except ImportError` fallbacks, the last binding winning, and a note for a
//! binding whose condition cannot be decided. Also the error listing the helpers in scope.

use super::{convert, convert_noted, ConvertOptions};
use crate::{Kernel, Op, UnaryOp};

const HEAD: &str = "import os\nimport torch\nimport triton\nimport triton.language as tl\nfrom packaging.version import Version\n";

/// A kernel calling `name(x)` after the module-level `prelude`.
fn module(prelude: &str, call: &str) -> String {
    format!(
        "{HEAD}{prelude}\n\n@triton.jit\ndef k(x_ptr, y_ptr, BLOCK: tl.constexpr):\n    offs = tl.arange(0, BLOCK)\n    x = tl.load(x_ptr + offs)\n    tl.store(y_ptr + offs, {call})\n"
    )
}

fn opts() -> ConvertOptions {
    ConvertOptions::with_constexprs(&[("BLOCK", 8)])
}

fn count(k: &Kernel, f: impl Fn(&Op) -> bool) -> usize {
    let mut n = 0;
    k.walk(&mut |_, d| n += f(&d.op) as usize);
    n
}

fn casts(k: &Kernel) -> usize {
    count(k, |o| matches!(o, Op::Cast))
}

const UNSLOTH_CAST: &str = "if Version(triton.__version__) >= Version(\"3.0.0\"):\n    triton_cast = tl.cast\nelse:\n    @triton.jit\n    def triton_cast(x, dtype):\n        return x.to(dtype)\n";

#[test]
fn a_version_switch_takes_the_branch_of_the_triton_version_in_use() {
    // `triton_cast(5000, tl.int32)` is only valid for `tl.cast` (the helper calls `.to` on an int).
    let src = module(UNSLOTH_CAST, "x + triton_cast(5000, tl.int32).to(tl.float32)");
    let k = convert(&src, "u.py", "k", &opts()).unwrap_or_else(|e| panic!("{e}"));
    assert!(casts(&k) >= 1);
    let old = ConvertOptions { triton_version: "2.3.0".into(), ..opts() };
    let e = convert(&src, "u.py", "k", &old).unwrap_err().to_string();
    assert!(e.contains("has no method `to`") || e.contains("no method"), "the jit helper under Triton 2.3: {e}");
    // On a tensor both bindings work; the helper's `.to` is what Triton 2.3 runs.
    let src = module(UNSLOTH_CAST, "triton_cast(x, tl.float16).to(tl.float32)");
    assert_eq!(casts(&convert(&src, "u.py", "k", &old).unwrap()), 2);
    // String and helper forms of the same check.
    for check in [
        "triton.__version__ >= \"3.0\"",
        "tuple(map(int, triton.__version__.split(\".\")[:2])) >= (3, 0)",
        "compare_version(\"triton\", operator.ge, \"3.0.0\")",
        "version.parse(triton.__version__).major >= 3",
    ] {
        let prelude = format!(
            "import operator\nfrom packaging import version\nfrom liger_kernel.utils import compare_version\nif {check}:\n    fast = tl.exp\nelse:\n    fast = tl.log\n"
        );
        let src = module(&prelude, "fast(x)");
        let new = convert(&src, "u.py", "k", &opts()).unwrap_or_else(|e| panic!("{check}: {e}"));
        assert_eq!(count(&new, |o| matches!(o, Op::Unary(UnaryOp::Exp))), 1, "{check}");
        let old = convert(&src, "u.py", "k", &ConvertOptions { triton_version: "2.1.0".into(), ..opts() }).unwrap();
        assert_eq!(count(&old, |o| matches!(o, Op::Unary(UnaryOp::Log))), 1, "{check}");
    }
}

const FLA_SWITCH: &str = "@triton.jit\ndef fast_exp(x):\n    return tl.inline_asm_elementwise(\"ex2.approx.ftz.f32 $0, $1;\", \"=r,r\", [x], dtype=tl.float32, is_pure=True, pack=1)\n\nif os.environ.get(\"FLA_USE_FAST_OPS\", \"0\") == \"1\":\n    exp = fast_exp\nelse:\n    exp = tl.exp\n";

#[test]
fn an_environment_switch_takes_the_default_unless_the_variable_is_set() {
    let src = module(FLA_SWITCH, "exp(x)");
    let k = convert(&src, "fla.py", "k", &opts()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(count(&k, |o| matches!(o, Op::Unary(UnaryOp::Exp))), 1);
    let set = ConvertOptions { env: vec![("FLA_USE_FAST_OPS".into(), "1".into())], ..opts() };
    let e = convert(&src, "fla.py", "k", &set).unwrap_err().to_string();
    assert!(e.contains("inline_asm_elementwise"), "the helper is what the set variable selects: {e}");
    // `os.getenv`, `in os.environ`, and `os.environ[...]` raising `KeyError` in a `try`.
    for prelude in [
        "if os.getenv(\"FAST\", \"\").lower() in (\"1\", \"true\"):\n    exp = tl.log\nelse:\n    exp = tl.exp\n",
        "if \"FAST\" in os.environ:\n    exp = tl.log\nelse:\n    exp = tl.exp\n",
        "try:\n    _flag = os.environ[\"FAST\"]\n    exp = tl.log\nexcept KeyError:\n    exp = tl.exp\n",
    ] {
        let src = module(prelude, "exp(x)");
        let k = convert(&src, "e.py", "k", &opts()).unwrap_or_else(|e| panic!("{prelude}: {e}"));
        assert_eq!(count(&k, |o| matches!(o, Op::Unary(UnaryOp::Exp))), 1, "{prelude}");
        let set = ConvertOptions { env: vec![("FAST".into(), "True".into())], ..opts() };
        let k = convert(&src, "e.py", "k", &set).unwrap();
        assert_eq!(count(&k, |o| matches!(o, Op::Unary(UnaryOp::Log))), 1, "{prelude}");
    }
}

#[test]
fn device_capability_checks_and_helpers_decide_by_the_device_option() {
    let prelude = "def is_hopper():\n    \"\"\"sm_90 or newer.\"\"\"\n    major, minor = 0, 0\n    return torch.cuda.get_device_capability()[0] >= 9\n\nIS_HOPPER = is_hopper()\nif IS_HOPPER and torch.cuda.is_available():\n    act = tl.exp\nelse:\n    act = tl.log\n";
    let src = module(prelude, "act(x)");
    // The helper assigns a tuple (not followed): undecided, the `else` branch with a note.
    let (k, notes) = convert_noted(&src, "d.py", "k", &opts()).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::Unary(UnaryOp::Log))), 1);
    assert_eq!(notes.len(), 1, "{notes:?}");
    let simple = src.replace("    major, minor = 0, 0\n", "");
    let (k, notes) = convert_noted(&simple, "d.py", "k", &opts()).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::Unary(UnaryOp::Exp))), 1);
    assert!(notes.is_empty(), "{notes:?}");
    let ampere = ConvertOptions { device_capability: (8, 0), ..opts() };
    let k = convert(&simple, "d.py", "k", &ampere).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::Unary(UnaryOp::Log))), 1);
}

#[test]
fn try_except_import_error_takes_the_fallback_only_when_the_import_fails() {
    let prelude = "try:\n    from triton.language.extra.libdevice import exp as dev_exp\nexcept ImportError:\n    dev_exp = tl.log\n";
    let src = module(prelude, "dev_exp(x)");
    let k = convert(&src, "t.py", "k", &opts()).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::Unary(UnaryOp::Exp))), 1);
    // Triton 2 has no `triton.language.extra.libdevice`: the `except` binds the name.
    let k = convert(&src, "t.py", "k", &ConvertOptions { triton_version: "2.2.0".into(), ..opts() }).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::Unary(UnaryOp::Log))), 1);
    // A relative import of a file that is not there fails too (the kernel's directory is real).
    let dir = std::env::temp_dir().join(format!("tilegrad-bindings-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("k.py");
    let src = module("try:\n    from .missing_ops import fast as act\nexcept ImportError:\n    act = tl.exp\n", "act(x)");
    std::fs::write(&path, &src).unwrap();
    let k = convert(&src, &path.display().to_string(), "k", &opts()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(count(&k, |o| matches!(o, Op::Unary(UnaryOp::Exp))), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_last_binding_of_a_name_wins() {
    // A re-import after a definition, and a definition after an import.
    let prelude = "@triton.jit\ndef act(x):\n    return tl.log(x)\n\nfrom triton.language import exp as act\n";
    let k = convert(&module(prelude, "act(x)"), "r.py", "k", &opts()).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::Unary(UnaryOp::Exp))), 1);
    assert_eq!(count(&k, |o| matches!(o, Op::Unary(UnaryOp::Log))), 0);
    let prelude = "from triton.language import exp as act\n\n@triton.jit\ndef act(x):\n    return tl.log(x)\n";
    let k = convert(&module(prelude, "act(x)"), "r.py", "k", &opts()).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::Unary(UnaryOp::Log))), 1);
    // A constant rebound later, and a name rebound to something unknown is no longer the old one.
    let prelude = "SCALE = 2.0\nSCALE = 3.0\n";
    let k = convert(&module(prelude, "x * SCALE"), "r.py", "k", &opts()).unwrap();
    let mut lits = Vec::new();
    k.walk(&mut |_, d| {
        if let Op::Const { value } = &d.op {
            lits.push(format!("{value:?}"));
        }
    });
    assert!(lits.iter().any(|l| l.contains('3')) && !lits.iter().any(|l| l.contains("2.0")), "{lits:?}");
    let prelude = "act = tl.exp\nact = torch.compile(some_fn)\n";
    let e = convert(&module(prelude, "act(x)"), "r.py", "k", &opts()).unwrap_err().to_string();
    assert!(e.contains("undefined name `act`"), "{e}");
}

#[test]
fn an_undecided_condition_takes_the_else_branch_with_a_note_at_the_condition() {
    let prelude = "if hasattr(tl, \"gather\"):\n    pick = tl.exp\nelse:\n    pick = tl.log\n";
    let src = module(prelude, "pick(x)");
    let (k, notes) = convert_noted(&src, "g.py", "k", &opts()).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::Unary(UnaryOp::Log))), 1);
    assert_eq!(notes.len(), 1, "{notes:?}");
    let n = notes[0].to_string();
    assert!(n.starts_with("g.py:6:4: ") && n.contains("`pick`") && n.contains("hasattr(tl, \"gather\")"), "{n}");
    // A name only the undecided branch binds is still bound; a name bound before keeps its binding.
    let prelude = "act = tl.exp\nif hasattr(tl, \"gather\"):\n    act = tl.log\n    @triton.jit\n    def extra(x):\n        return x\n";
    let (k, notes) = convert_noted(&module(prelude, "extra(act(x))"), "g.py", "k", &opts()).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::Unary(UnaryOp::Exp))), 1);
    assert_eq!(notes.len(), 2, "{notes:?}");
    // Names the kernel does not use give no note.
    let (_, notes) = convert_noted(&module(prelude, "x"), "g.py", "k", &opts()).unwrap();
    assert!(notes.is_empty(), "{notes:?}");
}

#[test]
fn the_unsupported_function_error_lists_imported_helpers() {
    let dir = std::env::temp_dir().join(format!("tilegrad-helpers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("ops.py"),
        format!("{HEAD}@triton.jit\ndef softplus(x):\n    return tl.log(1.0 + tl.exp(x))\n\ndef host():\n    pass\n"),
    )
    .unwrap();
    std::fs::write(dir.join("act.py"), format!("{HEAD}@triton.jit\ndef relu(x):\n    return tl.maximum(x, 0.0)\n")).unwrap();
    let src =
        module("from .ops import softplus\nfrom . import act\n\n@triton.jit\ndef local_helper(x):\n    return x\n", "tl.frobnicate(x)");
    let path = dir.join("k.py");
    std::fs::write(&path, &src).unwrap();
    let e = convert(&src, &path.display().to_string(), "k", &opts()).unwrap_err().to_string();
    assert!(e.contains("unsupported function `tl.frobnicate`"), "{e}");
    assert!(e.contains("act.relu") && e.contains("local_helper") && e.contains("softplus"), "{e}");
    assert!(!e.contains("host"), "not a jit helper: {e}");
    let _ = std::fs::remove_dir_all(&dir);
}
