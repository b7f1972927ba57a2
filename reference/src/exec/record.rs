//! Recording one program instance: the value of every op it ran (the last execution of each, or
//! the execution current when a chosen store last wrote a chosen element), and every op whose
//! result became non-finite from finite operands. Reports use it to explain a wrong element: the
//! data-flow slice of the element is walked over the kernel's def-use chains with these values.

use super::tile::{Tile, RV};
use crate::launch::TensorId;
use crate::tensor::Data;
use std::sync::Arc;
use tilegrad_ir::{Inst, Kernel, Op, Value};

/// The value an op produced in a recorded program.
#[derive(Clone, Debug, PartialEq)]
pub enum Recorded {
    /// A numeric tile (booleans as 0/1, integers as f64), row-major with `shape`.
    Num {
        /// Shape of the tile (empty for a scalar).
        shape: Vec<usize>,
        /// Elements.
        data: Arc<Vec<f64>>,
    },
    /// A pointer tile: a tensor of the launch's memory and element offsets into it.
    Ptr {
        /// The tensor.
        tensor: TensorId,
        /// Shape of the tile.
        shape: Vec<usize>,
        /// Offsets, row-major.
        offsets: Arc<Vec<i64>>,
    },
}

impl Recorded {
    /// Element `lane` as f64 (a pointer's offset for pointers).
    pub fn at(&self, lane: usize) -> f64 {
        match self {
            Recorded::Num { data, .. } => data.get(lane).or(data.first()).copied().unwrap_or(f64::NAN),
            Recorded::Ptr { offsets, .. } => offsets.get(lane).or(offsets.first()).map_or(f64::NAN, |&o| o as f64),
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        match self {
            Recorded::Num { shape, .. } | Recorded::Ptr { shape, .. } => shape,
        }
    }
}

/// An op whose result became non-finite (NaN or infinite) although its operands were finite at
/// the lanes that produced it (an overflowing `exp`, a division by zero), or a load that read a
/// non-finite value.
#[derive(Clone, Debug, PartialEq)]
pub struct NonFinite {
    /// The op.
    pub inst: Inst,
    /// Position of this execution among all the ops the program ran (program order).
    pub seq: u64,
    /// The lanes that became non-finite (flat, row-major), at most 64.
    pub lanes: Vec<u32>,
    /// The result at the first of them.
    pub result: f64,
    /// The numeric operands at the first of them.
    pub operands: Vec<f64>,
}

/// What [`crate::Launch::record_program`] saw one program do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProgramRecord {
    /// By value: what it held (see the launch's documentation for which execution).
    pub values: Vec<Option<Recorded>>,
    /// The first execution of each op whose result became non-finite from finite operands, in
    /// program order (loads: the first that read a non-finite value).
    pub nonfinite: Vec<NonFinite>,
    /// The lane of the target store that wrote the target element, when it did.
    pub target_lane: Option<usize>,
    /// Sequence number of the target store's execution that last wrote the target element.
    pub target_seq: Option<u64>,
}

/// The recorder a program carries while it runs.
#[derive(Default)]
pub(crate) struct Recorder {
    pub values: Vec<Option<Recorded>>,
    pub frozen: Option<Vec<Option<Recorded>>>,
    pub nonfinite: Vec<NonFinite>,
    pub seq: u64,
    /// (store instruction, slot, element offset) whose last write freezes the values.
    pub target: Option<(Inst, u32, i64)>,
    pub target_lane: Option<usize>,
    pub target_seq: Option<u64>,
    /// Slot -> tensor of the launch's memory.
    pub slot_tensor: Vec<TensorId>,
}

fn to_f64(d: &Data) -> Vec<f64> {
    (0..d.len()).map(|i| d.get_f64(i)).collect()
}

fn is_float(d: &Data) -> bool {
    matches!(d, Data::F32(_) | Data::F64(_))
}

impl Recorder {
    fn convert(&self, v: &RV) -> Recorded {
        match v {
            RV::Num(t) => Recorded::Num { shape: t.shape.to_vec(), data: Arc::new(to_f64(&t.materialize())) },
            RV::Ptr(p) => {
                let o = p.offs.materialize();
                Recorded::Ptr {
                    tensor: self.slot_tensor[p.slot as usize],
                    shape: p.offs.shape.to_vec(),
                    offsets: Arc::new((0..o.len()).map(|i| o.get_f64(i) as i64).collect()),
                }
            }
        }
    }

    /// Records instruction `i` of `k` after it ran; `get` reads the program's values.
    pub fn after(&mut self, k: &Kernel, i: Inst, get: &dyn Fn(Value) -> Option<RV>) {
        self.seq += 1;
        let d = k.inst(i);
        for &r in &d.results {
            if let Some(v) = get(r) {
                let rec = self.convert(&v);
                self.values[r.index()] = Some(rec);
            }
        }
        match &d.op {
            Op::Store { .. } | Op::AtomicAdd { .. } => self.check_target(k, i, get),
            _ => self.check_nonfinite(k, i, get),
        }
    }

    fn check_target(&mut self, k: &Kernel, i: Inst, get: &dyn Fn(Value) -> Option<RV>) {
        let Some((ti, slot, off)) = self.target else { return };
        if ti != i {
            return;
        }
        let d = k.inst(i);
        let Some(RV::Ptr(p)) = get(d.args[0]) else { return };
        if p.slot != slot {
            return;
        }
        let offs = p.offs.materialize();
        let mask = d.args.get(2).and_then(|&m| match get(m) {
            Some(RV::Num(t)) => Some(t.materialize()),
            _ => None,
        });
        let hit = (0..offs.len()).rev().find(|&l| offs.get_f64(l) as i64 == off && mask.as_ref().is_none_or(|m| m.get_f64(l) != 0.0));
        if let Some(l) = hit {
            // Values used by the store itself are the ones live now.
            for &a in &d.args {
                if let Some(v) = get(a) {
                    let rec = self.convert(&v);
                    self.values[a.index()] = Some(rec);
                }
            }
            self.frozen = Some(self.values.clone());
            self.target_lane = Some(l);
            self.target_seq = Some(self.seq);
        }
    }

    fn check_nonfinite(&mut self, k: &Kernel, i: Inst, get: &dyn Fn(Value) -> Option<RV>) {
        let d = k.inst(i);
        if d.results.is_empty() || self.nonfinite.iter().any(|n| n.inst == i) {
            return;
        }
        let Some(RV::Num(res)) = get(d.results[0]) else { return };
        let rd = res.materialize();
        if !is_float(&rd) {
            return;
        }
        let bad: Vec<usize> = (0..rd.len()).filter(|&l| !rd.get_f64(l).is_finite()).collect();
        if bad.is_empty() {
            return;
        }
        let n = rd.len();
        let operands: Vec<Tile> = d
            .args
            .iter()
            .filter_map(|&a| match get(a) {
                Some(RV::Num(t)) => Some(t),
                _ => None,
            })
            .collect();
        let ops: Vec<Arc<Data>> = operands.iter().map(|t| t.materialize()).collect();
        let lanewise = ops.iter().all(|o| o.len() == n || o.len() == 1);
        let elementwise = matches!(d.op, Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast);
        let at = |o: &Arc<Data>, l: usize| o.get_f64(if o.len() == 1 { 0 } else { l });
        let lanes: Vec<usize> = if let Op::Load { .. } = d.op {
            bad
        } else if elementwise && lanewise {
            let sel = |l: usize| match d.op {
                // `where` uses only the branch it selects.
                Op::Where if ops.len() == 3 => {
                    let pick = if at(&ops[0], l) != 0.0 { 1 } else { 2 };
                    at(&ops[pick], l).is_finite()
                }
                _ => ops.iter().all(|o| at(o, l).is_finite()),
            };
            bad.into_iter().filter(|&l| sel(l)).collect()
        } else if ops.iter().all(|o| (0..o.len()).all(|l| o.get_f64(l).is_finite())) {
            bad
        } else {
            Vec::new()
        };
        let Some(&first) = lanes.first() else { return };
        self.nonfinite.push(NonFinite {
            inst: i,
            seq: self.seq,
            lanes: lanes.iter().take(64).map(|&l| l as u32).collect(),
            result: rd.get_f64(first),
            operands: ops.iter().map(|o| if o.len() == n || o.len() == 1 { at(o, first) } else { f64::NAN }).collect(),
        });
    }

    pub fn finish(self) -> ProgramRecord {
        let values = self.frozen.unwrap_or(self.values);
        let nonfinite = match self.target_seq {
            Some(s) => self.nonfinite.into_iter().filter(|n| n.seq <= s).collect(),
            None => self.nonfinite,
        };
        ProgramRecord { values, nonfinite, target_lane: self.target_lane, target_seq: self.target_seq }
    }
}
