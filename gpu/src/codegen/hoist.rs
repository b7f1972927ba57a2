//! Loop invariants moved out of `for` loops, before code generation.
//!
//! A tile op inside a loop runs on every trip; when it needs other threads' elements
//! (broadcast, reduce, permute, dot) it goes through scratch memory and makes the block wait at
//! a barrier, every trip, although its operands never change. Generated kernels have such ops:
//! a VJP kernel carries the cotangent of an accumulator through its reverse loop unchanged (the
//! adjoint of `acc += x` passes `acc`'s cotangent on), and broadcasts it on every trip. Here a
//! carried value that the body yields back unchanged becomes its initial value, and the pure ops
//! whose operands all come from outside a loop run once, before it. The ops moved compute from
//! their operands and cannot fail (as in [`super::sink`]), so results and errors are those of the
//! kernel as written; a loop of no trips runs them once for nothing.
//!
//! Instruction and value ids are kept (no renumbering): failure sites and loops keep theirs.

use std::collections::HashSet;
use tilegrad_ir::{Block, Inst, Kernel, Op, Value};

/// Whether an op computes its result from its operands alone and cannot fail.
fn pure(k: &Kernel, i: Inst) -> bool {
    let d = k.inst(i);
    match &d.op {
        Op::ProgramId { .. }
        | Op::NumPrograms { .. }
        | Op::Const { .. }
        | Op::Arange { .. }
        | Op::Broadcast
        | Op::ExpandDims { .. }
        | Op::Reshape
        | Op::Permute { .. }
        | Op::Unary(_)
        | Op::Cmp(_)
        | Op::Where
        | Op::Cast
        | Op::Reduce { .. }
        | Op::Cumsum { .. }
        | Op::Dot { .. }
        | Op::AddPtr => true,
        Op::Binary(_) => !super::sink::integer_division(k, d),
        Op::Load { .. }
        | Op::Store { .. }
        | Op::AtomicAdd { .. }
        | Op::AtomicRmw { .. }
        | Op::AtomicCas
        | Op::For { .. }
        | Op::While { .. }
        | Op::If { .. }
        | Op::Yield => false,
    }
}

/// Replaces every use of `from` by `to`.
fn replace_uses(k: &mut Kernel, from: Value, to: Value) {
    for d in &mut k.insts {
        for a in d.args.iter_mut() {
            if *a == from {
                *a = to;
            }
        }
    }
}

/// The `for` loop `i`'s carried values that its body yields back unchanged (or yields their
/// initial value) are that initial value on every trip and after the loop: their uses take it,
/// and the loop no longer carries them.
fn drop_invariant_carries(k: &mut Kernel, i: Inst) {
    let Op::For { body, .. } = k.inst(i).op else { return };
    let Some(&y) = k.block(body).insts.last().filter(|&&y| matches!(k.inst(y).op, Op::Yield)) else { return };
    let n = k.inst(i).results.len();
    let mut keep = vec![true; n];
    for (j, kept) in keep.iter_mut().enumerate() {
        let (init, param, yielded) = (k.inst(i).args[3 + j], k.block(body).params[1 + j], k.inst(y).args[j]);
        if yielded == param || yielded == init {
            let result = k.inst(i).results[j];
            replace_uses(k, param, init);
            replace_uses(k, result, init);
            *kept = false;
        }
    }
    if keep.iter().all(|&x| x) {
        return;
    }
    let pick = |v: &[Value], skip: usize| -> Vec<Value> {
        v.iter().enumerate().filter(|(n, _)| *n < skip || keep[n - skip]).map(|(_, &v)| v).collect()
    };
    let d = &mut k.insts[i.index()];
    d.args = pick(&d.args, 3).into();
    d.results = pick(&d.results, 0).into();
    let bp = &mut k.blocks[body.index()].params;
    *bp = pick(bp, 1);
    let ya = &mut k.insts[y.index()].args;
    *ya = pick(ya, 0).into();
}

/// Moves the pure ops of `for` loop `i`'s body whose operands all come from outside the loop
/// to just before it, in block `parent`.
fn hoist_from(k: &mut Kernel, parent: Block, i: Inst) {
    let Op::For { body, .. } = k.inst(i).op else { return };
    // Values defined inside the loop: its body's parameters and everything its instructions
    // (nested blocks included) define.
    let mut inside: HashSet<Value> = k.block(body).params.iter().copied().collect();
    let mut blocks = vec![body];
    while let Some(b) = blocks.pop() {
        inside.extend(k.block(b).params.iter().copied());
        for &j in &k.block(b).insts {
            inside.extend(k.inst(j).results.iter().copied());
            blocks.extend(k.inst(j).op.blocks());
        }
    }
    let mut moved = Vec::new();
    let mut stay = Vec::new();
    for &j in &k.block(body).insts {
        let d = k.inst(j);
        if pure(k, j) && d.args.iter().all(|a| !inside.contains(a)) {
            for r in &d.results {
                inside.remove(r);
            }
            moved.push(j);
        } else {
            stay.push(j);
        }
    }
    if moved.is_empty() {
        return;
    }
    k.blocks[body.index()].insts = stay;
    let insts = &mut k.blocks[parent.index()].insts;
    let at = insts.iter().position(|&j| j == i).expect("the loop is in its parent block");
    insts.splice(at..at, moved);
}

/// The kernel with each `for` loop's invariant carried values replaced by their initial values
/// and its invariant pure ops moved before it, innermost loops first (what leaves an inner
/// loop may then leave the outer one).
pub(super) fn hoist_invariants(k: &Kernel) -> Kernel {
    let mut out = k.clone();
    fn visit(k: &mut Kernel, b: Block) {
        let insts = k.block(b).insts.clone();
        for i in insts {
            for nb in k.inst(i).op.blocks() {
                visit(k, nb);
            }
            if matches!(k.inst(i).op, Op::For { .. }) {
                drop_invariant_carries(k, i);
                hoist_from(k, b, i);
            }
        }
    }
    let body = out.body;
    visit(&mut out, body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tilegrad_ir::{DType, KernelBuilder};
    use tilegrad_reference::{HostTensor, Launch, Memory};

    /// out[r] = sum over trips t of (x[r, t] * g[r]) + acc, where `g` (a row tile broadcast to
    /// [R, C] inside the loop) and a scale reduced inside the loop are loop invariants, and a
    /// carried value is passed on unchanged; a floor division inside the loop may fail and
    /// stays.
    fn kernel() -> Kernel {
        const R: i64 = 4;
        const C: i64 = 8;
        let mut b = KernelBuilder::new("hoists");
        let x = b.ptr_param("x", DType::F32);
        let g = b.ptr_param("g", DType::F32);
        let y = b.ptr_param("y", DType::F32);
        let n = b.scalar_param("n", DType::I32);
        let d = b.scalar_param("d", DType::I32);
        let rows = b.arange(0, R);
        let cols = b.arange(0, C);
        let pg = b.add(g, rows);
        let gv = b.load(pg, None, None);
        let zero = b.i32(0);
        let one = b.i32(1);
        let acc = b.zeros(&[R as usize], DType::F32);
        let res = b.for_range(zero, n, one, Some(3), &[acc, gv], |b, t, c| {
            // c[1] is yielded back unchanged: invariant.
            let g2 = b.expand_dims(c[1], 1);
            let g2 = b.broadcast_to(g2, &[R as usize, C as usize]);
            let s = b.sum(g2, Some(1), false);
            let r2 = b.expand_dims(rows, 1);
            let c2 = b.expand_dims(cols, 0);
            let cc = b.i32(C as i32);
            let ro = b.mul(r2, cc);
            let off = b.add(ro, c2);
            let tc = b.mul(t, cc);
            let rr = b.i32(R as i32);
            let tcr = b.mul(tc, rr);
            let tq = b.floordiv(tcr, d);
            let _ = tq;
            let off = b.add(off, tcr);
            let px = b.add(x, off);
            let xv = b.load(px, None, None);
            let p = b.mul(xv, g2);
            let rs = b.sum(p, Some(1), false);
            let rs = b.add(rs, s);
            vec![b.add(c[0], rs), c[1]]
        });
        let py = b.add(y, rows);
        let out = b.add(res[0], res[1]);
        b.store(py, out, None);
        b.finish().unwrap()
    }

    fn ops_in(k: &Kernel, b: Block) -> Vec<&'static str> {
        k.block(b).insts.iter().map(|&i| k.inst(i).op.mnemonic()).collect()
    }

    fn the_loop(k: &Kernel) -> Inst {
        *k.block(k.body).insts.iter().find(|&&i| matches!(k.inst(i).op, Op::For { .. })).unwrap()
    }

    #[test]
    fn invariant_carries_and_ops_leave_the_loop_and_nothing_else_does() {
        let k = kernel();
        let h = hoist_invariants(&k);
        tilegrad_ir::verify(&h).unwrap();
        let (l0, l1) = (the_loop(&k), the_loop(&h));
        assert_eq!(k.inst(l0).results.len(), 2);
        assert_eq!(h.inst(l1).results.len(), 1, "the unchanged carried value is no longer carried");
        let Op::For { body, .. } = h.inst(l1).op else { unreachable!() };
        let inside = ops_in(&h, body);
        // The broadcast of the invariant and its reduction left; the load, its product and
        // reduction, the floor division (which may fail) and the ops using the induction
        // variable stayed.
        assert_eq!(inside.iter().filter(|o| **o == "reduce").count(), 1, "{inside:?}");
        assert!(!inside.contains(&"expand_dims"), "{inside:?}");
        for op in ["load", "floordiv", "mul", "yield"] {
            assert!(inside.contains(&op), "{op} stays: {inside:?}");
        }
        // Every pure op left uses a value of the loop.
        let mut defined: HashSet<Value> = h.block(body).params.iter().copied().collect();
        for &j in &h.block(body).insts {
            let d = h.inst(j);
            if pure(&h, j) {
                assert!(d.args.iter().any(|a| defined.contains(a)), "{} stays without a value of the loop", d.op.mnemonic());
            }
            defined.extend(d.results.iter().copied());
        }
        let outside = ops_in(&h, h.body);
        assert!(outside.iter().filter(|o| **o == "reduce").count() == 1, "{outside:?}");
        // Instruction ids are kept.
        assert_eq!(k.insts.len(), h.insts.len());
    }

    #[test]
    fn a_hoisted_kernel_runs_as_the_kernel() {
        let k = kernel();
        let h = hoist_invariants(&k);
        let x: Vec<f32> = (0..4 * 8 * 3).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.25).collect();
        let g: Vec<f32> = (0..4).map(|i| 0.5 + i as f32 * 0.75).collect();
        let run = |k: &Kernel, n: i64, d: i64| {
            let mut mem = Memory::new();
            let xt = mem.add("x", HostTensor::from_f32(&[96], x.clone()));
            let gt = mem.add("g", HostTensor::from_f32(&[4], g.clone()));
            let yt = mem.add("y", HostTensor::from_f32(&[4], vec![0.5; 4]));
            let r = Launch::new(k, 1).arg("x", xt).arg("g", gt).arg("y", yt).arg("n", n).arg("d", d).run(&mut mem);
            (r.map(|_| ()).map_err(|e| e.to_string()), mem[yt].as_f32().unwrap().to_vec())
        };
        for n in [0, 1, 3] {
            let (ok, y) = run(&k, n, 3);
            assert!(ok.is_ok(), "{ok:?}");
            assert!(y.iter().any(|v| *v != 0.5));
            assert_eq!(run(&h, n, 3), (ok, y), "{n} trips");
        }
        // A failing division fails alike.
        let (err, _) = run(&k, 2, 0);
        assert!(err.is_err());
        assert_eq!(run(&h, 2, 0).0, err);
    }
}
