//! Dead-code removal: what a kernel computes that reaches no memory anyone reads.
//!
//! Generated kernels compute more than they need. A VJP kernel recomputes the whole forward,
//! stores included, although only its shadows are read back; its tape loops recompute values
//! that nothing tapes. On a GPU every such load is bandwidth: the weighted sum's VJP kernel read
//! its input three times where once is enough. This pass keeps only what reaches memory that
//! matters, and drops the rest, loops and loop-carried values included.

use crate::analysis::pointer_sources;
use crate::kernel::{Block, Inst, Kernel, Value};
use crate::op::Op;

/// A copy of `k` without the instructions whose effects reach no memory that matters.
///
/// Memory matters when `output(param)` says so for a pointer parameter (its final contents are
/// read after the launch), or when the kernel may read it back (a load, or an atomic, through a
/// pointer that may point into it). Writes (stores, atomics) into other memory are dropped; then
/// every instruction whose results nothing kept uses, `for` loops with nothing kept inside, and a
/// `for` loop's or an `if`'s results (with their carried values) that nothing kept uses. A
/// pointer whose parameter is unknown counts as pointing into memory that matters. Repeated
/// until nothing changes: a dropped load may leave a tensor nobody reads.
///
/// What the dropped instructions would have reported (an out-of-bounds access, a loop past its
/// bound) is not reported: run it on kernels whose forward was validated. The result is
/// canonicalized.
pub fn remove_dead_code(k: &Kernel, output: &dyn Fn(&str) -> bool) -> Kernel {
    let mut k = k.clone();
    while sweep(&mut k, output) {
        k.canonicalize();
    }
    k
}

/// Where a value comes from.
#[derive(Clone, Copy)]
enum Def {
    /// A kernel parameter (or nothing).
    None,
    /// Result `n` of an instruction.
    Result(Inst, usize),
    /// Parameter `n` of a block nested in an instruction.
    BlockParam(Inst, usize),
}

struct Live<'k> {
    k: &'k Kernel,
    def: Vec<Def>,
    /// The instruction whose block holds each instruction (none at the top level).
    parent: Vec<Option<Inst>>,
    live: Vec<bool>,
    needed: Vec<bool>,
    /// Per instruction, which of its results (carried values, `if` results) are live.
    carried: Vec<Vec<bool>>,
    work: Vec<Value>,
}

impl Live<'_> {
    fn value(&mut self, v: Value) {
        if let Some(l) = self.live.get_mut(v.index()) {
            if !*l {
                *l = true;
                self.work.push(v);
            }
        }
    }

    /// The yield ending block `b`.
    fn yield_of(&self, b: Block) -> Option<Inst> {
        self.k.block(b).insts.last().copied().filter(|&i| matches!(self.k.inst(i).op, Op::Yield))
    }

    /// Result `n` of loop or `if` `i` is live: its yields' operand `n`, and a loop's initial value.
    fn result(&mut self, i: Inst, n: usize) {
        self.inst(i);
        if self.carried[i.index()][n] {
            return;
        }
        self.carried[i.index()][n] = true;
        let d = self.k.inst(i);
        match &d.op {
            Op::For { body, .. } => {
                self.value(d.args[3 + n]);
                if let Some(y) = self.yield_of(*body) {
                    self.value(self.k.inst(y).args[n]);
                }
            }
            Op::If { then_block, else_block } => {
                for b in [*then_block, *else_block] {
                    if let Some(y) = self.yield_of(b) {
                        self.value(self.k.inst(y).args[n]);
                    }
                }
            }
            // A `while` keeps everything (`inst`).
            _ => {}
        }
    }

    /// Instruction `i` runs: its operands are live (a loop's bounds; an `if`'s condition; a
    /// `while`'s everything), and so is the instruction holding it.
    fn inst(&mut self, i: Inst) {
        if self.needed[i.index()] {
            return;
        }
        self.needed[i.index()] = true;
        let d = self.k.inst(i);
        match &d.op {
            Op::For { .. } => {
                for &a in &d.args[..3] {
                    self.value(a);
                }
            }
            Op::If { .. } => self.value(d.args[0]),
            Op::While { cond, body, .. } => {
                for &a in &d.args {
                    self.value(a);
                }
                for b in [*cond, *body] {
                    if let Some(y) = self.yield_of(b) {
                        for &a in &self.k.inst(y).args {
                            self.value(a);
                        }
                    }
                }
                self.carried[i.index()].iter_mut().for_each(|c| *c = true);
            }
            _ => {
                for &a in &d.args {
                    self.value(a);
                }
            }
        }
        if let Some(p) = self.parent[i.index()] {
            self.inst(p);
        }
    }

    fn run(&mut self) {
        while let Some(v) = self.work.pop() {
            match self.def[v.index()] {
                Def::None => {}
                Def::Result(i, n) => match self.k.inst(i).op {
                    Op::For { .. } | Op::If { .. } => self.result(i, n),
                    _ => self.inst(i),
                },
                Def::BlockParam(i, n) => match self.k.inst(i).op {
                    // The induction variable needs only the loop; a carried value, its slot.
                    Op::For { .. } if n == 0 => self.inst(i),
                    Op::For { .. } => self.result(i, n - 1),
                    _ => self.inst(i),
                },
            }
        }
    }
}

/// One round: marks what is live and removes the rest in place (arenas keep the dead entries);
/// says whether it removed anything.
fn sweep(k: &mut Kernel, output: &dyn Fn(&str) -> bool) -> bool {
    let src = pointer_sources(k);
    let mut def = vec![Def::None; k.values.len()];
    let mut parent = vec![None; k.insts.len()];
    fn index(k: &Kernel, b: Block, owner: Option<Inst>, def: &mut [Def], parent: &mut [Option<Inst>]) {
        for &i in &k.block(b).insts {
            parent[i.index()] = owner;
            let d = k.inst(i);
            for (n, r) in d.results.iter().enumerate() {
                def[r.index()] = Def::Result(i, n);
            }
            for nb in d.op.blocks() {
                for (n, p) in k.block(nb).params.iter().enumerate() {
                    def[p.index()] = Def::BlockParam(i, n);
                }
                index(k, nb, Some(i), def, parent);
            }
        }
    }
    index(k, k.body, None, &mut def, &mut parent);

    // Memory that matters: outputs, and whatever may be read back (a load, an atomic whose old
    // value is used).
    let mut used = vec![false; k.values.len()];
    k.walk(&mut |_, d| d.args.iter().for_each(|a| used[a.index()] = true));
    let mut matters: Vec<bool> = k.params.iter().map(|p| output(&p.name)).collect();
    k.walk(&mut |_, d| {
        let reads = match d.op {
            Op::Load { .. } => true,
            Op::AtomicAdd { .. } | Op::AtomicRmw { .. } | Op::AtomicCas => d.results.iter().any(|r| used[r.index()]),
            _ => false,
        };
        if reads {
            for (j, &b) in src[d.args[0].index()].iter().enumerate() {
                matters[j] |= b;
            }
        }
    });
    let carried = k.insts.iter().map(|d| vec![false; d.results.len()]).collect();
    let mut l = Live { k, def, parent, live: vec![false; k.values.len()], needed: vec![false; k.insts.len()], carried, work: Vec::new() };
    let mut roots = Vec::new();
    k.walk(&mut |i, d| {
        if d.op.writes_memory() {
            let s = &src[d.args[0].index()];
            if s.is_empty() || s.iter().zip(&matters).any(|(&b, &m)| b && m) {
                roots.push(i);
            }
        }
    });
    for i in roots {
        l.inst(i);
    }
    l.run();
    let Live { needed, carried, .. } = l;

    // Remove what is not needed, and the dead results of loops and `if`s.
    let mut changed = false;
    k.walk(&mut |i, d| changed |= !needed[i.index()] && !matches!(d.op, Op::Yield));
    for b in 0..k.blocks.len() {
        let insts = std::mem::take(&mut k.blocks[b].insts);
        k.blocks[b].insts = insts.into_iter().filter(|&i| needed[i.index()] || matches!(k.inst(i).op, Op::Yield)).collect();
    }
    for i in 0..k.insts.len() {
        let prunable = matches!(k.insts[i].op, Op::For { .. } | Op::If { .. });
        if !needed[i] || !prunable || carried[i].iter().all(|&c| c) {
            continue;
        }
        changed = true;
        let keep = carried[i].clone();
        let op = k.insts[i].op.clone();
        let pick = |v: &[Value], skip: usize| -> Vec<Value> {
            v.iter().enumerate().filter(|(n, _)| *n < skip || keep[n - skip]).map(|(_, &v)| v).collect()
        };
        match op {
            Op::For { body, .. } => {
                let d = &mut k.insts[i];
                d.args = pick(&d.args, 3).into();
                d.results = pick(&d.results, 0).into();
                let bp = &mut k.blocks[body.index()].params;
                *bp = pick(bp, 1);
                if let Some(&y) = k.blocks[body.index()].insts.last() {
                    let ya = &mut k.insts[y.index()].args;
                    *ya = pick(ya, 0).into();
                }
            }
            Op::If { then_block, else_block } => {
                let d = &mut k.insts[i];
                d.results = pick(&d.results, 0).into();
                for b in [then_block, else_block] {
                    if let Some(&y) = k.blocks[b.index()].insts.last() {
                        let ya = &mut k.insts[y.index()].args;
                        *ya = pick(ya, 0).into();
                    }
                }
            }
            _ => {}
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, KernelBuilder};

    /// A kernel with a loop whose accumulator reaches an output, a second carried value that
    /// reaches only a scratch tensor, and a load whose value goes nowhere.
    fn kernel() -> Kernel {
        let mut b = KernelBuilder::new("k");
        let x = b.ptr_param("x", DType::F32);
        let out = b.ptr_param("out", DType::F32);
        let scratch = b.ptr_param("scratch", DType::F32);
        let n = b.scalar_param("n", DType::I32);
        let ar = b.arange(0, 16);
        let px = b.add(x, ar);
        let zero = b.i32(0);
        let one = b.i32(1);
        let z = b.f32(0.0);
        let acc0 = b.broadcast_to(z, &[16]);
        let r = b.for_range(zero, n, one, None, &[acc0, acc0], |b, _, c| {
            let v = b.load(px, None, None);
            let e = b.exp(v);
            vec![b.add(c[0], v), b.add(c[1], e)]
        });
        let _unused = b.load(px, None, None);
        let po = b.add(out, ar);
        b.store(po, r[0], None);
        let ps = b.add(scratch, ar);
        b.store(ps, r[1], None);
        b.finish().unwrap()
    }

    fn ops(k: &Kernel) -> Vec<&'static str> {
        let mut v = Vec::new();
        k.walk(&mut |_, d| v.push(d.op.mnemonic()));
        v
    }

    #[test]
    fn drops_what_reaches_no_memory_that_matters() {
        let k = kernel();
        let only_out = remove_dead_code(&k, &|p| p == "out");
        crate::verify(&only_out).unwrap();
        let o = ops(&only_out);
        // One store, one carried value, one load (the loop's), no exp.
        assert_eq!(o.iter().filter(|&&m| m == "store").count(), 1);
        assert_eq!(o.iter().filter(|&&m| m == "load").count(), 1);
        assert!(!o.contains(&"exp"), "{o:?}");
        only_out.walk(&mut |_, d| {
            if matches!(d.op, Op::For { .. }) {
                assert_eq!(d.results.len(), 1);
                assert_eq!(d.args.len(), 4);
            }
        });
        // Both outputs: everything but the unused load stays.
        let both = remove_dead_code(&k, &|p| p == "out" || p == "scratch");
        let o = ops(&both);
        assert_eq!(o.iter().filter(|&&m| m == "store").count(), 2);
        assert_eq!(o.iter().filter(|&&m| m == "load").count(), 1);
        assert!(o.contains(&"exp"));
        // No output: nothing but the parameters.
        let none = remove_dead_code(&k, &|_| false);
        assert!(ops(&none).is_empty(), "{:?}", ops(&none));
    }

    #[test]
    fn keeps_writes_to_memory_the_kernel_reads_back() {
        // y is scratch, but the kernel loads it after storing: the store stays.
        let mut b = KernelBuilder::new("k");
        let x = b.ptr_param("x", DType::F32);
        let y = b.ptr_param("y", DType::F32);
        let out = b.ptr_param("out", DType::F32);
        let ar = b.arange(0, 8);
        let px = b.add(x, ar);
        let v = b.load(px, None, None);
        let py = b.add(y, ar);
        b.store(py, v, None);
        let w = b.load(py, None, None);
        let po = b.add(out, ar);
        b.atomic_add(po, w, None);
        let k = b.finish().unwrap();
        let kept = remove_dead_code(&k, &|p| p == "out");
        assert_eq!(ops(&kept), ops(&k));
    }
}
