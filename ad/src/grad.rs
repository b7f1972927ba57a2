//! The vector-Jacobian product of a whole launch.
//!
//! A launch maps the initial contents of its input tensors to the final contents of its output
//! tensors. Given cotangents of the outputs, [`vjp`] returns cotangents of the inputs, with the
//! design's semantics: an element's final value comes from its last writer (whose stored value
//! receives the cotangent); an element no program stores passes its cotangent through to its
//! initial value (in-place tensors); `atomic_add` passes it through and to every contribution; a
//! load sends its cotangent to the element it read.
//!
//! Programs are differentiated in batches (consecutive programs, batch boundaries fixed by the
//! kernel's tile sizes or [`GradOptions::batch_programs`]), batches in parallel, each thread
//! taking the next one in order. Contributions are summed in batch order (each batch's as soon
//! as every earlier batch's are in, while they are in cache), within a batch access by access
//! and program by program: the result does not depend on the thread count, the timing or
//! [`GradOptions::chunk_programs`]. The results waiting for an earlier batch are bounded by the
//! memory budget.

use crate::graph::{active_values, forward_drops, reverse_needs, KernelGraph};
use crate::program::{Initial, Program, ProgramGrad, Shared, SlotData, StoreRun, V};
use crate::rules::Precision;
use crate::{AdError, BTile};
use std::collections::BTreeMap;
use tilegrad_ir::{DType, Inst, ParamKind, Type};
use tilegrad_reference::{Arg, HostTensor, Launch, Memory, Options, RaceMode, TensorId, Writers};

/// Options of a gradient computation.
#[derive(Clone, Debug)]
pub struct GradOptions {
    /// f64 ground truth (the default) or the kernel's own dtypes.
    pub precision: Precision,
    /// Memory for the work in flight beyond the gradients themselves: half for the results of
    /// finished batches waiting for earlier ones (they are added in batch order; beyond it,
    /// threads wait before starting another batch), half for the loop-body values the batches
    /// being evaluated keep for their reverse sweeps (beyond it, bodies are recomputed).
    /// Default 64 MiB.
    pub memory_budget: usize,
    /// Programs per chunk: the launch is differentiated in chunks of this many programs, one
    /// after the other (each chunk's batches in parallel). By default, one chunk.
    pub chunk_programs: Option<usize>,
    /// Programs evaluated together as one batch (every value holds one tile per program),
    /// overriding the size derived from the kernel's tile sizes. A batch whose programs take
    /// different branches or trip counts is split until they agree. Kernels that load what
    /// they stored are evaluated one program at a time.
    pub batch_programs: Option<usize>,
    /// Bytes of loop-body values each program may keep for its reverse sweep (at most; the
    /// memory budget may allow less). Within it, loop bodies are not recomputed; beyond it, the
    /// tape holds only each iteration's carried values and the reverse sweep recomputes the body
    /// from them (bounded memory).
    pub tape_budget: usize,
    /// The launch already ran on this memory with every check of the reference (as the
    /// launches of a recorded forward did): it is not checked again, and an f64 pointer
    /// parameter may be bound to a tensor stored in a narrower float dtype, whose values are
    /// then read exactly as f64 (see [`Launch::check_arguments_widened`]). Default false.
    pub validated: bool,
    /// Where programs store the same value to one element (not a race: the outcome does not
    /// depend on their order), the element's cotangent flows back through its last store in
    /// program order only, as through the one store that lands last on a GPU. Costs a reference
    /// run recording the writers and one program per batch. Set by [`vjp`] itself where it finds
    /// such stores; a caller that passes `validated` says so here. Default false.
    pub last_writer_only: bool,
}

impl Default for GradOptions {
    fn default() -> GradOptions {
        GradOptions {
            precision: Precision::F64,
            memory_budget: 64 << 20,
            chunk_programs: None,
            batch_programs: None,
            tape_budget: 16 << 20,
            validated: false,
            last_writer_only: false,
        }
    }
}

/// Per slot (`slot_ids`), the linear id of the program whose store each element holds after the
/// launch ([`Writers::NONE`] where no store wrote it), from a reference run recording writers.
fn last_writers(launch: &Launch, mem: &Memory, slot_ids: &[TensorId], validated: bool) -> Result<Vec<Vec<u32>>, AdError> {
    let mut m = if validated { widen(launch, mem) } else { mem.clone() };
    let recording = launch.clone().options(Options { record_writers: true, ..launch.get_options().clone() });
    let summary = recording.run(&mut m)?;
    Ok(slot_ids
        .iter()
        .map(|t| {
            summary
                .writers
                .iter()
                .find(|w| w.tensor == *t)
                .map_or_else(Vec::new, |w| w.iter().map(|x| x.map_or(Writers::NONE, |(p, _)| p)).collect())
        })
        .collect())
}

/// `mem` with the tensors that f64 pointer parameters of `launch` take converted to f64 where
/// they are stored narrower (for the reference, which binds f64 pointers to f64 tensors only).
fn widen(launch: &Launch, mem: &Memory) -> Memory {
    let k = launch.kernel();
    let wide: Vec<TensorId> = launch
        .args()
        .iter()
        .filter_map(|(n, a)| match (a, k.param(n).map(|p| &p.kind)) {
            (Arg::Tensor(t), Some(ParamKind::Ptr(DType::F64))) => Some(*t),
            _ => None,
        })
        .collect();
    let mut out = Memory::new();
    for i in 0..mem.len() {
        let id = TensorId(i as u32);
        let t = mem.get(id);
        let widened = wide.contains(&id) && t.dtype() != DType::F64;
        out.add(mem.name(id), if widened { HostTensor::from_f64(t.shape(), t.to_f64_vec()) } else { t.clone() });
    }
    out
}

/// The result of [`vjp`].
#[derive(Clone, Debug, PartialEq)]
pub struct Gradient {
    /// Cotangent of each requested input's initial contents, in the order requested.
    pub inputs: Vec<Vec<f64>>,
    /// For each loop, the largest trip count any program took: the `max_iters` a loop without
    /// one is bounded by (inferred from this launch's inputs).
    pub max_trips: BTreeMap<Inst, u64>,
}

/// The VJP of `launch` on `mem`: cotangents of the initial contents of `inputs` (float tensors)
/// given cotangents of the final contents of `outputs`.
///
/// Atomics other than `atomic_add` (max/min/and/or/xor/exchange/compare-and-swap), and an
/// `atomic_add` whose old value the kernel uses, make the launch depend on the order of its
/// programs (spin locks, first-writer flags); such a forward is refused with the op and its
/// location. Differentiate the kernel that does the math, not its synchronisation.
///
/// Out-of-bounds accesses, races and loops beyond their `max_iters` are errors, reported as the
/// reference interpreter reports them (with their locations). Where the engine can find them
/// itself while it differentiates ([`crate::graph::KernelFacts::self_checking`]: no tensor both
/// loaded and written, no address or mask computed from floats), it does, and the reference
/// run happens only to describe an error it found; otherwise the reference runs the launch
/// first (without changing `mem`).
pub fn vjp(
    launch: &Launch,
    mem: &Memory,
    inputs: &[TensorId],
    outputs: &[(TensorId, Vec<f64>)],
    opts: &GradOptions,
) -> Result<Gradient, AdError> {
    let k = launch.kernel();
    if opts.validated {
        launch.check_arguments_widened(mem)?;
    } else {
        launch.check_arguments(mem)?;
    }
    refuse_ordered_atomics(k)?;

    // Bind parameters: tensors to slots (aliases share one), scalars to values.
    let mut slot_ids: Vec<TensorId> = Vec::new();
    let mut param_slot: Vec<Option<u32>> = Vec::new();
    let mut params: Vec<V> = Vec::new();
    for p in &k.params {
        let given = launch.args().iter().find(|(n, _)| *n == p.name).map(|(_, a)| *a);
        match (&p.kind, given) {
            (ParamKind::Ptr(_), Some(Arg::Tensor(t))) => {
                let s = match slot_ids.iter().position(|x| *x == t) {
                    Some(s) => s,
                    None => {
                        slot_ids.push(t);
                        slot_ids.len() - 1
                    }
                } as u32;
                param_slot.push(Some(s));
                params.push(V::Ptr(s, BTile::new(1, &[], vec![0.0])));
            }
            (ParamKind::Scalar(_), Some(Arg::Scalar(l))) => {
                param_slot.push(None);
                params.push(V::Num(BTile::new(1, &[], vec![l.as_f64()])));
            }
            (ParamKind::Constexpr(_, l), Some(Arg::Scalar(_)) | None) => {
                param_slot.push(None);
                params.push(V::Num(BTile::new(1, &[], vec![l.as_f64()])));
            }
            // The reference run above has already rejected every other combination.
            _ => return Err(AdError::Spec(format!("kernel `{}`: argument `{}` does not match its parameter", k.name, p.name))),
        }
    }
    let slot_of = |t: TensorId, what: &str| -> Result<usize, AdError> {
        slot_ids
            .iter()
            .position(|x| *x == t)
            .ok_or_else(|| AdError::Spec(format!("{what} tensor `{}` is not an argument of the launch of `{}`", mem.name(t), k.name)))
    };
    let initial = |t: TensorId| {
        let h = mem.get(t);
        match (h.as_f32(), h.as_f64()) {
            (Some(v), _) => Initial::F32(v),
            (_, Some(v)) => Initial::F64(v),
            _ => Initial::Converted(h.to_f64_vec()),
        }
    };
    let mut slots: Vec<SlotData> =
        slot_ids.iter().map(|&t| SlotData { name: mem.name(t).to_string(), initial: initial(t), out_cot: None, is_input: false }).collect();
    for &t in inputs {
        let s = slot_of(t, "input")?;
        if !mem.get(t).dtype().is_float() {
            return Err(AdError::Spec(format!("input tensor `{}` is {}, not a float tensor", mem.name(t), mem.get(t).dtype())));
        }
        slots[s].is_input = true;
    }
    for (t, c) in outputs {
        let s = slot_of(*t, "output")?;
        if c.len() != mem.get(*t).numel() {
            return Err(AdError::Spec(format!(
                "cotangent of output `{}` has {} elements, the tensor has {}",
                mem.name(*t),
                c.len(),
                mem.get(*t).numel()
            )));
        }
        slots[s].out_cot = Some(c);
    }

    let facts = KernelGraph::build(k, &param_slot).facts(k);
    let self_check = facts.self_checking && launch.get_options().races == RaceMode::Error;
    let checked = if self_check || opts.validated { None } else { Some(launch.check(mem)?) };
    if !opts.last_writer_only && checked.as_ref().is_some_and(|s| s.same_value_races > 0) {
        return vjp(launch, mem, inputs, outputs, &GradOptions { last_writer_only: true, ..opts.clone() });
    }
    let owners = if opts.last_writer_only { Some(last_writers(launch, mem, &slot_ids, opts.validated)?) } else { None };
    // Batches: at most 16K elements per batched tile of the largest tile type. Kernels of small
    // tiles then spread the per-op overhead over several programs, while tiles stay
    // cache-sized (measured: batching 16K-element tiles of a row softmax slows it down). One
    // program at a time when programs read their own stores (their overlays are per program).
    let max_numel = k.values.iter().map(|v| v.ty.numel()).max().unwrap_or(1).max(1);
    let batch =
        if facts.needs_overlay || owners.is_some() { 1 } else { opts.batch_programs.unwrap_or((16384 / max_numel).clamp(1, 64)).max(1) }
            as u64;
    // Half the budget for the loop-body values of the batches in flight (one per thread).
    let in_flight = tilegrad_reference::working_threads() * batch as usize;
    let tape_budget = opts.tape_budget.min(opts.memory_budget / 2 / in_flight);
    let active = active_values(k);
    let needs = reverse_needs(k, &active);
    let views = crate::graph::broadcast_views(k);
    let drops = forward_drops(k, &needs);
    let num_types: Vec<Type> = k.values.iter().map(|v| if v.ty.is_ptr() { v.ty.with_dtype(DType::I64) } else { v.ty.clone() }).collect();
    let mut shared = Shared {
        kernel: k,
        facts: &facts,
        active: &active,
        needs: &needs,
        races_rejected: launch.get_options().races == RaceMode::Error,
        owners: owners.as_deref(),
        num_types: &num_types,
        slots: &slots,
        params: &params,
        grid: launch.grid().0,
        precision: opts.precision,
        tape_budget,
        self_check,
        invariant: vec![None; k.values.len()],
        views: &views,
        drops: &drops,
    };
    // An error the engine finds in a self-checking launch is the reference's to describe (when
    // the launch is at fault).
    let described = |e: AdError| if self_check && !opts.validated { launch.check(mem).err().map_or(e, AdError::from) } else { e };
    shared.invariant = Program::invariants(&shared, launch.grid().pid(0)).map_err(described)?;
    let mut grads: Vec<Vec<f64>> =
        slots.iter().map(|s| if s.is_input { crate::pages::zeroed(s.initial.len(), PAGE_CHUNK) } else { Vec::new() }).collect();
    let stored: Vec<Vec<bool>> = slots.iter().map(|s| if s.tracks_stores() { vec![false; s.initial.len()] } else { Vec::new() }).collect();
    let mut totals = Totals { stored, max_trips: BTreeMap::new(), store_runs: Vec::new(), too_many_runs: false };
    let total = launch.grid().programs();
    // One run over every batch, unless chunks are asked for (they hold whole batches, so that
    // batches, and the result's summation order, do not depend on the chunk size).
    let chunk = opts.chunk_programs.map_or(total, |c| (c as u64).max(1).div_ceil(batch) * batch);
    let mut start = 0;
    while start < total {
        let end = (start + chunk).min(total);
        run_chunk(&shared, launch, (start, end, batch), opts.memory_budget / 2, &mut grads, &mut totals).map_err(described)?;
        start = end;
    }
    let Totals { stored, max_trips, mut store_runs, too_many_runs } = totals;
    if self_check && !opts.validated && (too_many_runs || stores_overlap(&mut store_runs)) {
        // A race (which the reference names), or too many runs to tell cheaply; or programs
        // storing the same values, whose cotangents go to the last store only.
        if launch.check(mem)?.same_value_races > 0 && !opts.last_writer_only {
            return vjp(launch, mem, inputs, outputs, &GradOptions { last_writer_only: true, ..opts.clone() });
        }
    }
    if cfg!(debug_assertions) {
        // The engine's own checks agree with the reference's (on the memory as f64 where it is
        // stored narrow).
        let widened = opts.validated.then(|| widen(launch, mem));
        let summary = checked.map_or_else(|| launch.check(widened.as_ref().unwrap_or(mem)), Ok);
        assert!(summary.is_ok(), "a launch the reference rejects was differentiated: {:?}", summary.err());
        assert_eq!(max_trips, summary.expect("checked").max_trips);
    }
    // Elements of in-place tensors that no program stores keep their initial value (plus any
    // atomic contributions): their output cotangent passes through.
    for (s, sd) in slots.iter().enumerate() {
        if let (true, Some(oc)) = (sd.is_input, &sd.out_cot) {
            for (e, g) in grads[s].iter_mut().enumerate() {
                if !stored[s][e] {
                    *g += oc[e];
                }
            }
        }
    }
    // Each gradient moves out (a tensor requested twice gets a copy of the first one).
    let mut taken: Vec<Option<usize>> = vec![None; grads.len()];
    let mut out: Vec<Vec<f64>> = Vec::with_capacity(inputs.len());
    for (j, &t) in inputs.iter().enumerate() {
        let s = slot_ids.iter().position(|x| *x == t).expect("checked above");
        match taken[s] {
            Some(first) => {
                let copy = out[first].clone();
                out.push(copy);
            }
            None => {
                taken[s] = Some(j);
                out.push(std::mem::take(&mut grads[s]));
            }
        }
    }
    let inputs = out;
    Ok(Gradient { inputs, max_trips })
}

/// Programs `start..end` as one batch; where their control flow diverges, the two halves
/// separately (down to single programs), their results concatenated in program order.
fn run_batch(shared: &Shared<'_>, launch: &Launch, start: u64, end: u64) -> Result<ProgramGrad, AdError> {
    let pids: Vec<[u32; 3]> = (start..end).map(|p| launch.grid().pid(p)).collect();
    if let Some(out) = Program::new(shared, start, pids).run()? {
        return Ok(out);
    }
    if end - start < 2 {
        // A single program cannot diverge from itself.
        return Err(AdError::Spec(format!("kernel `{}`: program {start} diverged from itself", launch.kernel().name)));
    }
    let mid = start + (end - start) / 2;
    let (mut a, b) = (run_batch(shared, launch, start, mid)?, run_batch(shared, launch, mid, end)?);
    a.contrib.extend(b.contrib);
    a.store_runs.extend(b.store_runs);
    for (x, y) in a.stored.iter_mut().zip(b.stored) {
        x.extend(y);
    }
    for (i, t) in b.trips {
        match a.trips.iter_mut().find(|(j, _)| *j == i) {
            Some((_, u)) => *u = (*u).max(t),
            None => a.trips.push((i, t)),
        }
    }
    Ok(a)
}

/// Store runs the race check of a self-checking launch sorts at most (24 MiB); beyond, the
/// reference checks the launch.
const MAX_STORE_RUNS: usize = 1 << 20;

/// Whether runs stored by two different programs share an element (sorts `runs`).
fn stores_overlap(runs: &mut [StoreRun]) -> bool {
    runs.sort_unstable_by_key(|r| (r.slot, r.start));
    // The furthest end reached by any program so far (and that program), and the furthest end
    // reached by any other program.
    let (mut slot, mut top, mut second) = (u32::MAX, (i64::MIN, u64::MAX), i64::MIN);
    for r in runs.iter() {
        if r.slot != slot {
            (slot, top, second) = (r.slot, (i64::MIN, u64::MAX), i64::MIN);
        }
        let others = if top.1 == r.program { second } else { top.0 };
        if others > r.start {
            return true;
        }
        let end = r.start + r.len as i64;
        if r.program == top.1 {
            top.0 = top.0.max(end);
        } else if end > top.0 {
            (second, top) = (top.0, (end, r.program));
        } else {
            second = second.max(end);
        }
    }
    false
}

/// Elements per parallel task when gradient buffers are first touched.
const PAGE_CHUNK: usize = 1 << 14;

/// What the batches of a launch hand back besides gradient contributions, gathered in batch
/// order.
struct Totals {
    /// Per slot that [`SlotData::tracks_stores`]: whether some program stores each element.
    stored: Vec<Vec<bool>>,
    max_trips: BTreeMap<Inst, u64>,
    store_runs: Vec<StoreRun>,
    /// More store runs than [`MAX_STORE_RUNS`]: the reference checks the launch instead.
    too_many_runs: bool,
}

impl Totals {
    /// Adds the next batch's results (all but its contributions).
    fn add(&mut self, out: &ProgramGrad) {
        for (s, st) in out.stored.iter().enumerate() {
            if !self.stored[s].is_empty() {
                for &e in st {
                    self.stored[s][e as usize] = true;
                }
            }
        }
        for &(i, t) in &out.trips {
            let e = self.max_trips.entry(i).or_insert(0);
            *e = (*e).max(t);
        }
        if !self.too_many_runs {
            self.store_runs.extend_from_slice(&out.store_runs);
            self.too_many_runs = self.store_runs.len() > MAX_STORE_RUNS;
            if self.too_many_runs {
                self.store_runs = Vec::new();
            }
        }
    }
}

/// Adds contributions to one share of every gradient: `(first element, elements)` per slot.
fn add_contributions(share: &mut [(usize, &mut [f64])], out: &ProgramGrad) {
    for c in &out.contrib {
        let (lo, g) = &mut share[c.slot as usize];
        let (lo, hi) = (*lo as i64, (*lo + g.len()) as i64);
        let mut at = 0usize;
        for &(s, n) in &c.runs {
            // The part of the run in this share, and its values.
            let (a, b) = (s.max(lo), (s + n as i64).min(hi));
            if a < b {
                let v = &c.vals[at + (a - s) as usize..at + (b - s) as usize];
                let g = &mut g[(a - lo) as usize..(b - lo) as usize];
                crate::simd::wide(|| g.iter_mut().zip(v).for_each(|(g, &x)| *g += x));
            }
            at += n as usize;
        }
    }
}

/// Most adders of one chunk: each adds to its own share of every gradient, so that adding
/// keeps pace with many threads computing.
const MAX_SHARES: usize = 8;

/// What one adder adds, batch by batch in order.
enum Adds<'g> {
    /// A share of every gradient.
    Share(Vec<(usize, &'g mut [f64])>),
    /// Everything but contributions.
    Rest(&'g mut Totals),
}

/// A finished batch waiting for the adders, how many have added it, and its bytes.
struct Finished {
    out: ProgramGrad,
    added: std::sync::atomic::AtomicUsize,
    bytes: usize,
}

/// Runs the batches of programs `start..end` (`batch` programs each) in parallel, each thread
/// taking the next batch in order. Each batch's results are added to `grads` and `totals` as
/// soon as those of every earlier batch are in: the sums are in batch order whatever the
/// thread count or timing, while the results are still in cache, and their memory is reused by
/// later batches. Adders own disjoint shares of the gradients; the thread that finishes a batch
/// runs every adder that is free. While the results waiting for an earlier batch take more than
/// `pending_limit` bytes, threads wait before starting another batch (the earliest unfinished
/// batch is being computed, so the wait ends). Returns the error of the first batch that
/// failed (every earlier batch has been taken, so that is the same batch on every run).
fn run_chunk(
    shared: &Shared<'_>,
    launch: &Launch,
    (start, end, batch): (u64, u64, u64),
    pending_limit: usize,
    grads: &mut [Vec<f64>],
    totals: &mut Totals,
) -> Result<(), AdError> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    use std::sync::{Arc, Condvar, Mutex};
    const HELD: &str = "no thread panics holding the lock";
    let batches = (end - start).div_ceil(batch) as usize;
    let workers = tilegrad_reference::working_threads().min(batches).max(1);
    let shares = workers.min(MAX_SHARES);
    // Share k of a gradient of n elements: elements n*k/shares up to n*(k+1)/shares.
    let mut split: Vec<Vec<(usize, &mut [f64])>> = (0..shares).map(|_| Vec::new()).collect();
    for g in grads.iter_mut() {
        let n = g.len();
        let (mut rest, mut lo): (&mut [f64], usize) = (g, 0);
        for (k, share) in split.iter_mut().enumerate() {
            let hi = n * (k + 1) / shares;
            let (mine, others) = std::mem::take(&mut rest).split_at_mut(hi - lo);
            share.push((lo, mine));
            (rest, lo) = (others, hi);
        }
    }
    let mut adders: Vec<Mutex<(usize, Adds<'_>)>> = split.into_iter().map(|s| Mutex::new((0, Adds::Share(s)))).collect();
    adders.push(Mutex::new((0, Adds::Rest(totals))));
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let first_error: Mutex<Option<(usize, AdError)>> = Mutex::new(None);
    // Finished batches that some adder has not added yet, and the bytes they take.
    let inbox: Mutex<(BTreeMap<usize, Arc<Finished>>, usize)> = Mutex::new((BTreeMap::new(), 0));
    let drained = Condvar::new();
    let work = || loop {
        let mut held = inbox.lock().expect(HELD);
        while held.1 > pending_limit && !failed.load(SeqCst) {
            held = drained.wait(held).expect(HELD);
        }
        drop(held);
        let j = next.fetch_add(1, SeqCst);
        if j >= batches || failed.load(SeqCst) {
            return;
        }
        let first = start + j as u64 * batch;
        match run_batch(shared, launch, first, (first + batch).min(end)) {
            Err(e) => {
                failed.store(true, SeqCst);
                let mut first = first_error.lock().expect(HELD);
                if first.as_ref().is_none_or(|(k, _)| j < *k) {
                    *first = Some((j, e));
                }
                drop(first);
                // Waiting threads stop.
                let _held = inbox.lock().expect(HELD);
                drained.notify_all();
            }
            Ok(out) => {
                let bytes = out.bytes();
                let mut held = inbox.lock().expect(HELD);
                held.0.insert(j, Arc::new(Finished { out, added: AtomicUsize::new(0), bytes }));
                held.1 += bytes;
                drop(held);
                for adder in &adders {
                    // An adder another thread holds is left to it; that thread looks again after
                    // letting go, so that no batch is left behind.
                    while let Ok(mut a) = adder.try_lock() {
                        loop {
                            let Some(f) = inbox.lock().expect(HELD).0.get(&a.0).cloned() else { break };
                            match &mut a.1 {
                                Adds::Share(share) => add_contributions(share, &f.out),
                                Adds::Rest(t) => t.add(&f.out),
                            }
                            if f.added.fetch_add(1, SeqCst) + 1 == adders.len() {
                                let mut held = inbox.lock().expect(HELD);
                                held.0.remove(&a.0);
                                held.1 -= f.bytes;
                                drained.notify_all();
                            }
                            a.0 += 1;
                        }
                        let wanted = a.0;
                        drop(a);
                        if !inbox.lock().expect(HELD).0.contains_key(&wanted) {
                            break;
                        }
                    }
                }
            }
        }
    };
    rayon::scope(|s| {
        for _ in 1..workers {
            s.spawn(|_| work());
        }
        work();
    });
    if let Some((_, e)) = first_error.into_inner().expect("no thread panicked") {
        return Err(e);
    }
    for adder in adders {
        let (added, _) = adder.into_inner().expect("no thread panicked");
        assert_eq!(added, batches, "every batch of the chunk is added");
    }
    Ok(())
}

/// The refusal described on [`vjp`]: the first order-dependent atomic of `k`, in program order.
pub(crate) fn refuse_ordered_atomics(k: &tilegrad_ir::Kernel) -> Result<(), AdError> {
    use tilegrad_ir::Op;
    let mut added: Vec<(tilegrad_ir::Value, tilegrad_ir::Inst)> = Vec::new();
    let mut first: Option<(tilegrad_ir::Inst, String)> = None;
    k.walk(&mut |i, d| match d.op {
        Op::AtomicRmw { .. } | Op::AtomicCas if first.is_none() => {
            first = Some((
                i,
                format!(
                    "`{}` makes the launch depend on the order of its programs; tilegrad does not differentiate it \
                     (only `atomic_add` whose old value is unused is differentiable)",
                    d.op.mnemonic()
                ),
            ));
        }
        Op::AtomicAdd { .. } => added.extend(d.results.iter().map(|&r| (r, i))),
        _ => {}
    });
    if first.is_none() && !added.is_empty() {
        k.walk(&mut |_, d| {
            if first.is_none() {
                if let Some(&(_, i)) = added.iter().find(|(r, _)| d.args.contains(r)) {
                    first = Some((
                        i,
                        "the old value this `atomic_add` returns is used: it depends on the order of programs, and tilegrad \
                         does not differentiate it"
                            .into(),
                    ));
                }
            }
        });
    }
    match first {
        Some((i, message)) => {
            let d = k.inst(i);
            Err(AdError::Unsupported { kernel: k.name.clone(), op: d.op.mnemonic().into(), loc: d.loc.clone(), message })
        }
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, Rng, SeedableRng};
    use tilegrad_ir::{Kernel, KernelBuilder};
    use tilegrad_reference::HostTensor;

    /// `y[p*B + l] = x[p*B + l - H] * x[p*B + l + H] * s` with masked (zero) lanes outside `x`:
    /// neighbouring programs read overlapping windows of `x`, and `s` (a product of constants)
    /// is inactive.
    fn shifted_product(block: usize, halo: i32) -> Kernel {
        let mut b = KernelBuilder::new("shifted_product");
        let x = b.ptr_param("x", DType::F64);
        let y = b.ptr_param("y", DType::F64);
        let n = b.scalar_param("n", DType::I32);
        let pid = b.program_id(0);
        let bs = b.i32(block as i32);
        let start = b.mul(pid, bs);
        let r = b.arange(0, block as i64);
        let offs = b.add(start, r);
        let in_y = b.lt(offs, n);
        let mut loads = Vec::new();
        for h in [-halo, halo] {
            let hv = b.i32(h);
            let o = b.add(offs, hv);
            let zero = b.i32(0);
            let lo_ok = b.ge(o, zero);
            let hi_ok = b.lt(o, n);
            let ok = b.and(lo_ok, hi_ok);
            let p = b.add(x, o);
            let other = b.f64(0.0);
            loads.push(b.load(p, Some(ok), Some(other)));
        }
        let (c1, c2) = (b.f64(1.5), b.f64(-0.5));
        let s = b.mul(c1, c2);
        let prod = b.mul(loads[0], loads[1]);
        let v = b.mul(prod, s);
        let py = b.add(y, offs);
        b.store(py, v, Some(in_y));
        b.finish().unwrap()
    }

    #[test]
    fn overlapping_contributions_across_accumulation_ranges_are_exact_and_thread_independent() {
        // 40_000 elements: several accumulation ranges and a partial last block; the halo makes
        // windows straddle range boundaries and neighbouring programs share elements.
        let (n, block, halo) = (40_000usize, 512usize, 37i32);
        let k = shifted_product(block, halo);
        let mut rng = StdRng::seed_from_u64(5);
        let xs: Vec<f64> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let cy: Vec<f64> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let mut mem = Memory::new();
        let x = mem.add("x", HostTensor::from_f64(&[n], xs.clone()));
        let y = mem.add("y", HostTensor::zeros(DType::F64, &[n]));
        let launch = Launch::new(&k, n.div_ceil(block)).arg("x", x).arg("y", y).arg("n", n as i32);
        let run = |threads: usize, chunk: Option<usize>| {
            let opts = GradOptions { chunk_programs: chunk, ..GradOptions::default() };
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| vjp(&launch, &mem, &[x], &[(y, cy.clone())], &opts)).unwrap().inputs.remove(0)
        };
        let base = run(1, None);
        for (threads, chunk) in [(2, None), (3, Some(7)), (2, Some(1))] {
            let g = run(threads, chunk);
            assert!(g.iter().zip(&base).all(|(a, b)| a.to_bits() == b.to_bits()), "{threads} threads, chunks of {chunk:?}");
        }
        // Analytic: lane i reads x[i - H] and x[i + H]; s = -0.75.
        let h = halo as i64;
        let at = |i: i64| if i >= 0 && (i as usize) < n { xs[i as usize] } else { 0.0 };
        let mut want = vec![0.0; n];
        for i in 0..n as i64 {
            let c = cy[i as usize] * -0.75;
            if i - h >= 0 {
                want[(i - h) as usize] += c * at(i + h);
            }
            if i + h < n as i64 {
                want[(i + h) as usize] += c * at(i - h);
            }
        }
        for (e, (g, w)) in base.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-12 * w.abs().max(1.0), "x[{e}]: {g} vs {w}");
        }
        assert!(base.iter().any(|&g| g != 0.0));
    }

    #[test]
    fn contributions_of_many_batches_to_one_element_are_summed_in_batch_order() {
        // y[p*B + l] = x[l]^2: every program (one batch each) reads all of x, so each element of
        // x's gradient is a sum of P contributions, whose order shows in the bits.
        let (b, p) = (64usize, 40usize);
        let mut kb = KernelBuilder::new("squares_of_shared");
        let x = kb.ptr_param("x", DType::F64);
        let y = kb.ptr_param("y", DType::F64);
        let pid = kb.program_id(0);
        let bs = kb.i32(b as i32);
        let start = kb.mul(pid, bs);
        let r = kb.arange(0, b as i64);
        let px = kb.add(x, r);
        let v = kb.load(px, None, None);
        let v2 = kb.mul(v, v);
        let o = kb.add(start, r);
        let py = kb.add(y, o);
        kb.store(py, v2, None);
        let k = kb.finish().unwrap();
        let mut rng = StdRng::seed_from_u64(6);
        let xs: Vec<f64> = (0..b).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let cy: Vec<f64> = (0..b * p).map(|_| rng.gen_range(-1e3..1e3) * rng.gen_range(1e-6..1.0)).collect();
        let mut mem = Memory::new();
        let xt = mem.add("x", HostTensor::from_f64(&[b], xs.clone()));
        let yt = mem.add("y", HostTensor::zeros(DType::F64, &[b * p]));
        let launch = Launch::new(&k, p as u32).arg("x", xt).arg("y", yt);
        // Program q sends g*x + g*x = 2gx exactly; the sum is in program order from zero.
        let want: Vec<f64> = (0..b).map(|l| (0..p).fold(0.0, |s, q| s + 2.0 * cy[q * b + l] * xs[l])).collect();
        let reversed: Vec<f64> = (0..b).map(|l| (0..p).rev().fold(0.0, |s, q| s + 2.0 * cy[q * b + l] * xs[l])).collect();
        assert_ne!(want, reversed, "the order must show in the bits");
        // A zero memory budget: threads wait whenever a finished batch waits for an earlier one.
        for (threads, chunk, budget) in [(1, None, 64 << 20), (2, None, 64 << 20), (3, Some(7), 64 << 20), (5, None, 0), (4, Some(1), 0)] {
            let opts = GradOptions { chunk_programs: chunk, batch_programs: Some(1), memory_budget: budget, ..GradOptions::default() };
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let g = pool.install(|| vjp(&launch, &mem, &[xt], &[(yt, cy.clone())], &opts)).unwrap().inputs.remove(0);
            assert!(
                g.iter().zip(&want).all(|(a, w)| a.to_bits() == w.to_bits()),
                "{threads} threads, chunks of {chunk:?}, budget {budget}"
            );
        }
    }

    #[test]
    fn store_runs_overlap_exactly_when_two_programs_share_an_element() {
        let run = |slot, start, len, program| StoreRun { slot, start, len, program };
        // Abutting runs of two programs; one program overwriting itself; another slot.
        assert!(!stores_overlap(&mut [run(0, 0, 4, 0), run(0, 4, 4, 1), run(0, 5, 2, 1), run(1, 0, 8, 0)]));
        assert!(!stores_overlap(&mut [run(0, 0, 4, 0), run(0, 2, 4, 0), run(1, 3, 1, 1)]));
        assert!(stores_overlap(&mut [run(0, 0, 4, 0), run(0, 3, 1, 1)]));
        // Against brute force on random runs.
        let mut rng = StdRng::seed_from_u64(9);
        for _ in 0..2000 {
            let n = rng.gen_range(1..8);
            let mut runs: Vec<StoreRun> =
                (0..n).map(|_| run(rng.gen_range(0..2), rng.gen_range(0..30), rng.gen_range(1..6), rng.gen_range(0..3))).collect();
            let want = runs.iter().enumerate().any(|(i, a)| {
                runs[..i].iter().any(|b| {
                    a.slot == b.slot && a.program != b.program && a.start < b.start + b.len as i64 && b.start < a.start + a.len as i64
                })
            });
            assert_eq!(stores_overlap(&mut runs), want, "{runs:?}");
        }
    }

    #[test]
    fn activity_follows_loads_through_loops_and_not_constants() {
        let mut b = KernelBuilder::new("act");
        let x = b.ptr_param("x", DType::F32);
        let y = b.ptr_param("y", DType::F32);
        let r = b.arange(0, 8);
        let (c1, c2) = (b.f32(2.0), b.f32(3.0));
        let scale = b.mul(c1, c2);
        let acc0 = b.zeros(&[8], DType::F32);
        let (lo, hi, one) = (b.i32(0), b.i32(4), b.i32(1));
        let out = b.for_range(lo, hi, one, None, &[acc0], |b, i, c| {
            let eight = b.i32(8);
            let base = b.mul(i, eight);
            let o = b.add(base, r);
            let p = b.add(x, o);
            let v = b.load(p, None, None);
            vec![b.add(c[0], v)]
        });
        let scaled = b.mul(out[0], scale);
        let py = b.add(y, r);
        b.store(py, scaled, None);
        let k = b.finish().unwrap();
        let act = active_values(&k);
        assert!(!act[scale.index()] && !act[acc0.index()] && !act[r.index()]);
        assert!(act[out[0].index()] && act[scaled.index()]);
        // The carried accumulator inside the body is active (it receives loads from the second
        // iteration on).
        let body = k.insts.iter().find_map(|d| if let tilegrad_ir::Op::For { body, .. } = d.op { Some(body) } else { None }).unwrap();
        assert!(act[k.block(body).params[1].index()]);
        // The reverse sweep reads the load's pointer and value (an operand of an active add),
        // not the index arithmetic that made the pointer.
        let needs = reverse_needs(&k, &act);
        let ld = k.insts.iter().find(|d| matches!(d.op, tilegrad_ir::Op::Load { .. })).unwrap();
        assert!(needs[ld.args[0].index()] && needs[ld.results[0].index()]);
        let addptr = k.insts.iter().find(|d| matches!(d.op, tilegrad_ir::Op::AddPtr) && d.results[0] == ld.args[0]).unwrap();
        assert!(!needs[addptr.args[1].index()] && !needs[r.index()]);
        let f = k.insts.iter().find(|d| matches!(d.op, tilegrad_ir::Op::For { .. })).unwrap();
        assert!(needs[f.args[0].index()] && needs[f.args[2].index()]);
    }
}
