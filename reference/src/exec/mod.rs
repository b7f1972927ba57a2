//! Execution of a launch. Programs run in parallel in chunks and log their writes. The fast path
//! writes stores straight to the outputs, then proves from the access sets that no two programs
//! wrote one element and no program read what another wrote (store runs as sorted intervals, or
//! a per-element owner table when runs are many); atomics are then added in program order. Any
//! conflict sends the launch to the exact path, which commits every program's writes in program
//! order with per-element owner tables and reports the first race in program order (or, in warn
//! mode, lists them). Either way the results do not depend on the thread count.

mod alloc;
mod donate;
mod fast;
mod fastmath;
mod offs;
mod ops;
mod plan;
mod program;
mod record;
mod scratch;
mod tile;

pub use alloc::{tune as tune_allocator, working_threads};
pub use fast::release_buffers;
pub use fastmath::C as EXP2_POLY;
pub use ops::{dot_f32, round_tf32, sum_in_order, SUM_LANES};
pub use plan::needs_order;
pub use program::{endless_message as endless_while_message, long_for_message, WHILE_LIMIT};
pub use record::{NonFinite, ProgramRecord, Recorded};

use crate::error::{ExecError, Race, RaceKind, Site};
use crate::launch::{Bound, Launch, LaunchSummary, Memory, RaceMode, TensorId};
use crate::tensor::{Data, HostTensor};
use program::{lit_data, Program, ProgramOut, Shared, Slot};
use rayon::prelude::*;
use std::collections::HashMap;
use tile::{PtrTile, Tile, RV};
use tilegrad_ir::{DType, Inst, Kernel};

const NONE: u32 = u32::MAX;
const MANY: u32 = u32::MAX - 1;

/// Per written tensor: final contents and who wrote each element.
struct Commit {
    data: Data,
    /// Linear program id of the program that stored each element (NONE if none).
    owner: Vec<u32>,
    /// Instruction of that store.
    owner_inst: Vec<u32>,
    /// Linear program id of the programs that atomically updated each element (MANY if several),
    /// and the instruction; empty until the first atomic update (see [`Commit::atomic`]).
    atomic_owner: Vec<u32>,
    atomic_inst: Vec<u32>,
    /// The locks held by every store (atomic update) of each element so far, as interned lock
    /// sets; empty until some access holds a lock.
    owner_locks: Vec<u32>,
    atomic_locks: Vec<u32>,
    /// Elements some store of the launch set to bits other than their initial ones: a load of
    /// an element no store changed reads the same whatever the order of programs.
    changed: Vec<bool>,
    /// Stores that met another program's store of the same bits. They are order-independent if
    /// the element ends with those bits (see [`Committer::settle_same_bits`]).
    same_bits: Vec<SameBits>,
}

impl Commit {
    /// The atomic updater of element `o` and its instruction (`NONE` before any).
    fn atomic(&self, o: usize) -> (u32, u32) {
        if self.atomic_owner.is_empty() {
            (NONE, NONE)
        } else {
            (self.atomic_owner[o], self.atomic_inst[o])
        }
    }
}

/// Runs a launch and commits the final contents of its written tensors to `mem`.
/// Outputs that nothing else needs are written in place (see [`donate`]).
pub(crate) fn execute(l: &Launch, bound: &[Bound], mem: &mut Memory) -> Result<LaunchSummary, ExecError> {
    let plan = plan::Plan::new(l.kernel);
    let mut donated = donate::take(l, bound, mem, &plan);
    let (summary, slot_ids, finals) = match evaluate(l, bound, mem, &plan, &mut donated) {
        Ok(Some(r)) => r,
        other => {
            donate::restore(mem, donated);
            match other? {
                Some(r) => r,
                None => evaluate(l, bound, mem, &plan, &mut Vec::new())?.expect("nothing donated"),
            }
        }
    };
    for (s, d) in finals.into_iter().enumerate() {
        if let Some(d) = d {
            let t = mem.get(slot_ids[s]);
            let nt = HostTensor::new(t.dtype(), t.shape(), d)?;
            let old = mem.set(slot_ids[s], nt);
            if let Some(d) = old.try_into_data() {
                fast::recycle(d);
            }
        }
    }
    Ok(summary)
}

/// Runs a launch with every check of [`execute`] and discards the final contents (recycling
/// their buffers): `mem` is only read.
pub(crate) fn check(l: &Launch, bound: &[Bound], mem: &Memory) -> Result<LaunchSummary, ExecError> {
    let plan = plan::Plan::new(l.kernel);
    let (summary, _, finals) = evaluate(l, bound, mem, &plan, &mut Vec::new())?.expect("nothing donated");
    for d in finals.into_iter().flatten() {
        fast::recycle(d);
    }
    Ok(summary)
}

/// Runs a launch: its summary, its slots' tensors and the final contents of the written ones;
/// `None` when the fast path failed on buffers `donated` to it (they hold partial writes: the
/// caller puts the tensors back and runs it again with none).
fn evaluate(
    l: &Launch,
    bound: &[Bound],
    mem: &Memory,
    plan: &plan::Plan,
    donated: &mut [donate::Donated],
) -> Result<Option<Evaluated>, ExecError> {
    alloc::tune();
    let (shared, slot_ids) = build_shared(l, bound, mem, plan);
    let ordered = plan.ordered;
    let fast = if !ordered && !l.options.exact && l.options.races == RaceMode::Error {
        let mut own: Vec<Option<Data>> =
            slot_ids.iter().map(|t| donated.iter_mut().find(|d| d.tensor == *t).and_then(|d| d.data.take())).collect();
        let r = run_fast(l, &shared, &mut own)?;
        if r.is_none() && !donated.is_empty() {
            return Ok(None);
        }
        r
    } else {
        None
    };
    let (mut summary, finals) = match fast {
        Some(r) => r,
        None if ordered => run_ordered(l, &shared)?,
        None => run_exact(l, &shared)?,
    };
    for w in &mut summary.writers {
        w.tensor = slot_ids[w.tensor.0 as usize];
    }
    drop(shared);
    Ok(Some((summary, slot_ids, finals)))
}

type Finals = Vec<Option<Data>>;
type Evaluated = (LaunchSummary, Vec<TensorId>, Finals);

/// What every program of launch `l` shares, and the tensor of each slot.
fn build_shared<'a>(l: &Launch<'a>, bound: &[Bound], mem: &'a Memory, plan: &'a plan::Plan) -> (Shared<'a>, Vec<TensorId>) {
    let k = l.kernel;
    // Slots: distinct tensors bound to pointer parameters (aliasing parameters share a slot).
    let mut slot_ids: Vec<TensorId> = Vec::new();
    let mut param_slot: Vec<Option<u32>> = Vec::new();
    for b in bound {
        param_slot.push(match b {
            Bound::Tensor(t) => Some(match slot_ids.iter().position(|s| s == t) {
                Some(p) => p as u32,
                None => {
                    slot_ids.push(*t);
                    slot_ids.len() as u32 - 1
                }
            }),
            Bound::Scalar(..) => None,
        });
    }
    let mut slot_written = vec![false; slot_ids.len()];
    // A slot is scratch when every parameter bound to it is.
    let mut slot_scratch = vec![true; slot_ids.len()];
    for (j, s) in param_slot.iter().enumerate() {
        if let Some(s) = s {
            slot_written[*s as usize] |= plan.param_written[j];
            slot_scratch[*s as usize] &= l.options.scratch.iter().any(|n| *n == k.params[j].name);
        }
    }
    let params: Vec<RV> = bound
        .iter()
        .zip(&param_slot)
        .map(|(b, s)| match b {
            Bound::Tensor(_) => {
                RV::Ptr(PtrTile { slot: s.expect("tensor params have slots"), offs: Tile::scalar(DType::I64, Data::I64(vec![0])) })
            }
            Bound::Scalar(lit, dt) => RV::Num(Tile::scalar(*dt, lit_data(*lit, *dt))),
        })
        .collect();
    let shared = Shared {
        kernel: k,
        plan,
        slots: slot_ids
            .iter()
            .zip(slot_written.iter().zip(&slot_scratch))
            .map(|(t, (&w, &scratch))| {
                let ten = mem.get(*t);
                // Writes to a scratch tensor stay in the program that made them (not committed,
                // not checked for races): as far as the launch is concerned it is not written.
                let written = w && !scratch;
                Slot { name: mem.name(*t).to_string(), dtype: ten.dtype(), shape: ten.shape(), initial: ten.data(), written, scratch }
            })
            .collect(),
        params,
        grid: l.grid.0,
        poison: poisoned_loads(k, l.options.poison_masked_loads),
    };
    (shared, slot_ids)
}

/// The loads `mask` poisons.
fn poisoned_loads(k: &Kernel, mask: u64) -> Vec<tilegrad_ir::Inst> {
    if mask == 0 {
        return Vec::new();
    }
    let all = tilegrad_ir::analysis::unfilled_loads(k);
    all.into_iter().enumerate().filter(|(i, _)| tilegrad_ir::analysis::poisoned(mask, *i)).map(|(_, l)| l).collect()
}

/// Runs program `pid` of a launch alone, recording the value of every op it runs (see
/// [`ProgramRecord`]); `target` (a store instruction, a tensor and an element) freezes the values
/// at the last execution of that store that wrote that element. Its writes are discarded.
pub(crate) fn record(
    l: &Launch,
    bound: &[Bound],
    mem: &Memory,
    pid: [u32; 3],
    target: Option<(Inst, TensorId, i64)>,
) -> Result<ProgramRecord, ExecError> {
    let plan = plan::Plan::new(l.kernel);
    let (shared, slot_ids) = build_shared(l, bound, mem, &plan);
    let rec = record::Recorder {
        values: vec![None; l.kernel.values.len()],
        target: target.and_then(|(i, t, e)| slot_ids.iter().position(|&s| s == t).map(|s| (i, s as u32, e))),
        slot_tensor: slot_ids.clone(),
        ..Default::default()
    };
    Ok(Program::new(&shared, pid).run_recorded(rec)?.finish())
}

/// Runs every program in chunks of the grid, in parallel, handing each program's outcome to
/// `sink` in program order; the first error in program order stops the launch.
fn run_programs(
    l: &Launch,
    shared: &Shared,
    fast: Option<&[Option<fast::FastBuf>]>,
    mut sink: impl FnMut(u32, ProgramOut) -> Result<(), ExecError>,
) -> Result<LaunchSummary, ExecError> {
    let range = l.program_range();
    let mut summary = LaunchSummary { programs: range.end - range.start, ..Default::default() };
    let total = range.end;
    let chunk = l.options.chunk_programs.max(1) as u64;
    let mut start = range.start;
    while start < total {
        let end = (start + chunk).min(total);
        // At most a few pieces a working thread, so that no more programs run at once than
        // there are cores to run them (see `working_threads`), whatever rayon's thread count.
        let min_len = ((end - start) as usize).div_ceil(8 * working_threads());
        let outs: Vec<Result<ProgramOut, ExecError>> = (0..(end - start) as usize)
            .into_par_iter()
            .with_min_len(min_len)
            .map(|i| Program::new(shared, l.grid.pid(start + i as u64)).run(fast))
            .collect();
        for (off, out) in outs.into_iter().enumerate() {
            let out = out?;
            summary.elements_loaded += out.loaded;
            summary.elements_stored += out.stored;
            summary.elements_atomic += out.atomic;
            for (inst, t) in &out.trips {
                let e = summary.max_trips.entry(*inst).or_insert(0);
                *e = (*e).max(*t);
            }
            sink((start + off as u64) as u32, out)?;
        }
        start = end;
    }
    Ok(summary)
}

/// The fast path: stores go straight to the outputs; ownership is checked afterwards, in
/// parallel over element ranges. Returns `None` when anything conflicts (a race, or a program
/// mixing stores and atomics on one tensor): the exact path then decides, deterministically.
/// `own[s]`: slot `s`'s storage, given to be written in place.
fn run_fast(l: &Launch, shared: &Shared, own: &mut [Option<Data>]) -> Result<Option<(LaunchSummary, Finals)>, ExecError> {
    let (bufs, stale): (Vec<Option<fast::FastBuf>>, Vec<bool>) = shared
        .slots
        .iter()
        .zip(own.iter_mut())
        .map(|(s, own)| match (s.written, own.take()) {
            (true, Some(d)) => (Some(fast::FastBuf::from_owned(d)), false),
            (true, None) => {
                let (b, stale) = fast::FastBuf::for_output(s.initial);
                (Some(b), stale)
            }
            (false, _) => (None, false),
        })
        .unzip();
    let mut outs: Vec<FlatLog> = shared.slots.iter().map(|_| FlatLog::default()).collect();
    let mut mixed = false;
    let mut summary = run_programs(l, shared, Some(&bufs), |p, out| {
        mixed |= out.mixed;
        for (f, log) in outs.iter_mut().zip(out.logs) {
            f.add(p + 1, log);
        }
        Ok(())
    })?;
    if mixed {
        return Ok(None);
    }
    let threads = rayon::current_num_threads().max(1);
    let mut finals: Finals = Vec::new();
    for (s, (slot, buf)) in shared.slots.iter().zip(bufs).enumerate() {
        let Some(buf) = buf else {
            finals.push(None);
            continue;
        };
        let n = slot.initial.len();
        let Some(owner) = Owners::build(&outs[s], n, threads) else { return Ok(None) };
        if stale[s] {
            // A reused buffer: elements no program stored take their initial values (before the
            // atomics add onto them).
            owner.for_each_unstored(n, |a, b| buf.fill_range(slot.initial, a, b));
        }
        // Atomics, in program order.
        let mut atomic_owner: Vec<u32> = Vec::new();
        let mut atomic_inst: Vec<u32> = Vec::new();
        for (me, events) in &outs[s].events {
            let me = *me;
            for e in events {
                if atomic_owner.is_empty() {
                    atomic_owner = vec![0u32; n];
                    if l.options.record_writers {
                        atomic_inst = vec![NONE; n];
                    }
                }
                for (lane, o) in e.lanes() {
                    if owner.other_than(o, o + 1, me) {
                        return Ok(None);
                    }
                    let o = o as usize;
                    atomic_owner[o] = if atomic_owner[o] == 0 || atomic_owner[o] == me { me } else { MANY };
                    if let Some(i) = atomic_inst.get_mut(o) {
                        *i = e.inst.0;
                    }
                    buf.add(o, &e.vals, lane, slot.dtype);
                }
            }
        }
        // Loads of elements another program writes.
        let racy_read = outs[s].reads.par_iter().any(|&(me, st, len)| {
            owner.other_than(st, st + len as i64, me)
                || (!atomic_owner.is_empty() && atomic_owner[st as usize..st as usize + len as usize].iter().any(|&a| a != 0 && a != me))
        });
        if racy_read {
            return Ok(None);
        }
        if l.options.record_writers {
            summary.writers.push(fast_writers(s, &outs[s], n, &atomic_owner, &atomic_inst));
        }
        finals.push(Some(buf.into_data()));
    }
    Ok(Some((summary, finals)))
}

/// Who wrote each element of slot `s`, straight from the store runs where no two of them
/// overlap and no atomic updated it (no table of elements).
fn store_run_writers(s: usize, log: &FlatLog, n: usize) -> Option<crate::launch::Writers> {
    let mut iv: Vec<(i64, u32, u32, u32)> =
        log.stores.iter().zip(&log.store_insts).map(|(&(me, st, len), &inst)| (st, len, me - 1, inst)).collect();
    iv.sort_unstable_by_key(|r| r.0);
    let mut runs = Vec::with_capacity(2 * iv.len() + 1);
    let mut at = 0i64;
    for (st, len, p, inst) in iv {
        if st < at {
            return None;
        }
        if st > at {
            runs.push((at as usize, NONE, NONE));
        }
        runs.push((st as usize, p, inst));
        at = st + len as i64;
    }
    if (at as usize) < n {
        runs.push((at as usize, NONE, NONE));
    }
    Some(crate::launch::Writers::from_runs(TensorId(s as u32), n, runs))
}

/// Who wrote each element of slot `s` in a launch the fast path ran: the last store of its
/// program (programs never store to one element there), else the program that updated it
/// atomically ([`MANY`] for several), as the exact path records them.
fn fast_writers(s: usize, log: &FlatLog, n: usize, atomic_owner: &[u32], atomic_inst: &[u32]) -> crate::launch::Writers {
    if let Some(w) = Some(()).filter(|_| atomic_owner.is_empty()).and_then(|_| store_run_writers(s, log, n)) {
        return w;
    }
    let mut each = vec![(NONE, NONE); n];
    for (&(me, st, len), &inst) in log.stores.iter().zip(&log.store_insts) {
        for w in &mut each[st as usize..st as usize + len as usize] {
            *w = (me - 1, inst);
        }
    }
    for (o, w) in each.iter_mut().enumerate().filter(|(o, w)| w.0 == NONE && atomic_owner.get(*o).is_some_and(|&a| a != 0)) {
        let a = atomic_owner[o];
        *w = (if a == MANY { MANY } else { a - 1 }, atomic_inst.get(o).copied().unwrap_or(NONE));
    }
    crate::launch::Writers::from_elements(TensorId(s as u32), each)
}

/// What the fast path keeps of every program's log of one tensor until the launch's races are
/// checked, flat (a few bytes per run, not a log per program): store runs and load runs with
/// their program (+1), and the atomic events of the programs that made any, in program order.
#[derive(Default)]
struct FlatLog {
    stores: Vec<(u32, i64, u32)>,
    /// The store instruction of each of `stores`.
    store_insts: Vec<u32>,
    reads: Vec<(u32, i64, u32)>,
    events: Vec<(u32, Vec<program::Event>)>,
}

impl FlatLog {
    fn add(&mut self, me: u32, log: program::SlotLog) {
        for (inst, runs) in &log.store_runs {
            self.stores.extend(runs.iter().map(|&(st, len)| (me, st, len)));
            self.store_insts.extend(runs.iter().map(|_| inst.0));
        }
        for r in &log.reads {
            self.reads.extend(r.runs.iter().map(|&(st, len)| (me, st, len)));
        }
        if !log.events.is_empty() {
            self.events.push((me, log.events));
        }
    }
}

/// Which program stores each element of a tensor, found from every program's store runs: as
/// sorted disjoint intervals when runs are few (rows of tiles), else as a per-element table
/// filled in parallel over element ranges. Program ids are stored +1 (0: nobody).
enum Owners {
    Intervals(Vec<(i64, i64, u32)>),
    Table(Vec<u32>),
}

impl Owners {
    /// `None` when two programs store to one element.
    fn build(log: &FlatLog, n: usize, threads: usize) -> Option<Owners> {
        let runs = log.stores.len();
        if runs.saturating_mul(32) <= n {
            let mut iv: Vec<(i64, i64, u32)> = log.stores.iter().map(|&(me, st, len)| (st, st + len as i64, me)).collect();
            iv.sort_unstable();
            // Sweep: a run that starts inside the furthest-reaching earlier run of another
            // program overlaps some run of another program. Same-program overlaps merge.
            let mut merged: Vec<(i64, i64, u32)> = Vec::with_capacity(iv.len());
            for (st, en, p) in iv {
                match merged.last_mut() {
                    Some(last) if st < last.1 => {
                        if last.2 != p {
                            return None;
                        }
                        last.1 = last.1.max(en);
                    }
                    _ => merged.push((st, en, p)),
                }
            }
            return Some(Owners::Intervals(merged));
        }
        let mut owner = vec![0u32; n];
        let per = n.div_ceil(threads).max(1);
        let conflict = owner.par_chunks_mut(per).enumerate().any(|(c, part)| {
            let lo = (c * per) as i64;
            let hi = lo + part.len() as i64;
            for &(me, st, len) in &log.stores {
                let (a, b) = (st.max(lo), (st + len as i64).min(hi));
                if a >= b {
                    continue;
                }
                let mut bad = false;
                for w in &mut part[(a - lo) as usize..(b - lo) as usize] {
                    bad |= *w != 0 && *w != me;
                    *w = me;
                }
                if bad {
                    return true;
                }
            }
            false
        });
        (!conflict).then_some(Owners::Table(owner))
    }

    /// Calls `f(a, b)` for every maximal range `[a, b)` of elements that no program stores.
    fn for_each_unstored(&self, n: usize, mut f: impl FnMut(usize, usize)) {
        match self {
            Owners::Intervals(iv) => {
                let mut at = 0usize;
                for &(st, en, _) in iv {
                    if st as usize > at {
                        f(at, st as usize);
                    }
                    at = at.max(en as usize);
                }
                if at < n {
                    f(at, n);
                }
            }
            Owners::Table(t) => {
                let mut i = 0;
                while i < n {
                    if t[i] != 0 {
                        i += 1;
                        continue;
                    }
                    let start = i;
                    while i < n && t[i] == 0 {
                        i += 1;
                    }
                    f(start, i);
                }
            }
        }
    }

    /// True when a program other than `me` stores some element of `[a, b)`.
    fn other_than(&self, a: i64, b: i64, me: u32) -> bool {
        match self {
            Owners::Table(t) => t[a as usize..b as usize].iter().any(|&w| w != 0 && w != me),
            Owners::Intervals(iv) => {
                let first = iv.partition_point(|&(_, en, _)| en <= a);
                iv[first..].iter().take_while(|&&(st, _, _)| st < b).any(|&(_, _, p)| p != me)
            }
        }
    }
}

/// The exact path: every program's writes are committed in program order with per-element
/// owner tables, so the first race in program order is reported (or, in warn mode, every race is
/// listed and the highest program wins, as a sequential emulation would have it).
fn run_exact(l: &Launch, shared: &Shared) -> Result<(LaunchSummary, Finals), ExecError> {
    let mut c = Committer::new(shared);
    let summary = run_programs(l, shared, None, |p, out| c.program(l, shared, p, out))?;
    c.finish(l, shared, summary)
}

/// The ordered path, for kernels whose meaning depends on the order of programs (atomics that
/// return values they use, compare-and-swap, exchange): programs run one after another in
/// program order, each seeing the memory the earlier ones left. Accesses that two programs make
/// while holding the same lock (an element set by a successful `atomic_cas` or changed by an
/// `atomic_xchg`, and not yet set back; one a program never sets back guards nothing) are
/// ordered by it, in program order, and are not races; any other conflict is.
fn run_ordered(l: &Launch, shared: &Shared) -> Result<(LaunchSummary, Finals), ExecError> {
    let mut c = Committer::new(shared);
    let range = l.program_range();
    let mut summary = LaunchSummary { programs: range.end - range.start, ..Default::default() };
    for p in range {
        let out = {
            let slots = shared
                .slots
                .iter()
                .zip(&c.commits)
                .map(|(s, cm)| Slot {
                    name: s.name.clone(),
                    dtype: s.dtype,
                    shape: s.shape,
                    initial: cm.as_ref().map_or(s.initial, |cm| &cm.data),
                    written: s.written,
                    scratch: s.scratch,
                })
                .collect();
            let sh = Shared {
                kernel: shared.kernel,
                plan: shared.plan,
                slots,
                params: shared.params.clone(),
                grid: shared.grid,
                poison: shared.poison.clone(),
            };
            Program::new(&sh, l.grid.pid(p)).run(None)?
        };
        summary.elements_loaded += out.loaded;
        summary.elements_stored += out.stored;
        summary.elements_atomic += out.atomic;
        for (inst, t) in &out.trips {
            let e = summary.max_trips.entry(*inst).or_insert(0);
            *e = (*e).max(*t);
        }
        c.program(l, shared, p as u32, out)?;
    }
    c.finish(l, shared, summary)
}

/// Interned lock sets: id 0 is the empty set.
struct LockSets {
    sets: Vec<program::LockSet>,
    ids: HashMap<program::LockSet, u32>,
}

impl LockSets {
    fn new() -> LockSets {
        LockSets { sets: vec![Vec::new()], ids: HashMap::from([(Vec::new(), 0)]) }
    }

    fn id(&mut self, s: &program::LockSet) -> u32 {
        if s.is_empty() {
            return 0;
        }
        if let Some(&i) = self.ids.get(s) {
            return i;
        }
        self.sets.push(s.clone());
        self.ids.insert(s.clone(), self.sets.len() as u32 - 1);
        self.sets.len() as u32 - 1
    }

    /// The locks both sets hold (interned).
    fn common(&mut self, a: u32, b: u32) -> u32 {
        if a == b {
            return a;
        }
        if a == 0 || b == 0 {
            return 0;
        }
        let both: program::LockSet = self.sets[a as usize].iter().filter(|x| self.sets[b as usize].contains(x)).copied().collect();
        self.id(&both)
    }
}

/// Commits programs' writes in program order, checking conflicts.
struct Committer {
    commits: Vec<Option<Commit>>,
    races: Vec<Race>,
    reads: Vec<(u32, Vec<program::SlotLog>)>,
    locks: LockSets,
}

impl Committer {
    fn new(shared: &Shared) -> Committer {
        let commits = shared
            .slots
            .iter()
            .map(|s| {
                s.written.then(|| {
                    let n = s.initial.len();
                    Commit {
                        data: s.initial.clone(),
                        owner: vec![NONE; n],
                        owner_inst: vec![NONE; n],
                        atomic_owner: Vec::new(),
                        atomic_inst: Vec::new(),
                        owner_locks: Vec::new(),
                        atomic_locks: Vec::new(),
                        changed: vec![false; n],
                        same_bits: Vec::new(),
                    }
                })
            })
            .collect();
        Committer { commits, races: Vec::new(), reads: Vec::new(), locks: LockSets::new() }
    }

    fn program(&mut self, l: &Launch, shared: &Shared, p: u32, out: ProgramOut) -> Result<(), ExecError> {
        let mut logs = out.logs;
        for (s, log) in logs.iter_mut().enumerate() {
            if let Some(c) = self.commits[s].as_mut() {
                commit(shared.kernel, l, &shared.slots[s], c, p, log, &mut self.races, &mut self.locks)?;
            }
        }
        if logs.iter().any(|g| !g.reads.is_empty()) {
            logs.iter_mut().for_each(|g| g.events = Vec::new());
            self.reads.push((p, logs));
        }
        Ok(())
    }

    /// Checks the loads against the final owner tables.
    fn finish(mut self, l: &Launch, shared: &Shared, mut summary: LaunchSummary) -> Result<(LaunchSummary, Finals), ExecError> {
        let k = shared.kernel;
        self.settle_same_bits(l, shared, &mut summary)?;
        summary.races.append(&mut self.races);
        for (p, logs) in &self.reads {
            for (s, log) in logs.iter().enumerate() {
                let Some(c) = self.commits[s].as_ref() else { continue };
                'reads: for r in &log.reads {
                    let rl = self.locks.id(&r.locks);
                    for &(st, len) in &r.runs {
                        for o in st as usize..st as usize + len as usize {
                            let (w, wi, wl) = if c.owner[o] != NONE && c.owner[o] != *p {
                                if !c.changed[o] {
                                    // Every store left the element as it was: any order reads it.
                                    let (first, second) = (site(k, l, c.owner[o], c.owner_inst[o]), site(k, l, *p, r.inst.0));
                                    same_value(&mut summary, || slot_race(&shared.slots[s], RaceKind::ReadWrite, o, first, second));
                                    continue;
                                }
                                (c.owner[o], c.owner_inst[o], c.owner_locks.get(o).copied().unwrap_or(0))
                            } else if c.atomic(o).0 != NONE && c.atomic(o).0 != *p {
                                (c.atomic(o).0, c.atomic(o).1, c.atomic_locks.get(o).copied().unwrap_or(0))
                            } else {
                                continue;
                            };
                            if self.locks.common(rl, wl) != 0 {
                                continue;
                            }
                            let first = site(k, l, if w == MANY { *p } else { w }, wi);
                            let race = slot_race(&shared.slots[s], RaceKind::ReadWrite, o, first, site(k, l, *p, r.inst.0));
                            match l.options.races {
                                RaceMode::Error => return Err(ExecError::Race(Box::new(race))),
                                RaceMode::Warn => {
                                    if summary.races.len() < 100 {
                                        summary.races.push(race);
                                    }
                                    break 'reads;
                                }
                            }
                        }
                    }
                }
            }
        }
        if l.options.record_writers {
            // Slot indices here; `execute` maps them to tensor ids.
            for (s, c) in self.commits.iter_mut().enumerate() {
                let Some(c) = c else { continue };
                let each = (0..c.owner.len()).map(|o| if c.owner[o] != NONE { (c.owner[o], c.owner_inst[o]) } else { c.atomic(o) });
                summary.writers.push(crate::launch::Writers::from_elements(TensorId(s as u32), each));
            }
        }
        Ok((summary, self.commits.into_iter().map(|c| c.map(|c| c.data)).collect()))
    }
}

impl Committer {
    /// Write/write conflicts of the same bits: order-independent where the element ends with
    /// those bits (every program's last store agreed), a race where a later store changed them.
    fn settle_same_bits(&mut self, l: &Launch, shared: &Shared, summary: &mut LaunchSummary) -> Result<(), ExecError> {
        for (slot, c) in shared.slots.iter().zip(&mut self.commits) {
            let Some(c) = c else { continue };
            for sb in std::mem::take(&mut c.same_bits) {
                let race = || {
                    let (first, second) =
                        (site(shared.kernel, l, sb.first.0, sb.first.1), site(shared.kernel, l, sb.second.0, sb.second.1));
                    slot_race(slot, RaceKind::WriteWrite, sb.element, first, second)
                };
                if program::elem_bits(&c.data, sb.element) == sb.bits {
                    same_value(summary, race);
                    continue;
                }
                let race = race();
                match l.options.races {
                    RaceMode::Error => return Err(ExecError::Race(Box::new(race))),
                    RaceMode::Warn if self.races.len() < 100 => self.races.push(race),
                    RaceMode::Warn => {}
                }
            }
        }
        Ok(())
    }
}

/// Conflicts whose outcome does not depend on the order of programs kept per tensor as examples.
const SAME_BITS_KEPT: usize = 100;

/// A store that met another program's store of the same bits: the element, the bits, and the
/// (program, instruction) of both stores.
struct SameBits {
    element: usize,
    bits: u64,
    first: (u32, u32),
    second: (u32, u32),
}

/// Counts an order-independent access to an element other programs stored to, keeping the first.
fn same_value(summary: &mut LaunchSummary, race: impl FnOnce() -> Race) {
    summary.same_value_races += 1;
    if summary.same_value.len() < SAME_BITS_KEPT {
        summary.same_value.push(race());
    }
}

fn slot_race(slot: &Slot, kind: RaceKind, element: usize, first: Site, second: Site) -> Race {
    Race::at(kind, &slot.name, slot.shape, element as i64, first, second)
}

fn site(k: &Kernel, l: &Launch, p: u32, inst: u32) -> Site {
    let (op, loc) = if inst == NONE || inst == MANY {
        ("atomic_add", k.loc.clone())
    } else {
        let d = k.inst(Inst(inst));
        (d.op.mnemonic(), d.loc.clone())
    };
    Site { kernel: k.name.clone(), op, loc, pid: l.grid.pid(p as u64) }
}

/// Applies one program's logged writes to a tensor, checking for conflicts with earlier
/// programs; accesses under a common lock are ordered and do not conflict.
#[allow(clippy::too_many_arguments)]
fn commit(
    k: &Kernel,
    l: &Launch,
    slot: &Slot,
    c: &mut Commit,
    p: u32,
    log: &program::SlotLog,
    races: &mut Vec<Race>,
    locks: &mut LockSets,
) -> Result<(), ExecError> {
    for e in &log.events {
        let el = locks.id(&e.locks);
        if el != 0 && c.owner_locks.is_empty() {
            c.owner_locks = vec![0; c.owner.len()];
            c.atomic_locks = vec![0; c.owner.len()];
        }
        for (lane, o) in e.lanes() {
            let o = o as usize;
            let (ol, al) = (c.owner_locks.get(o).copied().unwrap_or(0), c.atomic_locks.get(o).copied().unwrap_or(0));
            let by_other = |owner: u32, held: u32, locks: &mut LockSets| owner != NONE && owner != p && locks.common(held, el) == 0;
            let conflict = if e.atomic {
                by_other(c.owner[o], ol, locks).then(|| (RaceKind::StoreAtomic, c.owner[o], c.owner_inst[o]))
            } else if by_other(c.owner[o], ol, locks) {
                let bits = program::elem_bits(&e.vals, lane);
                if program::elem_bits(&c.data, o) == bits {
                    // The same bits as the element holds from the other program: a note, if
                    // the element keeps them to the end of the launch.
                    c.same_bits.push(SameBits { element: o, bits, first: (c.owner[o], c.owner_inst[o]), second: (p, e.inst.0) });
                    None
                } else {
                    Some((RaceKind::WriteWrite, c.owner[o], c.owner_inst[o]))
                }
            } else if by_other(c.atomic(o).0, al, locks) {
                Some((RaceKind::StoreAtomic, c.atomic(o).0, c.atomic(o).1))
            } else {
                None
            };
            if let Some((kind, q, qi)) = conflict {
                let race = slot_race(slot, kind, o, site(k, l, if q == MANY { p } else { q }, qi), site(k, l, p, e.inst.0));
                match l.options.races {
                    RaceMode::Error => return Err(ExecError::Race(Box::new(race))),
                    RaceMode::Warn => {
                        if races.len() < 100 {
                            races.push(race);
                        }
                    }
                }
            }
            if e.atomic {
                if c.atomic_owner.is_empty() {
                    c.atomic_owner = vec![NONE; c.owner.len()];
                    c.atomic_inst = vec![NONE; c.owner.len()];
                }
                let first = c.atomic_owner[o] == NONE;
                c.atomic_owner[o] = if first || c.atomic_owner[o] == p { p } else { MANY };
                c.atomic_inst[o] = e.inst.0;
                if !c.atomic_locks.is_empty() {
                    c.atomic_locks[o] = if first { el } else { locks.common(al, el) };
                }
                let cur = program::elem_bits(&c.data, o);
                let v = program::elem_bits(&e.vals, lane);
                program::set_bits(&mut c.data, o, program::rmw_bits(e.rmw, slot.dtype, cur, v));
            } else {
                let first = c.owner[o] == NONE || c.owner[o] == p;
                if !c.owner_locks.is_empty() {
                    c.owner_locks[o] = if first { el } else { locks.common(ol, el) };
                }
                c.owner[o] = p;
                c.owner_inst[o] = e.inst.0;
                if !c.changed[o] && program::elem_bits(&e.vals, lane) != program::elem_bits(slot.initial, o) {
                    c.changed[o] = true;
                }
                set_into(&mut c.data, o, &e.vals, lane);
            }
        }
    }
    Ok(())
}

fn set_into(d: &mut Data, o: usize, v: &Data, lane: usize) {
    match (d, v) {
        (Data::I1(d), Data::I1(v)) => d[o] = v[lane],
        (Data::I32(d), Data::I32(v)) => d[o] = v[lane],
        (Data::I64(d), Data::I64(v)) => d[o] = v[lane],
        (Data::F32(d), Data::F32(v)) => d[o] = v[lane],
        (Data::F64(d), Data::F64(v)) => d[o] = v[lane],
        _ => unreachable!("the verifier checked stored values have the pointee dtype"),
    }
}
