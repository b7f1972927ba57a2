//! Loop tapes under a byte budget: what a loop's forward keeps for its reverse sweep, and the
//! reverse sweep that recomputes what was not kept.
//!
//! Each trip of a loop starts from its carried values. The forward keeps them at every
//! `stride`-th trip only ([`Checkpoints`]): when they pass the budget, every other one is dropped
//! and the stride doubles, so a loop of any trip count keeps at most a budget's worth. Within the
//! budget it also keeps each trip's body values (snapshots), and the reverse restores instead of
//! recomputing. The reverse takes segments of `stride` trips last to first: it runs the segment
//! forward again from its checkpoint (recording the segment's own checkpoints, or snapshots, under
//! the same budget), then reverses it, recursively until a trip's carried values are at hand.
//! Memory is the budget per level of recursion (a few levels for any trip count); time is one more
//! forward run per level.
//!
//! The tapes of loops nested in a trip belong to that trip: kept with its snapshot (and counted
//! in it), else dropped as the trip ends, since the reverse runs the trip again before sweeping it.

use super::{Instance, Program, V};
use crate::{AdError, BTile};
use tilegrad_ir::{Block, Value};

/// The body values of one trip that the reverse sweep reads.
pub(super) type Snap = Vec<(Value, V)>;

/// Bytes that a list of values holds (data and a fixed allowance per tile).
fn bytes_of<'v>(vals: impl IntoIterator<Item = &'v V>) -> usize {
    vals.into_iter().map(|v| v.num().data.len() * 8 + 64).sum()
}

/// The carried values of a loop at trips `first`, `first + stride`, `first + 2 stride`, ...,
/// thinned (the stride doubled) whenever they pass `limit` bytes (down to two of them).
pub(super) struct Checkpoints {
    first: u64,
    /// Trips run: the checkpoints cover trips `first..end`.
    end: u64,
    stride: u64,
    entries: Vec<Vec<V>>,
    bytes: usize,
    limit: usize,
}

impl Checkpoints {
    pub(super) fn new(first: u64, limit: usize) -> Checkpoints {
        Checkpoints { first, end: first, stride: 1, entries: Vec::new(), bytes: 0, limit }
    }

    /// Trip `t` (the next one: `t == end`) starts from `carried`.
    pub(super) fn record(&mut self, t: u64, carried: &[V]) {
        debug_assert_eq!(t, self.end);
        self.end = t + 1;
        if (t - self.first) % self.stride != 0 {
            return;
        }
        self.bytes += bytes_of(carried);
        self.entries.push(carried.to_vec());
        // Two checkpoints at least, so that each segment is shorter than the trips they cover
        // (the reverse makes progress whatever the limit).
        while self.bytes > self.limit && self.entries.len() > 2 {
            self.thin();
        }
    }

    /// Keeps every other checkpoint (trips `first + 2 k stride`).
    fn thin(&mut self) {
        let kept: Vec<Vec<V>> = std::mem::take(&mut self.entries).into_iter().step_by(2).collect();
        self.bytes = kept.iter().map(bytes_of).sum();
        self.entries = kept;
        self.stride *= 2;
    }

    /// Trips recorded.
    pub(super) fn trips(&self) -> u64 {
        self.end - self.first
    }

    /// Bytes held.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The last checkpoint and the trips it starts (`first..end` of its segment), taken off.
    fn pop_segment(&mut self) -> Option<(u64, u64, Vec<V>)> {
        let v = self.entries.pop()?;
        let a = self.first + self.entries.len() as u64 * self.stride;
        let b = self.end.min(a + self.stride);
        self.end = a;
        self.bytes -= bytes_of(&v);
        Some((a, b, v))
    }
}

/// How one trip of a loop runs: its body, and for `for` loops where the induction variable
/// starts and how it steps.
#[derive(Clone, Copy)]
pub(super) enum Trip {
    For { body: Block, lo: i64, st: i64 },
    While { body: Block },
}

impl Trip {
    fn body(self) -> Block {
        match self {
            Trip::For { body, .. } | Trip::While { body } => body,
        }
    }
}

/// What a loop keeps for its reverse while it runs forward, trip by trip.
pub(super) struct Recorder {
    pub(super) checkpoints: Checkpoints,
    /// Every trip's snapshot so far, while within the budget.
    pub(super) snaps: Option<Vec<Snap>>,
    /// Tapes of loops nested in the trips snapshotted so far (they go with the snapshots).
    nested: Vec<Instance>,
    /// Snapshot bytes are counted in the program's total (the forward sweep) rather than here
    /// (a segment run again in the reverse sweep, under a budget of its own).
    global: bool,
    snap_bytes: usize,
    /// Where this trip's nested tapes start in the program's log of tapes.
    mark: usize,
}

impl Program<'_> {
    /// Bytes of carried values (and of snapshots) a loop may keep: the tape budget of the batch.
    pub(super) fn tape_limit(&self) -> usize {
        self.sh.tape_budget * self.pids.len()
    }

    /// A recorder for a loop's forward run from trip `first`; snapshots are taken unless
    /// replaying (`snapshots`), counted in the program's total when `global`.
    pub(super) fn recorder(&self, first: u64, snapshots: bool, global: bool) -> Recorder {
        let snaps = snapshots.then(Vec::new);
        Recorder { checkpoints: Checkpoints::new(first, self.tape_limit()), snaps, nested: Vec::new(), global, snap_bytes: 0, mark: 0 }
    }

    /// Before trip `t`: records its carried values.
    pub(super) fn begin_trip(&mut self, rec: &mut Recorder, t: u64, carried: &[V]) {
        rec.checkpoints.record(t, carried);
        rec.mark = self.tape_log.len();
    }

    /// After a trip: keeps its body values (`values`, those the reverse reads) and nested tapes in
    /// a snapshot while within the budget; otherwise drops the nested tapes.
    pub(super) fn end_trip(&mut self, rec: &mut Recorder, values: &[Value]) {
        let nested: Vec<Instance> = self.tape_log.drain(rec.mark..).collect();
        let Some(sn) = &mut rec.snaps else {
            self.drop_tapes(&nested);
            return;
        };
        let needs = self.sh.needs;
        let snap: Snap = values.iter().filter_map(|&v| self.env[v.index()].take().filter(|_| needs[v.index()]).map(|x| (v, x))).collect();
        let bytes =
            bytes_of(snap.iter().map(|(_, x)| x)) + nested.iter().filter_map(|k| self.tapes.get(k)).map(|c| c.bytes()).sum::<usize>();
        let used = if rec.global { self.snap_bytes } else { rec.snap_bytes };
        if used + bytes <= self.tape_limit() {
            sn.push(snap);
            rec.nested.extend(nested);
            *(if rec.global { &mut self.snap_bytes } else { &mut rec.snap_bytes }) += bytes;
            return;
        }
        // Over budget: this loop is recomputed in reverse instead.
        let held = bytes_of(rec.snaps.take().iter().flatten().flatten().map(|(_, x)| x))
            + rec.nested.iter().filter_map(|k| self.tapes.get(k)).map(|c| c.bytes()).sum::<usize>();
        if rec.global {
            self.snap_bytes = self.snap_bytes.saturating_sub(held);
        }
        let all: Vec<Instance> = std::mem::take(&mut rec.nested).into_iter().chain(nested).collect();
        self.drop_tapes(&all);
    }

    /// Drops the tapes (and snapshots) of loop instances whose trips will be run again.
    fn drop_tapes(&mut self, keys: &[Instance]) {
        for k in keys {
            self.tapes.remove(k);
            if let Some(sn) = self.snaps.remove(k) {
                // Snapshots are the forward sweep's only, counted in the program's total.
                self.snap_bytes = self.snap_bytes.saturating_sub(bytes_of(sn.iter().flatten().map(|(_, x)| x)));
            }
        }
    }

    /// Keeps a finished loop's tape (and snapshots, with the tapes of loops nested in them) for
    /// its reverse, in the log of tapes that the enclosing trip owns. Also while replaying an
    /// outer trip: the reverse of this (inner) loop in that trip needs its tape.
    pub(super) fn keep_tape(&mut self, key: Instance, rec: Recorder) {
        if let Some(sn) = rec.snaps {
            self.snaps.insert(key.clone(), sn);
            self.tape_log.extend(rec.nested);
        }
        self.tape_log.push(key.clone());
        self.tapes.insert(key, rec.checkpoints);
    }

    /// Runs trip `t` of a loop from `carried`, returning the next carried values.
    fn run_trip(&mut self, trip: Trip, t: u64, carried: Vec<V>) -> Result<Vec<V>, AdError> {
        match trip {
            Trip::For { body, lo, st } => self.iterate(body, lo, st, t, carried),
            Trip::While { body } => self.iterate_while(body, t, carried),
        }
    }

    /// Runs trips `a..b` again from `start` (memory ops do not log again), keeping what their
    /// reverse needs under a budget of their own.
    fn rerun(&mut self, trip: Trip, (a, b): (u64, u64), start: Vec<V>) -> Result<(Checkpoints, Option<Vec<Snap>>), AdError> {
        let values = self.body_values(trip.body());
        let saved = self.replay;
        self.replay = true;
        let mut rec = self.recorder(a, true, false);
        let mut carried = start;
        for t in a..b {
            self.begin_trip(&mut rec, t, &carried);
            carried = match self.run_trip(trip, t, carried) {
                Ok(c) => c,
                Err(e) => {
                    self.replay = saved;
                    return Err(e);
                }
            };
            self.end_trip(&mut rec, &values);
        }
        self.replay = saved;
        // The nested tapes kept with the snapshots are the reverse's (it takes them off the map).
        Ok((rec.checkpoints, rec.snaps))
    }

    /// The reverse of the trips that `cp` covers, last to first, from the cotangents of the
    /// carried values after the last one; returns those before the first.
    pub(super) fn reverse_trips(
        &mut self,
        trip: Trip,
        mut cp: Checkpoints,
        snaps: Option<Vec<Snap>>,
        mut cot: Vec<Option<BTile>>,
    ) -> Result<Vec<Option<BTile>>, AdError> {
        if let Some(mut snaps) = snaps.filter(|s| s.len() as u64 == cp.trips()) {
            for t in (cp.first..cp.end).rev() {
                for (v, x) in snaps.pop().expect("one snapshot per trip") {
                    self.env[v.index()] = Some(x);
                }
                cot = self.reverse_trip(trip, t, cot)?;
            }
            return Ok(cot);
        }
        while let Some((a, b, start)) = cp.pop_segment() {
            if b - a == 1 {
                // The trip's carried values are at hand: run it again, then sweep it.
                let saved = (self.replay, self.tape_log.len());
                self.replay = true;
                let r = self.run_trip(trip, a, start);
                self.replay = saved.0;
                self.tape_log.truncate(saved.1);
                r?;
                cot = self.reverse_trip(trip, a, cot)?;
            } else {
                let (sub, sub_snaps) = self.rerun(trip, (a, b), start)?;
                cot = self.reverse_trips(trip, sub, sub_snaps, cot)?;
            }
        }
        Ok(cot)
    }

    /// The reverse of trip `t`, whose body values are in place.
    fn reverse_trip(&mut self, trip: Trip, t: u64, cot: Vec<Option<BTile>>) -> Result<Vec<Option<BTile>>, AdError> {
        let k = self.sh.kernel;
        let body = trip.body();
        let yields = k.block(body).insts.last().map(|&l| k.inst(l).args.clone()).unwrap_or_default();
        for (y, c) in yields.iter().zip(cot) {
            if let Some(c) = c {
                self.add_cot(*y, c);
            }
        }
        self.path.push(t as u32);
        let r = self.reverse_block(body);
        self.path.pop();
        r?;
        // A `for` body's first parameter is the induction variable, carried by no one.
        let params = &k.block(body).params;
        let carried = match trip {
            Trip::For { .. } => &params[1..],
            Trip::While { .. } => &params[..],
        };
        Ok(carried.iter().map(|&p| self.take_cot(p)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn carried(t: u64) -> Vec<V> {
        vec![V::Num(BTile::new(1, &[], vec![t as f64]))]
    }

    #[test]
    fn checkpoints_stay_within_their_limit_and_cover_every_trip_once() {
        for (trips, limit) in [(1, 0), (7, 1000), (1000, 72 * 10), (4097, 72 * 33), (50, 1 << 20)] {
            let mut cp = Checkpoints::new(5, limit);
            let mut most = 0;
            for t in 5..5 + trips {
                cp.record(t, &carried(t));
                most = most.max(cp.bytes());
                assert!(cp.bytes() <= limit.max(2 * 72), "{trips} trips, limit {limit}: {} bytes", cp.bytes());
            }
            // Segments, last to first, tile the trips and start from their own trip's values.
            let mut next = 5 + trips;
            let segments = (trips > 1).then_some(cp.entries.len());
            while let Some((a, b, v)) = cp.pop_segment() {
                assert_eq!(b, next, "{trips} trips, limit {limit}");
                assert!(a < b && (b - a < trips || trips == 1));
                assert_eq!(v[0].num().data[0], a as f64);
                next = a;
            }
            assert_eq!((next, cp.bytes()), (5, 0));
            assert!(most > 0);
            assert!(segments.is_none_or(|s| s >= 2));
        }
    }
}
