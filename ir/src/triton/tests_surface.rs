//! Conversion tests of the Python surface real kernel libraries use: `triton.jit` applied as a
//! call, constexprs that are floats, bools, strings, `None` and dtypes (folded at conversion),
//! guarded module-level imports and helpers imported from sibling files, Python's `min`/`max` on
//! tensors, `tl.float32(x)` casts, early `return` under a runtime `if`, and the errors of each at
//! their line:column.

use super::{autotune_configs, convert, kernels, ConstValue, ConvertOptions};
use crate::{BinaryOp, DType, IrError, Kernel, Lit, Op, ParamKind};

const HEAD: &str = "import triton\nimport triton.language as tl\n\n";

fn count(k: &Kernel, f: impl Fn(&Op) -> bool) -> usize {
    let mut n = 0;
    k.walk(&mut |_, d| n += f(&d.op) as usize);
    n
}

/// The `file:line:col` and message of a conversion error.
fn err_at(r: Result<Kernel, IrError>) -> (String, u32, u32, String) {
    match r {
        Err(IrError::Parse { file, error }) => (file, error.line, error.col, error.message),
        other => panic!("expected a located error, got {other:?}"),
    }
}

const BODY: &str = "    offs = tl.arange(0, BLOCK)\n    tl.store(y_ptr + offs, tl.load(x_ptr + offs) * 2.0)\n";

// ---------------------------------------------------------------- item 1: triton.jit as a call

#[test]
fn jit_applied_as_a_call_in_every_common_form() {
    let def = |name: &str| format!("def {name}(x_ptr, y_ptr, BLOCK: tl.constexpr):\n{BODY}\n");
    let src = format!(
        "{HEAD}{}_k = triton.jit(_k)\n\n{}kernel = triton.jit(fn)\n\n{}heur = triton.heuristics({{'BLOCK': lambda a: 16}})(triton.jit(_h))\n\n{}tuned = triton.autotune(configs=[triton.Config({{'BLOCK': 32}})], key=[])(triton.jit(_t))\n",
        def("_k"),
        def("fn"),
        def("_h"),
        def("_t")
    );
    assert_eq!(kernels(&src, "k.py").unwrap(), vec!["_k", "kernel", "heur", "tuned"]);
    for name in ["_k", "kernel", "heur", "tuned"] {
        let k = convert(&src, "k.py", name, &ConvertOptions::with_constexprs(&[("BLOCK", 16)])).unwrap();
        assert_eq!(k.name, name);
        assert_eq!(count(&k, |o| matches!(o, Op::Store { .. })), 1);
    }
    assert_eq!(autotune_configs(&src, "k.py", "tuned").unwrap(), vec![vec![("BLOCK".to_string(), 32)]]);
    // `fn` itself is not a kernel: only the name bound to its jit form is.
    let (_, line, col, m) = err_at(convert(&src, "k.py", "fn", &ConvertOptions::with_constexprs(&[("BLOCK", 16)])));
    assert_eq!((line, col), (10, 5), "{m}");
    assert!(m.contains("is not a `@triton.jit` function") && m.contains("jit = true"), "{m}");
}

#[test]
fn decorators_that_wrap_jit_and_the_option_for_unknown_ones() {
    let src = format!(
        "{HEAD}from mylib import kernel_decorator\n\ndef my_jit(fn):\n    return triton.jit(fn)\n\n@my_jit\ndef a(x_ptr, y_ptr, BLOCK: tl.constexpr):\n{BODY}\n@kernel_decorator(num_warps=4)\ndef b(x_ptr, y_ptr, BLOCK: tl.constexpr):\n{BODY}\nc = kernel_decorator(b)\n"
    );
    let opts = ConvertOptions::with_constexprs(&[("BLOCK", 8)]);
    assert!(convert(&src, "k.py", "a", &opts).is_ok());
    let (_, line, col, m) = err_at(convert(&src, "k.py", "b", &opts));
    assert_eq!((line, col), (15, 5));
    assert!(m.contains("it has only @kernel_decorator") && m.contains("jit = true"), "{m}");
    let (_, line, col, m) = err_at(convert(&src, "k.py", "c", &opts));
    assert_eq!((line, col), (19, 5));
    assert!(m.contains("bound to `kernel_decorator(...)`") && m.contains("name the function it wraps"), "{m}");
    let k = convert(&src, "k.py", "b", &ConvertOptions { assume_jit: true, ..opts.clone() }).unwrap();
    assert_eq!(k.name, "b");
    // Unknown names list what the file has.
    let (_, _, _, m) = err_at(convert(&src, "k.py", "nope", &opts));
    assert!(m.contains("found: a") && m.contains("other functions: b, my_jit"), "{m}");
}

// ---------------------------------------------------------------- item 2 and 7: constexprs

#[test]
fn float_bool_and_dtype_constexprs_bind_and_fold() {
    let src = format!(
        "{HEAD}@triton.jit\ndef k(x_ptr, y_ptr, eps: tl.constexpr, FLAG: tl.constexpr, X_dtype: tl.constexpr, BLOCK: tl.constexpr):\n    offs = tl.arange(0, BLOCK)\n    x = tl.load(x_ptr + offs)\n    if FLAG:\n        x = x + eps\n    if X_dtype == tl.float16:\n        x = x * 3.0\n    tl.store(y_ptr + offs, x.to(X_dtype))\n"
    );
    let opts = ConvertOptions::with_constexprs(&[("BLOCK", 8)])
        .bind("eps", 1e-6)
        .bind("FLAG", true)
        .bind("X_dtype", ConstValue::DType("float16".into()));
    let k = convert(&src, "k.py", "k", &opts).unwrap();
    let p = |n: &str| k.param(n).unwrap().kind.clone();
    assert_eq!(p("eps"), ParamKind::Constexpr(DType::F32, Lit::Float(1e-6)));
    assert_eq!(p("FLAG"), ParamKind::Constexpr(DType::I32, Lit::Int(1)));
    assert!(k.param("X_dtype").is_none(), "a dtype constexpr exists only at conversion");
    assert_eq!(count(&k, |o| matches!(o, Op::Binary(BinaryOp::Add))), 1, "`x + eps`");
    assert_eq!(count(&k, |o| matches!(o, Op::Binary(BinaryOp::Mul))), 1, "the f16 branch is taken");
    let mut consts = Vec::new();
    k.walk(&mut |_, d| {
        if let Op::Const { value } = &d.op {
            consts.push(*value);
        }
    });
    assert!(consts.contains(&Lit::Float(1e-6)), "{consts:?}");
    let mut casts = Vec::new();
    k.walk(&mut |_, d| {
        if let Op::Cast = d.op {
            casts.push(k.ty(d.results[0]).dtype());
        }
    });
    assert_eq!(casts, vec![Some(DType::F16), Some(DType::F32)], "`.to(X_dtype)`, then the store to f32");
    // False and f32: neither branch.
    let opts = opts.bind("FLAG", false).bind("X_dtype", ConstValue::DType("float32".into()));
    let k = convert(&src, "k.py", "k", &opts).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::Binary(_))), 0);
    // Unbound: the message shows how to bind each kind.
    let (_, line, col, m) = err_at(convert(&src, "k.py", "k", &ConvertOptions::with_constexprs(&[("BLOCK", 8)])));
    assert_eq!((line, col), (5, 21));
    assert!(m.contains("`eps` has no value") && m.contains("`eps=1e-6`") && m.contains("`eps='mean'`"), "{m}");
}

#[test]
fn string_and_none_constexprs_select_branches() {
    let src = format!(
        "{HEAD}@triton.jit\ndef k(x_ptr, y_ptr, ACTIVATION: tl.constexpr = None, reduction: tl.constexpr = \"mean\", BLOCK: tl.constexpr = 8):\n    offs = tl.arange(0, BLOCK)\n    x = tl.load(x_ptr + offs)\n    if ACTIVATION == \"leaky_relu\":\n        x = tl.where(x >= 0, x, x * 0.01)\n    elif ACTIVATION is None:\n        x = x + 1.0\n    if reduction == \"mean\":\n        x = x / BLOCK\n    tl.store(y_ptr + offs, x)\n"
    );
    let ops = |opts: &ConvertOptions| {
        let k = convert(&src, "k.py", "k", opts).unwrap();
        (count(&k, |o| matches!(o, Op::Where)), count(&k, |o| matches!(o, Op::Binary(BinaryOp::Div))), k.params.len())
    };
    // Defaults: None (identity plus one) and "mean".
    assert_eq!(ops(&ConvertOptions::default()), (0, 1, 3));
    assert_eq!(ops(&ConvertOptions::default().bind("ACTIVATION", "leaky_relu").bind("reduction", "sum")), (1, 0, 3));
    assert_eq!(ops(&ConvertOptions::default().bind("ACTIVATION", ConstValue::None)), (0, 1, 3));
    // A string compared with a tensor is an error at its column.
    let bad = src.replace("if reduction == \"mean\":", "if reduction == x:");
    let (_, line, col, m) = err_at(convert(&bad, "k.py", "k", &ConvertOptions::default()));
    assert_eq!((line, col), (12, 8), "{m}");
}

#[test]
fn fp8_dtypes_are_values_that_fold_but_not_compute() {
    let src = format!(
        "{HEAD}@triton.jit\ndef k(V, y_ptr, OUT_DTYPE: tl.constexpr, BLOCK: tl.constexpr):\n    offs = tl.arange(0, BLOCK)\n    v = tl.load(V + offs)\n    if V.dtype.element_ty == tl.float8e5:\n        v = v * 2.0\n    if OUT_DTYPE == tl.float8e4nv:\n        v = v + 1.0\n    tl.store(y_ptr + offs, v)\n"
    );
    let opts = ConvertOptions::with_constexprs(&[("BLOCK", 4)]).bind("OUT_DTYPE", ConstValue::parse("torch.float8_e4m3fn").unwrap());
    let opts = ConvertOptions { pointer_dtypes: vec![("V".into(), DType::F16)], ..opts };
    let k = convert(&src, "k.py", "k", &opts).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::Binary(BinaryOp::Mul))), 0);
    assert_eq!(count(&k, |o| matches!(o, Op::Binary(BinaryOp::Add))), 1, "`v + 1.0`");
    let bad = src.replace("tl.store(y_ptr + offs, v)", "tl.store(y_ptr + offs, v.to(OUT_DTYPE))");
    let (_, line, col, m) = err_at(convert(&bad, "k.py", "k", &opts));
    assert_eq!((line, col), (12, 28));
    assert!(m.contains("`tl.float8e4nv` is not a dtype tilegrad computes in"), "{m}");
}

#[test]
fn const_values_parse_as_specs_and_the_cli_write_them() {
    for (t, v) in [
        ("64", ConstValue::Int(64)),
        ("-3", ConstValue::Int(-3)),
        ("1e-6", ConstValue::Float(1e-6)),
        ("0.5", ConstValue::Float(0.5)),
        ("True", ConstValue::Bool(true)),
        ("false", ConstValue::Bool(false)),
        ("None", ConstValue::None),
        ("'mean'", ConstValue::Str("mean".into())),
        ("\"leaky_relu\"", ConstValue::Str("leaky_relu".into())),
        ("tl.float16", ConstValue::DType("float16".into())),
        ("torch.bfloat16", ConstValue::DType("bfloat16".into())),
        ("tl.float8e5", ConstValue::DType("float8e5".into())),
        ("torch.float8_e5m2", ConstValue::DType("float8e5".into())),
    ] {
        assert_eq!(ConstValue::parse(t), Some(v), "{t}");
    }
    for t in ["mean", "x.stride(0)", "tl.nothing", "cdiv(N, 2)"] {
        assert_eq!(ConstValue::parse(t), None, "{t}");
    }
}

// ---------------------------------------------------------------- item 3: imports

#[test]
fn guarded_imports_and_every_libdevice_path() {
    for (import, call) in [
        ("try:\n    from triton.language.extra.libdevice import rsqrt\nexcept ModuleNotFoundError:\n    from triton.language.math import rsqrt\n", "rsqrt(x)"),
        ("if triton.__version__ >= '3.0.0':\n    from triton.language.extra.cuda.libdevice import rsqrt\nelse:\n    from triton.language.math import rsqrt\n", "rsqrt(x)"),
        ("try:\n    import triton.language.extra.libdevice as libdevice\nexcept ImportError:\n    libdevice = tl.math\n", "libdevice.rsqrt(x)"),
        ("from triton.language.extra.hip import libdevice\n", "libdevice.rsqrt(x)"),
        ("", "tl.extra.cuda.libdevice.rsqrt(x)"),
        ("", "tl.math.rsqrt(x)"),
        ("from triton.language.math import rsqrt as _rsqrt\nfast_rsqrt = _rsqrt\n", "fast_rsqrt(x)"),
    ] {
        let src = format!(
            "{HEAD}{import}\n@triton.jit\ndef k(x_ptr, y_ptr, BLOCK: tl.constexpr):\n    offs = tl.arange(0, BLOCK)\n    x = tl.load(x_ptr + offs)\n    tl.store(y_ptr + offs, {call})\n"
        );
        let k = convert(&src, "k.py", "k", &ConvertOptions::with_constexprs(&[("BLOCK", 8)])).unwrap_or_else(|e| panic!("{import}: {e}"));
        assert_eq!(count(&k, |o| matches!(o, Op::Unary(crate::UnaryOp::Rsqrt))), 1, "{import}");
    }
    // libdevice functions that compose from IR ops.
    let src = format!(
        "{HEAD}from triton.language.extra import libdevice\n\n@triton.jit\ndef k(x_ptr, y_ptr, BLOCK: tl.constexpr):\n    offs = tl.arange(0, BLOCK)\n    x = tl.load(x_ptr + offs)\n    tl.store(y_ptr + offs, libdevice.pow(x, 2.0) + libdevice.log1p(x) + libdevice.fast_expf(x))\n"
    );
    let k = convert(&src, "k.py", "k", &ConvertOptions::with_constexprs(&[("BLOCK", 8)])).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::Binary(BinaryOp::Pow))), 1);
    assert_eq!(count(&k, |o| matches!(o, Op::Unary(crate::UnaryOp::Log) | Op::Unary(crate::UnaryOp::Exp))), 2);
}

/// A directory of its own under the system's temporary directory.
fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("tilegrad-surface-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn helpers_imported_from_sibling_and_package_modules() {
    let d = temp_dir("imports");
    std::fs::create_dir_all(d.join("pkg/ops")).unwrap();
    std::fs::write(d.join("pkg/__init__.py"), "").unwrap();
    std::fs::write(
        d.join("pkg/utils.py"),
        format!("{HEAD}SCALE = 3.0\n\n@triton.jit\ndef triton_tanh(x):\n    return tl.math.tanh(x) * SCALE\n\n@triton.jit\ndef broken(x):\n    return x.foo\n"),
    )
    .unwrap();
    std::fs::write(
        d.join("pkg/ops/helpers.py"),
        format!("{HEAD}from ..utils import triton_tanh\n\n@triton.jit\ndef twice(x):\n    return triton_tanh(x) * 2.0\n"),
    )
    .unwrap();
    let kernel = format!(
        "{HEAD}from .helpers import twice\nfrom .. import utils\nfrom pkg.utils import SCALE\n\n@triton.jit\ndef k(x_ptr, y_ptr, BLOCK: tl.constexpr):\n    offs = tl.arange(0, BLOCK)\n    x = tl.load(x_ptr + offs)\n    tl.store(y_ptr + offs, twice(x) + utils.triton_tanh(x) * SCALE)\n"
    );
    let path = d.join("pkg/ops/kernel.py");
    std::fs::write(&path, &kernel).unwrap();
    let file = path.display().to_string();
    let opts = ConvertOptions::with_constexprs(&[("BLOCK", 8)]);
    let k = convert(&kernel, &file, "k", &opts).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(count(&k, |o| matches!(o, Op::Unary(crate::UnaryOp::Tanh))), 2);
    // Ops of the helper point at the helper's file.
    let mut tanh_files = Vec::new();
    k.walk(&mut |_, dd| {
        if let Op::Unary(crate::UnaryOp::Tanh) = dd.op {
            tanh_files.push((dd.loc.file.to_string(), dd.loc.line));
        }
    });
    assert!(tanh_files.iter().all(|(f, l)| f.ends_with("utils.py") && *l == 8), "{tanh_files:?}");
    // An error inside an imported helper is located in its own file.
    let bad = kernel.replace("utils.triton_tanh(x) * SCALE", "utils.broken(x)");
    let (f, line, col, m) = err_at(convert(&bad, &file, "k", &opts));
    assert!(f.ends_with("utils.py") && (line, col) == (12, 12), "{f}:{line}:{col}: {m}");
    // A name the sibling module lacks.
    let bad = kernel.replace("from .helpers import twice", "from .helpers import thrice as twice");
    let (_, line, _, m) = err_at(convert(&bad, &file, "k", &opts));
    assert_eq!(line, 12, "at the use");
    assert!(m.contains("`thrice` is not defined in") && m.contains("helpers.py"), "{m}");
    let _ = std::fs::remove_dir_all(&d);
}

// ---------------------------------------------------------------- item 4: builtins on tensors

#[test]
fn python_min_max_and_dtype_calls_on_tensors() {
    let src = format!(
        "{HEAD}@triton.jit\ndef k(x_ptr, y_ptr, BLOCK: tl.constexpr):\n    offs = tl.arange(0, BLOCK)\n    x = tl.load(x_ptr + offs)\n    y = min(max(x, 0.0), 6.0, BLOCK)\n    z = tl.float16(y) + tl.float32(2)\n    tl.store(y_ptr + offs, tl.int32(z).to(tl.float32) + max(1, 2))\n"
    );
    let k = convert(&src, "k.py", "k", &ConvertOptions::with_constexprs(&[("BLOCK", 8)])).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::Binary(BinaryOp::Max))), 1);
    assert_eq!(count(&k, |o| matches!(o, Op::Binary(BinaryOp::Min))), 2);
    let mut casts = Vec::new();
    k.walk(&mut |_, d| {
        if let Op::Cast = d.op {
            casts.push(k.ty(d.results[0]).dtype().unwrap());
        }
    });
    // f16(y), the f32 constant 2 promoted with it, i32(z), f32 of it.
    assert!(casts.contains(&DType::F16) && casts.contains(&DType::I32), "{casts:?}");
    let bad = src.replace("tl.float16(y)", "tl.float16(offs, x)");
    let (_, line, col, m) = err_at(convert(&bad, "k.py", "k", &ConvertOptions::with_constexprs(&[("BLOCK", 8)])));
    assert_eq!((line, col), (9, 26));
    assert!(m.contains("at most 1 positional"), "{m}");
}

// ---------------------------------------------------------------- item 5: early return, branches

#[test]
fn early_return_under_a_runtime_if_becomes_an_if_over_the_rest() {
    let src = format!(
        "{HEAD}@triton.jit\ndef k(x_ptr, y_ptr, label_ptr, ignore_index, BLOCK: tl.constexpr):\n    row = tl.program_id(0)\n    offs = tl.arange(0, BLOCK)\n    label = tl.load(label_ptr + row)\n    if label == ignore_index:\n        tl.store(y_ptr + row * BLOCK + offs, tl.zeros([BLOCK], dtype=tl.float32))\n        return\n    x = tl.load(x_ptr + row * BLOCK + offs)\n    if label > 3:\n        x = x * 2.0\n    tl.store(y_ptr + row * BLOCK + offs, x)\n"
    );
    let k = convert(&src, "k.py", "k", &ConvertOptions::with_constexprs(&[("BLOCK", 8)])).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::If { .. })), 2, "the early return and the inner if");
    assert_eq!(count(&k, |o| matches!(o, Op::Store { .. })), 2);
    // A return inside a loop is refused at its line:column.
    let bad = format!(
        "{HEAD}@triton.jit\ndef k(x_ptr, n, BLOCK: tl.constexpr):\n    for i in range(n):\n        if i == 3:\n            return\n        tl.store(x_ptr + i, 1.0)\n"
    );
    let (_, line, col, m) = err_at(convert(&bad, "k.py", "k", &ConvertOptions::with_constexprs(&[("BLOCK", 8)])));
    assert_eq!((line, col), (8, 13));
    assert!(m.contains("`return` inside a loop"), "{m}");
}

#[test]
fn helper_returns_a_value_from_each_branch() {
    let src = format!(
        "{HEAD}@triton.jit\ndef pick(x, flag):\n    if flag > 0:\n        return x * 2.0\n    return x - 1.0\n\n@triton.jit\ndef half(x, flag):\n    if flag > 0:\n        return x * 0.5\n    x = x + 1.0\n\n@triton.jit\ndef k(x_ptr, y_ptr, flag, BLOCK: tl.constexpr):\n    offs = tl.arange(0, BLOCK)\n    tl.store(y_ptr + offs, pick(tl.load(x_ptr + offs), flag))\n"
    );
    let k = convert(&src, "k.py", "k", &ConvertOptions::with_constexprs(&[("BLOCK", 8)])).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::If { .. })), 1);
    let bad = src.replace("pick(tl.load", "half(tl.load");
    let (_, line, _, m) = err_at(convert(&bad, "k.py", "k", &ConvertOptions::with_constexprs(&[("BLOCK", 8)])));
    assert!(m.contains("returns a value on some paths only"), "{line}: {m}");
}

#[test]
fn loop_local_names_assigned_in_both_branches() {
    let src = format!(
        "{HEAD}@triton.jit\ndef k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):\n    acc = tl.zeros([BLOCK], dtype=tl.float32)\n    for i in range(n):\n        x = tl.load(x_ptr + i * BLOCK + tl.arange(0, BLOCK))\n        if i % 2 == 0:\n            t = x * 2.0\n            s = 1.0\n        else:\n            t = x - 1.0\n            s = 2.0\n        acc += t * s\n    tl.store(y_ptr + tl.arange(0, BLOCK), acc)\n"
    );
    let k = convert(&src, "k.py", "k", &ConvertOptions::with_constexprs(&[("BLOCK", 8)])).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(count(&k, |o| matches!(o, Op::If { .. })), 1);
    // Assigned in one branch only and used after: the error names it at the branch.
    let bad = src.replace("            t = x - 1.0\n", "");
    let (_, line, _, m) = err_at(convert(&bad, "k.py", "k", &ConvertOptions::with_constexprs(&[("BLOCK", 8)])));
    assert!(m.contains("undefined name `t`") || m.contains("`t` is defined in only one branch"), "{line}: {m}");
}
