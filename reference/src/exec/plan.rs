//! Facts computed once per kernel before a launch: when each value dies (so programs free tiles
//! early and stay cache-resident), and which pointer parameters may be written (so that only
//! loads from those tensors are logged for race detection), and what each `while` loop's
//! condition depends on (so that a loop that can never end is found at its first idle iteration).

use std::collections::{HashMap, HashSet};
use tilegrad_ir::analysis::{while_deps, WhileDeps};
use tilegrad_ir::{Block, Inst, Kernel, Op, Value};

pub(crate) struct Plan {
    /// Values to drop after each instruction (by instruction index).
    pub free_after: Vec<Vec<Value>>,
    /// For each parameter (by position), whether a store or atomic may write through it.
    pub param_written: Vec<bool>,
    /// Programs must run one after another in program order, each seeing the memory the
    /// earlier ones left: the kernel has atomics other than `atomic_add`, or uses the old value
    /// an atomic returns (which depends on that order).
    pub ordered: bool,
    /// What the condition of each `while` loop depends on.
    pub while_deps: HashMap<Inst, WhileDeps>,
}

impl Plan {
    pub fn new(k: &Kernel) -> Plan {
        let mut free_after = vec![Vec::new(); k.insts.len()];
        plan_block(k, k.body, true, &mut free_after);
        for f in &mut free_after {
            f.sort();
        }
        Plan {
            free_after,
            param_written: tilegrad_ir::analysis::param_uses(k).iter().map(|u| u.stored || u.atomic).collect(),
            ordered: needs_order(k),
            while_deps: all_while_deps(k),
        }
    }
}

/// Whether a kernel's meaning depends on the order of its programs: it has atomics other than
/// `atomic_add`, or uses the old value an atomic returns. Its launches run their programs one after
/// another, in program order.
pub fn needs_order(k: &Kernel) -> bool {
    let mut results = HashSet::new();
    let mut ordered = false;
    k.walk(&mut |_, d| match d.op {
        Op::AtomicRmw { .. } | Op::AtomicCas => ordered = true,
        Op::AtomicAdd { .. } => results.extend(d.results.iter().copied()),
        _ => {}
    });
    if !ordered && !results.is_empty() {
        k.walk(&mut |_, d| ordered |= d.args.iter().any(|a| results.contains(a)));
    }
    ordered
}

/// [`WhileDeps`] of every `while` loop of `k`.
fn all_while_deps(k: &Kernel) -> HashMap<Inst, WhileDeps> {
    let mut out = HashMap::new();
    k.walk(&mut |i, _| {
        if let Some(d) = while_deps(k, i) {
            out.insert(i, d);
        }
    });
    out
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
}
