//! Conversion tests: the IR the examples become (types, op counts, carried values, locations),
//! errors at exact line:column, and a mutation test showing that no input panics.

use super::{convert, kernels, ConvertOptions};
use crate::{DType, IrError, Kernel, Op, ParamKind, Type};

const VECTOR_ADD: &str = include_str!("../../../examples/triton/vector_add.py");
const WEIGHTED_SUM: &str = include_str!("../../../examples/triton/weighted_sum.py");
const MATMUL: &str = include_str!("../../../examples/triton/matmul.py");
const L2: &str = include_str!("../../../examples/triton/l2_norm.py");
const SOFTMAX: &str = include_str!("../../../examples/triton/softmax.py");
const GREY: &str = include_str!("../../../examples/triton/grey.py");
const ALL: &[&str] = &[
    VECTOR_ADD,
    WEIGHTED_SUM,
    MATMUL,
    L2,
    SOFTMAX,
    GREY,
    include_str!("../../../examples/triton/copy.py"),
    include_str!("../../../examples/triton/atomic_sum.py"),
];

fn conv(src: &str, name: &str, consts: &[(&str, i64)]) -> Result<Kernel, IrError> {
    convert(src, "k.py", name, &ConvertOptions::with_constexprs(consts))
}

fn count(k: &Kernel, f: impl Fn(&Op) -> bool) -> usize {
    let mut n = 0;
    k.walk(&mut |_, d| n += f(&d.op) as usize);
    n
}

/// The line:column and message of a parse error.
fn err(src: &str, consts: &[(&str, i64)]) -> (u32, u32, String) {
    match conv(src, "k", consts) {
        Err(IrError::Parse { file, error }) => {
            assert_eq!(file, "k.py");
            (error.line, error.col, error.message)
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
}

const HEAD: &str = "import triton\nimport triton.language as tl\n\n@triton.jit\n";

#[test]
fn lists_jit_kernels_under_autotune() {
    let src = "import triton\n@triton.autotune(configs=[], key=['n'])\n@triton.jit\ndef a(x_ptr):\n    pass\n\ndef host():\n    pass\n\n@triton.heuristics({})\n@triton.jit(do_not_specialize=['n'])\ndef b(x_ptr, n):\n    pass\n";
    assert_eq!(kernels(src, "k.py").unwrap(), vec!["a".to_string(), "b".to_string()]);
    assert_eq!(kernels(L2, "l2.py").unwrap(), vec!["l2_norm_partial".to_string(), "l2_norm_finish".to_string()]);
}

#[test]
fn vector_add_params_types_and_ops() {
    let k = conv(VECTOR_ADD, "vector_add", &[("BLOCK", 256)]).unwrap();
    let kinds: Vec<_> = k.params.iter().map(|p| (p.name.as_str(), p.kind.clone())).collect();
    assert_eq!(kinds[0], ("x_ptr", ParamKind::Ptr(DType::F32)));
    assert_eq!(kinds[3], ("n", ParamKind::Scalar(DType::I32)));
    assert!(matches!(kinds[4], ("BLOCK", ParamKind::Constexpr(DType::I32, crate::Lit::Int(256)))));
    assert_eq!(count(&k, |o| matches!(o, Op::Load { mask: true, other: false })), 2);
    assert_eq!(count(&k, |o| matches!(o, Op::Store { mask: true })), 1);
    assert_eq!(count(&k, |o| matches!(o, Op::Arange { start: 0, end: 256 })), 1);
    // Every op points at its Python line: program_id on line 8, the loads on 11 and 12, the store on 13.
    k.walk(&mut |_, d| {
        assert_eq!(&*d.loc.file, "k.py");
        match d.op {
            Op::Store { .. } => assert_eq!((d.loc.line, d.loc.col), (13, 5)),
            Op::Load { .. } => assert!(d.loc.line == 11 || d.loc.line == 12, "{:?}", d.loc),
            Op::ProgramId { .. } => assert_eq!(d.loc.line, 8),
            _ => assert!((8..=13).contains(&d.loc.line), "{:?} at {:?}", d.op, d.loc),
        }
    });
    assert_eq!(k.loc.line, 7);
}

#[test]
fn pointer_and_scalar_dtypes_from_options() {
    let src =
        format!("{HEAD}def k(x_ptr, out, n, scale):\n    tl.store(out + tl.arange(0, 4), tl.load(x_ptr + tl.arange(0, 4)) * scale)\n");
    let opts = ConvertOptions {
        pointer_dtypes: vec![("out".into(), DType::F16)],
        default_pointer_dtype: DType::F64,
        scalar_dtypes: vec![("scale".into(), DType::F32)],
        ..ConvertOptions::default()
    };
    let k = convert(&src, "k.py", "k", &opts).unwrap();
    let kinds: Vec<_> = k.params.iter().map(|p| p.kind.clone()).collect();
    assert_eq!(
        kinds,
        vec![ParamKind::Ptr(DType::F64), ParamKind::Ptr(DType::F16), ParamKind::Scalar(DType::I32), ParamKind::Scalar(DType::F32)]
    );
}

#[test]
fn literals_take_the_tensor_dtype() {
    let src = format!(
        "{HEAD}def k(x_ptr, y_ptr):\n    offs = tl.arange(0, 8) + 1\n    x = tl.load(x_ptr + offs) * 2.5\n    y = x.to(tl.float16) + 1\n    tl.store(y_ptr + offs, y)\n"
    );
    let k = convert(&src, "k.py", "k", &ConvertOptions { default_pointer_dtype: DType::F64, ..ConvertOptions::default() }).unwrap();
    let mut consts = Vec::new();
    k.walk(&mut |_, d| {
        if let Op::Const { .. } = d.op {
            consts.push(k.ty(d.results[0]).clone());
        }
    });
    assert_eq!(consts, vec![Type::scalar(DType::I32), Type::scalar(DType::F64), Type::scalar(DType::F16)]);
}

#[test]
fn weighted_sum_carries_accumulator_and_block_pointer_offsets() {
    let k = conv(WEIGHTED_SUM, "weighted_sum_fwd", &[("ROWS_TILE_SIZE", 16), ("D_TILE_SIZE", 32)]).unwrap();
    let mut fors = Vec::new();
    k.walk(&mut |_, d| {
        if let Op::For { .. } = d.op {
            fors.push(d.results.iter().map(|&v| k.ty(v).clone()).collect::<Vec<_>>());
        }
    });
    assert_eq!(fors.len(), 1);
    // output (f32[16]), then the x offsets (2 x i64) and the weight offset (i64).
    assert_eq!(fors[0], vec![Type::tile(DType::F32, &[16]), Type::scalar(DType::I64), Type::scalar(DType::I64), Type::scalar(DType::I64)]);
    assert_eq!(count(&k, |o| matches!(o, Op::Load { mask: true, other: true })), 2);
    assert_eq!(count(&k, |o| matches!(o, Op::Reduce { .. })), 1);
}

#[test]
fn helpers_are_inlined_at_their_lines() {
    let k = conv(MATMUL, "matmul", &[("BLOCK_M", 16), ("BLOCK_N", 16), ("BLOCK_K", 8)]).unwrap();
    let mut loads = Vec::new();
    k.walk(&mut |_, d| {
        if let Op::Load { .. } = d.op {
            loads.push(d.loc.line);
        }
    });
    assert_eq!(loads, vec![9, 9]);
    assert_eq!(count(&k, |o| matches!(o, Op::Dot { precision: crate::DotPrecision::Ieee })), 1);
}

#[test]
fn static_range_unrolls_and_if_on_constants_folds() {
    let src = format!(
        "{HEAD}def k(x_ptr, N: tl.constexpr):\n    acc = tl.zeros((4,), dtype=tl.float32)\n    for i in tl.static_range(3):\n        if i % 2 == 0:\n            acc += tl.load(x_ptr + i * 4 + tl.arange(0, 4))\n    tl.store(x_ptr + tl.arange(0, 4), acc)\n"
    );
    let k = conv(&src, "k", &[("N", 1)]).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::Load { .. })), 2);
    assert_eq!(count(&k, |o| matches!(o, Op::For { .. })), 0);
}

#[test]
fn if_on_scalar_tensor_defines_values() {
    let src = format!(
        "{HEAD}def k(x_ptr, n):\n    v = 1.0\n    if n > 4:\n        v = tl.load(x_ptr)\n        w = 2.0\n    else:\n        w = 3.0\n    tl.store(x_ptr, v * w)\n"
    );
    let k = conv(&src, "k", &[]).unwrap();
    let mut ifs = Vec::new();
    k.walk(&mut |_, d| {
        if let Op::If { .. } = d.op {
            ifs.push((d.results.len(), d.loc.line));
        }
    });
    assert_eq!(ifs, vec![(2, 7)]);
}

#[test]
fn l2_finish_loop_and_module_constants() {
    let k = conv(L2, "l2_norm_finish", &[("BLOCK", 8)]).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::For { .. })), 1);
    let src = format!("BLOCK = 32\nSCALE: tl.constexpr = tl.constexpr(2)\n{HEAD}def k(x_ptr):\n    o = tl.arange(0, BLOCK * SCALE)\n    tl.store(x_ptr + o, o)\n");
    let k = conv(&src, "k", &[]).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::Arange { end: 64, .. })), 1);
}

#[test]
fn softmax_reductions_keep_dims() {
    let k = conv(SOFTMAX, "softmax", &[("BLOCK_ROWS", 2), ("BLOCK_COLS", 8)]).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::Reduce { keep_dims: true, .. })), 2);
}

#[test]
fn shape_ops_and_cumsum() {
    let src = format!(
        "{HEAD}def k(x_ptr):\n    a = tl.load(x_ptr + tl.arange(0, 8)[:, None] * 4 + tl.arange(0, 4)[None, :])\n    b = tl.trans(a)\n    c = tl.reshape(b.T, (32,))\n    d = tl.cumsum(tl.broadcast_to(tl.expand_dims(c, 0), (2, 32)), axis=1)\n    tl.store(x_ptr + tl.arange(0, 32), tl.sum(d, axis=0) + tl.max(a) + tl.argmax(c, axis=0))\n"
    );
    let k = conv(&src, "k", &[]).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::Cumsum { axis: 1, .. })), 1);
    assert_eq!(count(&k, |o| matches!(o, Op::Permute { .. })), 2);
}

#[test]
fn errors_at_line_and_column() {
    let e = |body: &str| err(&format!("{HEAD}def k(x_ptr, n, B: tl.constexpr):\n{body}"), &[("B", 4)]);
    // Line 6 is the first body line.
    let (l, c, m) = e("    x = = 2\n");
    assert_eq!((l, c), (6, 9), "{m}");
    assert!(m.contains("syntax error"), "{m}");
    let (l, c, m) = e("    x = tl.frobnicate(1)\n");
    assert_eq!((l, c), (6, 9), "{m}");
    assert!(m.contains("unsupported function `tl.frobnicate`"), "{m}");
    let (l, c, m) = e("    i = 0\n    while i < n:\n        i += 1\n");
    assert_eq!((l, c), (7, 5));
    assert!(m.contains("`while`"), "{m}");
    let (l, c, m) = e("    for i in range(n):\n        break\n");
    assert_eq!((l, c), (7, 9));
    assert!(m.contains("`break`"), "{m}");
    let (l, c, m) = e("    return 1\n");
    assert_eq!((l, c), (6, 5));
    assert!(m.contains("cannot return a value"), "{m}");
    let (l, c, m) = e("    y = x_ptr + zz\n");
    assert_eq!((l, c), (6, 17));
    assert!(m.contains("undefined name `zz`"), "{m}");
    let (l, c, m) = e("    x = tl.arange(0, B)\n    if x > 2:\n        pass\n");
    assert_eq!((l, c), (7, 8));
    assert!(m.contains("must be a scalar"), "{m}");
    let (l, c, m) = e("    tl.static_assert(B > 100, \"too small\")\n");
    assert_eq!((l, c), (6, 5));
    assert!(m.contains("too small"), "{m}");
    let (l, c, m) = e("    x = tl.arange(0, B)\n    x[0] = 1\n");
    assert_eq!((l, c), (7, 5));
    assert!(m.contains("immutable"), "{m}");
    let (l, c, m) = e("    x = tl.arange(0, B)[1]\n");
    assert_eq!((l, c), (6, 25));
    assert!(m.contains("`None` and `:`"), "{m}");
    let (l, _, m) = e("    x = tl.load(x_ptr, bogus=1)\n");
    assert_eq!(l, 6);
    assert!(m.contains("no parameter `bogus`"), "{m}");
    let (l, c, m) = e("    for i in range(n):\n        if i > 1:\n            return\n");
    assert_eq!((l, c), (8, 13));
    assert!(m.contains("`return` inside a loop"), "{m}");
    let (l, _, m) = e("    d = tl.make_tensor_descriptor(x_ptr, [n], [1], [B])\n");
    assert_eq!(l, 6);
    assert!(m.contains("tensor descriptors"), "{m}");
}

#[test]
fn missing_constexpr_and_unknown_kernel() {
    let (l, c, m) = err(&format!("{HEAD}def k(x_ptr, BLOCK: tl.constexpr):\n    pass\n"), &[]);
    assert_eq!((l, c), (5, 14));
    assert!(m.contains("`BLOCK`"), "{m}");
    let (_, _, m) = err(&format!("{HEAD}def other(x_ptr):\n    pass\n"), &[]);
    assert!(m.contains("no `@triton.jit` function named `k`"), "{m}");
    // A default value binds a constexpr left unbound.
    assert!(
        conv(&format!("{HEAD}def k(x_ptr, BLOCK: tl.constexpr = 8):\n    tl.store(x_ptr + tl.arange(0, BLOCK), 1.0)\n"), "k", &[]).is_ok()
    );
}

#[test]
fn builder_errors_carry_the_python_location() {
    let src = format!("{HEAD}def k(x_ptr):\n    a = tl.arange(0, 4)\n    b = tl.arange(0, 8)\n    tl.store(x_ptr + a, a + b)\n");
    let e = conv(&src, "k", &[]).unwrap_err();
    let d = e.diagnostics();
    assert!(!d.is_empty(), "{e}");
    assert_eq!((&*d[0].loc.file, d[0].loc.line, d[0].loc.col), ("k.py", 8, 25), "{e}");
}

#[test]
fn recursion_is_an_error_not_a_crash() {
    let src = format!("{HEAD}def f(x):\n    return f(x)\n\n@triton.jit\ndef k(x_ptr):\n    f(1)\n");
    let (l, _, m) = err(&src, &[]);
    assert_eq!(l, 6);
    assert!(m.contains("recursion"), "{m}");
}

/// Deterministic mutations of every example (byte deletions, duplications, swaps, and
/// insertions of Python tokens) never panic: they convert or give an error.
#[test]
fn mutated_sources_never_panic() {
    let tokens =
        ["(", ")", ":", "None", " + ", "[", "]", "\n    ", "tl.", "for i in range(3):\n", "0", "-", "*", ",", "=", "if x:", "\"", "."];
    let names: &[(&str, i64)] = &[
        ("BLOCK", 16),
        ("ROWS_TILE_SIZE", 4),
        ("D_TILE_SIZE", 8),
        ("BLOCK_M", 4),
        ("BLOCK_N", 4),
        ("BLOCK_K", 4),
        ("BLOCK_ROWS", 2),
        ("BLOCK_COLS", 4),
        ("BLOCK_H", 2),
        ("BLOCK_W", 4),
    ];
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut rand = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n.max(1) as u64) as usize
    };
    let mut outcomes = (0, 0);
    for src in ALL {
        let ks = kernels(src, "m.py").unwrap();
        for _ in 0..150 {
            let mut s: Vec<u8> = src.as_bytes().to_vec();
            for _ in 0..1 + rand(3) {
                let i = rand(s.len());
                match rand(4) {
                    0 => {
                        let n = 1 + rand(8);
                        s.drain(i..(i + n).min(s.len()));
                    }
                    1 => {
                        let t = tokens[rand(tokens.len())];
                        s.splice(i..i, t.bytes());
                    }
                    2 => {
                        let j = rand(s.len());
                        s.swap(i, j);
                    }
                    _ => {
                        let n = 1 + rand(20);
                        let chunk: Vec<u8> = s[i..(i + n).min(s.len())].to_vec();
                        s.splice(i..i, chunk);
                    }
                }
            }
            let Ok(m) = String::from_utf8(s) else { continue };
            for k in &ks {
                match conv(&m, k, names) {
                    Ok(_) => outcomes.0 += 1,
                    Err(_) => outcomes.1 += 1,
                }
            }
        }
    }
    assert!(outcomes.0 > 0 && outcomes.1 > 0, "{outcomes:?}");
}
