//! Tests of the text format: round trips of builder kernels that use every op and attribute,
//! hand-written texts, exact positions of errors, and a mutation test that the parser never
//! panics.

use super::*;
use crate::builder::{KernelBuilder, Padding};
use crate::kernel::{Loc, ParamKind};
use crate::op::{BinaryOp, CmpOp, DotPrecision, Op, ReduceOp, UnaryOp};
use crate::types::{DType, Lit};
use std::collections::HashSet;
use std::sync::Arc;

/// Asserts both round-trip properties and returns the text.
fn round_trip(k: &Kernel) -> String {
    let text = k.to_string();
    let parsed = match parse_kernel(&text, "x") {
        Ok(p) => p,
        Err(e) => panic!("printed kernel does not parse: {e}\n{text}"),
    };
    assert_eq!(parsed, *k, "parse(print(k)) != k for\n{text}");
    assert_eq!(parsed.to_string(), text);
    text
}

/// Line, column and message of a syntax error.
fn perr(text: &str) -> (u32, u32, String) {
    match parse(text, "bad.tgir") {
        Err(IrError::Parse { file, error }) => {
            assert_eq!(file, "bad.tgir");
            (error.line, error.col, error.message)
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
}

fn assert_perr(text: &str, line: u32, col: u32, phrase: &str) {
    let (l, c, m) = perr(text);
    assert_eq!((l, c), (line, col), "wrong position for error `{m}` in\n{text}");
    assert!(m.contains(phrase), "message `{m}` lacks `{phrase}`");
}

/// Every op, attribute, dtype, unary/binary/cmp/reduce variant and memory form, without loops.
fn everything() -> Kernel {
    let mut b = KernelBuilder::new("everything");
    let x = b.ptr_param("x", DType::F32);
    let y = b.ptr_param("y", DType::F16);
    let z = b.ptr_param("z", DType::I64);
    let w = b.ptr_param("w", DType::BF16);
    let q = b.ptr_param("q", DType::F64);
    let mk = b.ptr_param("mk", DType::I1);
    let ip = b.ptr_param("ip", DType::I32);
    let n = b.scalar_param("n", DType::I32);
    let s = b.scalar_param("s", DType::F64);
    let blk = b.constexpr("BLOCK", 16);
    let pid = b.program_id(0);
    let p1 = b.program_id(1);
    let p2 = b.program_id(2);
    let n0 = b.num_programs(0);
    let n2 = b.num_programs(2);
    let t = b.add(pid, p1);
    let t = b.add(t, p2);
    let t = b.add(t, n0);
    let base = b.add(t, n2);
    let base = b.mul(base, blk);
    // Constants that must survive printing.
    let c_nan = b.f32(f32::NAN);
    let c_inf = b.f64(f64::INFINITY);
    let c_ninf = b.f64(f64::NEG_INFINITY);
    let c_nz = b.f64(-0.0);
    let c_tiny = b.f64(1e-300);
    let c_big = b.f64(1.5e300);
    let c_min = b.i64(i64::MIN);
    let c_true = b.constant(true, DType::I1);
    let c_false = b.constant(false, DType::I1);
    let c_third = b.f32(1.0 / 3.0);
    let sum = b.add(c_inf, c_ninf);
    let sum = b.add(sum, c_nz);
    let sum = b.add(sum, c_tiny);
    let sum = b.add(sum, c_big);
    let sum = b.add(sum, s);
    let bools = b.xor(c_true, c_false);
    // Offsets, masks, loads.
    let r = b.arange(0, 16);
    let offs = b.add(base, r);
    let mask = b.lt(offs, n);
    let mask = b.and(mask, bools);
    let px = b.add(x, offs);
    let v = b.load(px, Some(mask), Some(c_nan));
    let v2 = b.load(px, Some(mask), None);
    let v3 = b.load(px, None, None);
    // Every unary op.
    let mut acc = v;
    for f in [
        KernelBuilder::neg,
        KernelBuilder::abs,
        KernelBuilder::exp,
        KernelBuilder::exp2,
        KernelBuilder::log,
        KernelBuilder::log2,
        KernelBuilder::sqrt,
        KernelBuilder::rsqrt,
        KernelBuilder::sin,
        KernelBuilder::cos,
        KernelBuilder::tanh,
        KernelBuilder::sigmoid,
        KernelBuilder::erf,
        KernelBuilder::floor,
        KernelBuilder::ceil,
    ] {
        let u = f(&mut b, v2);
        acc = b.add(acc, u);
    }
    let nr = b.not(r);
    // Every binary op.
    let fv = b.sub(acc, v3);
    let fv = b.mul(fv, c_third);
    let fv = b.div(fv, v2);
    let fv = b.pow(fv, v);
    let fv = b.minimum(fv, v);
    let fv = b.maximum(fv, v2);
    let fv = b.rem(fv, v3);
    let iv = b.floordiv(offs, nr);
    let iv = b.rem(iv, r);
    let iv = b.minimum(iv, r);
    let iv = b.maximum(iv, r);
    let iv = b.and(iv, r);
    let iv = b.or(iv, r);
    let iv = b.xor(iv, r);
    let iv = b.umulhi(iv, r);
    // Every comparison, where, casts to every dtype.
    let c1 = b.eq(iv, r);
    let c2 = b.ne(fv, v);
    let c3 = b.le(iv, offs);
    let c4 = b.gt(fv, v2);
    let c5 = b.ge(iv, r);
    let c = b.or(c1, c2);
    let c = b.or(c, c3);
    let c = b.xor(c, c4);
    let c = b.and(c, c5);
    let sel = b.where_(c, fv, v);
    let h = b.cast(sel, DType::F16);
    let bf = b.cast(sel, DType::BF16);
    let d64 = b.cast(sel, DType::F64);
    let d64 = b.add(d64, sum);
    let i64v = b.cast(iv, DType::I64);
    let i64v = b.add(i64v, c_min);
    let i1v = b.cast(iv, DType::I1);
    // Stores of every dtype, masked and not, and atomics.
    let py = b.add(y, offs);
    b.store(py, h, Some(mask));
    let pz = b.add(z, offs);
    b.store(pz, i64v, None);
    let pw = b.add(w, offs);
    b.store(pw, bf, Some(c));
    let pq = b.add(q, offs);
    b.atomic_add(pq, d64, Some(mask));
    let pm = b.add(mk, offs);
    b.store(pm, i1v, None);
    let pi = b.add(ip, offs);
    b.atomic_add(pi, iv, None);
    // 2-D: expand_dims, broadcast, reshape, permute, reductions, scans, dot.
    let row = b.expand_dims(r, 1);
    let col = b.expand_dims(r, -2);
    let sixteen = b.i32(16);
    let rows = b.mul(row, sixteen);
    let idx = b.add(rows, col);
    let px2 = b.add(x, idx);
    let t2 = b.load(px2, None, None);
    let full = b.full(&[16, 16], 0.5f32, DType::F32);
    let t2 = b.add(t2, full);
    let zeros = b.zeros(&[16, 16], DType::F32);
    let t2 = b.add(t2, zeros);
    let wide = b.broadcast_to(v, &[16, 16]);
    let t2 = b.add(t2, wide);
    let t3 = b.reshape(t2, &[4, 4, 16]);
    let t3 = b.permute(t3, &[2, 0, 1]);
    let t2b = b.reshape(t3, &[16, 16]);
    let tt = b.trans(t2b);
    let r1 = b.sum(tt, Some(1), false);
    let r2 = b.max(tt, Some(0), true);
    let r3 = b.min(tt, None, false);
    let r4 = b.argmax(tt, Some(1), false);
    let r5 = b.argmin(tt, None, true);
    let cs = b.cumsum(tt, 1, false);
    let cr = b.cumsum(tt, 0, true);
    let ci = b.cumsum(r, 0, true);
    let dt = b.dot(cs, cr, None);
    let h2 = b.cast(dt, DType::F16);
    let dt2 = b.dot_with(h2, h2, Some(dt), DotPrecision::Ieee);
    let dt3 = b.dot_with(dt2, dt2, None, DotPrecision::Tf32);
    let all = b.add(dt3, r2);
    let all = b.add(all, r3);
    let all = b.add(all, r1);
    let r45 = b.add(r4, r5);
    let r45 = b.add(r45, ci);
    let all = b.add(all, r45);
    b.store(px2, all, None);
    b.finish().unwrap()
}

/// Loops with and without `max_iters` and carried values, nested loops, `if` with and without
/// results, block pointers.
fn loops() -> Kernel {
    let mut b = KernelBuilder::new("loops");
    let x = b.ptr_param("x", DType::F32);
    let out = b.ptr_param("out", DType::F32);
    let m = b.scalar_param("M", DType::I32);
    let n = b.scalar_param("N", DType::I32);
    let pid = b.program_id(0);
    let lo = b.i32(0);
    let one = b.i32(1);
    let sixteen = b.i32(16);
    let row0 = b.mul(pid, sixteen);
    let acc0 = b.zeros(&[16, 16], DType::F32);
    let cnt0 = b.i32(0);
    let bp = b.make_block_ptr(x, &[m, n], &[n, one], &[row0, lo], &[16, 16], &[1, 0]);
    let stepk = b.i64(16);
    let zero64 = b.i64(0);
    let init = [acc0, cnt0, bp.offsets[0], bp.offsets[1]];
    let res = b.for_range(lo, n, sixteen, Some(8), &init, |b, k, carried| {
        let cur = bp.with_offsets(&carried[2..4]);
        let tile = b.load_block(&cur, &[0, 1], Padding::Zero);
        let nan_tile = b.load_block(&cur, &[0], Padding::Nan);
        let raw = b.load_block(&cur, &[], Padding::None);
        let acc = b.add(carried[0], tile);
        let acc = b.add(acc, nan_tile);
        let acc = b.add(acc, raw);
        // A nested loop without carried values or max_iters.
        let two = b.i32(2);
        b.for_range(k, two, one, None, &[], |b, j, _| {
            let big = b.gt(j, k);
            b.if_else(
                big,
                |b| {
                    b.store_block(&cur, acc, &[0, 1]);
                    vec![]
                },
                |_| vec![],
            );
            vec![]
        });
        let next = b.add(carried[1], one);
        let adv = b.advance(&cur, &[zero64, stepk]);
        vec![acc, next, adv.offsets[0], adv.offsets[1]]
    });
    let flag = b.gt(res[1], lo);
    let picked = b.if_else(
        flag,
        |b| {
            let e = b.exp(res[0]);
            vec![e, res[1]]
        },
        |b| {
            let z = b.zeros(&[16, 16], DType::F32);
            vec![z, lo]
        },
    );
    // An `if` on an i32 condition (the builder compares it with 0).
    let again = b.if_else(res[1], |b| vec![b.f32(1.0)], |b| vec![b.f32(2.0)]);
    let scaled = b.mul(picked[0], again[0]);
    let ob = b.make_block_ptr(out, &[m, n], &[n, one], &[row0, lo], &[16, 16], &[1, 0]);
    b.store_block(&ob, scaled, &[0, 1]);
    // A loop with carried values and no max_iters.
    let fin = b.for_range(lo, m, one, None, &[picked[1]], |b, i, c| vec![b.add(c[0], i)]);
    let pf = b.add(out, fin[0]);
    let fv = b.cast(fin[0], DType::F32);
    b.store(pf, fv, None);
    b.finish().unwrap()
}

fn ops_of(k: &Kernel) -> Vec<Op> {
    let mut ops = Vec::new();
    k.walk(&mut |_, d| ops.push(d.op.clone()));
    ops
}

#[test]
fn builder_kernels_cover_every_op_and_round_trip() {
    let (a, l) = (everything(), loops());
    let mut ops = ops_of(&a);
    ops.extend(ops_of(&l));
    let names: HashSet<&str> = ops.iter().map(|o| o.mnemonic()).collect();
    for m in [
        "program_id",
        "num_programs",
        "const",
        "arange",
        "broadcast",
        "expand_dims",
        "reshape",
        "permute",
        "cmp",
        "where",
        "cast",
        "reduce",
        "cumsum",
        "dot",
        "addptr",
        "load",
        "store",
        "atomic_add",
        "for",
        "if",
        "yield",
    ] {
        assert!(names.contains(m), "no `{m}` op");
    }
    for u in UnaryOp::ALL {
        assert!(ops.contains(&Op::Unary(*u)), "no {u:?}");
    }
    for bo in BinaryOp::ALL {
        assert!(ops.contains(&Op::Binary(*bo)), "no {bo:?}");
    }
    for c in CmpOp::ALL {
        assert!(ops.contains(&Op::Cmp(*c)), "no {c:?}");
    }
    for r in ReduceOp::ALL {
        assert!(ops.iter().any(|o| matches!(o, Op::Reduce { kind, .. } if kind == r)), "no {r:?}");
    }
    for p in DotPrecision::ALL {
        assert!(ops.contains(&Op::Dot { precision: *p }), "no {p:?}");
    }
    let has = |f: &dyn Fn(&Op) -> bool| ops.iter().any(f);
    assert!(has(&|o| matches!(o, Op::Reduce { keep_dims: true, .. })));
    assert!(has(&|o| matches!(o, Op::Cumsum { reverse: true, .. })));
    assert!(has(&|o| matches!(o, Op::Cumsum { reverse: false, .. })));
    for (mask, other) in [(false, false), (true, false), (true, true)] {
        assert!(ops.contains(&Op::Load { mask, other }), "no load mask={mask} other={other}");
    }
    for mask in [false, true] {
        assert!(ops.contains(&Op::Store { mask }) && ops.contains(&Op::AtomicAdd { mask }));
    }
    assert!(has(&|o| matches!(o, Op::For { max_iters: Some(8), .. })));
    assert!(has(&|o| matches!(o, Op::For { max_iters: None, .. })));
    let all_types: HashSet<String> = a.values.iter().map(|v| v.ty.to_string()).collect();
    for d in DType::ALL {
        assert!(all_types.contains(&format!("{d}[16]")), "no {d} tile");
    }

    let ta = round_trip(&a);
    assert!(ta.starts_with("kernel everything(%x: ptr<f32>, %y: ptr<f16>"), "{ta}");
    assert!(ta.contains("%BLOCK: constexpr i32 = 16) @ \"ir/src/text/tests.rs\":"), "{ta}");
    for lit in ["const nan @", "const inf @", "const -inf @", "const -0.0 @", "const 1e-300 @", "const true @", "const false @"] {
        assert!(ta.contains(lit), "no `{lit}` in\n{ta}");
    }
    assert!(ta.contains(&format!("const {} @", i64::MIN)), "{ta}");
    assert!(ta.contains(", keep_dims @") && ta.contains(", reverse @") && ta.contains("precision=tf32"), "{ta}");
    assert!(ta.contains(", perm=[2, 0, 1] @"), "{ta}");
    let tl = round_trip(&l);
    assert!(tl.contains(", max_iters=8, iter_args(%"), "{tl}");
    assert!(tl.contains("iter_args() @"), "{tl}");
    assert!(tl.contains("} else {"), "{tl}");
    assert!(tl.contains("\n      if %"), "an if without results must start with `if`:\n{tl}");
    assert!(tl.contains("\n    for %"), "a for without results must start with `for`:\n{tl}");

    // Two kernels in one text.
    let module = print_module(&[a.clone(), l.clone()]);
    assert!(module.contains("}\n\nkernel loops("));
    assert_eq!(parse(&module, "m").unwrap(), vec![a, l]);
}

#[test]
fn unusual_locations_literals_and_params_round_trip() {
    // File names that need escaping, unknown-free locations of every op.
    let mut k = loops();
    let odd: Arc<str> = Arc::from("dir with space/we\"ird\\name\t\u{1}é.rs");
    for (i, inst) in k.insts.iter_mut().enumerate() {
        inst.loc = Loc { file: odd.clone(), line: i as u32 + 1, col: u32::MAX - i as u32 };
    }
    k.loc = Loc::new(odd.clone(), u32::MAX, 1);
    let text = round_trip(&k);
    assert!(text.contains(r#"@ "dir with space/we\"ird\\name\t\u{1}é.rs":1:4294967295"#), "{text}");

    // Constexpr parameters of other dtypes, NaNs with payloads, extreme integers.
    let text = "kernel c(%a: constexpr f32 = 0.5, %b: constexpr i1 = true, %c: constexpr i64 = -9223372036854775808,\n\
                %d: constexpr f64 = -inf, %e: constexpr bf16 = nan(0xfff8000000000001), %f: f16) {\n\
                %0: f64 = const nan(0x7ff0000000000001)\n\
                %1: f32 = const -1e-30\n\
                %2: f16 = const 3\n\
                %3: i64 = const -5\n\
                }\n";
    let k = parse_kernel(text, "c.tgir").unwrap();
    assert_eq!(k.params[0].kind, ParamKind::Constexpr(DType::F32, Lit::Float(0.5)));
    assert_eq!(k.params[2].kind, ParamKind::Constexpr(DType::I64, Lit::Int(i64::MIN)));
    assert_eq!(k.params[4].kind, ParamKind::Constexpr(DType::BF16, Lit::Float(f64::from_bits(0xfff8000000000001))));
    assert_eq!(k.params[5].kind, ParamKind::Scalar(DType::F16));
    let consts: Vec<Op> = ops_of(&k);
    assert_eq!(consts[0], Op::Const { value: Lit::Float(f64::from_bits(0x7ff0000000000001)) });
    assert_eq!(consts[2], Op::Const { value: Lit::Int(3) });
    let printed = k.to_string();
    assert!(printed.contains("%e: constexpr bf16 = nan(0xfff8000000000001)"), "{printed}");
    assert_eq!(parse_kernel(&printed, "c.tgir").unwrap(), k);
    assert_eq!(parse_kernel(&printed, "c.tgir").unwrap().to_string(), printed);
}

const HAND: &str = "# A kernel written by hand.
kernel scale(%x: ptr<f32>, %n: i32, %BLOCK: constexpr i32 = 128) {
  %pid: i32 = program_id 0
  %b: i32 = const 128
  %s: i32 = mul %pid, %b   # start of this program's block
  %lanes: i32[128] = arange 0, 128
  %st: i32[128] = broadcast %s
  %offs: i32[128] = add %st, %lanes

  %nt: i32[128] = broadcast %n
  %m: i1[128] = cmp lt %offs, %nt
  %xs: ptr<f32>[128] = broadcast %x
  %p: ptr<f32>[128] = addptr %xs, %offs
  %v: f32[128] = load %p, mask=%m
  %two: f32 = const 2.0
  %t: f32[128] = broadcast %two
  %r: f32[128] = mul %v, %t
     store %p, %r, mask=%m
}
";

#[test]
fn hand_written_kernel_gets_text_locations() {
    let k = parse_kernel(HAND, "hand.tgir").unwrap();
    assert_eq!(k.name, "scale");
    assert_eq!(k.loc, Loc::new("hand.tgir", 2, 1));
    let mut locs = Vec::new();
    k.walk(&mut |_, d| locs.push((d.op.mnemonic(), d.loc.clone())));
    assert_eq!(locs[0], ("program_id", Loc::new("hand.tgir", 3, 3)));
    assert_eq!(locs[2], ("mul", Loc::new("hand.tgir", 5, 3)));
    assert_eq!(locs.last().unwrap(), &("store", Loc::new("hand.tgir", 18, 6)));
    // The printed form carries those locations and names values by index.
    let text = round_trip(&k);
    assert!(text.contains("  %3: i32 = program_id 0 @ \"hand.tgir\":3:3\n"), "{text}");
    assert!(text.contains("store %12, %16, mask=%10 @ \"hand.tgir\":18:6\n"), "{text}");
}

#[test]
fn multi_kernel_file() {
    let text = format!("# two kernels\n\n{HAND}\n\n# and another\nkernel empty() {{\n}}\nkernel one(%n: i32) {{ # trailing comment\n  %0: i32 = add %n, %n\n}}");
    let ks = parse(&text, "multi.tgir").unwrap();
    let names: Vec<&str> = ks.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["scale", "empty", "one"]);
    assert_eq!(ks[1].insts.len(), 0);
    assert_eq!(ks[2].insts[0].loc, Loc::new("multi.tgir", 28, 3));
    assert_eq!(parse(&print_module(&ks), "multi.tgir").unwrap(), ks);
    let err = parse_kernel(&text, "multi.tgir").unwrap_err();
    assert!(err.to_string().contains("expected exactly one kernel, found 3"), "{err}");
}

#[test]
fn vector_add_example_parses() {
    let text = include_str!("../../../examples/vector_add.tgir");
    let k = parse_kernel(text, "examples/vector_add.tgir").unwrap();
    assert_eq!(k.name, "vector_add");
    let params: Vec<(&str, &ParamKind)> = k.params.iter().map(|p| (p.name.as_str(), &p.kind)).collect();
    assert_eq!(
        params,
        [
            ("x", &ParamKind::Ptr(DType::F32)),
            ("y", &ParamKind::Ptr(DType::F32)),
            ("out", &ParamKind::Ptr(DType::F32)),
            ("n", &ParamKind::Scalar(DType::I32)),
            ("BLOCK", &ParamKind::Constexpr(DType::I32, Lit::Int(1024))),
        ]
    );
    let ops = ops_of(&k);
    assert!(ops.contains(&Op::Load { mask: true, other: false }));
    assert_eq!(ops.last(), Some(&Op::Store { mask: true }));
    round_trip(&k);
}

/// A valid kernel in which error tests replace one line.
fn with_line(line: &str) -> String {
    format!("kernel k(%x: ptr<f32>, %n: i32) {{\n  %a: f32 = const 1.0\n  %i: i32 = const 2\n{line}\n}}\n")
}

#[test]
fn syntax_errors_point_at_the_token() {
    assert_perr("kernel k(%x: ptr<f32>, %n: i32] {\n}\n", 1, 31, "expected `,` or `)` after parameter, found `]`");
    assert_perr("kernel k(%x: ptr<f33>) {\n}\n", 1, 18, "unknown type `f33`");
    assert_perr("kernel k(%x: i32 {\n}\n", 1, 18, "expected `,` or `)` after parameter, found `{`");
    assert_perr(&with_line("  %b: f32 = foo %a"), 4, 13, "unknown op `foo`");
    assert_perr(&with_line("  %b: f32 = exp %nope"), 4, 17, "undefined value %nope");
    assert_perr(&with_line("  %a: f32 = exp %a"), 4, 3, "%a is already defined");
    assert_perr(&with_line("  %n: f32 = exp %a"), 4, 3, "%n is already defined");
    assert_perr(&with_line("  %b: f32[1] = expand_dims %a, axes=0"), 4, 32, "expected `axis`, found `axes`");
    assert_perr("kernel k() @ \"f.rs:1:1 {\n}\n", 1, 14, "unterminated string");
    assert_perr("kernel k() {\n  %a: f32 = const 1.0\n", 3, 1, "expected `}` to close kernel `k` (opened at 1:12)");
    assert_perr("kernel k() {\n}\nkernel j() {\n  %a: f32 = const 1.0\nkernel l() {\n}\n", 5, 1, "expected `}` to close kernel `j`");
    assert_perr("kernel k() {\n} extra\n", 2, 3, "expected end of line after the kernel, found `extra`");
    assert_perr("kernel k() {\n}\n\n  garbage here\n", 4, 3, "expected `kernel` to start a kernel, found `garbage`");
    assert_perr(&with_line("  %p: i32 = program_id 1x"), 4, 24, "invalid integer `1x`");
    assert_perr(&with_line("  %p: i32 = program_id 300"), 4, 24, "an axis 300 is out of range");
    assert_perr(&with_line("  %b: f32 = const 1.0.0"), 4, 19, "invalid number `1.0.0`");
    assert_perr(&with_line("  %b: f32 = add %a, %i %a"), 4, 24, "expected end of line after `add`, found `%a`");
    assert_perr(&with_line("  %b: f32 = add %a %i"), 4, 20, "expected `,` between operands, found `%i`");
    assert_perr(&with_line("  %b: f32 = load %x, other=%a"), 4, 22, "`other=` requires a mask");
    assert_perr(&with_line("  %b: f32 = cmp lq %a, %a"), 4, 17, "unknown comparison `lq`");
    assert_perr(&with_line("  %b: f32 = reduce avg %a, axis=0"), 4, 20, "unknown reduction `avg`");
    assert_perr(&with_line("  %b: f32 = dot %a, %a, %a, precision=fp8"), 4, 39, "unknown precision `fp8`");
    assert_perr(&with_line("  %b: f32 = const $"), 4, 19, "unexpected character `$`");
    assert_perr(&with_line("  % = const 1"), 4, 3, "expected a value name after `%`");
    assert_perr(&with_line("  %b f32 = const 1"), 4, 6, "expected `:` after %b, found `f32`");
    assert_perr(&with_line("  store %x, %a @ \"f\":x:1"), 4, 22, "expected a line number, found `x`");
    assert_perr("kernel k(%3: i32) {\n}\n", 1, 10, "parameter names must be identifiers");
    assert_perr("kernel k(%t: f32[4]) {\n}\n", 1, 14, "parameters must be scalars or scalar pointers");
    assert_perr("", 1, 1, "expected `kernel` to start a kernel, found end of input");
    assert_perr("# only a comment\n", 2, 1, "expected `kernel`");
    assert_perr("kernel k() @ \"a\\qb\":1:1 {\n}\n", 1, 14, "unknown escape `\\q`");
}

#[test]
fn scope_and_block_errors() {
    let lp = |body: &str| {
        format!(
            "kernel k(%n: i32) {{\n  %z: i32 = const 0\n  %o: i32 = const 1\n  %r: i32 = for %i: i32 = %z to %n step %o, iter_args(%c: i32 = %z) {{\n{body}\n  }}\n  %u: i32 = add %r, %c\n}}\n"
        )
    };
    // A value of a loop body is not visible after the loop.
    assert_perr(&lp("    yield %c"), 7, 21, "%c is not in scope here");
    // Nor is a loop's own result inside its body; nor may the body redefine it.
    assert_perr(&lp("    yield %r"), 5, 11, "%r is not in scope here");
    assert_perr(&lp("    %r: i32 = add %c, %c\n    yield %r"), 5, 5, "%r is already defined");
    assert_perr("kernel k(%n: i32) {\n  %r: i32 = for %r: i32 = %n to %n step %n, iter_args() {\n  }\n}\n", 2, 17, "%r is already defined");
    assert_perr(
        "kernel k(%n: i32) {\n  for %i: i32 = %n to %n step %n, iter_args() {\n  }\n  %j: i32 = add %i, %i\n}\n",
        4,
        17,
        "%i is not in scope here",
    );
    assert_perr(
        "kernel k(%n: i32) {\n  for %i: i32 = %n to %n step %n iter_args() {\n  }\n}\n",
        2,
        34,
        "expected `,` after the step, found `iter_args`",
    );
    assert_perr(
        "kernel k(%n: i32) {\n  for %i: i32 = %n to %n step %n, max_iter=3, iter_args() {\n  }\n}\n",
        2,
        35,
        "expected `max_iters=` or `iter_args`, found `max_iter`",
    );
    assert_perr(
        "kernel k(%c: i1) {\n  if %c {\n    yield\n  }\n  {\n  }\n}\n",
        4,
        4,
        "expected `else` after the `if` block, found end of line",
    );
    // Nesting is bounded.
    let mut deep = String::from("kernel k(%c: i1) {\n");
    for _ in 0..100 {
        deep.push_str("if %c {\n");
    }
    assert_perr(&deep, 66, 1, "nested more than 64 deep");
}

#[test]
fn verifier_errors_carry_text_locations() {
    // A zero dimension is a type error of the op that defines the value.
    let e = parse(&with_line("  %b: f32[0] = broadcast %a"), "bad.tgir").unwrap_err();
    let d = e.diagnostics();
    assert!(!d.is_empty(), "{e:?}");
    assert_eq!((d[0].op.as_str(), &d[0].loc), ("broadcast", &Loc::new("bad.tgir", 4, 3)), "{e}");
    assert!(d[0].message.contains("empty dimension"), "{e}");
    // Operands of different types.
    let e = parse(&with_line("  %b: f32 = add %a, %i"), "bad.tgir").unwrap_err();
    let IrError::Invalid { kernel, diagnostics } = &e else { panic!("{e:?}") };
    assert_eq!(kernel, "k");
    assert_eq!(diagnostics.len(), 1, "{e}");
    assert_eq!(diagnostics[0].op, "add");
    assert_eq!(diagnostics[0].loc, Loc::new("bad.tgir", 4, 3));
    assert!(diagnostics[0].message.contains("different types f32 and i32"), "{e}");
    // An explicit location wins over the text position.
    let e = parse(&with_line("  store %a, %a @ \"zoo.rs\":7:9"), "bad.tgir").unwrap_err();
    assert_eq!(e.diagnostics()[0].loc, Loc::new("zoo.rs", 7, 9), "{e}");
    // A loop body must end with `yield`.
    let e =
        parse("kernel k(%n: i32) {\n  for %i: i32 = %n to %n step %n, iter_args() {\n    %x: i32 = add %i, %i\n  }\n}\n", "b").unwrap_err();
    assert_eq!(e.diagnostics()[0].loc, Loc::new("b", 3, 5), "{e}");
    assert!(e.to_string().contains("must end with `yield`"), "{e}");
    // Huge shapes and ranges are reported, not a panic.
    assert!(parse(&with_line("  %b: f32[4294967296, 4294967296] = broadcast %a\n  %c: f32[2] = reshape %b"), "b").is_err());
    assert!(parse(&with_line("  %r: i32[1] = arange -9223372036854775808, 9223372036854775807"), "b").is_err());
}

/// A tiny deterministic generator (Knuth's MMIX LCG).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[test]
fn mutated_texts_never_panic() {
    const ALPHABET: &[char] = &[
        '%', ':', ',', '=', '(', ')', '[', ']', '{', '}', '@', '"', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'a', 'b', 'c', ' ',
        '\n', '-',
    ];
    let texts = [everything().to_string(), loops().to_string(), HAND.to_string()];
    let mut rng = Lcg(0x5eed);
    let (mut ok, mut failed) = (0, 0);
    for text in &texts {
        let base: Vec<char> = text.chars().collect();
        for _ in 0..2000 {
            let mut t = base.clone();
            for _ in 0..1 + rng.below(3) {
                let len = t.len();
                let a = rng.below(len + 1);
                let b = (a + 1 + rng.below(12)).min(len);
                match rng.below(3) {
                    0 => {
                        t.drain(a..b);
                    }
                    1 => {
                        let piece: Vec<char> = t[a..b].to_vec();
                        let at = rng.below(t.len() + 1);
                        t.splice(at..at, piece);
                    }
                    _ => t.insert(a, ALPHABET[rng.below(ALPHABET.len())]),
                }
            }
            let s: String = t.into_iter().collect();
            match parse(&s, "fuzz") {
                Ok(ks) => {
                    ok += 1;
                    // Whatever parses prints and parses back to itself.
                    let printed = print_module(&ks);
                    assert_eq!(parse(&printed, "fuzz").as_ref(), Ok(&ks), "{printed}");
                }
                Err(_) => failed += 1,
            }
        }
    }
    assert_eq!(ok + failed, 6000);
    assert!(failed > 3000, "mutations should mostly break the text ({ok} parsed)");
}

#[test]
fn tiles_above_the_element_limit_and_non_utf8_text_are_located_errors() {
    // A 2^24 x 2^24 tile (and one just over Triton's 2^20 elements) is refused at its op, before
    // any interpreter allocates it.
    for ty in ["f32[16777216, 16777216]", "f32[1048577]"] {
        let e = parse(&with_line(&format!("  %b: {ty} = broadcast %a")), "bad.tgir").unwrap_err();
        let d = e.diagnostics();
        assert!(!d.is_empty(), "{e:?}");
        assert_eq!((d[0].op.as_str(), &d[0].loc), ("broadcast", &Loc::new("bad.tgir", 4, 3)), "{e}");
        assert!(d[0].message.contains("above the maximum of 1048576 elements per tile"), "{e}");
    }
    parse(&with_line("  %b: f32[1024, 1024] = broadcast %a"), "ok.tgir").unwrap();
    // Bytes that are not UTF-8: the line:column of the first bad one.
    let mut bytes = b"kernel k() {\n  # caf\xc3\xa9 \xff\xfe\n}\n".to_vec();
    match crate::source_text(bytes.clone(), "bad.tgir") {
        Err(IrError::Parse { file, error }) => {
            assert_eq!((file.as_str(), error.line, error.col), ("bad.tgir", 2, 10), "{error}");
            assert!(error.message.contains("not valid UTF-8 (byte 0xff)"), "{error}");
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
    bytes.retain(|&b| b < 0xf0);
    assert_eq!(crate::source_text(bytes, "ok.tgir").unwrap(), "kernel k() {\n  # café \n}\n");
}

/// `while` loops and the atomics that return their old values: builder kernels round-trip, and
/// the verifier names misuse at its text position.
#[test]
fn while_loops_and_atomics_round_trip_and_verify() {
    use crate::op::AtomicOp;
    let mut b = KernelBuilder::new("spin");
    let lock = b.ptr_param("lock", DType::I32);
    let x = b.ptr_param("x", DType::F32);
    let n = b.scalar_param("n", DType::I32);
    let zero = b.i32(0);
    let one = b.i32(1);
    let r = b.while_loop(
        Some(5),
        &[zero],
        |b, c| {
            let old = b.atomic_cas(lock, zero, one);
            let held = b.eq(old, one);
            let small = b.lt(c[0], n);
            b.and(held, small)
        },
        |b, c| vec![b.add(c[0], one)],
    );
    let ar = b.arange(0, 16);
    let px = b.add(x, ar);
    let m = b.lt(ar, r[0]);
    let v = b.load(px, Some(m), None);
    let old = b.atomic_add(px, v, Some(m));
    for k in AtomicOp::ALL {
        let p = if matches!(k, AtomicOp::And | AtomicOp::Or | AtomicOp::Xor) { lock } else { x };
        let val = if p == lock { one } else { old };
        b.atomic_rmw(*k, p, val, None);
    }
    let k = b.finish().unwrap();
    let text = round_trip(&k);
    assert!(text.contains("while max_iters=5, iter_args(") && text.contains("} do ("), "{text}");
    for m in ["atomic_cas", "atomic_max", "atomic_min", "atomic_and", "atomic_or", "atomic_xor", "atomic_xchg"] {
        assert!(text.contains(&format!("= {m} ")), "no `{m}` in\n{text}");
    }
    // Misuse: a float `atomic_and`, a condition that is not i1, a carried type that changes.
    let bad = "kernel k(%p: ptr<f32>, %v: f32, %n: i32) {\n  %o: f32 = atomic_and %p, %v\n}\n";
    let e = parse(bad, "b").unwrap_err();
    assert_eq!(e.diagnostics()[0].loc, Loc::new("b", 2, 3), "{e}");
    assert!(e.to_string().contains("does not support f32"), "{e}");
    // Atomics whose operands do not have the pointer's element type (the text IR converts nothing).
    for (line, what) in [
        ("%o: i32 = atomic_cas %p, %f, %i", "`cmp` must be i32, found f32"),
        ("%o: i32 = atomic_cas %p, %i, %f", "value must be i32, found f32"),
        ("%o: i32 = atomic_add %p, %f", "value must be i32, found f32"),
    ] {
        let bad = format!("kernel k(%p: ptr<i32>, %f: f32, %i: i32) {{\n  {line}\n}}\n");
        let e = parse(&bad, "b").unwrap_err();
        assert_eq!(e.diagnostics()[0].loc, Loc::new("b", 2, 3), "{e}");
        assert!(e.to_string().contains(what) && e.to_string().contains("atomic_"), "{e}");
    }
    // A compare-and-swap whose `cmp` or value has another shape than its pointer (the text IR
    // broadcasts nothing, and Triton's op takes one shape for all three).
    for (line, what) in [
        ("%o: i32 = atomic_cas %p, %t, %i", "`cmp` must be i32, found i32[4]"),
        ("%o: i32[4] = atomic_cas %pt, %t, %i", "value must be i32[4], found i32"),
        ("%o: i32[4] = atomic_cas %pt, %i, %t", "`cmp` must be i32[4], found i32"),
    ] {
        let bad =
            format!("kernel k(%p: ptr<i32>, %i: i32) {{\n  %t: i32[4] = arange 0, 4\n  %pt: ptr<i32>[4] = broadcast %p\n  {line}\n}}\n");
        let e = parse(&bad, "b").unwrap_err();
        assert_eq!(e.diagnostics()[0].loc, Loc::new("b", 4, 3), "{e}");
        assert!(e.to_string().contains(what) && e.to_string().contains("atomic_cas"), "{e}");
    }
    let bad = "kernel k(%n: i32) {\n  %r: i32 = while iter_args(%a: i32 = %n) {\n    yield %a\n  } do (%b: i32) {\n    yield %b\n  }\n}\n";
    let e = parse(bad, "b").unwrap_err();
    assert!(e.to_string().contains("i1"), "{e}");
    assert_perr("kernel k(%n: i32) {\n  while iter_args() {\n    %c: i1 = const 0\n    yield %c\n  } od () {\n  }\n}\n", 5, 5, "`do`");
}
