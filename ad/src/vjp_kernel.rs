//! VJP kernels: the derivative of a launch as a tile-IR kernel of its own.
//!
//! The evaluator ([`crate::vjp`]) differentiates a launch by running its own rules on batches of
//! programs on the CPU. A VJP kernel states the same derivative in the IR, so that every backend
//! that runs kernels (the reference interpreter, the GPU code generator) runs the ground truth
//! too, fused per program instance:
//!
//! - each program first recomputes its forward, in f64 (the kernel promoted with
//!   [`promote_floats`]), stores included, so that its loads after its own stores see what they
//!   saw;
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
//! The rules follow the evaluator's conventions (see [`crate::rules::vjp`]): symbolic zeros (a
//! zero cotangent or a zero partial contributes zero, even beside an infinite or NaN factor),
//! max/min send the cotangent to the selected operand (ties to the first) or element (the first
//! equal to the result). The evaluator stays authoritative; tests check the two agree on every op.
//!
//! Not yet: loops and branches (`for`, `while`, `if`), whose reverse sweeps need a tape of their
//! carried values; they are refused with the op and its location.

use crate::AdError;
use std::collections::HashMap;
use tilegrad_ir::passes::promote_floats;
use tilegrad_ir::{BinaryOp, DType, DotPrecision, Elem, Inst, Kernel, KernelBuilder, Op, ParamKind, ReduceOp, UnaryOp, Value};

/// A VJP kernel and the shadow parameters it adds.
#[derive(Clone, Debug)]
pub struct VjpKernel {
    /// The kernel: the forward's parameters (floats promoted to f64), then the shadows.
    pub kernel: Kernel,
    /// For each float tensor parameter of the forward, in order: its name and its shadow's.
    pub shadows: Vec<(String, String)>,
}

/// The VJP kernel of `k` (any float dtypes: it computes in f64). See the module docs.
///
/// Errors: loops and branches (not yet), atomics other than an `atomic_add` whose old value is
/// unused (as [`crate::vjp`] refuses them), a float access through a pointer not derived from a
/// parameter; each with the op and its location.
pub fn vjp_kernel(k: &Kernel) -> Result<VjpKernel, AdError> {
    crate::grad::refuse_ordered_atomics(k)?;
    let p = promote_floats(k, DType::F64)?;
    let mut refused = None;
    p.walk(&mut |_, d| {
        if refused.is_none() && matches!(d.op, Op::For { .. } | Op::While { .. } | Op::If { .. }) {
            refused = Some(unsupported(
                &p,
                d,
                "VJP kernels do not take loops or branches yet (their reverse sweeps need a tape); the CPU \
                 evaluator differentiates this kernel",
            ));
        }
    });
    if let Some(e) = refused {
        return Err(e);
    }
    let forward: Vec<Inst> = p.block(p.body).insts.clone();
    let name = p.name.clone();
    let params = p.params.clone();
    let mut e = Emit { k: p.clone(), b: KernelBuilder::resume(p), shadow: HashMap::new(), adj: HashMap::new() };

    // Shadow parameters, named apart from every parameter.
    let mut shadows = Vec::new();
    for prm in &params {
        if let ParamKind::Ptr(d) = prm.kind {
            if d.is_float() {
                let mut s = format!("d_{}", prm.name);
                while params.iter().any(|q| q.name == s) || shadows.iter().any(|(_, t): &(String, String)| *t == s) {
                    s.insert_str(0, "d_");
                }
                let v = e.b.ptr_param(&s, DType::F64);
                e.shadow.insert(prm.value, v);
                shadows.push((prm.name.clone(), s));
            }
        }
    }
    // Shadow pointers beside the forward's pointers, computed from the same offsets.
    for &i in &forward {
        e.shadow_pointer(i)?;
    }
    // The reverse sweep.
    for &i in forward.iter().rev() {
        e.reverse(i)?;
    }
    let mut kernel = e.b.finish()?;
    kernel.name = format!("{name}_vjp");
    Ok(VjpKernel { kernel, shadows })
}

fn unsupported(k: &Kernel, d: &tilegrad_ir::InstData, message: &str) -> AdError {
    AdError::Unsupported { kernel: k.name.clone(), op: d.op.mnemonic().into(), loc: d.loc.clone(), message: message.into() }
}

/// The emitter: the promoted forward (to read types from), the builder continuing it, the shadow
/// of each pointer value, and the adjoint of each float value reached so far.
struct Emit {
    k: Kernel,
    b: KernelBuilder,
    shadow: HashMap<Value, Value>,
    adj: HashMap<Value, Value>,
}

impl Emit {
    fn is_float(&self, v: Value) -> bool {
        matches!(self.k.ty(v).elem, Elem::Num(d) if d.is_float())
    }

    fn shape(&self, v: Value) -> Vec<usize> {
        self.k.ty(v).shape.to_vec()
    }

    /// Adds `g` to the adjoint of `v` (float values only).
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
        self.b.f64(0.0)
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
            unsupported(&self.k, self.k.inst(i), "this float access goes through a pointer not derived from a tensor parameter")
        })
    }

    /// The shadow of a pointer-valued result, where its pointer operand has one.
    fn shadow_pointer(&mut self, i: Inst) -> Result<(), AdError> {
        let d = self.k.inst(i).clone();
        let Some(&r) = d.results.first() else { return Ok(()) };
        if !self.k.ty(r).is_ptr() {
            return Ok(());
        }
        self.b.set_loc(Some(d.loc.clone()));
        let sh = |e: &Emit, v: Value| e.shadow.get(&v).copied();
        let s = match &d.op {
            Op::AddPtr => sh(self, d.args[0]).map(|s| self.b.add(s, d.args[1])),
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
                (Some(x), Some(y)) => Some(self.b.where_(d.args[0], x, y)),
                _ => None,
            },
            _ => None,
        };
        if let Some(s) = s {
            self.shadow.insert(r, s);
        }
        Ok(())
    }

    /// Emits the adjoint of instruction `i`.
    fn reverse(&mut self, i: Inst) -> Result<(), AdError> {
        let d = self.k.inst(i).clone();
        self.b.set_loc(Some(d.loc.clone()));
        let a = &d.args;
        // Memory ops first: their adjoints do not wait for a result's cotangent.
        match &d.op {
            Op::Store { mask } => {
                if self.is_float(a[1]) {
                    let s = self.shadow_of(i, a[0])?;
                    let m = mask.then(|| a[2]);
                    let z = m.map(|_| self.zero());
                    let g = self.b.load(s, m, z);
                    let shape = self.shape(a[1]);
                    let zeros = self.b.full(&shape, 0.0, DType::F64);
                    self.b.store(s, zeros, m);
                    self.acc(a[1], g);
                }
                return Ok(());
            }
            Op::AtomicAdd { mask } => {
                if self.is_float(a[1]) {
                    let s = self.shadow_of(i, a[0])?;
                    let m = mask.then(|| a[2]);
                    let z = m.map(|_| self.zero());
                    let g = self.b.load(s, m, z);
                    self.acc(a[1], g);
                }
                return Ok(());
            }
            _ => {}
        }
        let Some(&r) = d.results.first() else { return Ok(()) };
        let Some(&g) = self.adj.get(&r) else { return Ok(()) };
        match &d.op {
            Op::Store { .. } | Op::AtomicAdd { .. } => unreachable!("handled above"),
            Op::ProgramId { .. } | Op::NumPrograms { .. } | Op::Const { .. } | Op::Arange { .. } | Op::Cmp(_) | Op::AddPtr | Op::Yield => {}
            Op::AtomicRmw { .. } | Op::AtomicCas | Op::For { .. } | Op::While { .. } | Op::If { .. } => {
                return Err(unsupported(&self.k, &d, "not differentiable in a VJP kernel"));
            }
            Op::Load { mask, other } => {
                let s = self.shadow_of(i, a[0])?;
                let m = mask.then(|| a[1]);
                self.b.atomic_add(s, g, m);
                if *other {
                    let z = self.zero();
                    let go = self.b.where_(a[1], z, g);
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
                    return Err(unsupported(&self.k, &d, "a broadcast that changes the rank of a tile"));
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
                let ga = self.b.where_(a[0], g, z);
                let gb = self.b.where_(a[0], z, g);
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
                let bt = self.b.trans(a[1]);
                let ga = self.b.dot_with(g, bt, None, DotPrecision::Ieee);
                let at = self.b.trans(a[0]);
                let gb = self.b.dot_with(at, g, None, DotPrecision::Ieee);
                self.acc(a[0], ga);
                self.acc(a[1], gb);
                self.acc(a[2], g);
            }
        }
        Ok(())
    }

    fn unary(&mut self, u: UnaryOp, x: Value, r: Value, g: Value) {
        use UnaryOp::*;
        let b = &mut self.b;
        let d = match u {
            Floor | Ceil | Not => return,
            Exp => r,
            Exp2 => {
                let c = b.f64(std::f64::consts::LN_2);
                b.mul(c, r)
            }
            Sqrt => {
                let c = b.f64(0.5);
                b.div(c, r)
            }
            Rsqrt => {
                let c = b.f64(-0.5);
                let t = b.mul(c, r);
                let t = b.mul(t, r);
                b.mul(t, r)
            }
            Tanh => {
                let one = b.f64(1.0);
                let rr = b.mul(r, r);
                b.sub(one, rr)
            }
            Sigmoid => {
                let one = b.f64(1.0);
                let om = b.sub(one, r);
                b.mul(r, om)
            }
            Neg => b.f64(-1.0),
            Abs => {
                let (z, one, m1) = (b.f64(0.0), b.f64(1.0), b.f64(-1.0));
                let pos = b.gt(x, z);
                let neg = b.lt(x, z);
                let s = b.where_(neg, m1, z);
                b.where_(pos, one, s)
            }
            Log => {
                let one = b.f64(1.0);
                b.div(one, x)
            }
            Log2 => {
                let (one, c) = (b.f64(1.0), b.f64(std::f64::consts::LN_2));
                let t = b.mul(x, c);
                b.div(one, t)
            }
            Sin => b.cos(x),
            Cos => {
                let s = b.sin(x);
                b.neg(s)
            }
            Erf => {
                let c = b.f64(2.0 / std::f64::consts::PI.sqrt());
                let nx = b.neg(x);
                let t = b.mul(nx, x);
                let t = b.exp(t);
                b.mul(c, t)
            }
        };
        let gx = self.times(g, d);
        self.acc(x, gx);
    }

    fn binary(&mut self, op: BinaryOp, x: Value, y: Value, g: Value) {
        use BinaryOp::*;
        match op {
            FloorDiv | And | Or | Xor => {}
            Add => {
                self.acc(x, g);
                self.acc(y, g);
            }
            Sub => {
                self.acc(x, g);
                let n = self.b.neg(g);
                self.acc(y, n);
            }
            Mul => {
                let gx = self.keep(g, y);
                let gy = self.keep(g, x);
                self.acc(x, gx);
                self.acc(y, gy);
            }
            Div => {
                let one = self.b.f64(1.0);
                let inv = self.b.div(one, y);
                let gx = self.keep(g, inv);
                let yy = self.b.mul(y, y);
                let nx = self.b.neg(x);
                let py = self.b.div(nx, yy);
                let gy = self.keep(g, py);
                self.acc(x, gx);
                self.acc(y, gy);
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
                self.acc(x, g);
                self.acc(y, gy);
            }
            Pow => {
                // d/dx = y x^(y-1) (0 where y is 0), d/dy = x^y ln x (0 where x is 0).
                let (z, one) = (self.zero(), self.b.f64(1.0));
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
                self.acc(x, gx);
                self.acc(y, gy);
            }
            Min | Max => {
                // The first operand is selected when neither is NaN and it is the extreme (ties
                // included), or when the second is NaN, or when both are.
                let b = &mut self.b;
                let xn = b.ne(x, x);
                let yn = b.ne(y, y);
                let any = b.or(xn, yn);
                let xok = b.not(xn);
                let by_nan = b.or(xok, yn);
                let by_value = if op == Max { b.ge(x, y) } else { b.le(x, y) };
                let first = b.where_(any, by_nan, by_value);
                let z = b.f64(0.0);
                let gx = b.where_(first, g, z);
                let gy = b.where_(first, z, g);
                self.acc(x, gx);
                self.acc(y, gy);
            }
        }
    }

    fn reduce(&mut self, kind: ReduceOp, axis: usize, keep_dims: bool, x: Value, r: Value, g: Value) {
        let sx = self.shape(x);
        let b = &mut self.b;
        let ax = axis as isize;
        let gk = if keep_dims { g } else { b.expand_dims(g, ax) };
        let gb = b.broadcast_to(gk, &sx);
        match kind {
            ReduceOp::Argmax | ReduceOp::Argmin => {}
            ReduceOp::Sum => self.acc(x, gb),
            ReduceOp::Max | ReduceOp::Min => {
                // The cotangent goes to the first element equal to the result, or (all NaN)
                // to the one argmax/argmin picks.
                let rk = if keep_dims { r } else { b.expand_dims(r, ax) };
                let rb = b.broadcast_to(rk, &sx);
                let eq = b.eq(x, rb);
                let eqi = b.cast(eq, DType::I32);
                let any = b.max(eqi, Some(ax), true);
                let first_eq = b.argmax(eqi, Some(ax), true);
                let fallback = if kind == ReduceOp::Max { b.argmax(x, Some(ax), true) } else { b.argmin(x, Some(ax), true) };
                let zi = b.i32(0);
                let found = b.gt(any, zi);
                let idx = b.where_(found, first_eq, fallback);
                let n = sx[axis];
                let ar = b.arange(0, n as i64);
                let mut at = vec![1usize; sx.len()];
                at[axis] = n;
                let ar = b.reshape(ar, &at);
                let ar = b.broadcast_to(ar, &sx);
                let ib = b.broadcast_to(idx, &sx);
                let hot = b.eq(ar, ib);
                let z = b.f64(0.0);
                let gx = b.where_(hot, gb, z);
                self.acc(x, gx);
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

    /// Runs the evaluator and the VJP kernel on the same launch; returns the largest normwise
    /// relative difference over the inputs' cotangents (and checks some are not zero).
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
        let want = vjp(&launch, &mem, &inputs, &outputs, &GradOptions::default()).unwrap().inputs;

        let vk = vjp_kernel(k).unwrap();
        let mut m2 = Memory::new();
        let mut vl = Launch::new(&vk.kernel, grid);
        let mut shadow_ids = Vec::new();
        for ((tt, &id), c) in tensors.iter().zip(&ids).zip(&cots) {
            let data: Vec<f64> = (0..tt.n).map(|i| mem.get(id).data().get_f64(i)).collect();
            let p = m2.add(tt.name, HostTensor::from_f64(&[tt.n], data));
            let s = m2.add(&format!("d_{}", tt.name), HostTensor::from_f64(&[tt.n], if tt.output { c.clone() } else { vec![0.0; tt.n] }));
            let (_, sname) = vk.shadows.iter().find(|(n, _)| n == tt.name).expect("a shadow for every float tensor");
            vl = vl.arg(tt.name, p).arg(sname, s);
            shadow_ids.push(s);
        }
        for &(s, v) in scalars {
            vl = vl.arg(s, v);
        }
        vl.run(&mut m2).unwrap_or_else(|e| panic!("{}: {e}\n{}", k.name, vk.kernel));
        let mut w = want.iter();
        for (tt, &s) in tensors.iter().zip(&shadow_ids) {
            if !tt.input {
                continue;
            }
            let want = w.next().unwrap();
            let got: Vec<f64> = (0..tt.n).map(|i| m2.get(s).data().get_f64(i)).collect();
            let norm = want.iter().map(|x| x * x).sum::<f64>().sqrt();
            let diff = want.iter().zip(&got).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
            assert!(norm > 0.0, "{}: the cotangent of {} is zero", k.name, tt.name);
            assert!(
                diff <= 1e-12 * norm,
                "{}: d{} differs by {diff:e} (norm {norm:e})\nwant {:?}\ngot  {:?}",
                k.name,
                tt.name,
                &want[..8.min(tt.n)],
                &got[..8.min(tt.n)]
            );
        }
    }

    const BLOCK: i64 = 64;

    /// `out[i] = f(x[i], y[i])` over blocks of 64 with a masked tail.
    fn pointwise(name: &str, dtype: DType, f: impl Fn(&mut KernelBuilder, Value, Value) -> Value) -> Kernel {
        let mut b = KernelBuilder::new(name);
        let (x, y, out) = (b.ptr_param("x", dtype), b.ptr_param("y", dtype), b.ptr_param("out", dtype));
        let n = b.scalar_param("n", DType::I32);
        let pid = b.program_id(0);
        let bs = b.i32(BLOCK as i32);
        let start = b.mul(pid, bs);
        let r = b.arange(0, BLOCK);
        let offs = b.add(start, r);
        let m = b.lt(offs, n);
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

    /// One tile of `a @ b + c` (masked to 45x29x21 within 64x32x32) in each precision.
    #[test]
    fn dot_agrees() {
        let (mm, nn, kk) = (45usize, 29usize, 21usize);
        for prec in [DotPrecision::Ieee, DotPrecision::Tf32] {
            let mut b = KernelBuilder::new("dot");
            let (pa, pb, pc, po) =
                (b.ptr_param("a", DType::F32), b.ptr_param("b", DType::F32), b.ptr_param("c", DType::F32), b.ptr_param("o", DType::F32));
            let (rm, rn, rk) = (b.arange(0, 64), b.arange(0, 32), b.arange(0, 32));
            let tile = |b: &mut KernelBuilder, p: Value, r: Value, c: Value, nr: usize, nc: usize| {
                let (r2, c2) = (b.expand_dims(r, 1), b.expand_dims(c, 0));
                let ncv = b.i32(nc as i32);
                let o = b.mul(r2, ncv);
                let o = b.add(o, c2);
                let nrv = b.i32(nr as i32);
                let (m1, m2) = (b.lt(r2, nrv), b.lt(c2, ncv));
                let m = b.and(m1, m2);
                let pp = b.add(p, o);
                (pp, m)
            };
            let (ap, am) = tile(&mut b, pa, rm, rk, mm, kk);
            let (bp, bm) = tile(&mut b, pb, rk, rn, kk, nn);
            let (cp, cm) = tile(&mut b, pc, rm, rn, mm, nn);
            let z = b.f32(0.0);
            let av = b.load(ap, Some(am), Some(z));
            let bv = b.load(bp, Some(bm), Some(z));
            let cv = b.load(cp, Some(cm), Some(z));
            let d = b.dot_with(av, bv, Some(cv), prec);
            let (op, om) = tile(&mut b, po, rm, rn, mm, nn);
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
        let pid = b.program_id(0);
        let bs = b.i32(BLOCK as i32);
        let start = b.mul(pid, bs);
        let r = b.arange(0, BLOCK);
        let offs = b.add(start, r);
        let m = b.lt(offs, n);
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

    #[test]
    fn loops_are_refused_with_their_location() {
        let mut b = KernelBuilder::new("looped");
        let x = b.ptr_param("x", DType::F64);
        let (lo, hi, st) = (b.i32(0), b.i32(4), b.i32(1));
        let z = b.f64(0.0);
        let _ = b.for_range(lo, hi, st, None, &[z], |b, i, carried| {
            let p = b.add(x, i);
            let v = b.load(p, None, None);
            vec![b.add(carried[0], v)]
        });
        let k = b.finish().unwrap();
        let e = vjp_kernel(&k).unwrap_err().to_string();
        assert!(e.contains("loops or branches") && e.contains("vjp_kernel.rs"), "{e}");
    }
}
