//! The emitter: one VJP rule per op, each emitting the IR of its adjoint; loops (tape copy and
//! reverse loop) and branches; memory adjoints through shadows.

use super::refuse::unsupported;
use super::taped::LoadSlot;
use super::{LoopCheckpoints, LoopTape};
use crate::AdError;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use tilegrad_ir::{BinaryOp, DType, DotPrecision, Elem, Inst, Kernel, KernelBuilder, Op, ReduceOp, UnaryOp, Value};

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

/// Whether a block (with its nested blocks) loads: a cotangent of what it yields may then
/// reach memory through a load's adjoint.
fn has_loads(k: &Kernel, blk: tilegrad_ir::Block) -> bool {
    k.block(blk).insts.iter().any(|&i| {
        let op = &k.inst(i).op;
        matches!(op, Op::Load { .. }) || op.blocks().into_iter().any(|b| has_loads(k, b))
    })
}

/// The emitter, for one scope (the kernel's body, or a reverse trip of a loop): the promoted
/// forward (to read types from), the builder, the shadow of each forward pointer value, the
/// adjoint of each forward float value reached so far, and the value that stands for each
/// forward value here (itself, outside loops).
pub(super) struct Emit<'k, 'b> {
    pub(super) k: &'k Kernel,
    pub(super) b: &'b mut KernelBuilder,
    pub(super) shadow: HashMap<Value, Value>,
    pub(super) adj: HashMap<Value, Value>,
    /// The loops and branches of the forward this scope has recomputed, each with its copy
    /// here: a loop's reverse puts its tape-writing copy in the recomputed loop's place
    /// ([`Emit::reverse_loop`]).
    pub(super) recomputed: HashMap<Inst, Inst>,
    /// This scope is where the forward ran, once a program: the kernel's body, or a side of a
    /// branch reversed in place ([`Emit::reverse_if_in_place`]). Its `for` loops write their
    /// own tapes.
    pub(super) in_place: bool,
    pub(super) map: HashMap<Value, Value>,
    pub(super) tapes: &'k Tapes,
    /// The dtype of the arithmetic, cotangents and shadows (f64, or f32).
    pub(super) fl: DType,
    /// The trip (i32) of the loop whose body this scope recomputes, where it is one: the slot
    /// its taped loads read back ([`super::taped`]).
    pub(super) trip: Option<Value>,
}

/// The loops' tapes, as the sweep adds them, and the name of the scalar parameter that takes
/// the linear id of the first program of a launch's batch (tapes hold the batch's programs).
pub(super) struct Tapes {
    pub(super) list: RefCell<Vec<LoopTape>>,
    pub(super) first: String,
    /// Loops keep checkpoints and recompute segments (see [`LoopTape::checkpoints`]).
    pub(super) checkpoints: bool,
    /// The loads whose values the forward keeps on a tape, and where ([`super::taped`]).
    pub(super) loads: RefCell<HashMap<Inst, LoadSlot>>,
}

/// A trip's slot on a tape, from its index (the index itself, or its place in a segment).
type SlotOf<'a> = dyn Fn(&mut KernelBuilder, Value) -> Value + 'a;

/// Where a tape keeps carried values: a trip's slots start at `base + t * per_trip` (i64
/// scalars) in `tape`, carried value `j` at `at[j]` within them.
#[derive(Clone, Copy)]
pub(super) struct Slots<'a> {
    pub(super) tape: Value,
    pub(super) base: Value,
    pub(super) per_trip: Value,
    pub(super) at: &'a [usize],
}

/// Pointers to the slots of trip `t` (i32 scalar) of each of `carried` (forward values of `k`).
pub(super) fn trip_slots(b: &mut KernelBuilder, k: &Kernel, sl: Slots<'_>, t: Value, carried: &[Value]) -> Vec<Value> {
    let t64 = b.cast(t, DType::I64);
    let off = b.mul(t64, sl.per_trip);
    let slot = b.add(sl.base, off);
    carried
        .iter()
        .zip(sl.at)
        .map(|(&c, &a)| {
            let o = b.i64(a as i64);
            let o = b.add(slot, o);
            let p = b.add(sl.tape, o);
            let shape = k.ty(c).shape.to_vec();
            if shape.is_empty() {
                return p;
            }
            let r = b.arange(0, shape.iter().product::<usize>() as i64);
            let r = b.reshape(r, &shape);
            b.add(p, r)
        })
        .collect()
}

/// Stores a trip's kept values `vals` (of `taped`, in the tape's dtype) to their slots of trip
/// `at_t`: the scalars in one store (one bounds check a trip, not one a value: on a GPU each
/// check waits for the block), the tiles one by one.
fn write_trip(b: &mut KernelBuilder, k: &Kernel, sl: Slots<'_>, at_t: Value, taped: &[Value], vals: &[Value]) {
    let ptrs = trip_slots(b, k, sl, at_t, taped);
    let scalars: Vec<usize> = (0..taped.len()).filter(|&j| k.ty(taped[j]).shape.is_empty()).collect();
    if scalars.len() > 1 {
        let n = scalars.len().next_power_of_two();
        let ar = b.arange(0, n as i64);
        // They take the trip's first slots, in order (see `at`).
        let p = b.add(ptrs[scalars[0]], ar);
        let mut v = b.broadcast_to(vals[scalars[scalars.len() - 1]], &[n]);
        for &j in scalars[..scalars.len() - 1].iter().rev() {
            let q = b.i32(sl.at[j] as i32);
            let here = b.eq(ar, q);
            let vj = b.broadcast_to(vals[j], &[n]);
            v = b.where_(here, vj, v);
        }
        let ns = b.i32(scalars.len() as i32);
        let m = b.lt(ar, ns);
        b.store(p, v, Some(m));
    }
    for j in 0..taped.len() {
        if scalars.len() <= 1 || !scalars.contains(&j) {
            b.store(ptrs[j], vals[j], None);
        }
    }
}

/// A `for` loop that runs once a program where the forward ran it (the kernel's body, a branch
/// reversed in place) writes its own tape: each trip of the forward's loop (its `body`, its
/// induction variable, lower bound and step in `ivs`) first stores its kept carried values
/// `taped` (at `at` among a trip's `per_trip` slots of `tape`, whose program slots start from
/// parameters `first` and `cap` in `tc`), as no copy need run again. Liger-Kernel's cross
/// entropy, whose loops sit after an early return, runs its first loop twice in its VJP kernel
/// instead of four times. Each trip finds its slots (a few integer ops) rather than keep them
/// in registers from the kernel's start.
#[allow(clippy::too_many_arguments)]
fn tape_in_place(
    b: &mut KernelBuilder,
    k: &Kernel,
    body: tilegrad_ir::Block,
    ivs: (Value, Value, Value),
    tc: (Value, Value, Value),
    (at, per_trip): (&[usize], usize),
    taped: &[Value],
    tdt: DType,
) {
    if taped.is_empty() {
        return;
    }
    let ((iv, lo, st), (tape, first, cap)) = (ivs, tc);
    b.insert_into(body, None, |b| {
        let pix = program_index(b);
        let pix = b.sub(pix, first);
        let s = b.i64(per_trip as i64);
        let base = b.mul(pix, cap);
        let base = b.mul(base, s);
        let t = super::taped::trip_of(b, iv, lo, st);
        let vals: Vec<Value> = taped.iter().map(|&c| if k.ty(c).dtype() == Some(tdt) { c } else { b.cast(c, tdt) }).collect();
        write_trip(b, k, Slots { tape, base, per_trip: s, at }, t, taped, &vals);
    });
}

/// The trips (i32) of `for` loop bounds `lo`, `hi`, `step`, as the forward counts them: `0`
/// where the span is empty, else `cdiv(span, |step|)` (a zero step failed in the forward); with
/// a step known `positive` (a constant, as loops over tiles have), `cdiv(max(hi - lo, 0), step)`.
fn trip_count(b: &mut KernelBuilder, lo: Value, hi: Value, st: Value, positive: bool) -> Value {
    let (lo, hi, st) = (b.cast(lo, DType::I64), b.cast(hi, DType::I64), b.cast(st, DType::I64));
    let (z, one) = (b.i64(0), b.i64(1));
    let (span, ast) = match positive {
        true => (b.sub(hi, lo), st),
        false => {
            let up = b.gt(st, z);
            let (fwd, back) = (b.sub(hi, lo), b.sub(lo, hi));
            let span = b.where_(up, fwd, back);
            let neg = b.sub(z, st);
            let ast = b.where_(up, st, neg);
            (span, b.maximum(ast, one))
        }
    };
    let span = b.maximum(span, z);
    let n = b.add(span, ast);
    let n = b.sub(n, one);
    let n = b.floordiv(n, ast);
    b.cast(n, DType::I32)
}

/// Whether `v` is an integer constant above zero in `k`.
fn positive_const(k: &Kernel, v: Value) -> bool {
    let mut found = false;
    k.walk(&mut |_, d| {
        if let (Op::Const { value: tilegrad_ir::Lit::Int(n) }, Some(&r)) = (&d.op, d.results.first()) {
            found |= r == v && *n > 0;
        }
    });
    found
}

/// The program's index in the grid, as an i64 scalar.
pub(super) fn program_index(b: &mut KernelBuilder) -> Value {
    let (p0, p1, p2) = (b.program_id(0), b.program_id(1), b.program_id(2));
    let (n0, n1) = (b.num_programs(0), b.num_programs(1));
    let (p0, p1, p2, n0, n1) =
        (b.cast(p0, DType::I64), b.cast(p1, DType::I64), b.cast(p2, DType::I64), b.cast(n0, DType::I64), b.cast(n1, DType::I64));
    let t = b.mul(p2, n1);
    let t = b.add(t, p1);
    let t = b.mul(t, n0);
    b.add(t, p0)
}

/// A constant of the arithmetic's dtype.
fn cst(b: &mut KernelBuilder, fl: DType, x: f64) -> Value {
    if fl == DType::F32 {
        b.f32(x as f32)
    } else {
        b.f64(x)
    }
}

impl<'k, 'b> Emit<'k, 'b> {
    /// What stands for forward value `x` here.
    /// A scope of the sweep (a loop body's, a branch side's, a copy's) over kernel `k` with its
    /// `tapes`, computing in `fl`: the shadows and forward values it starts from, the trip it
    /// recomputes where it is one; no cotangents yet, nothing recomputed, not where the forward
    /// ran.
    pub(super) fn scope(
        (k, tapes, fl): (&'k Kernel, &'k Tapes, DType),
        b: &'b mut KernelBuilder,
        shadow: HashMap<Value, Value>,
        map: HashMap<Value, Value>,
        trip: Option<Value>,
    ) -> Self {
        Emit { k, b, shadow, adj: HashMap::new(), recomputed: HashMap::new(), in_place: false, map, tapes, fl, trip }
    }

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
    pub(super) fn shadow_pointer(&mut self, i: Inst) {
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
        let slot = self.tapes.loads.borrow().get(&i).copied();
        if let Some(slot) = slot {
            // A taped load: its value in this trip, as the forward's loop kept it.
            let t = match (slot.in_loop, self.trip) {
                (true, Some(t)) => t,
                (true, None) => unreachable!("a taped load of a loop is recomputed in a trip of it"),
                (false, _) => self.b.i32(0),
            };
            let r = d.results[0];
            let p =
                trip_slots(self.b, self.k, Slots { tape: slot.tape, base: slot.base, per_trip: slot.per_trip, at: &[slot.at] }, t, &[r])[0];
            let v = self.b.load(p, None, None);
            let dt = self.k.ty(r).dtype().expect("a taped load is of floats");
            let v = if dt == self.fl { v } else { self.b.cast(v, dt) };
            self.map.insert(r, v);
            return;
        }
        let args: Vec<Value> = d.args.iter().map(|&a| self.v(a)).collect();
        let (k, tapes, fl, trip) = (self.k, self.tapes, self.fl, self.trip);
        let block = |b: &mut KernelBuilder,
                     blk: tilegrad_ir::Block,
                     params: &[Value],
                     shadow: HashMap<Value, Value>,
                     map: HashMap<Value, Value>,
                     trip: Option<Value>|
         -> Vec<Value> {
            let mut e = Emit::scope((k, tapes, fl), b, shadow, map, trip);
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
                let taped = self.tapes.loads.borrow().keys().any(|&j| super::taped::holding(k, *body, j).is_some());
                self.b.for_range(args[0], args[1], args[2], *max_iters, &args[3..], |b, iv, cs| {
                    let params: Vec<Value> = std::iter::once(iv).chain(cs.iter().copied()).collect();
                    let trip = taped.then(|| super::taped::trip_of(b, iv, args[0], args[2]));
                    block(b, *body, &params, shadow, map, trip)
                })
            }
            Op::While { cond, body, max_iters } => {
                let (s1, m1, s2, m2) = (self.shadow.clone(), self.map.clone(), self.shadow.clone(), self.map.clone());
                self.b.while_loop(
                    *max_iters,
                    &args,
                    |b, cs| block(b, *cond, cs, s1, m1, None)[0],
                    |b, cs| block(b, *body, cs, s2, m2, None),
                )
            }
            Op::If { then_block, else_block } => {
                let (s1, m1, s2, m2) = (self.shadow.clone(), self.map.clone(), self.shadow.clone(), self.map.clone());
                self.b.if_else(args[0], |b| block(b, *then_block, &[], s1, m1, trip), |b| block(b, *else_block, &[], s2, m2, trip))
            }
            _ => {
                let tys = d.results.iter().map(|&r| self.k.ty(r).clone()).collect();
                self.b.push(d.op.clone(), &args, tys).to_vec()
            }
        };
        if !d.op.blocks().is_empty() {
            if let Some(here) = self.b.last_inst() {
                self.recomputed.insert(i, here);
            }
        }
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
        let outer = self.float_outer_uses([then_block, else_block]);
        let res_adj: Vec<Option<Value>> = d.results.iter().map(|r| self.adj.get(r).copied()).collect();
        // Nothing to do where no cotangent leaves the branch: no float from outside it, no
        // memory adjoint of its own (stores, atomics), and no load that a cotangent of what it
        // yields reaches.
        let loads_reached = res_adj.iter().any(Option::is_some) && (has_loads(k, then_block) || has_loads(k, else_block));
        if outer.is_empty() && !loads_reached && !has_effects(k, then_block) && !has_effects(k, else_block) {
            return Ok(());
        }
        let err: RefCell<Option<AdError>> = RefCell::new(None);
        let (tapes, fl, trip) = (self.tapes, self.fl, self.trip);
        let side = |b: &mut KernelBuilder, blk: tilegrad_ir::Block, shadow: HashMap<Value, Value>, map: HashMap<Value, Value>| {
            Emit::scope((k, tapes, fl), b, shadow, map, trip).reverse_side(blk, &res_adj, &outer, &d.loc, &err)
        };
        let c = self.v(d.args[0]);
        let (s1, m1, s2, m2) = (self.shadow.clone(), self.map.clone(), self.shadow.clone(), self.map.clone());
        let out = self.b.if_else(c, |b| side(b, then_block, s1, m1), |b| side(b, else_block, s2, m2));
        self.gather_sides(err, &outer, &out)
    }

    /// The reverse of an `if` that ends the kernel (the rest of a kernel after an early
    /// return): nothing runs after it, so each side's reverse follows that side's forward in the
    /// forward's own branch, on the values it computed there, not recomputed; its `for` loops
    /// write their own tapes ([`Emit::reverse_loop`]). The `if` moves to the end, after the
    /// shadow pointers its sides use, and yields the cotangents of the values from outside it.
    /// Where it cannot move, [`Emit::reverse_if`].
    pub(super) fn reverse_if_in_place(&mut self, i: Inst) -> Result<(), AdError> {
        let d = self.k.inst(i).clone();
        let Op::If { then_block, else_block } = d.op else { unreachable!("an if") };
        if !self.b.move_to_end(i) {
            return self.reverse_if(i);
        }
        let k = self.k;
        let outer = self.float_outer_uses([then_block, else_block]);
        let res_adj: Vec<Option<Value>> = d.results.iter().map(|r| self.adj.get(r).copied()).collect();
        let err: RefCell<Option<AdError>> = RefCell::new(None);
        let (tapes, fl, trip) = (self.tapes, self.fl, self.trip);
        let side = |b: &mut KernelBuilder, blk: tilegrad_ir::Block, shadow: HashMap<Value, Value>, map: HashMap<Value, Value>| {
            let mut e = Emit { in_place: true, ..Emit::scope((k, tapes, fl), b, shadow, map, trip) };
            e.reverse_side(blk, &res_adj, &outer, &d.loc, &err)
        };
        let (s1, m1, s2, m2) = (self.shadow.clone(), self.map.clone(), self.shadow.clone(), self.map.clone());
        let out = self.b.extend_if(i, |b| side(b, then_block, s1, m1), |b| side(b, else_block, s2, m2));
        self.gather_sides(err, &outer, &out)
    }

    /// After a branch's two reverses: the first error either side met, else the cotangents
    /// the `if` yields (`out`) added to those of the values from outside it (`outer`).
    fn gather_sides(&mut self, err: RefCell<Option<AdError>>, outer: &[Value], out: &[Value]) -> Result<(), AdError> {
        if let Some(e) = err.into_inner() {
            return Err(e);
        }
        debug_assert_eq!(outer.len(), out.len(), "a cotangent yielded for each value from outside");
        for (&o, &v) in outer.iter().zip(out) {
            self.acc(o, v);
        }
        Ok(())
    }

    /// The float values from outside `blocks` (a branch's sides) that they use, each once.
    fn float_outer_uses(&self, blocks: [tilegrad_ir::Block; 2]) -> Vec<Value> {
        let mut outer: Vec<Value> = Vec::new();
        for b in blocks {
            for v in outer_uses(self.k, b) {
                if self.is_float(v) && !outer.contains(&v) {
                    outer.push(v);
                }
            }
        }
        outer
    }

    /// One side `blk` of a branch's reverse, in this scope (the side's own): its forward values
    /// (recomputed, or where the forward left them where the scope is `in_place`), the
    /// cotangents `res_adj` of what it yields, and its ops' rules from the last (the first error
    /// into `err`); returns the cotangents of `outer` it gathered.
    fn reverse_side(
        &mut self,
        blk: tilegrad_ir::Block,
        res_adj: &[Option<Value>],
        outer: &[Value],
        loc: &tilegrad_ir::Loc,
        err: &RefCell<Option<AdError>>,
    ) -> Vec<Value> {
        let k = self.k;
        self.b.set_loc(Some(loc.clone()));
        let bd = k.block(blk);
        for &j in &bd.insts {
            match self.in_place {
                true => self.shadow_pointer(j),
                false => self.recompute(j),
            }
        }
        let ys = &k.inst(*bd.insts.last().expect("a block ends in yield")).args;
        for (q, g) in res_adj.iter().enumerate() {
            if let Some(g) = g {
                self.acc(ys[q], *g);
            }
        }
        for &j in bd.insts.iter().rev() {
            if let Err(x) = self.reverse(j) {
                err.borrow_mut().get_or_insert(x);
            }
        }
        self.b.set_loc(Some(loc.clone()));
        self.outer_cotangents(outer)
    }

    /// The cotangents of `outer` this scope gathered (zeros where none).
    fn outer_cotangents(&mut self, outer: &[Value]) -> Vec<Value> {
        outer
            .iter()
            .map(|&o| match self.adj.get(&o) {
                Some(&g) => g,
                None => {
                    let shape = self.shape(o);
                    self.b.full(&shape, 0.0, self.fl)
                }
            })
            .collect()
    }

    /// The program's index in the grid, as an i64 scalar.
    fn program_index(&mut self) -> Value {
        program_index(self.b)
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
        // Where the copy and what it needs begin (see the move below).
        let from = self.b.block_len();
        let n = self.tapes.list.borrow().len();
        // The carried values whose values the reverse needs, and each one's place in a trip's
        // slots; the others (an accumulator only summed into) are not kept.
        let taped: Vec<Value> = fcarried.iter().copied().filter(|&c| value_needed(k, &blk, c)).collect();
        // i64 where every kept value is an integer (offsets, counters: no conversion on either
        // side); f32 where the arithmetic is f32 and every kept value is a float of 32 bits or
        // less (exactly so); else f64.
        let small = |c: &Value| matches!(k.ty(*c).dtype(), Some(DType::F32 | DType::F16 | DType::BF16));
        let int = |c: &Value| matches!(k.ty(*c).dtype(), Some(DType::I32 | DType::I64));
        let tdt = if !taped.is_empty() && taped.iter().all(int) {
            DType::I64
        } else if fl == DType::F32 && taped.iter().all(small) {
            DType::F32
        } else {
            DType::F64
        };
        let tape = self.b.ptr_param(&format!("tg_tape{n}"), tdt);
        let cap_name = format!("tg_cap{n}");
        let cap = self.b.scalar_param(&cap_name, DType::I64);
        // A trip's slots hold its kept scalars first (the copy stores them at once), then its
        // kept tiles.
        let mut at = vec![0; taped.len()];
        let mut per_trip = 0usize;
        for scalars in [true, false] {
            for (j, &c) in taped.iter().enumerate() {
                if k.ty(c).shape.is_empty() == scalars {
                    at[j] = per_trip;
                    per_trip += k.ty(c).numel();
                }
            }
        }
        // With checkpoints: every carried value (f64) at the start of each segment's first trip.
        let ck = self.tapes.checkpoints.then(|| {
            let mut at_full = Vec::new();
            let mut full = 0usize;
            for &c in &fcarried {
                at_full.push(full);
                full += k.ty(c).numel();
            }
            let seg = self.b.scalar_param(&format!("tg_seg{n}"), DType::I64);
            let tape = self.b.ptr_param(&format!("tg_ckpt{n}"), DType::F64);
            (seg, tape, at_full, full)
        });
        self.tapes.list.borrow_mut().push(LoopTape {
            tape: format!("tg_tape{n}"),
            capacity_param: cap_name,
            per_trip,
            dtype: tdt,
            max_iters,
            inst: i,
            loc: d.loc.clone(),
            checkpoints: ck.as_ref().map(|(_, _, _, full)| LoopCheckpoints {
                tape: format!("tg_ckpt{n}"),
                segment_param: format!("tg_seg{n}"),
                per_checkpoint: *full,
            }),
        });
        // The program's place in the batch: a launch runs its programs in batches sized to the
        // memory its tapes may take (see `gradient_by_kernel`).
        let first = match self.b.param_value(&self.tapes.first) {
            Some(v) => v,
            None => self.b.scalar_param(&self.tapes.first, DType::I64),
        };
        // A `for` loop where the forward ran it, once a program (in the kernel's body, or a
        // branch reversed in place): it writes its own tape, no copy runs (see `tape_in_place`).
        let once = self.in_place && ck.is_none() && cond.is_none();
        let pix = self.program_index();
        let pix = self.b.sub(pix, first);
        let s = self.b.i64(per_trip as i64);
        // A program's slots: a trip each, or with checkpoints a trip of one segment each.
        let slots = ck.as_ref().map_or(cap, |c| c.0);
        let base = self.b.mul(pix, slots);
        let base = self.b.mul(base, s);
        // With checkpoints: the program's checkpoints, `cdiv(cap, seg)` of `full` values each.
        let ck = ck.map(|(seg, tape, at_full, full)| {
            let nck = self.b.cdiv(cap, seg);
            let fs = self.b.i64(full as i64);
            let cbase = self.b.mul(pix, nck);
            let cbase = self.b.mul(cbase, fs);
            let seg32 = self.b.cast(seg, DType::I32);
            (seg32, tape, at_full, fs, cbase)
        });
        let bounds = cond.is_none().then(|| (self.v(d.args[0]), self.v(d.args[1]), self.v(d.args[2])));

        // The copy of the loop, writing each trip's carried values to the tape; it also carries
        // the trip count.
        // It touches no shadow: none of its pointers' shadows is made (they would be values of
        // the reverse sweep, which the copy must not use to move to the loop's place).
        let (shadow, map, tapes) = (HashMap::new(), self.map.clone(), self.tapes);
        let mut init_c: Vec<Value> = inits.iter().map(|&a| self.v(a)).collect();
        init_c.push(self.b.i32(0));
        // The copy writes each trip's kept values to its slot (`slot_of(t)`: `t`, or its place in
        // a segment), or with checkpoints, where `slot_of` is `None`, every carried value of a
        // segment's first trip to its checkpoint.
        let copy = |b: &mut KernelBuilder, iv: Option<Value>, cs: &[Value], shadow, map, slot_of: Option<&SlotOf<'_>>| {
            let t = cs[cs.len() - 1];
            let mut e = Emit::scope((k, tapes, fl), b, shadow, map, Some(t));
            e.b.set_loc(Some(d.loc.clone()));
            match (slot_of, &ck) {
                (Some(slot_of), _) => {
                    let at_t = slot_of(e.b, t);
                    let vals: Vec<Value> = taped
                        .iter()
                        .map(|c| {
                            let j = fcarried.iter().position(|f| f == c).expect("a carried value");
                            if k.ty(*c).dtype() == Some(tdt) {
                                cs[j]
                            } else {
                                e.b.cast(cs[j], tdt)
                            }
                        })
                        .collect();
                    write_trip(e.b, k, Slots { tape, base, per_trip: s, at: &at }, at_t, &taped, &vals);
                }
                (None, Some((seg32, ctape, at_full, fs, cbase))) => {
                    let q = e.b.floordiv(t, *seg32);
                    let r = e.b.rem(t, *seg32);
                    let zero = e.b.i32(0);
                    let first = e.b.eq(r, zero);
                    let ptrs = trip_slots(e.b, k, Slots { tape: *ctape, base: *cbase, per_trip: *fs, at: at_full }, q, &fcarried);
                    let vals: Vec<Value> = (0..fcarried.len())
                        .map(|j| if k.ty(fcarried[j]).dtype() == Some(DType::F64) { cs[j] } else { e.b.cast(cs[j], DType::F64) })
                        .collect();
                    e.b.if_else(
                        first,
                        |b| {
                            for (p, v) in ptrs.iter().zip(&vals) {
                                b.store(*p, *v, None);
                            }
                            vec![]
                        },
                        |_| vec![],
                    );
                }
                (None, None) => unreachable!("checkpoints where there are none"),
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
        let plain_slot = |_: &mut KernelBuilder, t: Value| t;
        let first_slot: Option<&SlotOf<'_>> = if ck.is_some() { None } else { Some(&plain_slot) };
        let res = match (bounds, cond) {
            (Some((lo, hi, st)), _) if once => {
                let iv = blk.params[0];
                tape_in_place(self.b, k, body, (iv, lo, st), (tape, first, cap), (&at, per_trip), &taped, tdt);
                vec![trip_count(self.b, lo, hi, st, positive_const(k, d.args[2]))]
            }
            (Some((lo, hi, st)), _) => {
                self.b.for_range(lo, hi, st, max_iters, &init_c, |b, iv, cs| copy(b, Some(iv), cs, shadow, map, first_slot))
            }
            (None, Some(cb)) => {
                let (s1, m1) = (shadow.clone(), map.clone());
                let cblk = k.block(cb).clone();
                self.b.while_loop(
                    max_iters,
                    &init_c,
                    |b, cs| {
                        let mut e = Emit::scope((k, tapes, fl), b, s1, m1, None);
                        for (&p, &v) in cblk.params.iter().zip(cs) {
                            e.map.insert(p, v);
                        }
                        for &j in &cblk.insts {
                            e.recompute(j);
                        }
                        let y = k.inst(*cblk.insts.last().expect("a condition ends in yield"));
                        e.v(y.args[0])
                    },
                    |b, cs| copy(b, None, cs, shadow, map, first_slot),
                )
            }
            (None, None) => unreachable!("a for loop has bounds"),
        };
        // A `while` loop that stores nothing, in the kernel's body (a `for` loop there writes
        // its own tape, above): its copy (and what the copy needs) moves to the loop's place and
        // takes the uses of its results, so that the forward's loop is left unused (dead-code
        // removal drops it) and its trips run once before the reverse, not twice. So does a
        // loop this scope recomputed (in a branch's reverse, a reverse trip), stores or not: the
        // recomputation stores nothing, and memory is as the forward left it until the end.
        let results = &res[..res.len() - 1];
        let place = match self.recomputed.get(&i) {
            Some(&here) => Some((here, d.results.iter().map(|&r| self.v(r)).collect::<Vec<_>>())),
            None => (!has_effects(k, body)).then(|| (i, d.results.to_vec())),
        };
        if let (false, None, Some((after, old))) = (once, &ck, place) {
            if self.b.move_after(from, after, &old, results) {
                for (&r, &o) in d.results.iter().zip(results) {
                    if self.map.contains_key(&r) {
                        self.map.insert(r, o);
                    }
                }
            }
        }
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
        // A `for` loop's induction variable at trip `t`: `lo + t * step`.
        let iv_of = |b: &mut KernelBuilder, t: Value| match (fiv, bounds) {
            (Some(fiv), Some((lo, _, st))) => {
                let idt = k.ty(fiv).dtype().expect("an integer induction variable");
                let tc = b.cast(t, idt);
                let step = b.mul(tc, st);
                Some(b.add(lo, step))
            }
            _ => None,
        };
        // The kept values of the trip in slot `at_t`, as the tape holds them, read where `valid`
        // (zeros elsewhere).
        let slots = Slots { tape, base, per_trip: s, at: &at };
        let kept_at = |b: &mut KernelBuilder, at_t: Value, valid: Value| -> Vec<Value> {
            let ptrs = trip_slots(b, k, slots, at_t, &taped);
            ptrs.into_iter()
                .map(|p| {
                    let z = b.zeros(&[], tdt);
                    b.load(p, Some(valid), Some(z))
                })
                .collect()
        };
        // One reverse trip: trip `t`, its kept values `kept` (read from the tape a step ahead:
        // see `reverse_steps`), carrying the cotangents.
        let first_err = RefCell::new(None);
        let rev = |b: &mut KernelBuilder, t: Value, kept: &[Value], cs: &[Value], shadow, map| {
            let mut e = Emit::scope((k, tapes, fl), b, shadow, map, Some(t));
            e.b.set_loc(Some(d.loc.clone()));
            for (&c, &v) in taped.iter().zip(kept) {
                let dt = k.ty(c).dtype().expect("carried numbers");
                let v = if dt == tdt { v } else { e.b.cast(v, dt) };
                e.map.insert(c, v);
            }
            // What the reverse does not read stands as zeros.
            for &c in fcarried.iter().filter(|c| !taped.contains(c)) {
                let (shape, dt) = (e.shape(c), k.ty(c).dtype().expect("carried numbers"));
                let z = e.b.full(&shape, 0.0, dt);
                e.map.insert(c, z);
            }
            if let (Some(fiv), Some(iv)) = (fiv, iv_of(e.b, t)) {
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
                    first_err.borrow_mut().get_or_insert(err);
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
        };
        // The reverse steps `r` in `0..n` (i32), step `r` reversing trip `trip_of(r)` from slot
        // `slot_of(r)`: a loop carrying the cotangents, then the kept values of its step, read
        // from the tape a step ahead (its first step's before it), so that the loads whose
        // pointers they give (a block pointer's tile, at its offsets) wait for no tape read.
        let reverse_steps = |b: &mut KernelBuilder,
                             n: Value,
                             init: &[Value],
                             trip_of: &SlotOf<'_>,
                             slot_of: &SlotOf<'_>,
                             shadow: HashMap<Value, Value>,
                             map: HashMap<Value, Value>| {
            let (z, one) = (b.i32(0), b.i32(1));
            let some = b.gt(n, z);
            let at0 = slot_of(b, z);
            let nc = init.len();
            let mut init = init.to_vec();
            init.extend(kept_at(b, at0, some));
            let out = b.for_range(z, n, one, max_iters, &init, |b, r, cs| {
                let one = b.i32(1);
                let r1 = b.add(r, one);
                let more = b.lt(r1, n);
                let at1 = slot_of(b, r1);
                let ahead = kept_at(b, at1, more);
                let t = trip_of(b, r);
                let mut next = rev(b, t, &cs[nc..], &cs[..nc], shadow.clone(), map.clone());
                next.extend(ahead);
                next
            });
            out[..nc].to_vec()
        };
        let (shadow, map) = (self.shadow.clone(), self.map.clone());
        let (z, one) = (self.b.i32(0), self.b.i32(1));
        let out = match &ck {
            // Trip t = trips - 1 - r, from slot t.
            None => {
                let back = |b: &mut KernelBuilder, r: Value| {
                    let one = b.i32(1);
                    let last = b.sub(trips, one);
                    b.sub(last, r)
                };
                reverse_steps(self.b, trips, &init_r, &back, &back, shadow, map)
            }
            // Segments from the last: each restores its checkpoint, runs its trips again writing
            // their slots, then reverses them.
            Some((seg32, ctape, at_full, fs, cbase)) => {
                let nseg = self.b.cdiv(trips, *seg32);
                self.b.for_range(z, nseg, one, None, &init_r, |b, sv, cs| {
                    let one = b.i32(1);
                    let lastseg = b.sub(nseg, one);
                    let g = b.sub(lastseg, sv);
                    let t0 = b.mul(g, *seg32);
                    let t1 = b.add(t0, *seg32);
                    let t1 = b.minimum(t1, trips);
                    let ptrs = trip_slots(b, k, Slots { tape: *ctape, base: *cbase, per_trip: *fs, at: at_full }, g, &fcarried);
                    let mut state: Vec<Value> = Vec::new();
                    for (&c, p) in fcarried.iter().zip(ptrs) {
                        let v = b.load(p, None, None);
                        let dt = k.ty(c).dtype().expect("carried numbers");
                        state.push(if dt == DType::F64 { v } else { b.cast(v, dt) });
                    }
                    state.push(t0);
                    let in_segment = |b: &mut KernelBuilder, t: Value| b.sub(t, t0);
                    let (s1, m1) = (shadow.clone(), map.clone());
                    b.for_range(t0, t1, one, max_iters, &state, |b, t, cs2| {
                        let iv = iv_of(b, t);
                        copy(b, iv, cs2, s1, m1, Some(&in_segment))
                    });
                    let n = b.sub(t1, t0);
                    let (s2, m2) = (shadow.clone(), map.clone());
                    // Trip t = t1 - 1 - r, from slot t - t0.
                    let back = |b: &mut KernelBuilder, r: Value| {
                        let one = b.i32(1);
                        let last = b.sub(t1, one);
                        b.sub(last, r)
                    };
                    let back_slot = |b: &mut KernelBuilder, r: Value| {
                        let t = back(b, r);
                        b.sub(t, t0)
                    };
                    reverse_steps(b, n, cs, &back, &back_slot, s2, m2)
                })
            }
        };
        if let Some(err) = first_err.into_inner() {
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
    pub(super) fn reverse(&mut self, i: Inst) -> Result<(), AdError> {
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
            FloorDiv | And | Or | Xor | UMulHi => {}
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
