//! Every op's VJP kernel, run by the reference interpreter, against the evaluator's
//! gradient on random inputs (sizes that are not multiples of the tiles).
use super::*;
use crate::{vjp, GradOptions};
use rand::{rngs::StdRng, Rng, SeedableRng};
use tilegrad_ir::{BinaryOp, DotPrecision, Op, UnaryOp, Value};
use tilegrad_reference::{HostTensor, Launch, Memory, TensorId};

/// A tensor of a test launch: its parameter, shape, and whether it is differentiated
/// (`input`) and/or has a cotangent (`output`); `data` overrides random values in [-1, 1).
struct T {
    name: &'static str,
    n: usize,
    input: bool,
    output: bool,
}

fn t(name: &'static str, n: usize, input: bool, output: bool) -> T {
    T { name, n, input, output }
}

/// Random inputs and cotangents for a launch of `k`; then [`same_gradients`].
fn agree(k: &Kernel, grid: usize, tensors: &[T], scalars: &[(&str, i32)], dtype: DType, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut mem = Memory::new();
    let mut ids: Vec<TensorId> = Vec::new();
    for tt in tensors {
        let v: Vec<f64> = (0..tt.n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let init = if tt.input { v } else { vec![0.0; tt.n] };
        ids.push(mem.add(tt.name, HostTensor::from_f64_as(dtype, &[tt.n], &init)));
    }
    let mut launch = Launch::new(k, grid);
    for (tt, &id) in tensors.iter().zip(&ids) {
        launch = launch.arg(tt.name, id);
    }
    for &(s, v) in scalars {
        launch = launch.arg(s, v);
    }
    let cots: Vec<Vec<f64>> = tensors.iter().map(|tt| (0..tt.n).map(|_| rng.gen_range(-1.0..1.0)).collect()).collect();
    let inputs: Vec<TensorId> = tensors.iter().zip(&ids).filter(|(tt, _)| tt.input).map(|(_, &id)| id).collect();
    let outputs: Vec<(TensorId, Vec<f64>)> =
        tensors.iter().zip(&ids).zip(&cots).filter(|((tt, _), _)| tt.output).map(|((_, &id), c)| (id, c.clone())).collect();
    same_gradients(&launch, &mem, &inputs, &outputs);
}

/// Runs the evaluator and the VJP kernel (by the reference) on the same launch and asserts
/// that every input's cotangent is not zero and agrees within 1e-12 normwise; returns the
/// VJP kernel's.
fn same_gradients(launch: &Launch, mem: &Memory, inputs: &[TensorId], outputs: &[(TensorId, Vec<f64>)]) -> Vec<Vec<f64>> {
    let k = launch.kernel();
    let want = vjp(launch, mem, inputs, outputs, &GradOptions::default()).unwrap().inputs;
    let max_trips = launch.check(mem).unwrap().max_trips;
    let mut got = Vec::new();
    // With the tensors the kernel only reads or only writes kept in their dtype, with every
    // tensor f64, and computing in f32 (within f32's rounding).
    for (keep, fl, tol) in [(true, DType::F64, 1e-12), (false, DType::F64, 1e-12), (true, DType::F32, 1e-4)] {
        let vk = vjp_kernel_with(k, keep, fl).unwrap();
        let run = &mut |l: &Launch, m: &mut Memory| l.run(m).map(|_| ()).map_err(AdError::from);
        got = gradient_by_kernel(&vk, launch, mem, inputs, outputs, TapeBounds { max_trips: &max_trips, memory: u64::MAX }, run)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", k.name, vk.kernel));
        if !vk.tapes.is_empty() {
            // No memory to spare: the programs run one per launch, each with its own tapes'
            // slots, their loops keeping checkpoints and running each segment again, and add
            // into the shadows in the same order.
            let (mut launches, mut checkpointed) = (0, 0);
            let one =
                gradient_by_kernel(&vk, launch, mem, inputs, outputs, TapeBounds { max_trips: &max_trips, memory: 0 }, &mut |l, m| {
                    launches += 1;
                    checkpointed += l.kernel().params.iter().any(|p| p.name.starts_with("tg_ckpt")) as u64;
                    run(l, m)
                })
                .unwrap_or_else(|e| panic!("{}, one program at a time: {e}", k.name));
            // Tapes that keep nothing need no batches.
            let keeps =
                vk.tapes.iter().any(|t| t.per_trip > 0 && t.max_iters.map_or(max_trips.get(&t.inst).copied().unwrap_or(0), u64::from) > 0);
            let want = if keeps { launch.grid().programs() } else { 1 };
            assert_eq!(launches, want, "{}: launches of one program", k.name);
            // Not even one program's whole tapes fit: its loops keep checkpoints.
            assert_eq!(checkpointed, if keeps { want } else { 0 }, "{}: checkpointed launches", k.name);
            assert_eq!(one, got, "{}: one program at a time", k.name);
        }
        let names = inputs.iter().map(|&t| mem.name(t));
        for ((name, want), got) in names.zip(&want).zip(&got) {
            let norm = want.iter().map(|x| x * x).sum::<f64>().sqrt();
            let diff = want.iter().zip(got).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
            assert!(norm > 0.0, "{}: the cotangent of {name} is zero", k.name);
            assert!(
                diff <= tol * norm,
                "{} (keep {keep}, {fl}): d{name} differs by {diff:e} (norm {norm:e})\nwant {:?}\ngot  {:?}",
                k.name,
                &want[..8.min(want.len())],
                &got[..8.min(got.len())]
            );
        }
    }
    got
}

const BLOCK: i64 = 64;

/// Program `pid`'s lanes `pid * BLOCK + 0..BLOCK` and the mask of those below `n`.
fn block_lanes(b: &mut KernelBuilder, n: Value) -> (Value, Value) {
    lanes_of(b, n, BLOCK)
}

/// Program `pid`'s lanes `pid * size + 0..size` (a block of rows, of elements) and the mask of
/// those below `n`.
fn lanes_of(b: &mut KernelBuilder, n: Value, size: i64) -> (Value, Value) {
    let pid = b.program_id(0);
    let bs = b.i32(size as i32);
    let start = b.mul(pid, bs);
    let r = b.arange(0, size);
    let offs = b.add(start, r);
    let m = b.lt(offs, n);
    (offs, m)
}

/// `out[i] = f(x[i], y[i])` over blocks of 64 with a masked tail.
fn pointwise(name: &str, dtype: DType, f: impl Fn(&mut KernelBuilder, Value, Value) -> Value) -> Kernel {
    let mut b = KernelBuilder::new(name);
    let (x, y, out) = (b.ptr_param("x", dtype), b.ptr_param("y", dtype), b.ptr_param("out", dtype));
    let n = b.scalar_param("n", DType::I32);
    let (offs, m) = block_lanes(&mut b, n);
    let (px, py) = (b.add(x, offs), b.add(y, offs));
    let xv = b.load(px, Some(m), None);
    let yv = b.load(py, Some(m), None);
    let v = f(&mut b, xv, yv);
    let po = b.add(out, offs);
    b.store(po, v, Some(m));
    b.finish().unwrap()
}

fn run_pointwise(k: &Kernel, dtype: DType, seed: u64) {
    let n: usize = 300;
    agree(
        k,
        n.div_ceil(BLOCK as usize),
        &[t("x", n, true, false), t("y", n, true, false), t("out", n, false, true)],
        &[("n", n as i32)],
        dtype,
        seed,
    );
}

/// `x * x + 0.5`: positive.
fn positive(b: &mut KernelBuilder, x: Value) -> Value {
    let h = b.f64(0.5);
    let xx = b.mul(x, x);
    b.add(xx, h)
}

#[test]
fn every_unary_op_agrees() {
    for &u in UnaryOp::ALL {
        if u == UnaryOp::Not {
            continue;
        }
        let k = pointwise(u.name(), DType::F64, |b, x, y| {
            let p = positive(b, x);
            let v = match u {
                UnaryOp::Neg => b.neg(x),
                UnaryOp::Abs => b.abs(x),
                UnaryOp::Not => unreachable!(),
                UnaryOp::Exp => b.exp(x),
                UnaryOp::Exp2 => b.exp2(x),
                UnaryOp::Log => b.log(p),
                UnaryOp::Log2 => b.log2(p),
                UnaryOp::Sqrt => b.sqrt(p),
                UnaryOp::Rsqrt => b.rsqrt(p),
                UnaryOp::Sin => b.sin(x),
                UnaryOp::Cos => b.cos(x),
                UnaryOp::Tanh => b.tanh(x),
                UnaryOp::Sigmoid => b.sigmoid(x),
                UnaryOp::Erf => b.erf(x),
                UnaryOp::Floor => b.floor(x),
                UnaryOp::Ceil => b.ceil(x),
            };
            // Times y, plus x / 4: both inputs have cotangents (floor and ceil give none).
            let vy = b.mul(v, y);
            let q = b.f64(0.25);
            let xq = b.mul(x, q);
            b.add(vy, xq)
        });
        run_pointwise(&k, DType::F64, 1);
    }
}

#[test]
fn every_float_binary_op_agrees_ties_included() {
    for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Mod, BinaryOp::Min, BinaryOp::Max, BinaryOp::Pow] {
        let k = pointwise(op.name(), DType::F64, |b, x, y| {
            // Every third lane's y equals x (ties of min and max).
            let r = b.arange(0, BLOCK);
            let three = b.i32(3);
            let m = b.rem(r, three);
            let z = b.i32(0);
            let tie = b.eq(m, z);
            let y = b.where_(tie, x, y);
            let py = positive(b, y);
            let px = positive(b, x);
            match op {
                BinaryOp::Add => b.add(x, y),
                BinaryOp::Sub => b.sub(x, y),
                BinaryOp::Mul => b.mul(x, y),
                BinaryOp::Div => b.div(x, py),
                BinaryOp::Mod => b.rem(x, py),
                BinaryOp::Min => b.minimum(x, y),
                BinaryOp::Max => b.maximum(x, y),
                _ => b.pow(px, y),
            }
        });
        run_pointwise(&k, DType::F64, 2);
    }
}

#[test]
fn where_casts_and_f32_kernels_agree() {
    let k = pointwise("select", DType::F32, |b, x, y| {
        let z = b.f32(0.0);
        let c = b.gt(x, z);
        let e = b.exp(y);
        let s = b.where_(c, e, x);
        let h = b.cast(s, DType::F16);
        let back = b.cast(h, DType::F32);
        b.mul(back, x)
    });
    run_pointwise(&k, DType::F32, 3);
}

/// Rows of `x` ([rows, 37], 8 rows a program) reduced and scanned: sums, max and min over
/// either axis, kept or not, a cumsum each way, and a softmax.
#[test]
fn reductions_scans_and_broadcasts_agree() {
    const R: usize = 8;
    const C: usize = 37;
    let mut b = KernelBuilder::new("rows");
    let (x, w, out, red) =
        (b.ptr_param("x", DType::F64), b.ptr_param("w", DType::F64), b.ptr_param("out", DType::F64), b.ptr_param("red", DType::F64));
    let rows = b.scalar_param("rows", DType::I32);
    let pid = b.program_id(0);
    let rs = b.i32(R as i32);
    let r0 = b.mul(pid, rs);
    let ar = b.arange(0, R as i64);
    let r = b.add(r0, ar);
    let c = b.arange(0, 64);
    let cc = b.i32(C as i32);
    let (r2, c2) = (b.expand_dims(r, 1), b.expand_dims(c, 0));
    let off = b.mul(r2, cc);
    let off = b.add(off, c2);
    let (rm, cm) = (b.lt(r2, rows), b.lt(c2, cc));
    let m = b.and(rm, cm);
    let px = b.add(x, off);
    let ninf = b.f64(-1e300);
    let xv = b.load(px, Some(m), Some(ninf));
    let pw = b.add(w, c);
    let wm = b.lt(c, cc);
    let zero = b.f64(0.0);
    let wv = b.load(pw, Some(wm), Some(zero));
    let wv = b.expand_dims(wv, 0);
    // softmax(x) * w + cumsums.
    let mx = b.max(xv, Some(1), true);
    let sh = b.sub(xv, mx);
    let e = b.exp(sh);
    let s = b.sum(e, Some(1), false);
    let s = b.expand_dims(s, 1);
    let sm = b.div(e, s);
    let y = b.mul(sm, wv);
    let xz = b.where_(m, xv, zero);
    let cs = b.cumsum(xz, 1, false);
    let cr = b.cumsum(xz, 0, true);
    let y = b.add(y, cs);
    let y = b.add(y, cr);
    let po = b.add(out, off);
    b.store(po, y, Some(m));
    // Per-row and per-column extremes and sums, into red[pid * (R + 3*64) ...].
    let big = b.f64(1e300);
    let xl = b.where_(m, xv, big);
    let mn0 = b.min(xl, Some(0), false);
    let mx0 = b.max(xv, Some(0), false);
    let s0 = b.sum(xz, Some(0), true);
    let s0 = b.reshape(s0, &[64]);
    let mn1 = b.min(xl, Some(1), false);
    let v = b.add(mn0, mx0);
    let v = b.add(v, s0);
    let base = b.i32((R + 64) as i32);
    let rb = b.mul(pid, base);
    let offc = b.add(rb, c);
    let pc = b.add(red, offc);
    b.store(pc, v, Some(wm));
    let sixty4 = b.i32(64);
    let offr = b.add(rb, sixty4);
    let offr = b.add(offr, ar);
    let pr = b.add(red, offr);
    let rmf = b.lt(r, rows);
    b.store(pr, mn1, Some(rmf));
    let k = b.finish().unwrap();
    let rows_n: usize = 29;
    let progs = rows_n.div_ceil(R);
    agree(
        &k,
        progs,
        &[
            t("x", rows_n * C, true, false),
            t("w", C, true, false),
            t("out", rows_n * C, false, true),
            t("red", progs * (R + 64), false, true),
        ],
        &[("rows", rows_n as i32)],
        DType::F64,
        4,
    );
}

/// Pointers `p + r[:, None] * nc + c[None, :]` into a row-major [nr, nc] tensor, and the
/// mask of those inside it.
fn masked_tile(b: &mut KernelBuilder, p: Value, r: Value, c: Value, nr: usize, nc: usize) -> (Value, Value) {
    let (r2, c2) = (b.expand_dims(r, 1), b.expand_dims(c, 0));
    let ncv = b.i32(nc as i32);
    let o = b.mul(r2, ncv);
    let o = b.add(o, c2);
    let nrv = b.i32(nr as i32);
    let (m1, m2) = (b.lt(r2, nrv), b.lt(c2, ncv));
    let m = b.and(m1, m2);
    (b.add(p, o), m)
}

/// One tile of `a @ b + c` (masked to 45x29x21 within 64x32x32) in each precision.
#[test]
fn dot_agrees() {
    let (mm, nn, kk) = (45usize, 29usize, 21usize);
    for prec in [DotPrecision::Ieee, DotPrecision::Tf32] {
        let mut b = KernelBuilder::new("dot");
        let (pa, pb, pc, po) =
            (b.ptr_param("a", DType::F32), b.ptr_param("b", DType::F32), b.ptr_param("c", DType::F32), b.ptr_param("o", DType::F32));
        let (rm, rn, rk) = (b.arange(0, 64), b.arange(0, 32), b.arange(0, 32));
        let (ap, am) = masked_tile(&mut b, pa, rm, rk, mm, kk);
        let (bp, bm) = masked_tile(&mut b, pb, rk, rn, kk, nn);
        let (cp, cm) = masked_tile(&mut b, pc, rm, rn, mm, nn);
        let z = b.f32(0.0);
        let av = b.load(ap, Some(am), Some(z));
        let bv = b.load(bp, Some(bm), Some(z));
        let cv = b.load(cp, Some(cm), Some(z));
        let d = b.dot_with(av, bv, Some(cv), prec);
        let (op, om) = masked_tile(&mut b, po, rm, rn, mm, nn);
        b.store(op, d, Some(om));
        let k = b.finish().unwrap();
        agree(
            &k,
            1,
            &[t("a", mm * kk, true, false), t("b", kk * nn, true, false), t("c", mm * nn, true, false), t("o", mm * nn, false, true)],
            &[],
            DType::F32,
            5,
        );
    }
}

/// In place: `x = x * x`, stored, loaded again and stored plus one; and an atomic sum of
/// squares into `total`.
#[test]
fn in_place_loads_after_stores_and_atomic_adds_agree() {
    let mut b = KernelBuilder::new("in_place");
    let (x, total) = (b.ptr_param("x", DType::F64), b.ptr_param("total", DType::F64));
    let n = b.scalar_param("n", DType::I32);
    let (offs, m) = block_lanes(&mut b, n);
    let px = b.add(x, offs);
    let xv = b.load(px, Some(m), None);
    let sq = b.mul(xv, xv);
    b.store(px, sq, Some(m));
    let again = b.load(px, Some(m), None);
    let one = b.f64(1.0);
    let y = b.add(again, one);
    let y = b.mul(y, xv);
    b.store(px, y, Some(m));
    let z = b.f64(0.0);
    let sqm = b.where_(m, sq, z);
    let s = b.sum(sqm, None, false);
    b.atomic_add(total, s, None);
    let k = b.finish().unwrap();
    let nv: usize = 200;
    agree(&k, nv.div_ceil(BLOCK as usize), &[t("x", nv, true, true), t("total", 1, true, true)], &[("n", nv as i32)], DType::F64, 6);
}

/// Rows of `x` [rows, d] weighted by `w` [d] and summed, over tiles of d in a loop (the
/// weighted sum), plus the running maximum of each row carried too.
/// Trip `kt` of a loop over a row block's columns, `dc` at a time: the `[rows, dc]` chunk of
/// row-major `x` (`d` columns) at rows `r` (valid where `rm`), masked (0 outside), its mask, its
/// columns and their mask.
fn row_chunk(b: &mut KernelBuilder, x: Value, (r, rm): (Value, Value), kt: Value, d: Value, dc: i64) -> (Value, Value, Value, Value) {
    let dt = b.i32(dc as i32);
    let c0 = b.mul(kt, dt);
    let ac = b.arange(0, dc);
    let cols = b.add(c0, ac);
    let cm = b.lt(cols, d);
    let (r2, c2) = (b.expand_dims(r, 1), b.expand_dims(cols, 0));
    let o = b.mul(r2, d);
    let o = b.add(o, c2);
    let (m1, m2) = (b.expand_dims(rm, 1), b.expand_dims(cm, 0));
    let m = b.and(m1, m2);
    let px = b.add(x, o);
    let z = b.f32(0.0);
    (b.load(px, Some(m), Some(z)), m, cols, cm)
}

#[test]
fn loops_agree() {
    const R: i64 = 4;
    const D: i64 = 16;
    let mut b = KernelBuilder::new("weighted_rows");
    let (x, w, out) = (b.ptr_param("x", DType::F32), b.ptr_param("w", DType::F32), b.ptr_param("out", DType::F32));
    let (rows, d) = (b.scalar_param("rows", DType::I32), b.scalar_param("d", DType::I32));
    let (r, rm) = lanes_of(&mut b, rows, R);
    let acc0 = b.zeros(&[R as usize], DType::F32);
    let mx0 = b.full(&[R as usize], -1e30f32, DType::F32);
    // A value from outside the loop that every trip uses: w[0] scales the products.
    let scale = b.load(w, None, None);
    let (lo, dt) = (b.i32(0), b.i32(D as i32));
    let hi = b.cdiv(d, dt);
    let one = b.i32(1);
    let res = b.for_range(lo, hi, one, None, &[acc0, mx0], |b, kt, c| {
        let (xv, m, cols, cm) = row_chunk(b, x, (r, rm), kt, d, D);
        let z = b.f32(0.0);
        let pw = b.add(w, cols);
        let wv = b.load(pw, Some(cm), Some(z));
        let wv = b.expand_dims(wv, 0);
        let p = b.mul(xv, wv);
        let p = b.mul(p, scale);
        let s = b.sum(p, Some(1), false);
        let acc = b.add(c[0], s);
        let big = b.f32(-1e30);
        let xm = b.where_(m, xv, big);
        let rmax = b.max(xm, Some(1), false);
        let mx = b.maximum(c[1], rmax);
        vec![acc, mx]
    });
    let v = b.add(res[0], res[1]);
    let po = b.add(out, r);
    b.store(po, v, Some(rm));
    let k = b.finish().unwrap();
    // The running max is taped (its rule reads it): in f32 where the arithmetic is f32.
    for (fl, tape) in [(DType::F64, DType::F64), (DType::F32, DType::F32)] {
        let vk = vjp_kernel_with(&k, true, fl).unwrap();
        assert_eq!(vk.tapes.len(), 1);
        assert_eq!((vk.tapes[0].per_trip, vk.tapes[0].dtype), (R as usize, tape));
    }
    let (rows_n, d_n) = (11usize, 45usize);
    agree(
        &k,
        rows_n.div_ceil(R as usize),
        &[t("x", rows_n * d_n, true, false), t("w", d_n, true, false), t("out", rows_n, false, true)],
        &[("rows", rows_n as i32), ("d", d_n as i32)],
        DType::F32,
        7,
    );
}

/// A loop advancing offsets as block pointers do (a column offset into `x` and another into
/// `w`, carried as integers): the reverse needs them for its loads, so they are kept, on an
/// integer tape (no float conversions), both in one store a trip; the accumulator is not kept.
#[test]
fn offsets_carried_by_a_loop_are_kept_on_an_integer_tape() {
    const R: i64 = 4;
    const D: i64 = 8;
    let mut b = KernelBuilder::new("advancing_offsets");
    let (x, w, out) = (b.ptr_param("x", DType::F32), b.ptr_param("w", DType::F32), b.ptr_param("out", DType::F32));
    let (rows, d) = (b.scalar_param("rows", DType::I32), b.scalar_param("d", DType::I32));
    let (r, rm) = lanes_of(&mut b, rows, R);
    let acc0 = b.zeros(&[R as usize], DType::F32);
    let (zero, one, dt) = (b.i32(0), b.i32(1), b.i32(D as i32));
    let hi = b.cdiv(d, dt);
    let res = b.for_range(zero, hi, one, None, &[acc0, zero, zero], |b, _, c| {
        let ac = b.arange(0, D);
        let cols = b.add(c[1], ac);
        let cm = b.lt(cols, d);
        let (r2, c2) = (b.expand_dims(r, 1), b.expand_dims(cols, 0));
        let o = b.mul(r2, d);
        let o = b.add(o, c2);
        let (m1, m2) = (b.expand_dims(rm, 1), b.expand_dims(cm, 0));
        let m = b.and(m1, m2);
        let px = b.add(x, o);
        let z = b.f32(0.0);
        let xv = b.load(px, Some(m), Some(z));
        let wc = b.add(c[2], ac);
        let wm = b.lt(wc, d);
        let pw = b.add(w, wc);
        let wv = b.load(pw, Some(wm), Some(z));
        let wv = b.expand_dims(wv, 0);
        let p = b.mul(xv, wv);
        let p = b.mul(p, xv);
        let s = b.sum(p, Some(1), false);
        let dt = b.i32(D as i32);
        vec![b.add(c[0], s), b.add(c[1], dt), b.add(c[2], dt)]
    });
    let po = b.add(out, r);
    b.store(po, res[0], Some(rm));
    let k = b.finish().unwrap();
    for fl in [DType::F64, DType::F32] {
        let vk = vjp_kernel_with(&k, true, fl).unwrap();
        assert_eq!(vk.tapes.len(), 1);
        assert_eq!((vk.tapes[0].per_trip, vk.tapes[0].dtype), (2, DType::I64));
        // One store into the tape.
        let src = tilegrad_ir::analysis::pointer_sources(&vk.kernel);
        let tape = vk.kernel.params.iter().position(|p| p.name == vk.tapes[0].tape).unwrap();
        let mut stores = 0;
        vk.kernel.walk(&mut |_, d| {
            if matches!(d.op, Op::Store { .. }) && src[d.args[0].index()][tape] {
                stores += 1;
            }
        });
        assert_eq!(stores, 1, "{}", vk.kernel);
    }
    let (rows_n, d_n) = (11usize, 45usize);
    agree(
        &k,
        rows_n.div_ceil(R as usize),
        &[t("x", rows_n * d_n, true, false), t("w", d_n, true, false), t("out", rows_n, false, true)],
        &[("rows", rows_n as i32), ("d", d_n as i32)],
        DType::F32,
        9,
    );
}

/// A loop whose body stores (tile by tile, `y = x * x`) and accumulates a dot product of
/// tiles over k: a matmul.
#[test]
fn loops_with_stores_and_dots_agree() {
    let (mm, nn, kk) = (19usize, 23usize, 37usize);
    let mut b = KernelBuilder::new("matmul_loop");
    let (pa, pb, pc, py) =
        (b.ptr_param("a", DType::F64), b.ptr_param("b", DType::F64), b.ptr_param("c", DType::F64), b.ptr_param("y", DType::F64));
    let kv = b.scalar_param("k", DType::I32);
    let (rm, rn) = (b.arange(0, 32), b.arange(0, 32));
    let acc0 = b.zeros(&[32, 32], DType::F64);
    let (lo, hi, st) = (b.i32(0), b.i32(kk.div_ceil(8) as i32), b.i32(1));
    let res = b.for_range(lo, hi, st, Some(8), &[acc0], |b, kt, c| {
        let eight = b.i32(8);
        let k0 = b.mul(kt, eight);
        let ak = b.arange(0, 8);
        let ks = b.add(k0, ak);
        let km = b.lt(ks, kv);
        let z = b.f64(0.0);
        let (pap, am) = masked_tile(b, pa, rm, ks, mm, kk);
        let av = b.load(pap, Some(am), Some(z));
        let (pbp, bm) = masked_tile(b, pb, ks, rn, kk, nn);
        let bv = b.load(pbp, Some(bm), Some(z));
        // y[k] = sum over the tile's rows of a^2 (a store in the loop).
        let sq = b.mul(av, av);
        let ys = b.sum(sq, Some(0), false);
        let pyp = b.add(py, ks);
        b.store(pyp, ys, Some(km));
        vec![b.dot(av, bv, Some(c[0]))]
    });
    let (pcp, cm) = masked_tile(&mut b, pc, rm, rn, mm, nn);
    let s = b.sigmoid(res[0]);
    b.store(pcp, s, Some(cm));
    let k = b.finish().unwrap();
    // The accumulator is only added to: the loop keeps no tape.
    let vk = vjp_kernel(&k).unwrap();
    assert_eq!(vk.tapes[0].per_trip, 0);
    // Nothing reads `c` or `y` back, so the forward's stores are gone, and so are the tape
    // loop's loads (it keeps nothing): `a` is loaded by the forward's loop (the sigmoid's
    // derivative needs its result) and the reverse loop only; `c` and `y` are never written.
    let src = tilegrad_ir::analysis::pointer_sources(&vk.kernel);
    let param = |n: &str| vk.kernel.params.iter().position(|p| p.name == n).unwrap();
    let (mut loads_a, mut writes_cy) = (0, 0);
    vk.kernel.walk(&mut |_, d| {
        let into = |j: usize| src[d.args[0].index()].get(j).copied().unwrap_or(false);
        match d.op {
            Op::Load { .. } if into(param("a")) => loads_a += 1,
            _ if d.op.writes_memory() && (into(param("c")) || into(param("y"))) => writes_cy += 1,
            _ => {}
        }
    });
    assert_eq!((loads_a, writes_cy), (2, 0));
    agree(
        &k,
        1,
        &[t("a", mm * kk, true, false), t("b", kk * nn, true, false), t("c", mm * nn, false, true), t("y", kk, false, true)],
        &[("k", kk as i32)],
        DType::F64,
        8,
    );
}

/// Per row: when `flag[row]` is 0 the row's loss is 0 (an early return); otherwise a loop
/// over column tiles sums `exp(x) * s` where `s` (a scale loaded before the branch) is from
/// outside both the branch and the loop, and a second branch picks `max` or `min` of the
/// row by the sign of its first element.
#[test]
fn branches_agree_with_loops_inside() {
    const C: i64 = 16;
    let mut b = KernelBuilder::new("branchy");
    let (x, flag, sc, loss) =
        (b.ptr_param("x", DType::F64), b.ptr_param("flag", DType::I32), b.ptr_param("scale", DType::F64), b.ptr_param("loss", DType::F64));
    let d = b.scalar_param("d", DType::I32);
    let row = b.program_id(0);
    let pf = b.add(flag, row);
    let f = b.load(pf, None, None);
    let s = b.load(sc, None, None);
    let zi = b.i32(0);
    let skip = b.eq(f, zi);
    let base = b.mul(row, d);
    let out = b.if_else(
        skip,
        |b| vec![b.f64(0.0)],
        |b| {
            let (lo, ct, one) = (b.i32(0), b.i32(C as i32), b.i32(1));
            let hi = b.cdiv(d, ct);
            let z = b.f64(0.0);
            let res = b.for_range(lo, hi, one, None, &[z], |b, t, c| {
                let ct = b.i32(C as i32);
                let c0 = b.mul(t, ct);
                let ar = b.arange(0, C);
                let cols = b.add(c0, ar);
                let m = b.lt(cols, d);
                let o = b.add(base, cols);
                let p = b.add(x, o);
                let zf = b.f64(0.0);
                let v = b.load(p, Some(m), Some(zf));
                let e = b.exp(v);
                let e = b.mul(e, s);
                let e = b.where_(m, e, zf);
                let tot = b.sum(e, None, false);
                vec![b.add(c[0], tot)]
            });
            let p0 = b.add(x, base);
            let x0 = b.load(p0, None, None);
            let zf = b.f64(0.0);
            let pos = b.gt(x0, zf);
            let pick = b.if_else(pos, |b| vec![b.maximum(res[0], x0)], |b| vec![b.minimum(res[0], s)]);
            vec![b.mul(pick[0], x0)]
        },
    );
    let pl = b.add(loss, row);
    b.store(pl, out[0], None);
    let k = b.finish().unwrap();
    // The forward's loop feeds only a store that nothing loads (removed); the branch's reverse
    // recomputes the loop's result and writes its tape in one run, then runs it backwards: two
    // loops, not a third for the tape alone.
    assert_eq!(all_loops(&vjp_kernel(&k).unwrap()), 2);
    let (rows, dn) = (9usize, 37usize);
    // Flags: rows 2 and 5 skipped.
    let mut rng = StdRng::seed_from_u64(9);
    let mut mem = Memory::new();
    let xs: Vec<f64> = (0..rows * dn).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let xt = mem.add("x", HostTensor::from_f64(&[rows * dn], xs));
    let ft = mem.add("flag", HostTensor::from_i32(&[rows], (0..rows).map(|r| i32::from(r != 2 && r != 5)).collect()));
    let st = mem.add("scale", HostTensor::from_f64(&[1], vec![0.75]));
    let lt = mem.add("loss", HostTensor::zeros(DType::F64, &[rows]));
    let launch = Launch::new(&k, rows).arg("x", xt).arg("flag", ft).arg("scale", st).arg("loss", lt).arg("d", dn as i32);
    let cot: Vec<f64> = (0..rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let got = same_gradients(&launch, &mem, &[xt, st], &[(lt, cot)]);
    // Skipped rows get nothing.
    assert!(got[0][2 * dn..3 * dn].iter().all(|&g| g == 0.0));
}

#[test]
fn what_is_not_supported_yet_is_refused_with_its_location() {
    // A `while` loop that loads what the kernel stores, and a branch that loads integers the
    // kernel stores.
    for in_while in [false, true] {
        let mut b = KernelBuilder::new("reads_its_writes");
        let x = b.ptr_param("x", if in_while { DType::F64 } else { DType::I32 });
        let z = b.f64(0.0);
        let got = if in_while {
            b.while_loop(
                Some(8),
                &[z],
                |b, c| {
                    let one = b.f64(1.0);
                    b.lt(c[0], one)
                },
                |b, c| {
                    let v = b.load(x, None, None);
                    let v = b.exp(v);
                    vec![b.add(c[0], v)]
                },
            )
        } else {
            let pid = b.program_id(0);
            let zi = b.i32(0);
            let first = b.eq(pid, zi);
            b.if_else(first, |b| vec![b.load(x, None, None)], |b| vec![b.i32(5)])
        };
        b.store(x, got[0], None);
        let k = b.finish().unwrap();
        let e = vjp_kernel(&k).unwrap_err().to_string();
        assert!(e.contains("reads a tensor the kernel writes") && e.contains("vjp_kernel/tests.rs"), "{e}");
    }
    // A loop inside a loop that loads what the kernel stores.
    let mut b = KernelBuilder::new("nested");
    let x = b.ptr_param("x", DType::F64);
    let (lo, hi, st) = (b.i32(0), b.i32(3), b.i32(1));
    let z = b.f64(0.0);
    let res = b.for_range(lo, hi, st, None, &[z], |b, _, c| {
        let (lo, hi, st) = (b.i32(0), b.i32(2), b.i32(1));
        b.for_range(lo, hi, st, None, &[c[0]], |b, j, c| {
            let p = b.add(x, j);
            let v = b.load(p, None, None);
            let v = b.exp(v);
            vec![b.add(c[0], v)]
        })
    });
    b.store(x, res[0], None);
    let k = b.finish().unwrap();
    let e = vjp_kernel(&k).unwrap_err().to_string();
    assert!(e.contains("a loop inside a loop") && e.contains("op `load`"), "{e}");
}

/// Trip `t` of a loop over a row's columns `size` at a time (the row starting at `base`, `d`
/// columns): the columns, their offsets and the mask of those below `d`.
fn columns(b: &mut KernelBuilder, t: Value, base: Value, d: Value, size: i64) -> (Value, Value, Value) {
    let st = b.i32(size as i32);
    let c0 = b.mul(t, st);
    let ar = b.arange(0, size);
    let cols = b.add(c0, ar);
    let m = b.lt(cols, d);
    (cols, b.add(base, cols), m)
}

/// A gradient written in place over the logits it comes from, as fused cross-entropy kernels
/// write it: after an early return for ignored rows (the rest in a branch), the label's logit
/// is read, a first loop reads a row's logits for its maximum and sum of exponentials, and a
/// second reads them again and overwrites them with `softmax - onehot`. The three load a
/// tensor the kernel writes: their values come back from the forward's tapes. With the loss
/// stored in the branch and the ignored rows' logits zeroed by a loop of their own (as
/// Liger-Kernel writes it), the branch ends the kernel and is reversed in place: each loop runs
/// in the forward, writing its tape, and backwards, twice in all.
#[test]
fn loops_that_load_what_the_kernel_overwrites_agree() {
    for trailing in [false, true] {
        ce_in_place(trailing);
    }
}

fn ce_in_place(trailing: bool) {
    const C: i64 = 16;
    let mut b = KernelBuilder::new("ce_in_place");
    let (x, y, loss) = (b.ptr_param("x", DType::F64), b.ptr_param("y", DType::I32), b.ptr_param("loss", DType::F64));
    let d = b.scalar_param("d", DType::I32);
    let row = b.program_id(0);
    let base = b.mul(row, d);
    let py = b.add(y, row);
    let label = b.load(py, None, None);
    let ignore = b.i32(-1);
    let skip = b.eq(label, ignore);
    let chunk = |b: &mut KernelBuilder, t: Value| {
        let (cols, o, m) = columns(b, t, base, d, C);
        (cols, m, b.add(x, o))
    };
    let pl = b.add(loss, row);
    let out = b.if_else(
        skip,
        |b| {
            if trailing {
                let (lo, one, ct) = (b.i32(0), b.i32(1), b.i32(C as i32));
                let hi = b.cdiv(d, ct);
                b.for_range(lo, hi, one, None, &[], |b, t, _| {
                    let (_, m, p) = chunk(b, t);
                    let z = b.full(&[C as usize], 0.0, DType::F64);
                    b.store(p, z, Some(m));
                    vec![]
                });
            }
            vec![b.f64(0.0)]
        },
        |b| {
            // The label's logit, read after the early return and before the loops overwrite it.
            let at = b.add(base, label);
            let pxy = b.add(x, at);
            let xy = b.load(pxy, None, None);
            let (lo, one, ct) = (b.i32(0), b.i32(1), b.i32(C as i32));
            let hi = b.cdiv(d, ct);
            let (ninf, z) = (b.f64(f64::NEG_INFINITY), b.f64(0.0));
            let md = b.for_range(lo, hi, one, None, &[ninf, z], |b, t, c| {
                let (_, m, p) = chunk(b, t);
                let ninf = b.f64(f64::NEG_INFINITY);
                let v = b.load(p, Some(m), Some(ninf));
                let mx = b.max(v, None, false);
                let m_new = b.maximum(c[0], mx);
                let shift = b.sub(c[0], m_new);
                let scale = b.exp(shift);
                let dd = b.mul(c[1], scale);
                let sh = b.sub(v, m_new);
                let e = b.exp(sh);
                let s = b.sum(e, None, false);
                vec![m_new, b.add(dd, s)]
            });
            b.for_range(lo, hi, one, None, &[], |b, t, _| {
                let (cols, m, p) = chunk(b, t);
                let z = b.f64(0.0);
                let v = b.load(p, Some(m), Some(z));
                let sh = b.sub(v, md[0]);
                let e = b.exp(sh);
                let prob = b.div(e, md[1]);
                let hit = b.eq(cols, label);
                let onef = b.f64(1.0);
                let zf = b.f64(0.0);
                let onehot = b.where_(hit, onef, zf);
                let g = b.sub(prob, onehot);
                b.store(p, g, Some(m));
                vec![]
            });
            let lse = b.log(md[1]);
            let lse = b.add(lse, md[0]);
            // Not linear in the label's logit, so that its value read back matters.
            let xy = b.tanh(xy);
            let l = b.sub(lse, xy);
            if trailing {
                b.store(pl, l, None);
            }
            vec![l]
        },
    );
    if !trailing {
        b.store(pl, out[0], None);
    }
    let k = b.finish().unwrap();
    let vk = vjp_kernel(&k).unwrap();
    if trailing {
        assert_eq!(all_loops(&vk), 6, "each of three loops forward and backwards");
    }
    assert_eq!(vk.tapes.iter().filter(|t| t.per_trip == C as usize).count(), 2, "a tape of loaded values a loop");
    assert!(vk.tapes.iter().any(|t| t.per_trip == 1 && t.max_iters == Some(1)), "the branch's tape of one slot");
    let (rows, dn) = (7usize, 45usize);
    let mut rng = StdRng::seed_from_u64(21);
    let mut mem = Memory::new();
    let xs: Vec<f64> = (0..rows * dn).map(|_| rng.gen_range(-2.0..2.0)).collect();
    let xt = mem.add("x", HostTensor::from_f64(&[rows * dn], xs));
    let labels: Vec<i32> = (0..rows).map(|r| if r == 3 { -1 } else { rng.gen_range(0..dn as i32) }).collect();
    let yt = mem.add("y", HostTensor::from_i32(&[rows], labels));
    let lt = mem.add("loss", HostTensor::zeros(DType::F64, &[rows]));
    let launch = Launch::new(&k, rows).arg("x", xt).arg("y", yt).arg("loss", lt).arg("d", dn as i32);
    // Cotangents of the losses and of the gradient left in `x`.
    let cl: Vec<f64> = (0..rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let cx: Vec<f64> = (0..rows * dn).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let got = same_gradients(&launch, &mem, &[xt], &[(lt, cl), (xt, cx.clone())]);
    // The ignored row's logits are left as they were, their cotangent passing through (within
    // f32's rounding: the last run computes in f32), or zeroed, their cotangent stopped.
    for (g, c) in got[0][3 * dn..4 * dn].iter().zip(&cx[3 * dn..4 * dn]) {
        let want = if trailing { 0.0 } else { *c };
        assert!((g - want).abs() <= 1e-7 * c.abs().max(1.0), "{g} against {want}");
    }
}

/// Loads of what the kernel writes in a loop's branch (a chunked running total read back from
/// the previous chunk's output with `load(...) if c > 0 else 0.`), and in place in a loop over
/// heads (a rotation of pairs, each read and overwritten in its trip).
#[test]
fn in_place_loops_and_loads_in_their_branches_agree() {
    const BT: i64 = 16;
    let mut b = KernelBuilder::new("chunked_total");
    let (x, y) = (b.ptr_param("x", DType::F64), b.ptr_param("y", DType::F64));
    let t_len = b.scalar_param("t", DType::I32);
    let row = b.program_id(0);
    let base = b.mul(row, t_len);
    let (lo, one, bt) = (b.i32(0), b.i32(1), b.i32(BT as i32));
    let hi = b.cdiv(t_len, bt);
    b.for_range(lo, hi, one, None, &[], |b, c, _| {
        let bt = b.i32(BT as i32);
        let c0 = b.mul(c, bt);
        let ar = b.arange(0, BT);
        let offs = b.add(c0, ar);
        let m = b.lt(offs, t_len);
        let o = b.add(base, offs);
        let px = b.add(x, o);
        let z = b.f64(0.0);
        let v = b.load(px, Some(m), Some(z));
        let zi = b.i32(0);
        let later = b.gt(c, zi);
        let prev = b.if_else(
            later,
            |b| {
                let at = b.add(base, c0);
                let minus = b.i32(-1);
                let at = b.add(at, minus);
                let p = b.add(y, at);
                let back = b.load(p, None, None);
                // Not linear, so that the value read back matters.
                vec![b.tanh(back)]
            },
            |b| vec![b.f64(0.0)],
        );
        let run = b.cumsum(v, 0, false);
        let tot = b.add(run, prev[0]);
        let py = b.add(y, o);
        b.store(py, tot, Some(m));
        vec![]
    });
    let k = b.finish().unwrap();
    agree(&k, 5, &[t("x", 5 * 70, true, false), t("y", 5 * 70, false, true)], &[("t", 70)], DType::F64, 4);

    let mut b = KernelBuilder::new("rotate_heads");
    let (q, cs, sn) = (b.ptr_param("q", DType::F64), b.ptr_param("cos", DType::F64), b.ptr_param("sin", DType::F64));
    let heads = b.scalar_param("heads", DType::I32);
    const HALF: i64 = 8;
    let row = b.program_id(0);
    let ar = b.arange(0, HALF);
    let pc = b.add(cs, ar);
    let c = b.load(pc, None, None);
    let ps = b.add(sn, ar);
    let s = b.load(ps, None, None);
    let (lo, one) = (b.i32(0), b.i32(1));
    b.for_range(lo, heads, one, None, &[], |b, h, _| {
        let w = b.i32(2 * HALF as i32);
        let rh = b.mul(row, heads);
        let rh = b.add(rh, h);
        let start = b.mul(rh, w);
        let o1 = b.add(start, ar);
        let half = b.i32(HALF as i32);
        let o2 = b.add(o1, half);
        let (p1, p2) = (b.add(q, o1), b.add(q, o2));
        let q1 = b.load(p1, None, None);
        let q2 = b.load(p2, None, None);
        let a = b.mul(q1, c);
        let bb = b.mul(q2, s);
        let r1 = b.sub(a, bb);
        let a = b.mul(q2, c);
        let bb = b.mul(q1, s);
        let r2 = b.add(a, bb);
        // Not linear in q either.
        let r2 = b.mul(r2, q1);
        b.store(p1, r1, None);
        b.store(p2, r2, None);
        vec![]
    });
    let k = b.finish().unwrap();
    let n = 3 * 5 * 2 * HALF as usize;
    agree(
        &k,
        3,
        &[t("q", n, true, true), t("cos", HALF as usize, true, false), t("sin", HALF as usize, true, false)],
        &[("heads", 5)],
        DType::F64,
        5,
    );
}

/// Loops inside loops: a persistent kernel whose programs walk rows `pid, pid + P, ...` and
/// each row's column chunks twice (a sum of squares carried by the first inner loop; the second
/// stores `x * tanh(norm)`), the inner trips growing with the outer trip (a triangle: row `r`'s
/// first `r + 1` chunks at most), and a `while` loop inside a `for` loop.
#[test]
fn loops_inside_loops_agree() {
    const C: i64 = 8;
    let mut b = KernelBuilder::new("persistent_rows");
    let (x, y, norm) = (b.ptr_param("x", DType::F64), b.ptr_param("y", DType::F64), b.ptr_param("norm", DType::F64));
    let (rows, d) = (b.scalar_param("rows", DType::I32), b.scalar_param("d", DType::I32));
    let (pid, progs) = (b.program_id(0), b.num_programs(0));
    b.for_range(pid, rows, progs, None, &[], |b, row, _| {
        let (lo, one, ct) = (b.i32(0), b.i32(1), b.i32(C as i32));
        let chunks = b.cdiv(d, ct);
        let upto = b.add(row, one);
        let hi = b.minimum(chunks, upto);
        let base = b.mul(row, d);
        let at = |b: &mut KernelBuilder, t: Value| {
            let (_, o, m) = columns(b, t, base, d, C);
            (o, m)
        };
        let z = b.full(&[C as usize], 0.0, DType::F64);
        let acc = b.for_range(lo, hi, one, None, &[z], |b, t, c| {
            let (o, m) = at(b, t);
            let p = b.add(x, o);
            let zf = b.f64(0.0);
            let v = b.load(p, Some(m), Some(zf));
            let sq = b.mul(v, v);
            vec![b.add(c[0], sq)]
        });
        let s = b.sum(acc[0], None, false);
        let nrm = b.sqrt(s);
        let pn = b.add(norm, row);
        b.store(pn, nrm, None);
        let th = b.tanh(nrm);
        b.for_range(lo, hi, one, None, &[], |b, t, _| {
            let (o, m) = at(b, t);
            let p = b.add(x, o);
            let zf = b.f64(0.0);
            let v = b.load(p, Some(m), Some(zf));
            let w = b.mul(v, th);
            let q = b.add(y, o);
            b.store(q, w, Some(m));
            vec![]
        });
        vec![]
    });
    let k = b.finish().unwrap();
    let (rows, dn) = (11usize, 37usize);
    agree(
        &k,
        3,
        &[t("x", rows * dn, true, false), t("y", rows * dn, false, true), t("norm", rows, false, true)],
        &[("rows", rows as i32), ("d", dn as i32)],
        DType::F64,
        11,
    );

    // For each row, c -> c * (1 + x) until it passes 2 (a number of trips per row), inside a
    // loop over rows; then y[row] = c.
    let mut b = KernelBuilder::new("rows_while");
    let (x, y) = (b.ptr_param("x", DType::F64), b.ptr_param("y", DType::F64));
    let rows = b.scalar_param("rows", DType::I32);
    let (pid, progs) = (b.program_id(0), b.num_programs(0));
    b.for_range(pid, rows, progs, None, &[], |b, row, _| {
        let px = b.add(x, row);
        let v = b.load(px, None, None);
        let v = b.abs(v);
        let half = b.f64(0.5);
        let g = b.add(v, half);
        let one = b.f64(1.0);
        let got = b.while_loop(
            Some(64),
            &[one],
            |b, c| {
                let two = b.f64(2.0);
                b.lt(c[0], two)
            },
            |b, c| {
                let one = b.f64(1.0);
                let f = b.add(one, g);
                vec![b.mul(c[0], f)]
            },
        );
        let py = b.add(y, row);
        b.store(py, got[0], None);
        vec![]
    });
    let k = b.finish().unwrap();
    agree(&k, 4, &[t("x", 13, true, false), t("y", 13, false, true)], &[("rows", 13)], DType::F64, 12);
}

/// A loop that advances pointers, as Triton's tutorials write it: a row's pointer (`p +=
/// BLOCK`) and a tile of pointers into a second tensor advanced by a tile of strides; the loop
/// carries their offsets in the VJP kernel.
#[test]
fn loops_that_advance_pointers_agree() {
    const C: i64 = 16;
    let mut b = KernelBuilder::new("advancing");
    let (x, w, y) = (b.ptr_param("x", DType::F64), b.ptr_param("w", DType::F64), b.ptr_param("y", DType::F64));
    let d = b.scalar_param("d", DType::I32);
    let row = b.program_id(0);
    let start = b.mul(row, d);
    let p0 = b.add(x, start);
    let ar = b.arange(0, C);
    let q0 = b.add(w, ar);
    let (lo, step) = (b.i32(0), b.i32(C as i32));
    let z = b.f64(0.0);
    let out = b.for_range(lo, d, step, None, &[z, p0, q0], |b, c0, c| {
        let ar = b.arange(0, C);
        let c0b = b.broadcast_to(c0, &[C as usize]);
        let cols = b.add(c0b, ar);
        let db = b.broadcast_to(d, &[C as usize]);
        let m = b.lt(cols, db);
        let ps = b.add(c[1], ar);
        let zf = b.f64(0.0);
        let v = b.load(ps, Some(m), Some(zf));
        let wv = b.load(c[2], Some(m), Some(zf));
        let e = b.tanh(v);
        let e = b.mul(e, wv);
        let s = b.sum(e, None, false);
        let ct = b.i32(C as i32);
        let p = b.add(c[1], ct);
        let stride = b.broadcast_to(ct, &[C as usize]);
        let q = b.add(c[2], stride);
        vec![b.add(c[0], s), p, q]
    });
    let py = b.add(y, row);
    b.store(py, out[0], None);
    let k = b.finish().unwrap();
    let (rows, dn) = (5usize, 45usize);
    agree(
        &k,
        rows,
        &[t("x", rows * dn, true, false), t("w", dn + C as usize, true, false), t("y", rows, false, true)],
        &[("d", dn as i32)],
        DType::F64,
        13,
    );
}

/// A value loaded in a branch from a tensor the kernel only reads (`load(...) if c else 0.`):
/// the cotangent of what the branch yields reaches the load's tensor.
#[test]
fn a_load_in_a_branch_gets_the_cotangent_of_what_the_branch_yields() {
    let mut b = KernelBuilder::new("picked");
    let (x, out) = (b.ptr_param("x", DType::F64), b.ptr_param("out", DType::F64));
    let n = b.scalar_param("n", DType::I32);
    let pid = b.program_id(0);
    let two = b.i32(2);
    let r = b.rem(pid, two);
    let zi = b.i32(0);
    let even = b.eq(r, zi);
    let (offs, m) = block_lanes(&mut b, n);
    let got = b.if_else(
        even,
        |b| {
            let p = b.add(x, offs);
            let z = b.f64(0.0);
            vec![b.load(p, Some(m), Some(z))]
        },
        |b| vec![b.full(&[BLOCK as usize], 0.25, DType::F64)],
    );
    let po = b.add(out, offs);
    b.store(po, got[0], Some(m));
    let k = b.finish().unwrap();
    agree(&k, 5, &[t("x", 300, true, false), t("out", 300, false, true)], &[("n", 300)], DType::F64, 6);
}

/// `while` loops: one whose condition reads a float carried value (c -> 2c + c^2 until it
/// reaches 1, a number of trips that differs per program), and one that walks a row's
/// column blocks, as kernels written in Triton do.
#[test]
fn while_loops_agree() {
    let mut b = KernelBuilder::new("doubling");
    let x = b.ptr_param("x", DType::F64);
    let y = b.ptr_param("y", DType::F64);
    let pid = b.program_id(0);
    let px = b.add(x, pid);
    let v = b.load(px, None, None);
    let v = b.abs(v);
    let tiny = b.f64(0.01);
    let v = b.add(v, tiny);
    let res = b.while_loop(
        Some(16),
        &[v],
        |b, c| {
            let one = b.f64(1.0);
            b.lt(c[0], one)
        },
        |b, c| {
            let two = b.f64(2.0);
            let d = b.mul(c[0], two);
            let sq = b.mul(c[0], c[0]);
            vec![b.add(d, sq)]
        },
    );
    let py = b.add(y, pid);
    b.store(py, res[0], None);
    let k = b.finish().unwrap();
    let vk = vjp_kernel(&k).unwrap();
    assert_eq!(vk.tapes.len(), 1);
    assert_eq!(vk.tapes[0].per_trip, 1, "the carried value's value is read by its square's rule");
    agree(&k, 9, &[t("x", 9, true, false), t("y", 9, false, true)], &[], DType::F64, 11);

    // Row blocks: while start < n: acc = acc / 2 + sum(exp(x) * w); start += B (the
    // halving makes each block's weight depend on its trip: reversed in the wrong order, the
    // gradients differ).
    const B: i64 = 16;
    let mut b = KernelBuilder::new("row_blocks");
    let x = b.ptr_param("x", DType::F32);
    let w = b.ptr_param("w", DType::F32);
    let out = b.ptr_param("out", DType::F32);
    let n = b.scalar_param("n", DType::I32);
    let row = b.program_id(0);
    let base = b.mul(row, n);
    let (z, s0) = (b.f32(0.0), b.i32(0));
    let res = b.while_loop(
        None,
        &[z, s0],
        |b, c| b.lt(c[1], n),
        |b, c| {
            let ar = b.arange(0, B);
            let cols = b.add(c[1], ar);
            let m = b.lt(cols, n);
            let o = b.add(base, cols);
            let pxo = b.add(x, o);
            let zero = b.f32(0.0);
            let xv = b.load(pxo, Some(m), Some(zero));
            let pw = b.add(w, cols);
            let wv = b.load(pw, Some(m), Some(zero));
            let e = b.exp(xv);
            let p = b.mul(e, wv);
            let p = b.where_(m, p, zero);
            let s = b.sum(p, None, false);
            let bb = b.i32(B as i32);
            let half = b.f32(0.5);
            let decayed = b.mul(c[0], half);
            vec![b.add(decayed, s), b.add(c[1], bb)]
        },
    );
    let po = b.add(out, row);
    b.store(po, res[0], None);
    let k = b.finish().unwrap();
    let (rows, cols) = (5usize, 37usize);
    agree(
        &k,
        rows,
        &[t("x", rows * cols, true, false), t("w", cols, true, false), t("out", rows, false, true)],
        &[("n", cols as i32)],
        DType::F32,
        12,
    );
}

/// Every loop of a VJP kernel, in any block.
fn all_loops(vk: &VjpKernel) -> usize {
    let mut n = 0;
    vk.kernel.walk(&mut |_, d| n += usize::from(matches!(d.op, Op::For { .. } | Op::While { .. })));
    n
}

/// The top-level loops of a VJP kernel.
fn top_level_loops(vk: &VjpKernel) -> usize {
    let k = &vk.kernel;
    k.block(k.body).insts.iter().filter(|&&i| matches!(k.inst(i).op, Op::For { .. } | Op::While { .. })).count()
}

/// A loop in the kernel's body whose results the reverse of what follows it needs (`acc * m`):
/// the forward's loop writes the tape itself, so that the loop runs once before the reverse
/// loop, not twice, whether or not it stores. Both agree with the evaluator.
#[test]
fn a_loop_in_the_kernels_body_writes_its_own_tape() {
    const R: i64 = 4;
    const D: i64 = 8;
    let build = |store_inside: bool| {
        let mut b = KernelBuilder::new("scaled_sums");
        let (x, out, side) = (b.ptr_param("x", DType::F32), b.ptr_param("out", DType::F32), b.ptr_param("side", DType::F32));
        let (rows, d) = (b.scalar_param("rows", DType::I32), b.scalar_param("d", DType::I32));
        let (r, rm) = lanes_of(&mut b, rows, R);
        let acc0 = b.zeros(&[R as usize], DType::F32);
        let m0 = b.full(&[R as usize], 1.0, DType::F32);
        let (lo, dt, one) = (b.i32(0), b.i32(D as i32), b.i32(1));
        let hi = b.cdiv(d, dt);
        let res = b.for_range(lo, hi, one, None, &[acc0, m0], |b, kt, c| {
            let (xv, _, _, _) = row_chunk(b, x, (r, rm), kt, d, D);
            let s = b.sum(xv, Some(1), false);
            let sq = b.mul(xv, xv);
            let q = b.sum(sq, Some(1), false);
            let half = b.f32(0.5);
            let q = b.mul(q, half);
            let q = b.add(q, c[1]);
            if store_inside {
                let ps = b.add(side, r);
                b.store(ps, s, Some(rm));
            }
            vec![b.add(c[0], s), q]
        });
        // The reverse of the product needs both results.
        let v = b.mul(res[0], res[1]);
        let po = b.add(out, r);
        b.store(po, v, Some(rm));
        b.finish().unwrap()
    };
    let (rows_n, d_n) = (9usize, 21usize);
    for (store_inside, loops) in [(false, 2), (true, 2)] {
        let k = build(store_inside);
        let vk = vjp_kernel(&k).unwrap();
        assert_eq!(top_level_loops(&vk), loops, "store inside: {store_inside}");
        agree(
            &k,
            rows_n.div_ceil(R as usize),
            &[t("x", rows_n * d_n, true, false), t("out", rows_n, false, true), t("side", rows_n, false, store_inside)],
            &[("rows", rows_n as i32), ("d", d_n as i32)],
            DType::F32,
            11,
        );
    }
}
