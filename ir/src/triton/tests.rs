//! Conversion tests: the IR the examples become (types, op counts, carried values, locations),
//! errors at exact line:column, and a mutation test showing that no input panics.

use super::{convert, kernels, ConvertOptions};
use crate::{DType, IrError, Kernel, Op, ParamKind, Type};

const VECTOR_ADD: &str = include_str!("../../../examples/triton/vector_add.py");
const WEIGHTED_SUM: &str = include_str!("../../../examples/triton/weighted_sum.py");
const WEIGHTED_SUM_DESC: &str = include_str!("../../../examples/triton/weighted_sum_desc.py");
const MATMUL: &str = include_str!("../../../examples/triton/matmul.py");
const L2: &str = include_str!("../../../examples/triton/l2_norm.py");
const SOFTMAX: &str = include_str!("../../../examples/triton/softmax.py");
const GREY: &str = include_str!("../../../examples/triton/grey.py");
const ALL: &[&str] = &[
    VECTOR_ADD,
    WEIGHTED_SUM,
    WEIGHTED_SUM_DESC,
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
fn autotune_configs_in_order_with_errors_at_their_line() {
    let src = "import triton\nBIG = 256\n@triton.autotune(configs=[triton.Config({'BLOCK': 64, 'EVEN': True}), triton.Config(kwargs={'BLOCK': BIG}, num_warps=8)], key=['n'])\n@triton.jit\ndef a(x_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr = False):\n    pass\n";
    let c = super::autotune_configs(src, "k.py", "a").unwrap();
    assert_eq!(c, vec![vec![("BLOCK".to_string(), 64), ("EVEN".to_string(), 1)], vec![("BLOCK".to_string(), 256)]]);
    assert!(super::autotune_configs(src.replace("@triton.autotune(configs=[triton.Config({'BLOCK': 64, 'EVEN': True}), triton.Config(kwargs={'BLOCK': BIG}, num_warps=8)], key=['n'])\n", "").as_str(), "k.py", "a").unwrap().is_empty());
    let gen = "import triton\n@triton.autotune(configs=[triton.Config({'B': b}) for b in [1, 2]], key=[])\n@triton.jit\ndef a(x_ptr):\n    pass\n";
    let e = super::autotune_configs(gen, "k.py", "a").unwrap_err().to_string();
    assert!(e.starts_with("k.py:2:26:") && e.contains("generated list"), "{e}");
    let bad = "import triton\n@triton.autotune(configs=[triton.Config({'B': 1.5})], key=[])\n@triton.jit\ndef a(x_ptr):\n    pass\n";
    let e = super::autotune_configs(bad, "k.py", "a").unwrap_err().to_string();
    assert!(e.starts_with("k.py:2:47:") && e.contains("`B` must be an integer"), "{e}");
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
fn a_float_bound_to_a_name_becomes_a_constant_on_the_line_that_bound_it() {
    // Line 5 binds the float, line 6 uses it: the constant is made at the use, with line 5's
    // location; the literal on line 6 keeps its own.
    let src = format!(
        "{HEAD}def k(x_ptr, y_ptr):\n    offs = tl.arange(0, 8)\n    scale = 0.5\n    y = tl.load(x_ptr + offs) * scale + 0.25\n    tl.store(y_ptr + offs, y)\n"
    );
    let k = convert(&src, "k.py", "k", &ConvertOptions::default()).unwrap();
    let mut consts = Vec::new();
    k.walk(&mut |_, d| {
        if let Op::Const { value: crate::Lit::Float(v) } = d.op {
            consts.push((v, d.loc.line - HEAD.lines().count() as u32));
        }
    });
    assert_eq!(consts, vec![(0.5, 3), (0.25, 4)]);
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
    let (l, c, m) = e("    i = 0\n    while True:\n        i += 1\n");
    assert_eq!((l, c), (7, 11));
    assert!(m.contains("`while` condition is always true"), "{m}");
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
    let (l, c, m) = e("    d = tl.make_tensor_descriptor(x_ptr, [n], [1], [B])\n    d.advance([0])\n");
    assert_eq!((l, c), (7, 5));
    assert!(m.contains("a tensor descriptor has no method `advance`"), "{m}");
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

// ---- tensor descriptors ------------------------------------------------------------------------

/// 1-based line and column of the first occurrence of `pat` in `src`.
fn line_col_of(src: &str, pat: &str) -> (u32, u32) {
    let i = src.find(pat).unwrap_or_else(|| panic!("`{pat}` not in source"));
    let line = src[..i].matches('\n').count() as u32 + 1;
    let col = src[..i].rsplit('\n').next().map_or(0, |l| l.chars().count()) as u32 + 1;
    (line, col)
}

#[test]
fn weighted_sum_with_descriptors_lowers_like_block_pointers() {
    let consts = [("ROWS_TILE_SIZE", 16), ("D_TILE_SIZE", 32)];
    let k = conv(WEIGHTED_SUM_DESC, "weighted_sum_fwd", &consts).unwrap();
    let bp = conv(WEIGHTED_SUM, "weighted_sum_fwd", &consts).unwrap();
    assert_eq!(k.params.len(), bp.params.len());
    // The descriptors are made before the loop and used inside it: only the accumulator is carried.
    let mut fors = Vec::new();
    k.walk(&mut |_, d| {
        if let Op::For { .. } = d.op {
            fors.push(d.results.iter().map(|&v| k.ty(v).clone()).collect::<Vec<_>>());
        }
    });
    assert_eq!(fors, vec![vec![Type::tile(DType::F32, &[16])]]);
    // Every dim is boundary-checked: masked, zero-padded loads and a masked store, with the same
    // bounds comparisons as the block-pointer version (x: 2 dims, weight: 1, output: 1).
    for kk in [&k, &bp] {
        assert_eq!(count(kk, |o| matches!(o, Op::Load { mask: true, other: true })), 2);
        assert_eq!(count(kk, |o| matches!(o, Op::Load { .. })), 2);
        assert_eq!(count(kk, |o| matches!(o, Op::Store { mask: true })), 1);
        assert_eq!(count(kk, |o| matches!(o, Op::Store { .. })), 1);
        assert_eq!(count(kk, |o| matches!(o, Op::Cmp(_))), 8);
    }
    // Ops carry the Python location of the access that produced them.
    let (xl, xc) = line_col_of(WEIGHTED_SUM_DESC, "x_desc.load");
    let (wl, wc) = line_col_of(WEIGHTED_SUM_DESC, "weight_desc.load");
    let (sl, sc) = line_col_of(WEIGHTED_SUM_DESC, "output_desc.store");
    let (mut loads, mut stores, mut cmps) = (Vec::new(), Vec::new(), Vec::new());
    k.walk(&mut |_, d| {
        assert_eq!(&*d.loc.file, "k.py");
        match d.op {
            Op::Load { .. } => loads.push((d.loc.line, d.loc.col)),
            Op::Store { .. } => stores.push((d.loc.line, d.loc.col)),
            Op::Cmp(_) => cmps.push(d.loc.line),
            _ => {}
        }
    });
    assert_eq!(loads, vec![(xl, xc), (wl, wc)]);
    assert_eq!(stores, vec![(sl, sc)]);
    assert_eq!(cmps, vec![xl, xl, xl, xl, wl, wl, sl, sl]);
}

#[test]
fn descriptor_forms_helpers_and_attributes() {
    // Positional and keyword forms, tuple offsets, constant offsets, 3 dims, the functional forms,
    // `.block_shape`, a descriptor passed to a helper and used in a loop and a tensor `if`.
    let src = format!(
        "{HEAD}def put(d, o, v):\n    d.store([o, 0, 0], v)\n\n@triton.jit\ndef k(x_ptr, y_ptr, n, B: tl.constexpr):\n    \
         dx = tl.make_tensor_descriptor(x_ptr, [n, 4, 8], [32, 8, 1], [B, 2, 8])\n    \
         dy = tl.make_tensor_descriptor(base=y_ptr, shape=(n, 4, 8), strides=(32, 8, 1), block_shape=(B, 2, 8), padding_option=\"zero\")\n    \
         acc = tl.zeros(dx.block_shape, dtype=tl.float32)\n    \
         for i in range(2):\n        acc += dx.load((0, i * 2, 0))\n    \
         if n > 3:\n        acc += tl.load_tensor_descriptor(dx, [1, 0, 0])\n    \
         put(dy, 0, acc)\n    tl.store_tensor_descriptor(dy, [B, 0, 0], acc)\n"
    );
    let k = conv(&src, "k", &[("B", 4)]).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::Load { mask: true, other: true })), 2);
    assert_eq!(count(&k, |o| matches!(o, Op::Store { mask: true })), 2);
    // 3 dims: 6 comparisons per access, and `n > 3`.
    assert_eq!(count(&k, |o| matches!(o, Op::Cmp(_))), 25);
    // A runtime last stride is accepted.
    let src = format!(
        "{HEAD}def k(x_ptr, n, s, B: tl.constexpr):\n    d = tl.make_tensor_descriptor(x_ptr, [n], [s], [B])\n    d.store([0], d.load([0]) * 2)\n"
    );
    assert!(conv(&src, "k", &[("B", 8)]).is_ok());
}

#[test]
fn descriptor_errors_at_line_and_column() {
    let e = |body: &str| err(&format!("{HEAD}def k(x_ptr, n, m, B: tl.constexpr):\n{body}"), &[("B", 4)]);
    let mk = "    d = tl.make_tensor_descriptor(x_ptr, [n, m], [m, 1], [B, B])\n";
    // Wrong number of offsets: at the offsets argument.
    let (l, c, m) = e(&format!("{mk}    x = d.load([0])\n"));
    assert_eq!((l, c), (7, 16), "{m}");
    assert!(m.contains("1 offsets for a tensor descriptor of rank 2"), "{m}");
    let (l, c, m) = e(&format!("{mk}    d.store((0, 1, 2), tl.zeros((B, B), dtype=tl.float32))\n"));
    assert_eq!((l, c), (7, 13), "{m}");
    assert!(m.contains("3 offsets"), "{m}");
    let (l, c, m) = e(&format!("{mk}    x = d.load(0)\n"));
    assert_eq!((l, c), (7, 16), "{m}");
    assert!(m.contains("list or tuple"), "{m}");
    // block_shape not constant: at the argument (positional or keyword).
    let (l, c, m) = e("    d = tl.make_tensor_descriptor(x_ptr, [n, m], [m, 1], [B, n])\n");
    assert_eq!((l, c), (6, 58), "{m}");
    assert!(m.contains("`block_shape` entries must be positive constant ints"), "{m}");
    let (l, c, m) = e("    d = tl.make_tensor_descriptor(x_ptr, shape=[n], strides=[1],\n        block_shape=[m])\n");
    assert_eq!((l, c), (7, 9), "{m}");
    assert!(m.contains("constant ints"), "{m}");
    // The last stride, when constant, must be 1.
    let (l, c, m) = e("    d = tl.make_tensor_descriptor(x_ptr, [n, m], [m, 2], [B, B])\n");
    assert_eq!((l, c), (6, 50), "{m}");
    assert!(m.contains("last stride of a tensor descriptor must be 1"), "{m}");
    let (l, c, m) = e("    d = tl.make_tensor_descriptor(x_ptr, [n], strides=[2], block_shape=[B])\n");
    assert_eq!((l, c), (6, 47), "{m}");
    assert!(m.contains("found the int 2"), "{m}");
    // `.load`/`.store` on something other than a descriptor.
    let (l, c, m) = e("    x = x_ptr.load([0])\n");
    assert_eq!((l, c), (6, 9), "{m}");
    assert!(m.contains("`.load` is a method of tensor descriptors"), "{m}");
    let (l, c, m) = e("    p = tl.make_block_ptr(x_ptr, (n,), (1,), (0,), (B,), (0,))\n    p.store([0], 1.0)\n");
    assert_eq!((l, c), (7, 5), "{m}");
    assert!(
        m.contains("`.store` is a method of tensor descriptors, not of a block pointer") || m.contains("not of a block pointer"),
        "{m}"
    );
    // Mismatched lengths, a non-pointer base, `tl.load` of a descriptor, reassignment in a loop.
    let (l, c, m) = e("    d = tl.make_tensor_descriptor(x_ptr, [n], [m, 1], [B, B])\n");
    assert_eq!((l, c), (6, 42), "{m}");
    assert!(m.contains("`shape` has 1 entries"), "{m}");
    let (l, c, m) = e("    d = tl.make_tensor_descriptor(n, [n], [1], [B])\n");
    assert_eq!((l, c), (6, 35), "{m}");
    assert!(m.contains("scalar pointer"), "{m}");
    let (l, _, m) = e(&format!("{mk}    x = tl.load(d)\n"));
    assert_eq!(l, 7);
    assert!(m.contains("desc.load"), "{m}");
    let (l, c, m) = e(&format!("{mk}    for i in range(n):\n        d = tl.make_tensor_descriptor(x_ptr, [n, m], [m, 1], [B, 2 * B])\n"));
    assert_eq!((l, c), (7, 5));
    assert!(m.contains("changes from a tensor descriptor of block shape [4, 4] to one of block shape [4, 8]"), "{m}");
}

#[test]
fn descriptor_reassigned_in_a_loop_is_carried() {
    // A descriptor rebuilt on another base each iteration: the loop carries its base, shape and
    // strides, and the store after the loop uses the last one.
    let src = format!(
        "{HEAD}def k(x_ptr, n, B: tl.constexpr):\n    d = tl.make_tensor_descriptor(x_ptr, [n], [1], [B])\n    \
         for i in range(3):\n        d = tl.make_tensor_descriptor(x_ptr + i * n, [n], [1], [B])\n    d.store([0], d.load([0]) + 1)\n"
    );
    let k = conv(&src, "k", &[("B", 8)]).unwrap();
    let mut fors = Vec::new();
    k.walk(&mut |_, d| {
        if let Op::For { .. } = d.op {
            fors.push(d.results.iter().map(|&v| k.ty(v).clone()).collect::<Vec<_>>());
        }
    });
    assert_eq!(fors, vec![vec![Type::ptr(DType::F32, &[]), Type::scalar(DType::I32), Type::scalar(DType::I32)]]);
}

/// `Y.dtype.element_ty` and `Out.type.element_ty` name a pointer's element dtype, as kernels
/// write when casting a result to the output's dtype.
#[test]
fn pointer_element_types() {
    let src = "import triton\nimport triton.language as tl\n\n@triton.jit\ndef k(X, Y, Out, BLOCK: tl.constexpr):\n    offs = tl.arange(0, BLOCK)\n    x = tl.load(X + offs)\n    tl.store(Y + offs, (x * 2).to(Y.dtype.element_ty))\n    tl.store(Out + offs, x.to(Out.type.element_ty))\n";
    let opts = ConvertOptions {
        constexprs: vec![("BLOCK".into(), 16.into())],
        pointer_dtypes: vec![("X".into(), DType::F32), ("Y".into(), DType::F16), ("Out".into(), DType::BF16)],
        ..ConvertOptions::default()
    };
    let k = convert(src, "k.py", "k", &opts).unwrap();
    let mut casts = Vec::new();
    k.walk(&mut |_, d| {
        if let Op::Cast = d.op {
            casts.push(k.ty(d.results[0]).dtype());
        }
    });
    assert_eq!(casts, vec![Some(DType::F16), Some(DType::BF16)]);
    let e = convert(&src.replace("Y.dtype.element_ty", "Y.dtype.shape"), "k.py", "k", &opts).unwrap_err();
    assert!(e.to_string().contains("the pointer type ptr<f16> has no attribute `shape`"), "{e}");
}

#[test]
fn long_chains_convert_and_deep_nesting_is_a_located_error() {
    // 7,400 terms of `1.0 + ...`: Python nests them to the left; the chain is walked iteratively.
    let terms = vec!["1.0"; 7_400].join(" + ");
    let k = conv(&format!("{HEAD}def k(x_ptr):\n    tl.store(x_ptr, {terms})\n"), "k", &[]).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::Store { .. })), 1);
    let k =
        conv(&format!("{HEAD}def k(x_ptr):\n    x = tl.load(x_ptr)\n    tl.store(x_ptr, x{})\n", " + x".repeat(7_400)), "k", &[]).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::Binary(crate::BinaryOp::Add))), 7_400);
    let limit = format!("nested deeper than {} levels", super::convert::MAX_NESTING);
    // Nested calls, unary minuses and parentheses: an error at the expression past the limit.
    for (expr, first_col) in [
        (format!("{}x{}", "tl.abs(".repeat(2_900), ")".repeat(2_900)), 21),
        (format!("{}x", "-".repeat(7_400)), 21),
        (format!("{}x{}", "x + (".repeat(300), ")".repeat(300)), 21),
    ] {
        let src = format!("{HEAD}def k(x_ptr):\n    x = tl.load(x_ptr)\n    tl.store(x_ptr, {expr})\n");
        let (line, col, msg) = err(&src, &[]);
        assert_eq!(line, 7, "{msg}");
        assert!(col > first_col && (col as usize) < first_col as usize + expr.len(), "{col}: {msg}");
        assert!(msg.contains(&limit), "{msg}");
    }
    // Blocks count too: 250 nested `if True:` (Python allows 100 levels of indentation).
    let mut body = String::new();
    for d in 0..250 {
        body.push_str(&format!("{}if True:\n", "    ".repeat(d + 1)));
    }
    body.push_str(&format!("{}tl.store(x_ptr, 1.0)\n", "    ".repeat(251)));
    let (line, _, msg) = err(&format!("{HEAD}def k(x_ptr):\n{body}"), &[]);
    assert!(msg.contains(&limit) && line > 100, "{line}: {msg}");
    // Module-level constants and attribute chains of any length are read without recursion.
    let src = format!("{HEAD}def k(x_ptr):\n    tl.store(x_ptr, C)\n\nC = {}3\n", "-".repeat(7_401));
    let k = conv(&src, "k", &[]).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::Store { .. })), 1);
    let src = format!("{HEAD}def k(x_ptr):\n    tl.store(x_ptr, tl{})\n", ".a".repeat(10_000));
    let (line, col, _) = err(&src, &[]);
    assert_eq!((line, col), (6, 21));
}

#[test]
fn tiles_above_tritons_element_limit_are_refused_at_their_line() {
    for (expr, n) in [("tl.zeros((16777216, 16777216), tl.float32)", 1u64 << 48), ("tl.arange(0, 2097152).to(tl.float32)", 1 << 21)] {
        let src = format!("{HEAD}def k(x_ptr):\n    y = {expr}\n    tl.store(x_ptr, tl.sum(y))\n");
        match conv(&src, "k", &[]) {
            Err(IrError::Invalid { kernel, diagnostics }) => {
                assert_eq!(kernel, "k");
                let d = diagnostics.iter().find(|d| d.message.contains("above the maximum of 1048576")).expect("a size diagnostic");
                assert_eq!(d.loc.line, 6, "{d}");
                assert!(d.message.contains(&n.to_string()), "{d}");
            }
            other => panic!("{expr}: expected an invalid kernel, got {other:?}"),
        }
    }
    // Constant folding checks its arithmetic.
    let (line, _, msg) = err(&format!("{HEAD}def k(x_ptr):\n    tl.store(x_ptr, tl.cdiv(-9223372036854775807 - 1, -1))\n"), &[]);
    assert!(line == 6 && msg.contains("integer overflow"), "{msg}");
    // At the limit, fine.
    let src = format!("{HEAD}def k(x_ptr):\n    y = tl.arange(0, 1048576).to(tl.float32)\n    tl.store(x_ptr, tl.sum(y))\n");
    conv(&src, "k", &[]).unwrap();
}

#[test]
fn a_deep_chain_before_a_syntax_error_is_a_located_error_not_a_stack_overflow() {
    // The parser drops the tree it built when it meets the error: 200,000 levels of it.
    for chain in [vec!["1"; 200_000].join(" + ") + " +", "-".repeat(200_000)] {
        let src = format!("{HEAD}def k(x_ptr):\n    tl.store(x_ptr, 1.0)\n\nX = {chain}\n");
        let (line, _, msg) = err(&src, &[]);
        assert!(line == 8 && msg.contains("Python syntax error"), "{line}: {msg}");
    }
}
