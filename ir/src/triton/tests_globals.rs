//! Module-level names the running program gives ([`ConvertOptions::globals`]): each replaces the
//! conversion's own reading of its file, whatever the conversion made of the conditions around
//! it, and is not noted; a binding that cannot be applied leaves the conversion's reading.

use super::{convert, convert_noted, ConstValue, ConvertOptions, GlobalBinding, GlobalFact};
use crate::{Kernel, Op, UnaryOp};

const HEAD: &str = "import os\nimport platform\nimport triton\nimport triton.language as tl\n";

/// A kernel storing `call` after the module-level `prelude`.
fn module(prelude: &str, call: &str) -> String {
    format!(
        "{HEAD}{prelude}\n\n@triton.jit\ndef k(x_ptr, y_ptr, BLOCK: tl.constexpr):\n    offs = tl.arange(0, BLOCK)\n    x = tl.load(x_ptr + offs)\n    tl.store(y_ptr + offs, {call})\n"
    )
}

fn opts(globals: Vec<GlobalBinding>) -> ConvertOptions {
    ConvertOptions { globals, ..ConvertOptions::with_constexprs(&[("BLOCK", 8)]) }
}

fn unary(k: &Kernel, op: UnaryOp) -> usize {
    let mut n = 0;
    k.walk(&mut |_, d| n += matches!(&d.op, Op::Unary(u) if *u == op) as usize);
    n
}

fn binding(file: &str, name: &str, fact: GlobalFact) -> GlobalBinding {
    GlobalBinding { file: file.into(), name: name.into(), fact }
}

fn jit(file: &str, name: &str, line: u32) -> GlobalFact {
    GlobalFact::Jit { file: file.into(), name: name.into(), line }
}

/// The line (1-based) of the first line of `src` that starts with `text`.
fn line_of(src: &str, text: &str) -> u32 {
    src.lines().position(|l| l.starts_with(text)).map(|i| i as u32 + 1).unwrap_or_else(|| panic!("no line `{text}`"))
}

/// Two helpers, and `helper` bound to one of them under a condition the scan cannot decide.
const SWITCH: &str = "@triton.jit\ndef _jit_exp(x):\n    return tl.exp(x)\n\n@triton.jit\ndef _jit_log(x):\n    return tl.log(x)\n\nif platform.machine() == \"x86_64\":\n    helper = _jit_exp\nelse:\n    helper = _jit_log\n";

#[test]
fn a_jit_function_of_the_program_replaces_the_guess_of_an_undecided_condition() {
    let src = module(SWITCH, "helper(x)");
    // Alone, the conversion reads the condition as false and notes it.
    let (k, notes) = convert_noted(&src, "s.py", "k", &opts(vec![])).unwrap();
    assert_eq!((unary(&k, UnaryOp::Exp), unary(&k, UnaryOp::Log)), (0, 1));
    assert_eq!(notes.len(), 1, "{notes:?}");
    // The program took the `if`: `helper` is `_jit_exp`.
    let fact = jit("s.py", "_jit_exp", line_of(&src, "def _jit_exp"));
    let (k, notes) = convert_noted(&src, "s.py", "k", &opts(vec![binding("s.py", "helper", fact)])).unwrap();
    assert_eq!((unary(&k, UnaryOp::Exp), unary(&k, UnaryOp::Log)), (1, 0));
    assert!(notes.is_empty(), "{notes:?}");
}

#[test]
fn functions_of_one_name_are_told_apart_by_their_line() {
    let prelude = "if platform.system() == \"Linux\":\n    @triton.jit\n    def act(x):\n        return tl.exp(x)\nelse:\n    @triton.jit\n    def act(x):\n        return tl.log(x)\n";
    let src = module(prelude, "act(x)");
    let first = line_of(&src, "    @triton.jit");
    let (k, notes) = convert_noted(&src, "a.py", "k", &opts(vec![binding("a.py", "act", jit("a.py", "act", first))])).unwrap();
    assert_eq!((unary(&k, UnaryOp::Exp), unary(&k, UnaryOp::Log)), (1, 0));
    assert!(notes.is_empty(), "{notes:?}");
    // The line of the `def` names it too; the other one is the `else` branch's.
    let (k, _) = convert_noted(&src, "a.py", "k", &opts(vec![binding("a.py", "act", jit("a.py", "act", first + 6))])).unwrap();
    assert_eq!((unary(&k, UnaryOp::Exp), unary(&k, UnaryOp::Log)), (0, 1));
}

/// unsloth's cast switch: `tl.cast` on a new Triton, a jit helper (which calls `.to` on its
/// argument) on an old one.
const CAST: &str = "if triton.__version__ >= \"3.0\":\n    triton_cast = tl.cast\nelse:\n    @triton.jit\n    def triton_cast(x, dtype):\n        return x.to(dtype)\n";

#[test]
fn a_builtin_or_a_helper_of_the_program_wins_over_the_version_the_conversion_assumes() {
    // `triton_cast(5000, tl.int32)` is valid only for `tl.cast` (an int has no `.to`).
    let src = module(CAST, "x + triton_cast(5000, tl.int32).to(tl.float32)");
    let old = |globals| ConvertOptions { triton_version: "2.3.0".into(), ..opts(globals) };
    assert!(convert(&src, "c.py", "k", &old(vec![])).is_err());
    let cast = binding("c.py", "triton_cast", GlobalFact::Builtin("triton.language.cast".into()));
    convert(&src, "c.py", "k", &old(vec![cast])).unwrap_or_else(|e| panic!("{e}"));
    // The other way round: the conversion reads `tl.cast`, the program bound the helper.
    let helper = binding("c.py", "triton_cast", jit("c.py", "triton_cast", line_of(&src, "    @triton.jit")));
    let e = convert(&src, "c.py", "k", &opts(vec![helper])).unwrap_err().to_string();
    assert!(e.contains("no method"), "the helper's `.to` on an int: {e}");
}

#[test]
fn constants_of_the_program_replace_the_guessed_ones() {
    let prelude = "if platform.machine() == \"arm64\":\n    SCALE = 2.5\nelse:\n    SCALE = 3.5\n";
    let src = module(prelude, "x * SCALE");
    let lits = |k: &Kernel| {
        let mut out = Vec::new();
        k.walk(&mut |_, d| {
            if let Op::Const { value } = &d.op {
                out.push(format!("{value:?}"));
            }
        });
        out
    };
    let (k, notes) = convert_noted(&src, "c.py", "k", &opts(vec![])).unwrap();
    assert!(lits(&k).iter().any(|l| l.contains("3.5")) && notes.len() == 1, "{:?} {notes:?}", lits(&k));
    let scale = binding("c.py", "SCALE", GlobalFact::Const(ConstValue::Float(2.5)));
    let (k, notes) = convert_noted(&src, "c.py", "k", &opts(vec![scale])).unwrap();
    assert!(lits(&k).iter().any(|l| l.contains("2.5")) && !lits(&k).iter().any(|l| l.contains("3.5")), "{:?}", lits(&k));
    assert!(notes.is_empty(), "{notes:?}");
}

#[test]
fn a_helper_of_another_file_is_read_even_where_no_import_reaches_it() {
    let dir = std::env::temp_dir().join(format!("tilegrad-globals-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("pkg")).unwrap();
    let ops = format!("{HEAD}\n@triton.jit\ndef fast_exp(x):\n    return tl.exp(x)\n");
    let ops_path = dir.join("pkg").join("ops.py");
    std::fs::write(&ops_path, &ops).unwrap();
    // An absolute import of an installed package the conversion does not look for.
    let src = module("try:\n    from somewhere_installed.ops import fast_exp as act\nexcept ImportError:\n    act = tl.log\n", "act(x)");
    let path = dir.join("k.py");
    std::fs::write(&path, &src).unwrap();
    let file = path.display().to_string();
    // Alone, the conversion takes the import as working and cannot call what it names.
    assert!(convert(&src, &file, "k", &opts(vec![])).is_err());
    let fact = jit(&ops_path.display().to_string(), "fast_exp", line_of(&ops, "@triton.jit"));
    let (k, notes) = convert_noted(&src, &file, "k", &opts(vec![binding(&file, "act", fact)])).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(unary(&k, UnaryOp::Exp), 1);
    assert!(notes.is_empty(), "{notes:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bindings_that_cannot_be_applied_leave_the_conversion_s_reading() {
    let src = module(SWITCH, "helper(x)");
    for fact in [
        // A file that is not there, a function the file does not define, a module not read.
        binding("s.py", "helper", jit("/no/such/file.py", "f", 1)),
        binding("s.py", "helper", jit("s.py", "missing", 3)),
        binding("other.py", "helper", jit("s.py", "_jit_exp", 5)),
    ] {
        let (k, notes) = convert_noted(&src, "s.py", "k", &opts(vec![fact.clone()])).unwrap_or_else(|e| panic!("{fact:?}: {e}"));
        assert_eq!(unary(&k, UnaryOp::Log), 1, "{fact:?}");
        assert_eq!(notes.len(), 1, "{fact:?}: {notes:?}");
    }
}
