//! Memory ops of a batch: loads (gathers from the launch's initial memory, or from this
//! program's own earlier stores), stores and atomics (logged as events, never applied), the
//! seeding of stored values' cotangents from the launch-output cotangents, and the reverse of
//! loads (contributions to input gradients, as runs of consecutive elements).

use super::{Initial, Instance, Program, V};
use crate::{AdError, BTile};
use std::collections::HashMap;
use tilegrad_ir::{Inst, Value};

/// A logged store or atomic of one program.
pub(super) struct Event {
    pub(super) slot: u32,
    pub(super) atomic: bool,
    /// Active lanes, as runs in lane order (none spanning two programs).
    pub(super) runs: Vec<LaneRun>,
    /// Values of all lanes of the tile, when a later load of this program may read them.
    pub(super) vals: Vec<f64>,
    /// Lanes of the whole batch.
    pub(super) numel: usize,
    /// Programs the lanes belong to (`numel / batch` lanes each).
    pub(super) batch: usize,
}

impl Event {
    /// Active lanes: (lane, element), in lane order.
    fn lanes(&self) -> impl Iterator<Item = (u32, i64)> + '_ {
        self.runs.iter().flat_map(|r| (0..r.len).map(move |k| (r.lane + k, r.elem + k as i64)))
    }
}

/// Lanes `lane..lane + len` of a store, writing elements `elem..elem + len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LaneRun {
    pub(super) lane: u32,
    pub(super) len: u32,
    pub(super) elem: i64,
}

impl LaneRun {
    fn elems(&self) -> std::ops::Range<i64> {
        self.elem..self.elem + self.len as i64
    }
}

/// The active lanes of a store of offsets `offs` (`per` lanes per program) into a tensor of
/// `len` elements, as maximal runs of consecutive lanes writing consecutive elements within one
/// program; or the first active lane out of bounds.
fn lane_runs(offs: &[f64], mask: Option<&[f64]>, per: usize, len: usize) -> Result<Vec<LaneRun>, usize> {
    let mut runs: Vec<LaneRun> = Vec::new();
    let lim = len as f64;
    for (p, o) in offs.chunks(per).enumerate() {
        let base = p * per;
        match mask {
            None => {
                let mut l = 0;
                while l < o.len() {
                    let (e, n) = (o[l], run_len(o, l));
                    if e < 0.0 {
                        return Err(base + l);
                    }
                    if e + n as f64 > lim {
                        return Err(base + l + (lim - e).max(0.0) as usize);
                    }
                    runs.push(LaneRun { lane: (base + l) as u32, len: n as u32, elem: e as i64 });
                    l += n;
                }
            }
            Some(m) => {
                let own = runs.len();
                for (l, (&e, &m)) in o.iter().zip(&m[base..base + o.len()]).enumerate() {
                    if m == 0.0 {
                        continue;
                    }
                    if e < 0.0 || e >= lim {
                        return Err(base + l);
                    }
                    let (lane, elem) = ((base + l) as u32, e as i64);
                    match runs[own..].last_mut() {
                        Some(r) if r.lane + r.len == lane && r.elem + r.len as i64 == elem => r.len += 1,
                        _ => runs.push(LaneRun { lane, len: 1, elem }),
                    }
                }
            }
        }
    }
    Ok(runs)
}

/// A run of consecutive elements that one program stored, kept for the race check of a
/// self-checking launch (see [`crate::graph::KernelFacts::self_checking`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct StoreRun {
    pub slot: u32,
    pub start: i64,
    pub len: u32,
    /// The program's linear index in the launch.
    pub program: u64,
}

/// Where each lane of a load came from, when some lane read this program's own store.
pub(super) type Provenance = Vec<Option<(u32, u32)>>;

/// The cotangents one load of a batch sends to the initial contents of an input tensor, as runs
/// of consecutive elements (tiles of rows are a few long runs: the accumulation adds slices).
pub(crate) struct Contrib {
    pub slot: u32,
    /// (first element, length) of each run, in lane order.
    pub runs: Vec<(i64, u32)>,
    /// Cotangents, one per element of the runs in order.
    pub vals: Vec<f64>,
}

impl Contrib {
    fn new(slot: u32, n: usize) -> Contrib {
        Contrib { slot, runs: Vec::new(), vals: Vec::with_capacity(n) }
    }

    /// Appends element `e`'s cotangent.
    #[inline]
    fn push(&mut self, e: i64, v: f64) {
        match self.runs.last_mut() {
            Some((s, n)) if *s + *n as i64 == e => *n += 1,
            _ => self.runs.push((e, 1)),
        }
        self.vals.push(v);
    }

    /// Runs of `offs` (one value per element, in order), whose values are `vals`.
    fn dense(slot: u32, offs: &[f64], vals: Vec<f64>) -> Contrib {
        let mut c = Contrib { slot, runs: Vec::new(), vals };
        let mut l = 0;
        while l < offs.len() {
            let n = run_len(offs, l);
            c.runs.push((offs[l] as i64, n as u32));
            l += n;
        }
        c
    }
}

/// The runs of elements (first, length) that loads read, with their batch, kept for their
/// reverse within a byte limit (a loop of many trips would otherwise keep every trip's; beyond
/// it, the reverse finds them again).
#[derive(Default)]
pub(super) struct LoadRuns {
    map: HashMap<Instance, (usize, Vec<(i64, u32)>)>,
    bytes: usize,
}

impl LoadRuns {
    fn cost(runs: &[(i64, u32)]) -> usize {
        runs.len() * 12 + 64
    }

    fn keep(&mut self, key: Instance, batch: usize, runs: Vec<(i64, u32)>, limit: usize) {
        let bytes = Self::cost(&runs);
        if self.bytes + bytes > limit {
            return;
        }
        self.bytes += bytes;
        if let Some((_, old)) = self.map.insert(key, (batch, runs)) {
            self.bytes -= Self::cost(&old);
        }
    }

    fn take(&mut self, key: &Instance) -> Option<(usize, Vec<(i64, u32)>)> {
        let r = self.map.remove(key)?;
        self.bytes -= Self::cost(&r.1);
        Some(r)
    }
}

impl Program<'_> {
    pub(super) fn load(&mut self, i: Inst, has_mask: bool, has_other: bool) -> Result<BTile, AdError> {
        let k = self.sh.kernel;
        let d = k.inst(i);
        let key = self.instance(i);
        // Borrow the operands in place (no copies of the tiles).
        let (env, invariant) = (&self.env, &self.sh.invariant);
        let val = |v: Value| super::lookup(env, invariant, v);
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
        let fast = prov.is_none() && !use_overlay;
        // The fast path writes every lane (in order), the other one lane by lane.
        let mut out = if fast { Vec::with_capacity(n) } else { vec![0.0; n] };
        let mut own: Provenance = Vec::new();
        let mut bad: Option<(usize, i64)> = None;
        let mut atomic_src = false;
        if fast {
            // Every lane reads the launch's initial memory: one tight loop per storage type.
            // A mask with every lane active is no mask.
            let m = mask.filter(|m| m.contains(&0.0));
            let mut runs = Vec::new();
            bad = match &sd.initial {
                Initial::F32(v) => gather_initial(v, offs_data, m, other, &mut out, &mut runs),
                Initial::F64(v) => gather_initial(v, offs_data, m, other, &mut out, &mut runs),
                Initial::Converted(v) => gather_initial(v, offs_data, m, other, &mut out, &mut runs),
            };
            if bad.is_none() && m.is_none() && !runs.is_empty() && runs.len() * 8 <= n {
                let limit = self.tape_limit();
                self.load_runs.keep(key.clone(), br, runs, limit);
            }
        }
        for l in 0..n {
            if fast {
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
        if !self.replay && !own.is_empty() {
            // No provenance means "every lane read the launch's initial memory".
            self.loads.insert(key, own);
        }
        // Memory holds values of the tensor's dtype, so loads need no rounding in native mode.
        Ok(BTile::new(br, &shape, out))
    }

    pub(super) fn store(&mut self, i: Inst, has_mask: bool, atomic: bool) -> Result<(), AdError> {
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
        // A mask with every lane active is no mask.
        let mask = mask_all.as_deref().filter(|m| m.contains(&0.0));
        let sd = &self.sh.slots[slot as usize];
        let n = offs_all.len();
        let per = (n / br.max(1)).max(1);
        let runs = match lane_runs(&offs_all, mask, per, sd.initial.len()) {
            Ok(runs) => runs,
            Err(l) => {
                let e = offs_all[l] as i64;
                let (pid, l) = self.lane_owner(br, numel, l);
                return Err(self.unsupported(i, format!("out-of-bounds store to `{}` at offset {e}, lane {l}, program {pid:?}", sd.name)));
            }
        };
        drop((offs_all, mask_all));
        let ev = self.events.len() as u32;
        let event = Event { slot, atomic, runs, vals, numel: n, batch: br };
        if self.sh.facts.needs_overlay {
            for (l, e) in event.lanes() {
                self.overlay.insert((slot, e), (ev, l));
            }
        }
        if !atomic && sd.tracks_stores() {
            self.out.stored[slot as usize].extend(event.runs.iter().flat_map(|r| r.elems()));
        }
        if !atomic && self.sh.self_check && self.log_store_runs(&event, per) {
            // A race: stop here (the reference describes it).
            let name = &self.sh.slots[slot as usize].name;
            return Err(self.unsupported(i, format!("two lanes of one program store one element of `{name}`")));
        }
        let key = self.instance(i);
        self.event_of.insert(key, ev as usize);
        self.events.push(event);
        Ok(())
    }

    /// Records the runs of elements each program stored with `event` (`per > 0` lanes per
    /// program of its batch), for the race check of a self-checking launch; returns whether the
    /// store's active lanes in one program write one element twice. A store of shared operands
    /// (batch 1) in a batch of several programs is every program's store.
    fn log_store_runs(&mut self, event: &Event, per: usize) -> bool {
        let (first, out) = (self.first, &mut self.out);
        let mut twice = false;
        let writers = if event.batch == 1 { self.pids.len() as u64 } else { 1 };
        let mut at = 0;
        while at < event.runs.len() {
            // The runs of one program: lanes below `bound`.
            let p = event.runs[at].lane as usize / per;
            let bound = ((p + 1) * per) as u32;
            let to = at + event.runs[at..].iter().take_while(|r| r.lane < bound).count();
            let mine = &event.runs[at..to];
            // Runs in increasing, disjoint order of elements cannot write an element twice.
            if !mine.windows(2).all(|w| w[1].elem >= w[0].elem + w[0].len as i64) {
                let mut es: Vec<(i64, i64)> = mine.iter().map(|r| (r.elem, r.elem + r.len as i64)).collect();
                es.sort_unstable();
                twice |= es.windows(2).any(|w| w[1].0 < w[0].1);
            }
            for w in 0..writers {
                let program = first + p as u64 + w;
                for r in mine {
                    match out.store_runs.last_mut() {
                        Some(s) if s.program == program && s.slot == event.slot && s.start + s.len as i64 == r.elem => s.len += r.len,
                        _ => out.store_runs.push(StoreRun { slot: event.slot, start: r.elem, len: r.len, program }),
                    }
                }
            }
            at = to;
        }
        twice
    }

    /// Initial cotangents of every event's values: a store lane that is its element's last
    /// writer in this program receives the launch-output cotangent of that element; every
    /// atomic contribution does.
    pub(super) fn seed_store_cotangents(&mut self) {
        let live = self.live_lanes();
        let mut accs = Vec::with_capacity(self.events.len());
        for (ev, e) in self.events.iter().enumerate() {
            let oc = self.sh.slots[e.slot as usize].out_cot;
            // Programs storing the same value to one element: the last one's store takes it.
            let owned = self.sh.owners.map(|o| &o[e.slot as usize]).filter(|o| !o.is_empty() && !e.atomic);
            let oc = match (oc, owned) {
                (Some(oc), Some(own)) => {
                    let me = self.first as u32;
                    let mut acc = vec![0.0; e.numel];
                    for (l, el) in e.lanes() {
                        if own[el as usize] == me && live.as_ref().is_none_or(|m| m.get(&(e.slot, el)) == Some(&(ev as u32, l))) {
                            acc[l as usize] = oc[el as usize];
                        }
                    }
                    accs.push(acc);
                    continue;
                }
                (oc, _) => oc,
            };
            // Runs (in lane order) covering every lane, each lane its element's last writer:
            // the cotangents are the output cotangent's slices, one after the other.
            if let (Some(oc), true) = (oc, e.atomic || live.is_none()) {
                if e.runs.iter().map(|r| r.len as usize).sum::<usize>() == e.numel {
                    let mut acc = Vec::with_capacity(e.numel);
                    for r in &e.runs {
                        acc.extend_from_slice(&oc[r.elem as usize..r.elem as usize + r.len as usize]);
                    }
                    accs.push(acc);
                    continue;
                }
            }
            let mut acc = vec![0.0; e.numel];
            let Some(oc) = oc else {
                accs.push(acc);
                continue;
            };
            match (&live, e.atomic) {
                (Some(m), false) => {
                    for (l, el) in e.lanes() {
                        if m.get(&(e.slot, el)) == Some(&(ev as u32, l)) {
                            acc[l as usize] += oc[el as usize];
                        }
                    }
                }
                // Every lane receives its element's cotangent: slices of runs.
                _ => {
                    for r in &e.runs {
                        let (l, el, len) = (r.lane as usize, r.elem as usize, r.len as usize);
                        acc[l..l + len].iter_mut().zip(&oc[el..el + len]).for_each(|(a, &o)| *a += o);
                    }
                }
            }
            accs.push(acc);
        }
        self.acc = accs;
    }

    /// The last writer (event, lane) of every element this program stores, or `None` when every
    /// stored lane is its element's last writer (no two stores of this program overlap, which
    /// is checked on sorted runs of elements rather than element by element).
    pub(super) fn live_lanes(&self) -> Option<HashMap<(u32, i64), (u32, u32)>> {
        if self.sh.facts.needs_overlay {
            return Some(self.overlay.clone());
        }
        // One store per tensor cannot overlap itself where races are errors (two lanes of one
        // store writing one element is a race, rejected by the reference run, or by the
        // engine's own check when the store is logged).
        let mut stores: Vec<u32> = self.events.iter().filter(|e| !e.atomic).map(|e| e.slot).collect();
        stores.sort_unstable();
        if self.sh.races_rejected && stores.windows(2).all(|w| w[0] != w[1]) {
            return None;
        }
        let mut runs: Vec<(u32, i64, i64)> =
            self.events.iter().filter(|e| !e.atomic).flat_map(|e| e.runs.iter().map(|r| (e.slot, r.elem, r.elem + r.len as i64))).collect();
        runs.sort_unstable();
        let overlap = runs.windows(2).any(|w| w[0].0 == w[1].0 && w[1].1 < w[0].2);
        if !overlap {
            return None;
        }
        let mut last = HashMap::new();
        for (ev, e) in self.events.iter().enumerate().filter(|(_, e)| !e.atomic) {
            for (l, el) in e.lanes() {
                last.insert((e.slot, el), (ev as u32, l));
            }
        }
        Some(last)
    }

    /// Reverse of a load: its cotangent goes to the elements it read (contributions to an input
    /// tensor's gradient, or this program's earlier stores), and to `other` on masked-off lanes.
    pub(super) fn reverse_load(&mut self, i: Inst, mask: bool, other: bool) -> Result<(), AdError> {
        let k = self.sh.kernel;
        let d = k.inst(i);

        let Some(c) = self.take_cot(d.results[0]) else { return Ok(()) };
        let key = self.instance(i);
        let (env, invariant) = (&self.env, &self.sh.invariant);
        let val = |v: Value| super::lookup(env, invariant, v);
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
        let other_active = other && self.sh.active[d.args[2].index()];
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
                    None => {
                        contrib = match self.load_runs.take(&key) {
                            // The runs the forward load found (for the same lanes).
                            Some((b, runs)) if b == cb => Contrib { slot: slot as u32, runs, vals: c.data },
                            _ => Contrib::dense(slot as u32, offs_data, c.data),
                        }
                    }
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
            push_contrib(&mut self.out.contrib, contrib);
        }
        drop((offs_all, mask_all));
        if let Some(oc) = other_cot {
            let ot = k.ty(d.args[2]);
            self.add_cot(d.args[2], fit_batch(BTile::new(cb, &ot.shape, oc), other_batch));
        }
        Ok(())
    }
}

/// Appends a load's contribution, or adds it to an earlier one of the same elements when only
/// contributions to other tensors came between them (a loop loading one tile each trip keeps
/// one contribution, not one per trip). The sums per element are the same up to association.
fn push_contrib(out: &mut Vec<Contrib>, c: Contrib) {
    for prev in out.iter_mut().rev().take(8) {
        if prev.slot != c.slot {
            continue;
        }
        if prev.runs == c.runs {
            prev.vals.iter_mut().zip(&c.vals).for_each(|(a, b)| *a += b);
            return;
        }
        break;
    }
    out.push(c);
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
pub(super) fn add_batched(a: &BTile, b: &BTile) -> BTile {
    let batch = a.batch.max(b.batch);
    let data = if a.batch == b.batch {
        a.data.iter().zip(&b.data).map(|(x, y)| x + y).collect()
    } else {
        expand(a, batch).iter().zip(expand(b, batch).iter()).map(|(x, y)| x + y).collect()
    };
    BTile::new(batch, &a.shape, data)
}

/// `t += base` elementwise, `base` of `t`'s shape and batch 1 or `t`'s batch (the same sums
/// as [`add_batched`]).
pub(super) fn add_in_place(t: &mut BTile, base: &BTile) {
    let n = base.data.len();
    for row in t.data.chunks_mut(n.max(1)) {
        row.iter_mut().zip(&base.data).for_each(|(x, &b)| *x += b);
    }
}

/// A cotangent computed for every program, brought to a value of batch `b`: summed over the
/// programs when the value is shared by all of them.
pub(super) fn fit_batch(t: BTile, b: usize) -> BTile {
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

/// The length of the run of consecutive elements starting at lane `l` (at least 1). Compared
/// eight lanes at a time against `e + n + 0..8` (a vectorisable test), then lane by lane.
fn run_len(offs: &[f64], l: usize) -> usize {
    let rest = &offs[l..];
    let e = rest[0];
    let mut n = 1;
    while n + 8 <= rest.len() {
        let base = e + n as f64;
        let chunk: &[f64; 8] = rest[n..n + 8].try_into().expect("eight lanes");
        let ok = (0..8).fold(true, |ok, k| ok & (chunk[k] == base + k as f64));
        if !ok {
            break;
        }
        n += 8;
    }
    while n < rest.len() && rest[n] == e + n as f64 {
        n += 1;
    }
    n
}

/// Appends `src[offs[l]]` to `out` (empty) for every active lane (`other`, or 0, for
/// masked-off lanes); returns the first active lane out of bounds (lane, offset), if any.
/// Without a mask, `runs` (empty) receives the runs of consecutive elements read, in order
/// (first element, length), unless a lane is out of bounds.
fn gather_initial<T: Copy + Into<f64>>(
    src: &[T],
    offs: &[f64],
    mask: Option<&[f64]>,
    other: Option<&[f64]>,
    out: &mut Vec<f64>,
    runs: &mut Vec<(i64, u32)>,
) -> Option<(usize, i64)> {
    let other_at = |l: usize| other.map_or(0.0, |o| if o.len() == 1 { o[0] } else { o[l] });
    if mask.is_none() {
        // Runs of consecutive elements (rows of a tile) are copied as slices; the first run
        // out of bounds falls through to the lane-by-lane loop, which names its lane.
        let mut l = 0;
        while l < offs.len() {
            let (e, n) = (offs[l], run_len(offs, l));
            let run = (e >= 0.0).then(|| (e as usize).checked_add(n).and_then(|end| src.get(e as usize..end))).flatten();
            match run {
                Some(run) => crate::simd::wide(|| out.extend(run.iter().map(|&v| v.into()))),
                None => break,
            }
            runs.push((e as i64, n as u32));
            l += n;
        }
        if l == offs.len() {
            return None;
        }
        out.clear();
        runs.clear();
    }
    for (l, &e) in offs.iter().enumerate() {
        if mask.is_some_and(|m| m[l] == 0.0) {
            out.push(other_at(l));
            continue;
        }
        match src.get(e as usize) {
            // A negative offset converts to 0 (`as` saturates): check the sign as well.
            Some(&v) if e >= 0.0 => out.push(v.into()),
            _ => return Some((l, e as i64)),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathers_by_runs_and_names_the_first_lane_out_of_bounds() {
        let src: Vec<f32> = (0..10).map(|x| x as f32 * 0.5).collect();
        let gather = |offs: &[f64], mask: Option<&[f64]>, other: Option<&[f64]>| {
            let (mut out, mut runs) = (Vec::new(), Vec::new());
            let bad = gather_initial(&src, offs, mask, other, &mut out, &mut runs);
            (bad, bad.is_none().then_some(out), runs)
        };
        // Two runs (3..6, 0..2) and a single element.
        let all = Some(vec![1.5, 2.0, 2.5, 0.0, 0.5, 4.5]);
        assert_eq!(gather(&[3.0, 4.0, 5.0, 0.0, 1.0, 9.0], None, None), (None, all, vec![(3, 3), (0, 2), (9, 1)]));
        // A run leaving the tensor, a negative offset, an offset beyond any index.
        assert_eq!(gather(&[7.0, 8.0, 9.0, 10.0, 0.0, 1.0], None, None).0, Some((3, 10)));
        assert_eq!(gather(&[0.0, -1.0, 0.0, 1.0, 2.0, 3.0], None, None).0, Some((1, -1)));
        assert_eq!(gather(&[1e300, 0.0, 0.0, 0.0, 0.0, 0.0], None, None).0, Some((0, i64::MAX)));
        // Masked-off lanes read `other` and are not bounds-checked.
        let mask = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0];
        let want = Some(vec![0.5, -7.0, 1.0, 1.5, -7.0, 2.0]);
        assert_eq!(gather(&[1.0, 99.0, 2.0, 3.0, -5.0, 4.0], Some(&mask), Some(&[-7.0])), (None, want, vec![]));
        assert_eq!(run_len(&[1.0, 2.0, 3.0, 3.0, 4.0], 0), 3);
        assert_eq!(run_len(&[1.0, 2.0, 3.0, 3.0, 4.0], 3), 2);
        // Long runs: whole chunks of eight, a break inside a chunk, a tail.
        let long: Vec<f64> = (0..30).map(|i| if i < 21 { 100.0 + i as f64 } else { i as f64 }).collect();
        assert_eq!((run_len(&long, 0), run_len(&long, 5), run_len(&long, 21)), (21, 16, 9));
        let step: Vec<f64> = (0..40).map(|i| (i + i / 17) as f64).collect();
        assert_eq!((run_len(&step, 0), run_len(&step, 17), run_len(&step, 34)), (17, 17, 6));
    }

    #[test]
    fn contributions_keep_lane_order_in_runs() {
        let c = Contrib::dense(0, &[4.0, 5.0, 6.0, 2.0, 2.0, 3.0], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(c.runs, vec![(4, 3), (2, 1), (2, 2)]);
        let mut m = Contrib::new(1, 4);
        for (e, v) in [(7, 1.0), (8, 2.0), (3, 3.0), (4, 4.0)] {
            m.push(e, v);
        }
        assert_eq!((m.runs, m.vals), (vec![(7, 2), (3, 2)], vec![1.0, 2.0, 3.0, 4.0]));
    }

    #[test]
    fn store_lane_runs_match_the_active_lanes_and_name_the_first_lane_out_of_bounds() {
        use rand::{rngs::StdRng, Rng, SeedableRng};
        let mut r = StdRng::seed_from_u64(7);
        for case in 0..500 {
            let (per, programs, len) = (r.gen_range(1..20), r.gen_range(1..4), r.gen_range(1..60));
            // Mostly consecutive offsets, with jumps, repeats and a few out of bounds.
            let mut e: i64 = r.gen_range(-2..len as i64);
            let offs: Vec<f64> = (0..per * programs)
                .map(|_| {
                    e = if r.gen_bool(0.8) { e + 1 } else { r.gen_range(-1..len as i64 + 2) };
                    e as f64
                })
                .collect();
            let mask: Option<Vec<f64>> = r.gen_bool(0.5).then(|| (0..offs.len()).map(|_| r.gen_bool(0.8) as i64 as f64).collect());
            let active = |l: usize| mask.as_ref().is_none_or(|m| m[l] != 0.0);
            let first_bad = (0..offs.len()).find(|&l| active(l) && (offs[l] < 0.0 || offs[l] >= len as f64));
            match (lane_runs(&offs, mask.as_deref(), per, len), first_bad) {
                (Err(l), Some(b)) => assert_eq!(l, b, "case {case}"),
                (Ok(runs), None) => {
                    let lanes: Vec<(u32, i64)> =
                        runs.iter().flat_map(|r| (0..r.len).map(move |k| (r.lane + k, r.elem + k as i64))).collect();
                    let want: Vec<(u32, i64)> = (0..offs.len()).filter(|&l| active(l)).map(|l| (l as u32, offs[l] as i64)).collect();
                    assert_eq!(lanes, want, "case {case}");
                    for w in runs.windows(2) {
                        // No run spans two programs; neighbours in one program are not mergeable.
                        assert_eq!(w[0].lane as usize / per, (w[0].lane + w[0].len - 1) as usize / per, "case {case}");
                        let same = w[0].lane as usize / per == w[1].lane as usize / per;
                        assert!(!(same && w[0].lane + w[0].len == w[1].lane && w[0].elem + w[0].len as i64 == w[1].elem), "case {case}");
                    }
                }
                (got, want) => panic!("case {case}: {got:?} against first bad lane {want:?}"),
            }
        }
    }
}
