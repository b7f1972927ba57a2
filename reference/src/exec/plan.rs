//! Facts computed once per kernel before a launch: when each value dies (so programs free tiles
//! early and stay cache-resident), and which pointer parameters may be written (so that only
//! loads from those tensors are logged for race detection).

use std::collections::HashSet;
use tilegrad_ir::{Block, Kernel, Op, Value};

pub(crate) struct Plan {
    /// Values to drop after each instruction (by instruction index).
    pub free_after: Vec<Vec<Value>>,
    /// For each parameter (by position), whether a store or atomic may write through it.
    pub param_written: Vec<bool>,
}

impl Plan {
    pub fn new(k: &Kernel) -> Plan {
        let mut free_after = vec![Vec::new(); k.insts.len()];
        plan_block(k, k.body, true, &mut free_after);
        Plan { free_after, param_written: written_params(k) }
    }
}

/// All values used by an instruction, including uses nested in its blocks.
fn uses(k: &Kernel, i: tilegrad_ir::Inst, out: &mut Vec<Value>) {
    let d = k.inst(i);
    out.extend(d.args.iter().copied());
    for b in d.op.blocks() {
        for &j in &k.block(b).insts {
            uses(k, j, out);
        }
    }
}

fn plan_block(k: &Kernel, b: Block, is_body: bool, free_after: &mut [Vec<Value>]) {
    let bd = k.block(b);
    let mut here: HashSet<Value> = bd.params.iter().copied().collect();
    if is_body {
        // Parameters are defined at kernel entry; they are re-installed for every program.
        here.extend(k.params.iter().map(|p| p.value));
    }
    let mut last: std::collections::HashMap<Value, usize> = std::collections::HashMap::new();
    let mut buf = Vec::new();
    for (pos, &i) in bd.insts.iter().enumerate() {
        let d = k.inst(i);
        buf.clear();
        uses(k, i, &mut buf);
        for v in &buf {
            if here.contains(v) {
                last.insert(*v, pos);
            }
        }
        for &r in &d.results {
            here.insert(r);
            last.entry(r).or_insert(pos);
        }
        for nb in d.op.blocks() {
            plan_block(k, nb, false, free_after);
        }
    }
    // A yield reads its operands after the block ends: never free what the yield passes on.
    let yielded: HashSet<Value> = bd
        .insts
        .last()
        .map(|&i| k.inst(i))
        .filter(|d| matches!(d.op, Op::Yield))
        .map(|d| d.args.iter().copied().collect())
        .unwrap_or_default();
    for (v, pos) in last {
        if !yielded.contains(&v) {
            free_after[bd.insts[pos].index()].push(v);
        }
    }
    for f in free_after.iter_mut() {
        f.sort();
    }
}

/// Pointer provenance: which parameters each pointer value may derive from, to a fixpoint over
/// loop-carried values.
fn written_params(k: &Kernel) -> Vec<bool> {
    let np = k.params.len();
    let mut src: Vec<Vec<bool>> = vec![Vec::new(); k.values.len()];
    for (j, p) in k.params.iter().enumerate() {
        let mut s = vec![false; np];
        s[j] = true;
        src[p.value.index()] = s;
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
    let mut written = vec![false; np];
    for _ in 0..64 {
        let mut changed = false;
        let mut insts = Vec::new();
        k.walk(&mut |i, _| insts.push(i));
        for i in insts {
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
                        if let Some(&yv) = y.get(j) {
                            changed |= union(&mut src, bd.params[j + 1], yv);
                            changed |= union(&mut src, d.results[j], yv);
                        }
                        changed |= union(&mut src, d.results[j], init);
                    }
                }
                Op::If { then_block, else_block } => {
                    for b in [then_block, else_block] {
                        let bd = k.block(*b);
                        if let Some(&l) = bd.insts.last() {
                            for (j, &yv) in k.inst(l).args.iter().enumerate() {
                                if let Some(&r) = d.results.get(j) {
                                    changed |= union(&mut src, r, yv);
                                }
                            }
                        }
                    }
                }
                Op::Store { .. } | Op::AtomicAdd { .. } => {
                    for (j, &b) in src[d.args[0].index()].iter().enumerate() {
                        written[j] |= b;
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
                | Op::Yield => {}
            }
        }
        if !changed {
            break;
        }
    }
    written
}
