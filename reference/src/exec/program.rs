//! One program instance: walks the kernel's blocks, evaluating each op on [`RV`]s, and records its
//! memory accesses. Loads see the launch's initial memory overlaid with this program's own earlier
//! stores and atomics; stores and atomics are logged (not applied) so that every program sees the
//! same initial memory whatever the execution order, and the driver commits them afterwards.

use super::offs::{self, with_offs, Off};
use super::ops::{self, MinMaxNum};
use super::plan::Plan;
use super::scratch::Overlay;
use super::tile::{PtrTile, Tile, RV};
use crate::error::{ExecError, Site};
use crate::tensor::Data;
use std::collections::HashMap;
use std::sync::Arc;
use tilegrad_ir::{AtomicOp, Block, DType, Inst, Kernel, Lit, Op, Value};

/// Iterations of a `while` loop without `max_iters` after which the reference gives up.
pub const WHILE_LIMIT: u64 = 10_000_000;

/// Elements held as locks: (slot, offset), sorted. Empty when no lock is held.
pub(crate) type LockSet = Vec<(u32, i64)>;

/// A tensor of the launch, as programs see it.
pub(crate) struct Slot<'m> {
    pub name: String,
    pub dtype: DType,
    pub shape: &'m [usize],
    pub initial: &'m Data,
    /// Some op may write it: loads from it are logged for race detection.
    pub written: bool,
    /// A scratch tensor ([`crate::Options::scratch`]): each program's writes stay its own
    /// ([`super::scratch`]).
    pub scratch: bool,
}

/// How a logged write combines with the element: a store, or an atomic read-modify-write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rmw {
    /// `tl.store`.
    Store,
    /// `tl.atomic_add`.
    Add,
    /// The other read-modify-writes (a successful compare-and-swap is logged as an exchange).
    Op(AtomicOp),
}

/// What every program of a launch shares.
pub(crate) struct Shared<'a> {
    pub kernel: &'a Kernel,
    pub plan: &'a Plan,
    pub slots: Vec<Slot<'a>>,
    /// Initial values of the parameters (pointer params: slot and offset 0).
    pub params: Vec<RV>,
    pub grid: [u32; 3],
    /// The loads whose masked-off float lanes read NaN (see [`crate::Options::poison_masked_loads`]).
    pub poison: Vec<Inst>,
}

/// A logged store or atomic: the access's offsets, values and mask as the (shared, dense) tiles
/// of the program, so logging copies nothing.
pub(crate) struct Event {
    pub inst: Inst,
    pub atomic: bool,
    /// How the values combine with the element.
    pub rmw: Rmw,
    /// Locks this program held during the access (see [`Program`]).
    pub locks: LockSet,
    offs: Arc<Data>,
    pub vals: Arc<Data>,
    mask: Option<Arc<Data>>,
    /// The offsets as runs, when every lane is active (computed once, at the store).
    runs: Option<Runs>,
}

impl Event {
    /// All offsets of the access (active or not): i32 or i64 data.
    pub fn offsets(&self) -> &Data {
        &self.offs
    }

    /// The mask, when some lane is inactive.
    pub fn mask(&self) -> Option<&[bool]> {
        match self.mask.as_deref() {
            Some(Data::I1(m)) => Some(m),
            _ => None,
        }
    }

    /// Offset of lane `l`.
    fn off(&self, l: usize) -> i64 {
        with_offs!(&*self.offs, |ov| ov[l].i())
    }

    /// Active lanes as (lane, offset), in lane order.
    pub fn lanes(&self) -> impl Iterator<Item = (usize, i64)> + '_ {
        let m = self.mask();
        (0..self.offs.len()).filter(move |&l| m.is_none_or(|m| m[l])).map(move |l| (l, self.off(l)))
    }
}

/// Offsets as runs of consecutive elements: (first, length).
pub(crate) type Runs = Vec<(i64, u32)>;

/// Run-length encodes offsets (in their order).
pub(crate) fn runs_of(offs: impl IntoIterator<Item = i64>) -> Runs {
    let mut runs: Runs = Vec::new();
    for o in offs {
        match runs.last_mut() {
            Some((s, l)) if *s + *l as i64 == o && *l < u32::MAX => *l += 1,
            _ => runs.push((o, 1)),
        }
    }
    runs
}

/// A logged load from a tensor that some op may write.
pub(crate) struct ReadLog {
    pub inst: Inst,
    pub runs: Runs,
    /// Locks this program held during the load.
    pub locks: LockSet,
}

/// Per-slot record of one program.
#[derive(Default)]
pub(crate) struct SlotLog {
    pub events: Vec<Event>,
    pub reads: Vec<ReadLog>,
    /// Fast mode: the stores already written to the output, as runs per store instruction.
    pub store_runs: Vec<(Inst, Runs)>,
    /// Element -> value bits as this program sees them after its own writes; built on the first
    /// load after a write.
    overlay: Option<HashMap<i64, u64>>,
    /// This program's writes, when the tensor is scratch.
    pages: Option<super::scratch::Pages>,
}

/// The outcome of one program.
pub(crate) struct ProgramOut {
    pub logs: Vec<SlotLog>,
    pub trips: Vec<(Inst, u64)>,
    pub loaded: u64,
    pub stored: u64,
    pub atomic: u64,
    /// Fast mode: this program both stored and atomically updated one tensor (the fast path
    /// cannot order those; the exact path can).
    pub mixed: bool,
}

/// A bounds scan that passed (see `Program::scanned`).
struct Scanned {
    offs: Arc<Data>,
    mask: Option<Arc<Data>>,
    numel: i64,
    all_active: bool,
}

pub(crate) struct Program<'a> {
    sh: &'a Shared<'a>,
    /// The last successful bounds scan: (offsets, mask, numel, all lanes active). Loads and
    /// stores through `x + offs` and `y + offs` share one offsets buffer (and usually one mask),
    /// so the second access skips the scan. Holding the buffers keeps them from being reused.
    scanned: Option<Scanned>,
    pid: [u32; 3],
    env: Vec<Option<RV>>,
    logs: Vec<SlotLog>,
    trips: Vec<(Inst, u64)>,
    loaded: u64,
    stored: u64,
    atomic: u64,
    /// Locks this program holds: elements it set with a successful `atomic_cas` or changed with
    /// an `atomic_xchg`, and has not yet set back to the value they had (slot, offset, free value
    /// bits). Its accesses while holding one are ordered with the other programs' accesses under
    /// the same lock; one still held when the program ends guarded nothing (see
    /// [`Program::drop_unreleased_locks`]).
    held: Vec<(u32, i64, u64)>,
    /// Records every op's value ([`super::record`]); `None` in ordinary launches.
    rec: Option<Box<super::record::Recorder>>,
    /// Counts the writes that may have changed memory as this program sees it (a `while`
    /// loop's progress check compares it across an iteration).
    changes: u64,
    /// How many `while` loops are running: inside one, a store that repeats an earlier one
    /// is compared with memory to find whether it changed anything.
    whiles: u32,
}

pub(super) fn bits_of(d: &Data, i: usize) -> u64 {
    match d {
        Data::I1(v) => v[i] as u64,
        Data::I32(v) => v[i] as i64 as u64,
        Data::I64(v) => v[i] as u64,
        Data::F32(v) => v[i].to_bits() as u64,
        Data::F64(v) => v[i].to_bits(),
    }
}

/// Combines element bits `cur` with value bits `v` (both of `dtype`) as `rmw` does.
pub(crate) fn rmw_bits(rmw: Rmw, dtype: DType, cur: u64, v: u64) -> u64 {
    let f = |x: u64| f32::from_bits(x as u32);
    let narrow = |x: f32| {
        let mut s = [x];
        ops::round_narrow(dtype, &mut s);
        s[0].to_bits() as u64
    };
    let pick = |max: bool| -> u64 {
        match dtype {
            DType::I32 => {
                let (a, b) = (cur as i64 as i32, v as i64 as i32);
                (if max { a.max(b) } else { a.min(b) }) as i64 as u64
            }
            DType::I64 => {
                let (a, b) = (cur as i64, v as i64);
                (if max { a.max(b) } else { a.min(b) }) as u64
            }
            DType::F64 => {
                let (a, b) = (f64::from_bits(cur), f64::from_bits(v));
                (if max { a.max_num(b) } else { a.min_num(b) }).to_bits()
            }
            DType::I1 => {
                if max {
                    cur | v
                } else {
                    cur & v
                }
            }
            _ => narrow(if max { f(cur).max_num(f(v)) } else { f(cur).min_num(f(v)) }),
        }
    };
    match rmw {
        Rmw::Store | Rmw::Op(AtomicOp::Xchg) => v,
        Rmw::Add => add_bits(dtype, cur, v),
        Rmw::Op(AtomicOp::Max) => pick(true),
        Rmw::Op(AtomicOp::Min) => pick(false),
        // Integers only (the verifier checked): bits of i32 are kept sign-extended.
        Rmw::Op(AtomicOp::And) => cur & v,
        Rmw::Op(AtomicOp::Or) => cur | v,
        Rmw::Op(AtomicOp::Xor) => match dtype {
            DType::I32 => ((cur as i64 as i32) ^ (v as i64 as i32)) as i64 as u64,
            _ => cur ^ v,
        },
    }
}

/// Data of one element from its bits.
pub(crate) fn set_bits(d: &mut Data, o: usize, b: u64) {
    match d {
        Data::I1(v) => v[o] = b != 0,
        Data::I32(v) => v[o] = b as i64 as i32,
        Data::I64(v) => v[o] = b as i64,
        Data::F32(v) => v[o] = f32::from_bits(b as u32),
        Data::F64(v) => v[o] = f64::from_bits(b),
    }
}

/// Bits of element `i` of `d`.
pub(crate) fn elem_bits(d: &Data, i: usize) -> u64 {
    bits_of(d, i)
}

/// Adds `a` (bits of `d`'s element type) to `b`.
fn add_bits(dtype: DType, a: u64, b: u64) -> u64 {
    match dtype {
        DType::I1 => a | b,
        DType::I32 => (a as i64 as i32).wrapping_add(b as i64 as i32) as i64 as u64,
        DType::I64 => (a as i64).wrapping_add(b as i64) as u64,
        DType::F16 | DType::BF16 | DType::F32 => {
            let mut s = [f32::from_bits(a as u32) + f32::from_bits(b as u32)];
            ops::round_narrow(dtype, &mut s);
            s[0].to_bits() as u64
        }
        DType::F64 => (f64::from_bits(a) + f64::from_bits(b)).to_bits(),
    }
}

impl<'a> Program<'a> {
    pub fn new(sh: &'a Shared<'a>, pid: [u32; 3]) -> Program<'a> {
        let mut env = vec![None; sh.kernel.values.len()];
        for (p, v) in sh.kernel.params.iter().zip(&sh.params) {
            env[p.value.index()] = Some(v.clone());
        }
        Program {
            sh,
            scanned: None,
            pid,
            env,
            logs: (0..sh.slots.len()).map(|_| SlotLog::default()).collect(),
            trips: Vec::new(),
            loaded: 0,
            stored: 0,
            atomic: 0,
            held: Vec::new(),
            rec: None,
            changes: 0,
            whiles: 0,
        }
    }

    /// An element this program took and never gave back (a flag set once, a value exchanged in)
    /// guarded no critical section: the accesses made while holding it are not ordered by it.
    fn drop_unreleased_locks(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let stuck: LockSet = self.lockset();
        let strip = |l: &mut LockSet| l.retain(|x| !stuck.contains(x));
        for log in &mut self.logs {
            log.events.iter_mut().for_each(|e| strip(&mut e.locks));
            log.reads.iter_mut().for_each(|r| strip(&mut r.locks));
        }
        self.held.clear();
    }

    /// The locks held now.
    fn lockset(&self) -> LockSet {
        let mut l: LockSet = self.held.iter().map(|&(s, o, _)| (s, o)).collect();
        l.sort_unstable();
        l
    }

    /// Runs the program recording every op's value; its writes are discarded.
    pub fn run_recorded(mut self, rec: super::record::Recorder) -> Result<super::record::Recorder, ExecError> {
        self.rec = Some(Box::new(rec));
        self.block(self.sh.kernel.body)?;
        Ok(*self.rec.take().expect("set above"))
    }

    /// Runs the program. With `fast` outputs, its stores are written there at the end (in
    /// program order) and kept only as runs; atomics stay logged.
    pub fn run(mut self, fast: Option<&[Option<super::fast::FastBuf>]>) -> Result<ProgramOut, ExecError> {
        self.block(self.sh.kernel.body)?;
        self.drop_unreleased_locks();
        // Scratch writes end with the program.
        self.logs.iter_mut().for_each(|l| l.pages = None);
        let mut mixed = false;
        if let Some(bufs) = fast {
            for (s, log) in self.logs.iter_mut().enumerate() {
                if log.events.is_empty() {
                    continue;
                }
                let buf = bufs[s].as_ref().expect("written slots have fast buffers");
                let events = std::mem::take(&mut log.events);
                let (mut st, mut at) = (false, false);
                for e in events {
                    if e.atomic {
                        at = true;
                        log.events.push(e);
                    } else {
                        st = true;
                        let runs = match e.runs {
                            Some(runs) => {
                                buf.write_runs(&runs, &e.vals);
                                runs
                            }
                            None => {
                                buf.write(e.offsets(), e.mask(), &e.vals);
                                runs_of(e.lanes().map(|(_, o)| o))
                            }
                        };
                        log.store_runs.push((e.inst, runs));
                    }
                }
                mixed |= st && at;
                log.overlay = None;
            }
        }
        Ok(ProgramOut { logs: self.logs, trips: self.trips, loaded: self.loaded, stored: self.stored, atomic: self.atomic, mixed })
    }

    fn site(&self, i: Inst) -> Site {
        let d = self.sh.kernel.inst(i);
        Site { kernel: self.sh.kernel.name.clone(), op: d.op.mnemonic(), loc: d.loc.clone(), pid: self.pid }
    }

    fn runtime(&self, i: Inst, message: String) -> ExecError {
        ExecError::Runtime { site: Box::new(self.site(i)), message }
    }

    fn get(&self, v: Value) -> &RV {
        self.env[v.index()].as_ref().expect("verified kernels define values before use")
    }

    fn num(&self, v: Value) -> &Tile {
        match self.get(v) {
            RV::Num(t) => t,
            RV::Ptr(_) => unreachable!("the verifier checked this operand is numeric"),
        }
    }

    fn ptr(&self, v: Value) -> &PtrTile {
        match self.get(v) {
            RV::Ptr(p) => p,
            RV::Num(_) => unreachable!("the verifier checked this operand is a pointer"),
        }
    }

    /// Runs a block up to (not including) a final `yield`, whose operands it returns.
    fn block(&mut self, b: Block) -> Result<Vec<RV>, ExecError> {
        let k = self.sh.kernel;
        for &i in &k.block(b).insts {
            let d = k.inst(i);
            if let Op::Yield = d.op {
                return Ok(d.args.iter().map(|&a| self.get(a).clone()).collect());
            }
            self.inst(i)?;
            if let Some(mut r) = self.rec.take() {
                let env = &self.env;
                r.after(k, i, &|v| env.get(v.index()).cloned().flatten());
                self.rec = Some(r);
            }
            for &v in &self.sh.plan.free_after[i.index()] {
                self.env[v.index()] = None;
            }
        }
        Ok(Vec::new())
    }

    fn set(&mut self, v: Value, x: RV) {
        self.env[v.index()] = Some(x);
    }

    fn inst(&mut self, i: Inst) -> Result<(), ExecError> {
        let k = self.sh.kernel;
        let d = k.inst(i);
        let a = &d.args;
        let res = |n: usize| d.results[n];
        let rty = |n: usize| k.ty(d.results[n]);
        let num = |t: Tile| RV::Num(t);
        match &d.op {
            Op::ProgramId { axis } => {
                let p = self.pid[*axis as usize] as i32;
                self.set(res(0), num(Tile::scalar(DType::I32, Data::I32(vec![p]))));
            }
            Op::NumPrograms { axis } => {
                let g = self.sh.grid[*axis as usize] as i32;
                self.set(res(0), num(Tile::scalar(DType::I32, Data::I32(vec![g]))));
            }
            Op::Const { value } => {
                let dt = rty(0).dtype().expect("verified const is numeric");
                self.set(res(0), num(Tile::scalar(dt, lit_data(*value, dt))));
            }
            Op::Arange { start, end } => {
                let v: Vec<i32> = (*start as i32..*end as i32).collect();
                let n = v.len();
                self.set(res(0), num(Tile::dense(DType::I32, &[n], Data::I32(v))));
            }
            Op::Broadcast => {
                let shape = rty(0).shape.clone();
                let out = match self.get(a[0]) {
                    RV::Num(t) => RV::Num(t.broadcast(&shape)),
                    RV::Ptr(p) => RV::Ptr(PtrTile { slot: p.slot, offs: p.offs.broadcast(&shape) }),
                };
                self.set(res(0), out);
            }
            Op::ExpandDims { axis } => {
                let ax = *axis as usize;
                let out = match self.get(a[0]) {
                    RV::Num(t) => RV::Num(t.expand_dims(ax)),
                    RV::Ptr(p) => RV::Ptr(PtrTile { slot: p.slot, offs: p.offs.expand_dims(ax) }),
                };
                self.set(res(0), out);
            }
            Op::Reshape => {
                let shape = rty(0).shape.clone();
                let out = match self.get(a[0]) {
                    RV::Num(t) => RV::Num(t.reshape(&shape)),
                    RV::Ptr(p) => RV::Ptr(PtrTile { slot: p.slot, offs: p.offs.reshape(&shape) }),
                };
                self.set(res(0), out);
            }
            Op::Permute { perm } => {
                let out = match self.get(a[0]) {
                    RV::Num(t) => RV::Num(ops::permute(t, perm)),
                    RV::Ptr(p) => RV::Ptr(PtrTile { slot: p.slot, offs: ops::permute(&p.offs, perm) }),
                };
                self.set(res(0), out);
            }
            Op::Unary(u) => {
                let t = ops::unary(*u, self.num(a[0])).map_err(|m| self.runtime(i, m))?;
                self.set(res(0), num(t));
            }
            Op::Binary(b) => {
                let t = ops::binary(*b, self.num(a[0]), self.num(a[1])).map_err(|m| self.runtime(i, m))?;
                self.set(res(0), num(t));
            }
            Op::Cmp(c) => {
                let t = ops::cmp(*c, self.num(a[0]), self.num(a[1])).map_err(|m| self.runtime(i, m))?;
                self.set(res(0), num(t));
            }
            Op::Where => {
                let c = self.num(a[0]);
                let out = match (self.get(a[1]), self.get(a[2])) {
                    (RV::Num(x), RV::Num(y)) => RV::Num(ops::select(c, x, y).map_err(|m| self.runtime(i, m))?),
                    (RV::Ptr(x), RV::Ptr(y)) => {
                        if x.slot != y.slot {
                            return Err(self.runtime(
                                i,
                                format!(
                                    "`where` selects between pointers into `{}` and `{}`; a pointer tile must point into one tensor",
                                    self.sh.slots[x.slot as usize].name, self.sh.slots[y.slot as usize].name
                                ),
                            ));
                        }
                        // Offsets may be stored as i32 on one side and i64 on the other.
                        let (xo, yo) = if x.offs.dtype == y.offs.dtype {
                            (x.offs.clone(), y.offs.clone())
                        } else {
                            (ops::cast(&x.offs, DType::I64), ops::cast(&y.offs, DType::I64))
                        };
                        RV::Ptr(PtrTile { slot: x.slot, offs: ops::select(c, &xo, &yo).map_err(|m| self.runtime(i, m))? })
                    }
                    _ => unreachable!("the verifier checked both branches have one type"),
                };
                self.set(res(0), out);
            }
            Op::Cast => {
                let dt = rty(0).dtype().expect("verified cast is numeric");
                let t = ops::cast(self.num(a[0]), dt);
                self.set(res(0), num(t));
            }
            Op::Reduce { kind, axis, .. } => {
                let ty = rty(0);
                let t = ops::reduce(*kind, self.num(a[0]), *axis as usize, ty.dtype().expect("numeric"), &ty.shape)
                    .map_err(|m| self.runtime(i, m))?;
                self.set(res(0), num(t));
            }
            Op::Cumsum { axis, reverse } => {
                let t = ops::cumsum(self.num(a[0]), *axis as usize, *reverse).map_err(|m| self.runtime(i, m))?;
                self.set(res(0), num(t));
            }
            Op::Dot { precision } => {
                let t = ops::dot(self.num(a[0]), self.num(a[1]), self.num(a[2]), *precision).map_err(|m| self.runtime(i, m))?;
                self.set(res(0), num(t));
            }
            Op::AddPtr => {
                let p = self.ptr(a[0]);
                let offs = ops::add_offsets(&p.offs, self.num(a[1]));
                let out = RV::Ptr(PtrTile { slot: p.slot, offs });
                self.set(res(0), out);
            }
            Op::Load { mask, other } => {
                let m = mask.then(|| a[1]);
                let o = other.then(|| a[2]);
                let t = self.load(i, a[0], m, o)?;
                self.set(res(0), num(t));
            }
            Op::Store { mask } => self.store(i, false, a[0], a[1], mask.then(|| a[2]))?,
            Op::AtomicAdd { mask } if !self.sh.plan.ordered => {
                self.store(i, true, a[0], a[1], mask.then(|| a[2]))?;
                if let Some(&r) = d.results.first() {
                    // Unused (the plan found no use): launches whose atomics return values
                    // they use run ordered.
                    let ty = rty(0);
                    let dt = ty.dtype().expect("verified atomics return numbers");
                    self.set(r, num(Tile::scalar(dt, lit_data(Lit::Int(0), dt)).broadcast(&ty.shape)));
                }
            }
            Op::AtomicAdd { mask } => self.atomic(i, Rmw::Add, a[0], a[1], None, mask.then(|| a[2]))?,
            Op::AtomicRmw { kind, mask } => self.atomic(i, Rmw::Op(*kind), a[0], a[1], None, mask.then(|| a[2]))?,
            Op::AtomicCas => self.atomic(i, Rmw::Op(AtomicOp::Xchg), a[0], a[2], Some(a[1]), None)?,
            Op::For { body, max_iters } => self.for_loop(i, *body, *max_iters)?,
            Op::While { cond, body, max_iters } => self.while_loop(i, *cond, *body, *max_iters)?,
            Op::If { then_block, else_block } => {
                let c = self.num(a[0]).bool_scalar();
                let outs = self.block(if c { *then_block } else { *else_block })?;
                for (r, v) in d.results.iter().zip(outs) {
                    self.set(*r, v);
                }
            }
            Op::Yield => unreachable!("yield is handled by the enclosing block"),
        }
        Ok(())
    }

    fn for_loop(&mut self, i: Inst, body: Block, max_iters: Option<u32>) -> Result<(), ExecError> {
        let k = self.sh.kernel;
        let d = k.inst(i);
        let lo = self.num(d.args[0]).i64_scalar();
        let hi = self.num(d.args[1]).i64_scalar();
        let step = self.num(d.args[2]).i64_scalar();
        if step == 0 {
            return Err(self.runtime(i, "loop step is zero".into()));
        }
        let (lo128, hi128, st128) = (lo as i128, hi as i128, step as i128);
        let span = if step > 0 { hi128 - lo128 } else { lo128 - hi128 };
        let trips = if span <= 0 { 0 } else { ((span + st128.abs() - 1) / st128.abs()) as u64 };
        match max_iters {
            Some(m) if trips > m as u64 => return Err(ExecError::LoopBound { site: Box::new(self.site(i)), trips, max_iters: m }),
            None if trips > WHILE_LIMIT => return Err(self.runtime(i, long_for_message())),
            _ => {}
        }
        match self.trips.iter_mut().find(|(j, _)| *j == i) {
            Some((_, t)) => *t = (*t).max(trips),
            None => self.trips.push((i, trips)),
        }
        let iv_ty = k.ty(d.args[0]).dtype().expect("verified bounds are integers");
        let params = k.block(body).params.clone();
        let mut carried: Vec<RV> = d.args[3..].iter().map(|&a| self.get(a).clone()).collect();
        for t in 0..trips {
            let iv = (lo128 + st128 * t as i128) as i64;
            let ivd = match iv_ty {
                DType::I32 => Data::I32(vec![iv as i32]),
                _ => Data::I64(vec![iv]),
            };
            self.set(params[0], RV::Num(Tile::scalar(iv_ty, ivd)));
            for (p, v) in params[1..].iter().zip(carried.drain(..)) {
                self.set(*p, v);
            }
            carried = self.block(body)?;
        }
        for (r, v) in d.results.iter().zip(carried) {
            self.set(*r, v);
        }
        Ok(())
    }

    /// A `while` loop: the condition block, then the body while it holds. A loop past its
    /// `max_iters` is an error; so is one whose iteration leaves unchanged every carried value
    /// its condition depends on (and memory, when the condition reads memory): it can never
    /// end, since programs run in program order and nothing else will change them. Without
    /// `max_iters`, one past [`WHILE_LIMIT`] iterations is an error too.
    fn while_loop(&mut self, i: Inst, cond: Block, body: Block, max_iters: Option<u32>) -> Result<(), ExecError> {
        self.whiles += 1;
        let r = self.run_while(i, cond, body, max_iters);
        self.whiles -= 1;
        r
    }

    fn run_while(&mut self, i: Inst, cond: Block, body: Block, max_iters: Option<u32>) -> Result<(), ExecError> {
        let k = self.sh.kernel;
        let d = k.inst(i);
        let deps = &self.sh.plan.while_deps[&i];
        let cparams = k.block(cond).params.clone();
        let bparams = k.block(body).params.clone();
        let mut carried: Vec<RV> = d.args.iter().map(|&a| self.get(a).clone()).collect();
        let mut trips = 0u64;
        loop {
            let changes = self.changes;
            let before: Vec<Option<RV>> = carried.iter().zip(&deps.carried).map(|(v, &dep)| dep.then(|| v.clone())).collect();
            for (p, v) in cparams.iter().zip(&carried) {
                self.set(*p, v.clone());
            }
            let c = self.block(cond)?;
            let go = match c.first() {
                Some(RV::Num(t)) => t.bool_scalar(),
                _ => unreachable!("the verifier checked the condition yields an i1 scalar"),
            };
            if !go {
                break;
            }
            trips += 1;
            let limit = max_iters.map_or(WHILE_LIMIT, u64::from);
            if trips > limit {
                return Err(match max_iters {
                    Some(m) => ExecError::LoopBound { site: Box::new(self.site(i)), trips, max_iters: m },
                    None => self.runtime(
                        i,
                        format!("`while` loop ran more than {WHILE_LIMIT} iterations without ending (give it a `max_iters` bound if it is meant to)"),
                    ),
                });
            }
            for (p, v) in bparams.iter().zip(carried.drain(..)) {
                self.set(*p, v);
            }
            carried = self.block(body)?;
            let memory_same = self.changes == changes;
            let idle = carried.iter().zip(&before).all(|(a, b)| b.as_ref().is_none_or(|b| same_rv(a, b)));
            if idle && (memory_same || !deps.reads_memory) {
                return Err(self.runtime(i, endless_message(deps.reads_memory)));
            }
        }
        match self.trips.iter_mut().find(|(j, _)| *j == i) {
            Some((_, t)) => *t = (*t).max(trips),
            None => self.trips.push((i, trips)),
        }
        for (r, v) in d.results.iter().zip(carried) {
            self.set(*r, v);
        }
        Ok(())
    }

    /// An atomic read-modify-write in an ordered launch: each active lane, in lane order, reads
    /// the element as this program sees it (the launch's memory after the earlier programs, and
    /// this program's own writes), combines it, and returns the old value (masked-off lanes: 0).
    /// `cmp` makes it a compare-and-swap: lanes whose element differs write nothing. A
    /// successful compare-and-swap that changes its element acquires it as a lock; a write that
    /// gives a held element back its previous value releases it.
    fn atomic(&mut self, i: Inst, rmw: Rmw, ptr: Value, val: Value, cmp: Option<Value>, mask: Option<Value>) -> Result<(), ExecError> {
        let p = self.ptr(ptr).clone();
        let (offs, md) = self.active(i, &p, mask)?;
        let vals = self.num(val).materialize();
        let cmpd = cmp.map(|c| self.num(c).materialize());
        let slot = &self.sh.slots[p.slot as usize];
        if slot.scratch {
            return Err(self.runtime(i, format!("an atomic on `{}`, a scratch tensor (its writes are the program's own)", slot.name)));
        }
        let (dtype, initial) = (slot.dtype, slot.initial);
        let n = offs.len();
        let mv: Option<&[bool]> = match md.as_deref() {
            Some(Data::I1(m)) => Some(m),
            _ => None,
        };
        let log = &mut self.logs[p.slot as usize];
        if log.overlay.is_none() {
            log.overlay = Some(build_overlay(dtype, initial, &log.events));
        }
        let overlay = log.overlay.as_mut().expect("built above");
        let mut old = vec![0u64; n];
        let mut wrote = vec![false; n];
        let mut acquired: Vec<(i64, u64)> = Vec::new();
        let mut changed = false;
        for l in 0..n {
            if mv.is_some_and(|m| !m[l]) {
                continue;
            }
            let o = with_offs!(&*offs, |ov| ov[l].i());
            let cur = overlay.get(&o).copied().unwrap_or_else(|| bits_of(initial, o as usize));
            old[l] = cur;
            let v = bits_of(&vals, l);
            if let Some(c) = &cmpd {
                if bits_of(c, l) != cur {
                    continue;
                }
                if v != cur {
                    acquired.push((o, cur));
                }
            } else if rmw == Rmw::Op(AtomicOp::Xchg) && v != cur {
                // A test-and-set lock (`while tl.atomic_xchg(lock, 1) == 1: pass`): an exchange
                // that changes its element takes it, until the element gets its value back.
                acquired.push((o, cur));
            }
            let next = rmw_bits(rmw, dtype, cur, v);
            changed |= next != cur;
            overlay.insert(o, next);
            wrote[l] = true;
        }
        self.changes += changed as u64;
        let before = self.lockset();
        for &(o, free) in &acquired {
            if !self.held.iter().any(|&(s, x, _)| s == p.slot && x == o) {
                self.held.push((p.slot, o, free));
            }
        }
        // A held element given back its free value is released.
        let overlay = self.logs[p.slot as usize].overlay.as_ref().expect("built above");
        self.held.retain(|&(s, o, free)| s != p.slot || overlay.get(&o).is_none_or(|&b| b != free));
        let mut locks = before;
        for l in self.lockset() {
            if !locks.contains(&l) {
                locks.push(l);
            }
        }
        locks.sort_unstable();
        let active = wrote.iter().filter(|&&w| w).count();
        self.atomic += active as u64;
        if active > 0 {
            let all = active == n;
            let e = Event {
                inst: i,
                atomic: true,
                rmw,
                locks,
                offs: offs.clone(),
                vals: vals.clone(),
                mask: (!all).then(|| Arc::new(Data::I1(wrote))),
                runs: None,
            };
            self.logs[p.slot as usize].events.push(e);
        }
        let d = self.sh.kernel.inst(i);
        if let Some(&r) = d.results.first() {
            let mut out = match dtype {
                DType::I1 => Data::I1(vec![false; n]),
                DType::I32 => Data::I32(vec![0; n]),
                DType::I64 => Data::I64(vec![0; n]),
                DType::F64 => Data::F64(vec![0.0; n]),
                _ => Data::F32(vec![0.0; n]),
            };
            for (l, &b) in old.iter().enumerate() {
                set_bits(&mut out, l, b);
            }
            self.set(r, RV::Num(Tile::dense(dtype, &p.offs.shape, out)));
        }
        Ok(())
    }

    /// Flat lane index -> multi-index in `shape`.
    fn lane(shape: &[usize], mut l: usize) -> Vec<usize> {
        let mut idx = vec![0; shape.len()];
        for d in (0..shape.len()).rev() {
            idx[d] = l % shape[d];
            l /= shape[d];
        }
        idx
    }

    fn oob(&self, i: Inst, slot: u32, offset: i64, shape: &[usize], lane: usize) -> ExecError {
        let s = &self.sh.slots[slot as usize];
        ExecError::OutOfBounds {
            site: Box::new(self.site(i)),
            tensor: s.name.clone(),
            offset,
            numel: s.initial.len(),
            lane: Self::lane(shape, lane),
        }
    }

    /// The active lanes of an access: offsets (dense i64) and mask, checked against the tensor's
    /// bounds.
    fn active(&mut self, i: Inst, p: &PtrTile, mask: Option<Value>) -> Result<(Arc<Data>, Option<Arc<Data>>), ExecError> {
        let offs = p.offs.materialize();
        let numel = self.sh.slots[p.slot as usize].initial.len() as i64;
        let md = mask.map(|m| self.num(m).materialize());
        let mv: Option<&[bool]> = match md.as_deref() {
            Some(Data::I1(m)) => Some(m),
            _ => None,
        };
        let same = |c: &Scanned| {
            Arc::ptr_eq(&c.offs, &offs)
                && c.numel == numel
                && match (&c.mask, &md) {
                    (None, None) => true,
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    _ => false,
                }
        };
        let (bad, all) = match &self.scanned {
            Some(c) if same(c) => (false, c.all_active),
            _ => with_offs!(&*offs, |ov| offs::scan(ov, mv, numel)),
        };
        if !bad {
            self.scanned = Some(Scanned { offs: offs.clone(), mask: md.clone(), numel, all_active: all });
        }
        if bad {
            let l = with_offs!(&*offs, |ov| (0..ov.len()).find(|&l| mv.is_none_or(|m| m[l]) && !(0..numel).contains(&ov[l].i())))
                .expect("a bad lane exists");
            let o = with_offs!(&*offs, |ov| ov[l].i());
            return Err(self.oob(i, p.slot, o, &p.offs.shape, l));
        }
        // An all-true mask is no mask: later passes take their unmasked fast paths.
        let md = if all { None } else { md };
        Ok((offs, md))
    }

    fn load(&mut self, i: Inst, ptr: Value, mask: Option<Value>, other: Option<Value>) -> Result<Tile, ExecError> {
        let p = self.ptr(ptr).clone();
        let (offs, md) = self.active(i, &p, mask)?;
        let slot = &self.sh.slots[p.slot as usize];
        let n = offs.len();
        let mv: Option<&[bool]> = match md.as_deref() {
            Some(Data::I1(m)) => Some(m),
            _ => None,
        };
        // `other`: a splat is read as one value, anything else densely.
        let other_t = other.map(|o| self.num(o).clone());
        let od = other_t.as_ref().map(|t| if t.is_splat() { t.data.clone() } else { t.materialize() });
        let active = mv.map_or(n, |m| m.iter().filter(|&&b| b).count());
        self.loaded += active as u64;
        let poison = other.is_none() && self.sh.poison.contains(&i);
        // Runs of an unmasked access: for a contiguous copy, and for the read log.
        let runs: Runs = if mv.is_none() { with_offs!(&*offs, |ov| offs::runs(ov)) } else { Vec::new() };
        let log = &mut self.logs[p.slot as usize];
        if log.overlay.is_none() && !log.events.is_empty() {
            log.overlay = Some(build_overlay(slot.dtype, slot.initial, &log.events));
        }
        let overlay = match (&log.pages, &log.overlay) {
            (Some(pages), _) => Some(Overlay::Pages(pages)),
            (None, m) => m.as_ref().map(Overlay::Map),
        };
        macro_rules! gather {
            ($var:ident, $init:expr, $from_bits:expr, $zero:expr) => {{
                let other_v: Option<&Vec<_>> = match od.as_deref() {
                    Some(Data::$var(v)) => Some(v),
                    _ => None,
                };
                let read = |o: i64| -> _ {
                    match overlay.and_then(|ov| ov.get(&o)) {
                        Some(&b) => $from_bits(b),
                        None => $init[o as usize],
                    }
                };
                let out: Vec<_> = with_offs!(&*offs, |ov| match (mv, overlay, other_v) {
                    (None, None, _) if runs.len() * 8 <= n => {
                        // Mostly contiguous rows: copy run by run.
                        let mut out = Vec::with_capacity(n);
                        for &(st, len) in &runs {
                            out.extend_from_slice(&$init[st as usize..st as usize + len as usize]);
                        }
                        out
                    }
                    (None, None, _) => ov.iter().map(|&o| $init[o.i() as usize]).collect(),
                    (None, Some(_), _) => ov.iter().map(|&o| read(o.i())).collect(),
                    (Some(m), None, ot) => {
                        let splat = ot.filter(|v| v.len() == 1).map_or($zero, |v| v[0]);
                        match ot.filter(|v| v.len() > 1) {
                            Some(v) => (0..n).map(|l| if m[l] { $init[ov[l].i() as usize] } else { v[l] }).collect(),
                            None => (0..n).map(|l| if m[l] { $init[ov[l].i() as usize] } else { splat }).collect(),
                        }
                    }
                    (Some(m), Some(_), ot) => (0..n)
                        .map(|l| if m[l] { read(ov[l].i()) } else { ot.map_or($zero, |v| if v.len() == 1 { v[0] } else { v[l] }) })
                        .collect(),
                });
                Data::$var(out)
            }};
        }
        let data = match slot.initial {
            Data::I1(init) => gather!(I1, init, |b: u64| b != 0, false),
            Data::I32(init) => gather!(I32, init, |b: u64| b as i64 as i32, 0),
            Data::I64(init) => gather!(I64, init, |b: u64| b as i64, 0),
            Data::F32(init) => gather!(F32, init, |b: u64| f32::from_bits(b as u32), if poison { f32::NAN } else { 0.0 }),
            Data::F64(init) => gather!(F64, init, f64::from_bits, if poison { f64::NAN } else { 0.0 }),
        };
        if slot.written {
            let runs = match mv {
                None => runs,
                Some(m) => with_offs!(&*offs, |ov| runs_of(ov.iter().zip(m).filter(|(_, &b)| b).map(|(&o, _)| o.i()))),
            };
            let locks = self.lockset();
            self.logs[p.slot as usize].reads.push(ReadLog { inst: i, runs, locks });
        }
        Ok(Tile::dense(slot.dtype, &p.offs.shape, data))
    }

    fn store(&mut self, i: Inst, atomic: bool, ptr: Value, val: Value, mask: Option<Value>) -> Result<(), ExecError> {
        let p = self.ptr(ptr).clone();
        let (offs, md) = self.active(i, &p, mask)?;
        let vals = self.num(val).materialize();
        let runs = md.is_none().then(|| with_offs!(&*offs, |ov| offs::runs(ov)));
        let locks = self.lockset();
        let rmw = if atomic { Rmw::Add } else { Rmw::Store };
        let e = Event { inst: i, atomic, rmw, locks, offs, vals, mask: md, runs };
        let active = match e.mask() {
            None => e.offsets().len(),
            Some(m) => m.iter().filter(|&&b| b).count(),
        } as u64;
        if !atomic {
            if let Some(dup) = duplicate(&e) {
                let site = self.site(i);
                let slot = &self.sh.slots[p.slot as usize];
                let kind = crate::error::RaceKind::DuplicateLanes;
                return Err(ExecError::Race(Box::new(crate::error::Race::at(kind, &slot.name, slot.shape, dup, site.clone(), site))));
            }
            self.stored += active;
        } else {
            self.atomic += active;
        }
        let slot = &self.sh.slots[p.slot as usize];
        let log = &mut self.logs[p.slot as usize];
        if slot.scratch {
            if atomic {
                return Err(
                    self.runtime(i, format!("an atomic_add on `{}`, a scratch tensor (its writes are the program's own)", slot.name))
                );
            }
            let pages = log.pages.get_or_insert_with(Default::default);
            for (l, o) in e.lanes() {
                pages.write(slot.initial, o, bits_of(&e.vals, l));
            }
            self.changes += 1;
            return Ok(());
        }
        if atomic || self.whiles == 0 || !rewrites_same(log, slot.dtype, slot.initial, &e) {
            self.changes += 1;
        }
        if let Some(overlay) = &mut log.overlay {
            apply(overlay, slot.dtype, slot.initial, &e);
        }
        let released: Vec<(i64, u64)> = if self.held.iter().any(|&(s, ..)| s == p.slot) {
            let mut m = HashMap::new();
            apply(&mut m, slot.dtype, slot.initial, &e);
            self.held.iter().filter(|h| h.0 == p.slot && m.get(&h.1) == Some(&h.2)).map(|h| (h.1, h.2)).collect()
        } else {
            Vec::new()
        };
        if !e.atomic {
            if let Some(k) = overwritten(&log.events, &e) {
                log.events.remove(k);
            }
        }
        log.events.push(e);
        self.held.retain(|h| h.0 != p.slot || !released.contains(&(h.1, h.2)));
        Ok(())
    }
}

/// How many of a slot's latest events a store looks back over for one it overwrites.
const OVERWRITE_WINDOW: usize = 8;

/// The latest earlier store of the same instruction to exactly the same elements, where only
/// plain stores came after it: `e` overwrites every element it wrote, so the launch's result is
/// the same without it, and the store forgets it. A loop storing one tile each trip (a `while`
/// that never moves on) then logs one store, not one per trip.
fn overwritten(events: &[Event], e: &Event) -> Option<usize> {
    let start = events.len().saturating_sub(OVERWRITE_WINDOW);
    for k in (start..events.len()).rev() {
        let old = &events[k];
        if old.atomic {
            return None;
        }
        if old.inst == e.inst && old.locks == e.locks && same_lanes(old, e) {
            return Some(k);
        }
    }
    None
}

/// Whether `e`, a plain store that repeats an earlier one ([`overwritten`]), writes only the
/// bits this program already sees in its elements (so memory is as it was).
fn rewrites_same(log: &mut SlotLog, dtype: DType, initial: &Data, e: &Event) -> bool {
    if overwritten(&log.events, e).is_none() {
        return false;
    }
    let overlay = log.overlay.get_or_insert_with(|| build_overlay(dtype, initial, &log.events));
    e.lanes().all(|(l, o)| overlay.get(&o).copied().unwrap_or_else(|| bits_of(initial, o as usize)) == bits_of(&e.vals, l))
}

/// Whether two accesses touch the same elements through the same lanes.
fn same_lanes(a: &Event, b: &Event) -> bool {
    let offs = Arc::ptr_eq(&a.offs, &b.offs) || a.offs == b.offs;
    let mask = match (&a.mask, &b.mask) {
        (None, None) => true,
        (Some(x), Some(y)) => Arc::ptr_eq(x, y) || x == y,
        _ => false,
    };
    offs && mask
}

/// Applies one write event to an overlay map.
fn apply(m: &mut HashMap<i64, u64>, dtype: DType, initial: &Data, e: &Event) {
    for (l, o) in e.lanes() {
        let b = bits_of(&e.vals, l);
        if e.atomic {
            let cur = m.get(&o).copied().unwrap_or_else(|| bits_of(initial, o as usize));
            m.insert(o, rmw_bits(e.rmw, dtype, cur, b));
        } else {
            m.insert(o, b);
        }
    }
}

/// Why a `while` loop can never end, by whether its condition reads memory.
/// The error of a `for` loop without `max_iters` whose bounds give more than [`WHILE_LIMIT`]
/// trips (a bound in elements where one in blocks was meant, an overflowed size): refused before
/// its first trip, on every backend, instead of running for hours.
pub fn long_for_message() -> String {
    format!("this `for` loop's bounds give more than {WHILE_LIMIT} trips (give it a `max_iters` bound if it is meant to)")
}

/// The error of a `while` loop found never ending (see `Program::run_while`): one text for the
/// reference and every backend.
pub fn endless_message(reads_memory: bool) -> String {
    if reads_memory {
        "this `while` loop can never end: an iteration changed neither memory nor the carried values its condition depends \
         on (a spin lock that no earlier program released? programs run in program order, so a program never waits on a \
         later one)"
            .into()
    } else {
        "this `while` loop can never end: an iteration left unchanged every carried value its condition depends on (is the \
         step that moves the loop on missing?)"
            .into()
    }
}

/// Whether two values hold the same bits (loop-progress check).
fn same_rv(a: &RV, b: &RV) -> bool {
    let same = |x: &Tile, y: &Tile| x.dtype == y.dtype && x.shape == y.shape && *x.materialize() == *y.materialize();
    match (a, b) {
        (RV::Num(x), RV::Num(y)) => same(x, y),
        (RV::Ptr(x), RV::Ptr(y)) => x.slot == y.slot && same(&x.offs, &y.offs),
        _ => false,
    }
}

/// Replays a program's writes to one tensor into an overlay map.
fn build_overlay(dtype: DType, initial: &Data, events: &[Event]) -> HashMap<i64, u64> {
    let mut m: HashMap<i64, u64> = HashMap::new();
    for e in events {
        apply(&mut m, dtype, initial, e);
    }
    m
}

/// An element two active lanes of one store write with different bits (the winner is undefined
/// on a GPU), if any.
fn duplicate(e: &Event) -> Option<i64> {
    let increasing = match (&e.runs, e.mask()) {
        // Runs that each start past the end of the previous one never repeat an element.
        (Some(runs), _) => runs.windows(2).all(|w| w[1].0 >= w[0].0 + w[0].1 as i64),
        (None, None) => with_offs!(e.offsets(), |ov| offs::increasing(ov)),
        (None, Some(_)) => {
            let mut prev = i64::MIN;
            let mut inc = true;
            for (_, o) in e.lanes() {
                inc &= o > prev;
                prev = o;
            }
            inc
        }
    };
    if increasing {
        return None;
    }
    // Lanes writing one element the same bits leave it the same whichever lands last.
    let mut s: Vec<(i64, u64)> = e.lanes().map(|(lane, o)| (o, bits_of(&e.vals, lane))).collect();
    s.sort_unstable();
    s.windows(2).find(|w| w[0].0 == w[1].0 && w[0].1 != w[1].1).map(|w| w[0].0)
}

/// A literal as one-element data of dtype `dt`.
pub(crate) fn lit_data(l: Lit, dt: DType) -> Data {
    match dt {
        DType::I1 => Data::I1(vec![l.as_i64() != 0]),
        DType::I32 => Data::I32(vec![l.as_i64() as i32]),
        DType::I64 => Data::I64(vec![l.as_i64()]),
        DType::F16 | DType::BF16 | DType::F32 => {
            let mut v = vec![match dt {
                DType::F16 => half::f16::from_f64(l.as_f64()).to_f32(),
                DType::BF16 => half::bf16::from_f64(l.as_f64()).to_f32(),
                _ => l.as_f64() as f32,
            }];
            ops::round_narrow(dt, &mut v);
            Data::F32(v)
        }
        DType::F64 => Data::F64(vec![l.as_f64()]),
    }
}
