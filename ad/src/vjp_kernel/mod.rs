//! VJP kernels: the derivative of a launch as a tile-IR kernel of its own.
//!
//! The evaluator ([`crate::vjp`]) differentiates a launch by running its own rules on batches of
//! programs on the CPU. A VJP kernel states the same derivative in the IR, so that every backend
//! that runs kernels (the reference interpreter, the GPU code generator) runs the ground truth
//! too, fused per program instance:
//!
//! - each program first recomputes its forward, in f64 (the kernel promoted with
//!   [`promote_floats`]), stores included, so that its loads after its own stores see what they
//!   saw; the tensors it only reads or only writes stay in their dtype in memory, converted at
//!   each access ([`promote_floats_keeping_tensors_as`]), so that a launch needs no f64 copy of
//!   them; what reaches no shadow (stores nothing loads, the loops that feed only them) is
//!   removed at the end ([`remove_dead_code`]);
//! - then it runs the reverse sweep, op by op from the last, with one rule per op emitting IR;
//! - memory derivatives go through *shadow* tensors, one f64 tensor per float tensor parameter
//!   (`d_<name>`), holding cotangents of contents: a load's adjoint is an `atomic_add` of its
//!   cotangent into the shadow of what it read; a store's adjoint reads the shadow of what it
//!   wrote (the stored value's cotangent) and then zeroes it (the overwritten contents no longer
//!   reach anything); an `atomic_add`'s adjoint reads the shadow.
//!
//! Launched on a copy of the forward's initial memory with the shadows of outputs set to their
//! cotangents and the others to zero, it leaves in each shadow the cotangent of that tensor's
//! initial contents: last-writer semantics, loads after own stores and in-place elements left
//! untouched (their cotangent passes through) need no special case. This is exact for launches
//! without races between programs (which `check` validates first); atomics make the order of the
//! f64 sums depend on the programs' order (differences of about 1e-16).
//!
//! # Loops
//! A `for` loop is reversed by a loop over its trips from the last. Its carried values at the
//! start of each trip are kept on a *tape*: where the reverse sweep reaches the loop, a copy of
//! the loop runs again (its stores and atomics left out: they happened) and writes them to the
//! tape parameter `tg_tape<n>` (i64 where every kept value is an integer, f32 in f32 kernels
//! where that is exact, else f64: [`LoopTape`]; a trip's scalars in one store). A `for` loop
//! where the forward ran it, once a program (in the kernel's body), needs no copy: each of its
//! trips writes its own slots first, and its trip count comes from its bounds. An `if` that
//! ends the kernel (the rest of a kernel after an early return) is reversed in its own branch,
//! after the branch's forward and on its values, so that its loops are such loops too. Where a
//! branch's reverse or a reverse trip recomputes a loop, the copy is that recomputation: it
//! moves to the recomputed loop's place ([`tilegrad_ir::KernelBuilder::move_after`]); so does
//! the copy of a `while` loop that stores nothing, in the kernel's body, leaving the forward's
//! loop to dead-code removal. The reverse loop reads them back (a trip ahead, so that the
//! trip's loads need not wait for them),
//! recomputes the trip's body from them, and runs the body's rules, carrying the cotangents of
//! the carried values and of the values from outside the loop that the body uses. The copy's
//! and the reverse trips' loads read memory as the forward left it at its end; where a `for`
//! loop loads a tensor the kernel writes (in its body or its branches: a gradient written in
//! place over the logits, a rotation in place, a running total read back), the forward's loop
//! keeps each such load's values on a tape of their own, and every recomputation reads them
//! back from there (the private `taped` module); so does a branch outside loops, in one slot
//! a program.
//!
//! The rules follow the evaluator's conventions (see [`crate::rules::vjp`]): symbolic zeros (a
//! zero cotangent or a zero partial contributes zero, even beside an infinite or NaN factor),
//! max/min send the cotangent to the selected operand (ties to the first) or element (the first
//! equal to the result). The evaluator stays authoritative; tests check the two agree on every op.
//!
//! A `while` loop is reversed the same way: the copy also runs its condition and counts the
//! trips, which the reverse loop then takes.
//!
//! A launch runs its programs in batches whose tapes fit in the memory it may take
//! ([`gradient_by_kernel`]; tapes hold a batch's programs from its first, the parameter
//! [`VjpKernel::first_param`]). Where not even one program's tapes fit, the kernel is built
//! again with checkpoints ([`vjp_kernel_checkpointed`], [`LoopCheckpoints`]): the copy keeps
//! every carried value at the start of each segment (of the length that takes the least
//! memory: about `sqrt(trips * checkpoint / kept a trip)`), and the reverse, segment by segment from the last, restores a checkpoint, runs the segment's
//! trips again writing their tape, and reverses them.
//!
//! A loop inside a loop is reversed inside each reverse trip of the outer one: the trip
//! recomputes its body, the inner loop included, then the inner loop's copy writes its tape
//! (the same slots for every outer trip) and its reverse loop runs.
//!
//! A `for` loop that advances a pointer (`p += BLOCK`) carries its offset from where it started
//! instead ([`tilegrad_ir::passes::carry_offsets`]), which its tape keeps.
//!
//! Not yet: pointers carried by loops otherwise, and loads of a tensor the kernel writes in a
//! `while` loop or a loop inside a loop; they are refused with the op and its location.

mod emit;
mod launch;
mod refuse;
mod taped;
#[cfg(test)]
mod tests;

pub use launch::{gradient_by_kernel, Part, PlanInput, TapeBounds, VjpPlan};

use crate::AdError;
use emit::{Emit, Tapes};
use refuse::refuse_unsupported;
use std::cell::RefCell;
use std::collections::HashMap;
use tilegrad_ir::passes::{carry_offsets, promote_floats, promote_floats_keeping_tensors_as, remove_dead_code};
use tilegrad_ir::{DType, Inst, Kernel, KernelBuilder, Loc, Op, ParamKind};
use tilegrad_reference::{Arg, Launch, Memory, TensorId};

/// A VJP kernel and the parameters it adds.
#[derive(Clone, Debug)]
pub struct VjpKernel {
    /// The kernel: the forward's parameters (floats promoted to f64), then the shadows, then
    /// each loop's tape and capacity.
    pub kernel: Kernel,
    /// For each float tensor parameter of the forward, in order: its name and its shadow's.
    pub shadows: Vec<(String, String)>,
    /// The tapes of the forward's loops, in order.
    pub tapes: Vec<LoopTape>,
    /// Where the kernel has tapes: its scalar (i64) parameter taking the linear id of the
    /// first program of the launch's batch. Tapes hold the programs of a batch from that one
    /// on, so that a launch may run its programs in batches (each launch runs
    /// [`tilegrad_reference::Options::programs`]) and bound the tapes' memory.
    pub first_param: Option<String>,
    /// The float tensor parameters kept in their own dtype (see [`vjp_kernel_with`]); the
    /// others are of [`VjpKernel::float`].
    pub kept: Vec<String>,
    /// The dtype of the arithmetic and the shadows: f64 or f32.
    pub float: DType,
}

/// What a launch of a VJP kernel gives a loop's tape: a tensor of its dtype of at least
/// `programs * capacity * per_trip` elements (the programs of the launch's batch) for parameter `tape`, and the scalar (i64)
/// `capacity` for parameter `capacity_param`: the most trips a program may take (`max_iters`,
/// or the largest trip count of a forward run). A program that takes more fails with an
/// out-of-bounds store at the loop.
#[derive(Clone, Debug)]
pub struct LoopTape {
    /// The tape's parameter.
    pub tape: String,
    /// The capacity's parameter.
    pub capacity_param: String,
    /// Elements a trip keeps (the carried values at its start).
    pub per_trip: usize,
    /// The tape's dtype: i64 where every kept value is an integer (a block pointer's offsets),
    /// f32 in a kernel computing in f32 whose kept values are floats of 32 bits or less, else
    /// f64.
    pub dtype: DType,
    /// The loop's bound on its trips, where it has one.
    pub max_iters: Option<u32>,
    /// The loop.
    pub inst: Inst,
    /// Where the loop is.
    pub loc: Loc,
    /// With checkpoints ([`vjp_kernel_checkpointed`]): the tape holds the kept values of one
    /// segment's trips (`segment` slots a program, not `capacity`), and this the checkpoints.
    pub checkpoints: Option<LoopCheckpoints>,
}

/// A loop's checkpoints: an f64 tensor of at least `programs * cdiv(capacity, segment) *
/// per_checkpoint` elements for parameter `tape`, holding every carried value at the start of
/// each segment of `segment` trips (the i64 scalar parameter `segment_param`). The reverse
/// restores a segment's checkpoint, runs its trips again writing their kept values, and
/// reverses them, segments from the last: a tape of `segment` trips, not of every trip, for
/// one more run of the loop's forward.
#[derive(Clone, Debug)]
pub struct LoopCheckpoints {
    /// The checkpoints' parameter.
    pub tape: String,
    /// The segment length's parameter.
    pub segment_param: String,
    /// Values a checkpoint holds (every carried value).
    pub per_checkpoint: usize,
}

/// The VJP kernel of `k` (any float dtypes: it computes in f64). See the module docs.
///
/// Errors: what is not yet supported (see the module docs), atomics other than an `atomic_add`
/// whose old value is unused (as [`crate::vjp`] refuses them), a float access through a pointer
/// not derived from a parameter; each with the op and its location.
pub fn vjp_kernel(k: &Kernel) -> Result<VjpKernel, AdError> {
    vjp_kernel_with(k, true, DType::F64)
}

/// The VJP kernel of `launch`'s kernel for its tensors in `mem`: those the kernel only reads or
/// only writes are kept in the dtype `mem` holds them in ([`vjp_kernel_with`]; `mem` may hold a
/// tensor of an f64 kernel as f32 where its values are f32s), unless the launch binds one tensor
/// to two parameters.
pub fn vjp_kernel_for(launch: &Launch, mem: &Memory, float: DType) -> Result<VjpKernel, AdError> {
    let tensors: Vec<TensorId> = launch
        .args()
        .iter()
        .filter_map(|(_, a)| match a {
            Arg::Tensor(t) => Some(*t),
            Arg::Scalar(_) => None,
        })
        .collect();
    if tensors.iter().enumerate().any(|(i, t)| tensors[..i].contains(t)) {
        return build(launch.kernel(), None, float, false);
    }
    let stored = |name: &str, declared: DType| match launch.args().iter().find(|(n, _)| n == name) {
        Some((_, Arg::Tensor(t))) if mem.get(*t).dtype().is_float() => mem.get(*t).dtype(),
        _ => declared,
    };
    build(launch.kernel(), Some(&stored), float, false)
}

/// [`vjp_kernel`], computing in `float` (f64, the ground truth; or f32, faster where the
/// device's f64 is slow, and with shadows half the size) with `keep_tensors` saying whether the
/// float tensors that the kernel only reads or only writes stay in their dtype (converted at each
/// access, as [`tilegrad_ir::passes::promote_floats_keeping_tensors`] does: no copies of them)
/// rather than all becoming `float`. Launches that bind one tensor to two parameters need
/// `false`.
pub fn vjp_kernel_with(k: &Kernel, keep_tensors: bool, float: DType) -> Result<VjpKernel, AdError> {
    build(k, keep_tensors.then_some(&|_: &str, d: DType| d), float, false)
}

/// [`vjp_kernel_with`] keeping the float tensors the kernel only reads or only writes in the
/// dtype `stored(name, declared)` gives for each (as [`vjp_kernel_for`] takes it from a
/// launch's memory): for building a launch's VJP kernel ahead of its memory.
pub fn vjp_kernel_as(k: &Kernel, stored: &StoredDtype<'_>, float: DType) -> Result<VjpKernel, AdError> {
    build(k, Some(stored), float, false)
}

/// `vk` (a VJP kernel of `k`) built again with checkpoints in its loops
/// ([`LoopCheckpoints`]): the same kernel whose tapes hold one segment of trips a program, for
/// launches whose programs' whole tapes do not fit. `stored` gives the dtype in memory of the
/// tensors `vk` keeps in their dtype (as [`vjp_kernel_as`] takes it).
pub fn vjp_kernel_checkpointed(k: &Kernel, vk: &VjpKernel, stored: &StoredDtype<'_>) -> Result<VjpKernel, AdError> {
    let keep = |name: &str, d: DType| if vk.kept.iter().any(|n| n == name) { stored(name, d) } else { d };
    let keep: Option<&StoredDtype<'_>> = if vk.kept.is_empty() { None } else { Some(&keep) };
    build(k, keep, vk.float, true)
}

/// The dtype in memory of a tensor parameter (by name) of a declared dtype.
pub type StoredDtype<'a> = dyn Fn(&str, DType) -> DType + 'a;

/// The VJP kernel, keeping tensors in the dtypes `keep` gives (see
/// [`promote_floats_keeping_tensors_as`]), or none.
fn build(k: &Kernel, keep: Option<&StoredDtype<'_>>, fl: DType, checkpoints: bool) -> Result<VjpKernel, AdError> {
    if !matches!(fl, DType::F32 | DType::F64) {
        return Err(AdError::Spec(format!("VJP kernels compute in f64 or f32, not {fl}")));
    }
    crate::grad::refuse_ordered_atomics(k)?;
    let (p, kept) = match keep {
        Some(stored) => promote_floats_keeping_tensors_as(k, fl, stored)?,
        None => (promote_floats(k, fl)?, Vec::new()),
    };
    // Loops that advance a pointer carry its offset instead, which a tape keeps.
    let p = carry_offsets(&p);
    let taped_loads = refuse_unsupported(&p)?;
    let forward: Vec<Inst> = p.block(p.body).insts.clone();
    let params = p.params.clone();
    let mut b = KernelBuilder::resume(p.clone());
    let mut first = "tg_first".to_string();
    while params.iter().any(|q| q.name == first) {
        first.insert_str(0, "tg_");
    }
    let tapes = Tapes { list: RefCell::new(Vec::new()), first, checkpoints, loads: RefCell::new(HashMap::new()) };
    let slots = taped::instrument(&mut b, &p, &taped_loads, &tapes, fl);
    tapes.loads.replace(slots);
    let mut e = Emit { in_place: true, ..Emit::scope((&p, &tapes, fl), &mut b, HashMap::new(), HashMap::new(), None) };

    // Shadow parameters, named apart from every parameter.
    let mut shadows = Vec::new();
    for prm in &params {
        if let ParamKind::Ptr(d) = prm.kind {
            if d.is_float() {
                let mut s = format!("d_{}", prm.name);
                while params.iter().any(|q| q.name == s) || shadows.iter().any(|(_, t): &(String, String)| *t == s) {
                    s.insert_str(0, "d_");
                }
                let v = e.b.ptr_param(&s, fl);
                e.shadow.insert(prm.value, v);
                shadows.push((prm.name.clone(), s));
            }
        }
    }
    // Shadow pointers beside the forward's pointers, computed from the same offsets.
    for &i in &forward {
        e.shadow_pointer(i);
    }
    // The reverse sweep. An `if` that ends the kernel (the rest of it after an early return)
    // is reversed in its own branch.
    for (n, &i) in forward.iter().enumerate().rev() {
        match p.inst(i).op {
            Op::If { .. } if n + 1 == forward.len() => e.reverse_if_in_place(i)?,
            _ => e.reverse(i)?,
        }
    }
    let (tapes, first) = (tapes.list.into_inner(), tapes.first);
    // Only the shadows are read back: what reaches nothing else goes (the forward's stores that
    // nothing loads, the loops they feed, values recomputed for tapes that keep nothing).
    let kernel = b.finish()?;
    let mut kernel = remove_dead_code(&kernel, &|name| shadows.iter().any(|(_, s)| s == name));
    kernel.name = format!("{}_vjp", p.name);
    let first_param = (!tapes.is_empty()).then_some(first);
    Ok(VjpKernel { kernel, shadows, tapes, first_param, kept, float: fl })
}
