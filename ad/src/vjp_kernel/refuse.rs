//! What VJP kernels do not take yet, refused before any IR is emitted, with the op and its
//! location (see the module docs of [`super`]).

use crate::AdError;
use tilegrad_ir::analysis::pointer_sources;
use tilegrad_ir::{Inst, InstData, Kernel, Op};

pub(super) fn unsupported(k: &Kernel, d: &InstData, message: &str) -> AdError {
    AdError::Unsupported { kernel: k.name.clone(), op: d.op.mnemonic().into(), loc: d.loc.clone(), message: message.into() }
}

/// Refuses what has no VJP kernel yet (see the module docs), from the parameters each pointer
/// value may point into ([`pointer_sources`]) and the parameters some op writes.
pub(super) fn refuse_unsupported(k: &Kernel) -> Result<(), AdError> {
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
    fn has_loop(k: &Kernel, blk: tilegrad_ir::Block) -> bool {
        k.block(blk).insts.iter().any(|&i| {
            let op = &k.inst(i).op;
            matches!(op, Op::For { .. } | Op::While { .. }) || op.blocks().into_iter().any(|b| has_loop(k, b))
        })
    }
    k.walk(&mut |_, d| {
        if refused.is_some() {
            return;
        }
        let why = match &d.op {
            Op::For { body, .. } | Op::While { body, .. } => {
                let b = k.block(*body);
                if b.params.iter().any(|&v| k.ty(v).is_ptr()) {
                    Some("VJP kernels do not take loops that carry pointers yet (carry offsets instead); the CPU evaluator differentiates this kernel")
                } else if d.op.blocks().into_iter().any(|b| has_loop(k, b)) {
                    Some("VJP kernels do not take loops inside loops yet; the CPU evaluator differentiates this kernel")
                } else {
                    None
                }
            }
            _ => None,
        };
        if let Some(why) = why {
            refused = Some(unsupported(k, d, why));
        }
    });
    // A load in a loop or a branch must read what the forward left (the reverse sweep
    // recomputes them after it).
    fn loads_in(k: &Kernel, blk: tilegrad_ir::Block, nested: bool, out: &mut Vec<Inst>) {
        for &i in &k.block(blk).insts {
            let d = k.inst(i);
            if nested && matches!(d.op, Op::Load { .. }) {
                out.push(i);
            }
            for b in d.op.blocks() {
                loads_in(k, b, true, out);
            }
        }
    }
    let mut nested_loads = Vec::new();
    loads_in(k, k.body, false, &mut nested_loads);
    for i in nested_loads {
        let d = k.inst(i);
        let from = &sources[d.args[0].index()];
        let reads_written = !from.contains(&true) || from.iter().zip(&written).any(|(&f, &w)| f && w);
        if reads_written && refused.is_none() {
            refused = Some(unsupported(
                k,
                d,
                "this load in a loop or branch reads a tensor the kernel writes: VJP kernels recompute loops and \
                 branches from memory as the forward left it, so they do not take it yet; the CPU evaluator \
                 differentiates this kernel",
            ));
        }
    }
    match refused {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
