//! What VJP kernels do not take yet, refused before any IR is emitted, with the op and its
//! location (see the module docs of [`super`]).

use crate::AdError;
use tilegrad_ir::analysis::pointer_sources;
use tilegrad_ir::{Inst, InstData, Kernel, Op};

pub(super) fn unsupported(k: &Kernel, d: &InstData, message: &str) -> AdError {
    AdError::Unsupported { kernel: k.name.clone(), op: d.op.mnemonic().into(), loc: d.loc.clone(), message: message.into() }
}

/// Refuses what has no VJP kernel yet (see the module docs), from the parameters each pointer
/// value may point into ([`pointer_sources`]) and the parameters some op writes. The loads
/// whose values the kernel keeps on a tape instead of reading them again, each with its loop
/// (`(loop, load)`; `None` for a branch outside loops): float loads in a `for` loop's body
/// (directly or in its branches) or in a branch that read a tensor the kernel writes.
pub(super) fn refuse_unsupported(k: &Kernel) -> Result<Vec<(Option<Inst>, Inst)>, AdError> {
    let sources = pointer_sources(k);
    let mut written = vec![false; k.params.len()];
    let mut refused = None;
    k.walk(&mut |_, d| {
        if let Op::Store { .. } | Op::AtomicAdd { .. } = d.op {
            for (w, &s) in written.iter_mut().zip(&sources[d.args[0].index()]) {
                *w |= s;
            }
        }
    });
    // Refusals: what has no VJP kernel yet.
    k.walk(&mut |_, d| {
        if refused.is_some() {
            return;
        }
        let why = match &d.op {
            Op::For { body, .. } | Op::While { body, .. } if k.block(*body).params.iter().any(|&v| k.ty(v).is_ptr()) => {
                Some("VJP kernels do not take loops that carry pointers yet (carry offsets instead); the CPU evaluator differentiates this kernel")
            }
            _ => None,
        };
        if let Some(why) = why {
            refused = Some(unsupported(k, d, why));
        }
    });
    // A load in a loop or a branch must read what the forward left (the reverse sweep
    // recomputes them after it), unless it reads through a tape: one in a `for` loop's body, or
    // in a branch outside loops (directly or in nested branches), keeps its value there
    // ([`super::taped`]).
    let mut nested_loads = Vec::new();
    loads_in(k, k.body, Within::Body, &mut nested_loads);
    let mut taped = Vec::new();
    for (i, within) in nested_loads {
        let d = k.inst(i);
        let from = &sources[d.args[0].index()];
        let reads_written = !from.contains(&true) || from.iter().zip(&written).any(|(&f, &w)| f && w);
        let float = k.ty(d.results[0]).dtype().is_some_and(|t| t.is_float());
        match (reads_written, within) {
            (false, _) => {}
            (true, Within::For(l)) if float => taped.push((Some(l), i)),
            (true, Within::Branch) if float => taped.push((None, i)),
            (true, _) if refused.is_none() => {
                refused = Some(unsupported(
                    k,
                    d,
                    "this load reads a tensor the kernel writes, in a `while` loop or a loop inside a loop (or reads \
                     integers): VJP kernels recompute it from memory as the forward left it, and keep loaded values \
                     only for float loads in `for` loops (not nested) and branches; the CPU evaluator differentiates \
                     this kernel",
                ));
            }
            _ => {}
        }
    }
    match refused {
        Some(e) => Err(e),
        None => Ok(taped),
    }
}

/// Where a load is: in the kernel's body, in a branch outside loops, in a `for` loop outside
/// loops (its body or a branch in it), or in a `while` loop or a loop inside a loop (whose trips
/// a tape of one loop's trips cannot tell apart).
#[derive(Clone, Copy)]
enum Within {
    Body,
    Branch,
    For(Inst),
    Other,
}

/// The loads in blocks nested in `blk` (not those of the kernel's body), each with where it is.
fn loads_in(k: &Kernel, blk: tilegrad_ir::Block, within: Within, out: &mut Vec<(Inst, Within)>) {
    for &i in &k.block(blk).insts {
        let d = k.inst(i);
        if !matches!(within, Within::Body) && matches!(d.op, Op::Load { .. }) {
            out.push((i, within));
        }
        for b in d.op.blocks() {
            let inner = match (&d.op, within) {
                (Op::For { .. }, Within::Body | Within::Branch) => Within::For(i),
                (Op::For { .. } | Op::While { .. }, _) => Within::Other,
                // A branch's sides are in the same trip.
                (_, Within::Body) => Within::Branch,
                (_, w) => w,
            };
            loads_in(k, b, inner, out);
        }
    }
}
