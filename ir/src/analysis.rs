//! Analyses shared by backends: which pointer parameters each pointer value may point into, what
//! each parameter is used for (loaded, stored, atomically updated), and which loads leave their
//! masked-off lanes to the backend (no `other`), and what the condition of a `while` loop
//! depends on.

use crate::kernel::{Inst, Kernel, Value};
use crate::op::Op;
use std::collections::{HashMap, HashSet};

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

/// What the condition of a `while` loop depends on: the loop-carried values it is computed
/// from, directly or through the body's updates of other carried values, and whether that
/// computation reads memory. Everything else it uses is defined before the loop and cannot
/// change while the loop runs.
///
/// So an iteration that ends with every carried value in `carried` as it began (and, when
/// `reads_memory`, with memory as it began) is followed by the same iteration forever: the loop
/// can never end, whatever the other carried values and the stores do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WhileDeps {
    /// By carried position: the condition depends on it.
    pub carried: Vec<bool>,
    /// A load or atomic contributes to the condition.
    pub reads_memory: bool,
}

/// [`WhileDeps`] of the `while` instruction `i`; `None` when `i` is not a `while`.
pub fn while_deps(k: &Kernel, i: Inst) -> Option<WhileDeps> {
    let Op::While { cond, body, .. } = k.inst(i).op else { return None };
    let (cd, bd) = (k.block(cond), k.block(body));
    let yields = |b: &crate::kernel::BlockData| b.insts.last().map(|&l| k.inst(l).args.to_vec()).unwrap_or_default();
    let next = yields(bd);
    // Values defined at the top level of the two blocks; values of nested blocks are reached
    // through the instruction that owns them, which is taken whole.
    let mut def: HashMap<Value, Inst> = HashMap::new();
    for b in [cd, bd] {
        for &j in &b.insts {
            def.extend(k.inst(j).results.iter().map(|&r| (r, j)));
        }
    }
    let carried_at: HashMap<Value, usize> =
        cd.params.iter().enumerate().chain(bd.params.iter().enumerate()).map(|(n, &p)| (p, n)).collect();
    let mut deps = WhileDeps { carried: vec![false; cd.params.len()], reads_memory: false };
    let mut seen: HashSet<Inst> = HashSet::new();
    let mut work = yields(cd);
    while let Some(v) = work.pop() {
        if let Some(&n) = carried_at.get(&v) {
            if !deps.carried[n] {
                deps.carried[n] = true;
                work.extend(next.get(n).copied());
            }
        } else if let Some(&j) = def.get(&v) {
            if seen.insert(j) {
                depend_on(k, j, &mut work, &mut deps.reads_memory);
            }
        }
    }
    Some(deps)
}

/// Adds the operands of `i` and of every instruction nested in its blocks to `work`; notes
/// whether any of them reads memory.
fn depend_on(k: &Kernel, i: Inst, work: &mut Vec<Value>, reads_memory: &mut bool) {
    let d = k.inst(i);
    *reads_memory |= match d.op {
        Op::Load { .. } | Op::AtomicAdd { .. } | Op::AtomicRmw { .. } | Op::AtomicCas => true,
        Op::ProgramId { .. }
        | Op::NumPrograms { .. }
        | Op::Const { .. }
        | Op::Arange { .. }
        | Op::Broadcast
        | Op::ExpandDims { .. }
        | Op::Reshape
        | Op::Permute { .. }
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Cmp(_)
        | Op::Where
        | Op::Cast
        | Op::Reduce { .. }
        | Op::Cumsum { .. }
        | Op::Dot { .. }
        | Op::AddPtr
        | Op::Store { .. }
        | Op::For { .. }
        | Op::While { .. }
        | Op::If { .. }
        | Op::Yield => false,
    };
    work.extend(d.args.iter().copied());
    for b in d.op.blocks() {
        for &j in &k.block(b).insts {
            depend_on(k, j, work, reads_memory);
        }
    }
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

    #[test]
    fn while_deps_follow_the_body_from_the_condition() {
        // while j < 10: acc += x; j = where(acc > 5, 10, 0) ; out = acc * 2 (not in the condition)
        let mut b = KernelBuilder::new("w");
        let x = b.ptr_param("x", DType::F32);
        let (zero, ten, five, two) = (b.i32(0), b.i32(10), b.f32(5.0), b.f32(2.0));
        let acc0 = b.f32(0.0);
        let v = b.load(x, None, None);
        b.while_loop(
            None,
            &[zero, acc0, acc0],
            |b, c| b.lt(c[0], ten),
            |b, c| {
                let acc = b.add(c[1], v);
                let big = b.gt(acc, five);
                let j = b.where_(big, ten, zero);
                let out = b.mul(acc, two);
                vec![j, acc, out]
            },
        );
        let k = b.finish().unwrap();
        let mut ws = Vec::new();
        k.walk(&mut |i, d| {
            if matches!(d.op, Op::While { .. }) {
                ws.push(i)
            }
        });
        let d = while_deps(&k, ws[0]).unwrap();
        assert_eq!(d, WhileDeps { carried: vec![true, true, false], reads_memory: false });
    }

    #[test]
    fn while_deps_see_loads_in_the_condition_and_in_nested_blocks() {
        let mut b = KernelBuilder::new("w");
        let x = b.ptr_param("x", DType::I32);
        let (zero, one, three) = (b.i32(0), b.i32(1), b.i32(3));
        // while load(x) > 0: i += 1 (the counter is not in the condition)
        b.while_loop(
            None,
            &[zero],
            |b, _| {
                let v = b.load(x, None, None);
                b.gt(v, zero)
            },
            |b, c| vec![b.add(c[0], one)],
        );
        // while i < 3: i = (for t in 0..1: t + load(x)) : a load in a nested loop
        b.while_loop(
            None,
            &[zero],
            |b, c| b.lt(c[0], three),
            |b, c| {
                let i = c[0];
                b.for_range(zero, one, one, None, &[i], |b, _, c| {
                    let v = b.load(x, None, None);
                    vec![b.add(c[0], v)]
                })
            },
        );
        let k = b.finish().unwrap();
        let mut ws = Vec::new();
        k.walk(&mut |i, d| {
            if matches!(d.op, Op::While { .. }) {
                ws.push(i)
            }
        });
        assert_eq!(while_deps(&k, ws[0]).unwrap(), WhileDeps { carried: vec![false], reads_memory: true });
        assert_eq!(while_deps(&k, ws[1]).unwrap(), WhileDeps { carried: vec![true], reads_memory: true });
        assert_eq!(while_deps(&k, k.block(k.body).insts[0]), None);
    }
}
