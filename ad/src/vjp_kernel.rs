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
//! tape parameter `tg_tape<n>` (f64, [`LoopTape`]); the reverse loop reads them back, recomputes
//! the trip's body from them, and runs the body's rules, carrying the cotangents of the carried
//! values and of the values from outside the loop that the body uses. The copy's loads read
//! memory as the forward left it, so a loop may not load a tensor the kernel writes (refused).
//!
//! The rules follow the evaluator's conventions (see [`crate::rules::vjp`]): symbolic zeros (a
//! zero cotangent or a zero partial contributes zero, even beside an infinite or NaN factor),
//! max/min send the cotangent to the selected operand (ties to the first) or element (the first
//! equal to the result). The evaluator stays authoritative; tests check the two agree on every op.
//!
//! A `while` loop is reversed the same way: the copy also runs its condition and counts the
//! trips, which the reverse loop then takes.
//!
//! Not yet: loops inside loops, pointers carried by loops; they are refused with the op and its
//! location.

use crate::AdError;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use tilegrad_ir::analysis::pointer_sources;
use tilegrad_ir::passes::{promote_floats, promote_floats_keeping_tensors_as, remove_dead_code};
use tilegrad_ir::{
    BinaryOp, DType, DotPrecision, Elem, Inst, InstData, Kernel, KernelBuilder, Loc, Op, ParamKind, ReduceOp, UnaryOp, Value,
};
use tilegrad_reference::{Arg, HostTensor, Launch, Memory, TensorId};

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
    /// The float tensor parameters kept in their own dtype (see [`vjp_kernel_with`]); the
    /// others are of [`VjpKernel::float`].
    pub kept: Vec<String>,
    /// The dtype of the arithmetic and the shadows: f64 or f32.
    pub float: DType,
}

/// What a launch of a VJP kernel gives a loop's tape: an f64 tensor of at least
/// `programs * capacity * per_trip` elements for parameter `tape`, and the scalar (i64)
/// `capacity` for parameter `capacity_param`: the most trips a program may take (`max_iters`,
/// or the largest trip count of a forward run). A program that takes more fails with an
/// out-of-bounds store at the loop.
#[derive(Clone, Debug)]
pub struct LoopTape {
    /// The tape's parameter.
    pub tape: String,
    /// The capacity's parameter.
    pub capacity_param: String,
    /// f64 elements a trip keeps (the carried values at its start).
    pub per_trip: usize,
    /// The loop's bound on its trips, where it has one.
    pub max_iters: Option<u32>,
    /// The loop.
    pub inst: Inst,
    /// Where the loop is.
    pub loc: Loc,
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
        return build(launch.kernel(), None, float);
    }
    let stored = |name: &str, declared: DType| match launch.args().iter().find(|(n, _)| n == name) {
        Some((_, Arg::Tensor(t))) if mem.get(*t).dtype().is_float() => mem.get(*t).dtype(),
        _ => declared,
    };
    build(launch.kernel(), Some(&stored), float)
}

/// [`vjp_kernel`], computing in `float` (f64, the ground truth; or f32, faster where the
/// device's f64 is slow, and with shadows half the size) with `keep_tensors` saying whether the
/// float tensors that the kernel only reads or only writes stay in their dtype (converted at each
/// access, as [`tilegrad_ir::passes::promote_floats_keeping_tensors`] does: no copies of them)
/// rather than all becoming `float`. Launches that bind one tensor to two parameters need
/// `false`.
pub fn vjp_kernel_with(k: &Kernel, keep_tensors: bool, float: DType) -> Result<VjpKernel, AdError> {
    build(k, keep_tensors.then_some(&|_: &str, d: DType| d), float)
}

/// [`vjp_kernel_with`] keeping the float tensors the kernel only reads or only writes in the
/// dtype `stored(name, declared)` gives for each (as [`vjp_kernel_for`] takes it from a
/// launch's memory): for building a launch's VJP kernel ahead of its memory.
pub fn vjp_kernel_as(k: &Kernel, stored: &StoredDtype<'_>, float: DType) -> Result<VjpKernel, AdError> {
    build(k, Some(stored), float)
}

/// The dtype in memory of a tensor parameter (by name) of a declared dtype.
pub type StoredDtype<'a> = dyn Fn(&str, DType) -> DType + 'a;

/// The VJP kernel, keeping tensors in the dtypes `keep` gives (see
/// [`promote_floats_keeping_tensors_as`]), or none.
fn build(k: &Kernel, keep: Option<&StoredDtype<'_>>, fl: DType) -> Result<VjpKernel, AdError> {
    if !matches!(fl, DType::F32 | DType::F64) {
        return Err(AdError::Spec(format!("VJP kernels compute in f64 or f32, not {fl}")));
    }
    crate::grad::refuse_ordered_atomics(k)?;
    let (p, kept) = match keep {
        Some(stored) => promote_floats_keeping_tensors_as(k, fl, stored)?,
        None => (promote_floats(k, fl)?, Vec::new()),
    };
    refuse_unsupported(&p)?;
    let forward: Vec<Inst> = p.block(p.body).insts.clone();
    let params = p.params.clone();
    let mut b = KernelBuilder::resume(p.clone());
    let tapes = RefCell::new(Vec::new());
    let mut e = Emit { k: &p, b: &mut b, shadow: HashMap::new(), adj: HashMap::new(), map: HashMap::new(), tapes: &tapes, fl };

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
    // The reverse sweep.
    for &i in forward.iter().rev() {
        e.reverse(i)?;
    }
    let tapes = tapes.into_inner();
    // Only the shadows are read back: what reaches nothing else goes (the forward's stores that
    // nothing loads, the loops they feed, values recomputed for tapes that keep nothing).
    let kernel = b.finish()?;
    let mut kernel = remove_dead_code(&kernel, &|name| shadows.iter().any(|(_, s)| s == name));
    kernel.name = format!("{}_vjp", p.name);
    Ok(VjpKernel { kernel, shadows, tapes, kept, float: fl })
}

/// Runs VJP kernel `vk` of `launch`'s kernel: the cotangents of the initial contents of
/// `inputs` (float tensors) given cotangents of the final contents of `outputs`, as
/// [`crate::vjp`] gives them.
///
/// The launch of `vk` runs on a memory of its own: `mem`'s tensors shared where `vk` takes
/// them in their dtype, else f64 copies, a shadow per float tensor (the output's cotangent, else zeros)
/// and the loops' tapes, sized by `max_iters` or else by `max_trips` (a forward run's largest
/// trip count per loop, as [`tilegrad_reference::LaunchSummary::max_trips`] has it). `run`
/// executes it (the reference interpreter, or another backend). `mem` must be as the forward
/// found it, and the launch without races between programs.
pub fn gradient_by_kernel(
    vk: &VjpKernel,
    launch: &Launch,
    mem: &Memory,
    inputs: &[TensorId],
    outputs: &[(TensorId, Vec<f64>)],
    max_trips: &BTreeMap<Inst, u64>,
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
    let programs = launch.grid().programs();
    for tape in &vk.tapes {
        let cap = match tape.max_iters {
            Some(m) => m as u64,
            None => max_trips.get(&tape.inst).copied().unwrap_or(0),
        };
        let n = programs
            .checked_mul(cap)
            .and_then(|x| x.checked_mul(tape.per_trip as u64))
            .and_then(|x| usize::try_from(x).ok())
            .ok_or_else(|| AdError::Spec(format!("{}: the loop's tape would hold more than 2^64 values", tape.loc)))?;
        // At least one element: a loop may keep nothing (no device allocation is empty).
        let t = HostTensor::try_full(DType::F64, &[n.max(1)], 0.0)?;
        let id = m.add(&tape.tape, t);
        vl = vl.arg(&tape.tape, id).arg(&tape.capacity_param, cap as i64);
    }
    run(&vl, &mut m)?;
    inputs
        .iter()
        .map(|t| match copies.iter().find(|(o, ..)| o == t) {
            Some(&(_, _, Some(sh))) => Ok(m.get(sh).to_f64_vec()),
            _ => Err(AdError::Spec(format!("`{}` is not a float tensor of the launch", mem.name(*t)))),
        })
        .collect()
}

/// The values a block (with the blocks nested in it) uses and does not define, in order of use.
fn outer_uses(k: &Kernel, blk: tilegrad_ir::Block) -> Vec<Value> {
    fn walk(k: &Kernel, blk: tilegrad_ir::Block, defined: &mut HashSet<Value>, uses: &mut Vec<Value>) {
        let bd = k.block(blk);
        defined.extend(bd.params.iter().copied());
        for &i in &bd.insts {
            let d = k.inst(i);
            for &a in &d.args {
                if !defined.contains(&a) && !uses.contains(&a) {
                    uses.push(a);
                }
            }
            for b in d.op.blocks() {
                walk(k, b, defined, uses);
            }
            defined.extend(d.results.iter().copied());
        }
    }
    let (mut defined, mut uses) = (HashSet::new(), Vec::new());
    walk(k, blk, &mut defined, &mut uses);
    uses
}

/// Whether the reverse of loop body `blk` reads the value of carried value `c`, or of a value the
/// body computes from it: false where every use is by an op whose rule reads no operand's value
/// (sums and differences, negation, shape changes, sum reductions and scans, float casts, the
/// branches of a `where`, the value a store or `atomic_add` writes, a `dot`'s accumulator, the
/// yield). Integers (which
/// may address memory or steer branches) and uses inside nested blocks count as read.
fn value_needed(k: &Kernel, blk: &tilegrad_ir::BlockData, c: Value) -> bool {
    if !k.ty(c).dtype().is_some_and(|d| d.is_float()) {
        return true;
    }
    let mut derived: HashSet<Value> = HashSet::from([c]);
    for &i in &blk.insts {
        let d = k.inst(i);
        if d.op.blocks().into_iter().any(|b| outer_uses(k, b).iter().any(|v| derived.contains(v))) {
            return true;
        }
        let hits: Vec<usize> = (0..d.args.len()).filter(|&p| derived.contains(&d.args[p])).collect();
        if hits.is_empty() {
            continue;
        }
        let reads_no_value = match &d.op {
            Op::Binary(BinaryOp::Add | BinaryOp::Sub) | Op::Unary(UnaryOp::Neg) => true,
            Op::Broadcast | Op::ExpandDims { .. } | Op::Reshape | Op::Permute { .. } | Op::Cumsum { .. } | Op::Yield => true,
            Op::Reduce { kind: ReduceOp::Sum, .. } => true,
            Op::Cast => k.ty(d.results[0]).dtype().is_some_and(|t| t.is_float()),
            Op::Where => !hits.contains(&0),
            Op::Store { .. } | Op::AtomicAdd { .. } => hits == [1],
            // The accumulator `dot` adds its product to.
            Op::Dot { .. } => hits == [2],
            _ => false,
        };
        if !reads_no_value {
            return true;
        }
        derived.extend(d.results.iter().copied());
    }
    false
}

/// Whether a block (with its nested blocks) stores or adds atomically: its reverse then has
/// memory adjoints even without cotangents flowing out of it.
fn has_effects(k: &Kernel, blk: tilegrad_ir::Block) -> bool {
    k.block(blk).insts.iter().any(|&i| {
        let op = &k.inst(i).op;
        matches!(op, Op::Store { .. } | Op::AtomicAdd { .. }) || op.blocks().into_iter().any(|b| has_effects(k, b))
    })
}

fn unsupported(k: &Kernel, d: &InstData, message: &str) -> AdError {
    AdError::Unsupported { kernel: k.name.clone(), op: d.op.mnemonic().into(), loc: d.loc.clone(), message: message.into() }
}

/// Refuses what has no VJP kernel yet (see the module docs), from the parameters each pointer
/// value may point into ([`pointer_sources`]) and the parameters some op writes.
fn refuse_unsupported(k: &Kernel) -> Result<(), AdError> {
    let sources = pointer_sources(k);
    let mut written = vec![false; k.params.len()];
    let mut refused = None;
    k.walk(&mut |_, d| {
        if let Op::Store { .. } | Op::AtomicAdd { .. } = d.op {
            for (w, &s) in written.iter_mut().zip(&sources[d.args[0].index()]) {
                *w |= s;
            }
        }
    });
    // Refusals: what has no VJP kernel yet.
    fn has_loop(k: &Kernel, blk: tilegrad_ir::Block) -> bool {
        k.block(blk).insts.iter().any(|&i| {
            let op = &k.inst(i).op;
            matches!(op, Op::For { .. } | Op::While { .. }) || op.blocks().into_iter().any(|b| has_loop(k, b))
        })
    }
    k.walk(&mut |_, d| {
        if refused.is_some() {
            return;
        }
        let why = match &d.op {
            Op::For { body, .. } | Op::While { body, .. } => {
                let b = k.block(*body);
                if b.params.iter().any(|&v| k.ty(v).is_ptr()) {
                    Some("VJP kernels do not take loops that carry pointers yet (carry offsets instead); the CPU evaluator differentiates this kernel")
                } else if d.op.blocks().into_iter().any(|b| has_loop(k, b)) {
                    Some("VJP kernels do not take loops inside loops yet; the CPU evaluator differentiates this kernel")
                } else {
                    None
                }
            }
            _ => None,
        };
        if let Some(why) = why {
            refused = Some(unsupported(k, d, why));
        }
    });
    // A load in a loop or a branch must read what the forward left (the reverse sweep
    // recomputes them after it).
    fn loads_in(k: &Kernel, blk: tilegrad_ir::Block, nested: bool, out: &mut Vec<Inst>) {
        for &i in &k.block(blk).insts {
            let d = k.inst(i);
            if nested && matches!(d.op, Op::Load { .. }) {
                out.push(i);
            }
            for b in d.op.blocks() {
                loads_in(k, b, true, out);
            }
        }
    }
    let mut nested_loads = Vec::new();
    loads_in(k, k.body, false, &mut nested_loads);
    for i in nested_loads {
        let d = k.inst(i);
        let from = &sources[d.args[0].index()];
        let reads_written = !from.contains(&true) || from.iter().zip(&written).any(|(&f, &w)| f && w);
        if reads_written && refused.is_none() {
            refused = Some(unsupported(
                k,
                d,
                "this load in a loop or branch reads a tensor the kernel writes: VJP kernels recompute loops and \
                 branches from memory as the forward left it, so they do not take it yet; the CPU evaluator \
                 differentiates this kernel",
            ));
        }
    }
    match refused {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The emitter, for one scope (the kernel's body, or a reverse trip of a loop): the promoted
/// forward (to read types from), the builder, the shadow of each forward pointer value, the
/// adjoint of each forward float value reached so far, and the value that stands for each
/// forward value here (itself, outside loops).
struct Emit<'k, 'b> {
    k: &'k Kernel,
    b: &'b mut KernelBuilder,
    shadow: HashMap<Value, Value>,
    adj: HashMap<Value, Value>,
    map: HashMap<Value, Value>,
    tapes: &'k RefCell<Vec<LoopTape>>,
    /// The dtype of the arithmetic, cotangents and shadows (f64, or f32).
    fl: DType,
}

/// A constant of the arithmetic's dtype.
fn cst(b: &mut KernelBuilder, fl: DType, x: f64) -> Value {
    if fl == DType::F32 {
        b.f32(x as f32)
    } else {
        b.f64(x)
    }
}

impl Emit<'_, '_> {
    /// What stands for forward value `x` here.
    fn v(&self, x: Value) -> Value {
        self.map.get(&x).copied().unwrap_or(x)
    }

    fn is_float(&self, v: Value) -> bool {
        matches!(self.k.ty(v).elem, Elem::Num(d) if d.is_float())
    }

    fn shape(&self, v: Value) -> Vec<usize> {
        self.k.ty(v).shape.to_vec()
    }

    /// Adds `g` to the adjoint of forward value `v` (float values only).
    fn acc(&mut self, v: Value, g: Value) {
        if !self.is_float(v) {
            return;
        }
        let sum = match self.adj.get(&v) {
            Some(&a) => self.b.add(a, g),
            None => g,
        };
        self.adj.insert(v, sum);
    }

    fn zero(&mut self) -> Value {
        cst(self.b, self.fl, 0.0)
    }

    /// `g * d`, zero where `g` is (a masked-off lane's infinite derivative stays out).
    fn times(&mut self, g: Value, d: Value) -> Value {
        let z = self.zero();
        let gz = self.b.eq(g, z);
        let prod = self.b.mul(g, d);
        self.b.where_(gz, z, prod)
    }

    /// `g * p`, zero where either factor is.
    fn keep(&mut self, g: Value, p: Value) -> Value {
        let z = self.zero();
        let gz = self.b.eq(g, z);
        let pz = self.b.eq(p, z);
        let either = self.b.or(gz, pz);
        let prod = self.b.mul(g, p);
        self.b.where_(either, z, prod)
    }

    fn shadow_of(&self, i: Inst, ptr: Value) -> Result<Value, AdError> {
        self.shadow.get(&ptr).copied().ok_or_else(|| {
            unsupported(self.k, self.k.inst(i), "this float access goes through a pointer not derived from a tensor parameter")
        })
    }

    /// The shadow of a pointer-valued result, where its pointer operand has one.
    fn shadow_pointer(&mut self, i: Inst) {
        let d = self.k.inst(i).clone();
        let Some(&r) = d.results.first() else { return };
        if !self.k.ty(r).is_ptr() {
            return;
        }
        self.b.set_loc(Some(d.loc.clone()));
        let sh = |e: &Emit, v: Value| e.shadow.get(&v).copied();
        let s = match &d.op {
            Op::AddPtr => sh(self, d.args[0]).map(|s| {
                let o = self.v(d.args[1]);
                self.b.add(s, o)
            }),
            Op::Broadcast => sh(self, d.args[0]).map(|s| {
                let shape = self.shape(r);
                self.b.broadcast_to(s, &shape)
            }),
            Op::ExpandDims { axis } => sh(self, d.args[0]).map(|s| self.b.expand_dims(s, *axis as isize)),
            Op::Reshape => sh(self, d.args[0]).map(|s| {
                let shape = self.shape(r);
                self.b.reshape(s, &shape)
            }),
            Op::Permute { perm } => sh(self, d.args[0]).map(|s| {
                let perm: Vec<usize> = perm.iter().map(|&p| p as usize).collect();
                self.b.permute(s, &perm)
            }),
            Op::Where => match (sh(self, d.args[1]), sh(self, d.args[2])) {
                (Some(x), Some(y)) => {
                    let c = self.v(d.args[0]);
                    Some(self.b.where_(c, x, y))
                }
                _ => None,
            },
            _ => None,
        };
        if let Some(s) = s {
            self.shadow.insert(r, s);
        }
    }

    /// Recomputes forward op `i` of a loop body or branch here (stores and atomics left out:
    /// they happened; loops and branches with their blocks recomputed), with the shadow of a
    /// pointer result.
    fn recompute(&mut self, i: Inst) {
        let d = self.k.inst(i).clone();
        self.b.set_loc(Some(d.loc.clone()));
        let args: Vec<Value> = d.args.iter().map(|&a| self.v(a)).collect();
        let (k, tapes, fl) = (self.k, self.tapes, self.fl);
        let block = |b: &mut KernelBuilder,
                     blk: tilegrad_ir::Block,
                     params: &[Value],
                     shadow: HashMap<Value, Value>,
                     map: HashMap<Value, Value>|
         -> Vec<Value> {
            let mut e = Emit { k, b, shadow, adj: HashMap::new(), map, tapes, fl };
            let bd = k.block(blk);
            for (&f, &v) in bd.params.iter().zip(params) {
                e.map.insert(f, v);
            }
            for &j in &bd.insts {
                e.recompute(j);
            }
            let y = k.inst(*bd.insts.last().expect("a block ends in yield"));
            y.args.iter().map(|&a| e.v(a)).collect()
        };
        let out: Vec<Value> = match &d.op {
            Op::Store { .. } | Op::AtomicAdd { .. } | Op::Yield => return,
            Op::For { body, max_iters } => {
                let (shadow, map) = (self.shadow.clone(), self.map.clone());
                self.b.for_range(args[0], args[1], args[2], *max_iters, &args[3..], |b, iv, cs| {
                    let params: Vec<Value> = std::iter::once(iv).chain(cs.iter().copied()).collect();
                    block(b, *body, &params, shadow, map)
                })
            }
            Op::While { cond, body, max_iters } => {
                let (s1, m1, s2, m2) = (self.shadow.clone(), self.map.clone(), self.shadow.clone(), self.map.clone());
                self.b.while_loop(*max_iters, &args, |b, cs| block(b, *cond, cs, s1, m1)[0], |b, cs| block(b, *body, cs, s2, m2))
            }
            Op::If { then_block, else_block } => {
                let (s1, m1, s2, m2) = (self.shadow.clone(), self.map.clone(), self.shadow.clone(), self.map.clone());
                self.b.if_else(args[0], |b| block(b, *then_block, &[], s1, m1), |b| block(b, *else_block, &[], s2, m2))
            }
            _ => {
                let tys = d.results.iter().map(|&r| self.k.ty(r).clone()).collect();
                self.b.push(d.op.clone(), &args, tys).to_vec()
            }
        };
        for (&r, &o) in d.results.iter().zip(out.iter()) {
            self.map.insert(r, o);
        }
        self.shadow_pointer(i);
    }

    /// Emits the reverse of an `if`: a branch on the same condition whose sides recompute their
    /// forward side and run its rules, giving the cotangents of the values from outside.
    fn reverse_if(&mut self, i: Inst) -> Result<(), AdError> {
        let d = self.k.inst(i).clone();
        let Op::If { then_block, else_block } = d.op else { unreachable!("an if") };
        let k = self.k;
        let mut outer: Vec<Value> = Vec::new();
        for b in [then_block, else_block] {
            for v in outer_uses(k, b) {
                if self.is_float(v) && !outer.contains(&v) {
                    outer.push(v);
                }
            }
        }
        let res_adj: Vec<Option<Value>> = d.results.iter().map(|r| self.adj.get(r).copied()).collect();
        if outer.is_empty() && !has_effects(k, then_block) && !has_effects(k, else_block) {
            return Ok(());
        }
        let err: RefCell<Option<AdError>> = RefCell::new(None);
        let (tapes, fl) = (self.tapes, self.fl);
        let side = |b: &mut KernelBuilder, blk: tilegrad_ir::Block, shadow: HashMap<Value, Value>, map: HashMap<Value, Value>| {
            let mut e = Emit { k, b, shadow, adj: HashMap::new(), map, tapes, fl };
            e.b.set_loc(Some(d.loc.clone()));
            let bd = k.block(blk);
            for &j in &bd.insts {
                e.recompute(j);
            }
            let ys = &k.inst(*bd.insts.last().expect("a block ends in yield")).args;
            for (q, g) in res_adj.iter().enumerate() {
                if let Some(g) = g {
                    e.acc(ys[q], *g);
                }
            }
            for &j in bd.insts.iter().rev() {
                if let Err(x) = e.reverse(j) {
                    err.borrow_mut().get_or_insert(x);
                }
            }
            e.b.set_loc(Some(d.loc.clone()));
            outer
                .iter()
                .map(|&o| match e.adj.get(&o) {
                    Some(&g) => g,
                    None => {
                        let shape = e.shape(o);
                        e.b.full(&shape, 0.0, e.fl)
                    }
                })
                .collect::<Vec<Value>>()
        };
        let c = self.v(d.args[0]);
        let (s1, m1, s2, m2) = (self.shadow.clone(), self.map.clone(), self.shadow.clone(), self.map.clone());
        let out = self.b.if_else(c, |b| side(b, then_block, s1, m1), |b| side(b, else_block, s2, m2));
        if let Some(e) = err.into_inner() {
            return Err(e);
        }
        for (q, &o) in outer.iter().enumerate() {
            self.acc(o, out[q]);
        }
        Ok(())
    }

    /// The program's index in the grid, as an i64 scalar.
    fn program_index(&mut self) -> Value {
        let b = &mut *self.b;
        let (p0, p1, p2) = (b.program_id(0), b.program_id(1), b.program_id(2));
        let (n0, n1) = (b.num_programs(0), b.num_programs(1));
        let (p0, p1, p2, n0, n1) =
            (b.cast(p0, DType::I64), b.cast(p1, DType::I64), b.cast(p2, DType::I64), b.cast(n0, DType::I64), b.cast(n1, DType::I64));
        let t = b.mul(p2, n1);
        let t = b.add(t, p1);
        let t = b.mul(t, n0);
        b.add(t, p0)
    }

    /// Pointers to the tape slots of trip `t` (i32 scalar) of each of `carried` (forward
    /// values), where a trip's slots start at `base + t * per_trip` (i64 scalars) and carried
    /// value `j` at `at[j]` within them.
    fn trip_slots(&mut self, tape: Value, base: Value, per_trip: Value, at: &[usize], t: Value, carried: &[Value]) -> Vec<Value> {
        let t64 = self.b.cast(t, DType::I64);
        let off = self.b.mul(t64, per_trip);
        let slot = self.b.add(base, off);
        carried
            .iter()
            .zip(at)
            .map(|(&c, &a)| {
                let o = self.b.i64(a as i64);
                let o = self.b.add(slot, o);
                let p = self.b.add(tape, o);
                let shape = self.shape(c);
                if shape.is_empty() {
                    return p;
                }
                let r = self.b.arange(0, shape.iter().product::<usize>() as i64);
                let r = self.b.reshape(r, &shape);
                self.b.add(p, r)
            })
            .collect()
    }

    /// Emits the reverse of loop `i` (`for` or `while`): the copy that writes the tape and
    /// counts the trips, then the reverse loop over them. A `while`'s condition is recomputed by
    /// the copy only: no cotangent flows through it.
    fn reverse_loop(&mut self, i: Inst) -> Result<(), AdError> {
        let d = self.k.inst(i).clone();
        let (body, cond, max_iters) = match d.op {
            Op::For { body, max_iters } => (body, None, max_iters),
            Op::While { cond, body, max_iters } => (body, Some(cond), max_iters),
            _ => unreachable!("a loop"),
        };
        let (k, fl) = (self.k, self.fl);
        let blk = k.block(body).clone();
        // A `for` body's parameters are its induction variable and the carried values, a
        // `while` body's the carried values; so are the loop's operands after a `for`'s bounds.
        let (fiv, fcarried, inits) = match cond {
            None => (Some(blk.params[0]), blk.params[1..].to_vec(), d.args[3..].to_vec()),
            Some(_) => (None, blk.params.clone(), d.args.to_vec()),
        };
        let yields = k.inst(*blk.insts.last().expect("a body ends in yield")).args.to_vec();
        self.b.set_loc(Some(d.loc.clone()));
        let n = self.tapes.borrow().len();
        let tape = self.b.ptr_param(&format!("tg_tape{n}"), DType::F64);
        let cap_name = format!("tg_cap{n}");
        let cap = self.b.scalar_param(&cap_name, DType::I64);
        // The carried values whose values the reverse needs, and each one's place in a trip's
        // slots; the others (an accumulator only summed into) are not kept.
        let taped: Vec<Value> = fcarried.iter().copied().filter(|&c| value_needed(k, &blk, c)).collect();
        let mut at = Vec::new();
        let mut per_trip = 0usize;
        for &c in &taped {
            at.push(per_trip);
            per_trip += k.ty(c).numel();
        }
        self.tapes.borrow_mut().push(LoopTape {
            tape: format!("tg_tape{n}"),
            capacity_param: cap_name,
            per_trip,
            max_iters,
            inst: i,
            loc: d.loc.clone(),
        });
        let pix = self.program_index();
        let s = self.b.i64(per_trip as i64);
        let base = self.b.mul(pix, cap);
        let base = self.b.mul(base, s);
        let bounds = cond.is_none().then(|| (self.v(d.args[0]), self.v(d.args[1]), self.v(d.args[2])));

        // The copy of the loop, writing each trip's carried values to the tape; it also carries
        // the trip count.
        let (shadow, map, tapes) = (self.shadow.clone(), self.map.clone(), self.tapes);
        let mut init_c: Vec<Value> = inits.iter().map(|&a| self.v(a)).collect();
        init_c.push(self.b.i32(0));
        let copy = |b: &mut KernelBuilder, iv: Option<Value>, cs: &[Value], shadow, map| {
            let mut e = Emit { k, b, shadow, adj: HashMap::new(), map, tapes, fl };
            e.b.set_loc(Some(d.loc.clone()));
            let t = cs[cs.len() - 1];
            for (c, ptrs) in taped.iter().zip(e.trip_slots(tape, base, s, &at, t, &taped)) {
                let j = fcarried.iter().position(|f| f == c).expect("a carried value");
                let v = e.b.cast(cs[j], DType::F64);
                e.b.store(ptrs, v, None);
            }
            if let (Some(f), Some(iv)) = (fiv, iv) {
                e.map.insert(f, iv);
            }
            for (j, &c) in fcarried.iter().enumerate() {
                e.map.insert(c, cs[j]);
            }
            for &j in &blk.insts {
                e.recompute(j);
            }
            let mut next: Vec<Value> = yields.iter().map(|&y| e.v(y)).collect();
            e.b.set_loc(Some(d.loc.clone()));
            let one = e.b.i32(1);
            next.push(e.b.add(t, one));
            next
        };
        let res = match (bounds, cond) {
            (Some((lo, hi, st)), _) => self.b.for_range(lo, hi, st, max_iters, &init_c, |b, iv, cs| copy(b, Some(iv), cs, shadow, map)),
            (None, Some(cb)) => {
                let (s1, m1) = (shadow.clone(), map.clone());
                let cblk = k.block(cb).clone();
                self.b.while_loop(
                    max_iters,
                    &init_c,
                    |b, cs| {
                        let mut e = Emit { k, b, shadow: s1, adj: HashMap::new(), map: m1, tapes, fl };
                        for (&p, &v) in cblk.params.iter().zip(cs) {
                            e.map.insert(p, v);
                        }
                        for &j in &cblk.insts {
                            e.recompute(j);
                        }
                        let y = k.inst(*cblk.insts.last().expect("a condition ends in yield"));
                        e.v(y.args[0])
                    },
                    |b, cs| copy(b, None, cs, shadow, map),
                )
            }
            (None, None) => unreachable!("a for loop has bounds"),
        };
        let trips = res[res.len() - 1];

        // The reverse loop: it carries the cotangents of the float carried values, then of the
        // float values from outside the body that the body uses.
        let float_carried: Vec<usize> = (0..fcarried.len()).filter(|&j| self.is_float(fcarried[j])).collect();
        let outer: Vec<Value> = outer_uses(k, body).into_iter().filter(|&v| self.is_float(v)).collect();
        let mut init_r = Vec::new();
        for &j in &float_carried {
            let g = match self.adj.get(&d.results[j]) {
                Some(&g) => g,
                None => {
                    let shape = self.shape(fcarried[j]);
                    self.b.full(&shape, 0.0, self.fl)
                }
            };
            init_r.push(g);
        }
        for &o in &outer {
            let shape = self.shape(o);
            init_r.push(self.b.full(&shape, 0.0, self.fl));
        }
        let (shadow, map) = (self.shadow.clone(), self.map.clone());
        let (z, one) = (self.b.i32(0), self.b.i32(1));
        let mut first_err = None;
        let out = self.b.for_range(z, trips, one, max_iters, &init_r, |b, sv, cs| {
            let mut e = Emit { k, b, shadow, adj: HashMap::new(), map, tapes, fl };
            e.b.set_loc(Some(d.loc.clone()));
            // Trip t = trips - 1 - s: its carried values from the tape, its induction variable.
            let one = e.b.i32(1);
            let last = e.b.sub(trips, one);
            let t = e.b.sub(last, sv);
            for (&c, ptrs) in taped.iter().zip(e.trip_slots(tape, base, s, &at, t, &taped)) {
                let v = e.b.load(ptrs, None, None);
                let dt = k.ty(c).dtype().expect("carried numbers");
                let v = if dt == DType::F64 { v } else { e.b.cast(v, dt) };
                e.map.insert(c, v);
            }
            // What the reverse does not read stands as zeros.
            for &c in fcarried.iter().filter(|c| !taped.contains(c)) {
                let (shape, dt) = (e.shape(c), k.ty(c).dtype().expect("carried numbers"));
                let z = e.b.full(&shape, 0.0, dt);
                e.map.insert(c, z);
            }
            if let (Some(fiv), Some((lo, _, st))) = (fiv, bounds) {
                let idt = k.ty(fiv).dtype().expect("an integer induction variable");
                let tc = e.b.cast(t, idt);
                let step = e.b.mul(tc, st);
                let iv = e.b.add(lo, step);
                e.map.insert(fiv, iv);
            }
            for &j in &blk.insts {
                e.recompute(j);
            }
            for (q, &j) in float_carried.iter().enumerate() {
                e.acc(yields[j], cs[q]);
            }
            for &j in blk.insts.iter().rev() {
                if let Err(err) = e.reverse(j) {
                    first_err.get_or_insert(err);
                }
            }
            e.b.set_loc(Some(d.loc.clone()));
            let mut next = Vec::new();
            for &j in &float_carried {
                let g = match e.adj.get(&fcarried[j]) {
                    Some(&g) => g,
                    None => {
                        let shape = e.shape(fcarried[j]);
                        e.b.full(&shape, 0.0, e.fl)
                    }
                };
                next.push(g);
            }
            for (q, &o) in outer.iter().enumerate() {
                let prev = cs[float_carried.len() + q];
                next.push(match e.adj.get(&o) {
                    Some(&g) => e.b.add(prev, g),
                    None => prev,
                });
            }
            next
        });
        if let Some(err) = first_err {
            return Err(err);
        }
        for (q, &j) in float_carried.iter().enumerate() {
            self.acc(inits[j], out[q]);
        }
        for (q, &o) in outer.iter().enumerate() {
            self.acc(o, out[float_carried.len() + q]);
        }
        Ok(())
    }

    /// Emits the adjoint of forward instruction `i`.
    fn reverse(&mut self, i: Inst) -> Result<(), AdError> {
        let d = self.k.inst(i).clone();
        self.b.set_loc(Some(d.loc.clone()));
        let a = &d.args;
        // Memory ops and loops first: their adjoints do not wait for a result's cotangent.
        match &d.op {
            Op::Store { mask } => {
                if self.is_float(a[1]) {
                    let s = self.shadow_of(i, a[0])?;
                    let m = mask.then(|| self.v(a[2]));
                    let z = m.map(|_| self.zero());
                    let g = self.b.load(s, m, z);
                    let shape = self.shape(a[1]);
                    let zeros = self.b.full(&shape, 0.0, self.fl);
                    self.b.store(s, zeros, m);
                    self.acc(a[1], g);
                }
                return Ok(());
            }
            Op::AtomicAdd { mask } => {
                if self.is_float(a[1]) {
                    let s = self.shadow_of(i, a[0])?;
                    let m = mask.then(|| self.v(a[2]));
                    let z = m.map(|_| self.zero());
                    let g = self.b.load(s, m, z);
                    self.acc(a[1], g);
                }
                return Ok(());
            }
            Op::For { .. } | Op::While { .. } => return self.reverse_loop(i),
            Op::If { .. } => return self.reverse_if(i),
            _ => {}
        }
        let Some(&r) = d.results.first() else { return Ok(()) };
        let Some(&g) = self.adj.get(&r) else { return Ok(()) };
        match &d.op {
            Op::Store { .. } | Op::AtomicAdd { .. } | Op::For { .. } | Op::While { .. } | Op::If { .. } => unreachable!("handled above"),
            Op::ProgramId { .. } | Op::NumPrograms { .. } | Op::Const { .. } | Op::Arange { .. } | Op::Cmp(_) | Op::AddPtr | Op::Yield => {}
            Op::AtomicRmw { .. } | Op::AtomicCas => {
                return Err(unsupported(self.k, &d, "not differentiable in a VJP kernel"));
            }
            Op::Load { mask, other } => {
                let s = self.shadow_of(i, a[0])?;
                let m = mask.then(|| self.v(a[1]));
                self.b.atomic_add(s, g, m);
                if *other {
                    let z = self.zero();
                    let c = self.v(a[1]);
                    let go = self.b.where_(c, z, g);
                    self.acc(a[2], go);
                }
            }
            Op::Broadcast => {
                let (sx, sr) = (self.shape(a[0]), self.shape(r));
                let gx = if sx.is_empty() {
                    self.b.sum(g, None, false)
                } else if sx.len() == sr.len() {
                    let mut t = g;
                    for ax in 0..sx.len() {
                        if sx[ax] == 1 && sr[ax] != 1 {
                            t = self.b.sum(t, Some(ax as isize), true);
                        }
                    }
                    t
                } else {
                    return Err(unsupported(self.k, &d, "a broadcast that changes the rank of a tile"));
                };
                self.acc(a[0], gx);
            }
            Op::ExpandDims { .. } | Op::Reshape => {
                let sx = self.shape(a[0]);
                let gx = self.b.reshape(g, &sx);
                self.acc(a[0], gx);
            }
            Op::Permute { perm } => {
                let mut inv = vec![0usize; perm.len()];
                for (i, &p) in perm.iter().enumerate() {
                    inv[p as usize] = i;
                }
                let gx = self.b.permute(g, &inv);
                self.acc(a[0], gx);
            }
            Op::Unary(u) => self.unary(*u, a[0], r, g),
            Op::Binary(op) => {
                if self.is_float(r) {
                    self.binary(*op, a[0], a[1], g);
                }
            }
            Op::Where => {
                let z = self.zero();
                let c = self.v(a[0]);
                let ga = self.b.where_(c, g, z);
                let gb = self.b.where_(c, z, g);
                self.acc(a[1], ga);
                self.acc(a[2], gb);
            }
            Op::Cast => {
                if self.is_float(a[0]) {
                    self.acc(a[0], g);
                }
            }
            Op::Reduce { kind, axis, keep_dims } => self.reduce(*kind, *axis as usize, *keep_dims, a[0], r, g),
            Op::Cumsum { axis, reverse } => {
                let gx = self.b.cumsum(g, *axis as isize, !reverse);
                self.acc(a[0], gx);
            }
            Op::Dot { .. } => {
                let (x, y) = (self.v(a[0]), self.v(a[1]));
                let bt = self.b.trans(y);
                let ga = self.b.dot_with(g, bt, None, DotPrecision::Ieee);
                let at = self.b.trans(x);
                let gb = self.b.dot_with(at, g, None, DotPrecision::Ieee);
                self.acc(a[0], ga);
                self.acc(a[1], gb);
                self.acc(a[2], g);
            }
        }
        Ok(())
    }

    fn unary(&mut self, u: UnaryOp, xf: Value, r: Value, g: Value) {
        use UnaryOp::*;
        let (x, r) = (self.v(xf), self.v(r));
        let fl = self.fl;
        let b = &mut *self.b;
        let d = match u {
            Floor | Ceil | Not => return,
            Exp => r,
            Exp2 => {
                let c = cst(b, fl, std::f64::consts::LN_2);
                b.mul(c, r)
            }
            Sqrt => {
                let c = cst(b, fl, 0.5);
                b.div(c, r)
            }
            Rsqrt => {
                let c = cst(b, fl, -0.5);
                let t = b.mul(c, r);
                let t = b.mul(t, r);
                b.mul(t, r)
            }
            Tanh => {
                let one = cst(b, fl, 1.0);
                let rr = b.mul(r, r);
                b.sub(one, rr)
            }
            Sigmoid => {
                let one = cst(b, fl, 1.0);
                let om = b.sub(one, r);
                b.mul(r, om)
            }
            Neg => cst(b, fl, -1.0),
            Abs => {
                let (z, one, m1) = (cst(b, fl, 0.0), cst(b, fl, 1.0), cst(b, fl, -1.0));
                let pos = b.gt(x, z);
                let neg = b.lt(x, z);
                let s = b.where_(neg, m1, z);
                b.where_(pos, one, s)
            }
            Log => {
                let one = cst(b, fl, 1.0);
                b.div(one, x)
            }
            Log2 => {
                let (one, c) = (cst(b, fl, 1.0), cst(b, fl, std::f64::consts::LN_2));
                let t = b.mul(x, c);
                b.div(one, t)
            }
            Sin => b.cos(x),
            Cos => {
                let s = b.sin(x);
                b.neg(s)
            }
            Erf => {
                let c = cst(b, fl, 2.0 / std::f64::consts::PI.sqrt());
                let nx = b.neg(x);
                let t = b.mul(nx, x);
                let t = b.exp(t);
                b.mul(c, t)
            }
        };
        let gx = self.times(g, d);
        self.acc(xf, gx);
    }

    fn binary(&mut self, op: BinaryOp, xf: Value, yf: Value, g: Value) {
        use BinaryOp::*;
        let (x, y) = (self.v(xf), self.v(yf));
        match op {
            FloorDiv | And | Or | Xor => {}
            Add => {
                self.acc(xf, g);
                self.acc(yf, g);
            }
            Sub => {
                self.acc(xf, g);
                let n = self.b.neg(g);
                self.acc(yf, n);
            }
            Mul => {
                let gx = self.keep(g, y);
                let gy = self.keep(g, x);
                self.acc(xf, gx);
                self.acc(yf, gy);
            }
            Div => {
                let one = cst(self.b, self.fl, 1.0);
                let inv = self.b.div(one, y);
                let gx = self.keep(g, inv);
                let yy = self.b.mul(y, y);
                let nx = self.b.neg(x);
                let py = self.b.div(nx, yy);
                let gy = self.keep(g, py);
                self.acc(xf, gx);
                self.acc(yf, gy);
            }
            Mod => {
                // d/dx = 1, d/dy = -trunc(x / y).
                let q = self.b.div(x, y);
                let z = self.zero();
                let neg = self.b.lt(q, z);
                let (c, f) = (self.b.ceil(q), self.b.floor(q));
                let t = self.b.where_(neg, c, f);
                let p = self.b.neg(t);
                let gy = self.keep(g, p);
                self.acc(xf, g);
                self.acc(yf, gy);
            }
            Pow => {
                // d/dx = y x^(y-1) (0 where y is 0), d/dy = x^y ln x (0 where x is 0).
                let (z, one) = (self.zero(), cst(self.b, self.fl, 1.0));
                let ym1 = self.b.sub(y, one);
                let pw = self.b.pow(x, ym1);
                let dx = self.b.mul(y, pw);
                let y0 = self.b.eq(y, z);
                let dx = self.b.where_(y0, z, dx);
                let xy = self.b.pow(x, y);
                let ln = self.b.log(x);
                let dy = self.b.mul(xy, ln);
                let x0 = self.b.eq(x, z);
                let dy = self.b.where_(x0, z, dy);
                let gx = self.keep(g, dx);
                let gy = self.keep(g, dy);
                self.acc(xf, gx);
                self.acc(yf, gy);
            }
            Min | Max => {
                // The first operand is selected when neither is NaN and it is the extreme (ties
                // included), or when the second is NaN, or when both are.
                let fl = self.fl;
                let b = &mut *self.b;
                let xn = b.ne(x, x);
                let yn = b.ne(y, y);
                let any = b.or(xn, yn);
                let xok = b.not(xn);
                let by_nan = b.or(xok, yn);
                let by_value = if op == Max { b.ge(x, y) } else { b.le(x, y) };
                let first = b.where_(any, by_nan, by_value);
                let z = cst(b, fl, 0.0);
                let gx = b.where_(first, g, z);
                let gy = b.where_(first, z, g);
                self.acc(xf, gx);
                self.acc(yf, gy);
            }
        }
    }

    fn reduce(&mut self, kind: ReduceOp, axis: usize, keep_dims: bool, xf: Value, r: Value, g: Value) {
        let sx = self.shape(xf);
        let (x, r) = (self.v(xf), self.v(r));
        let fl = self.fl;
        let b = &mut *self.b;
        let ax = axis as isize;
        let gk = if keep_dims { g } else { b.expand_dims(g, ax) };
        let gb = b.broadcast_to(gk, &sx);
        match kind {
            ReduceOp::Argmax | ReduceOp::Argmin => {}
            ReduceOp::Sum => self.acc(xf, gb),
            ReduceOp::Max | ReduceOp::Min => {
                // The cotangent goes to the first element equal to the result (the lowest
                // index of a `min` over the equal ones: one integer reduction); where none is
                // (every element NaN), to the first, as argmax/argmin pick then.
                let rk = if keep_dims { r } else { b.expand_dims(r, ax) };
                let rb = b.broadcast_to(rk, &sx);
                let eq = b.eq(x, rb);
                let n = sx[axis];
                let ar = b.arange(0, n as i64);
                let mut at = vec![1usize; sx.len()];
                at[axis] = n;
                let ar = b.reshape(ar, &at);
                let ar = b.broadcast_to(ar, &sx);
                let none = b.i32(n as i32);
                let cand = b.where_(eq, ar, none);
                let first = b.min(cand, Some(ax), true);
                let zi = b.i32(0);
                let missing = b.ge(first, none);
                let idx = b.where_(missing, zi, first);
                let ib = b.broadcast_to(idx, &sx);
                let hot = b.eq(ar, ib);
                let z = cst(b, fl, 0.0);
                let gx = b.where_(hot, gb, z);
                self.acc(xf, gx);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Every op's VJP kernel, run by the reference interpreter, against the evaluator's
    //! gradient on random inputs (sizes that are not multiples of the tiles).
    use super::*;
    use crate::{vjp, GradOptions};
    use rand::{rngs::StdRng, Rng, SeedableRng};
    use tilegrad_reference::{HostTensor, Launch, Memory, TensorId};

    /// A tensor of a test launch: its parameter, shape, and whether it is differentiated
    /// (`input`) and/or has a cotangent (`output`); `data` overrides random values in [-1, 1).
    struct T {
        name: &'static str,
        n: usize,
        input: bool,
        output: bool,
    }

    fn t(name: &'static str, n: usize, input: bool, output: bool) -> T {
        T { name, n, input, output }
    }

    /// Random inputs and cotangents for a launch of `k`; then [`same_gradients`].
    fn agree(k: &Kernel, grid: usize, tensors: &[T], scalars: &[(&str, i32)], dtype: DType, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut mem = Memory::new();
        let mut ids: Vec<TensorId> = Vec::new();
        for tt in tensors {
            let v: Vec<f64> = (0..tt.n).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let init = if tt.input { v } else { vec![0.0; tt.n] };
            ids.push(mem.add(tt.name, HostTensor::from_f64_as(dtype, &[tt.n], &init)));
        }
        let mut launch = Launch::new(k, grid);
        for (tt, &id) in tensors.iter().zip(&ids) {
            launch = launch.arg(tt.name, id);
        }
        for &(s, v) in scalars {
            launch = launch.arg(s, v);
        }
        let cots: Vec<Vec<f64>> = tensors.iter().map(|tt| (0..tt.n).map(|_| rng.gen_range(-1.0..1.0)).collect()).collect();
        let inputs: Vec<TensorId> = tensors.iter().zip(&ids).filter(|(tt, _)| tt.input).map(|(_, &id)| id).collect();
        let outputs: Vec<(TensorId, Vec<f64>)> =
            tensors.iter().zip(&ids).zip(&cots).filter(|((tt, _), _)| tt.output).map(|((_, &id), c)| (id, c.clone())).collect();
        same_gradients(&launch, &mem, &inputs, &outputs);
    }

    /// Runs the evaluator and the VJP kernel (by the reference) on the same launch and asserts
    /// that every input's cotangent is not zero and agrees within 1e-12 normwise; returns the
    /// VJP kernel's.
    fn same_gradients(launch: &Launch, mem: &Memory, inputs: &[TensorId], outputs: &[(TensorId, Vec<f64>)]) -> Vec<Vec<f64>> {
        let k = launch.kernel();
        let want = vjp(launch, mem, inputs, outputs, &GradOptions::default()).unwrap().inputs;
        let max_trips = launch.check(mem).unwrap().max_trips;
        let mut got = Vec::new();
        // With the tensors the kernel only reads or only writes kept in their dtype, with every
        // tensor f64, and computing in f32 (within f32's rounding).
        for (keep, fl, tol) in [(true, DType::F64, 1e-12), (false, DType::F64, 1e-12), (true, DType::F32, 1e-4)] {
            let vk = vjp_kernel_with(k, keep, fl).unwrap();
            got =
                gradient_by_kernel(&vk, launch, mem, inputs, outputs, &max_trips, &mut |l, m| l.run(m).map(|_| ()).map_err(AdError::from))
                    .unwrap_or_else(|e| panic!("{}: {e}\n{}", k.name, vk.kernel));
            let names = inputs.iter().map(|&t| mem.name(t));
            for ((name, want), got) in names.zip(&want).zip(&got) {
                let norm = want.iter().map(|x| x * x).sum::<f64>().sqrt();
                let diff = want.iter().zip(got).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
                assert!(norm > 0.0, "{}: the cotangent of {name} is zero", k.name);
                assert!(
                    diff <= tol * norm,
                    "{} (keep {keep}, {fl}): d{name} differs by {diff:e} (norm {norm:e})\nwant {:?}\ngot  {:?}",
                    k.name,
                    &want[..8.min(want.len())],
                    &got[..8.min(got.len())]
                );
            }
        }
        got
    }

    const BLOCK: i64 = 64;

    /// Program `pid`'s lanes `pid * BLOCK + 0..BLOCK` and the mask of those below `n`.
    fn block_lanes(b: &mut KernelBuilder, n: Value) -> (Value, Value) {
        let pid = b.program_id(0);
        let bs = b.i32(BLOCK as i32);
        let start = b.mul(pid, bs);
        let r = b.arange(0, BLOCK);
        let offs = b.add(start, r);
        let m = b.lt(offs, n);
        (offs, m)
    }

    /// `out[i] = f(x[i], y[i])` over blocks of 64 with a masked tail.
    fn pointwise(name: &str, dtype: DType, f: impl Fn(&mut KernelBuilder, Value, Value) -> Value) -> Kernel {
        let mut b = KernelBuilder::new(name);
        let (x, y, out) = (b.ptr_param("x", dtype), b.ptr_param("y", dtype), b.ptr_param("out", dtype));
        let n = b.scalar_param("n", DType::I32);
        let (offs, m) = block_lanes(&mut b, n);
        let (px, py) = (b.add(x, offs), b.add(y, offs));
        let xv = b.load(px, Some(m), None);
        let yv = b.load(py, Some(m), None);
        let v = f(&mut b, xv, yv);
        let po = b.add(out, offs);
        b.store(po, v, Some(m));
        b.finish().unwrap()
    }

    fn run_pointwise(k: &Kernel, dtype: DType, seed: u64) {
        let n: usize = 300;
        agree(
            k,
            n.div_ceil(BLOCK as usize),
            &[t("x", n, true, false), t("y", n, true, false), t("out", n, false, true)],
            &[("n", n as i32)],
            dtype,
            seed,
        );
    }

    /// `x * x + 0.5`: positive.
    fn positive(b: &mut KernelBuilder, x: Value) -> Value {
        let h = b.f64(0.5);
        let xx = b.mul(x, x);
        b.add(xx, h)
    }

    #[test]
    fn every_unary_op_agrees() {
        for &u in UnaryOp::ALL {
            if u == UnaryOp::Not {
                continue;
            }
            let k = pointwise(u.name(), DType::F64, |b, x, y| {
                let p = positive(b, x);
                let v = match u {
                    UnaryOp::Neg => b.neg(x),
                    UnaryOp::Abs => b.abs(x),
                    UnaryOp::Not => unreachable!(),
                    UnaryOp::Exp => b.exp(x),
                    UnaryOp::Exp2 => b.exp2(x),
                    UnaryOp::Log => b.log(p),
                    UnaryOp::Log2 => b.log2(p),
                    UnaryOp::Sqrt => b.sqrt(p),
                    UnaryOp::Rsqrt => b.rsqrt(p),
                    UnaryOp::Sin => b.sin(x),
                    UnaryOp::Cos => b.cos(x),
                    UnaryOp::Tanh => b.tanh(x),
                    UnaryOp::Sigmoid => b.sigmoid(x),
                    UnaryOp::Erf => b.erf(x),
                    UnaryOp::Floor => b.floor(x),
                    UnaryOp::Ceil => b.ceil(x),
                };
                // Times y, plus x / 4: both inputs have cotangents (floor and ceil give none).
                let vy = b.mul(v, y);
                let q = b.f64(0.25);
                let xq = b.mul(x, q);
                b.add(vy, xq)
            });
            run_pointwise(&k, DType::F64, 1);
        }
    }

    #[test]
    fn every_float_binary_op_agrees_ties_included() {
        for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Mod, BinaryOp::Min, BinaryOp::Max, BinaryOp::Pow] {
            let k = pointwise(op.name(), DType::F64, |b, x, y| {
                // Every third lane's y equals x (ties of min and max).
                let r = b.arange(0, BLOCK);
                let three = b.i32(3);
                let m = b.rem(r, three);
                let z = b.i32(0);
                let tie = b.eq(m, z);
                let y = b.where_(tie, x, y);
                let py = positive(b, y);
                let px = positive(b, x);
                match op {
                    BinaryOp::Add => b.add(x, y),
                    BinaryOp::Sub => b.sub(x, y),
                    BinaryOp::Mul => b.mul(x, y),
                    BinaryOp::Div => b.div(x, py),
                    BinaryOp::Mod => b.rem(x, py),
                    BinaryOp::Min => b.minimum(x, y),
                    BinaryOp::Max => b.maximum(x, y),
                    _ => b.pow(px, y),
                }
            });
            run_pointwise(&k, DType::F64, 2);
        }
    }

    #[test]
    fn where_casts_and_f32_kernels_agree() {
        let k = pointwise("select", DType::F32, |b, x, y| {
            let z = b.f32(0.0);
            let c = b.gt(x, z);
            let e = b.exp(y);
            let s = b.where_(c, e, x);
            let h = b.cast(s, DType::F16);
            let back = b.cast(h, DType::F32);
            b.mul(back, x)
        });
        run_pointwise(&k, DType::F32, 3);
    }

    /// Rows of `x` ([rows, 37], 8 rows a program) reduced and scanned: sums, max and min over
    /// either axis, kept or not, a cumsum each way, and a softmax.
    #[test]
    fn reductions_scans_and_broadcasts_agree() {
        const R: usize = 8;
        const C: usize = 37;
        let mut b = KernelBuilder::new("rows");
        let (x, w, out, red) =
            (b.ptr_param("x", DType::F64), b.ptr_param("w", DType::F64), b.ptr_param("out", DType::F64), b.ptr_param("red", DType::F64));
        let rows = b.scalar_param("rows", DType::I32);
        let pid = b.program_id(0);
        let rs = b.i32(R as i32);
        let r0 = b.mul(pid, rs);
        let ar = b.arange(0, R as i64);
        let r = b.add(r0, ar);
        let c = b.arange(0, 64);
        let cc = b.i32(C as i32);
        let (r2, c2) = (b.expand_dims(r, 1), b.expand_dims(c, 0));
        let off = b.mul(r2, cc);
        let off = b.add(off, c2);
        let (rm, cm) = (b.lt(r2, rows), b.lt(c2, cc));
        let m = b.and(rm, cm);
        let px = b.add(x, off);
        let ninf = b.f64(-1e300);
        let xv = b.load(px, Some(m), Some(ninf));
        let pw = b.add(w, c);
        let wm = b.lt(c, cc);
        let zero = b.f64(0.0);
        let wv = b.load(pw, Some(wm), Some(zero));
        let wv = b.expand_dims(wv, 0);
        // softmax(x) * w + cumsums.
        let mx = b.max(xv, Some(1), true);
        let sh = b.sub(xv, mx);
        let e = b.exp(sh);
        let s = b.sum(e, Some(1), false);
        let s = b.expand_dims(s, 1);
        let sm = b.div(e, s);
        let y = b.mul(sm, wv);
        let xz = b.where_(m, xv, zero);
        let cs = b.cumsum(xz, 1, false);
        let cr = b.cumsum(xz, 0, true);
        let y = b.add(y, cs);
        let y = b.add(y, cr);
        let po = b.add(out, off);
        b.store(po, y, Some(m));
        // Per-row and per-column extremes and sums, into red[pid * (R + 3*64) ...].
        let big = b.f64(1e300);
        let xl = b.where_(m, xv, big);
        let mn0 = b.min(xl, Some(0), false);
        let mx0 = b.max(xv, Some(0), false);
        let s0 = b.sum(xz, Some(0), true);
        let s0 = b.reshape(s0, &[64]);
        let mn1 = b.min(xl, Some(1), false);
        let v = b.add(mn0, mx0);
        let v = b.add(v, s0);
        let base = b.i32((R + 64) as i32);
        let rb = b.mul(pid, base);
        let offc = b.add(rb, c);
        let pc = b.add(red, offc);
        b.store(pc, v, Some(wm));
        let sixty4 = b.i32(64);
        let offr = b.add(rb, sixty4);
        let offr = b.add(offr, ar);
        let pr = b.add(red, offr);
        let rmf = b.lt(r, rows);
        b.store(pr, mn1, Some(rmf));
        let k = b.finish().unwrap();
        let rows_n: usize = 29;
        let progs = rows_n.div_ceil(R);
        agree(
            &k,
            progs,
            &[
                t("x", rows_n * C, true, false),
                t("w", C, true, false),
                t("out", rows_n * C, false, true),
                t("red", progs * (R + 64), false, true),
            ],
            &[("rows", rows_n as i32)],
            DType::F64,
            4,
        );
    }

    /// Pointers `p + r[:, None] * nc + c[None, :]` into a row-major [nr, nc] tensor, and the
    /// mask of those inside it.
    fn masked_tile(b: &mut KernelBuilder, p: Value, r: Value, c: Value, nr: usize, nc: usize) -> (Value, Value) {
        let (r2, c2) = (b.expand_dims(r, 1), b.expand_dims(c, 0));
        let ncv = b.i32(nc as i32);
        let o = b.mul(r2, ncv);
        let o = b.add(o, c2);
        let nrv = b.i32(nr as i32);
        let (m1, m2) = (b.lt(r2, nrv), b.lt(c2, ncv));
        let m = b.and(m1, m2);
        (b.add(p, o), m)
    }

    /// One tile of `a @ b + c` (masked to 45x29x21 within 64x32x32) in each precision.
    #[test]
    fn dot_agrees() {
        let (mm, nn, kk) = (45usize, 29usize, 21usize);
        for prec in [DotPrecision::Ieee, DotPrecision::Tf32] {
            let mut b = KernelBuilder::new("dot");
            let (pa, pb, pc, po) =
                (b.ptr_param("a", DType::F32), b.ptr_param("b", DType::F32), b.ptr_param("c", DType::F32), b.ptr_param("o", DType::F32));
            let (rm, rn, rk) = (b.arange(0, 64), b.arange(0, 32), b.arange(0, 32));
            let (ap, am) = masked_tile(&mut b, pa, rm, rk, mm, kk);
            let (bp, bm) = masked_tile(&mut b, pb, rk, rn, kk, nn);
            let (cp, cm) = masked_tile(&mut b, pc, rm, rn, mm, nn);
            let z = b.f32(0.0);
            let av = b.load(ap, Some(am), Some(z));
            let bv = b.load(bp, Some(bm), Some(z));
            let cv = b.load(cp, Some(cm), Some(z));
            let d = b.dot_with(av, bv, Some(cv), prec);
            let (op, om) = masked_tile(&mut b, po, rm, rn, mm, nn);
            b.store(op, d, Some(om));
            let k = b.finish().unwrap();
            agree(
                &k,
                1,
                &[t("a", mm * kk, true, false), t("b", kk * nn, true, false), t("c", mm * nn, true, false), t("o", mm * nn, false, true)],
                &[],
                DType::F32,
                5,
            );
        }
    }

    /// In place: `x = x * x`, stored, loaded again and stored plus one; and an atomic sum of
    /// squares into `total`.
    #[test]
    fn in_place_loads_after_stores_and_atomic_adds_agree() {
        let mut b = KernelBuilder::new("in_place");
        let (x, total) = (b.ptr_param("x", DType::F64), b.ptr_param("total", DType::F64));
        let n = b.scalar_param("n", DType::I32);
        let (offs, m) = block_lanes(&mut b, n);
        let px = b.add(x, offs);
        let xv = b.load(px, Some(m), None);
        let sq = b.mul(xv, xv);
        b.store(px, sq, Some(m));
        let again = b.load(px, Some(m), None);
        let one = b.f64(1.0);
        let y = b.add(again, one);
        let y = b.mul(y, xv);
        b.store(px, y, Some(m));
        let z = b.f64(0.0);
        let sqm = b.where_(m, sq, z);
        let s = b.sum(sqm, None, false);
        b.atomic_add(total, s, None);
        let k = b.finish().unwrap();
        let nv: usize = 200;
        agree(&k, nv.div_ceil(BLOCK as usize), &[t("x", nv, true, true), t("total", 1, true, true)], &[("n", nv as i32)], DType::F64, 6);
    }

    /// Rows of `x` [rows, d] weighted by `w` [d] and summed, over tiles of d in a loop (the
    /// weighted sum), plus the running maximum of each row carried too.
    #[test]
    fn loops_agree() {
        const R: i64 = 4;
        const D: i64 = 16;
        let mut b = KernelBuilder::new("weighted_rows");
        let (x, w, out) = (b.ptr_param("x", DType::F32), b.ptr_param("w", DType::F32), b.ptr_param("out", DType::F32));
        let (rows, d) = (b.scalar_param("rows", DType::I32), b.scalar_param("d", DType::I32));
        let pid = b.program_id(0);
        let rt = b.i32(R as i32);
        let r0 = b.mul(pid, rt);
        let ar = b.arange(0, R);
        let r = b.add(r0, ar);
        let rm = b.lt(r, rows);
        let acc0 = b.zeros(&[R as usize], DType::F32);
        let mx0 = b.full(&[R as usize], -1e30f32, DType::F32);
        // A value from outside the loop that every trip uses: w[0] scales the products.
        let scale = b.load(w, None, None);
        let (lo, dt) = (b.i32(0), b.i32(D as i32));
        let hi = b.cdiv(d, dt);
        let one = b.i32(1);
        let res = b.for_range(lo, hi, one, None, &[acc0, mx0], |b, kt, c| {
            let dt = b.i32(D as i32);
            let c0 = b.mul(kt, dt);
            let ac = b.arange(0, D);
            let cols = b.add(c0, ac);
            let cm = b.lt(cols, d);
            let (r2, c2) = (b.expand_dims(r, 1), b.expand_dims(cols, 0));
            let o = b.mul(r2, d);
            let o = b.add(o, c2);
            let (m1, m2) = (b.expand_dims(rm, 1), b.expand_dims(cm, 0));
            let m = b.and(m1, m2);
            let px = b.add(x, o);
            let z = b.f32(0.0);
            let xv = b.load(px, Some(m), Some(z));
            let pw = b.add(w, cols);
            let wv = b.load(pw, Some(cm), Some(z));
            let wv = b.expand_dims(wv, 0);
            let p = b.mul(xv, wv);
            let p = b.mul(p, scale);
            let s = b.sum(p, Some(1), false);
            let acc = b.add(c[0], s);
            let big = b.f32(-1e30);
            let xm = b.where_(m, xv, big);
            let rmax = b.max(xm, Some(1), false);
            let mx = b.maximum(c[1], rmax);
            vec![acc, mx]
        });
        let v = b.add(res[0], res[1]);
        let po = b.add(out, r);
        b.store(po, v, Some(rm));
        let k = b.finish().unwrap();
        let (rows_n, d_n) = (11usize, 45usize);
        agree(
            &k,
            rows_n.div_ceil(R as usize),
            &[t("x", rows_n * d_n, true, false), t("w", d_n, true, false), t("out", rows_n, false, true)],
            &[("rows", rows_n as i32), ("d", d_n as i32)],
            DType::F32,
            7,
        );
    }

    /// A loop whose body stores (tile by tile, `y = x * x`) and accumulates a dot product of
    /// tiles over k: a matmul.
    #[test]
    fn loops_with_stores_and_dots_agree() {
        let (mm, nn, kk) = (19usize, 23usize, 37usize);
        let mut b = KernelBuilder::new("matmul_loop");
        let (pa, pb, pc, py) =
            (b.ptr_param("a", DType::F64), b.ptr_param("b", DType::F64), b.ptr_param("c", DType::F64), b.ptr_param("y", DType::F64));
        let kv = b.scalar_param("k", DType::I32);
        let (rm, rn) = (b.arange(0, 32), b.arange(0, 32));
        let acc0 = b.zeros(&[32, 32], DType::F64);
        let (lo, hi, st) = (b.i32(0), b.i32(kk.div_ceil(8) as i32), b.i32(1));
        let res = b.for_range(lo, hi, st, Some(8), &[acc0], |b, kt, c| {
            let eight = b.i32(8);
            let k0 = b.mul(kt, eight);
            let ak = b.arange(0, 8);
            let ks = b.add(k0, ak);
            let km = b.lt(ks, kv);
            let z = b.f64(0.0);
            let (pap, am) = masked_tile(b, pa, rm, ks, mm, kk);
            let av = b.load(pap, Some(am), Some(z));
            let (pbp, bm) = masked_tile(b, pb, ks, rn, kk, nn);
            let bv = b.load(pbp, Some(bm), Some(z));
            // y[k] = sum over the tile's rows of a^2 (a store in the loop).
            let sq = b.mul(av, av);
            let ys = b.sum(sq, Some(0), false);
            let pyp = b.add(py, ks);
            b.store(pyp, ys, Some(km));
            vec![b.dot(av, bv, Some(c[0]))]
        });
        let (pcp, cm) = masked_tile(&mut b, pc, rm, rn, mm, nn);
        let s = b.sigmoid(res[0]);
        b.store(pcp, s, Some(cm));
        let k = b.finish().unwrap();
        // The accumulator is only added to: the loop keeps no tape.
        let vk = vjp_kernel(&k).unwrap();
        assert_eq!(vk.tapes[0].per_trip, 0);
        // Nothing reads `c` or `y` back, so the forward's stores are gone, and so are the tape
        // loop's loads (it keeps nothing): `a` is loaded by the forward's loop (the sigmoid's
        // derivative needs its result) and the reverse loop only; `c` and `y` are never written.
        let src = tilegrad_ir::analysis::pointer_sources(&vk.kernel);
        let param = |n: &str| vk.kernel.params.iter().position(|p| p.name == n).unwrap();
        let (mut loads_a, mut writes_cy) = (0, 0);
        vk.kernel.walk(&mut |_, d| {
            let into = |j: usize| src[d.args[0].index()].get(j).copied().unwrap_or(false);
            match d.op {
                Op::Load { .. } if into(param("a")) => loads_a += 1,
                _ if d.op.writes_memory() && (into(param("c")) || into(param("y"))) => writes_cy += 1,
                _ => {}
            }
        });
        assert_eq!((loads_a, writes_cy), (2, 0));
        agree(
            &k,
            1,
            &[t("a", mm * kk, true, false), t("b", kk * nn, true, false), t("c", mm * nn, false, true), t("y", kk, false, true)],
            &[("k", kk as i32)],
            DType::F64,
            8,
        );
    }

    /// Per row: when `flag[row]` is 0 the row's loss is 0 (an early return); otherwise a loop
    /// over column tiles sums `exp(x) * s` where `s` (a scale loaded before the branch) is from
    /// outside both the branch and the loop, and a second branch picks `max` or `min` of the
    /// row by the sign of its first element.
    #[test]
    fn branches_agree_with_loops_inside() {
        const C: i64 = 16;
        let mut b = KernelBuilder::new("branchy");
        let (x, flag, sc, loss) = (
            b.ptr_param("x", DType::F64),
            b.ptr_param("flag", DType::I32),
            b.ptr_param("scale", DType::F64),
            b.ptr_param("loss", DType::F64),
        );
        let d = b.scalar_param("d", DType::I32);
        let row = b.program_id(0);
        let pf = b.add(flag, row);
        let f = b.load(pf, None, None);
        let s = b.load(sc, None, None);
        let zi = b.i32(0);
        let skip = b.eq(f, zi);
        let base = b.mul(row, d);
        let out = b.if_else(
            skip,
            |b| vec![b.f64(0.0)],
            |b| {
                let (lo, ct, one) = (b.i32(0), b.i32(C as i32), b.i32(1));
                let hi = b.cdiv(d, ct);
                let z = b.f64(0.0);
                let res = b.for_range(lo, hi, one, None, &[z], |b, t, c| {
                    let ct = b.i32(C as i32);
                    let c0 = b.mul(t, ct);
                    let ar = b.arange(0, C);
                    let cols = b.add(c0, ar);
                    let m = b.lt(cols, d);
                    let o = b.add(base, cols);
                    let p = b.add(x, o);
                    let zf = b.f64(0.0);
                    let v = b.load(p, Some(m), Some(zf));
                    let e = b.exp(v);
                    let e = b.mul(e, s);
                    let e = b.where_(m, e, zf);
                    let tot = b.sum(e, None, false);
                    vec![b.add(c[0], tot)]
                });
                let p0 = b.add(x, base);
                let x0 = b.load(p0, None, None);
                let zf = b.f64(0.0);
                let pos = b.gt(x0, zf);
                let pick = b.if_else(pos, |b| vec![b.maximum(res[0], x0)], |b| vec![b.minimum(res[0], s)]);
                vec![b.mul(pick[0], x0)]
            },
        );
        let pl = b.add(loss, row);
        b.store(pl, out[0], None);
        let k = b.finish().unwrap();
        let (rows, dn) = (9usize, 37usize);
        // Flags: rows 2 and 5 skipped.
        let mut rng = StdRng::seed_from_u64(9);
        let mut mem = Memory::new();
        let xs: Vec<f64> = (0..rows * dn).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let xt = mem.add("x", HostTensor::from_f64(&[rows * dn], xs));
        let ft = mem.add("flag", HostTensor::from_i32(&[rows], (0..rows).map(|r| i32::from(r != 2 && r != 5)).collect()));
        let st = mem.add("scale", HostTensor::from_f64(&[1], vec![0.75]));
        let lt = mem.add("loss", HostTensor::zeros(DType::F64, &[rows]));
        let launch = Launch::new(&k, rows).arg("x", xt).arg("flag", ft).arg("scale", st).arg("loss", lt).arg("d", dn as i32);
        let cot: Vec<f64> = (0..rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let got = same_gradients(&launch, &mem, &[xt, st], &[(lt, cot)]);
        // Skipped rows get nothing.
        assert!(got[0][2 * dn..3 * dn].iter().all(|&g| g == 0.0));
    }

    #[test]
    fn what_is_not_supported_yet_is_refused_with_its_location() {
        // A loop that loads what the kernel stores.
        let mut b = KernelBuilder::new("reads_its_writes");
        let x = b.ptr_param("x", DType::F64);
        let (lo, hi, st) = (b.i32(0), b.i32(4), b.i32(1));
        let z = b.f64(0.0);
        let res = b.for_range(lo, hi, st, None, &[z], |b, i, carried| {
            let p = b.add(x, i);
            let v = b.load(p, None, None);
            vec![b.add(carried[0], v)]
        });
        b.store(x, res[0], None);
        let k = b.finish().unwrap();
        let e = vjp_kernel(&k).unwrap_err().to_string();
        assert!(e.contains("reads a tensor the kernel writes") && e.contains("vjp_kernel.rs"), "{e}");
        // A loop inside a loop.
        let mut b = KernelBuilder::new("nested");
        let x = b.ptr_param("x", DType::F64);
        let y = b.ptr_param("y", DType::F64);
        let (lo, hi, st) = (b.i32(0), b.i32(3), b.i32(1));
        let z = b.f64(0.0);
        let res = b.for_range(lo, hi, st, None, &[z], |b, _, c| {
            let (lo, hi, st) = (b.i32(0), b.i32(2), b.i32(1));
            b.for_range(lo, hi, st, None, &[c[0]], |b, j, c| {
                let p = b.add(x, j);
                let v = b.load(p, None, None);
                vec![b.add(c[0], v)]
            })
        });
        b.store(y, res[0], None);
        let k = b.finish().unwrap();
        let e = vjp_kernel(&k).unwrap_err().to_string();
        assert!(e.contains("loops inside loops") && e.contains("op `for`"), "{e}");
    }

    /// `while` loops: one whose condition reads a float carried value (c -> 2c + c^2 until it
    /// reaches 1, a number of trips that differs per program), and one that walks a row's
    /// column blocks, as kernels written in Triton do.
    #[test]
    fn while_loops_agree() {
        let mut b = KernelBuilder::new("doubling");
        let x = b.ptr_param("x", DType::F64);
        let y = b.ptr_param("y", DType::F64);
        let pid = b.program_id(0);
        let px = b.add(x, pid);
        let v = b.load(px, None, None);
        let v = b.abs(v);
        let tiny = b.f64(0.01);
        let v = b.add(v, tiny);
        let res = b.while_loop(
            Some(16),
            &[v],
            |b, c| {
                let one = b.f64(1.0);
                b.lt(c[0], one)
            },
            |b, c| {
                let two = b.f64(2.0);
                let d = b.mul(c[0], two);
                let sq = b.mul(c[0], c[0]);
                vec![b.add(d, sq)]
            },
        );
        let py = b.add(y, pid);
        b.store(py, res[0], None);
        let k = b.finish().unwrap();
        let vk = vjp_kernel(&k).unwrap();
        assert_eq!(vk.tapes.len(), 1);
        assert_eq!(vk.tapes[0].per_trip, 1, "the carried value's value is read by its square's rule");
        agree(&k, 9, &[t("x", 9, true, false), t("y", 9, false, true)], &[], DType::F64, 11);

        // Row blocks: while start < n: acc = acc / 2 + sum(exp(x) * w); start += B (the
        // halving makes each block's weight depend on its trip: reversed in the wrong order, the
        // gradients differ).
        const B: i64 = 16;
        let mut b = KernelBuilder::new("row_blocks");
        let x = b.ptr_param("x", DType::F32);
        let w = b.ptr_param("w", DType::F32);
        let out = b.ptr_param("out", DType::F32);
        let n = b.scalar_param("n", DType::I32);
        let row = b.program_id(0);
        let base = b.mul(row, n);
        let (z, s0) = (b.f32(0.0), b.i32(0));
        let res = b.while_loop(
            None,
            &[z, s0],
            |b, c| b.lt(c[1], n),
            |b, c| {
                let ar = b.arange(0, B);
                let cols = b.add(c[1], ar);
                let m = b.lt(cols, n);
                let o = b.add(base, cols);
                let pxo = b.add(x, o);
                let zero = b.f32(0.0);
                let xv = b.load(pxo, Some(m), Some(zero));
                let pw = b.add(w, cols);
                let wv = b.load(pw, Some(m), Some(zero));
                let e = b.exp(xv);
                let p = b.mul(e, wv);
                let p = b.where_(m, p, zero);
                let s = b.sum(p, None, false);
                let bb = b.i32(B as i32);
                let half = b.f32(0.5);
                let decayed = b.mul(c[0], half);
                vec![b.add(decayed, s), b.add(c[1], bb)]
            },
        );
        let po = b.add(out, row);
        b.store(po, res[0], None);
        let k = b.finish().unwrap();
        let (rows, cols) = (5usize, 37usize);
        agree(
            &k,
            rows,
            &[t("x", rows * cols, true, false), t("w", cols, true, false), t("out", rows, false, true)],
            &[("n", cols as i32)],
            DType::F32,
            12,
        );
    }
}
