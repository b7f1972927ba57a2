//! Loaded values kept on a tape: a `for` loop that loads a tensor the kernel also writes (a
//! gradient written in place over the logits it was computed from, a rotation of a tensor in
//! place, a running total read back from the previous chunk's output) would read, when the
//! reverse sweep recomputes its trips, memory as the forward left it at its end, not as each
//! trip saw it. So the forward's loop itself keeps each such load's value (in its body or in a
//! branch of it), trip by trip, on a
//! tape of its own (a [`LoopTape`] of the arithmetic's dtype), and every recomputation of the
//! load (the copy that writes the carried values' tape, the reverse trips, a branch's
//! recomputation of the loop) reads it back from there. A branch outside loops that loads such a
//! tensor (the label's logit read after an early return for ignored rows) keeps its values the
//! same way, in one slot a program.

use super::emit::{program_index, trip_slots, Slots, Tapes};
use super::LoopTape;
use std::collections::HashMap;
use tilegrad_ir::{Block, DType, Inst, Kernel, KernelBuilder, Op, Value};

/// Where a load's values are kept: the tape, the first slot of the program's batch place
/// (`base`, i64: defined at the kernel's start), a trip's slots (`per_trip`, i64), the load's
/// place within a trip's slots (`at`), and whether it is in a loop.
#[derive(Clone, Copy, Debug)]
pub(super) struct LoadSlot {
    pub(super) tape: Value,
    pub(super) base: Value,
    pub(super) per_trip: Value,
    pub(super) at: usize,
    /// In a loop (a slot a trip), or in a branch outside loops (one slot).
    pub(super) in_loop: bool,
}

/// Instruments the forward in `b` (a continuation of the promoted kernel `k`): after each of
/// `loads` (`(loop, load)`, from [`super::refuse::refuse_unsupported`]; no loop for a load in a
/// branch outside loops) a store of its value, in `fl`, to its loop's tape at the trip's slot
/// (the branches' tape has one slot a program); the tapes go to `tapes.list`. Returns where each
/// load's values are.
pub(super) fn instrument(
    b: &mut KernelBuilder,
    k: &Kernel,
    loads: &[(Option<Inst>, Inst)],
    tapes: &Tapes,
    fl: DType,
) -> HashMap<Inst, LoadSlot> {
    let mut out = HashMap::new();
    let mut loops: Vec<Option<Inst>> = Vec::new();
    for &(l, _) in loads {
        if !loops.contains(&l) {
            loops.push(l);
        }
    }
    for l in loops {
        let mine: Vec<Inst> = loads.iter().filter(|(m, _)| *m == l).map(|&(_, i)| i).collect();
        // A loop's trip, from its induction variable; a branch outside loops runs once, in the
        // one slot its tape has a program.
        let (max_iters, trip, loc) = match l.map(|l| k.inst(l)) {
            Some(d) => match d.op {
                Op::For { body, max_iters } => (max_iters, Some((k.block(body).params[0], d.args[0], d.args[2])), d.loc.clone()),
                _ => continue,
            },
            None => (Some(1), None, k.inst(mine[0]).loc.clone()),
        };
        let mut at = Vec::new();
        let mut per_trip = 0usize;
        for &i in &mine {
            at.push(per_trip);
            per_trip += k.ty(k.inst(i).results[0]).numel();
        }
        let n = tapes.list.borrow().len();
        let tape = b.ptr_param(&format!("tg_tape{n}"), fl);
        let cap_name = format!("tg_cap{n}");
        let cap = b.scalar_param(&cap_name, DType::I64);
        let first = match b.param_value(&tapes.first) {
            Some(v) => v,
            None => b.scalar_param(&tapes.first, DType::I64),
        };
        tapes.list.borrow_mut().push(LoopTape {
            tape: format!("tg_tape{n}"),
            capacity_param: cap_name,
            per_trip,
            dtype: fl,
            max_iters,
            inst: l.unwrap_or(mine[0]),
            loc,
            checkpoints: None,
        });
        // The program's first slot, at the kernel's start: it holds wherever the load is.
        let (base, per) = b.insert_into(k.body, None, |b| {
            let pix = program_index(b);
            let pix = b.sub(pix, first);
            let per = b.i64(per_trip as i64);
            let base = b.mul(pix, cap);
            (b.mul(base, per), per)
        });
        for (&i, &a) in mine.iter().zip(&at) {
            let v = k.inst(i).results[0];
            let Some(blk) = l.and_then(|l| op_blocks(k, l)).and_then(|body| holding(k, body, i)).or_else(|| holding(k, k.body, i)) else {
                continue;
            };
            b.set_loc(Some(k.inst(i).loc.clone()));
            b.insert_into(blk, Some(i), |b| {
                let t = match trip {
                    Some((iv, lo, step)) => trip_of(b, iv, lo, step),
                    None => b.i32(0),
                };
                let p = trip_slots(b, k, Slots { tape, base, per_trip: per, at: &[a] }, t, &[v])[0];
                let w = if k.ty(v).dtype() == Some(fl) { v } else { b.cast(v, fl) };
                b.store(p, w, None);
            });
            out.insert(i, LoadSlot { tape, base, per_trip: per, at: a, in_loop: l.is_some() });
        }
    }
    b.set_loc(None);
    out
}

/// The body of loop `l`.
fn op_blocks(k: &Kernel, l: Inst) -> Option<Block> {
    match k.inst(l).op {
        Op::For { body, .. } => Some(body),
        _ => None,
    }
}

/// The block, `blk` or one nested in it, that holds instruction `i`.
pub(super) fn holding(k: &Kernel, blk: Block, i: Inst) -> Option<Block> {
    let insts = &k.block(blk).insts;
    if insts.contains(&i) {
        return Some(blk);
    }
    insts.iter().flat_map(|&j| k.inst(j).op.blocks()).find_map(|b| holding(k, b, i))
}

/// The trip (i32) of a `for` loop whose induction variable is `iv`: `(iv - lo) / step`.
pub(super) fn trip_of(b: &mut KernelBuilder, iv: Value, lo: Value, step: Value) -> Value {
    let gone = b.sub(iv, lo);
    let t = b.floordiv(gone, step);
    b.cast(t, DType::I32)
}
