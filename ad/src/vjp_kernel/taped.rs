//! Loaded values kept on a tape: a `for` loop that loads a tensor the kernel also writes (a
//! gradient written in place over the logits it was computed from, a rotation of a tensor in
//! place, a running total read back from the previous chunk's output) would read, when the
//! reverse sweep recomputes its trips, memory as the forward left it at its end, not as each
//! trip saw it. So the forward's loop itself keeps each such load's value (in its body or in a
//! branch of it), trip by trip, on a
//! tape of its own (a [`LoopTape`] of the arithmetic's dtype), and every recomputation of the
//! load (the copy that writes the carried values' tape, the reverse trips, a branch's
//! recomputation of the loop) reads it back from there.

use super::emit::{program_index, trip_slots, Slots, Tapes};
use super::LoopTape;
use std::collections::HashMap;
use tilegrad_ir::{Block, DType, Inst, Kernel, KernelBuilder, Op, Value};

/// Where a load's values are kept: the tape, the first slot of the program's batch place
/// (`base`, i64: defined at the kernel's start), a trip's slots (`per_trip`, i64) and the
/// load's place within a trip's slots (`at`).
#[derive(Clone, Copy, Debug)]
pub(super) struct LoadSlot {
    pub(super) tape: Value,
    pub(super) base: Value,
    pub(super) per_trip: Value,
    pub(super) at: usize,
}

/// Instruments the forward in `b` (a continuation of the promoted kernel `k`): after each of
/// `loads` (`(loop, load)`, from [`super::refuse::refuse_unsupported`]) a store of its value,
/// in `fl`, to its loop's tape at the trip's slot; the tapes go to `tapes.list`. Returns where
/// each load's values are.
pub(super) fn instrument(b: &mut KernelBuilder, k: &Kernel, loads: &[(Inst, Inst)], tapes: &Tapes, fl: DType) -> HashMap<Inst, LoadSlot> {
    let mut out = HashMap::new();
    let mut loops: Vec<Inst> = Vec::new();
    for &(l, _) in loads {
        if !loops.contains(&l) {
            loops.push(l);
        }
    }
    for l in loops {
        let d = k.inst(l).clone();
        let Op::For { body, max_iters } = d.op else { continue };
        let mine: Vec<Inst> = loads.iter().filter(|(m, _)| *m == l).map(|&(_, i)| i).collect();
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
            inst: l,
            loc: d.loc.clone(),
            checkpoints: None,
        });
        // The program's first slot, at the kernel's start: it holds wherever the loop is.
        let (base, per) = b.insert_into(k.body, None, |b| {
            let pix = program_index(b);
            let pix = b.sub(pix, first);
            let per = b.i64(per_trip as i64);
            let base = b.mul(pix, cap);
            (b.mul(base, per), per)
        });
        let (lo, step) = (d.args[0], d.args[2]);
        let iv = k.block(body).params[0];
        for (&i, &a) in mine.iter().zip(&at) {
            let v = k.inst(i).results[0];
            b.set_loc(Some(k.inst(i).loc.clone()));
            let Some(blk) = holding(k, body, i) else { continue };
            b.insert_into(blk, Some(i), |b| {
                let t = trip_of(b, iv, lo, step);
                let p = trip_slots(b, k, Slots { tape, base, per_trip: per, at: &[a] }, t, &[v])[0];
                let w = if k.ty(v).dtype() == Some(fl) { v } else { b.cast(v, fl) };
                b.store(p, w, None);
            });
            out.insert(i, LoadSlot { tape, base, per_trip: per, at: a });
        }
    }
    b.set_loc(None);
    out
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
