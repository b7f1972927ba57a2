//! The op table: every compute op and sub-variant on random shapes and batches, with each VJP
//! checked against central finite differences of [`eval`] along a random direction, batch-1
//! broadcasting checked against explicit replication, and the tie, zero-gradient and error rules.

use super::{eval, is_differentiable, vjp, Precision};
use crate::{AdError, BTile};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use smallvec::smallvec;
use tilegrad_ir::{BinaryOp, CmpOp, DType, DotPrecision, Lit, Op, ReduceOp, Type, UnaryOp};

/// How an operand's values are drawn.
#[derive(Clone, Copy, Debug)]
enum Gen {
    /// Uniform in [-2, 2].
    Normal,
    /// Uniform in [0.3, 2] (domains of log, sqrt, pow's base).
    Pos,
    /// |x| in [0.3, 2], random sign (away from abs's kink, a divisor).
    AwayZero,
    /// An integer plus a fraction in [0.2, 0.8] (away from floor/ceil's jumps).
    Frac,
    /// Per program, a shuffle of values at least 0.2 apart (no max/min ties).
    Distinct,
    /// Integers in [-20, 20].
    Int,
    /// Nonzero integers in [-5, 5] (divisors).
    IntNz,
    /// 0 or 1.
    Bool,
}

impl Gen {
    fn draw(self, rng: &mut StdRng, batch: usize, numel: usize) -> Vec<f64> {
        let one = |rng: &mut StdRng| match self {
            Gen::Normal => rng.gen_range(-2.0..2.0),
            Gen::Pos => rng.gen_range(0.3..2.0),
            Gen::AwayZero => rng.gen_range(0.3..2.0) * if rng.gen_bool(0.5) { 1.0 } else { -1.0 },
            Gen::Frac => rng.gen_range(-3..3) as f64 + rng.gen_range(0.2..0.8),
            Gen::Int => rng.gen_range(-20..=20) as f64,
            Gen::IntNz => (rng.gen_range(1..=5) * if rng.gen_bool(0.5) { 1 } else { -1 }) as f64,
            Gen::Bool => rng.gen_range(0..2) as f64,
            Gen::Distinct => unreachable!("drawn per program"),
        };
        if let Gen::Distinct = self {
            let mut out = Vec::with_capacity(batch * numel);
            for _ in 0..batch {
                let mut v: Vec<f64> = (0..numel).map(|i| i as f64 * 0.3 - 1.0 + rng.gen_range(-0.05..0.05)).collect();
                for i in (1..v.len()).rev() {
                    v.swap(i, rng.gen_range(0..=i));
                }
                out.extend(v);
            }
            return out;
        }
        (0..batch * numel).map(|_| one(rng)).collect()
    }
}

/// Operand `j` of program `b`, broadcasting a batch-1 tile.
fn at(t: &BTile, b: usize, j: usize) -> f64 {
    t.row(if t.batch == 1 { 0 } else { b })[j]
}

/// Moves operand 1 at least 0.2 away from operand 0 (no min/max ties, no flipping comparisons).
fn fix_apart(rng: &mut StdRng, args: &mut [BTile]) {
    let a = args[0].clone();
    let t = &mut args[1];
    for b in 0..t.batch {
        for j in 0..t.numel() {
            let s = if rng.gen_bool(0.5) { 1.0 } else { -1.0 };
            t.row_mut(b)[j] = at(&a, b, j) + s * rng.gen_range(0.2..1.0);
        }
    }
}

/// Picks divisors so that a / b has a fraction in [0.2, 0.8] (away from fmod's jumps).
fn fix_mod(rng: &mut StdRng, args: &mut [BTile]) {
    let a = args[0].clone();
    let t = &mut args[1];
    for b in 0..t.batch {
        for j in 0..t.numel() {
            let q = rng.gen_range(0..3) as f64 + rng.gen_range(0.2..0.8);
            t.row_mut(b)[j] = at(&a, b, j) / q * if rng.gen_bool(0.5) { 1.0 } else { -1.0 };
        }
    }
}

type Fix = fn(&mut StdRng, &mut [BTile]);

/// One row of the op table.
struct Case {
    name: String,
    op: Op,
    tys: Vec<Type>,
    rty: Type,
    gens: Vec<Gen>,
    fix: Option<Fix>,
    /// Every VJP must be a symbolic zero (piecewise-constant ops, integer operands).
    zero: bool,
}

fn case(name: impl Into<String>, op: Op, tys: Vec<Type>, rty: Type, gens: Vec<Gen>) -> Case {
    Case { name: name.into(), op, tys, rty, gens, fix: None, zero: false }
}

impl Case {
    fn fix(mut self, f: Fix) -> Case {
        self.fix = Some(f);
        self
    }
    fn zero(mut self) -> Case {
        self.zero = true;
        self
    }
}

const SIZES: [usize; 6] = [1, 2, 3, 5, 6, 7];

fn shape(rng: &mut StdRng, ranks: std::ops::RangeInclusive<usize>) -> Vec<usize> {
    let rank = rng.gen_range(ranks);
    (0..rank).map(|_| SIZES[rng.gen_range(0..SIZES.len())]).collect()
}

fn t(d: DType, s: &[usize]) -> Type {
    Type::tile(d, s)
}

/// The op table: every compute op and sub-variant, on random shapes.
fn table(rng: &mut StdRng) -> Vec<Case> {
    use DType::*;
    let mut cases = Vec::new();
    // Layout ops.
    for _ in 0..3 {
        let dst = shape(rng, 1..=3);
        let src: Vec<usize> = dst.iter().map(|&d| if rng.gen_bool(0.5) { 1 } else { d }).collect();
        cases.push(case("broadcast", Op::Broadcast, vec![t(F32, &src)], t(F32, &dst), vec![Gen::Normal]));
        cases.push(case("broadcast scalar", Op::Broadcast, vec![t(F64, &[])], t(F64, &dst), vec![Gen::Normal]));
        let src = shape(rng, 0..=2);
        let axis = rng.gen_range(0..=src.len());
        let mut dst = src.clone();
        dst.insert(axis, 1);
        cases.push(case("expand_dims", Op::ExpandDims { axis: axis as u8 }, vec![t(F32, &src)], t(F32, &dst), vec![Gen::Normal]));
        let src = shape(rng, 1..=3);
        let n: usize = src.iter().product();
        cases.push(case("reshape flat", Op::Reshape, vec![t(F32, &src)], t(F32, &[n]), vec![Gen::Normal]));
        cases.push(case("reshape", Op::Reshape, vec![t(F64, &[n])], t(F64, &[1, n, 1]), vec![Gen::Normal]));
        let src = shape(rng, 3..=3);
        let mut perm = vec![0u8, 1, 2];
        for i in (1..3).rev() {
            perm.swap(i, rng.gen_range(0..=i));
        }
        let dst: Vec<usize> = perm.iter().map(|&p| src[p as usize]).collect();
        cases.push(case(
            format!("permute {perm:?}"),
            Op::Permute { perm: perm.into() },
            vec![t(F32, &src)],
            t(F32, &dst),
            vec![Gen::Normal],
        ));
    }
    cases.push(case("reshape 2x3", Op::Reshape, vec![t(F32, &[2, 3])], t(F32, &[3, 2]), vec![Gen::Normal]));
    cases.push(case("trans", Op::Permute { perm: smallvec![1, 0] }, vec![t(F32, &[3, 5])], t(F32, &[5, 3]), vec![Gen::Normal]));
    // Unary maths.
    for d in [F32, F64, F16] {
        for &u in UnaryOp::ALL.iter().filter(|&&u| u != UnaryOp::Not) {
            let s = shape(rng, 0..=3);
            let g = match u {
                UnaryOp::Log | UnaryOp::Log2 | UnaryOp::Sqrt | UnaryOp::Rsqrt => Gen::Pos,
                UnaryOp::Abs => Gen::AwayZero,
                UnaryOp::Floor | UnaryOp::Ceil => Gen::Frac,
                _ => Gen::Normal,
            };
            let c = case(format!("{} {d}", u.name()), Op::Unary(u), vec![t(d, &s)], t(d, &s), vec![g]);
            cases.push(if matches!(u, UnaryOp::Floor | UnaryOp::Ceil) { c.zero() } else { c });
        }
    }
    for u in [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Not] {
        cases.push(case(format!("{} i32", u.name()), Op::Unary(u), vec![t(I32, &[5])], t(I32, &[5]), vec![Gen::Int]).zero());
    }
    cases.push(case("not i1", Op::Unary(UnaryOp::Not), vec![t(I1, &[3, 2])], t(I1, &[3, 2]), vec![Gen::Bool]).zero());
    // Binary maths.
    for d in [F32, F64] {
        for &b in BinaryOp::ALL {
            let s = shape(rng, 0..=3);
            let name = format!("{} {d}", b.name());
            let c = |g0, g1| case(name.clone(), Op::Binary(b), vec![t(d, &s), t(d, &s)], t(d, &s), vec![g0, g1]);
            cases.push(match b {
                BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul => c(Gen::Normal, Gen::Normal),
                BinaryOp::Div => c(Gen::Normal, Gen::AwayZero),
                BinaryOp::Mod => c(Gen::AwayZero, Gen::Normal).fix(fix_mod),
                BinaryOp::Min | BinaryOp::Max => c(Gen::Normal, Gen::Normal).fix(fix_apart),
                BinaryOp::Pow => c(Gen::Pos, Gen::Normal),
                BinaryOp::FloorDiv | BinaryOp::And | BinaryOp::Or | BinaryOp::Xor | BinaryOp::UMulHi => continue,
            });
        }
    }
    for &b in BinaryOp::ALL.iter().filter(|b| !b.float_only()) {
        let g1 = if matches!(b, BinaryOp::FloorDiv | BinaryOp::Mod) { Gen::IntNz } else { Gen::Int };
        for d in [I32, I64] {
            cases.push(
                case(format!("{} {d}", b.name()), Op::Binary(b), vec![t(d, &[7]), t(d, &[7])], t(d, &[7]), vec![Gen::Int, g1]).zero(),
            );
        }
    }
    for &b in BinaryOp::ALL.iter().filter(|b| b.bits_only()) {
        cases.push(case(format!("{} i1", b.name()), Op::Binary(b), vec![t(I1, &[6]), t(I1, &[6])], t(I1, &[6]), vec![Gen::Bool; 2]).zero());
    }
    for &k in CmpOp::ALL {
        let s = shape(rng, 2..=2);
        cases.push(
            case(format!("cmp {}", k.name()), Op::Cmp(k), vec![t(F32, &s), t(F32, &s)], t(I1, &s), vec![Gen::Normal; 2])
                .fix(fix_apart)
                .zero(),
        );
    }
    let s = shape(rng, 2..=2);
    cases.push(case("where", Op::Where, vec![t(I1, &s), t(F32, &s), t(F32, &s)], t(F32, &s), vec![Gen::Bool, Gen::Normal, Gen::Normal]));
    cases.push(
        case("where i32", Op::Where, vec![t(I1, &s), t(I32, &s), t(I32, &s)], t(I32, &s), vec![Gen::Bool, Gen::Int, Gen::Int]).zero(),
    );
    // Casts.
    for (from, to, g, zero) in [
        (F32, F64, Gen::Normal, false),
        (F64, F16, Gen::Normal, false),
        (F16, F32, Gen::Normal, false),
        (F32, I32, Gen::Frac, true),
        (I32, F32, Gen::Int, true),
        (I1, F32, Gen::Bool, true),
        (F64, I64, Gen::Frac, true),
        (F32, I1, Gen::AwayZero, true),
    ] {
        let s = shape(rng, 0..=2);
        let c = case(format!("cast {from}->{to}"), Op::Cast, vec![t(from, &s)], t(to, &s), vec![g]);
        cases.push(if zero { c.zero() } else { c });
    }
    // Reductions and scans.
    for &kind in ReduceOp::ALL {
        for keep_dims in [false, true] {
            let s = shape(rng, 1..=3);
            let axis = rng.gen_range(0..s.len());
            let mut rs = s.clone();
            if keep_dims {
                rs[axis] = 1;
            } else {
                rs.remove(axis);
            }
            let arg = matches!(kind, ReduceOp::Argmax | ReduceOp::Argmin);
            let rd = if arg { I32 } else { F32 };
            let g = if kind == ReduceOp::Sum { Gen::Normal } else { Gen::Distinct };
            let op = Op::Reduce { kind, axis: axis as u8, keep_dims };
            let c = case(format!("reduce {} axis {axis} keep {keep_dims}", kind.name()), op, vec![t(F32, &s)], t(rd, &rs), vec![g]);
            cases.push(if arg { c.zero() } else { c });
        }
    }
    cases.push(
        case(
            "reduce sum i32",
            Op::Reduce { kind: ReduceOp::Sum, axis: 0, keep_dims: false },
            vec![t(I32, &[5, 3])],
            t(I32, &[3]),
            vec![Gen::Int],
        )
        .zero(),
    );
    for reverse in [false, true] {
        for _ in 0..2 {
            let s = shape(rng, 1..=3);
            let axis = rng.gen_range(0..s.len());
            cases.push(case(
                format!("cumsum axis {axis} reverse {reverse}"),
                Op::Cumsum { axis: axis as u8, reverse },
                vec![t(F32, &s)],
                t(F32, &s),
                vec![Gen::Normal],
            ));
        }
    }
    for precision in [DotPrecision::Ieee, DotPrecision::Tf32] {
        for d in [F32, F64] {
            let s = shape(rng, 3..=3);
            let (m, k, n) = (s[0], s[1], s[2]);
            cases.push(case(
                format!("dot {} {d}", precision.name()),
                Op::Dot { precision },
                vec![t(d, &[m, k]), t(d, &[k, n]), t(d, &[m, n])],
                t(d, &[m, n]),
                vec![Gen::Normal; 3],
            ));
        }
    }
    cases
}

fn refs(v: &[BTile]) -> Vec<&BTile> {
    v.iter().collect()
}

fn dotp(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The same values in `batch` programs.
fn replicate(x: &BTile, batch: usize) -> BTile {
    if x.batch == batch {
        return x.clone();
    }
    BTile::new(batch, &x.shape, (0..batch).flat_map(|_| x.data.iter().copied()).collect())
}

/// Runs every check of one case with the given operand batches.
fn check_case(c: &Case, batches: &[usize], rng: &mut StdRng) {
    let tys: Vec<&Type> = c.tys.iter().collect();
    let what = format!("{} with batches {batches:?}", c.name);
    let mut args: Vec<BTile> =
        c.tys.iter().zip(&c.gens).zip(batches).map(|((ty, g), &b)| BTile::new(b, &ty.shape, g.draw(rng, b, ty.numel()))).collect();
    if let Some(f) = c.fix {
        f(rng, &mut args);
    }
    let y = eval(&c.op, &refs(&args), &tys, &c.rty, Precision::F64).unwrap_or_else(|e| panic!("{what}: {e}"));
    let batch = *batches.iter().max().unwrap();
    assert_eq!((y.batch, y.shape.as_slice()), (batch, c.rty.shape.as_slice()), "{what}: result");
    let cot = BTile::new(batch, &c.rty.shape, (0..batch * c.rty.numel()).map(|_| rng.gen_range(-1.0..1.0)).collect());
    let grads = vjp(&c.op, &refs(&args), &tys, &y, &c.rty, &cot).unwrap_or_else(|e| panic!("{what}: vjp: {e}"));
    assert_eq!(grads.len(), args.len(), "{what}: one cotangent per operand");

    // Batch-1 operands behave as if replicated across the programs.
    if batches.iter().any(|&b| b != batch) {
        let full: Vec<BTile> = args.iter().map(|a| replicate(a, batch)).collect();
        let yf = eval(&c.op, &refs(&full), &tys, &c.rty, Precision::F64).unwrap();
        assert_eq!(y, yf, "{what}: a batch-1 operand is broadcast over the programs");
        let gf = vjp(&c.op, &refs(&full), &tys, &yf, &c.rty, &cot).unwrap();
        for (i, (g, gf)) in grads.iter().zip(&gf).enumerate() {
            if let (Some(g), Some(gf)) = (g, gf) {
                if args[i].batch == batch {
                    assert_eq!(g, gf, "{what}: operand {i}");
                    continue;
                }
                let n = g.numel();
                let summed: Vec<f64> = (0..n).map(|j| (0..batch).map(|b| gf.row(b)[j]).sum()).collect();
                let close = g.data.iter().zip(&summed).all(|(x, y)| (x - y).abs() <= 1e-12 * (1.0 + y.abs()));
                assert!(close, "{what}: operand {i}: the cotangent of a batch-1 operand sums over the programs");
            }
        }
    }

    let loss = |args: &[BTile]| dotp(&eval(&c.op, &refs(args), &tys, &c.rty, Precision::F64).unwrap().data, &cot.data);
    for (i, g) in grads.iter().enumerate() {
        let diff = is_differentiable(&c.tys[i]);
        assert_eq!(g.is_some(), diff && !c.zero, "{what}: operand {i} cotangent presence");
        if !diff {
            continue;
        }
        let v: Vec<f64> = (0..args[i].data.len()).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let h = 1e-5;
        let fd = {
            let mut plus = args.clone();
            plus[i].data.iter_mut().zip(&v).for_each(|(x, d)| *x += h * d);
            let mut minus = args.clone();
            minus[i].data.iter_mut().zip(&v).for_each(|(x, d)| *x -= h * d);
            (loss(&plus) - loss(&minus)) / (2.0 * h)
        };
        match g {
            None => assert!(fd.abs() < 1e-9, "{what}: operand {i} has a symbolic-zero VJP but finite differences give {fd}"),
            Some(g) => {
                assert_eq!((g.batch, g.shape.as_slice()), (args[i].batch, args[i].shape.as_slice()), "{what}: operand {i} cotangent shape");
                let ad = dotp(&g.data, &v);
                let scale: f64 = g.data.iter().zip(&v).map(|(x, y)| (x * y).abs()).sum();
                let err = (fd - ad).abs();
                assert!(err <= 1e-6 * scale.max(1e-3), "{what}: operand {i}: AD {ad} vs FD {fd} (scale {scale})");
            }
        }
    }
}

#[test]
fn op_table_vjps_match_finite_differences() {
    let mut rng = StdRng::seed_from_u64(0x7113_67ad);
    let cases = table(&mut rng);
    let mut covered = std::collections::HashSet::new();
    for c in &cases {
        covered.insert(match &c.op {
            Op::Unary(u) => u.name().to_string(),
            Op::Binary(b) => b.name().to_string(),
            Op::Cmp(k) => format!("cmp {}", k.name()),
            Op::Reduce { kind, .. } => format!("reduce {}", kind.name()),
            Op::Dot { precision } => format!("dot {}", precision.name()),
            op => op.mnemonic().to_string(),
        });
        let n = c.tys.len();
        let mut configs = vec![vec![1; n], vec![3; n]];
        if n >= 2 {
            let mut mixed = vec![3; n];
            mixed[0] = 1;
            configs.push(mixed);
            let mut mixed = vec![3; n];
            mixed[n - 1] = 1;
            if c.fix.is_none() {
                configs.push(mixed);
            }
        }
        for batches in configs {
            check_case(c, &batches, &mut rng);
        }
    }
    let mut expected: Vec<String> = UnaryOp::ALL.iter().map(|u| u.name().to_string()).collect();
    expected.extend(BinaryOp::ALL.iter().map(|b| b.name().to_string()));
    expected.extend(CmpOp::ALL.iter().map(|k| format!("cmp {}", k.name())));
    expected.extend(ReduceOp::ALL.iter().map(|k| format!("reduce {}", k.name())));
    expected.extend(["dot ieee", "dot tf32"].map(String::from));
    expected.extend(["broadcast", "expand_dims", "reshape", "permute", "where", "cast", "cumsum"].map(String::from));
    for e in expected {
        assert!(covered.contains(&e), "the op table misses {e}");
    }
}

fn f(d: DType, s: &[usize], data: Vec<f64>) -> (BTile, Type) {
    (BTile::new(1, s, data), Type::tile(d, s))
}

#[test]
fn const_and_arange_are_batch_one() {
    let ty = Type::scalar(DType::F32);
    let c = Op::Const { value: Lit::Float(0.1) };
    assert_eq!(eval(&c, &[], &[], &ty, Precision::F64).unwrap().data, vec![0.1]);
    assert_eq!(eval(&c, &[], &[], &ty, Precision::Native).unwrap().data, vec![0.1f32 as f64]);
    let h = Type::scalar(DType::F16);
    assert_eq!(eval(&c, &[], &[], &h, Precision::Native).unwrap().data, vec![half::f16::from_f64(0.1).to_f64()]);
    let i = Type::scalar(DType::I32);
    assert_eq!(eval(&Op::Const { value: Lit::Int(-7) }, &[], &[], &i, Precision::F64).unwrap().data, vec![-7.0]);
    let b = Type::scalar(DType::I1);
    assert_eq!(eval(&Op::Const { value: Lit::Bool(true) }, &[], &[], &b, Precision::F64).unwrap().data, vec![1.0]);
    let a = eval(&Op::Arange { start: -2, end: 3 }, &[], &[], &Type::tile(DType::I32, &[5]), Precision::F64).unwrap();
    assert_eq!((a.batch, a.data.clone()), (1, vec![-2.0, -1.0, 0.0, 1.0, 2.0]));
    assert!(vjp(&c, &[], &[], &BTile::new(1, &[], vec![0.1]), &ty, &BTile::new(1, &[], vec![1.0])).unwrap().is_empty());
}

#[test]
fn max_ties_go_to_the_first_operand_and_lowest_index() {
    let (x, ty) = f(DType::F32, &[4], vec![1.0, -2.0, 3.0, 0.0]);
    let cot = BTile::new(1, &[4], vec![1.0, 2.0, 3.0, 4.0]);
    for op in [BinaryOp::Max, BinaryOp::Min] {
        let o = Op::Binary(op);
        let y = eval(&o, &[&x, &x], &[&ty, &ty], &ty, Precision::F64).unwrap();
        let g = vjp(&o, &[&x, &x], &[&ty, &ty], &y, &ty, &cot).unwrap();
        assert_eq!(g[0].as_ref().unwrap().data, cot.data, "{}(a, a): all to a", op.name());
        assert_eq!(g[1].as_ref().unwrap().data, vec![0.0; 4], "{}(a, a): none to b", op.name());
    }
    // Reduce max with a repeated maximum: to the lowest index, along the last and a leading axis.
    let (x, ty) = f(DType::F32, &[2, 4], vec![1.0, 3.0, 0.0, 3.0, 5.0, -1.0, 5.0, 5.0]);
    let rty = Type::tile(DType::F32, &[2]);
    let op = Op::Reduce { kind: ReduceOp::Max, axis: 1, keep_dims: false };
    let y = eval(&op, &[&x], &[&ty], &rty, Precision::F64).unwrap();
    assert_eq!(y.data, vec![3.0, 5.0]);
    let g = vjp(&op, &[&x], &[&ty], &y, &rty, &BTile::new(1, &[2], vec![10.0, 20.0])).unwrap();
    assert_eq!(g[0].as_ref().unwrap().data, vec![0.0, 10.0, 0.0, 0.0, 20.0, 0.0, 0.0, 0.0]);
    let (x, ty) = f(DType::F32, &[3, 2], vec![2.0, -1.0, 2.0, 4.0, 1.0, 4.0]);
    let rty = Type::tile(DType::F32, &[1, 2]);
    for (kind, want) in [(ReduceOp::Max, vec![7.0, 0.0, 0.0, 8.0, 0.0, 0.0]), (ReduceOp::Min, vec![0.0, 8.0, 0.0, 0.0, 7.0, 0.0])] {
        let op = Op::Reduce { kind, axis: 0, keep_dims: true };
        let y = eval(&op, &[&x], &[&ty], &rty, Precision::F64).unwrap();
        let g = vjp(&op, &[&x], &[&ty], &y, &rty, &BTile::new(1, &[1, 2], vec![7.0, 8.0])).unwrap();
        assert_eq!(g[0].as_ref().unwrap().data, want, "reduce {}", kind.name());
    }
    // Argmax agrees on the tie: index 1 and 0.
    let (x, ty) = f(DType::F32, &[2, 4], vec![1.0, 3.0, 0.0, 3.0, 5.0, -1.0, 5.0, 5.0]);
    let op = Op::Reduce { kind: ReduceOp::Argmax, axis: 1, keep_dims: false };
    assert_eq!(eval(&op, &[&x], &[&ty], &Type::tile(DType::I32, &[2]), Precision::F64).unwrap().data, vec![1.0, 0.0]);
}

#[test]
fn integer_semantics_follow_c() {
    let (a, ty) = f(DType::I32, &[4], vec![-7.0, 7.0, -7.0, i32::MIN as f64]);
    let (b, _) = f(DType::I32, &[4], vec![2.0, -2.0, -2.0, -1.0]);
    let ev = |op| eval(&Op::Binary(op), &[&a, &b], &[&ty, &ty], &ty, Precision::F64).unwrap().data;
    assert_eq!(ev(BinaryOp::FloorDiv), vec![-3.0, -3.0, 3.0, i32::MIN as f64]);
    assert_eq!(ev(BinaryOp::Mod), vec![-1.0, 1.0, -1.0, 0.0]);
    let (m, _) = f(DType::I32, &[4], vec![i32::MAX as f64, 1.0, -1.0, 0.0]);
    let (one, _) = f(DType::I32, &[4], vec![1.0; 4]);
    let s = eval(&Op::Binary(BinaryOp::Add), &[&m, &one], &[&ty, &ty], &ty, Precision::F64).unwrap();
    assert_eq!(s.data, vec![i32::MIN as f64, 2.0, 0.0, 1.0]);
    let n = eval(&Op::Unary(UnaryOp::Not), &[&m], &[&ty], &ty, Precision::F64).unwrap();
    assert_eq!(n.data, vec![i32::MIN as f64, -2.0, 0.0, -1.0]);
    // Casts: truncation, saturation, NaN to 0, != 0 for i1.
    let (x, fty) = f(DType::F32, &[5], vec![-2.7, 2.7, 1e20, f64::NAN, 0.0]);
    let c = |d| eval(&Op::Cast, &[&x], &[&fty], &Type::tile(d, &[5]), Precision::F64).unwrap().data;
    assert_eq!(c(DType::I32), vec![-2.0, 2.0, i32::MAX as f64, 0.0, 0.0]);
    assert_eq!(c(DType::I1), vec![1.0, 1.0, 1.0, 1.0, 0.0]);
}

#[test]
fn errors_name_the_op() {
    let rule = |r: Result<BTile, AdError>| match r {
        Err(AdError::Rule { op, message }) => format!("{op}: {message}"),
        other => panic!("expected a rule error, got {other:?}"),
    };
    let (a, ty) = f(DType::I32, &[3], vec![1.0, 2.0, 3.0]);
    let (z, _) = f(DType::I32, &[3], vec![1.0, 0.0, 1.0]);
    for op in [BinaryOp::FloorDiv, BinaryOp::Mod] {
        let m = rule(eval(&Op::Binary(op), &[&a, &z], &[&ty, &ty], &ty, Precision::F64));
        assert_eq!(m, format!("{}: integer division by zero", op.name()));
    }
    let (big, ty64) = f(DType::I64, &[2], vec![(1u64 << 53) as f64, 0.0]);
    let (one, _) = f(DType::I64, &[2], vec![1.0, 1.0]);
    let m = rule(eval(&Op::Binary(BinaryOp::Add), &[&big, &one], &[&ty64, &ty64], &ty64, Precision::F64));
    assert!(m.starts_with("add: ") && m.contains("2^53"), "{m}");
    let (x, fty) = f(DType::F32, &[2], vec![1e300, 0.0]);
    let m = rule(eval(&Op::Cast, &[&x], &[&fty], &ty64, Precision::F64));
    assert!(m.starts_with("cast: ") && m.contains("2^53"), "{m}");
    let load = Op::Load { mask: false, other: false };
    let m = rule(eval(&load, &[], &[], &fty, Precision::F64));
    assert_eq!(m, "load: handled by the evaluator");
    let store = Op::Store { mask: false };
    let e = vjp(&store, &[], &[], &x, &fty, &x).unwrap_err();
    assert_eq!(e.to_string(), "op `store`: handled by the evaluator");
    // Malformed operands are errors, not panics.
    let m = rule(eval(&Op::Binary(BinaryOp::Add), &[&a], &[&ty], &ty, Precision::F64));
    assert!(m.contains("expects 2 operand(s)"), "{m}");
    let (b3, _) = f(DType::I32, &[3], vec![0.0; 3]);
    let b2 = BTile::new(2, &[3], vec![0.0; 6]);
    let b3x = BTile::new(3, &[3], vec![0.0; 9]);
    let _ = b3;
    let m = rule(eval(&Op::Binary(BinaryOp::Add), &[&b2, &b3x], &[&ty, &ty], &ty, Precision::F64));
    assert!(m.contains("programs"), "{m}");
}

#[test]
fn integer_add_sub_mul_agree_with_exact_arithmetic_at_the_edges() {
    let mut rng = StdRng::seed_from_u64(21);
    let edge32 = [i32::MIN as i64, i32::MIN as i64 + 1, -1, 0, 1, i32::MAX as i64 - 1, i32::MAX as i64, 46341, -46341, 65536];
    let n = 64;
    let ty = Type::tile(DType::I32, &[n]);
    for round in 0..20 {
        let draw = |rng: &mut StdRng| -> Vec<i64> {
            (0..n).map(|_| if round % 2 == 0 { edge32[rng.gen_range(0..edge32.len())] } else { rng.gen_range(-1000..1000) }).collect()
        };
        let (a, b) = (draw(&mut rng), draw(&mut rng));
        let (ta, tb) =
            (BTile::new(1, &[n], a.iter().map(|&x| x as f64).collect()), BTile::new(1, &[n], b.iter().map(|&x| x as f64).collect()));
        for (op, f) in [
            (BinaryOp::Add, i32::wrapping_add as fn(i32, i32) -> i32),
            (BinaryOp::Sub, i32::wrapping_sub),
            (BinaryOp::Mul, i32::wrapping_mul),
        ] {
            let got = eval(&Op::Binary(op), &[&ta, &tb], &[&ty, &ty], &ty, Precision::F64).unwrap().data;
            let want: Vec<f64> = a.iter().zip(&b).map(|(&x, &y)| f(x as i32, y as i32) as f64).collect();
            assert_eq!(got, want, "i32 {}", op.name());
        }
    }
    // i64: exact up to 2^53 inclusive, an error beyond.
    let lim = 1i64 << 53;
    let ty = Type::tile(DType::I64, &[3]);
    let t = |v: [i64; 3]| BTile::new(1, &[3], v.iter().map(|&x| x as f64).collect());
    let add = |a: [i64; 3], b: [i64; 3]| eval(&Op::Binary(BinaryOp::Add), &[&t(a), &t(b)], &[&ty, &ty], &ty, Precision::F64);
    assert_eq!(add([lim - 1, -lim, 5], [1, 0, -7]).unwrap().data, vec![lim as f64, -lim as f64, -2.0]);
    assert!(add([lim, 0, 0], [1, 0, 0]).is_err());
    let mul = eval(&Op::Binary(BinaryOp::Mul), &[&t([1 << 26, 3, -1]), &t([1 << 27, 5, lim])], &[&ty, &ty], &ty, Precision::F64);
    assert_eq!(mul.unwrap().data, vec![lim as f64, 15.0, -lim as f64]);
    assert!(eval(&Op::Binary(BinaryOp::Mul), &[&t([1 << 27, 1, 1]), &t([1 << 27, 1, 1])], &[&ty, &ty], &ty, Precision::F64).is_err());
}

/// Broadcast views: an operand held in a shape that broadcasts to its type's gives the same
/// result as the materialised broadcast, and its cotangent is the materialised operand's
/// cotangent summed over the broadcast dimensions (per program, or over programs too when the
/// view is shared by the batch).
#[test]
fn broadcast_views_match_materialised_broadcasts() {
    let mut rng = StdRng::seed_from_u64(77);
    let ops =
        [Op::Binary(BinaryOp::Add), Op::Binary(BinaryOp::Sub), Op::Binary(BinaryOp::Mul), Op::Binary(BinaryOp::Div), Op::Cmp(CmpOp::Lt)];
    // Rows shorter than eight lanes, and rows of two chunks of eight and a tail.
    for (full, view_shape) in [[3usize, 5], [4, 19]].into_iter().flat_map(|f| [[f[0], 1], [1, f[1]], [1, 1]].map(|v| (f, v))) {
        let (rows, cols, numel) = (full[0], full[1], full[0] * full[1]);
        let ty = |d: DType| Type::tile(d, &full);
        for (batch, view_batch) in [(1, 1), (2, 2), (2, 1)] {
            for op in &ops {
                for view_first in [false, true] {
                    let dense = BTile::new(batch, &full, Gen::AwayZero.draw(&mut rng, batch, numel));
                    let vn: usize = view_shape.iter().product();
                    let view = BTile::new(view_batch, &view_shape, Gen::AwayZero.draw(&mut rng, view_batch, vn));
                    // The view's element that element (i, j) of program b reads.
                    let at = |b: usize, i: usize, j: usize| {
                        b * vn + if view_shape[0] == 1 { 0 } else { i } * view_shape[1] + if view_shape[1] == 1 { 0 } else { j }
                    };
                    // The view materialised.
                    let mut mat = Vec::new();
                    for b in 0..view_batch {
                        for i in 0..rows {
                            for j in 0..cols {
                                mat.push(view.data[at(b, i, j)]);
                            }
                        }
                    }
                    let mat = BTile::new(view_batch, &full, mat);
                    let t = ty(DType::F64);
                    let rt = if matches!(op, Op::Cmp(_)) { ty(DType::I1) } else { t.clone() };
                    let order = |v: &BTile| if view_first { [v.clone(), dense.clone()] } else { [dense.clone(), v.clone()] };
                    let (with_view, with_mat) = (order(&view), order(&mat));
                    let args_v: Vec<&BTile> = with_view.iter().collect();
                    let args_m: Vec<&BTile> = with_mat.iter().collect();
                    let tys = [&t, &t];
                    let rv = eval(op, &args_v, &tys, &rt, Precision::F64).unwrap();
                    let rm = eval(op, &args_m, &tys, &rt, Precision::F64).unwrap();
                    assert_eq!(rv, rm, "{op:?} view {view_shape:?} batches {batch}/{view_batch}");
                    if matches!(op, Op::Cmp(_)) {
                        continue;
                    }
                    let cot = BTile::new(batch, &full, Gen::Normal.draw(&mut rng, batch, numel));
                    let gv = vjp(op, &args_v, &tys, &rv, &rt, &cot).unwrap();
                    let gm = vjp(op, &args_m, &tys, &rm, &rt, &cot).unwrap();
                    let (iv, id) = if view_first { (0, 1) } else { (1, 0) };
                    let (gvv, gmv) = (gv[iv].as_ref().unwrap(), gm[iv].as_ref().unwrap());
                    assert_eq!(gv[id], gm[id], "{op:?}: the dense operand's cotangent");
                    assert_eq!((gvv.batch, &gvv.shape[..]), (view_batch, &view_shape[..]));
                    // Sum the materialised cotangent over the broadcast dimensions.
                    let mut want = vec![0.0; view_batch * vn];
                    for b in 0..view_batch {
                        for i in 0..rows {
                            for j in 0..cols {
                                want[at(b, i, j)] += gmv.data[b * numel + i * cols + j];
                            }
                        }
                    }
                    for (g, w) in gvv.data.iter().zip(&want) {
                        assert!((g - w).abs() <= 1e-12 * w.abs().max(1.0), "{op:?} view {view_shape:?}: {g} vs {w}");
                    }
                }
            }
        }
    }
}
