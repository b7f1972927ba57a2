//! The vector-Jacobian product of a whole launch.
//!
//! A launch maps the initial contents of its input tensors to the final contents of its output
//! tensors. Given cotangents of the outputs, [`vjp`] returns cotangents of the inputs, with the
//! design's semantics: an element's final value comes from its last writer (whose stored value
//! receives the cotangent); an element no program stores passes its cotangent through to its
//! initial value (in-place tensors); `atomic_add` passes it through and to every contribution; a
//! load sends its cotangent to the element it read. Programs are differentiated in parallel and
//! their contributions summed in program order, so the result does not depend on the thread
//! count.

use crate::graph::{active_values, KernelGraph};
use crate::program::{Contrib, Initial, Program, ProgramGrad, Shared, SlotData, V};
use crate::rules::Precision;
use crate::{AdError, BTile};
use rayon::prelude::*;
use std::collections::BTreeMap;
use tilegrad_ir::{DType, Inst, ParamKind, Type};
use tilegrad_reference::{Arg, Launch, Memory, TensorId};

/// Options of a gradient computation.
#[derive(Clone, Debug)]
pub struct GradOptions {
    /// f64 ground truth (the default) or the kernel's own dtypes.
    pub precision: Precision,
    /// Memory for the programs in flight (their tapes and pending gradient contributions):
    /// programs are differentiated in parallel chunks sized to it. Default 2 GiB.
    pub memory_budget: usize,
    /// Programs per chunk, overriding the size derived from `memory_budget`.
    pub chunk_programs: Option<usize>,
    /// Bytes of loop-body values each program may keep for its reverse sweep. Within it, loop
    /// bodies are not recomputed; beyond it, the tape holds only each iteration's carried values
    /// and the reverse sweep recomputes the body from them (bounded memory).
    pub tape_budget: usize,
}

impl Default for GradOptions {
    fn default() -> GradOptions {
        GradOptions { precision: Precision::F64, memory_budget: 2 << 30, chunk_programs: None, tape_budget: 16 << 20 }
    }
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
/// The launch is first run by the reference interpreter (on a copy of `mem`), which rejects
/// out-of-bounds accesses, races and loops beyond their `max_iters` with their locations and
/// measures every loop's trip count.
pub fn vjp(
    launch: &Launch,
    mem: &Memory,
    inputs: &[TensorId],
    outputs: &[(TensorId, Vec<f64>)],
    opts: &GradOptions,
) -> Result<Gradient, AdError> {
    let k = launch.kernel();
    tilegrad_ir::verify(k)?;
    let mut scratch = mem.clone();
    let summary = launch.run(&mut scratch)?;
    drop(scratch);

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

    let facts = KernelGraph::build(k, &param_slot).facts();
    let active = active_values(k);
    let num_types: Vec<Type> = k.values.iter().map(|v| if v.ty.is_ptr() { v.ty.with_dtype(DType::I64) } else { v.ty.clone() }).collect();
    let shared = Shared {
        kernel: k,
        facts: &facts,
        active: &active,
        num_types: &num_types,
        slots: &slots,
        params: &params,
        grid: launch.grid().0,
        precision: opts.precision,
        tape_budget: opts.tape_budget,
    };
    let mut grads: Vec<Vec<f64>> = slots.iter().map(|s| if s.is_input { vec![0.0; s.initial.len()] } else { Vec::new() }).collect();
    // Touch the gradients' pages once, in parallel, before accumulation (first-touch faults
    // taken inside the accumulation cost several times more).
    for g in grads.iter_mut() {
        g.par_chunks_mut(RANGE).for_each(|c| c.fill(0.0));
    }
    let mut stored: Vec<Vec<bool>> =
        slots.iter().map(|s| if s.tracks_stores() { vec![false; s.initial.len()] } else { Vec::new() }).collect();
    let mut max_trips: BTreeMap<Inst, u64> = BTreeMap::new();
    let total = launch.grid().programs();
    // Per program in flight: its pending contributions and stores (~24 bytes per element it
    // loads or stores) and at most its tape budget.
    let per_program = (summary.elements_loaded + summary.elements_stored + summary.elements_atomic) / total.max(1) * 24
        + opts.tape_budget.min(64 << 20) as u64
        + 4096;
    let chunk = opts.chunk_programs.map_or_else(|| (opts.memory_budget as u64 / per_program).clamp(1, 1 << 16), |c| c as u64).max(1);
    let mut start = 0;
    while start < total {
        let end = (start + chunk).min(total);
        let outs: Vec<Result<ProgramGrad, AdError>> =
            (start..end).into_par_iter().map(|p| Program::new(&shared, launch.grid().pid(p)).run()).collect();
        let outs: Vec<ProgramGrad> = outs.into_iter().collect::<Result<_, _>>()?;
        accumulate(&mut grads, &outs);
        for out in outs {
            for (s, st) in out.stored.iter().enumerate() {
                if !stored[s].is_empty() {
                    for &e in st {
                        stored[s][e as usize] = true;
                    }
                }
            }
            for (i, t) in out.trips {
                let e = max_trips.entry(i).or_insert(0);
                *e = (*e).max(t);
            }
        }
        start = end;
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
    debug_assert_eq!(max_trips, summary.max_trips);
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

/// Elements per range of a gradient tensor that one task accumulates into.
const RANGE: usize = 1 << 14;

/// Adds the contributions of `outs` (programs in order) into `grads`, in parallel over fixed
/// element ranges of each tensor: each element receives its contributions in program order,
/// whatever the thread count. Contributions are first listed per range they touch (in order).
fn accumulate(grads: &mut [Vec<f64>], outs: &[ProgramGrad]) {
    for (s, g) in grads.iter_mut().enumerate() {
        let mut buckets: Vec<Vec<&Contrib>> = vec![Vec::new(); g.len().div_ceil(RANGE)];
        for c in outs.iter().flat_map(|o| o.contrib.iter()).filter(|c| c.slot as usize == s) {
            for b in &mut buckets[c.lo as usize / RANGE..=c.hi as usize / RANGE] {
                b.push(c);
            }
        }
        g.par_chunks_mut(RANGE).zip(buckets).enumerate().for_each(|(r, (chunk, list))| {
            let (lo, hi) = ((r * RANGE) as i64, (r * RANGE + chunk.len()) as i64);
            for c in list {
                if c.lo >= lo && c.hi < hi {
                    for (&e, &v) in c.elems.iter().zip(&c.vals) {
                        chunk[(e - lo) as usize] += v;
                    }
                } else {
                    for (&e, &v) in c.elems.iter().zip(&c.vals) {
                        if e >= lo && e < hi {
                            chunk[(e - lo) as usize] += v;
                        }
                    }
                }
            }
        });
    }
}
