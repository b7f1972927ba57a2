//! The gather/scatter dataflow graph of a kernel as launched: one node per instruction (loads are
//! Gather nodes, stores Scatter nodes, atomics AtomicAdd nodes, loops and branches one node each
//! with their bodies' nodes nested under them), SSA edges from definitions to uses, and memory
//! edges from each store to the later accesses of the same tensor (the memory versions a load
//! may read). Tensors are identified by the launch's binding of pointer parameters, so two
//! parameters bound to one tensor alias.
//!
//! The engine uses the graph for the facts it needs before running programs: whether any load
//! may read a version written by its own program (then programs track an overlay of their own
//! stores), and which tensors each memory node may touch.

use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use std::collections::HashMap;
use tilegrad_ir::{Block, Inst, Kernel, Loc, Op, Value};

/// What a node does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeKind {
    /// A load: reads memory through offsets (and a mask).
    Gather,
    /// A store: writes memory.
    Scatter,
    /// An atomic add.
    AtomicAdd,
    /// A structured loop; its body's nodes have it as `parent`.
    Loop,
    /// A branch; its blocks' nodes have it as `parent`.
    Branch,
    /// Any other op (compute, layout, program id, yield).
    Compute,
}

/// A graph node.
#[derive(Clone, Debug)]
pub struct Node {
    /// The instruction.
    pub inst: Inst,
    /// Its kind.
    pub kind: NodeKind,
    /// The op's mnemonic.
    pub op: &'static str,
    /// Source location of the op.
    pub loc: Loc,
    /// The loop or branch node it is nested in.
    pub parent: Option<NodeIndex>,
    /// Tensor slots a memory node may access (empty otherwise).
    pub slots: Vec<u32>,
}

/// A graph edge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Edge {
    /// The source defines operand `n` of the target.
    Data(usize),
    /// The target may read or overwrite what the source stored.
    Memory,
}

/// The dataflow graph of a kernel under one launch binding, and the facts derived from it.
pub struct KernelGraph {
    /// The graph.
    pub graph: StableDiGraph<Node, Edge>,
    /// Node of each instruction.
    pub node_of: HashMap<Inst, NodeIndex>,
}

/// Facts the engine needs about a launch of a kernel.
pub struct KernelFacts {
    /// Some load may read a store of its own program (a load after a store to the same tensor,
    /// or both in one loop): programs then keep an overlay of their own stores.
    pub needs_overlay: bool,
    /// The engine itself finds every error a reference run of the launch would report, so the
    /// launch needs no separate validation run (see [`KernelGraph::facts`]).
    pub self_checking: bool,
}

impl KernelGraph {
    /// Builds the graph; `param_slot` maps each parameter (by position) to its tensor slot.
    pub fn build(k: &Kernel, param_slot: &[Option<u32>]) -> KernelGraph {
        let src = tilegrad_ir::analysis::pointer_sources(k);
        let mut g = KernelGraph { graph: StableDiGraph::new(), node_of: HashMap::new() };
        let mut def: HashMap<Value, NodeIndex> = HashMap::new();
        let mut memory: Vec<NodeIndex> = Vec::new();
        g.add_block(k, k.body, None, &src, param_slot, &mut def, &mut memory);
        g
    }

    #[allow(clippy::too_many_arguments)]
    fn add_block(
        &mut self,
        k: &Kernel,
        b: Block,
        parent: Option<NodeIndex>,
        src: &[Vec<bool>],
        param_slot: &[Option<u32>],
        def: &mut HashMap<Value, NodeIndex>,
        memory: &mut Vec<NodeIndex>,
    ) {
        for &i in &k.block(b).insts {
            let d = k.inst(i);
            let kind = match d.op {
                Op::Load { .. } => NodeKind::Gather,
                Op::Store { .. } => NodeKind::Scatter,
                Op::AtomicAdd { .. } => NodeKind::AtomicAdd,
                Op::For { .. } | Op::While { .. } => NodeKind::Loop,
                Op::If { .. } => NodeKind::Branch,
                _ => NodeKind::Compute,
            };
            let slots: Vec<u32> = if matches!(kind, NodeKind::Gather | NodeKind::Scatter | NodeKind::AtomicAdd) {
                let mut s: Vec<u32> = src[d.args[0].index()]
                    .iter()
                    .enumerate()
                    .filter(|(_, &b)| b)
                    .filter_map(|(j, _)| param_slot.get(j).copied().flatten())
                    .collect();
                s.sort_unstable();
                s.dedup();
                s
            } else {
                Vec::new()
            };
            let n = self.graph.add_node(Node { inst: i, kind: kind.clone(), op: d.op.mnemonic(), loc: d.loc.clone(), parent, slots });
            self.node_of.insert(i, n);
            for (j, a) in d.args.iter().enumerate() {
                if let Some(&from) = def.get(a) {
                    self.graph.add_edge(from, n, Edge::Data(j));
                }
            }
            if kind != NodeKind::Compute && kind != NodeKind::Loop && kind != NodeKind::Branch {
                // Memory edges from earlier writes of an aliasing tensor.
                for &m in memory.iter() {
                    let earlier = &self.graph[m];
                    let writes = matches!(earlier.kind, NodeKind::Scatter | NodeKind::AtomicAdd);
                    if writes && earlier.slots.iter().any(|s| self.graph[n].slots.contains(s)) {
                        self.graph.add_edge(m, n, Edge::Memory);
                    }
                }
                memory.push(n);
            }
            for &r in &d.results {
                def.insert(r, n);
            }
            for nb in d.op.blocks() {
                for &p in &k.block(nb).params {
                    def.insert(p, n);
                }
                let before = memory.len();
                self.add_block(k, nb, Some(n), src, param_slot, def, memory);
                if matches!(d.op, Op::For { .. } | Op::While { .. }) {
                    // Loop-carried memory: a write late in the body reaches reads early in the
                    // next iteration.
                    let body: Vec<NodeIndex> = memory[before..].to_vec();
                    for &w in &body {
                        for &r in &body {
                            let (wn, rn) = (&self.graph[w], &self.graph[r]);
                            if matches!(wn.kind, NodeKind::Scatter | NodeKind::AtomicAdd)
                                && wn.slots.iter().any(|s| rn.slots.contains(s))
                                && w.index() >= r.index()
                            {
                                self.graph.add_edge(w, r, Edge::Memory);
                            }
                        }
                    }
                }
            }
        }
    }

    /// The facts the engine needs about kernel `k` (the kernel the graph was built from).
    ///
    /// A launch is *self-checking* when the engine's own run finds every error the reference
    /// interpreter would report: it bounds-checks every active lane of every access and checks
    /// every trip count against its `max_iters` as it goes, and the races it must find are
    /// only stores of different programs (or two lanes of one store) writing one element, which
    /// it finds from the stored runs. That holds when no tensor is both loaded and written
    /// (no read-write races), no tensor is both stored and atomically updated, and no address,
    /// mask, loop bound or branch condition depends on a float value (the engine computes
    /// floats in f64, the reference in the kernel's dtypes, so such accesses could differ).
    pub fn facts(&self, k: &Kernel) -> KernelFacts {
        let needs_overlay = self.graph.edge_indices().any(|e| {
            let (_, to) = self.graph.edge_endpoints(e).expect("edge exists");
            self.graph[e] == Edge::Memory && self.graph[to].kind == NodeKind::Gather
        });
        // Per slot: (loaded, stored, atomically updated).
        let mut uses: HashMap<u32, (bool, bool, bool)> = HashMap::new();
        for n in self.graph.node_weights() {
            for &s in &n.slots {
                let u = uses.entry(s).or_default();
                match n.kind {
                    NodeKind::Gather => u.0 = true,
                    NodeKind::Scatter => u.1 = true,
                    NodeKind::AtomicAdd => u.2 = true,
                    _ => {}
                }
            }
        }
        let disjoint = uses.values().all(|&(l, s, a)| !(l && (s || a)) && !(s && a));
        KernelFacts { needs_overlay, self_checking: disjoint && !floats_steer(k) }
    }
}

/// Activity analysis: for each value of `k` (by index), whether it may depend on a float load,
/// the only way the initial contents of a tensor enter a program. Values that do not (integer
/// and index arithmetic, offsets, masks, constants and what is computed from them alone) carry
/// no gradient to any input: the reverse sweep neither computes nor stores their cotangents.
pub fn active_values(k: &Kernel) -> Vec<bool> {
    fn float(k: &Kernel, v: Value) -> bool {
        crate::rules::is_differentiable(k.ty(v))
    }
    fn yields(k: &Kernel, b: Block) -> Vec<Value> {
        k.block(b).insts.last().map(|&l| k.inst(l)).filter(|d| matches!(d.op, Op::Yield)).map(|d| d.args.to_vec()).unwrap_or_default()
    }
    /// One pass over a block; returns whether anything changed.
    fn pass(k: &Kernel, b: Block, act: &mut [bool]) -> bool {
        let mut changed = false;
        let set = |act: &mut [bool], v: Value, on: bool| {
            let turn = on && float(k, v) && !act[v.index()];
            act[v.index()] |= turn;
            turn
        };
        for &i in &k.block(b).insts {
            let d = k.inst(i);
            match &d.op {
                Op::Load { .. } => changed |= set(act, d.results[0], true),
                Op::For { body, .. } => {
                    let params = &k.block(*body).params;
                    let ys = yields(k, *body);
                    for (j, &r) in d.results.iter().enumerate() {
                        let on = d.args.get(3 + j).is_some_and(|a| act[a.index()]) || ys.get(j).is_some_and(|y| act[y.index()]);
                        changed |= set(act, r, on);
                        if let Some(&p) = params.get(1 + j) {
                            changed |= set(act, p, on);
                        }
                    }
                    changed |= pass(k, *body, act);
                }
                Op::While { cond, body, .. } => {
                    let (cp, bp) = (&k.block(*cond).params, &k.block(*body).params);
                    let ys = yields(k, *body);
                    for (j, &r) in d.results.iter().enumerate() {
                        let on = act[d.args[j].index()] || ys.get(j).is_some_and(|y| act[y.index()]);
                        for v in [r, cp[j], bp[j]] {
                            changed |= set(act, v, on);
                        }
                    }
                    changed |= pass(k, *cond, act);
                    changed |= pass(k, *body, act);
                }
                Op::If { then_block, else_block } => {
                    changed |= pass(k, *then_block, act);
                    changed |= pass(k, *else_block, act);
                    let (t, e) = (yields(k, *then_block), yields(k, *else_block));
                    for (j, &r) in d.results.iter().enumerate() {
                        let on = t.get(j).is_some_and(|y| act[y.index()]) || e.get(j).is_some_and(|y| act[y.index()]);
                        changed |= set(act, r, on);
                    }
                }
                _ => {
                    let on = d.args.iter().any(|a| act[a.index()]);
                    for &r in &d.results {
                        changed |= set(act, r, on);
                    }
                }
            }
        }
        changed
    }
    let mut act = vec![false; k.values.len()];
    while pass(k, k.body, &mut act) {}
    act
}

/// For each value of `k` (by index), whether it is a `broadcast` of a number tile the evaluator
/// may leave unmaterialised (a broadcast view, see [`crate::rules::takes_views`]): its source
/// has the result's rank (or is a scalar), and every use of it is an op that accepts views.
pub fn broadcast_views(k: &Kernel) -> Vec<bool> {
    let mut view = vec![false; k.values.len()];
    let mut insts = Vec::new();
    k.walk(&mut |i, _| insts.push(i));
    for &i in &insts {
        let d = k.inst(i);
        if let Op::Broadcast = d.op {
            let (src, dst) = (k.ty(d.args[0]), k.ty(d.results[0]));
            let rank_ok = src.shape.is_empty() || crate::rules::broadcasts_to(&src.shape, &dst.shape);
            view[d.results[0].index()] = dst.dtype().is_some() && !dst.shape.is_empty() && rank_ok;
        }
    }
    for &i in &insts {
        let d = k.inst(i);
        if !crate::rules::takes_views(&d.op) {
            for a in &d.args {
                view[a.index()] = false;
            }
        }
    }
    view
}

/// Whether any address, mask, loop bound or branch condition of `k` may depend on a float
/// value (through any chain of ops, loop-carried values and branch results).
pub fn floats_steer(k: &Kernel) -> bool {
    let mut insts = Vec::new();
    k.walk(&mut |i, _| insts.push(i));
    let yields = |b: Block| k.block(b).insts.last().map(|&l| k.inst(l)).filter(|d| matches!(d.op, Op::Yield)).map(|d| d.args.to_vec());
    let mut dep: Vec<bool> = k.values.iter().map(|v| v.ty.dtype().is_some_and(|d| d.is_float())).collect();
    let mut changed = true;
    while changed {
        changed = false;
        let mut set = |dep: &mut Vec<bool>, v: Value, on: bool| {
            if on && !dep[v.index()] {
                dep[v.index()] = true;
                changed = true;
            }
        };
        for &i in &insts {
            let d = k.inst(i);
            match &d.op {
                Op::For { body, .. } => {
                    let ys = yields(*body).unwrap_or_default();
                    let params = &k.block(*body).params;
                    for (j, &r) in d.results.iter().enumerate() {
                        let on = d.args.get(3 + j).is_some_and(|a| dep[a.index()]) || ys.get(j).is_some_and(|y| dep[y.index()]);
                        set(&mut dep, r, on);
                        if let Some(&p) = params.get(1 + j) {
                            set(&mut dep, p, on);
                        }
                    }
                }
                Op::While { cond, body, .. } => {
                    let ys = yields(*body).unwrap_or_default();
                    let (cp, bp) = (&k.block(*cond).params, &k.block(*body).params);
                    for (j, &r) in d.results.iter().enumerate() {
                        let on = dep[d.args[j].index()] || ys.get(j).is_some_and(|y| dep[y.index()]);
                        for v in [r, cp[j], bp[j]] {
                            set(&mut dep, v, on);
                        }
                    }
                }
                Op::If { then_block, else_block } => {
                    let (t, e) = (yields(*then_block).unwrap_or_default(), yields(*else_block).unwrap_or_default());
                    for (j, &r) in d.results.iter().enumerate() {
                        let on = t.get(j).is_some_and(|y| dep[y.index()]) || e.get(j).is_some_and(|y| dep[y.index()]);
                        set(&mut dep, r, on);
                    }
                }
                _ => {
                    let on = d.args.iter().any(|a| dep[a.index()]);
                    for &r in &d.results {
                        set(&mut dep, r, on);
                    }
                }
            }
        }
    }
    insts.iter().any(|&i| {
        let d = k.inst(i);
        let steering: &[Value] = match &d.op {
            Op::Load { mask, .. } => &d.args[..1 + *mask as usize],
            Op::Store { mask } | Op::AtomicAdd { mask } => {
                if *mask {
                    &[d.args[0], d.args[2]]
                } else {
                    &d.args[..1]
                }
            }
            Op::For { .. } => &d.args[..3],
            Op::If { .. } => &d.args[..1],
            Op::While { cond, .. } => return yields(*cond).unwrap_or_default().iter().any(|v| dep[v.index()]),
            _ => &[],
        };
        steering.iter().any(|v| dep[v.index()])
    })
}

/// For each value of `k` (by index), whether the reverse sweep reads it, given the activity of
/// [`active_values`]: the operands and result of a compute op whose result is active, the
/// pointer and mask of a load whose result is active (and its `other` when that is active), an
/// active stored value, the condition of a branch and the start and step of a loop. Loop
/// snapshots keep only these (the others are recomputed if ever needed, never read).
pub fn reverse_needs(k: &Kernel, active: &[bool]) -> Vec<bool> {
    fn walk(k: &Kernel, b: Block, active: &[bool], need: &mut [bool]) {
        for &i in &k.block(b).insts {
            let d = k.inst(i);
            let mut mark = |v: Value| need[v.index()] = true;
            let res_active = d.results.first().is_some_and(|r| active[r.index()]);
            match &d.op {
                Op::Load { mask, other } => {
                    if res_active {
                        mark(d.args[0]);
                        if *mask {
                            mark(d.args[1]);
                        }
                        if *other && active[d.args[2].index()] {
                            mark(d.args[2]);
                        }
                    }
                }
                Op::Store { .. } | Op::AtomicAdd { .. } => {
                    if active[d.args[1].index()] {
                        mark(d.args[1]);
                    }
                }
                Op::For { body, .. } => {
                    mark(d.args[0]);
                    mark(d.args[2]);
                    walk(k, *body, active, need);
                }
                Op::While { cond, body, .. } => {
                    walk(k, *cond, active, need);
                    walk(k, *body, active, need);
                }
                Op::If { then_block, else_block } => {
                    mark(d.args[0]);
                    walk(k, *then_block, active, need);
                    walk(k, *else_block, active, need);
                }
                Op::Yield | Op::ProgramId { .. } | Op::NumPrograms { .. } | Op::AddPtr => {}
                _ => {
                    if res_active {
                        d.args.iter().for_each(|&a| mark(a));
                        d.results.iter().for_each(|&r| mark(r));
                    }
                }
            }
        }
    }
    let mut need = vec![false; k.values.len()];
    walk(k, k.body, active, &mut need);
    need
}

/// For each instruction (by index), the values of its block that die with it in the forward
/// sweep: those it is the last to read (a read inside a loop or branch counts as a read by that
/// instruction) or that it defines and nothing reads, unless the reverse sweep reads them
/// ([`reverse_needs`]) or a loop reads them (the reverse sweep may run its body again).
/// Freeing them right away keeps a program's live tiles few, so that new tiles reuse memory
/// that is still in cache.
pub fn forward_drops(k: &Kernel, needs: &[bool]) -> Vec<Vec<Value>> {
    /// Values read by instruction `i`, its nested blocks included.
    fn reads(k: &Kernel, i: Inst, out: &mut Vec<Value>) {
        let d = k.inst(i);
        out.extend(d.args.iter().copied());
        let nested: &[Block] = match &d.op {
            Op::For { body, .. } => std::slice::from_ref(body),
            Op::If { then_block, else_block } | Op::While { cond: then_block, body: else_block, .. } => &[*then_block, *else_block],
            _ => &[],
        };
        for &b in nested {
            for &j in &k.block(b).insts {
                reads(k, j, out);
            }
        }
    }
    fn walk(k: &Kernel, b: Block, needs: &[bool], last: &mut [Option<Inst>], kept: &mut [bool], drops: &mut [Vec<Value>]) {
        let insts = &k.block(b).insts;
        let mut used = Vec::new();
        for &i in insts {
            let d = k.inst(i);
            match &d.op {
                Op::For { body, .. } => walk(k, *body, needs, last, kept, drops),
                Op::If { then_block, else_block } | Op::While { cond: then_block, body: else_block, .. } => {
                    walk(k, *then_block, needs, last, kept, drops);
                    walk(k, *else_block, needs, last, kept, drops);
                }
                _ => {}
            }
            // After the nested blocks: a value of this block read inside them dies with `i`,
            // unless `i` is a loop.
            used.clear();
            reads(k, i, &mut used);
            for v in used.iter().chain(&d.results) {
                last[v.index()] = Some(i);
            }
            if let Op::For { .. } | Op::While { .. } = d.op {
                used.iter().for_each(|v| kept[v.index()] = true);
            }
        }
        // Nested blocks are done: the last readers of this block's results are final.
        for &i in insts {
            for r in &k.inst(i).results {
                if let (false, false, Some(at)) = (needs[r.index()], kept[r.index()], last[r.index()]) {
                    drops[at.index()].push(*r);
                }
            }
        }
    }
    let (mut last, mut kept) = (vec![None; k.values.len()], vec![false; k.values.len()]);
    let mut drops = vec![Vec::new(); k.insts.len()];
    walk(k, k.body, needs, &mut last, &mut kept, &mut drops);
    drops
}

#[cfg(test)]
mod tests {
    use super::*;
    use tilegrad_ir::{DType, KernelBuilder};

    #[test]
    fn memory_edges_link_stores_to_later_loads_of_aliasing_tensors() {
        let mut b = KernelBuilder::new("k");
        let x = b.ptr_param("x", DType::F32);
        let y = b.ptr_param("y", DType::F32);
        let ar = b.arange(0, 16);
        let px = b.add(x, ar);
        let v = b.load(px, None, None);
        let py = b.add(y, ar);
        b.store(py, v, None);
        let w = b.load(py, None, None);
        b.store(px, w, None);
        let k = b.finish().unwrap();
        // x and y are distinct tensors: the second load reads y after the store to y.
        let g = KernelGraph::build(&k, &[Some(0), Some(1)]);
        assert!(g.facts(&k).needs_overlay);
        let gathers = g.graph.node_indices().filter(|&n| g.graph[n].kind == NodeKind::Gather).count();
        let scatters = g.graph.node_indices().filter(|&n| g.graph[n].kind == NodeKind::Scatter).count();
        assert_eq!((gathers, scatters), (2, 2));
        let mem = g.graph.edge_indices().filter(|&e| g.graph[e] == Edge::Memory).count();
        // store y -> load y, store y -> store x? (no: other tensor), so exactly one memory edge.
        assert_eq!(mem, 1);
        // Bound to one tensor, every later access aliases.
        let g = KernelGraph::build(&k, &[Some(0), Some(0)]);
        let mem = g.graph.edge_indices().filter(|&e| g.graph[e] == Edge::Memory).count();
        assert_eq!(mem, 2);
    }

    #[test]
    fn a_pure_gather_then_scatter_kernel_needs_no_overlay() {
        let mut b = KernelBuilder::new("copy");
        let x = b.ptr_param("x", DType::F32);
        let y = b.ptr_param("y", DType::F32);
        let ar = b.arange(0, 16);
        let px = b.add(x, ar);
        let v = b.load(px, None, None);
        let py = b.add(y, ar);
        b.store(py, v, None);
        let k = b.finish().unwrap();
        let f = KernelGraph::build(&k, &[Some(0), Some(1)]).facts(&k);
        assert!(!f.needs_overlay && f.self_checking);
        // Bound to one tensor, the copy loads what it stores: it needs a reference run.
        assert!(!KernelGraph::build(&k, &[Some(0), Some(0)]).facts(&k).self_checking);
    }
}
