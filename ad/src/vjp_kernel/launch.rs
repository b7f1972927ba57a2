//! Launching a VJP kernel: its memory (the launch's tensors, shadows seeded with the outputs'
//! cotangents, the loops' tapes), the run, and the cotangents read back from the shadows.

use super::VjpKernel;
use crate::AdError;
use std::collections::BTreeMap;
use tilegrad_ir::{DType, Inst, ParamKind};
use tilegrad_reference::{Arg, HostTensor, Launch, Memory, TensorId};

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
/// The launch of `vk` runs on a memory of its own: `mem`'s tensors shared where `vk` takes
/// them in their dtype, else f64 copies, a shadow per float tensor (the output's cotangent, else zeros)
/// and the loops' tapes, sized by `max_iters` or else by `max_trips` (a forward run's largest
/// trip count per loop, as [`tilegrad_reference::LaunchSummary::max_trips`] has it), for as
/// many programs at once as fit in `memory` bytes beside the launch's tensors (at least one: the
/// programs run in batches, each a launch of its own, in program order). `run`
/// executes it (the reference interpreter, or another backend). `mem` must be as the forward
/// found it, and the launch without races between programs.
pub fn gradient_by_kernel(
    vk: &VjpKernel,
    launch: &Launch,
    mem: &Memory,
    inputs: &[TensorId],
    outputs: &[(TensorId, Vec<f64>)],
    bounds: TapeBounds<'_>,
    run: &mut dyn FnMut(&Launch, &mut Memory) -> Result<(), AdError>,
) -> Result<Vec<Vec<f64>>, AdError> {
    let mut m = Memory::new();
    // Each tensor of the launch once: its copy and, for floats, its shadow.
    let mut copies: Vec<(TensorId, TensorId, Option<TensorId>)> = Vec::new();
    let mut args: Vec<(String, Arg)> = Vec::new();
    for (name, a) in launch.args() {
        let a = match a {
            Arg::Tensor(t) => {
                let c = match copies.iter().find(|(o, ..)| o == t) {
                    Some(&(_, c, _)) => c,
                    None => {
                        let h = mem.get(*t);
                        let float = h.dtype().is_float();
                        let kept = vk.kept.contains(name);
                        if kept && launch.args().iter().filter(|(_, b)| b == a).count() > 1 {
                            return Err(AdError::Spec(format!(
                                "the launch binds `{}` to several parameters, `{name}` among them: its VJP kernel must keep no tensor in its dtype (vjp_kernel_for)",
                                mem.name(*t)
                            )));
                        }
                        // Tensors in the dtype the kernel takes are shared, not copied (it
                        // never writes those it keeps in their dtype and reads).
                        let want = match vk.kernel.param(name).map(|p| &p.kind) {
                            Some(ParamKind::Ptr(d)) => *d,
                            _ => h.dtype(),
                        };
                        let copy = if !float || want == h.dtype() {
                            h.clone()
                        } else if !kept {
                            HostTensor::from_f64_as(want, h.shape(), &h.to_f64_vec())
                        } else {
                            return Err(AdError::Spec(format!(
                                "the VJP kernel reads `{name}` as {want}, the launch binds `{}` of {}: build it for the launch's memory (vjp_kernel_for)",
                                mem.name(*t),
                                h.dtype()
                            )));
                        };
                        let c = m.add(mem.name(*t), copy);
                        let sh = if float {
                            let data = match outputs.iter().find(|(o, _)| o == t) {
                                Some((_, g)) if g.len() == h.numel() => g.clone(),
                                Some((_, g)) => {
                                    return Err(AdError::Spec(format!(
                                        "the cotangent of `{}` has {} elements, the tensor {}",
                                        mem.name(*t),
                                        g.len(),
                                        h.numel()
                                    )))
                                }
                                None => vec![0.0; h.numel()],
                            };
                            let sh = if vk.float == DType::F64 {
                                HostTensor::from_f64(h.shape(), data)
                            } else {
                                HostTensor::from_f64_as(vk.float, h.shape(), &data)
                            };
                            Some(m.add(&format!("d_{}", mem.name(*t)), sh))
                        } else {
                            None
                        };
                        copies.push((*t, c, sh));
                        c
                    }
                };
                Arg::Tensor(c)
            }
            s => *s,
        };
        args.push((name.clone(), a));
    }
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
    let held: u64 = (0..m.len() as u32)
        .map(|i| m.get(TensorId(i)))
        .map(|h| h.numel() as u64 * tilegrad_reference::storage_bytes(h.dtype()) as u64)
        .sum();
    let room = memory.saturating_sub(held);
    // Where one program's whole tapes do not fit, the loops keep checkpoints instead: a
    // checkpoint a segment, segments of the length that takes the least memory (see
    // `segment`).
    let rebuilt;
    let vk = if room < per_program(vk, &caps, None)? {
        let stored = |name: &str, declared: DType| match launch.args().iter().find(|(n, _)| n == name) {
            Some((_, Arg::Tensor(t))) if mem.get(*t).dtype().is_float() => mem.get(*t).dtype(),
            _ => declared,
        };
        rebuilt = super::vjp_kernel_checkpointed(launch.kernel(), vk, &stored)?;
        &rebuilt
    } else {
        vk
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
    let per_program = per_program(vk, &caps, Some(&segments))?;
    // Programs run in batches whose tapes fit; at least one program per batch.
    let batch = match per_program {
        0 => programs,
        p => (room / p).clamp(1, programs.max(1)),
    };
    let mut vl = Launch::new(&vk.kernel, launch.grid());
    for (n, a) in &args {
        vl = vl.arg(n, *a);
    }
    for (p, s) in &vk.shadows {
        let t = launch.args().iter().find(|(n, _)| n == p).and_then(|(_, a)| match a {
            Arg::Tensor(t) => Some(*t),
            Arg::Scalar(_) => None,
        });
        let Some(sh) = t.and_then(|t| copies.iter().find(|(o, ..)| *o == t)).and_then(|c| c.2) else {
            return Err(AdError::Spec(format!("the launch binds no float tensor to parameter `{p}`")));
        };
        vl = vl.arg(s, sh);
    }
    // Tapes are scratch: a backend that runs elsewhere keeps them there.
    let mut scratch: Vec<String> = Vec::new();
    for ((tape, &cap), &seg) in vk.tapes.iter().zip(&caps).zip(&segments) {
        let slots = if tape.checkpoints.is_some() { seg } else { cap };
        let mut add = |name: &str, dtype: DType, per_program: Option<u64>| -> Result<TensorId, AdError> {
            let n = per_program
                .and_then(|x| x.checked_mul(batch))
                .and_then(|x| usize::try_from(x).ok())
                .ok_or_else(|| AdError::Spec(format!("{}: the loop's tape would hold more than 2^64 values", tape.loc)))?;
            // At least one element: a loop may keep nothing (no device allocation is empty).
            // Zeros from a zeroed allocation: a backend that keeps the tape elsewhere never
            // touches them. Every batch reuses it: a slot is written before it is read.
            scratch.push(name.to_string());
            Ok(m.add(name, HostTensor::try_full(dtype, &[n.max(1)], 0.0)?))
        };
        let id = add(&tape.tape, tape.dtype, slots.checked_mul(tape.per_trip as u64))?;
        vl = vl.arg(&tape.tape, id).arg(&tape.capacity_param, cap as i64);
        if let Some(c) = &tape.checkpoints {
            let id = add(&c.tape, DType::F64, cap.div_ceil(seg).checked_mul(c.per_checkpoint as u64))?;
            vl = vl.arg(&c.tape, id).arg(&c.segment_param, seg as i64);
        }
    }
    let mut first = 0u64;
    while first < programs {
        let end = first.saturating_add(batch).min(programs);
        let mut bl = vl.clone();
        if let Some(f) = &vk.first_param {
            bl = bl.arg(f, first as i64);
        }
        let bl = bl.options(tilegrad_reference::Options {
            scratch: scratch.clone(),
            programs: (batch < programs).then_some(first..end),
            ..tilegrad_reference::Options::default()
        });
        run(&bl, &mut m)?;
        first = end;
    }
    inputs
        .iter()
        .map(|t| match copies.iter().find(|(o, ..)| o == t) {
            Some(&(_, _, Some(sh))) => Ok(m.get(sh).to_f64_vec()),
            _ => Err(AdError::Spec(format!("`{}` is not a float tensor of the launch", mem.name(*t)))),
        })
        .collect()
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
