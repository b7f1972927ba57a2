//! Ill-typed and ill-formed kernels are rejected with every problem listed, each naming the
//! kernel, the op and the source location of the user's call.

use smallvec::smallvec;
use tilegrad_ir::{BinaryOp, DType, InstData, IrError, Kernel, KernelBuilder, Loc, Op, Type, Value};

/// The line of the caller, to compare with reported locations.
#[track_caller]
fn here() -> u32 {
    Loc::caller().line
}

fn diags(e: &IrError) -> Vec<String> {
    e.diagnostics().iter().map(|d| d.to_string()).collect()
}

#[test]
fn shapes_that_do_not_broadcast_point_at_the_builder_call() {
    let mut b = KernelBuilder::new("bad_shapes");
    let a = b.arange(0, 16);
    let c = b.arange(0, 32);
    let line = here() + 1;
    let _ = b.add(a, c);
    let e = b.finish().unwrap_err();
    let d = &e.diagnostics()[0];
    assert_eq!(d.kernel, "bad_shapes");
    assert_eq!(d.op, "add");
    assert_eq!(d.loc.line, line);
    assert!(d.loc.file.ends_with("errors.rs"), "{}", d.loc);
    assert!(d.message.contains("shapes [16] and [32] do not broadcast"), "{}", d.message);
    let text = e.to_string();
    assert!(text.starts_with("invalid kernel `bad_shapes`:"), "{text}");
    assert!(text.contains(&format!("errors.rs:{line}:")), "{text}");
}

#[test]
fn every_surface_error_is_collected() {
    let mut b = KernelBuilder::new("many");
    let x = b.ptr_param("x", DType::F32);
    let a = b.arange(0, 16);
    let f = b.cast(a, DType::F32);
    let _ = b.load(f, None, None); // not a pointer
    let m = b.arange(0, 8);
    let p = b.add(x, a);
    let _ = b.load(p, Some(m), None); // mask of i32, not i1
    let _ = b.arange(5, 5); // empty
    let _ = b.sum(f, Some(3), false); // axis out of range
    let _ = b.dot(f, f, None); // not 2-D
    let e = b.finish().unwrap_err();
    let d = diags(&e);
    assert_eq!(d.len(), 5, "{d:#?}");
    assert!(d[0].contains("op `load`: loads need a pointer, found f32[16]"), "{}", d[0]);
    assert!(d[1].contains("op `load`: mask must be i1, found i32[8]"), "{}", d[1]);
    assert!(d[2].contains("op `arange`: empty range 5..5"), "{}", d[2]);
    assert!(d[3].contains("op `sum`: axis 3 is out of range for f32[16]"), "{}", d[3]);
    assert!(d[4].contains("op `dot`: shapes f32[16] and f32[16] are not [M, K] and [K, N]"), "{}", d[4]);
}

#[test]
fn arange_must_have_a_power_of_two_length() {
    let mut b = KernelBuilder::new("np2");
    let _ = b.arange(0, 12);
    let e = b.finish().unwrap_err();
    assert!(diags(&e)[0].contains("range length 12 is not a power of two"), "{e}");
}

#[test]
fn loop_carried_values_must_keep_their_type() {
    let mut b = KernelBuilder::new("carry");
    let zero = b.i32(0);
    let n = b.i32(4);
    let one = b.i32(1);
    let acc = b.zeros(&[16], DType::F32);
    b.for_range(zero, n, one, None, &[acc], |b, _, _| vec![b.zeros(&[32], DType::F32)]);
    let e = b.finish().unwrap_err();
    assert!(diags(&e)[0].contains("op `for`: a carried value changes type from f32[16] to f32[32]"), "{e}");
}

/// Builds a kernel by hand (as a buggy pass or front end might) and checks the verifier.
#[test]
fn the_verifier_rejects_ill_typed_canonical_ops() {
    let loc = Loc::new("hand.tgir", 7, 3);
    let mut k = Kernel::new("hand", Loc::new("hand.tgir", 1, 1));
    let a = k.new_value(Type::tile(DType::F32, &[4]));
    let b = k.new_value(Type::tile(DType::I32, &[4]));
    let r = k.new_value(Type::tile(DType::F32, &[4]));
    k.insts.push(InstData { op: Op::Arange { start: 0, end: 4 }, args: smallvec![], results: smallvec![b], loc: loc.clone() });
    k.insts.push(InstData { op: Op::Binary(BinaryOp::Add), args: smallvec![a, b], results: smallvec![r], loc: loc.clone() });
    let body = k.body;
    k.blocks[body.index()].insts = vec![tilegrad_ir::Inst(0), tilegrad_ir::Inst(1)];
    let e = tilegrad_ir::verify(&k).unwrap_err();
    let d = diags(&e);
    assert!(d.iter().any(|m| m.contains("hand.tgir:7:3: kernel `hand`, op `add`: operand %0 is not defined before this use")), "{d:#?}");
    assert!(d.iter().any(|m| m.contains("op `add`: operands have different types f32[4] and i32[4]")), "{d:#?}");

    // A yield outside a loop body or branch.
    let mut k = Kernel::new("stray", Loc::new("s.tgir", 1, 1));
    k.insts.push(InstData { op: Op::Yield, args: smallvec![], results: smallvec![], loc: Loc::new("s.tgir", 2, 1) });
    let body = k.body;
    k.blocks[body.index()].insts = vec![tilegrad_ir::Inst(0)];
    let e = tilegrad_ir::verify(&k).unwrap_err();
    assert!(e.to_string().contains("s.tgir:2:1: kernel `stray`, op `yield`: `yield` may only end a loop body or an if branch"), "{e}");

    // A value used past its arena.
    let mut k = Kernel::new("oob", Loc::new("o.tgir", 1, 1));
    let r = k.new_value(Type::tile(DType::F32, &[4]));
    k.insts.push(InstData {
        op: Op::Unary(tilegrad_ir::UnaryOp::Exp),
        args: smallvec![Value(99)],
        results: smallvec![r],
        loc: loc.clone(),
    });
    let body = k.body;
    k.blocks[body.index()].insts = vec![tilegrad_ir::Inst(0)];
    let e = tilegrad_ir::verify(&k).unwrap_err();
    assert!(e.to_string().contains("operand %99 is not defined before this use"), "{e}");
}

#[test]
fn store_value_must_have_the_pointee_dtype_after_the_builder_casts() {
    // The builder casts the value to the pointee dtype (Triton's rule): a kernel storing an i32
    // tile into an f32 tensor verifies, and the IR holds an explicit cast.
    let mut b = KernelBuilder::new("st");
    let y = b.ptr_param("y", DType::F32);
    let a = b.arange(0, 8);
    let p = b.add(y, a);
    b.store(p, a, None);
    let k = b.finish().unwrap();
    let mut casts = 0;
    k.walk(&mut |_, d| casts += matches!(d.op, Op::Cast) as usize);
    assert_eq!(casts, 1);
}

#[test]
fn names_must_be_identifiers() {
    let mut b = KernelBuilder::new("k 1");
    b.ptr_param("3x", DType::F32);
    let e = b.finish().unwrap_err();
    let d = diags(&e);
    assert!(d.iter().any(|m| m.contains("kernel name `k 1` is not an identifier")), "{d:#?}");
    assert!(d.iter().any(|m| m.contains("parameter name `3x` is not an identifier")), "{d:#?}");
}
