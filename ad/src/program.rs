//! A batch of program instances, forward then reverse.
//!
//! The forward sweep evaluates the kernel body in f64 (through [`crate::rules`]) for a batch of
//! programs at once: a value holds one tile per program, or one tile shared by all where it is
//! the same in each (constants, `arange`, scalars, what only depends on them), which the rules
//! broadcast. Control flow must agree across the batch; where a loop bound or branch condition
//! differs between its programs, the batch reports divergence and is split by the caller. The
//! sweep records a tape: the carried values of loop iterations, and a log of memory events
//! (stores and atomics with their active lanes and values; for loads that read this program's
//! own earlier stores, which store lane each lane read; such kernels run one program per batch).
//! Loop tapes stay within a byte budget per program ([`tape`]): intermediate values of a loop
//! body are kept while they fit, else recomputed from the carried values; carried values are
//! kept for every iteration while they fit, else for every k-th, and the reverse sweep runs the
//! segments between them forward again.
//!
//! The reverse sweep walks the body backwards applying one VJP rule per op. Memory follows the
//! launch semantics of the design: a store's value receives the launch-output cotangent of the
//! elements it is the last writer of, plus the cotangents of this program's later loads that
//! read it; a load's cotangent goes to the element it read (an input tensor, or this program's
//! earlier store); an atomic contribution receives the output cotangent of its element.

mod memory;
mod tape;

use crate::graph::KernelFacts;
use crate::rules::{self, Precision};
use crate::{AdError, BTile};
use memory::{add_batched, add_in_place, fit_batch, Event, LoadRuns, Provenance};
pub(crate) use memory::{Contrib, StoreRun};
use smallvec::SmallVec;
use std::collections::HashMap;
use tape::{Checkpoints, Snap, Trip};
use tilegrad_ir::{Block, DType, Inst, Kernel, Op, Type, Value};

/// A runtime value: a number tile, or a pointer tile (tensor slot and element offsets).
#[derive(Clone, Debug)]
pub(crate) enum V {
    Num(BTile),
    Ptr(u32, BTile),
}

impl V {
    fn num(&self) -> &BTile {
        match self {
            V::Num(t) => t,
            V::Ptr(_, o) => o,
        }
    }
}

/// The initial contents of a tensor, read in place (f32 and f64) or converted to f64 once.
pub(crate) enum Initial<'a> {
    F32(&'a [f32]),
    F64(&'a [f64]),
    Converted(Vec<f64>),
}

impl Initial<'_> {
    /// Elements.
    pub fn len(&self) -> usize {
        match self {
            Initial::F32(v) => v.len(),
            Initial::F64(v) => v.len(),
            Initial::Converted(v) => v.len(),
        }
    }
}

/// A tensor of the launch as the AD engine sees it.
pub(crate) struct SlotData<'a> {
    pub name: String,
    pub initial: Initial<'a>,
    /// Cotangent of the final contents, when the tensor is a differentiated output.
    pub out_cot: Option<&'a [f64]>,
    /// Gradient of the initial contents is requested.
    pub is_input: bool,
}

impl SlotData<'_> {
    /// The elements programs store must be reported (an in-place tensor: elements no program
    /// stores pass their cotangent through).
    pub fn tracks_stores(&self) -> bool {
        self.is_input && self.out_cot.is_some()
    }
}

/// What all programs share.
pub(crate) struct Shared<'a> {
    pub kernel: &'a Kernel,
    pub facts: &'a KernelFacts,
    /// Per value: whether it may carry a gradient ([`crate::graph::active_values`]).
    pub active: &'a [bool],
    /// The launch rejects races (the default): no store has two lanes writing one element.
    pub races_rejected: bool,
    /// Per slot, the program whose store each element holds after the launch, where programs
    /// store the same value to one element ([`crate::GradOptions::last_writer_only`]): only that
    /// program's store receives the element's cotangent. Programs then run one per batch.
    pub owners: Option<&'a [Vec<u32>]>,
    /// Per value: whether the reverse sweep reads it ([`crate::graph::reverse_needs`]).
    pub needs: &'a [bool],
    /// Per value: its type as the rules see it (pointers as their i64 offsets).
    pub num_types: &'a [Type],
    pub slots: &'a [SlotData<'a>],
    pub params: &'a [V],
    pub grid: [u32; 3],
    pub precision: Precision,
    /// Bytes of loop-body values a program may keep for its reverse sweep; beyond it, loop bodies
    /// are recomputed from their taped carried values.
    pub tape_budget: usize,
    /// No reference run validated the launch: the engine must find its errors (out-of-bounds
    /// lanes, trip counts beyond `max_iters`, store races) itself.
    pub self_check: bool,
    /// Values that are the same in every program (see [`invariant_inst`]), computed once for
    /// the launch by [`Program::invariants`]; `None` elsewhere (and while computing them).
    pub invariant: Vec<Option<V>>,
    /// Per value: a broadcast left unmaterialised ([`crate::graph::broadcast_views`]).
    pub views: &'a [bool],
    /// Per instruction: the values that die with it in the forward sweep
    /// ([`crate::graph::forward_drops`]).
    pub drops: &'a [Vec<Value>],
}

/// What one program hands back: its gradient contributions and the elements it stored.
#[derive(Default)]
pub(crate) struct ProgramGrad {
    /// Contributions to the gradient of initial contents, in the order of the reverse sweep.
    pub contrib: Vec<Contrib>,
    /// Per slot: elements this program stored (they do not pass their cotangent through); only
    /// for slots that [`SlotData::tracks_stores`].
    pub stored: Vec<Vec<i64>>,
    /// Largest trip count per loop in this program.
    pub trips: Vec<(Inst, u64)>,
    /// Runs of stored elements, by program (only when [`Shared::self_check`]).
    pub store_runs: Vec<StoreRun>,
}

impl ProgramGrad {
    /// Bytes held (what a chunk of pending results costs).
    pub fn bytes(&self) -> usize {
        let contrib: usize = self.contrib.iter().map(|c| c.vals.len() * 8 + c.runs.len() * 16 + 64).sum();
        let stored: usize = self.stored.iter().map(|s| s.len() * 8).sum();
        contrib + stored + self.store_runs.len() * std::mem::size_of::<StoreRun>()
    }
}

/// Identifies one dynamic execution of a memory op: the op and the iteration indices of the
/// loops around it.
type Instance = (Inst, Vec<u32>);

/// A batch of program instances evaluated together: every value holds one tile per program
/// (or one tile for all of them where it is the same, e.g. constants and what only depends on
/// them). Control flow must agree across the batch (same trip counts, same branches); where it
/// does not, the batch reports divergence and the caller evaluates smaller batches.
pub(crate) struct Program<'a> {
    sh: &'a Shared<'a>,
    /// The batch's program ids, in launch order.
    pids: Vec<[u32; 3]>,
    /// The linear index of the batch's first program.
    first: u64,
    /// Set when control flow differs across the batch (the run then stops).
    divergent: bool,
    env: Vec<Option<V>>,
    cot: Vec<Option<BTile>>,
    /// Current iteration indices of the enclosing loops.
    path: Vec<u32>,
    /// Loop tapes: carried values at the start of iterations (every one, or every `stride`-th
    /// beyond the tape budget), per dynamic loop instance.
    tapes: HashMap<Instance, Checkpoints>,
    /// The loop instances whose tapes were kept, latest last: those of an iteration's nested
    /// loops are dropped when it ends, unless its snapshot keeps them ([`tape`]).
    tape_log: Vec<Instance>,
    /// Loop snapshots: every value of each iteration's body, while within the tape budget (the
    /// reverse sweep then restores instead of recomputing).
    snaps: HashMap<Instance, Vec<Snap>>,
    /// Bytes held in snapshots (and in the tapes of loops nested in snapshotted iterations).
    snap_bytes: usize,
    /// Values defined in each loop body (and its branches), by body block.
    body_values: HashMap<Block, Vec<Value>>,
    events: Vec<Event>,
    event_of: HashMap<Instance, usize>,
    loads: HashMap<Instance, Provenance>,
    /// Runs of elements (first, length) that a load read, with its batch, kept for its reverse
    /// when they are long (rows of a tile): the reverse needs not find them again.
    load_runs: LoadRuns,
    /// (slot, element) -> latest (event, lane) of this program, when the kernel loads after
    /// stores.
    overlay: HashMap<(u32, i64), (u32, u32)>,
    /// Per event: accumulated cotangent of its values, by lane.
    acc: Vec<Vec<f64>>,
    /// True while the reverse sweep recomputes a loop body (memory ops must not log again).
    replay: bool,
    out: ProgramGrad,
}

fn rule_err(k: &Kernel, i: Inst, e: AdError) -> AdError {
    let d = k.inst(i);
    match e {
        AdError::Rule { op, message } => AdError::Unsupported { kernel: k.name.clone(), op, loc: d.loc.clone(), message },
        other => other,
    }
}

impl<'a> Program<'a> {
    pub fn new(sh: &'a Shared<'a>, first: u64, pids: Vec<[u32; 3]>) -> Program<'a> {
        let n = sh.kernel.values.len();
        let mut env = vec![None; n];
        for (p, v) in sh.kernel.params.iter().zip(sh.params) {
            env[p.value.index()] = Some(v.clone());
        }
        Program {
            sh,
            pids,
            first,
            divergent: false,
            env,
            cot: vec![None; n],
            path: Vec::new(),
            tapes: HashMap::new(),
            tape_log: Vec::new(),
            snaps: HashMap::new(),
            snap_bytes: 0,
            body_values: HashMap::new(),
            events: Vec::new(),
            event_of: HashMap::new(),
            loads: HashMap::new(),
            load_runs: LoadRuns::default(),
            overlay: HashMap::new(),
            acc: Vec::new(),
            replay: false,
            out: ProgramGrad { stored: vec![Vec::new(); sh.slots.len()], ..ProgramGrad::default() },
        }
    }

    /// Forward, then reverse; returns the batch's contributions (program-major within each
    /// access), or `None` when control flow diverged across the batch.
    pub fn run(mut self) -> Result<Option<ProgramGrad>, AdError> {
        let body = self.sh.kernel.body;
        match self.forward_block(body) {
            Err(_) if self.divergent => return Ok(None),
            r => r?,
        };
        self.seed_store_cotangents();
        match self.reverse_block(body) {
            Err(_) if self.divergent => return Ok(None),
            r => r?,
        };
        for st in self.out.stored.iter_mut() {
            st.sort_unstable();
            st.dedup();
        }
        Ok(Some(self.out))
    }

    fn get(&self, v: Value) -> &V {
        lookup(&self.env, &self.sh.invariant, v)
    }

    /// The launch's program-invariant values ([`invariant_inst`]), evaluated once.
    pub fn invariants(sh: &'a Shared<'a>, pid: [u32; 3]) -> Result<Vec<Option<V>>, AdError> {
        let k = sh.kernel;
        let mut p = Program::new(sh, 0, vec![pid]);
        let mut out: Vec<Option<V>> = vec![None; k.values.len()];
        for &i in &k.block(k.body).insts {
            if invariant_inst(k, i, &out) {
                p.forward_inst(i)?;
                for &r in &k.inst(i).results {
                    out[r.index()] = p.env[r.index()].clone();
                }
            }
        }
        Ok(out)
    }

    fn instance(&self, i: Inst) -> Instance {
        (i, self.path.clone())
    }

    // ---- forward -------------------------------------------------------------------------

    /// Runs a block; returns the operands of its final `yield` (if any).
    fn forward_block(&mut self, b: Block) -> Result<Vec<V>, AdError> {
        let k = self.sh.kernel;
        for &i in &k.block(b).insts {
            let d = k.inst(i);
            if let Op::Yield = d.op {
                return Ok(d.args.iter().map(|&a| self.get(a).clone()).collect());
            }
            if d.results.first().is_some_and(|r| self.sh.invariant[r.index()].is_some()) {
                // Computed once for the launch.
                continue;
            }
            self.forward_inst(i)?;
            for v in &self.sh.drops[i.index()] {
                self.env[v.index()] = None;
            }
        }
        Ok(Vec::new())
    }

    fn set(&mut self, v: Value, x: V) {
        self.env[v.index()] = Some(x);
    }

    fn scalar(&self, v: Value) -> f64 {
        self.get(v).num().data[0]
    }

    /// A scalar that steers control flow: the same in every program of the batch, else the
    /// batch diverges (an error that [`Program::run`] turns into `None`).
    fn uniform_scalar(&mut self, v: Value) -> Result<f64, AdError> {
        let t = self.get(v).num();
        let x = t.data[0];
        if t.data.iter().all(|&y| y == x) {
            Ok(x)
        } else {
            self.divergent = true;
            Err(AdError::Spec("control flow diverges across the batch".into()))
        }
    }

    /// The program that lane `l` of a batch-`b` access of `numel` lanes per program belongs to,
    /// and its lane.
    fn lane_owner(&self, b: usize, numel: usize, l: usize) -> ([u32; 3], usize) {
        let p = if b == 1 || numel == 0 { 0 } else { l / numel };
        (self.pids[p.min(self.pids.len() - 1)], if numel == 0 { l } else { l % numel })
    }

    fn forward_inst(&mut self, i: Inst) -> Result<(), AdError> {
        let k = self.sh.kernel;
        let d = k.inst(i);
        match &d.op {
            Op::ProgramId { axis } => {
                let data: Vec<f64> = self.pids.iter().map(|p| p[*axis as usize] as f64).collect();
                self.set(d.results[0], V::Num(BTile::new(data.len(), &[], data)));
            }
            Op::NumPrograms { axis } => {
                let x = self.sh.grid[*axis as usize] as f64;
                self.set(d.results[0], V::Num(BTile::new(1, &[], vec![x])));
            }
            Op::AddPtr => {
                let (V::Ptr(slot, offs), V::Num(delta)) = (self.get(d.args[0]), self.get(d.args[1])) else {
                    unreachable!("verified addptr takes a pointer and integers")
                };
                let slot = *slot;
                // Offsets that die here (a tile of this program's own, of the result's shape and
                // batch) take the base in place instead of a new tile.
                let reusable = self.sh.drops[i.index()].contains(&d.args[1])
                    && d.args[0] != d.args[1]
                    && delta.shape == offs.shape
                    && delta.batch >= offs.batch
                    && self.env[d.args[1].index()].is_some();
                let r = if reusable {
                    let Some(V::Num(mut t)) = self.env[d.args[1].index()].take() else { unreachable!("checked above") };
                    let V::Ptr(_, offs) = self.get(d.args[0]) else { unreachable!("checked above") };
                    // A base of zeros shared by the batch (a tensor's own pointer, broadcast)
                    // adds nothing.
                    if offs.batch != 1 || offs.data.iter().any(|&x| x != 0.0) {
                        add_in_place(&mut t, offs);
                    }
                    t
                } else {
                    add_batched(offs, delta)
                };
                self.set(d.results[0], V::Ptr(slot, r));
            }
            Op::Broadcast | Op::ExpandDims { .. } | Op::Reshape | Op::Permute { .. } | Op::Where
                if d.args.iter().any(|&a| matches!(self.get(a), V::Ptr(..))) =>
            {
                // Pointer tiles: the layout op applies to the offsets.
                let slot = d.args.iter().find_map(|&a| if let V::Ptr(s, _) = self.get(a) { Some(*s) } else { None }).expect("a pointer");
                if let Op::Where = d.op {
                    if let (V::Ptr(a, _), V::Ptr(b, _)) = (self.get(d.args[1]), self.get(d.args[2])) {
                        if a != b {
                            return Err(self.unsupported(i, "`where` selects between pointers into different tensors".into()));
                        }
                    }
                }
                let r = self.compute(i, Precision::F64)?;
                self.set(d.results[0], V::Ptr(slot, r));
            }
            Op::Broadcast if self.sh.views[d.results[0].index()] => {
                // A view: the source's elements in a shape of the result's rank.
                let src = self.get(d.args[0]).num();
                let shape: Vec<usize> = if src.shape.is_empty() { vec![1; k.ty(d.results[0]).shape.len()] } else { src.shape.to_vec() };
                let r = BTile::new(src.batch, &shape, src.data.clone());
                self.set(d.results[0], V::Num(r));
            }
            Op::Load { mask, other } => {
                let r = self.load(i, *mask, *other)?;
                self.set(d.results[0], V::Num(r));
            }
            Op::Store { mask } | Op::AtomicAdd { mask } => {
                if !self.replay {
                    self.store(i, *mask, matches!(d.op, Op::AtomicAdd { .. }))?;
                }
            }
            Op::For { body, max_iters } => {
                let (lo, hi, st) = (
                    self.uniform_scalar(d.args[0])? as i64,
                    self.uniform_scalar(d.args[1])? as i64,
                    self.uniform_scalar(d.args[2])? as i64,
                );
                if st == 0 {
                    return Err(self.unsupported(i, "loop step is zero".into()));
                }
                let trips = trip_count(lo, hi, st);
                if let Some(m) = max_iters.filter(|&m| trips > m as u64) {
                    return Err(self.unsupported(i, format!("loop ran {trips} iterations, more than its max_iters = {m}")));
                }
                match self.out.trips.iter_mut().find(|(j, _)| *j == i) {
                    Some((_, t)) => *t = (*t).max(trips),
                    None => self.out.trips.push((i, trips)),
                }
                let mut carried: Vec<V> = d.args[3..].iter().map(|&a| self.get(a).clone()).collect();
                let key = self.instance(i);
                let values = self.body_values(*body);
                let mut rec = self.recorder(0, !self.replay, true);
                for t in 0..trips {
                    self.begin_trip(&mut rec, t, &carried);
                    carried = self.iterate(*body, lo, st, t, carried)?;
                    self.end_trip(&mut rec, &values);
                }
                self.keep_tape(key, rec);
                for (r, v) in d.results.iter().zip(carried) {
                    self.set(*r, v);
                }
            }
            Op::While { cond, body, max_iters } => self.forward_while(i, *cond, *body, *max_iters)?,
            Op::If { then_block, else_block } => {
                let c = self.uniform_scalar(d.args[0])? != 0.0;
                let outs = self.forward_block(if c { *then_block } else { *else_block })?;
                for (r, v) in d.results.iter().zip(outs) {
                    self.set(*r, v);
                }
            }
            Op::Yield => unreachable!("yield ends its block"),
            _ => {
                let r = self.compute(i, self.sh.precision)?;
                self.set(d.results[0], V::Num(r));
            }
        }
        Ok(())
    }

    /// The values defined in a loop body: its parameters, its instructions' results, and the
    /// values of its `if` branches (nested loops keep their own tapes).
    fn body_values(&mut self, b: Block) -> Vec<Value> {
        fn collect(k: &Kernel, b: Block, out: &mut Vec<Value>) {
            out.extend(k.block(b).params.iter().copied());
            for &i in &k.block(b).insts {
                let d = k.inst(i);
                out.extend(d.results.iter().copied());
                if let Op::If { then_block, else_block } = d.op {
                    collect(k, then_block, out);
                    collect(k, else_block, out);
                }
            }
        }
        let k = self.sh.kernel;
        self.body_values
            .entry(b)
            .or_insert_with(|| {
                let mut v = Vec::new();
                collect(k, b, &mut v);
                v
            })
            .clone()
    }

    /// Runs iteration `t` of a loop from `carried`, returning the next carried values.
    fn iterate(&mut self, body: Block, lo: i64, st: i64, t: u64, carried: Vec<V>) -> Result<Vec<V>, AdError> {
        let k = self.sh.kernel;
        let params = &k.block(body).params;
        let iv = lo + st * t as i64;
        let iv = if k.ty(params[0]).dtype() == Some(DType::I32) { iv as i32 as f64 } else { iv as f64 };
        self.env[params[0].index()] = Some(V::Num(BTile::new(1, &[], vec![iv])));
        for (p, v) in params[1..].iter().zip(carried) {
            self.env[p.index()] = Some(v);
        }
        self.path.push(t as u32);
        let r = self.forward_block(body);
        self.path.pop();
        r
    }

    /// A `while` loop: the condition (the same in every program of the batch, else the batch
    /// diverges), then the body while it holds, taping the carried values of each iteration
    /// as `for` loops do. Past `max_iters` (or, without one, a generous bound) it is an error.
    fn forward_while(&mut self, i: Inst, cond: Block, body: Block, max_iters: Option<u32>) -> Result<(), AdError> {
        const LIMIT: u64 = 10_000_000;
        let k = self.sh.kernel;
        let d = k.inst(i);
        let mut carried: Vec<V> = d.args.iter().map(|&a| self.get(a).clone()).collect();
        let key = self.instance(i);
        let values = self.body_values(body);
        let mut rec = self.recorder(0, !self.replay, true);
        let cparams = k.block(cond).params.clone();
        let mut t = 0u64;
        loop {
            for (p, v) in cparams.iter().zip(&carried) {
                self.env[p.index()] = Some(v.clone());
            }
            self.path.push(t as u32);
            let c = self.forward_block(cond);
            self.path.pop();
            let c = c?;
            let cv = &c.first().expect("the verifier checked the condition yields a value").num().data;
            if cv.iter().any(|&x| (x != 0.0) != (cv[0] != 0.0)) {
                self.divergent = true;
                return Err(AdError::Spec("control flow diverges across the batch".into()));
            }
            if cv[0] == 0.0 {
                break;
            }
            if t >= max_iters.map_or(LIMIT, u64::from) {
                return Err(self.unsupported(
                    i,
                    match max_iters {
                        Some(m) => format!("loop ran {} iterations, more than its max_iters = {m}", t + 1),
                        None => format!("`while` loop ran more than {LIMIT} iterations without ending"),
                    },
                ));
            }
            self.begin_trip(&mut rec, t, &carried);
            carried = self.iterate_while(body, t, carried)?;
            self.end_trip(&mut rec, &values);
            t += 1;
        }
        match self.out.trips.iter_mut().find(|(j, _)| *j == i) {
            Some((_, x)) => *x = (*x).max(t),
            None => self.out.trips.push((i, t)),
        }
        self.keep_tape(key, rec);
        for (r, v) in d.results.iter().zip(carried) {
            self.set(*r, v);
        }
        Ok(())
    }

    /// Runs body iteration `t` of a `while` loop from `carried`, returning the next carried values.
    fn iterate_while(&mut self, body: Block, t: u64, carried: Vec<V>) -> Result<Vec<V>, AdError> {
        let params = &self.sh.kernel.block(body).params;
        for (p, v) in params.iter().zip(carried) {
            self.env[p.index()] = Some(v);
        }
        self.path.push(t as u32);
        let r = self.forward_block(body);
        self.path.pop();
        r
    }

    fn unsupported(&self, i: Inst, message: String) -> AdError {
        let d = self.sh.kernel.inst(i);
        AdError::Unsupported { kernel: self.sh.kernel.name.clone(), op: d.op.mnemonic().into(), loc: d.loc.clone(), message }
    }

    /// A compute op through the rule table.
    fn compute(&self, i: Inst, precision: Precision) -> Result<BTile, AdError> {
        let k = self.sh.kernel;
        let d = k.inst(i);
        let args: SmallVec<[&BTile; 4]> = d.args.iter().map(|&a| self.get(a).num()).collect();
        let tys: SmallVec<[&Type; 4]> = d.args.iter().map(|&a| &self.sh.num_types[a.index()]).collect();
        let rt = &self.sh.num_types[d.results[0].index()];
        rules::eval(&d.op, &args, &tys, rt, precision).map_err(|e| rule_err(k, i, e))
    }

    // ---- reverse -------------------------------------------------------------------------

    fn add_cot(&mut self, v: Value, c: BTile) {
        // Inactive values (integers, and floats computed without any load) pass nothing on.
        if !self.sh.active[v.index()] {
            return;
        }
        match &mut self.cot[v.index()] {
            Some(x) if x.batch == c.batch => x.data.iter_mut().zip(&c.data).for_each(|(a, b)| *a += b),
            // A shared value's cotangent is the sum over the programs.
            Some(x) if x.batch == 1 => x.data.iter_mut().zip(&fit_batch(c, 1).data).for_each(|(a, b)| *a += b),
            Some(x) => {
                let mut c = c;
                c.data.iter_mut().zip(&fit_batch(std::mem::replace(x, BTile::zeros(1, &[])), 1).data).for_each(|(a, b)| *a += b);
                *x = c;
            }
            slot => *slot = Some(c),
        }
    }

    fn take_cot(&mut self, v: Value) -> Option<BTile> {
        self.cot[v.index()].take()
    }

    fn reverse_block(&mut self, b: Block) -> Result<(), AdError> {
        let k = self.sh.kernel;
        for &i in k.block(b).insts.iter().rev() {
            let d = k.inst(i);
            if let Op::Yield = d.op {
                continue;
            }
            self.reverse_inst(i)?;
        }
        Ok(())
    }

    fn reverse_inst(&mut self, i: Inst) -> Result<(), AdError> {
        let k = self.sh.kernel;
        let d = k.inst(i);
        match &d.op {
            Op::ProgramId { .. } | Op::NumPrograms { .. } | Op::AddPtr => {}
            Op::Load { mask, other } => self.reverse_load(i, *mask, *other)?,
            Op::Store { .. } | Op::AtomicAdd { .. } => {
                // An inactive value (stored constants, indices) passes nothing on.
                if !self.sh.active[d.args[1].index()] {
                    return Ok(());
                }
                let Some(&ev) = self.event_of.get(&self.instance(i)) else { return Ok(()) };
                let vt = k.ty(d.args[1]);
                let c = std::mem::take(&mut self.acc[ev]);
                let vb = self.get(d.args[1]).num().batch;
                self.add_cot(d.args[1], fit_batch(BTile::new(self.events[ev].batch, &vt.shape, c), vb));
            }
            Op::For { .. } | Op::While { .. } => self.reverse_loop(i)?,
            Op::Broadcast if self.sh.views[d.results[0].index()] => {
                // The view's cotangent is already summed over the broadcast dimensions.
                if let Some(c) = self.take_cot(d.results[0]) {
                    let shape = k.ty(d.args[0]).shape.clone();
                    self.add_cot(d.args[0], BTile { batch: c.batch, shape, data: c.data });
                }
            }
            Op::If { then_block, else_block } => {
                let c = self.scalar(d.args[0]) != 0.0;
                let blk = if c { *then_block } else { *else_block };
                let y = k.block(blk).insts.last().map(|&l| k.inst(l).args.clone()).unwrap_or_default();
                for (r, yv) in d.results.iter().zip(y) {
                    if let Some(c) = self.take_cot(*r) {
                        self.add_cot(yv, c);
                    }
                }
                self.reverse_block(blk)?;
            }
            Op::Yield => {}
            _ => {
                let Some(c) = self.take_cot(d.results[0]) else { return Ok(()) };
                let Some(c) = self.pass_through(i, c) else { return Ok(()) };
                let args: SmallVec<[&BTile; 4]> = d.args.iter().map(|&a| self.get(a).num()).collect();
                let tys: SmallVec<[&Type; 4]> = d.args.iter().map(|&a| &self.sh.num_types[a.index()]).collect();
                let res = self.get(d.results[0]).num();
                let rt = k.ty(d.results[0]);
                let grads = rules::vjp(&d.op, &args, &tys, res, rt, &c).map_err(|e| rule_err(k, i, e))?;
                drop((args, tys));
                for (&a, g) in d.args.iter().zip(grads) {
                    if let Some(g) = g {
                        self.add_cot(a, g);
                    }
                }
            }
        }
        Ok(())
    }

    /// The reverse of ops whose cotangent passes to an operand unchanged (`reshape`,
    /// `expand_dims`, float-to-float `cast`, `+`, and `-` up to sign), when operands and result
    /// hold the same programs and elements: the cotangent moves instead of being copied, with
    /// the values the rules would give. Returns the cotangent when the rules must handle it.
    fn pass_through(&mut self, i: Inst, c: BTile) -> Option<BTile> {
        let k = self.sh.kernel;
        let d = k.inst(i);
        let same = d.args.iter().all(|&a| {
            let t = self.get(a).num();
            t.batch == c.batch && t.data.len() == c.data.len()
        });
        let diff = |v: Value| rules::is_differentiable(k.ty(v));
        match &d.op {
            Op::Reshape | Op::ExpandDims { .. } | Op::Cast if same && diff(d.args[0]) && diff(d.results[0]) => {
                let shape = &k.ty(d.args[0]).shape;
                self.add_cot(d.args[0], BTile::new(c.batch, shape, c.data));
                None
            }
            Op::Binary(op @ (tilegrad_ir::BinaryOp::Add | tilegrad_ir::BinaryOp::Sub)) if same => {
                let (a, b) = (d.args[0], d.args[1]);
                let (act_a, act_b) = (self.sh.active[a.index()], self.sh.active[b.index()]);
                if act_b {
                    let gb = if *op == tilegrad_ir::BinaryOp::Sub {
                        BTile { batch: c.batch, shape: c.shape.clone(), data: c.data.iter().map(|&g| -g).collect() }
                    } else if act_a {
                        c.clone()
                    } else {
                        BTile { batch: c.batch, shape: c.shape.clone(), data: c.data.clone() }
                    };
                    self.add_cot(b, gb);
                }
                if act_a {
                    self.add_cot(a, c);
                }
                None
            }
            _ => Some(c),
        }
    }

    /// Reverse of a `for` or `while` loop: its trips last to first ([`tape`]); the cotangents
    /// of its results are those of the last trip's yields, and those of the first trip's carried
    /// values go to the loop's initial values (a `while` condition carries none: a boolean).
    fn reverse_loop(&mut self, i: Inst) -> Result<(), AdError> {
        let d = self.sh.kernel.inst(i);
        let key = self.instance(i);
        let Some(cp) = self.tapes.remove(&key) else { return Ok(()) };
        let snaps = self.snaps.remove(&key);
        let (trip, init) = match d.op {
            Op::For { body, .. } => {
                let (lo, st) = (self.scalar(d.args[0]) as i64, self.scalar(d.args[2]) as i64);
                (Trip::For { body, lo, st }, &d.args[3..])
            }
            Op::While { body, .. } => (Trip::While { body }, &d.args[..]),
            _ => unreachable!("only loops have tapes"),
        };
        let cot: Vec<Option<BTile>> = d.results.iter().map(|&r| self.take_cot(r)).collect();
        let cot = self.reverse_trips(trip, cp, snaps, cot)?;
        for (a, c) in init.iter().zip(cot) {
            if let Some(c) = c {
                self.add_cot(*a, c);
            }
        }
        Ok(())
    }
}

/// Value `v` of a program: its own, or the launch's program-invariant one.
fn lookup<'b>(env: &'b [Option<V>], invariant: &'b [Option<V>], v: Value) -> &'b V {
    env[v.index()].as_ref().or(invariant[v.index()].as_ref()).expect("verified kernels define values before use")
}

/// Whether top-level instruction `i` computes the same value in every program, given which
/// values are so far (`known`): a compute or pointer op (no program id, memory access or
/// control flow) whose operands are parameters or such values. Such values carry no gradient
/// (they depend on no load) and are computed once per launch instead of once per batch.
fn invariant_inst(k: &Kernel, i: Inst, known: &[Option<V>]) -> bool {
    let d = k.inst(i);
    let pure = match d.op {
        Op::Const { .. }
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
        | Op::NumPrograms { .. } => true,
        Op::ProgramId { .. }
        | Op::Load { .. }
        | Op::Store { .. }
        | Op::AtomicAdd { .. }
        | Op::AtomicRmw { .. }
        | Op::AtomicCas
        | Op::For { .. }
        | Op::While { .. }
        | Op::If { .. }
        | Op::Yield => false,
    };
    pure && d.args.iter().all(|a| known[a.index()].is_some() || k.params.iter().any(|p| p.value == *a))
}

/// Trip count of `range(lo, hi, step)`.
pub(crate) fn trip_count(lo: i64, hi: i64, step: i64) -> u64 {
    let (lo, hi, st) = (lo as i128, hi as i128, step as i128);
    let span = if st > 0 { hi - lo } else { lo - hi };
    if span <= 0 {
        0
    } else {
        ((span + st.abs() - 1) / st.abs()) as u64
    }
}
