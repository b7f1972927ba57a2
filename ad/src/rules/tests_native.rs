//! Native-precision agreement with the executable specification: each case builds a tiny kernel
//! (load the operands of each program, apply one op, store the result), runs it with the
//! reference interpreter on random data, and compares element by element with [`eval`] in
//! [`Precision::Native`] on the same data: bit-exact, except 1 ulp of f32 for `exp`-based and
//! transcendental ops whose reference implementation differs in rare ties.

use super::{eval, Precision};
use crate::BTile;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tilegrad_ir::{BinaryOp, DType, DotPrecision, KernelBuilder, Op, ReduceOp, Type, UnaryOp, Value};
use tilegrad_reference::{HostTensor, Launch, Memory};

/// Programs per launch.
const P: usize = 3;

/// Offsets `pid * numel + row-major index` of a tile of `shape` (rank 0..=2). Indices come from
/// cumsums of ones: `arange` requires a power of two, these shapes need not be one.
fn offsets(b: &mut KernelBuilder, shape: &[usize]) -> Value {
    let pid = b.program_id(0);
    let numel = b.i32(shape.iter().product::<usize>() as i32);
    let base = b.mul(pid, numel);
    if shape.is_empty() {
        return base;
    }
    let ones = b.full(shape, 1, DType::I32);
    let one = b.i32(1);
    let mut idx = b.zeros(shape, DType::I32);
    for (axis, _) in shape.iter().enumerate() {
        let c = b.cumsum(ones, axis as isize, false);
        let i = b.sub(c, one);
        let stride = b.i32(shape[axis + 1..].iter().product::<usize>() as i32);
        let i = b.mul(i, stride);
        idx = b.add(idx, i);
    }
    b.add(base, idx)
}

/// One native case: operand types and data (all programs), the op, and how to build it.
struct NCase {
    name: &'static str,
    op: Op,
    ins: Vec<Type>,
    out: Type,
    data: Vec<Vec<f64>>,
    /// Allowed difference in f32 ulps.
    ulps: u32,
    build: fn(&mut KernelBuilder, &[Value]) -> Value,
}

fn run(c: &NCase) {
    let mut b = KernelBuilder::new("native");
    let ptrs: Vec<Value> = c.ins.iter().enumerate().map(|(i, t)| b.ptr_param(&format!("x{i}"), t.dtype().unwrap())).collect();
    let yp = b.ptr_param("y", c.out.dtype().unwrap());
    let vals: Vec<Value> = ptrs
        .iter()
        .zip(&c.ins)
        .map(|(&p, t)| {
            let o = offsets(&mut b, &t.shape);
            let p = b.add(p, o);
            b.load(p, None, None)
        })
        .collect();
    let y = (c.build)(&mut b, &vals);
    let o = offsets(&mut b, &c.out.shape);
    let py = b.add(yp, o);
    b.store(py, y, None);
    let k = b.finish().unwrap_or_else(|e| panic!("{}: {e}", c.name));
    let mut found = false;
    k.walk(&mut |_, d| found |= d.op == c.op);
    assert!(found, "{}: the builder did not emit {:?}", c.name, c.op);

    let mut mem = Memory::new();
    let mut launch = Launch::new(&k, P);
    let mut args = Vec::new();
    for (i, (t, d)) in c.ins.iter().zip(&c.data).enumerate() {
        let id = mem.add(&format!("x{i}"), HostTensor::from_f64_as(t.dtype().unwrap(), &[d.len()], d));
        // The operands as the reference holds them (rounded to their dtype).
        args.push(BTile::new(P, &t.shape, mem[id].to_f64_vec()));
        launch = launch.arg(&format!("x{i}"), id);
    }
    let yid = mem.add("y", HostTensor::zeros(c.out.dtype().unwrap(), &[P * c.out.numel()]));
    launch.arg("y", yid).run(&mut mem).unwrap_or_else(|e| panic!("{}: {e}", c.name));
    let want = mem[yid].to_f64_vec();

    let refs: Vec<&BTile> = args.iter().collect();
    let tys: Vec<&Type> = c.ins.iter().collect();
    let got = eval(&c.op, &refs, &tys, &c.out, Precision::Native).unwrap_or_else(|e| panic!("{}: {e}", c.name));
    assert_eq!(got.batch, P);
    let mut off_by_one = 0;
    for (j, (&g, &w)) in got.data.iter().zip(&want).enumerate() {
        if g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()) {
            continue;
        }
        let ulps = (g as f32).to_bits().abs_diff((w as f32).to_bits());
        assert!(ulps <= c.ulps && g as f32 as f64 == g, "{}: element {j}: native eval {g:e}, reference {w:e} ({ulps} ulps)", c.name);
        off_by_one += 1;
    }
    // Ties are rare: a handful of elements at most.
    assert!(off_by_one <= 2, "{}: {off_by_one} elements differ by an ulp", c.name);
}

fn uni(rng: &mut StdRng, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..n).map(|_| rng.gen_range(lo..hi)).collect()
}

fn ints(rng: &mut StdRng, n: usize, lo: i64, hi: i64) -> Vec<f64> {
    (0..n).map(|_| rng.gen_range(lo..=hi) as f64).collect()
}

#[test]
fn native_eval_agrees_with_the_reference_interpreter() {
    use DType::*;
    let mut rng = StdRng::seed_from_u64(0x005e_ed0f_7e57);
    let t = Type::tile;
    let s = [5usize, 7];
    let n = P * 35;
    let mut cases = Vec::new();
    let unary = |name, u: UnaryOp, d: DType, data: Vec<f64>, ulps, build: fn(&mut KernelBuilder, &[Value]) -> Value| NCase {
        name,
        op: Op::Unary(u),
        ins: vec![t(d, &s)],
        out: t(d, &s),
        data: vec![data],
        ulps,
        build,
    };
    let binary = |name, op: BinaryOp, d: DType, a: Vec<f64>, b: Vec<f64>, build: fn(&mut KernelBuilder, &[Value]) -> Value| NCase {
        name,
        op: Op::Binary(op),
        ins: vec![t(d, &s), t(d, &s)],
        out: t(d, &s),
        data: vec![a, b],
        ulps: 0,
        build,
    };
    cases.push(binary("add f32", BinaryOp::Add, F32, uni(&mut rng, n, -3.0, 3.0), uni(&mut rng, n, -3.0, 3.0), |b, v| b.add(v[0], v[1])));
    cases.push(binary("add f16", BinaryOp::Add, F16, uni(&mut rng, n, -3.0, 3.0), uni(&mut rng, n, -3e-3, 3e-3), |b, v| b.add(v[0], v[1])));
    cases.push(binary("mul bf16", BinaryOp::Mul, BF16, uni(&mut rng, n, -3.0, 3.0), uni(&mut rng, n, -3.0, 3.0), |b, v| b.mul(v[0], v[1])));
    cases.push(binary("mul f32", BinaryOp::Mul, F32, uni(&mut rng, n, -3.0, 3.0), uni(&mut rng, n, -3.0, 3.0), |b, v| b.mul(v[0], v[1])));
    cases.push(binary("div f32", BinaryOp::Div, F32, uni(&mut rng, n, -3.0, 3.0), uni(&mut rng, n, 0.1, 3.0), |b, v| b.div(v[0], v[1])));
    cases.push(binary("pow f32", BinaryOp::Pow, F32, uni(&mut rng, n, 0.1, 3.0), uni(&mut rng, n, -2.0, 2.0), |b, v| b.pow(v[0], v[1])));
    cases.push(binary("mod f32", BinaryOp::Mod, F32, uni(&mut rng, n, -5.0, 5.0), uni(&mut rng, n, 0.3, 2.0), |b, v| b.rem(v[0], v[1])));
    cases.push(binary("max f32", BinaryOp::Max, F32, uni(&mut rng, n, -3.0, 3.0), uni(&mut rng, n, -3.0, 3.0), |b, v| {
        b.maximum(v[0], v[1])
    }));
    cases.push(binary("floordiv i32", BinaryOp::FloorDiv, I32, ints(&mut rng, n, -50, 50), ints(&mut rng, n, -7, -1), |b, v| {
        b.floordiv(v[0], v[1])
    }));
    cases.push(binary("mod i32", BinaryOp::Mod, I32, ints(&mut rng, n, -50, 50), ints(&mut rng, n, -7, -1), |b, v| b.rem(v[0], v[1])));
    cases.push(binary("mod i64", BinaryOp::Mod, I64, ints(&mut rng, n, -50, -1), ints(&mut rng, n, 1, 7), |b, v| b.rem(v[0], v[1])));
    let big = ints(&mut rng, n, i32::MAX as i64 - 100, i32::MAX as i64);
    cases.push(binary("add i32 wraps", BinaryOp::Add, I32, big, ints(&mut rng, n, 0, 200), |b, v| b.add(v[0], v[1])));
    let big = ints(&mut rng, n, 40000, 50000);
    cases.push(binary("mul i32 wraps", BinaryOp::Mul, I32, big.clone(), big, |b, v| b.mul(v[0], v[1])));
    cases.push(unary("exp f32", UnaryOp::Exp, F32, uni(&mut rng, n, -20.0, 20.0), 1, |b, v| b.exp(v[0])));
    cases.push(unary("exp f16", UnaryOp::Exp, F16, uni(&mut rng, n, -5.0, 5.0), 1, |b, v| b.exp(v[0])));
    cases.push(unary("tanh f32", UnaryOp::Tanh, F32, uni(&mut rng, n, -4.0, 4.0), 1, |b, v| b.tanh(v[0])));
    cases.push(unary("sigmoid f32", UnaryOp::Sigmoid, F32, uni(&mut rng, n, -8.0, 8.0), 1, |b, v| b.sigmoid(v[0])));
    cases.push(unary("erf f32", UnaryOp::Erf, F32, uni(&mut rng, n, -3.0, 3.0), 1, |b, v| b.erf(v[0])));
    cases.push(unary("sqrt f32", UnaryOp::Sqrt, F32, uni(&mut rng, n, 0.0, 9.0), 0, |b, v| b.sqrt(v[0])));
    cases.push(unary("rsqrt bf16", UnaryOp::Rsqrt, BF16, uni(&mut rng, n, 0.1, 9.0), 0, |b, v| b.rsqrt(v[0])));
    cases.push(unary("log f32", UnaryOp::Log, F32, uni(&mut rng, n, 0.1, 9.0), 0, |b, v| b.log(v[0])));
    cases.push(unary("sin f64", UnaryOp::Sin, F64, uni(&mut rng, n, -9.0, 9.0), 0, |b, v| b.sin(v[0])));
    let r = [4usize, 37];
    let red = |name, kind, axis: usize, d: DType, data: Vec<f64>, build: fn(&mut KernelBuilder, &[Value]) -> Value| NCase {
        name,
        op: Op::Reduce { kind, axis: axis as u8, keep_dims: false },
        ins: vec![t(d, &r)],
        out: t(if matches!(kind, ReduceOp::Argmax | ReduceOp::Argmin) { I32 } else { d }, &[r[1 - axis]]),
        data: vec![data],
        ulps: 0,
        build,
    };
    let rn = P * 4 * 37;
    cases.push(red("sum f32 last axis of 37", ReduceOp::Sum, 1, F32, uni(&mut rng, rn, -3.0, 3.0), |b, v| b.sum(v[0], Some(1), false)));
    cases.push(red("sum f32 axis 0", ReduceOp::Sum, 0, F32, uni(&mut rng, rn, -3.0, 3.0), |b, v| b.sum(v[0], Some(0), false)));
    cases.push(red("sum f64 last axis of 37", ReduceOp::Sum, 1, F64, uni(&mut rng, rn, -3.0, 3.0), |b, v| b.sum(v[0], Some(1), false)));
    cases.push(red("sum f16 last axis of 37", ReduceOp::Sum, 1, F16, uni(&mut rng, rn, -3.0, 3.0), |b, v| b.sum(v[0], Some(1), false)));
    cases.push(red("max f32", ReduceOp::Max, 1, F32, uni(&mut rng, rn, -3.0, 3.0), |b, v| b.max(v[0], Some(1), false)));
    cases.push(red("min f32 axis 0", ReduceOp::Min, 0, F32, uni(&mut rng, rn, -3.0, 3.0), |b, v| b.min(v[0], Some(0), false)));
    cases.push(red("argmax i32", ReduceOp::Argmax, 1, I32, ints(&mut rng, rn, -5, 5), |b, v| b.argmax(v[0], Some(1), false)));
    cases.push(NCase {
        name: "cumsum f32",
        op: Op::Cumsum { axis: 1, reverse: false },
        ins: vec![t(F32, &r)],
        out: t(F32, &r),
        data: vec![uni(&mut rng, rn, -3.0, 3.0)],
        ulps: 0,
        build: |b, v| b.cumsum(v[0], 1, false),
    });
    cases.push(NCase {
        name: "cumsum f16 reverse",
        op: Op::Cumsum { axis: 0, reverse: true },
        ins: vec![t(F16, &r)],
        out: t(F16, &r),
        data: vec![uni(&mut rng, rn, -3.0, 3.0)],
        ulps: 0,
        build: |b, v| b.cumsum(v[0], 0, true),
    });
    for (name, precision, d) in
        [("dot tf32", DotPrecision::Tf32, F32), ("dot ieee", DotPrecision::Ieee, F32), ("dot f16", DotPrecision::Ieee, F16)]
    {
        let (m, k, nn) = (16, 32, 16);
        cases.push(NCase {
            name,
            op: Op::Dot { precision },
            ins: vec![t(d, &[m, k]), t(d, &[k, nn]), t(F32, &[m, nn])],
            out: t(F32, &[m, nn]),
            data: vec![uni(&mut rng, P * m * k, -2.0, 2.0), uni(&mut rng, P * k * nn, -2.0, 2.0), uni(&mut rng, P * m * nn, -2.0, 2.0)],
            ulps: 0,
            build: match precision {
                DotPrecision::Tf32 => |b, v| b.dot_with(v[0], v[1], Some(v[2]), DotPrecision::Tf32),
                DotPrecision::Ieee => |b, v| b.dot_with(v[0], v[1], Some(v[2]), DotPrecision::Ieee),
            },
        });
    }
    let cast = |name, from: DType, to: DType, data, build: fn(&mut KernelBuilder, &[Value]) -> Value| NCase {
        name,
        op: Op::Cast,
        ins: vec![t(from, &s)],
        out: t(to, &s),
        data: vec![data],
        ulps: 0,
        build,
    };
    cases.push(cast("cast f32->f16", F32, F16, uni(&mut rng, n, -70000.0, 70000.0), |b, v| b.cast(v[0], DType::F16)));
    cases.push(cast("cast f64->bf16", F64, BF16, uni(&mut rng, n, -3.0, 3.0), |b, v| b.cast(v[0], DType::BF16)));
    cases.push(cast("cast f32->i32", F32, I32, uni(&mut rng, n, -3e9, 3e9), |b, v| b.cast(v[0], DType::I32)));
    cases.push(cast("cast i64->f32", I64, F32, ints(&mut rng, n, -(1 << 40), 1 << 40), |b, v| b.cast(v[0], DType::F32)));
    for c in &cases {
        run(c);
    }
}
