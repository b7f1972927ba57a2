//! Execution of a launch: programs run in parallel in chunks; their logged writes are committed
//! in program order (so results do not depend on the thread count), and races are found from the
//! access sets: a per-element owner table for stores and atomics, checked against every logged
//! load.

mod ops;
mod plan;
mod program;
mod tile;

pub use ops::round_tf32;

use crate::error::{ExecError, Race, RaceKind, Site};
use crate::launch::{Bound, Launch, LaunchSummary, Memory, RaceMode, TensorId};
use crate::tensor::{Data, HostTensor};
use program::{lit_data, Program, ProgramOut, Shared, Slot};
use rayon::prelude::*;
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
    /// Linear program id of the programs that atomically updated each element (MANY if several).
    atomic_owner: Vec<u32>,
    atomic_inst: Vec<u32>,
}

pub(crate) fn execute(l: &Launch, bound: &[Bound], mem: &mut Memory) -> Result<LaunchSummary, ExecError> {
    let k = l.kernel;
    let plan = plan::Plan::new(k);
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
    for (j, s) in param_slot.iter().enumerate() {
        if let Some(s) = s {
            slot_written[*s as usize] |= plan.param_written[j];
        }
    }
    let params: Vec<RV> = bound
        .iter()
        .zip(&param_slot)
        .map(|(b, s)| match b {
            Bound::Tensor(_) => RV::Ptr(PtrTile {
                slot: s.expect("tensor params have slots"),
                offs: Tile::scalar(DType::I64, Data::I64(vec![0])),
            }),
            Bound::Scalar(lit, dt) => RV::Num(Tile::scalar(*dt, lit_data(*lit, *dt))),
        })
        .collect();
    let mut commits: Vec<Option<Commit>> = slot_ids
        .iter()
        .zip(&slot_written)
        .map(|(t, &w)| {
            w.then(|| {
                let n = mem.get(*t).numel();
                Commit {
                    data: mem.get(*t).data().clone(),
                    owner: vec![NONE; n],
                    owner_inst: vec![NONE; n],
                    atomic_owner: vec![NONE; n],
                    atomic_inst: vec![NONE; n],
                }
            })
        })
        .collect();

    let mut summary = LaunchSummary { programs: l.grid.programs(), ..Default::default() };
    let mut reads: Vec<(u32, Vec<program::SlotLog>)> = Vec::new();
    {
        let shared = Shared {
            kernel: k,
            plan: &plan,
            slots: slot_ids
                .iter()
                .zip(&slot_written)
                .map(|(t, &w)| {
                    let ten = mem.get(*t);
                    Slot { name: mem.name(*t).to_string(), dtype: ten.dtype(), initial: ten.data(), written: w }
                })
                .collect(),
            params,
            grid: l.grid.0,
        };
        let total = l.grid.programs();
        let chunk = l.options.chunk_programs.max(1) as u64;
        let mut start = 0u64;
        while start < total {
            let end = (start + chunk).min(total);
            let outs: Vec<Result<ProgramOut, ExecError>> =
                (start..end).into_par_iter().map(|p| Program::new(&shared, l.grid.pid(p)).run()).collect();
            for (off, out) in outs.into_iter().enumerate() {
                let p = (start + off as u64) as u32;
                let out = out?;
                summary.elements_loaded += out.loaded;
                summary.elements_stored += out.stored;
                summary.elements_atomic += out.atomic;
                for (inst, t) in &out.trips {
                    let e = summary.max_trips.entry(*inst).or_insert(0);
                    *e = (*e).max(*t);
                }
                let mut logs = out.logs;
                for (s, log) in logs.iter_mut().enumerate() {
                    if let Some(c) = commits[s].as_mut() {
                        commit(k, l, &shared.slots[s], c, p, log, &mut summary.races)?;
                    }
                }
                if logs.iter().any(|g| !g.reads.is_empty()) {
                    logs.iter_mut().for_each(|g| g.events = Vec::new());
                    reads.push((p, logs));
                }
            }
            start = end;
        }
        // Loads against the final owner tables.
        for (p, logs) in &reads {
            for (s, log) in logs.iter().enumerate() {
                let Some(c) = commits[s].as_ref() else { continue };
                for r in &log.reads {
                    for &o in &r.offs {
                        let o = o as usize;
                        let (w, wi) = if c.owner[o] != NONE && c.owner[o] != *p {
                            (c.owner[o], c.owner_inst[o])
                        } else if c.atomic_owner[o] != NONE && c.atomic_owner[o] != *p {
                            (c.atomic_owner[o], c.atomic_inst[o])
                        } else {
                            continue;
                        };
                        let race = Race {
                            kind: RaceKind::ReadWrite,
                            tensor: shared.slots[s].name.clone(),
                            offset: o as i64,
                            first: site(k, l, w, wi),
                            second: site(k, l, *p, r.inst.0),
                        };
                        match l.options.races {
                            RaceMode::Error => return Err(ExecError::Race(Box::new(race))),
                            RaceMode::Warn => {
                                summary.races.push(race);
                                break;
                            }
                        }
                    }
                }
            }
        }
    }
    for (s, c) in commits.into_iter().enumerate() {
        if let Some(c) = c {
            let t = mem.get(slot_ids[s]);
            let nt = HostTensor::new(t.dtype(), &t.shape().to_vec(), c.data)?;
            mem.set(slot_ids[s], nt);
        }
    }
    Ok(summary)
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

/// Applies one program's logged writes to a tensor, checking for conflicts with earlier programs.
fn commit(
    k: &Kernel,
    l: &Launch,
    slot: &Slot,
    c: &mut Commit,
    p: u32,
    log: &program::SlotLog,
    races: &mut Vec<Race>,
) -> Result<(), ExecError> {
    for e in &log.events {
        for (lane, &o) in e.offs.iter().enumerate() {
            let o = o as usize;
            let conflict = if e.atomic {
                (c.owner[o] != NONE && c.owner[o] != p).then(|| (RaceKind::StoreAtomic, c.owner[o], c.owner_inst[o]))
            } else if c.owner[o] != NONE && c.owner[o] != p {
                Some((RaceKind::WriteWrite, c.owner[o], c.owner_inst[o]))
            } else if c.atomic_owner[o] != NONE && c.atomic_owner[o] != p {
                Some((RaceKind::StoreAtomic, c.atomic_owner[o], c.atomic_inst[o]))
            } else {
                None
            };
            if let Some((kind, q, qi)) = conflict {
                let race = Race {
                    kind,
                    tensor: slot.name.clone(),
                    offset: o as i64,
                    first: site(k, l, if q == MANY { p } else { q }, qi),
                    second: site(k, l, p, e.inst.0),
                };
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
                c.atomic_owner[o] = if c.atomic_owner[o] == NONE || c.atomic_owner[o] == p { p } else { MANY };
                c.atomic_inst[o] = e.inst.0;
                add_into(&mut c.data, o, &e.vals, lane, slot.dtype);
            } else {
                c.owner[o] = p;
                c.owner_inst[o] = e.inst.0;
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

fn add_into(d: &mut Data, o: usize, v: &Data, lane: usize, dtype: DType) {
    match (d, v) {
        (Data::I1(d), Data::I1(v)) => d[o] |= v[lane],
        (Data::I32(d), Data::I32(v)) => d[o] = d[o].wrapping_add(v[lane]),
        (Data::I64(d), Data::I64(v)) => d[o] = d[o].wrapping_add(v[lane]),
        (Data::F32(d), Data::F32(v)) => {
            let mut s = [d[o] + v[lane]];
            ops::round_narrow(dtype, &mut s);
            d[o] = s[0];
        }
        (Data::F64(d), Data::F64(v)) => d[o] += v[lane],
        _ => unreachable!("the verifier checked atomic values have the pointee dtype"),
    }
}
