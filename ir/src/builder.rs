//! The Rust builder API: kernels written with calls that read like Triton (`b.load(ptr, mask,
//! other)`, `b.arange(0, BLOCK)`, `b.for_range(...)`).
//!
//! The builder is a front end: it applies Triton's surface rules (broadcasting, dtype promotion,
//! pointer arithmetic, block pointers, mask defaults) and emits canonical ops. Every op records the
//! call site of the builder method (`#[track_caller]`), so errors and reports point at the user's
//! Rust line. Surface errors (say, shapes that do not broadcast) are collected and returned by
//! [`KernelBuilder::finish`]; builder methods never panic.

use crate::error::{Diagnostic, IrError};
use crate::kernel::{Block, InstData, Kernel, Loc, Param, ParamKind, Value};
use crate::op::{AtomicOp, BinaryOp, CmpOp, DotPrecision, Op, ReduceOp, UnaryOp};
use crate::types::{DType, Elem, Lit, Shape, Type};
use smallvec::{smallvec, SmallVec};

/// What a block-pointer load yields in lanes outside the tensor (Triton's `padding_option`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Padding {
    /// Unspecified: such lanes are undefined (the reference reads them as 0 in forward kernels).
    None,
    /// Zero.
    Zero,
    /// NaN (float tensors only).
    Nan,
}

/// A block pointer (`tl.make_block_ptr`): a window of `block_shape` into an N-d view of a tensor.
/// The builder lowers loads and stores through it to offset tiles and boundary masks. Inside a
/// loop, carry its [`BlockPtr::offsets`] (see [`BlockPtr::with_offsets`]).
#[derive(Clone, Debug)]
pub struct BlockPtr {
    /// Base pointer (scalar).
    pub base: Value,
    /// Logical shape of the view (i64 scalars).
    pub shape: Vec<Value>,
    /// Strides of the view in elements (i64 scalars).
    pub strides: Vec<Value>,
    /// Current window origin (i64 scalars); `advance` changes these.
    pub offsets: Vec<Value>,
    /// Window size.
    pub block_shape: Vec<usize>,
    /// Dimension order (kept for fidelity with Triton; it does not change the result).
    pub order: Vec<usize>,
}

impl BlockPtr {
    /// The same block pointer with other offsets (e.g. the carried values of a loop).
    pub fn with_offsets(&self, offsets: &[Value]) -> BlockPtr {
        BlockPtr { offsets: offsets.to_vec(), ..self.clone() }
    }
}

/// Builds one kernel. See the module docs.
pub struct KernelBuilder {
    k: Kernel,
    stack: Vec<Block>,
    errors: Vec<Diagnostic>,
    /// Location that overrides the caller's for every op and error (see [`KernelBuilder::set_loc`]).
    loc_override: Option<Loc>,
}

impl KernelBuilder {
    /// Starts a kernel named `name`.
    #[track_caller]
    pub fn new(name: &str) -> KernelBuilder {
        let k = Kernel::new(name, Loc::caller());
        let body = k.body;
        KernelBuilder { k, stack: vec![body], errors: Vec::new(), loc_override: None }
    }

    /// Continues `k`: ops are appended to the end of its body, parameters after its own. Passes
    /// that derive a kernel from another (the VJP kernels of `tilegrad-ad`) build on the
    /// original's values this way.
    pub fn resume(k: Kernel) -> KernelBuilder {
        let body = k.body;
        KernelBuilder { k, stack: vec![body], errors: Vec::new(), loc_override: None }
    }

    /// How many instructions the kernel holds so far: a mark for
    /// [`KernelBuilder::relocate_floats`].
    pub fn mark(&self) -> usize {
        self.k.insts.len()
    }

    /// Gives the float constants equal to `value` made since `mark` the location `loc`: a front
    /// end's constant bound to a name on one line and made where it is used on another belongs
    /// to the line that bound it (where a report names it).
    pub fn relocate_floats(&mut self, mark: usize, value: f64, loc: &Loc) {
        for d in self.k.insts.iter_mut().skip(mark) {
            if matches!(d.op, Op::Const { value: Lit::Float(v) } if v.to_bits() == value.to_bits()) {
                d.loc = loc.clone();
            }
        }
    }

    /// How many instructions the current block holds so far: a mark for
    /// [`KernelBuilder::move_after`].
    pub fn block_len(&self) -> usize {
        let cur = *self.stack.last().expect("builder block stack is never empty");
        self.k.blocks[cur.index()].insts.len()
    }

    /// The current block's last instruction so far: what an op just emitted (a loop, a branch)
    /// is, for a later [`KernelBuilder::move_after`] to it.
    pub fn last_inst(&self) -> Option<crate::kernel::Inst> {
        let cur = *self.stack.last().expect("builder block stack is never empty");
        self.k.blocks[cur.index()].insts.last().copied()
    }

    /// Moves the current block's instructions from position `from` (a [`KernelBuilder::block_len`]
    /// mark) to its end so that they come right after instruction `after` of the same block, and
    /// makes every use of `old[n]` a use of `new[n]`: a pass that built, at the end of a kernel,
    /// a copy of a loop computing the same values (the VJP kernels' tape loops) puts it in the
    /// loop's place, leaving the loop unused. `old` must be values defined by `after` (every use
    /// of them comes after it). Moves nothing and returns false where `after` is not in the
    /// current block, or where the moved instructions use a value defined between `after` and
    /// them.
    pub fn move_after(&mut self, from: usize, after: crate::kernel::Inst, old: &[Value], new: &[Value]) -> bool {
        let cur = *self.stack.last().expect("builder block stack is never empty");
        let list = &self.k.blocks[cur.index()].insts;
        let Some(at) = list.iter().position(|&i| i == after) else { return false };
        if at >= from || from > list.len() {
            return false;
        }
        // Values defined between `after` and the moved instructions.
        let between: std::collections::HashSet<Value> = list[at + 1..from].iter().flat_map(|&i| self.k.inst(i).results.clone()).collect();
        let moved: Vec<crate::kernel::Inst> = list[from..].to_vec();
        let mut uses_between = false;
        let mut visit = |d: &InstData| uses_between |= d.args.iter().any(|a| between.contains(a));
        for &i in &moved {
            visit(self.k.inst(i));
            for b in self.k.inst(i).op.blocks() {
                self.k.walk_block(b, &mut |_, d| visit(d));
            }
        }
        if uses_between {
            return false;
        }
        let list = &mut self.k.blocks[cur.index()].insts;
        list.truncate(from);
        list.splice(at + 1..at + 1, moved);
        for d in &mut self.k.insts {
            for a in d.args.iter_mut() {
                if let Some(n) = old.iter().position(|o| o == a) {
                    *a = new[n];
                }
            }
        }
        true
    }

    /// Moves instruction `i` of the current block to its end, where no later instruction of the
    /// block uses its results: a pass that appends code to an `if` that ends the kernel
    /// ([`KernelBuilder::extend_if`]) puts the `if` after the code it built for it. Returns
    /// whether it moved.
    pub fn move_to_end(&mut self, i: crate::kernel::Inst) -> bool {
        let cur = *self.stack.last().expect("builder block stack is never empty");
        let list = &self.k.blocks[cur.index()].insts;
        let Some(at) = list.iter().position(|&j| j == i) else { return false };
        let results = &self.k.inst(i).results;
        let used_after = list[at + 1..].iter().any(|&j| {
            let mut used = false;
            let mut visit = |d: &InstData| used |= d.args.iter().any(|a| results.contains(a));
            visit(self.k.inst(j));
            for b in self.k.inst(j).op.blocks() {
                self.k.walk_block(b, &mut |_, d| visit(d));
            }
            used
        });
        if used_after {
            return false;
        }
        let list = &mut self.k.blocks[cur.index()].insts;
        list.remove(at);
        list.push(i);
        true
    }

    /// Appends to each side of `inst`, an `if` of the kernel being continued, what `then_more`
    /// and `else_more` emit there (before the side's closing `yield`), and makes the values
    /// they return (of the same types on both sides) more results of the `if`, which it
    /// returns: a pass that runs code on each side's values where they are (the VJP kernels'
    /// reverse of an `if` that ends the kernel).
    #[track_caller]
    pub fn extend_if(
        &mut self,
        inst: crate::kernel::Inst,
        then_more: impl FnOnce(&mut KernelBuilder) -> Vec<Value>,
        else_more: impl FnOnce(&mut KernelBuilder) -> Vec<Value>,
    ) -> Vec<Value> {
        let loc = Loc::caller();
        let Op::If { then_block, else_block } = self.k.inst(inst).op else {
            self.error("if", &loc, "extend_if takes an if".into());
            return Vec::new();
        };
        let tv = self.append_to_side(then_block, then_more);
        let tys: Vec<Type> = tv.iter().map(|&v| self.ty(v)).collect();
        let ev = self.append_to_side(else_block, |b| {
            let ev = else_more(b);
            b.coerce_yield(&ev, &tys, "if", &loc)
        });
        for (blk, vals) in [(then_block, &tv), (else_block, &ev)] {
            let y = *self.k.blocks[blk.index()].insts.last().expect("a side ends in yield");
            self.k.insts[y.0 as usize].args.extend_from_slice(vals);
        }
        let more: Vec<Value> = tys.into_iter().map(|t| self.k.new_value(t)).collect();
        self.k.insts[inst.0 as usize].results.extend_from_slice(&more);
        more
    }

    /// Emits `f` into side `blk` of an `if`, before its closing `yield`; returns what `f` does.
    fn append_to_side(&mut self, blk: Block, f: impl FnOnce(&mut KernelBuilder) -> Vec<Value>) -> Vec<Value> {
        let y = self.k.blocks[blk.index()].insts.pop().expect("a side ends in yield");
        debug_assert!(matches!(self.k.inst(y).op, Op::Yield), "a side ends in yield");
        self.stack.push(blk);
        let vals = f(self);
        self.stack.pop();
        self.k.blocks[blk.index()].insts.push(y);
        vals
    }

    /// Emits instructions with `f` into block `blk` of the kernel being continued, right after
    /// its instruction `after` (at the block's start where `None`), rather than at the end of
    /// the current block: a pass that instruments a kernel built before (the VJP kernels'
    /// tapes of loaded values) adds to its loops this way. Where `after` is not in `blk`, they
    /// go before the block's closing `yield` (or at its end).
    pub fn insert_into<R>(&mut self, blk: Block, after: Option<crate::kernel::Inst>, f: impl FnOnce(&mut KernelBuilder) -> R) -> R {
        let len = self.k.blocks[blk.index()].insts.len();
        self.stack.push(blk);
        let r = f(self);
        self.stack.pop();
        let list = &self.k.blocks[blk.index()].insts;
        let closing = list[..len].last().is_some_and(|&i| matches!(self.k.inst(i).op, Op::Yield));
        let at = match after {
            None => 0,
            Some(a) => list[..len].iter().position(|&i| i == a).map_or(if closing { len - 1 } else { len }, |p| p + 1),
        };
        let list = &mut self.k.blocks[blk.index()].insts;
        let new = list.split_off(len);
        list.splice(at..at, new);
        r
    }

    /// Verifies and returns the kernel, or every error found.
    pub fn finish(mut self) -> Result<Kernel, IrError> {
        if !self.errors.is_empty() {
            return Err(IrError::Invalid { kernel: self.k.name.clone(), diagnostics: self.errors });
        }
        self.k.canonicalize();
        crate::verify::verify(&self.k)?;
        Ok(self.k)
    }

    /// The type of a value built so far.
    pub fn ty(&self, v: Value) -> Type {
        self.k.ty(v).clone()
    }

    /// The shape of a value built so far.
    pub fn shape(&self, v: Value) -> Shape {
        self.k.ty(v).shape.clone()
    }

    /// Sets the location recorded for every op emitted and every error found from now on, instead
    /// of the Rust call site (`None` restores the call site). Front ends that translate another
    /// language (the Triton front end) use it to point ops at the user's source line.
    pub fn set_loc(&mut self, loc: Option<Loc>) {
        self.loc_override = loc;
    }

    fn error(&mut self, op: &str, loc: &Loc, message: String) {
        let loc = self.loc_override.as_ref().unwrap_or(loc).clone();
        self.errors.push(Diagnostic { kernel: self.k.name.clone(), op: op.into(), loc, message });
    }

    /// Appends an instruction to the current block and returns its results.
    fn emit(&mut self, op: Op, args: &[Value], result_types: Vec<Type>, loc: &Loc) -> SmallVec<[Value; 2]> {
        let results: SmallVec<[Value; 2]> = result_types.into_iter().map(|t| self.k.new_value(t)).collect();
        let loc = self.loc_override.as_ref().unwrap_or(loc).clone();
        self.k.insts.push(InstData { op, args: SmallVec::from_slice(args), results: results.clone(), loc });
        let inst = crate::kernel::Inst(self.k.insts.len() as u32 - 1);
        let cur = *self.stack.last().expect("builder block stack is never empty");
        self.k.blocks[cur.index()].insts.push(inst);
        results
    }

    /// Appends `op` as it is, on operands of the types it takes and with these result types
    /// (no surface rule applies; [`KernelBuilder::finish`] verifies it). Passes that copy ops
    /// of another kernel use it; ops with blocks are built with their own methods.
    #[track_caller]
    pub fn push(&mut self, op: Op, args: &[Value], result_types: Vec<Type>) -> SmallVec<[Value; 2]> {
        let loc = Loc::caller();
        self.emit(op, args, result_types, &loc)
    }

    fn emit1(&mut self, op: Op, args: &[Value], ty: Type, loc: &Loc) -> Value {
        self.emit(op, args, vec![ty], loc)[0]
    }

    // ---- parameters -------------------------------------------------------------------------

    fn param(&mut self, name: &str, kind: ParamKind, ty: Type) -> Value {
        let v = self.k.new_value(ty);
        self.k.params.push(Param { name: name.into(), kind, value: v });
        v
    }

    /// The value of the parameter named `name`, where the kernel has one.
    pub fn param_value(&self, name: &str) -> Option<Value> {
        self.k.params.iter().find(|p| p.name == name).map(|p| p.value)
    }

    /// A tensor-pointer parameter.
    pub fn ptr_param(&mut self, name: &str, elem: DType) -> Value {
        self.param(name, ParamKind::Ptr(elem), Type::ptr(elem, &[]))
    }

    /// A runtime scalar parameter.
    pub fn scalar_param(&mut self, name: &str, dtype: DType) -> Value {
        self.param(name, ParamKind::Scalar(dtype), Type::scalar(dtype))
    }

    /// A constexpr parameter bound to `value` (i32). Use the Rust value for shapes; the returned
    /// value is the constant as an IR scalar.
    pub fn constexpr(&mut self, name: &str, value: i64) -> Value {
        self.param(name, ParamKind::Constexpr(DType::I32, Lit::Int(value)), Type::scalar(DType::I32))
    }

    /// A constexpr parameter of any scalar dtype (a float `eps`, a bool flag) bound to `value`.
    pub fn constexpr_of(&mut self, name: &str, dtype: DType, value: Lit) -> Value {
        self.param(name, ParamKind::Constexpr(dtype, value), Type::scalar(dtype))
    }

    // ---- constants and indices --------------------------------------------------------------

    /// A scalar constant of dtype `dtype`.
    #[track_caller]
    pub fn constant(&mut self, value: impl Into<Lit>, dtype: DType) -> Value {
        let loc = Loc::caller();
        self.constant_at(value.into(), dtype, &loc)
    }

    fn constant_at(&mut self, value: Lit, dtype: DType, loc: &Loc) -> Value {
        let value = match (value, dtype) {
            (Lit::Int(i), d) if d.is_float() => Lit::Float(i as f64),
            (Lit::Bool(b), d) if d.is_int() => Lit::Int(b as i64),
            (Lit::Bool(b), d) if d.is_float() => Lit::Float(b as i64 as f64),
            (v, _) => v,
        };
        if !value.fits(dtype) {
            self.error("const", loc, format!("constant {value} does not fit {dtype}"));
        }
        self.emit1(Op::Const { value }, &[], Type::scalar(dtype), loc)
    }

    /// An i32 constant.
    #[track_caller]
    pub fn i32(&mut self, v: i32) -> Value {
        self.constant(v, DType::I32)
    }
    /// An i64 constant.
    #[track_caller]
    pub fn i64(&mut self, v: i64) -> Value {
        self.constant(v, DType::I64)
    }
    /// An f32 constant.
    #[track_caller]
    pub fn f32(&mut self, v: f32) -> Value {
        self.constant(v, DType::F32)
    }
    /// An f64 constant.
    #[track_caller]
    pub fn f64(&mut self, v: f64) -> Value {
        self.constant(v, DType::F64)
    }

    /// `tl.program_id(axis)`.
    #[track_caller]
    pub fn program_id(&mut self, axis: u8) -> Value {
        let loc = Loc::caller();
        self.emit1(Op::ProgramId { axis }, &[], Type::scalar(DType::I32), &loc)
    }

    /// `tl.num_programs(axis)`.
    #[track_caller]
    pub fn num_programs(&mut self, axis: u8) -> Value {
        let loc = Loc::caller();
        self.emit1(Op::NumPrograms { axis }, &[], Type::scalar(DType::I32), &loc)
    }

    /// `tl.arange(start, end)`: i32[end - start].
    #[track_caller]
    pub fn arange(&mut self, start: i64, end: i64) -> Value {
        let loc = Loc::caller();
        let n = if end > start { end.abs_diff(start) as usize } else { 1 };
        if end <= start {
            self.error("arange", &loc, format!("empty range {start}..{end}"));
        }
        self.emit1(Op::Arange { start, end }, &[], Type::tile(DType::I32, &[n]), &loc)
    }

    /// `tl.full(shape, value, dtype)`.
    #[track_caller]
    pub fn full(&mut self, shape: &[usize], value: impl Into<Lit>, dtype: DType) -> Value {
        let loc = Loc::caller();
        let c = self.constant_at(value.into(), dtype, &loc);
        if shape.is_empty() {
            return c;
        }
        self.emit1(Op::Broadcast, &[c], Type::tile(dtype, shape), &loc)
    }

    /// `tl.zeros(shape, dtype)`.
    #[track_caller]
    pub fn zeros(&mut self, shape: &[usize], dtype: DType) -> Value {
        let loc = Loc::caller();
        let c = self.constant_at(Lit::Int(0), dtype, &loc);
        if shape.is_empty() {
            return c;
        }
        self.emit1(Op::Broadcast, &[c], Type::tile(dtype, shape), &loc)
    }

    // ---- shapes -----------------------------------------------------------------------------

    /// `tl.broadcast_to(x, shape)`, with Triton's rules (ranks aligned on the right).
    #[track_caller]
    pub fn broadcast_to(&mut self, x: Value, shape: &[usize]) -> Value {
        let loc = Loc::caller();
        self.broadcast_at(x, shape, &loc)
    }

    fn broadcast_at(&mut self, x: Value, shape: &[usize], loc: &Loc) -> Value {
        let t = self.ty(x);
        if t.shape.as_slice() == shape {
            return x;
        }
        if t.is_scalar() {
            return self.emit1(Op::Broadcast, &[x], t.with_shape(shape), loc);
        }
        if t.rank() > shape.len() {
            self.error("broadcast", loc, format!("cannot broadcast {t} to rank {}", shape.len()));
            return x;
        }
        let mut v = x;
        let pad = shape.len() - t.rank();
        if pad > 0 {
            let mut s: Shape = smallvec![1; pad];
            s.extend_from_slice(&t.shape);
            v = self.emit1(Op::Reshape, &[v], t.with_shape(&s), loc);
        }
        let cur = self.shape(v);
        if cur.iter().zip(shape).any(|(a, b)| a != b && *a != 1) {
            self.error("broadcast", loc, format!("cannot broadcast {t} to {:?}", shape));
            return x;
        }
        self.emit1(Op::Broadcast, &[v], t.with_shape(shape), loc)
    }

    /// The shape two shapes broadcast to, or an error message.
    pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Shape, String> {
        let r = a.len().max(b.len());
        let mut out: Shape = smallvec![0; r];
        for i in 0..r {
            let da = if i + a.len() >= r { a[i + a.len() - r] } else { 1 };
            let db = if i + b.len() >= r { b[i + b.len() - r] } else { 1 };
            out[i] = if da == db || db == 1 {
                da
            } else if da == 1 {
                db
            } else {
                return Err(format!("shapes {a:?} and {b:?} do not broadcast"));
            };
        }
        Ok(out)
    }

    /// `tl.expand_dims(x, axis)` (negative axes count from the end).
    #[track_caller]
    pub fn expand_dims(&mut self, x: Value, axis: isize) -> Value {
        let loc = Loc::caller();
        let t = self.ty(x);
        let r = t.rank() as isize + 1;
        let a = if axis < 0 { axis + r } else { axis };
        if a < 0 || a >= r {
            self.error("expand_dims", &loc, format!("axis {axis} is out of range for {t}"));
            return x;
        }
        let mut s = t.shape.clone();
        s.insert(a as usize, 1);
        self.emit1(Op::ExpandDims { axis: a as u8 }, &[x], t.with_shape(&s), &loc)
    }

    /// `tl.reshape(x, shape)`.
    #[track_caller]
    pub fn reshape(&mut self, x: Value, shape: &[usize]) -> Value {
        let loc = Loc::caller();
        let t = self.ty(x);
        if Some(t.numel()) != shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) {
            self.error("reshape", &loc, format!("cannot reshape {t} to {shape:?}"));
            return x;
        }
        self.emit1(Op::Reshape, &[x], t.with_shape(shape), &loc)
    }

    /// `tl.permute(x, perm)`.
    #[track_caller]
    pub fn permute(&mut self, x: Value, perm: &[usize]) -> Value {
        let loc = Loc::caller();
        self.permute_at(x, perm, &loc)
    }

    fn permute_at(&mut self, x: Value, perm: &[usize], loc: &Loc) -> Value {
        let t = self.ty(x);
        let mut seen = vec![false; t.rank()];
        if perm.len() != t.rank() || perm.iter().any(|&p| p >= t.rank() || std::mem::replace(&mut seen[p], true)) {
            self.error("permute", loc, format!("{perm:?} is not a permutation of the dims of {t}"));
            return x;
        }
        let s: Vec<usize> = perm.iter().map(|&p| t.shape[p]).collect();
        let perm = perm.iter().map(|&p| p as u8).collect();
        self.emit1(Op::Permute { perm }, &[x], t.with_shape(&s), loc)
    }

    /// `tl.trans(x)` / `x.T`: swaps the last two dims.
    #[track_caller]
    pub fn trans(&mut self, x: Value) -> Value {
        let loc = Loc::caller();
        let r = self.ty(x).rank();
        if r < 2 {
            return x;
        }
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        self.permute_at(x, &perm, &loc)
    }

    // ---- elementwise ------------------------------------------------------------------------

    /// Casts to `dtype` (`x.to(dtype)`).
    #[track_caller]
    pub fn cast(&mut self, x: Value, dtype: DType) -> Value {
        let loc = Loc::caller();
        self.cast_at(x, dtype, &loc)
    }

    fn cast_at(&mut self, x: Value, dtype: DType, loc: &Loc) -> Value {
        let t = self.ty(x);
        match t.elem {
            Elem::Num(d) if d == dtype => x,
            Elem::Num(_) => self.emit1(Op::Cast, &[x], t.with_dtype(dtype), loc),
            Elem::Ptr(_) => {
                self.error("cast", loc, format!("cannot cast pointer {t} to {dtype}"));
                x
            }
        }
    }

    /// Promotes and broadcasts numeric operands to one type.
    fn unify(&mut self, vals: &[Value], op: &str, loc: &Loc) -> Option<SmallVec<[Value; 3]>> {
        let tys: Vec<Type> = vals.iter().map(|&v| self.ty(v)).collect();
        let mut shape = Shape::new();
        let mut dt: Option<DType> = None;
        for t in &tys {
            let Some(d) = t.dtype() else {
                self.error(op, loc, format!("operand must be numeric, found {t}"));
                return None;
            };
            dt = Some(dt.map_or(d, |x| DType::promote(x, d)));
            match Self::broadcast_shapes(&shape, &t.shape) {
                Ok(s) => shape = s,
                Err(e) => {
                    self.error(op, loc, e);
                    return None;
                }
            }
        }
        let dt = dt?;
        let mut out = SmallVec::new();
        for &v in vals {
            let c = self.cast_at(v, dt, loc);
            out.push(self.broadcast_at(c, &shape, loc));
        }
        Some(out)
    }

    fn binary_at(&mut self, op: BinaryOp, a: Value, b: Value, loc: &Loc) -> Value {
        let (ta, tb) = (self.ty(a), self.ty(b));
        // Pointer arithmetic: ptr + int, int + ptr, ptr - int.
        if ta.is_ptr() || tb.is_ptr() {
            let (p, o) = if ta.is_ptr() { (a, b) } else { (b, a) };
            let to = self.ty(o);
            let ok_op = op == BinaryOp::Add || (op == BinaryOp::Sub && ta.is_ptr());
            if !ok_op || !to.dtype().is_some_and(|d| d.is_int()) {
                self.error(op.name(), loc, format!("unsupported pointer arithmetic: {ta} {} {tb}", op.name()));
                return p;
            }
            let o = if op == BinaryOp::Sub { self.unary_at(UnaryOp::Neg, o, loc) } else { o };
            let shape = match Self::broadcast_shapes(&self.shape(p), &to.shape) {
                Ok(s) => s,
                Err(e) => {
                    self.error(op.name(), loc, e);
                    return p;
                }
            };
            let p = self.broadcast_at(p, &shape, loc);
            let o = self.broadcast_at(o, &shape, loc);
            let pt = self.ty(p);
            return self.emit1(Op::AddPtr, &[p, o], pt, loc);
        }
        let (mut a, mut b) = (a, b);
        // Triton's true division of integers produces f32.
        if op == BinaryOp::Div && !ta.dtype().is_some_and(|d| d.is_float()) && !tb.dtype().is_some_and(|d| d.is_float()) {
            a = self.cast_at(a, DType::F32, loc);
            b = self.cast_at(b, DType::F32, loc);
        }
        let Some(v) = self.unify(&[a, b], op.name(), loc) else { return a };
        let t = self.ty(v[0]);
        self.emit1(Op::Binary(op), &[v[0], v[1]], t, loc)
    }

    fn unary_at(&mut self, op: UnaryOp, x: Value, loc: &Loc) -> Value {
        let t = self.ty(x);
        let mut x = x;
        if op.float_only() && t.dtype().is_some_and(|d| !d.is_float()) {
            // Triton's math functions promote integer operands to f32.
            x = self.cast_at(x, DType::F32, loc);
        }
        let t = self.ty(x);
        self.emit1(Op::Unary(op), &[x], t, loc)
    }

    fn cmp_at(&mut self, op: CmpOp, a: Value, b: Value, loc: &Loc) -> Value {
        let Some(v) = self.unify(&[a, b], "cmp", loc) else { return a };
        let t = self.ty(v[0]).with_dtype(DType::I1);
        self.emit1(Op::Cmp(op), &[v[0], v[1]], t, loc)
    }

    /// `tl.where(cond, a, b)` with broadcasting and promotion.
    #[track_caller]
    pub fn where_(&mut self, cond: Value, a: Value, b: Value) -> Value {
        let loc = Loc::caller();
        let tc = self.ty(cond);
        if tc.dtype() != Some(DType::I1) {
            self.error("where", &loc, format!("condition must be i1, found {tc}"));
            return a;
        }
        let (ta, tb) = (self.ty(a), self.ty(b));
        let (a, b, shape) = if ta.is_ptr() || tb.is_ptr() {
            if ta != tb && !(ta.elem == tb.elem) {
                self.error("where", &loc, format!("cannot select between {ta} and {tb}"));
                return a;
            }
            let s = match Self::broadcast_shapes(&ta.shape, &tb.shape).and_then(|s| Self::broadcast_shapes(&s, &tc.shape)) {
                Ok(s) => s,
                Err(e) => {
                    self.error("where", &loc, e);
                    return a;
                }
            };
            (self.broadcast_at(a, &s, &loc), self.broadcast_at(b, &s, &loc), s)
        } else {
            let Some(v) = self.unify(&[a, b], "where", &loc) else { return a };
            let s = match Self::broadcast_shapes(&self.shape(v[0]), &tc.shape) {
                Ok(s) => s,
                Err(e) => {
                    self.error("where", &loc, e);
                    return a;
                }
            };
            (self.broadcast_at(v[0], &s, &loc), self.broadcast_at(v[1], &s, &loc), s)
        };
        let c = self.broadcast_at(cond, &shape, &loc);
        let t = self.ty(a);
        self.emit1(Op::Where, &[c, a, b], t, &loc)
    }

    // ---- reductions, scans, dot -------------------------------------------------------------

    fn reduce_at(&mut self, kind: ReduceOp, x: Value, axis: Option<isize>, keep_dims: bool, loc: &Loc) -> Value {
        let t = self.ty(x);
        let Some(dt) = t.dtype() else {
            self.error(kind.name(), loc, format!("cannot reduce {t}"));
            return x;
        };
        let mut x = x;
        if dt.is_bool() {
            x = self.cast_at(x, DType::I32, loc);
        }
        let t = self.ty(x);
        if t.is_scalar() {
            return x;
        }
        let (x, ax, keep_shape) = match axis {
            None => {
                let flat = if t.rank() == 1 { x } else { self.emit1(Op::Reshape, &[x], t.with_shape(&[t.numel()]), loc) };
                (flat, 0usize, keep_dims.then(|| vec![1usize; t.rank()]))
            }
            Some(a) => {
                let a2 = if a < 0 { a + t.rank() as isize } else { a };
                if a2 < 0 || a2 as usize >= t.rank() {
                    self.error(kind.name(), loc, format!("axis {a} is out of range for {t}"));
                    return x;
                }
                (x, a2 as usize, None)
            }
        };
        let xt = self.ty(x);
        let keep = keep_dims && keep_shape.is_none();
        let mut s = xt.shape.clone();
        if keep {
            s[ax] = 1;
        } else {
            s.remove(ax);
        }
        let rd = if matches!(kind, ReduceOp::Argmax | ReduceOp::Argmin) { DType::I32 } else { xt.dtype().unwrap_or(DType::F32) };
        let r = self.emit1(Op::Reduce { kind, axis: ax as u8, keep_dims: keep }, &[x], Type::tile(rd, &s), loc);
        match keep_shape {
            Some(ks) => self.emit1(Op::Reshape, &[r], Type::tile(rd, &ks), loc),
            None => r,
        }
    }

    /// `tl.cumsum(x, axis)`.
    #[track_caller]
    pub fn cumsum(&mut self, x: Value, axis: isize, reverse: bool) -> Value {
        let loc = Loc::caller();
        let mut x = x;
        if self.ty(x).dtype() == Some(DType::I1) {
            x = self.cast_at(x, DType::I32, &loc);
        }
        let t = self.ty(x);
        let a = if axis < 0 { axis + t.rank() as isize } else { axis };
        if t.dtype().is_none() || a < 0 || a as usize >= t.rank() {
            self.error("cumsum", &loc, format!("axis {axis} is out of range for {t}"));
            return x;
        }
        self.emit1(Op::Cumsum { axis: a as u8, reverse }, &[x], t, &loc)
    }

    /// `tl.dot(a, b, acc)` with Triton's default precision (tf32 for f32 operands).
    #[track_caller]
    pub fn dot(&mut self, a: Value, b: Value, acc: Option<Value>) -> Value {
        let loc = Loc::caller();
        self.dot_at(a, b, acc, None, &loc)
    }

    /// `tl.dot(a, b, acc, input_precision=...)`.
    #[track_caller]
    pub fn dot_with(&mut self, a: Value, b: Value, acc: Option<Value>, precision: DotPrecision) -> Value {
        let loc = Loc::caller();
        self.dot_at(a, b, acc, Some(precision), &loc)
    }

    fn dot_at(&mut self, a: Value, b: Value, acc: Option<Value>, precision: Option<DotPrecision>, loc: &Loc) -> Value {
        let (ta, tb) = (self.ty(a), self.ty(b));
        if ta.rank() != 2 || tb.rank() != 2 || ta.shape[1] != tb.shape[0] {
            self.error("dot", loc, format!("shapes {ta} and {tb} are not [M, K] and [K, N]"));
            return a;
        }
        let (Some(da), Some(db)) = (ta.dtype(), tb.dtype()) else {
            self.error("dot", loc, format!("operands must be numeric, found {ta} and {tb}"));
            return a;
        };
        let d = DType::promote(da, db);
        let (a, b) = (self.cast_at(a, d, loc), self.cast_at(b, d, loc));
        let out = [ta.shape[0], tb.shape[1]];
        let acc = match acc {
            Some(c) => c,
            None => {
                let ad = if d == DType::F64 { DType::F64 } else { DType::F32 };
                let z = self.constant_at(Lit::Float(0.0), ad, loc);
                self.emit1(Op::Broadcast, &[z], Type::tile(ad, &out), loc)
            }
        };
        let tc = self.ty(acc);
        if tc.shape.as_slice() != out {
            self.error("dot", loc, format!("accumulator {tc} does not have shape {out:?}"));
            return acc;
        }
        let precision = precision.unwrap_or(if d == DType::F32 { DotPrecision::Tf32 } else { DotPrecision::Ieee });
        self.emit1(Op::Dot { precision }, &[a, b, acc], tc, loc)
    }

    // ---- memory -----------------------------------------------------------------------------

    /// `tl.load(ptr, mask, other)`; a scalar `mask`/`other` is broadcast, `other` is cast.
    #[track_caller]
    pub fn load(&mut self, ptr: Value, mask: Option<Value>, other: Option<Value>) -> Value {
        let loc = Loc::caller();
        self.load_at(ptr, mask, other, &loc)
    }

    fn load_at(&mut self, ptr: Value, mask: Option<Value>, other: Option<Value>, loc: &Loc) -> Value {
        let pt = self.ty(ptr);
        let Elem::Ptr(dt) = pt.elem else {
            self.error("load", loc, format!("loads need a pointer, found {pt}"));
            return ptr;
        };
        let (ptr, mask) = match self.ptr_and_mask(ptr, mask, "load", loc) {
            Some(x) => x,
            None => return ptr,
        };
        let shape = self.shape(ptr);
        let other = match (other, mask) {
            (Some(_), None) => {
                self.error("load", loc, "`other` requires a mask".into());
                None
            }
            (Some(o), Some(_)) => {
                let o = self.cast_at(o, dt, loc);
                Some(self.broadcast_at(o, &shape, loc))
            }
            (None, _) => None,
        };
        let mut args: Vec<Value> = vec![ptr];
        args.extend(mask);
        args.extend(other);
        self.emit1(Op::Load { mask: mask.is_some(), other: other.is_some() }, &args, Type::tile(dt, &shape), loc)
    }

    /// Broadcasts a pointer and its mask to one shape.
    fn ptr_and_mask(&mut self, ptr: Value, mask: Option<Value>, op: &str, loc: &Loc) -> Option<(Value, Option<Value>)> {
        let Some(m) = mask else { return Some((ptr, None)) };
        let mt = self.ty(m);
        if mt.dtype() != Some(DType::I1) {
            self.error(op, loc, format!("mask must be i1, found {mt}"));
            return None;
        }
        let s = match Self::broadcast_shapes(&self.shape(ptr), &mt.shape) {
            Ok(s) => s,
            Err(e) => {
                self.error(op, loc, e);
                return None;
            }
        };
        Some((self.broadcast_at(ptr, &s, loc), Some(self.broadcast_at(m, &s, loc))))
    }

    /// A store (`atomic` `None`) or an atomic read-modify-write: the pointer's shape is the
    /// access's, the value is cast to the pointee dtype and broadcast. Atomics return the old
    /// values (`None` after an error or for stores).
    fn store_like(&mut self, atomic: Option<Option<AtomicOp>>, ptr: Value, value: Value, mask: Option<Value>, loc: &Loc) -> Option<Value> {
        let name = match atomic {
            None => "store",
            Some(None) => "atomic_add",
            Some(Some(k)) => k.name(),
        };
        let pt = self.ty(ptr);
        let Elem::Ptr(dt) = pt.elem else {
            self.error(name, loc, format!("{name} needs a pointer, found {pt}"));
            return None;
        };
        // The pointer shape is the shape of the access; the value broadcasts to it.
        let vt = self.ty(value);
        let s = match Self::broadcast_shapes(&pt.shape, &vt.shape) {
            Ok(s) => s,
            Err(e) => {
                self.error(name, loc, e);
                return None;
            }
        };
        let ptr = self.broadcast_at(ptr, &s, loc);
        let (ptr, mask) = self.ptr_and_mask(ptr, mask, name, loc)?;
        let s = self.shape(ptr);
        let v = self.cast_at(value, dt, loc);
        let v = self.broadcast_at(v, &s, loc);
        let mut args = vec![ptr, v];
        args.extend(mask);
        let m = mask.is_some();
        match atomic {
            None => {
                self.emit(Op::Store { mask: m }, &args, vec![], loc);
                None
            }
            Some(kind) => {
                let op = match kind {
                    None => Op::AtomicAdd { mask: m },
                    Some(kind) => Op::AtomicRmw { kind, mask: m },
                };
                Some(self.emit1(op, &args, Type::tile(dt, &s), loc))
            }
        }
    }

    /// `tl.store(ptr, value, mask)`; the value is cast to the pointee dtype and broadcast.
    #[track_caller]
    pub fn store(&mut self, ptr: Value, value: Value, mask: Option<Value>) {
        let loc = Loc::caller();
        self.store_like(None, ptr, value, mask, &loc);
    }

    /// `tl.atomic_add(ptr, value, mask)`: returns the old values (see [`Op::AtomicAdd`]; after
    /// an error, the pointer).
    #[track_caller]
    pub fn atomic_add(&mut self, ptr: Value, value: Value, mask: Option<Value>) -> Value {
        let loc = Loc::caller();
        self.store_like(Some(None), ptr, value, mask, &loc).unwrap_or(ptr)
    }

    /// `tl.atomic_max/min/and/or/xor/xchg(ptr, value, mask)`: returns the old values.
    #[track_caller]
    pub fn atomic_rmw(&mut self, kind: AtomicOp, ptr: Value, value: Value, mask: Option<Value>) -> Value {
        let loc = Loc::caller();
        self.store_like(Some(Some(kind)), ptr, value, mask, &loc).unwrap_or(ptr)
    }

    /// `tl.atomic_cas(ptr, cmp, value)`: `cmp` and `value` must have the pointee dtype (as in
    /// Triton, neither is converted) and are broadcast to the pointer's shape; returns the old
    /// values.
    #[track_caller]
    pub fn atomic_cas(&mut self, ptr: Value, cmp: Value, value: Value) -> Value {
        let loc = Loc::caller();
        let pt = self.ty(ptr);
        let Elem::Ptr(dt) = pt.elem else {
            self.error("atomic_cas", &loc, format!("atomic_cas needs a pointer, found {pt}"));
            return ptr;
        };
        for (v, what) in [(cmp, "cmp"), (value, "value")] {
            let t = self.ty(v);
            if t.dtype() != Some(dt) {
                let msg = format!("`{what}` must have the pointer's element type {dt}, found {t} (atomic_cas converts neither operand)");
                self.error("atomic_cas", &loc, msg);
                return ptr;
            }
        }
        let mut s = pt.shape.clone();
        for v in [cmp, value] {
            match Self::broadcast_shapes(&s, &self.ty(v).shape) {
                Ok(x) => s = x,
                Err(e) => {
                    self.error("atomic_cas", &loc, e);
                    return ptr;
                }
            }
        }
        let ptr = self.broadcast_at(ptr, &s, &loc);
        let c = self.broadcast_at(cmp, &s, &loc);
        let v = self.broadcast_at(value, &s, &loc);
        self.emit1(Op::AtomicCas, &[ptr, c, v], Type::tile(dt, &s), &loc)
    }

    // ---- block pointers ---------------------------------------------------------------------

    /// `tl.make_block_ptr(base, shape, strides, offsets, block_shape, order)`.
    #[track_caller]
    pub fn make_block_ptr(
        &mut self,
        base: Value,
        shape: &[Value],
        strides: &[Value],
        offsets: &[Value],
        block_shape: &[usize],
        order: &[usize],
    ) -> BlockPtr {
        let loc = Loc::caller();
        let n = block_shape.len();
        if shape.len() != n || strides.len() != n || offsets.len() != n || order.len() != n {
            self.error(
                "make_block_ptr",
                &loc,
                format!(
                    "shape, strides, offsets, block_shape and order must have one length, found {}, {}, {}, {} and {}",
                    shape.len(),
                    strides.len(),
                    offsets.len(),
                    n,
                    order.len()
                ),
            );
        }
        let bt = self.ty(base);
        if !bt.is_ptr() || !bt.is_scalar() {
            self.error("make_block_ptr", &loc, format!("base must be a scalar pointer, found {bt}"));
        }
        let to_i64 = |b: &mut Self, vs: &[Value]| -> Vec<Value> {
            vs.iter()
                .map(|&v| {
                    let t = b.ty(v);
                    if !t.is_scalar() || !t.dtype().is_some_and(|d| d.is_int()) {
                        b.error("make_block_ptr", &loc, format!("shape, strides and offsets must be integer scalars, found {t}"));
                        v
                    } else {
                        b.cast_at(v, DType::I64, &loc)
                    }
                })
                .collect()
        };
        let shape = to_i64(self, shape);
        let strides = to_i64(self, strides);
        let offsets = to_i64(self, offsets);
        BlockPtr { base, shape, strides, offsets, block_shape: block_shape.to_vec(), order: order.to_vec() }
    }

    /// `tl.advance(bp, deltas)`.
    #[track_caller]
    pub fn advance(&mut self, bp: &BlockPtr, deltas: &[Value]) -> BlockPtr {
        let loc = Loc::caller();
        if deltas.len() != bp.offsets.len() {
            self.error("advance", &loc, format!("{} deltas for a block pointer of rank {}", deltas.len(), bp.offsets.len()));
            return bp.clone();
        }
        let offsets: Vec<Value> = bp
            .offsets
            .iter()
            .zip(deltas)
            .map(|(&o, &d)| {
                let d = self.cast_at(d, DType::I64, &loc);
                self.binary_at(BinaryOp::Add, o, d, &loc)
            })
            .collect();
        bp.with_offsets(&offsets)
    }

    /// Pointer tile and boundary mask of a block pointer's window.
    fn block_ptr_lanes(&mut self, bp: &BlockPtr, boundary_check: &[usize], loc: &Loc) -> (Value, Option<Value>) {
        let n = bp.block_shape.len();
        let mut off: Option<Value> = None;
        let mut mask: Option<Value> = None;
        for d in 0..n {
            if bp.offsets.len() <= d || bp.strides.len() <= d || bp.shape.len() <= d {
                break;
            }
            let ar =
                self.emit1(Op::Arange { start: 0, end: bp.block_shape[d] as i64 }, &[], Type::tile(DType::I32, &[bp.block_shape[d]]), loc);
            let ar = self.cast_at(ar, DType::I64, loc);
            let idx = self.binary_at(BinaryOp::Add, ar, bp.offsets[d], loc);
            let mut s = vec![1usize; n];
            s[d] = bp.block_shape[d];
            let idx = if n > 1 { self.emit1(Op::Reshape, &[idx], Type::tile(DType::I64, &s), loc) } else { idx };
            let term = self.binary_at(BinaryOp::Mul, idx, bp.strides[d], loc);
            off = Some(match off {
                None => term,
                Some(o) => self.binary_at(BinaryOp::Add, o, term, loc),
            });
            if boundary_check.contains(&d) {
                let zero = self.constant_at(Lit::Int(0), DType::I64, loc);
                let lo = self.cmp_at(CmpOp::Ge, idx, zero, loc);
                let hi = self.cmp_at(CmpOp::Lt, idx, bp.shape[d], loc);
                let m = self.binary_at(BinaryOp::And, lo, hi, loc);
                mask = Some(match mask {
                    None => m,
                    Some(x) => self.binary_at(BinaryOp::And, x, m, loc),
                });
            }
        }
        for &d in boundary_check {
            if d >= n {
                self.error("load", loc, format!("boundary_check dim {d} is out of range for a block of rank {n}"));
            }
        }
        let off = off.unwrap_or_else(|| self.constant_at(Lit::Int(0), DType::I64, loc));
        let off = self.broadcast_at(off, &bp.block_shape, loc);
        let p = self.binary_at(BinaryOp::Add, bp.base, off, loc);
        let mask = mask.map(|m| self.broadcast_at(m, &bp.block_shape, loc));
        (p, mask)
    }

    /// `tl.load(block_ptr, boundary_check=..., padding_option=...)`.
    #[track_caller]
    pub fn load_block(&mut self, bp: &BlockPtr, boundary_check: &[usize], padding: Padding) -> Value {
        let loc = Loc::caller();
        let (p, mask) = self.block_ptr_lanes(bp, boundary_check, &loc);
        let other = match (padding, mask) {
            (Padding::None, _) | (_, None) => None,
            (Padding::Zero, Some(_)) => Some(self.constant_at(Lit::Int(0), DType::I32, &loc)),
            (Padding::Nan, Some(_)) => {
                let pd = self.ty(bp.base).elem;
                if !matches!(pd, Elem::Ptr(d) if d.is_float()) {
                    self.error("load", &loc, "padding_option=\"nan\" needs a float tensor".into());
                }
                Some(self.constant_at(Lit::Float(f64::NAN), DType::F64, &loc))
            }
        };
        self.load_at(p, mask, other, &loc)
    }

    /// `tl.store(block_ptr, value, boundary_check=...)`.
    #[track_caller]
    pub fn store_block(&mut self, bp: &BlockPtr, value: Value, boundary_check: &[usize]) {
        let loc = Loc::caller();
        let (p, mask) = self.block_ptr_lanes(bp, boundary_check, &loc);
        self.store_like(None, p, value, mask, &loc);
    }

    // ---- control flow -----------------------------------------------------------------------

    /// `for i in range(lo, hi, step)` with loop-carried values. `body` receives the induction
    /// variable and the carried values and returns the next carried values; the loop returns the
    /// final ones. `max_iters` bounds the trip count (inferred from a run when `None`).
    #[track_caller]
    pub fn for_range(
        &mut self,
        lo: Value,
        hi: Value,
        step: Value,
        max_iters: Option<u32>,
        init: &[Value],
        body: impl FnOnce(&mut KernelBuilder, Value, &[Value]) -> Vec<Value>,
    ) -> Vec<Value> {
        let loc = Loc::caller();
        let Some(b3) = self.unify(&[lo, hi, step], "for", &loc) else { return init.to_vec() };
        let it = self.ty(b3[0]);
        if !it.is_scalar() || !it.dtype().is_some_and(|d| d.is_int()) {
            self.error("for", &loc, format!("loop bounds must be integer scalars, found {it}"));
            return init.to_vec();
        }
        let blk = self.k.new_block();
        let iv = self.k.new_value(it);
        let init_tys: Vec<Type> = init.iter().map(|&v| self.ty(v)).collect();
        let params: Vec<Value> = init_tys.iter().map(|t| self.k.new_value(t.clone())).collect();
        self.k.blocks[blk.index()].params = std::iter::once(iv).chain(params.iter().copied()).collect();
        self.stack.push(blk);
        let next = body(self, iv, &params);
        let next = self.coerce_yield(&next, &init_tys, "for", &loc);
        self.emit(Op::Yield, &next, vec![], &loc);
        self.stack.pop();
        let mut args = vec![b3[0], b3[1], b3[2]];
        args.extend_from_slice(init);
        self.emit(Op::For { body: blk, max_iters }, &args, init_tys, &loc).to_vec()
    }

    /// `while cond(carried): carried = body(carried)`. `cond` receives the carried values and
    /// returns a scalar condition (non-i1 scalars compare with 0); `body` receives them and
    /// returns the next ones; the loop returns the final ones. `max_iters` bounds the number of
    /// body runs (inferred from a run when `None`).
    #[track_caller]
    pub fn while_loop(
        &mut self,
        max_iters: Option<u32>,
        init: &[Value],
        cond: impl FnOnce(&mut KernelBuilder, &[Value]) -> Value,
        body: impl FnOnce(&mut KernelBuilder, &[Value]) -> Vec<Value>,
    ) -> Vec<Value> {
        let loc = Loc::caller();
        let init_tys: Vec<Type> = init.iter().map(|&v| self.ty(v)).collect();
        let cb = self.k.new_block();
        let cparams: Vec<Value> = init_tys.iter().map(|t| self.k.new_value(t.clone())).collect();
        self.k.blocks[cb.index()].params = cparams.clone();
        self.stack.push(cb);
        let c = cond(self, &cparams);
        let ct = self.ty(c);
        let c = match ct.dtype() {
            Some(DType::I1) if ct.is_scalar() => c,
            Some(d) if ct.is_scalar() => {
                let z = self.constant_at(Lit::Int(0), d, &loc);
                self.cmp_at(CmpOp::Ne, c, z, &loc)
            }
            _ => {
                self.error("while", &loc, format!("the condition must be a scalar, found {ct}"));
                c
            }
        };
        self.emit(Op::Yield, &[c], vec![], &loc);
        self.stack.pop();
        let bb = self.k.new_block();
        let bparams: Vec<Value> = init_tys.iter().map(|t| self.k.new_value(t.clone())).collect();
        self.k.blocks[bb.index()].params = bparams.clone();
        self.stack.push(bb);
        let next = body(self, &bparams);
        let next = self.coerce_yield(&next, &init_tys, "while", &loc);
        self.emit(Op::Yield, &next, vec![], &loc);
        self.stack.pop();
        self.emit(Op::While { cond: cb, body: bb, max_iters }, init, init_tys, &loc).to_vec()
    }

    /// Yielded values must keep the carried types; a scalar or a lower dtype is converted the way
    /// Triton does, anything else is an error.
    fn coerce_yield(&mut self, vals: &[Value], tys: &[Type], op: &str, loc: &Loc) -> Vec<Value> {
        if vals.len() != tys.len() {
            self.error(op, loc, format!("yields {} value(s), expected {}", vals.len(), tys.len()));
            return vals.to_vec();
        }
        vals.iter()
            .zip(tys)
            .map(|(&v, t)| {
                let vt = self.ty(v);
                if vt == *t {
                    return v;
                }
                if vt.shape != t.shape {
                    self.error(op, loc, format!("a carried value changes type from {t} to {vt}"));
                    return v;
                }
                match t.dtype() {
                    Some(d) => self.cast_at(v, d, loc),
                    None => {
                        self.error(op, loc, format!("a carried value changes type from {t} to {vt}"));
                        v
                    }
                }
            })
            .collect()
    }

    /// `if cond: ... else: ...` on a scalar condition; each branch returns the values the `if`
    /// defines (both the same types).
    #[track_caller]
    pub fn if_else(
        &mut self,
        cond: Value,
        then_branch: impl FnOnce(&mut KernelBuilder) -> Vec<Value>,
        else_branch: impl FnOnce(&mut KernelBuilder) -> Vec<Value>,
    ) -> Vec<Value> {
        let loc = Loc::caller();
        let ct = self.ty(cond);
        let cond = match ct.dtype() {
            Some(DType::I1) if ct.is_scalar() => cond,
            Some(d) if ct.is_scalar() => {
                let z = self.constant_at(Lit::Int(0), d, &loc);
                self.cmp_at(CmpOp::Ne, cond, z, &loc)
            }
            _ => {
                self.error("if", &loc, format!("condition must be a scalar, found {ct}"));
                return Vec::new();
            }
        };
        let tb = self.k.new_block();
        self.stack.push(tb);
        let tv = then_branch(self);
        self.stack.pop();
        let eb = self.k.new_block();
        self.stack.push(eb);
        let ev = else_branch(self);
        self.stack.pop();
        let tys: Vec<Type> = tv.iter().map(|&v| self.ty(v)).collect();
        self.stack.push(tb);
        self.emit(Op::Yield, &tv, vec![], &loc);
        self.stack.pop();
        self.stack.push(eb);
        let ev = self.coerce_yield(&ev, &tys, "if", &loc);
        self.emit(Op::Yield, &ev, vec![], &loc);
        self.stack.pop();
        self.emit(Op::If { then_block: tb, else_block: eb }, &[cond], tys, &loc).to_vec()
    }

    /// `tl.cdiv(a, b)` on integer scalars or tiles: `(a + b - 1) // b`.
    #[track_caller]
    pub fn cdiv(&mut self, a: Value, b: Value) -> Value {
        let loc = Loc::caller();
        let d = self.ty(b).dtype().unwrap_or(DType::I32);
        let one = self.constant_at(Lit::Int(1), d, &loc);
        let s = self.binary_at(BinaryOp::Add, a, b, &loc);
        let s = self.binary_at(BinaryOp::Sub, s, one, &loc);
        self.binary_at(BinaryOp::FloorDiv, s, b, &loc)
    }
}

macro_rules! binary_methods {
    ($($(#[$m:meta])* $name:ident => $op:ident,)*) => {
        impl KernelBuilder {
            $(
                $(#[$m])*
                #[track_caller]
                pub fn $name(&mut self, a: Value, b: Value) -> Value {
                    let loc = Loc::caller();
                    self.binary_at(BinaryOp::$op, a, b, &loc)
                }
            )*
        }
    };
}

binary_methods! {
    /// `a + b` (pointer + offsets too).
    add => Add,
    /// `a - b`.
    sub => Sub,
    /// `a * b`.
    mul => Mul,
    /// `a / b` (true division; integers become f32 as in Triton).
    div => Div,
    /// `a // b` (truncating, as Triton on integers).
    floordiv => FloorDiv,
    /// `a % b` (sign of the dividend).
    rem => Mod,
    /// `tl.minimum(a, b)`.
    minimum => Min,
    /// `tl.maximum(a, b)`.
    maximum => Max,
    /// `a ** b`.
    pow => Pow,
    /// `a & b`.
    and => And,
    /// `a | b`.
    or => Or,
    /// `a ^ b`.
    xor => Xor,
    /// `tl.umulhi(a, b)`: the high half of the unsigned product.
    umulhi => UMulHi,
}

macro_rules! cmp_methods {
    ($($(#[$m:meta])* $name:ident => $op:ident,)*) => {
        impl KernelBuilder {
            $(
                $(#[$m])*
                #[track_caller]
                pub fn $name(&mut self, a: Value, b: Value) -> Value {
                    let loc = Loc::caller();
                    self.cmp_at(CmpOp::$op, a, b, &loc)
                }
            )*
        }
    };
}

cmp_methods! {
    /// `a == b`.
    eq => Eq,
    /// `a != b`.
    ne => Ne,
    /// `a < b`.
    lt => Lt,
    /// `a <= b`.
    le => Le,
    /// `a > b`.
    gt => Gt,
    /// `a >= b`.
    ge => Ge,
}

macro_rules! unary_methods {
    ($($(#[$m:meta])* $name:ident => $op:ident,)*) => {
        impl KernelBuilder {
            $(
                $(#[$m])*
                #[track_caller]
                pub fn $name(&mut self, x: Value) -> Value {
                    let loc = Loc::caller();
                    self.unary_at(UnaryOp::$op, x, &loc)
                }
            )*
        }
    };
}

unary_methods! {
    /// `-x`.
    neg => Neg,
    /// `tl.abs(x)`.
    abs => Abs,
    /// `~x` / `not x`.
    not => Not,
    /// `tl.exp(x)`.
    exp => Exp,
    /// `tl.exp2(x)`.
    exp2 => Exp2,
    /// `tl.log(x)`.
    log => Log,
    /// `tl.log2(x)`.
    log2 => Log2,
    /// `tl.sqrt(x)`.
    sqrt => Sqrt,
    /// `tl.rsqrt(x)`.
    rsqrt => Rsqrt,
    /// `tl.sin(x)`.
    sin => Sin,
    /// `tl.cos(x)`.
    cos => Cos,
    /// `tl.math.tanh(x)`.
    tanh => Tanh,
    /// `tl.sigmoid(x)`.
    sigmoid => Sigmoid,
    /// `tl.math.erf(x)`.
    erf => Erf,
    /// `tl.floor(x)`.
    floor => Floor,
    /// `tl.ceil(x)`.
    ceil => Ceil,
}

macro_rules! reduce_methods {
    ($($(#[$m:meta])* $name:ident => $op:ident,)*) => {
        impl KernelBuilder {
            $(
                $(#[$m])*
                #[track_caller]
                pub fn $name(&mut self, x: Value, axis: Option<isize>, keep_dims: bool) -> Value {
                    let loc = Loc::caller();
                    self.reduce_at(ReduceOp::$op, x, axis, keep_dims, &loc)
                }
            )*
        }
    };
}

reduce_methods! {
    /// `tl.sum(x, axis, keep_dims)`; `axis = None` reduces everything.
    sum => Sum,
    /// `tl.max(x, axis, keep_dims)`.
    max => Max,
    /// `tl.min(x, axis, keep_dims)`.
    min => Min,
    /// `tl.argmax(x, axis, keep_dims)`.
    argmax => Argmax,
    /// `tl.argmin(x, axis, keep_dims)`.
    argmin => Argmin,
}

#[cfg(test)]
mod move_tests {
    use super::*;

    /// A loop, a use of its result, then at the end a copy of the loop: the copy moves to the
    /// loop's place and takes the use; a copy that uses a value made after the loop stays.
    #[test]
    fn a_copy_of_a_loop_moves_to_its_place_unless_it_uses_what_follows_it() {
        for uses_later in [false, true] {
            let mut b = KernelBuilder::new("k");
            let (out, n) = (b.ptr_param("out", DType::F32), b.scalar_param("n", DType::I32));
            let (lo, one) = (b.i32(0), b.i32(1));
            let zero = b.f32(0.0);
            let looped = |b: &mut KernelBuilder, init: Value| b.for_range(lo, n, one, None, &[init], |b, _, c| vec![b.add(c[0], c[0])]);
            let first = looped(&mut b, zero);
            let the_loop = *b.k.blocks[b.k.body.index()].insts.last().unwrap();
            let later = b.f32(2.0);
            let used = b.mul(first[0], later);
            b.store(out, used, None);
            let from = b.block_len();
            let init = if uses_later { later } else { zero };
            let copy = looped(&mut b, init);
            assert_eq!(b.move_after(from, the_loop, &first, &copy), !uses_later);
            let k = b.finish().unwrap();
            let body = &k.block(k.body).insts;
            let mul = body.iter().position(|&i| matches!(k.inst(i).op, Op::Binary(BinaryOp::Mul))).unwrap();
            let loops: Vec<usize> =
                body.iter().enumerate().filter(|(_, &i)| matches!(k.inst(i).op, Op::For { .. })).map(|(p, _)| p).collect();
            // The product reads the copy's result where it moved (the second loop, now before it).
            let uses = k.inst(body[mul]).args[0];
            let copy_at = if uses_later { loops[1] } else { loops[0] + 1 };
            assert_eq!(loops.len(), 2);
            assert_eq!(uses == k.inst(body[copy_at]).results[0], !uses_later);
            assert!(uses_later || copy_at < mul);
        }
    }

    /// An `if` moved to the end of its block and given a result more on each side, computed
    /// there from that side's values: the kernel verifies and the new result is each side's;
    /// an `if` whose result a later instruction uses does not move.
    #[test]
    fn an_if_moves_to_the_end_and_yields_more_from_each_side() {
        let mut b = KernelBuilder::new("k");
        let (out, n) = (b.ptr_param("out", DType::F32), b.scalar_param("n", DType::I32));
        let zero = b.i32(0);
        let c = b.gt(n, zero);
        let (two, three) = (b.f32(2.0), b.f32(3.0));
        let r = b.if_else(c, |b| vec![b.mul(two, two)], |b| vec![b.add(three, three)]);
        let the_if = b.last_inst().unwrap();
        b.store(out, r[0], None);
        assert!(!b.move_to_end(the_if), "its result is stored after it");
        let mut b = KernelBuilder::new("k");
        let (out, n) = (b.ptr_param("out", DType::F32), b.scalar_param("n", DType::I32));
        let zero = b.i32(0);
        let c = b.gt(n, zero);
        let (two, three) = (b.f32(2.0), b.f32(3.0));
        let (mut t, mut e) = (None, None);
        b.if_else(
            c,
            |b| {
                let v = b.mul(two, two);
                t = Some(v);
                b.store(out, v, None);
                vec![]
            },
            |b| {
                let v = b.add(three, three);
                e = Some(v);
                b.store(out, v, None);
                vec![]
            },
        );
        let sides = [t.unwrap(), e.unwrap()];
        let the_if = b.last_inst().unwrap();
        let later = b.f32(5.0);
        assert!(b.move_to_end(the_if));
        let more = b.extend_if(the_if, |b| vec![b.mul(sides[0], later)], |b| vec![b.sub(sides[1], later)]);
        assert_eq!(more.len(), 1);
        let po = b.add(out, zero);
        b.store(po, more[0], None);
        let k = b.finish().unwrap();
        let body = &k.block(k.body).insts;
        let at = body.iter().position(|&i| matches!(k.inst(i).op, Op::If { .. })).unwrap();
        // After the constant made after it, before the store of what it yields.
        let five = |i: crate::kernel::Inst| matches!(k.inst(i).op, Op::Const { value: Lit::Float(x) } if x == 5.0);
        assert!(body[..at].iter().any(|&i| five(i)));
        assert!(body[at..].iter().any(|&i| matches!(k.inst(i).op, Op::Store { .. })));
        assert_eq!(k.inst(body[at]).results.len(), 1);
        let Op::If { then_block, else_block } = k.inst(body[at]).op else { unreachable!() };
        for (blk, op) in [(then_block, BinaryOp::Mul), (else_block, BinaryOp::Sub)] {
            let insts = &k.block(blk).insts;
            let y = k.inst(*insts.last().unwrap());
            assert!(matches!(y.op, Op::Yield) && y.args.len() == 1);
            let made = insts.iter().find(|&&i| k.inst(i).results.contains(&y.args[0])).unwrap();
            assert_eq!(k.inst(*made).op, Op::Binary(op));
        }
    }

    /// Instructions inserted into a loop's body after one of its instructions, and at the
    /// kernel's start, land there, and the kernel verifies (a value made at the start is used
    /// in the loop).
    #[test]
    fn instructions_inserted_into_a_built_block_land_where_asked() {
        let mut b = KernelBuilder::new("k");
        let (x, out, n) = (b.ptr_param("x", DType::F32), b.ptr_param("out", DType::F32), b.scalar_param("n", DType::I32));
        let (lo, one) = (b.i32(0), b.i32(1));
        b.for_range(lo, n, one, None, &[], |b, i, _| {
            let p = b.add(x, i);
            let v = b.load(p, None, None);
            let q = b.add(out, i);
            b.store(q, v, None);
            vec![]
        });
        let k = b.k.clone();
        let the_loop = *k.block(k.body).insts.last().unwrap();
        let Op::For { body, .. } = k.inst(the_loop).op else { panic!("a loop") };
        let load = *k.block(body).insts.iter().find(|&&i| matches!(k.inst(i).op, Op::Load { .. })).unwrap();
        let two = b.insert_into(k.body, None, |b| b.f32(2.0));
        b.insert_into(body, Some(load), |b| {
            let v = b.k.inst(load).results[0];
            let w = b.mul(v, two);
            b.store(out, w, None);
        });
        let k = b.finish().unwrap();
        assert!(matches!(k.inst(k.block(k.body).insts[0]).op, Op::Const { .. }), "the constant opens the body");
        let ops: Vec<&str> = k.block(body).insts.iter().map(|&i| k.inst(i).op.mnemonic()).collect();
        let at = ops.iter().position(|&o| o == "load").unwrap();
        assert_eq!(&ops[at..at + 3], ["load", "mul", "store"], "{ops:?}");
        assert_eq!(ops.last(), Some(&"yield"));
    }
}
