//! Loops that advance a pointer carry an offset instead: `p += BLOCK` in a `for` loop (the idiom
//! of Triton's tutorials) makes the loop carry a pointer, which a pass that keeps a loop's
//! carried values (the VJP kernels' tapes of `tilegrad-ad`) cannot store. [`carry_offsets`]
//! rewrites such a loop to carry the i64 offset from the pointer it starts from, and to
//! compute the pointer from it where the body uses it: the same addresses, trip by trip.

use crate::kernel::{Block, Inst, InstData, Kernel, Loc, Value};
use crate::op::{BinaryOp, Op};
use crate::types::{DType, Elem, Lit, Type};
use smallvec::smallvec;

/// `k` with every `for` loop that carries a pointer `p` advanced only by `addptr`s of it
/// (`yield addptr(addptr(p, a), b)`, or `p` itself) rewritten to carry the i64 offset `o` from
/// the pointer `p0` it starts from: the body computes `addptr(p0, o)` where it used `p` and
/// yields `o + a + b`, and what followed the loop reads `addptr(p0, o)` of its last offset.
/// Loops whose pointers come from anything else stay as they are.
pub fn carry_offsets(k: &Kernel) -> Kernel {
    let mut out = k.clone();
    let mut loops = Vec::new();
    k.walk(&mut |i, d| {
        if matches!(d.op, Op::For { .. }) {
            loops.push(i);
        }
    });
    for l in loops {
        rewrite_loop(&mut out, l);
    }
    out
}

/// The offsets `y` adds to `p` through a chain of `addptr`s in `body`, outermost last; `None`
/// where `y` is not such a chain.
fn chain(k: &Kernel, body: Block, p: Value, mut y: Value) -> Option<Vec<Value>> {
    let mut offsets = Vec::new();
    let defined: std::collections::HashMap<Value, Inst> =
        k.block(body).insts.iter().flat_map(|&i| k.inst(i).results.iter().map(move |&r| (r, i))).collect();
    while y != p {
        let d = k.inst(*defined.get(&y)?);
        if d.op != Op::AddPtr {
            return None;
        }
        offsets.push(d.args[1]);
        y = d.args[0];
    }
    offsets.reverse();
    Some(offsets)
}

/// Appends an instruction to the arena (the caller places it in a block) and returns it.
fn push(k: &mut Kernel, op: Op, args: &[Value], ty: Type, loc: &Loc) -> (Inst, Value) {
    let r = k.new_value(ty);
    k.insts.push(InstData { op, args: args.iter().copied().collect(), results: smallvec![r], loc: loc.clone() });
    (Inst(k.insts.len() as u32 - 1), r)
}

/// Replaces every use of `old` by `new` in block `b` and the blocks nested in it.
fn replace_in(k: &mut Kernel, b: Block, old: Value, new: Value) {
    let insts = k.block(b).insts.clone();
    for i in insts {
        for a in k.insts[i.index()].args.iter_mut() {
            if *a == old {
                *a = new;
            }
        }
        for nb in k.inst(i).op.blocks() {
            replace_in(k, nb, old, new);
        }
    }
}

/// The block that holds instruction `i`.
fn block_of(k: &Kernel, i: Inst) -> Option<Block> {
    (0..k.blocks.len()).map(|b| Block(b as u32)).find(|&b| k.block(b).insts.contains(&i))
}

/// Rewrites loop `l`'s carried pointers (see [`carry_offsets`]).
fn rewrite_loop(k: &mut Kernel, l: Inst) {
    let d = k.inst(l).clone();
    let Op::For { body, .. } = d.op else { return };
    let Some(outer) = block_of(k, l) else { return };
    let yield_inst = *k.block(body).insts.last().expect("a body ends in yield");
    let params = k.block(body).params.clone();
    for (j, &p) in params.iter().enumerate().skip(1) {
        let pty = k.ty(p).clone();
        if !pty.is_ptr() {
            continue;
        }
        let y = k.inst(yield_inst).args[j - 1];
        let Some(offsets) = chain(k, body, p, y) else { continue };
        let p0 = d.args[2 + j];
        let oty = Type { elem: Elem::Num(DType::I64), shape: pty.shape.clone() };
        let loc = d.loc.clone();
        // Before the loop: the first offset, zero.
        let (zi, z) = push(k, Op::Const { value: Lit::Int(0) }, &[], Type::scalar(DType::I64), &loc);
        let mut before = vec![zi];
        let init = if oty.shape.is_empty() {
            z
        } else {
            let (bi, bz) = push(k, Op::Broadcast, &[z], oty.clone(), &loc);
            before.push(bi);
            bz
        };
        let at = k.block(outer).insts.iter().position(|&i| i == l).expect("the loop is in its block");
        k.blocks[outer.index()].insts.splice(at..at, before);
        k.insts[l.index()].args[2 + j] = init;
        // The carried offset, the pointer from it at the body's start, and the next offset.
        let o = k.new_value(oty.clone());
        k.blocks[body.index()].params[j] = o;
        let (pi, pp) = push(k, Op::AddPtr, &[p0, o], pty.clone(), &loc);
        replace_in(k, body, p, pp);
        k.blocks[body.index()].insts.insert(0, pi);
        let mut next = o;
        let mut adds = Vec::new();
        for a in offsets {
            let aty = k.ty(a).clone();
            let mut a = a;
            if aty.dtype() != Some(DType::I64) {
                let (ci, c) = push(k, Op::Cast, &[a], aty.with_dtype(DType::I64), &loc);
                adds.push(ci);
                a = c;
            }
            if k.ty(a).shape != oty.shape {
                let (bi, b) = push(k, Op::Broadcast, &[a], oty.clone(), &loc);
                adds.push(bi);
                a = b;
            }
            let (ai, s) = push(k, Op::Binary(BinaryOp::Add), &[next, a], oty.clone(), &loc);
            adds.push(ai);
            next = s;
        }
        let insts = &mut k.blocks[body.index()].insts;
        let end = insts.len() - 1;
        insts.splice(end..end, adds);
        k.insts[yield_inst.index()].args[j - 1] = next;
        // After the loop: the last pointer, for what reads it.
        let r = d.results[j - 1];
        let last = k.new_value(oty);
        k.insts[l.index()].results[j - 1] = last;
        let (fi, fp) = push(k, Op::AddPtr, &[p0, last], pty, &loc);
        let at = k.block(outer).insts.iter().position(|&i| i == l).expect("the loop is in its block");
        k.blocks[outer.index()].insts.insert(at + 1, fi);
        let uses: Vec<Inst> = k.block(outer).insts[at + 2..].to_vec();
        for i in uses {
            for a in k.insts[i.index()].args.iter_mut() {
                if *a == r {
                    *a = fp;
                }
            }
            for nb in k.inst(i).op.blocks() {
                replace_in(k, nb, r, fp);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KernelBuilder;

    /// A row walked by a pointer advanced in its loop, and a tile of pointers advanced by a
    /// tile of offsets: rewritten to carry offsets, the kernel verifies, carries no pointer, and
    /// its loop's last pointer after it is `p0 + o`.
    #[test]
    fn a_loop_that_advances_a_pointer_carries_its_offset() {
        let mut b = KernelBuilder::new("walk");
        let (x, y) = (b.ptr_param("x", DType::F32), b.ptr_param("y", DType::F32));
        let n = b.scalar_param("n", DType::I32);
        let pid = b.program_id(0);
        let start = b.mul(pid, n);
        let p0 = b.add(x, start);
        let r = b.arange(0, 8);
        let t0 = b.add(p0, r);
        let (lo, step) = (b.i32(0), b.i32(8));
        let z = b.f32(0.0);
        let out = b.for_range(lo, n, step, None, &[z, p0, t0], |b, _, c| {
            let r = b.arange(0, 8);
            let ps = b.add(c[1], r);
            let v = b.load(ps, None, None);
            let w = b.load(c[2], None, None);
            let s = b.sum(v, None, false);
            let s2 = b.sum(w, None, false);
            let acc = b.add(c[0], s);
            let acc = b.add(acc, s2);
            let eight = b.i32(8);
            let p = b.add(c[1], eight);
            let four = b.i32(4);
            let four = b.broadcast_to(four, &[8]);
            let t = b.add(c[2], four);
            let t = b.add(t, four);
            vec![acc, p, t]
        });
        let py = b.add(y, pid);
        b.store(py, out[0], None);
        // The loop's last pointer, read after it.
        let last = b.load(out[1], None, None);
        b.store(y, last, None);
        let k = b.finish().unwrap();
        let rewritten = carry_offsets(&k);
        crate::verify::verify(&rewritten).unwrap();
        let mut carried_ptrs = 0;
        rewritten.walk(&mut |_, d| {
            if let Op::For { body, .. } = d.op {
                carried_ptrs += rewritten.block(body).params.iter().filter(|&&v| rewritten.ty(v).is_ptr()).count();
            }
        });
        assert_eq!(carried_ptrs, 0, "{rewritten}");
        // A loop whose pointer is replaced by another is left as it was.
        let mut b = KernelBuilder::new("jump");
        let x = b.ptr_param("x", DType::F32);
        let (lo, hi, one) = (b.i32(0), b.i32(3), b.i32(1));
        let out = b.for_range(lo, hi, one, None, &[x], |b, i, _| vec![b.add(x, i)]);
        let v = b.load(out[0], None, None);
        b.store(x, v, None);
        let k = b.finish().unwrap();
        assert_eq!(carry_offsets(&k), k);
    }
}
