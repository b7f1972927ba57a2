//! Analyses shared by backends: which pointer parameters each pointer value may point into, what
//! each parameter is used for (loaded, stored, atomically updated), and which loads leave their
//! masked-off lanes to the backend (no `other`).

use crate::kernel::{Kernel, Value};
use crate::op::Op;

/// For every value, the set of parameters (by position) a pointer value may derive from; empty
/// for non-pointers. Computed to a fixpoint over loop-carried values and `if` results.
pub fn pointer_sources(k: &Kernel) -> Vec<Vec<bool>> {
    let np = k.params.len();
    let mut src: Vec<Vec<bool>> = vec![Vec::new(); k.values.len()];
    for (j, p) in k.params.iter().enumerate() {
        if let Some(s) = src.get_mut(p.value.index()) {
            *s = vec![false; np];
            s[j] = true;
        }
    }
    let union = |src: &mut Vec<Vec<bool>>, to: Value, from: Value| -> bool {
        let f = src[from.index()].clone();
        if f.is_empty() {
            return false;
        }
        let t = &mut src[to.index()];
        if t.is_empty() {
            *t = vec![false; f.len()];
        }
        let mut changed = false;
        for (a, b) in t.iter_mut().zip(f) {
            if b && !*a {
                *a = true;
                changed = true;
            }
        }
        changed
    };
    let mut insts = Vec::new();
    k.walk(&mut |i, _| insts.push(i));
    // Each pass propagates along at least one more loop back edge; the sets only grow.
    for _ in 0..=k.values.len() {
        let mut changed = false;
        for &i in &insts {
            let d = k.inst(i);
            match &d.op {
                Op::AddPtr | Op::Broadcast | Op::Reshape | Op::ExpandDims { .. } | Op::Permute { .. } => {
                    changed |= union(&mut src, d.results[0], d.args[0]);
                }
                Op::Where => {
                    changed |= union(&mut src, d.results[0], d.args[1]);
                    changed |= union(&mut src, d.results[0], d.args[2]);
                }
                Op::For { body, .. } => {
                    let bd = k.block(*body);
                    let y = bd.insts.last().map(|&l| k.inst(l).args.clone()).unwrap_or_default();
                    for (j, &init) in d.args[3..].iter().enumerate() {
                        changed |= union(&mut src, bd.params[j + 1], init);
                        changed |= union(&mut src, d.results[j], init);
                        if let Some(&yv) = y.get(j) {
                            changed |= union(&mut src, bd.params[j + 1], yv);
                            changed |= union(&mut src, d.results[j], yv);
                        }
                    }
                }
                Op::While { cond, body, .. } => {
                    let (cd, bd) = (k.block(*cond), k.block(*body));
                    let y = bd.insts.last().map(|&l| k.inst(l).args.clone()).unwrap_or_default();
                    for (j, &init) in d.args.iter().enumerate() {
                        for p in [cd.params[j], bd.params[j], d.results[j]] {
                            changed |= union(&mut src, p, init);
                            if let Some(&yv) = y.get(j) {
                                changed |= union(&mut src, p, yv);
                            }
                        }
                    }
                }
                Op::If { then_block, else_block } => {
                    for b in [then_block, else_block] {
                        if let Some(&l) = k.block(*b).insts.last() {
                            for (j, &yv) in k.inst(l).args.iter().enumerate() {
                                if let Some(&r) = d.results.get(j) {
                                    changed |= union(&mut src, r, yv);
                                }
                            }
                        }
                    }
                }
                Op::ProgramId { .. }
                | Op::NumPrograms { .. }
                | Op::Const { .. }
                | Op::Arange { .. }
                | Op::Unary(_)
                | Op::Binary(_)
                | Op::Cmp(_)
                | Op::Cast
                | Op::Reduce { .. }
                | Op::Cumsum { .. }
                | Op::Dot { .. }
                | Op::Load { .. }
                | Op::Store { .. }
                | Op::AtomicAdd { .. }
                | Op::AtomicRmw { .. }
                | Op::AtomicCas
                | Op::Yield => {}
            }
        }
        if !changed {
            break;
        }
    }
    src
}

/// How a kernel uses each of its parameters' memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParamUse {
    /// Some load may read through it.
    pub loaded: bool,
    /// Some store may write through it.
    pub stored: bool,
    /// Some atomic op may update through it.
    pub atomic: bool,
}

/// The use of every parameter (by position).
pub fn param_uses(k: &Kernel) -> Vec<ParamUse> {
    let src = pointer_sources(k);
    let mut uses = vec![ParamUse::default(); k.params.len()];
    k.walk(&mut |_, d| {
        let (field, ptr): (fn(&mut ParamUse) -> &mut bool, Value) = match d.op {
            Op::Load { .. } => (|u| &mut u.loaded, d.args[0]),
            Op::Store { .. } => (|u| &mut u.stored, d.args[0]),
            Op::AtomicAdd { .. } | Op::AtomicRmw { .. } | Op::AtomicCas => (|u| &mut u.atomic, d.args[0]),
            _ => return,
        };
        for (j, &b) in src[ptr.index()].iter().enumerate() {
            if b {
                *field(&mut uses[j]) = true;
            }
        }
    });
    uses
}

/// The loads whose masked-off lanes read what the backend leaves there: masked float loads
/// without `other`, in instruction order. On Triton's NVIDIA and AMD backends those lanes read
/// 0 (the register is zeroed before the predicated load); Triton documents them as undefined.
/// A launch may *poison* some of them (read NaN) to find whether its results depend on those
/// lanes: the `i`-th load of this list is poisoned when bit `min(i, 63)` of the mask is set.
pub fn unfilled_loads(k: &Kernel) -> Vec<crate::kernel::Inst> {
    let mut out = Vec::new();
    k.walk(&mut |i, d| {
        if let Op::Load { mask: true, other: false } = d.op {
            if k.ty(d.results[0]).dtype().is_some_and(|t| t.is_float()) {
                out.push(i);
            }
        }
    });
    out.sort();
    out
}

/// Whether the `i`-th of [`unfilled_loads`] is poisoned under `mask`.
pub fn poisoned(mask: u64, i: usize) -> bool {
    mask >> i.min(63) & 1 != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, KernelBuilder};

    #[test]
    fn provenance_follows_arithmetic_selects_and_loops() {
        let mut b = KernelBuilder::new("p");
        let x = b.ptr_param("x", DType::F32);
        let y = b.ptr_param("y", DType::F32);
        let z = b.ptr_param("z", DType::F32);
        let n = b.scalar_param("n", DType::I32);
        let ar = b.arange(0, 16);
        let px = b.add(x, ar);
        let v = b.load(px, None, None);
        let zero = b.i32(0);
        let one = b.i32(1);
        // A pointer into y carried through a loop and advanced each iteration, then stored to.
        let r = b.for_range(zero, n, one, None, &[y], |b, _, c| vec![b.add(c[0], one)]);
        let py = b.add(r[0], ar);
        b.store(py, v, None);
        let m = b.lt(ar, n);
        let sel = b.where_(m, px, py);
        b.atomic_add(sel, v, None);
        let _ = z;
        let k = b.finish().unwrap();
        let u = param_uses(&k);
        assert_eq!(u[0], ParamUse { loaded: true, stored: false, atomic: true });
        assert_eq!(u[1], ParamUse { loaded: false, stored: true, atomic: true });
        assert_eq!(u[2], ParamUse::default());
        assert_eq!(u[3], ParamUse::default());
    }
}
