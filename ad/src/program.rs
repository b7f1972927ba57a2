//! A batch of program instances, forward then reverse.
//!
//! The forward sweep evaluates the kernel body in f64 (through [`crate::rules`]) for a batch of
//! programs at once: a value holds one tile per program, or one tile shared by all where it is
//! the same in each (constants, `arange`, scalars, what only depends on them), which the rules
//! broadcast. Control flow must agree across the batch; where a loop bound or branch condition
//! differs between its programs, the batch reports divergence and is split by the caller. The
//! sweep records a tape: the carried values of every loop iteration, and a log of memory events
//! (stores and atomics with their active lanes and values; for loads that read this program's
//! own earlier stores, which store lane each lane read; such kernels run one program per batch).
//! Intermediate values of a loop body are kept only within a byte budget per program; beyond
//! it, the reverse sweep recomputes each iteration from its taped carried values, so the tape
//! holds at most `trips x carried` values per loop and program.
//!
//! The reverse sweep walks the body backwards applying one VJP rule per op. Memory follows the
//! launch semantics of the design: a store's value receives the launch-output cotangent of the
//! elements it is the last writer of, plus the cotangents of this program's later loads that
//! read it; a load's cotangent goes to the element it read (an input tensor, or this program's
//! earlier store); an atomic contribution receives the output cotangent of its element.

use crate::graph::KernelFacts;
use crate::rules::{self, Precision};
use crate::{AdError, BTile};
use smallvec::SmallVec;
use std::collections::HashMap;
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
}

/// A logged store or atomic of one program.
struct Event {
    slot: u32,
    atomic: bool,
    /// Active lanes: (lane, element).
    lanes: Vec<(u32, i64)>,
    /// Values of all lanes of the tile, when a later load of this program may read them.
    vals: Vec<f64>,
    /// Lanes of the whole batch.
    numel: usize,
    /// Programs the lanes belong to (`numel / batch` lanes each).
    batch: usize,
}

/// Where each lane of a load came from, when some lane read this program's own store.
type Provenance = Vec<Option<(u32, u32)>>;

/// The cotangents one load of a batch sends to the initial contents of an input tensor, as runs
/// of consecutive elements (tiles of rows are a few long runs: the accumulation adds slices).
pub(crate) struct Contrib {
    pub slot: u32,
    /// Smallest and largest element (inclusive): lets the accumulation skip what it does not own.
    pub lo: i64,
    pub hi: i64,
    /// (first element, length) of each run, in lane order.
    pub runs: Vec<(i64, u32)>,
    /// Cotangents, one per element of the runs in order.
    pub vals: Vec<f64>,
}

impl Contrib {
    fn new(slot: u32, n: usize) -> Contrib {
        Contrib { slot, lo: i64::MAX, hi: i64::MIN, runs: Vec::new(), vals: Vec::with_capacity(n) }
    }

    /// Appends element `e`'s cotangent.
    #[inline]
    fn push(&mut self, e: i64, v: f64) {
        match self.runs.last_mut() {
            Some((s, n)) if *s + *n as i64 == e => *n += 1,
            _ => self.runs.push((e, 1)),
        }
        self.lo = self.lo.min(e);
        self.hi = self.hi.max(e);
        self.vals.push(v);
    }

    /// Runs of `offs` (one value per element, in order), whose values are `vals`.
    fn dense(slot: u32, offs: &[f64], vals: Vec<f64>) -> Contrib {
        let mut c = Contrib { slot, lo: i64::MAX, hi: i64::MIN, runs: Vec::new(), vals };
        for &o in offs {
            let e = o as i64;
            match c.runs.last_mut() {
                Some((s, n)) if *s + *n as i64 == e => *n += 1,
                _ => c.runs.push((e, 1)),
            }
        }
        for &(s, n) in &c.runs {
            c.lo = c.lo.min(s);
            c.hi = c.hi.max(s + n as i64 - 1);
        }
        c
    }
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
    /// Set when control flow differs across the batch (the run then stops).
    divergent: bool,
    env: Vec<Option<V>>,
    cot: Vec<Option<BTile>>,
    /// Current iteration indices of the enclosing loops.
    path: Vec<u32>,
    /// Loop tapes: carried values at the start of each iteration, per dynamic loop instance.
    tapes: HashMap<Instance, Vec<Vec<V>>>,
    /// Loop snapshots: every value of each iteration's body, while within the tape budget (the
    /// reverse sweep then restores instead of recomputing).
    snaps: HashMap<Instance, Vec<Vec<(Value, V)>>>,
    /// Bytes held in snapshots.
    snap_bytes: usize,
    /// Values defined in each loop body (and its branches), by body block.
    body_values: HashMap<Block, Vec<Value>>,
    events: Vec<Event>,
    event_of: HashMap<Instance, usize>,
    loads: HashMap<Instance, Provenance>,
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
    pub fn new(sh: &'a Shared<'a>, pids: Vec<[u32; 3]>) -> Program<'a> {
        let n = sh.kernel.values.len();
        let mut env = vec![None; n];
        for (p, v) in sh.kernel.params.iter().zip(sh.params) {
            env[p.value.index()] = Some(v.clone());
        }
        Program {
            sh,
            pids,
            divergent: false,
            env,
            cot: vec![None; n],
            path: Vec::new(),
            tapes: HashMap::new(),
            snaps: HashMap::new(),
            snap_bytes: 0,
            body_values: HashMap::new(),
            events: Vec::new(),
            event_of: HashMap::new(),
            loads: HashMap::new(),
            overlay: HashMap::new(),
            acc: Vec::new(),
            replay: false,
            out: ProgramGrad { contrib: Vec::new(), stored: vec![Vec::new(); sh.slots.len()], trips: Vec::new() },
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
        self.env[v.index()].as_ref().expect("verified kernels define values before use")
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
            self.forward_inst(i)?;
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
                let r = V::Ptr(*slot, add_batched(offs, delta));
                self.set(d.results[0], r);
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
            Op::Load { mask, other } => {
                let r = self.load(i, *mask, *other)?;
                self.set(d.results[0], V::Num(r));
            }
            Op::Store { mask } | Op::AtomicAdd { mask } => {
                if !self.replay {
                    self.store(i, *mask, matches!(d.op, Op::AtomicAdd { .. }))?;
                }
            }
            Op::For { body, .. } => {
                let (lo, hi, st) = (
                    self.uniform_scalar(d.args[0])? as i64,
                    self.uniform_scalar(d.args[1])? as i64,
                    self.uniform_scalar(d.args[2])? as i64,
                );
                if st == 0 {
                    return Err(self.unsupported(i, "loop step is zero".into()));
                }
                let trips = trip_count(lo, hi, st);
                match self.out.trips.iter_mut().find(|(j, _)| *j == i) {
                    Some((_, t)) => *t = (*t).max(trips),
                    None => self.out.trips.push((i, trips)),
                }
                let mut carried: Vec<V> = d.args[3..].iter().map(|&a| self.get(a).clone()).collect();
                let key = self.instance(i);
                let mut tape = Vec::with_capacity(trips as usize);
                let values = self.body_values(*body);
                let mut snaps: Option<Vec<Vec<(Value, V)>>> = (!self.replay).then(|| Vec::with_capacity(trips as usize));
                for t in 0..trips {
                    tape.push(carried.clone());
                    carried = self.iterate(*body, lo, st, t, carried)?;
                    if let Some(sn) = &mut snaps {
                        // The body's values are out of scope after the iteration: move out those
                        // the reverse sweep reads, drop the others.
                        let needs = self.sh.needs;
                        let snap: Vec<(Value, V)> = values
                            .iter()
                            .filter_map(|&v| self.env[v.index()].take().filter(|_| needs[v.index()]).map(|x| (v, x)))
                            .collect();
                        let bytes: usize = snap.iter().map(|(_, x)| x.num().data.len() * 8).sum();
                        if self.snap_bytes + bytes <= self.sh.tape_budget * self.pids.len() {
                            self.snap_bytes += bytes;
                            sn.push(snap);
                        } else {
                            // Over budget: this loop is recomputed in reverse instead.
                            self.snap_bytes -= sn.iter().flatten().map(|(_, x)| x.num().data.len() * 8).sum::<usize>();
                            snaps = None;
                        }
                    }
                }
                if let Some(sn) = snaps {
                    self.snaps.insert(key.clone(), sn);
                }
                // Also while replaying an outer iteration: the reverse of this (inner) loop in that
                // iteration needs its tape.
                self.tapes.insert(key, tape);
                for (r, v) in d.results.iter().zip(carried) {
                    self.set(*r, v);
                }
            }
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

    fn load(&mut self, i: Inst, has_mask: bool, has_other: bool) -> Result<BTile, AdError> {
        let k = self.sh.kernel;
        let d = k.inst(i);
        let key = self.instance(i);
        // Borrow the operands in place (no copies of the tiles).
        let env = &self.env;
        let val = |v: Value| env[v.index()].as_ref().expect("verified kernels define values before use");
        let V::Ptr(slot, offs) = val(d.args[0]) else { unreachable!("verified load takes a pointer") };
        let slot = *slot;
        // Operands of batch 1 are shared by every program; the result has the largest batch.
        let br = [Some(offs), has_mask.then(|| val(d.args[1]).num()), has_other.then(|| val(d.args[2]).num())]
            .iter()
            .flatten()
            .map(|t| t.batch)
            .max()
            .unwrap_or(1);
        let offs_all = expand(offs, br);
        let mask_all = has_mask.then(|| expand(val(d.args[1]).num(), br));
        let other_all = has_other.then(|| expand(val(d.args[2]).num(), br));
        let (offs_data, mask, other) = (&*offs_all, mask_all.as_deref(), other_all.as_deref());
        let sd = &self.sh.slots[slot as usize];
        let n = offs_data.len();
        let numel = offs.numel();
        // Only a kernel that may load after its own stores consults the overlay (or, when
        // replaying a loop body, the provenance recorded by the forward sweep).
        let prov: Option<&Provenance> = if self.replay { self.loads.get(&key).filter(|p| !p.is_empty()) } else { None };
        let use_overlay = !self.replay && self.sh.facts.needs_overlay && !self.overlay.is_empty();
        let mut out = vec![0.0; n];
        let mut own: Provenance = Vec::new();
        let mut bad: Option<(usize, i64)> = None;
        let mut atomic_src = false;
        if prov.is_none() && !use_overlay {
            // Every lane reads the launch's initial memory: one tight loop per storage type.
            // A mask with every lane active is no mask.
            let m = mask.filter(|m| m.contains(&0.0));
            bad = match &sd.initial {
                Initial::F32(v) => gather_initial(v, offs_data, m, other, &mut out),
                Initial::F64(v) => gather_initial(v, offs_data, m, other, &mut out),
                Initial::Converted(v) => gather_initial(v, offs_data, m, other, &mut out),
            };
        }
        for l in 0..n {
            if prov.is_none() && !use_overlay {
                break;
            }
            if mask.is_some_and(|m| m[l] == 0.0) {
                out[l] = other.map_or(0.0, |o| o[if o.len() == 1 { 0 } else { l }]);
                continue;
            }
            let e = offs_data[l] as i64;
            if e < 0 || e as usize >= sd.initial.len() {
                bad = Some((l, e));
                break;
            }
            let src = if let Some(p) = prov {
                p[l]
            } else if use_overlay {
                self.overlay.get(&(slot, e)).copied()
            } else {
                None
            };
            match src {
                Some((ev, lane)) => {
                    let evd = &self.events[ev as usize];
                    atomic_src |= evd.atomic;
                    out[l] = evd.vals[lane as usize];
                    if own.is_empty() {
                        own = vec![None; n];
                    }
                    own[l] = Some((ev, lane));
                }
                None => {
                    out[l] = match &sd.initial {
                        Initial::F32(v) => v[e as usize] as f64,
                        Initial::F64(v) => v[e as usize],
                        Initial::Converted(v) => v[e as usize],
                    }
                }
            }
        }
        if let Some((l, e)) = bad {
            let (pid, l) = self.lane_owner(br, numel, l);
            let msg = format!("out-of-bounds load from `{}` at offset {e}, lane {l}, program {pid:?}", sd.name);
            return Err(self.unsupported(i, msg));
        }
        if atomic_src {
            return Err(self.unsupported(
                i,
                "a load of an element this program updated with atomic_add cannot be differentiated (its value depends on other programs)"
                    .into(),
            ));
        }
        let shape = offs.shape.clone();
        if !self.replay {
            // An empty provenance means "every lane read the launch's initial memory".
            self.loads.insert(key, own);
        }
        // Memory holds values of the tensor's dtype, so loads need no rounding in native mode.
        Ok(BTile::new(br, &shape, out))
    }

    fn store(&mut self, i: Inst, has_mask: bool, atomic: bool) -> Result<(), AdError> {
        let k = self.sh.kernel;
        let d = k.inst(i);
        let V::Ptr(slot, offs) = self.get(d.args[0]) else { unreachable!("verified store takes a pointer") };
        let slot = *slot;
        // Stored values are read back only by later loads of this program.
        let vals = if self.sh.facts.needs_overlay { self.get(d.args[1]).num().data.clone() } else { Vec::new() };
        // Every program of the batch stores its own lanes (operands of batch 1 are shared).
        let numel = offs.numel();
        let br = offs.batch.max(self.get(d.args[1]).num().batch).max(if has_mask { self.get(d.args[2]).num().batch } else { 1 });
        let offs_all = expand(offs, br);
        let mask_all = has_mask.then(|| expand(self.get(d.args[2]).num(), br));
        let mask = mask_all.as_deref();
        let sd = &self.sh.slots[slot as usize];
        let n = offs_all.len();
        let mut lanes = Vec::with_capacity(n);
        let len = sd.initial.len() as f64;
        let dense = mask.is_none_or(|m| !m.contains(&0.0)) && offs_all.iter().fold(true, |ok, &e| ok & (e >= 0.0) & (e < len));
        if dense {
            // Every lane active and in bounds: no per-lane branches.
            lanes.extend(offs_all.iter().enumerate().map(|(l, &e)| (l as u32, e as i64)));
        }
        for l in 0..n {
            if dense {
                break;
            }
            if mask.is_some_and(|m| m[l] == 0.0) {
                continue;
            }
            let e = offs_all[l] as i64;
            if e < 0 || e as usize >= sd.initial.len() {
                let (pid, l) = self.lane_owner(br, numel, l);
                return Err(self.unsupported(i, format!("out-of-bounds store to `{}` at offset {e}, lane {l}, program {pid:?}", sd.name)));
            }
            lanes.push((l as u32, e));
        }
        drop((offs_all, mask_all));
        let ev = self.events.len() as u32;
        if self.sh.facts.needs_overlay {
            for &(l, e) in &lanes {
                self.overlay.insert((slot, e), (ev, l));
            }
        }
        if !atomic && sd.tracks_stores() {
            self.out.stored[slot as usize].extend(lanes.iter().map(|&(_, e)| e));
        }
        let key = self.instance(i);
        self.event_of.insert(key, ev as usize);
        self.events.push(Event { slot, atomic, lanes, vals, numel: n, batch: br });
        Ok(())
    }

    // ---- reverse -------------------------------------------------------------------------

    /// Initial cotangents of every event's values: a store lane that is its element's last
    /// writer in this program receives the launch-output cotangent of that element; every
    /// atomic contribution does.
    fn seed_store_cotangents(&mut self) {
        self.acc = self.events.iter().map(|e| vec![0.0; e.numel]).collect();
        let live = self.live_lanes();
        for ((ev, e), acc) in self.events.iter().enumerate().zip(self.acc.iter_mut()) {
            let Some(oc) = &self.sh.slots[e.slot as usize].out_cot else { continue };
            match (&live, e.atomic) {
                (Some(m), false) => {
                    for &(l, el) in &e.lanes {
                        if m.get(&(e.slot, el)) == Some(&(ev as u32, l)) {
                            acc[l as usize] += oc[el as usize];
                        }
                    }
                }
                // Every lane receives its element's cotangent.
                _ => e.lanes.iter().for_each(|&(l, el)| acc[l as usize] += oc[el as usize]),
            }
        }
    }

    /// The last writer (event, lane) of every element this program stores, or `None` when every
    /// stored lane is its element's last writer (no two stores of this program overlap, which
    /// is checked on sorted runs of elements rather than element by element).
    fn live_lanes(&self) -> Option<HashMap<(u32, i64), (u32, u32)>> {
        if self.sh.facts.needs_overlay {
            return Some(self.overlay.clone());
        }
        // One store per tensor cannot overlap itself where races are errors (two lanes of one
        // store writing one element is a race, rejected by the reference run).
        let mut stores: Vec<u32> = self.events.iter().filter(|e| !e.atomic).map(|e| e.slot).collect();
        stores.sort_unstable();
        if self.sh.races_rejected && stores.windows(2).all(|w| w[0] != w[1]) {
            return None;
        }
        let mut runs: Vec<(u32, i64, i64)> = Vec::new();
        for e in self.events.iter().filter(|e| !e.atomic) {
            for &(_, el) in &e.lanes {
                match runs.last_mut() {
                    Some((s, _, end)) if *s == e.slot && *end == el => *end += 1,
                    _ => runs.push((e.slot, el, el + 1)),
                }
            }
        }
        runs.sort_unstable();
        let overlap = runs.windows(2).any(|w| w[0].0 == w[1].0 && w[1].1 < w[0].2);
        if !overlap {
            return None;
        }
        let mut last = HashMap::new();
        for (ev, e) in self.events.iter().enumerate().filter(|(_, e)| !e.atomic) {
            for &(l, el) in &e.lanes {
                last.insert((e.slot, el), (ev as u32, l));
            }
        }
        Some(last)
    }

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
            Op::Load { mask, other } => {
                let Some(c) = self.take_cot(d.results[0]) else { return Ok(()) };
                let key = self.instance(i);
                let env = &self.env;
                let val = |v: Value| env[v.index()].as_ref().expect("verified kernels define values before use");
                let V::Ptr(slot, offs) = val(d.args[0]) else { unreachable!("verified load takes a pointer") };
                let slot = *slot as usize;
                // The cotangent has the load's batch: bring the offsets and mask to it.
                let offs_all = expand(offs, c.batch);
                let mask_all = mask.then(|| expand(val(d.args[1]).num(), c.batch));
                // A mask with every lane active is no mask.
                let m = mask_all.as_deref().filter(|m| m.contains(&0.0));
                let offs_data: &[f64] = &offs_all;
                let prov = self.loads.get(&key).filter(|p| !p.is_empty());
                let is_input = self.sh.slots[slot].is_input;
                let other_active = *other && self.sh.active[d.args[2].index()];
                let other_batch = if other_active { val(d.args[2]).num().batch } else { 1 };
                let mut other_cot = other_active.then(|| vec![0.0; offs_data.len()]);
                let (n, cb) = (offs_data.len(), c.batch);
                let mut contrib = Contrib::new(slot as u32, n);
                if prov.is_none() {
                    // Every lane read the launch's initial memory: tight loops.
                    if let (Some(m), Some(oc)) = (m, &mut other_cot) {
                        oc.iter_mut().zip(m.iter().zip(&c.data)).for_each(|(o, (&m, &g))| *o = if m == 0.0 { g } else { 0.0 });
                    }
                    if is_input {
                        match m {
                            None => contrib = Contrib::dense(slot as u32, offs_data, c.data),
                            Some(m) => {
                                for ((&o, &m), &g) in offs_data.iter().zip(m).zip(&c.data) {
                                    if m != 0.0 {
                                        contrib.push(o as i64, g);
                                    }
                                }
                            }
                        }
                    }
                } else {
                    for l in 0..n {
                        if m.is_some_and(|m| m[l] == 0.0) {
                            if let Some(oc) = &mut other_cot {
                                oc[l] = c.data[l];
                            }
                            continue;
                        }
                        match prov.and_then(|p| p[l]) {
                            Some((ev, lane)) => self.acc[ev as usize][lane as usize] += c.data[l],
                            None => {
                                if is_input {
                                    contrib.push(offs_data[l] as i64, c.data[l]);
                                }
                            }
                        }
                    }
                }
                if !contrib.vals.is_empty() {
                    self.out.contrib.push(contrib);
                }
                drop((offs_all, mask_all));
                if let Some(oc) = other_cot {
                    let ot = k.ty(d.args[2]);
                    self.add_cot(d.args[2], fit_batch(BTile::new(cb, &ot.shape, oc), other_batch));
                }
            }
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
            Op::For { body, .. } => self.reverse_loop(i, *body)?,
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

    /// Reverse of a loop: iterations last to first, each recomputed from its taped carried
    /// values, then swept backwards.
    fn reverse_loop(&mut self, i: Inst, body: Block) -> Result<(), AdError> {
        let k = self.sh.kernel;
        let d = k.inst(i);
        let key = self.instance(i);
        let Some(tape) = self.tapes.remove(&key) else { return Ok(()) };
        let (lo, st) = (self.scalar(d.args[0]) as i64, self.scalar(d.args[2]) as i64);
        let params = k.block(body).params.clone();
        let yields = k.block(body).insts.last().map(|&l| k.inst(l).args.clone()).unwrap_or_default();
        // Cotangents of the loop results are those of the last iteration's yields.
        let mut carried_cot: Vec<Option<BTile>> = d.results.iter().map(|&r| self.take_cot(r)).collect();
        let mut snaps = self.snaps.remove(&key);
        for t in (0..tape.len()).rev() {
            match snaps.as_mut().and_then(|s| s.pop()) {
                // Restore the body's values of iteration t.
                Some(snap) => {
                    for (v, x) in snap {
                        self.env[v.index()] = Some(x);
                    }
                }
                // Recompute them from the iteration's carried values.
                None => {
                    let saved = self.replay;
                    self.replay = true;
                    self.iterate(body, lo, st, t as u64, tape[t].clone())?;
                    self.replay = saved;
                }
            }
            for (y, c) in yields.iter().zip(carried_cot.drain(..)) {
                if let Some(c) = c {
                    self.add_cot(*y, c);
                }
            }
            self.path.push(t as u32);
            let r = self.reverse_block(body);
            self.path.pop();
            r?;
            carried_cot = params[1..].iter().map(|&p| self.take_cot(p)).collect();
            // Values of the body are dead once swept; cotangents of body values are consumed.
        }
        for (a, c) in d.args[3..].iter().zip(carried_cot) {
            if let Some(c) = c {
                self.add_cot(*a, c);
            }
        }
        Ok(())
    }
}

/// `t`'s data for a batch of `b` programs: as is, or repeated when `t` is shared (batch 1).
fn expand(t: &BTile, b: usize) -> std::borrow::Cow<'_, [f64]> {
    if t.batch == b {
        std::borrow::Cow::Borrowed(&t.data)
    } else {
        std::borrow::Cow::Owned(t.data.repeat(b))
    }
}

/// `a + b` elementwise (pointer offsets plus integers), either operand shared across the batch.
fn add_batched(a: &BTile, b: &BTile) -> BTile {
    let batch = a.batch.max(b.batch);
    let data = if a.batch == b.batch {
        a.data.iter().zip(&b.data).map(|(x, y)| x + y).collect()
    } else {
        expand(a, batch).iter().zip(expand(b, batch).iter()).map(|(x, y)| x + y).collect()
    };
    BTile::new(batch, &a.shape, data)
}

/// A cotangent computed for every program, brought to a value of batch `b`: summed over the
/// programs when the value is shared by all of them.
fn fit_batch(t: BTile, b: usize) -> BTile {
    if t.batch == b || b != 1 {
        return t;
    }
    let n = t.numel();
    let mut data = vec![0.0; n];
    for p in 0..t.batch {
        data.iter_mut().zip(t.row(p)).for_each(|(d, &x)| *d += x);
    }
    BTile::new(1, &t.shape, data)
}

/// Reads `src[offs[l]]` into `out[l]` for every active lane (`other`, or 0, for masked-off
/// lanes); returns the first active lane out of bounds (lane, offset), if any.
fn gather_initial<T: Copy + Into<f64>>(
    src: &[T],
    offs: &[f64],
    mask: Option<&[f64]>,
    other: Option<&[f64]>,
    out: &mut [f64],
) -> Option<(usize, i64)> {
    let other_at = |l: usize| other.map_or(0.0, |o| if o.len() == 1 { o[0] } else { o[l] });
    if mask.is_none() {
        // Bounds first (one pass), then the gather without per-lane branches.
        let n = src.len() as f64;
        if offs.iter().fold(true, |ok, &e| ok & (e >= 0.0) & (e < n)) {
            out.iter_mut().zip(offs).for_each(|(o, &e)| *o = src[e as usize].into());
            return None;
        }
    }
    for (l, (o, &e)) in out.iter_mut().zip(offs).enumerate() {
        if mask.is_some_and(|m| m[l] == 0.0) {
            *o = other_at(l);
            continue;
        }
        match src.get(e as usize) {
            // A negative offset converts to 0 (`as` saturates): check the sign as well.
            Some(&v) if e >= 0.0 => *o = v.into(),
            _ => return Some((l, e as i64)),
        }
    }
    None
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
