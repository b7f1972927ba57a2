//! Launching a VJP kernel: its memory (the launch's tensors, shadows seeded with the outputs'
//! cotangents, the loops' tapes), the run, and the cotangents read back from the shadows.

use super::VjpKernel;
use crate::AdError;
use std::collections::BTreeMap;
use tilegrad_ir::{DType, Inst, ParamKind};
use tilegrad_reference::{Arg, Grid, HostTensor, Launch, Memory, TensorId};

/// How long a VJP kernel's tapes are, and how much memory its launch may take (see
/// [`gradient_by_kernel`]).
#[derive(Clone, Copy, Debug)]
pub struct TapeBounds<'a> {
    /// The forward run's largest trip count of each loop
    /// ([`tilegrad_reference::LaunchSummary::max_trips`]), for loops without `max_iters`.
    pub max_trips: &'a BTreeMap<Inst, u64>,
    /// Bytes the launch may take where it runs: its tensors, shadows and tapes.
    pub memory: u64,
}

/// Runs VJP kernel `vk` of `launch`'s kernel: the cotangents of the initial contents of
/// `inputs` (float tensors) given cotangents of the final contents of `outputs`, as
/// [`crate::vjp`] gives them.
///
/// The launch of `vk` runs on a memory of its own ([`VjpPlan`]): `mem`'s tensors shared where
/// `vk` takes them in their dtype, else f64 copies, a shadow per float tensor (the output's
/// cotangent, else zeros) and the loops' tapes. `run` executes each batch of programs (the
/// reference interpreter, or another backend). `mem` must be as the forward found it, and the
/// launch without races between programs.
pub fn gradient_by_kernel(
    vk: &VjpKernel,
    launch: &Launch,
    mem: &Memory,
    inputs: &[TensorId],
    outputs: &[(TensorId, Vec<f64>)],
    bounds: TapeBounds<'_>,
    run: &mut dyn FnMut(&Launch, &mut Memory) -> Result<(), AdError>,
) -> Result<Vec<Vec<f64>>, AdError> {
    let tensors: Vec<PlanInput> = (0..mem.len() as u32).map(|i| PlanInput::of(mem, TensorId(i))).collect();
    let plan = VjpPlan::new(vk, launch, &tensors, bounds)?;
    let mut m = Memory::new();
    for (name, part) in &plan.tensors {
        let t = match *part {
            Part::Primal { of, dtype } => {
                let h = mem.get(of);
                if dtype == h.dtype() {
                    h.clone()
                } else {
                    HostTensor::from_f64_as(dtype, h.shape(), &h.to_f64_vec())
                }
            }
            Part::Shadow { of, dtype } => {
                let h = mem.get(of);
                let data = match outputs.iter().find(|(o, _)| *o == of) {
                    Some((_, g)) if g.len() == h.numel() => g.clone(),
                    Some((_, g)) => {
                        return Err(AdError::Spec(format!(
                            "the cotangent of `{}` has {} elements, the tensor {}",
                            mem.name(of),
                            g.len(),
                            h.numel()
                        )))
                    }
                    None => vec![0.0; h.numel()],
                };
                if dtype == DType::F64 {
                    HostTensor::from_f64(h.shape(), data)
                } else {
                    HostTensor::from_f64_as(dtype, h.shape(), &data)
                }
            }
            // Zeros from a zeroed allocation: a backend that keeps the tape elsewhere never
            // touches them. Every batch reuses it: a slot is written before it is read.
            Part::Tape { dtype, numel } => HostTensor::try_full(dtype, &[numel], 0.0)?,
        };
        m.add(name, t);
    }
    for bl in plan.batches() {
        run(&bl, &mut m)?;
    }
    inputs
        .iter()
        .map(|&t| match plan.shadow_of(t) {
            Some(sh) => Ok(m.get(sh).to_f64_vec()),
            None => Err(AdError::Spec(format!("`{}` is not a float tensor of the launch", mem.name(t)))),
        })
        .collect()
}

/// A tensor of the launch a [`VjpPlan`] is made for: its name, dtype and shape (its contents
/// are the caller's, wherever they are).
#[derive(Clone, Debug)]
pub struct PlanInput {
    /// Name.
    pub name: String,
    /// Dtype.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
}

impl PlanInput {
    /// Tensor `t` of a host memory.
    pub fn of(mem: &Memory, t: TensorId) -> PlanInput {
        let h = mem.get(t);
        PlanInput { name: mem.name(t).to_string(), dtype: h.dtype(), shape: h.shape().to_vec() }
    }

    fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// One tensor of a VJP kernel's launch ([`VjpPlan::tensors`]), by what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The launch's tensor `of`, in `dtype`: the tensor itself where that is its dtype, else
    /// a copy converted to it.
    Primal {
        /// The launch's tensor.
        of: TensorId,
        /// The dtype the VJP kernel takes it in.
        dtype: DType,
    },
    /// The shadow of the launch's float tensor `of`, in `dtype`: seeded with the cotangent of
    /// its final contents (zeros where it has none), it holds the cotangent of its initial
    /// contents after the run.
    Shadow {
        /// The launch's tensor.
        of: TensorId,
        /// The VJP kernel's float dtype.
        dtype: DType,
    },
    /// A loop's tape or checkpoints: scratch of `numel` elements, written before it is read.
    Tape {
        /// Dtype.
        dtype: DType,
        /// Elements.
        numel: usize,
    },
}

/// How a VJP kernel's launch runs, wherever its memory is: the kernel (with checkpoints in its
/// loops where whole tapes do not fit), the tensors of its memory, and its programs in batches
/// whose tapes fit.
///
/// Tapes are sized by `max_iters` or else by `max_trips` (a forward run's largest trip count
/// per loop, as [`tilegrad_reference::LaunchSummary::max_trips`] has it), for as many programs
/// at once as fit in the bounds' memory beside the launch's tensors and shadows (at least one:
/// the programs run in batches, each a launch of its own, in program order).
#[derive(Clone, Debug)]
pub struct VjpPlan {
    /// The VJP kernel that runs.
    pub kernel: VjpKernel,
    /// The tensors of its launch's memory: the `i`th is `TensorId(i)` there, named.
    pub tensors: Vec<(String, Part)>,
    args: Vec<(String, Arg)>,
    grid: Grid,
    batch: u64,
    programs: u64,
    scratch: Vec<String>,
}

impl VjpPlan {
    /// The plan of `vk` (a VJP kernel of `launch`'s kernel) for `launch` over tensors of these
    /// dtypes and shapes (`tensors[i]` is the launch's `TensorId(i)`).
    pub fn new(vk: &VjpKernel, launch: &Launch, tensors: &[PlanInput], bounds: TapeBounds<'_>) -> Result<VjpPlan, AdError> {
        let (parts, args, copies) = plan_tensors(vk, launch, tensors)?;
        let programs = launch.grid().programs();
        let TapeBounds { max_trips, memory } = bounds;
        let caps: Vec<u64> = vk
            .tapes
            .iter()
            .map(|t| match t.max_iters {
                Some(m) => m as u64,
                None => max_trips.get(&t.inst).copied().unwrap_or(0),
            })
            .collect();
        // What the launch's tensors leave of `memory` for the tapes.
        let held: u64 = parts.iter().map(|(_, p)| part_bytes(p, tensors)).sum();
        let room = memory.saturating_sub(held);
        // Where one program's whole tapes do not fit, the loops keep checkpoints instead: a
        // checkpoint a segment, segments of the length that takes the least memory (see
        // `segment`).
        let vk = if room < per_program(vk, &caps, None)? {
            let stored = |name: &str, declared: DType| match launch.args().iter().find(|(n, _)| n == name) {
                Some((_, Arg::Tensor(t))) if tensors[t.0 as usize].dtype.is_float() => tensors[t.0 as usize].dtype,
                _ => declared,
            };
            super::vjp_kernel_checkpointed(launch.kernel(), vk, &stored)?
        } else {
            vk.clone()
        };
        let segments: Vec<u64> = vk
            .tapes
            .iter()
            .zip(&caps)
            .map(|(t, &cap)| {
                let checkpoint = t.checkpoints.as_ref().map_or(0, |c| c.per_checkpoint as u64 * 8);
                segment(cap, t.per_trip as u64 * t.dtype.size_bytes() as u64, checkpoint)
            })
            .collect();
        let per_program = per_program(&vk, &caps, Some(&segments))?;
        // Programs run in batches whose tapes fit; at least one program per batch.
        let batch = match per_program {
            0 => programs,
            p => (room / p).clamp(1, programs.max(1)),
        };
        let mut plan = VjpPlan { kernel: vk, tensors: parts, args, grid: launch.grid(), batch, programs, scratch: Vec::new() };
        plan.bind_shadows(launch, &copies)?;
        plan.add_tapes(&caps, &segments)?;
        Ok(plan)
    }

    /// The tensor of the plan's memory that holds the shadow of the launch's tensor `t`.
    pub fn shadow_of(&self, t: TensorId) -> Option<TensorId> {
        self.tensors.iter().position(|(_, p)| *p == Part::Shadow { of: t, dtype: self.kernel.float }).map(|i| TensorId(i as u32))
    }

    /// The launches of the VJP kernel, a batch of programs each, in order, over the plan's
    /// memory ([`VjpPlan::tensors`]).
    pub fn batches(&self) -> impl Iterator<Item = Launch<'_>> + '_ {
        let mut vl = Launch::new(&self.kernel.kernel, self.grid);
        for (n, a) in &self.args {
            vl = vl.arg(n, *a);
        }
        let (batch, programs) = (self.batch, self.programs);
        (0..programs.div_ceil(batch.max(1))).map(move |i| {
            let (first, end) = (i * batch, ((i + 1) * batch).min(programs));
            let mut bl = vl.clone();
            if let Some(f) = &self.kernel.first_param {
                bl = bl.arg(f, first as i64);
            }
            bl.options(tilegrad_reference::Options {
                scratch: self.scratch.clone(),
                programs: (batch < programs).then_some(first..end),
                ..tilegrad_reference::Options::default()
            })
        })
    }

    /// Binds each shadow parameter of the kernel to its tensor's shadow.
    fn bind_shadows(&mut self, launch: &Launch, copies: &[(TensorId, Option<TensorId>)]) -> Result<(), AdError> {
        for (p, s) in &self.kernel.shadows {
            let t = launch.args().iter().find(|(n, _)| n == p).and_then(|(_, a)| match a {
                Arg::Tensor(t) => Some(*t),
                Arg::Scalar(_) => None,
            });
            let Some(sh) = t.and_then(|t| copies.iter().find(|(o, _)| *o == t)).and_then(|c| c.1) else {
                return Err(AdError::Spec(format!("the launch binds no float tensor to parameter `{p}`")));
            };
            self.args.push((s.clone(), Arg::Tensor(sh)));
        }
        Ok(())
    }

    /// Adds each loop's tape (and checkpoints) for a batch of programs, with its capacity.
    fn add_tapes(&mut self, caps: &[u64], segments: &[u64]) -> Result<(), AdError> {
        let tapes = self.kernel.tapes.clone();
        for ((tape, &cap), &seg) in tapes.iter().zip(caps).zip(segments) {
            let slots = if tape.checkpoints.is_some() { seg } else { cap };
            let id = self.add_tape(&tape.tape, tape.dtype, slots.checked_mul(tape.per_trip as u64), &tape.loc)?;
            self.args.push((tape.tape.clone(), Arg::Tensor(id)));
            self.args.push((tape.capacity_param.clone(), Arg::from(cap as i64)));
            if let Some(c) = &tape.checkpoints {
                let id = self.add_tape(&c.tape, DType::F64, cap.div_ceil(seg).checked_mul(c.per_checkpoint as u64), &tape.loc)?;
                self.args.push((c.tape.clone(), Arg::Tensor(id)));
                self.args.push((c.segment_param.clone(), Arg::from(seg as i64)));
            }
        }
        Ok(())
    }

    /// A tape of `per_program` elements for each program of a batch (at least one element: a
    /// loop may keep nothing, and no device allocation is empty). Tapes are scratch: a backend
    /// that runs elsewhere keeps them there.
    fn add_tape(&mut self, name: &str, dtype: DType, per_program: Option<u64>, loc: &tilegrad_ir::Loc) -> Result<TensorId, AdError> {
        let n = per_program
            .and_then(|x| x.checked_mul(self.batch))
            .and_then(|x| usize::try_from(x).ok())
            .ok_or_else(|| AdError::Spec(format!("{loc}: the loop's tape would hold more than 2^64 values")))?;
        self.scratch.push(name.to_string());
        self.tensors.push((name.to_string(), Part::Tape { dtype, numel: n.max(1) }));
        Ok(TensorId(self.tensors.len() as u32 - 1))
    }
}

/// Each tensor of the launch once, in the order its parameters bind them: the tensor as the VJP
/// kernel takes it and, for floats, its shadow. Returns the parts, the arguments binding the
/// forward's parameters to them, and for each launch tensor its shadow.
#[allow(clippy::type_complexity)]
fn plan_tensors(
    vk: &VjpKernel,
    launch: &Launch,
    tensors: &[PlanInput],
) -> Result<(Vec<(String, Part)>, Vec<(String, Arg)>, Vec<(TensorId, Option<TensorId>)>), AdError> {
    let mut parts: Vec<(String, Part)> = Vec::new();
    let mut copies: Vec<(TensorId, TensorId, Option<TensorId>)> = Vec::new();
    let mut args: Vec<(String, Arg)> = Vec::new();
    let add = |parts: &mut Vec<(String, Part)>, name: String, p: Part| {
        parts.push((name, p));
        TensorId(parts.len() as u32 - 1)
    };
    for (name, a) in launch.args() {
        let a = match a {
            Arg::Tensor(t) => {
                if let Some(&(_, c, _)) = copies.iter().find(|(o, ..)| o == t) {
                    args.push((name.clone(), Arg::Tensor(c)));
                    continue;
                }
                let h = tensors.get(t.0 as usize).ok_or_else(|| AdError::Spec(format!("parameter `{name}`: no tensor {}", t.0)))?;
                let float = h.dtype.is_float();
                let kept = vk.kept.contains(name);
                if kept && launch.args().iter().filter(|(_, b)| b == a).count() > 1 {
                    return Err(AdError::Spec(format!(
                        "the launch binds `{}` to several parameters, `{name}` among them: its VJP kernel must keep no tensor in its dtype (vjp_kernel_for)",
                        h.name
                    )));
                }
                // Tensors in the dtype the kernel takes are shared, not copied (it never writes
                // those it keeps in their dtype and reads).
                let want = match vk.kernel.param(name).map(|p| &p.kind) {
                    Some(ParamKind::Ptr(d)) if float => *d,
                    _ => h.dtype,
                };
                if kept && want != h.dtype {
                    return Err(AdError::Spec(format!(
                        "the VJP kernel reads `{name}` as {want}, the launch binds `{}` of {}: build it for the launch's memory (vjp_kernel_for)",
                        h.name, h.dtype
                    )));
                }
                let c = add(&mut parts, h.name.clone(), Part::Primal { of: *t, dtype: want });
                let sh = float.then(|| add(&mut parts, format!("d_{}", h.name), Part::Shadow { of: *t, dtype: vk.float }));
                copies.push((*t, c, sh));
                Arg::Tensor(c)
            }
            s => *s,
        };
        args.push((name.clone(), a));
    }
    Ok((parts, args, copies.into_iter().map(|(t, _, sh)| (t, sh)).collect()))
}

/// Bytes a part of a plan's memory takes (tapes: none, they are what is sized).
fn part_bytes(p: &Part, tensors: &[PlanInput]) -> u64 {
    match *p {
        Part::Primal { of, dtype } | Part::Shadow { of, dtype } => {
            tensors[of.0 as usize].numel() as u64 * tilegrad_reference::storage_bytes(dtype) as u64
        }
        Part::Tape { .. } => 0,
    }
}

/// The segment length (trips) of a loop of `cap` trips keeping checkpoints that takes the least
/// memory a program: a segment's tape (`trip` bytes a trip) and a checkpoint (`checkpoint`
/// bytes) a segment, `seg * trip + cdiv(cap, seg) * checkpoint`: about `sqrt(cap * checkpoint /
/// trip)`, so that a loop whose checkpoints are larger than what a trip keeps (many carried
/// values, few of them read by the reverse) takes longer segments and fewer checkpoints. The
/// reverse runs each trip's forward once more whatever the length.
fn segment(cap: u64, trip: u64, checkpoint: u64) -> u64 {
    let cap = cap.max(1);
    if trip == 0 {
        return cap;
    }
    let bytes = |seg: u64| seg.saturating_mul(trip).saturating_add(cap.div_ceil(seg).saturating_mul(checkpoint));
    // For each number of segments the shortest length that gives it is the best: the lengths up
    // to about sqrt(cap), and those giving up to about sqrt(cap) segments, cover every number.
    let r = (cap as f64).sqrt() as u64 + 2;
    (1..=r.min(cap)).chain((1..=r).map(|n| cap.div_ceil(n))).min_by_key(|&s| (bytes(s), s)).unwrap_or(cap)
}

/// Bytes a program's slots take on all of `vk`'s tapes (and checkpoints, where it keeps them,
/// with these segment lengths), for loops of these trip counts.
fn per_program(vk: &VjpKernel, caps: &[u64], segments: Option<&[u64]>) -> Result<u64, AdError> {
    let mut total = 0u64;
    for (j, (tape, &cap)) in vk.tapes.iter().zip(caps).enumerate() {
        let seg = segments.map_or(cap, |s| s[j]);
        let (slots, ck) = match &tape.checkpoints {
            Some(c) => (seg, cap.div_ceil(seg.max(1)).checked_mul(c.per_checkpoint as u64).and_then(|x| x.checked_mul(8))),
            None => (cap, Some(0)),
        };
        total = slots
            .checked_mul(tape.per_trip as u64)
            .and_then(|x| x.checked_mul(tape.dtype.size_bytes() as u64))
            .and_then(|x| x.checked_add(ck?))
            .and_then(|x| x.checked_add(total))
            .ok_or_else(|| AdError::Spec(format!("{}: the loop's tape would hold more than 2^64 bytes per program", tape.loc)))?;
    }
    Ok(total)
}

#[cfg(test)]
mod segment_tests {
    use super::segment;

    #[test]
    fn segments_take_the_least_memory() {
        let sizes = [8u64, 16, 24, 40, 64, 100, 520, 4096];
        let pairs: Vec<(u64, u64)> = sizes.iter().flat_map(|&t| sizes.iter().map(move |&c| (t, c))).chain([(0, 16)]).collect();
        for cap in [1u64, 2, 3, 7, 16, 45, 100, 257, 1000, 1023] {
            for &(trip, checkpoint) in &pairs {
                let bytes = |seg: u64| seg * trip + cap.div_ceil(seg) * checkpoint;
                let best = (1..=cap).map(bytes).min().unwrap();
                let s = segment(cap, trip, checkpoint);
                assert!((1..=cap).contains(&s), "cap {cap}: segment {s}");
                assert_eq!(bytes(s), best, "cap {cap}, trip {trip}, checkpoint {checkpoint}: segment {s}");
                // Never more than the square root's choice.
                let sqrt = ((cap as f64).sqrt().ceil() as u64).max(1);
                assert!(bytes(s) <= bytes(sqrt));
            }
        }
    }
}
