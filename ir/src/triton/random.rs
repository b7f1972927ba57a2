//! Triton's random numbers: `tl.randint`, `tl.randint4x`, `tl.rand`, `tl.rand4x`, `tl.randn`,
//! `tl.randn4x`, `tl.philox`, `tl.philox_impl`, `tl.uint_to_uniform_float`,
//! `tl.pair_uniform_to_normal` and `tl.umulhi`, computing the bits `triton/language/random.py`
//! computes, so that a kernel that draws a dropout mask in its forward and draws it again in its
//! backward (from the same seed and offsets) gets the same mask here as on the GPU.
//!
//! # Why a front-end lowering
//! Triton's generator is itself a library of `@jit` functions over primitive integer ops
//! (wrapping multiply and add, xor, `umulhi`), so it is lowered here, in the front end, to the
//! canonical ops of the IR: the only new op is [`crate::BinaryOp::UMulHi`], Triton's own
//! `tl.umulhi` primitive. Every backend (the interpreter, the AD evaluator, the VJP kernels, the
//! CUDA code generator) handles random kernels by handling that op, with no Philox of its own to
//! keep in step with Triton's, and random values are integer-derived, so they carry no
//! cotangent: they are constants with respect to the kernel's inputs, as in PyTorch. A Philox
//! op would have kept kernels shorter (10 rounds are about 100 integer ops per call), at the
//! cost of a second implementation of the generator in every backend.
//!
//! # The algorithm (Philox-4x32, `n_rounds` = 10 by default)
//! The state is four 32-bit counter words and two key words. `randint4x(seed, offset)` takes
//! the counter `(offset_lo, offset_hi, 0, 0)`, where `offset_hi` is the high word of an i64
//! offset (0 for i32), and the key `(seed_lo, seed_hi)` of the seed converted to 64 bits (an
//! i32 seed is sign-extended, as Triton's `seed.to(tl.uint64)` does). Each round, with
//! `A = 0xD2511F53`, `B = 0xCD9E8D57`:
//! `(c0, c1, c2, c3) = (umulhi(B, c2) ^ c1 ^ k0, B * c2, umulhi(A, c0) ^ c3 ^ k1, A * c0)`, then
//! `k0 += 0x9E3779B9`, `k1 += 0xBB67AE85`. `randint` is the first word; `rand` maps a word `x`
//! read as i32 to `(x < 0 ? -x - 1 : x)` times `4.6566127342e-10` in f32; `randn` is
//! `sqrt(-2 log(max(1e-7, u1))) * cos(2 pi u2)` of the first two words' uniforms (Box-Muller).
//!
//! # Differences from Triton
//! Triton's results of `randint`, `randint4x`, `philox` and `philox_impl` are `uint32`; the IR has
//! no unsigned dtypes, so they are i32 with the same bits. Stores, bitwise ops, wrapping
//! arithmetic, `rand` and `randn` agree bit for bit; comparisons, `//`, `%` and conversions to
//! float of those results read the bits as signed where Triton reads them as unsigned. Philox on
//! 64-bit counters (Triton's `uint64` variant of `tl.philox`) is refused. `log`, `cos` and `sin`
//! in `randn` are the IR's (correctly rounded f32), where a GPU's may differ in the last bit.

use super::builtins::Args;
use super::convert::Cx;
use super::errors::{fail, R};
use super::value::{literal_like, tensor, Val};
use crate::{DType, KernelBuilder, Value};

/// Philox-4x32's round multipliers and key increments (Weyl constants), as i32 bit patterns.
const ROUND_A: i32 = 0xD251_1F53_u32 as i32;
const ROUND_B: i32 = 0xCD9E_8D57_u32 as i32;
const KEY_A: i32 = 0x9E37_79B9_u32 as i32;
const KEY_B: i32 = 0xBB67_AE85_u32 as i32;
/// Triton's `N_ROUNDS_DEFAULT`.
const N_ROUNDS_DEFAULT: i64 = 10;
/// The most rounds a call may ask for (each is unrolled into about ten ops per call).
const MAX_ROUNDS: i64 = 1024;
/// `uint_to_uniform_float`'s scales: the largest values with `MAX_INT * scale < 1` in f32.
const SCALE_32: f64 = 4.6566127342e-10;
const SCALE_64: f64 = 1.0842020432385337e-19;

/// Whether `name` (canonical, e.g. `tl.rand`) is a function of this module.
pub(crate) fn is_random(name: &str) -> bool {
    matches!(
        name,
        "tl.randint"
            | "tl.randint4x"
            | "tl.rand"
            | "tl.rand4x"
            | "tl.randn"
            | "tl.randn4x"
            | "tl.philox"
            | "tl.philox_impl"
            | "tl.uint_to_uniform_float"
            | "tl.pair_uniform_to_normal"
            | "tl.umulhi"
            | "tl.math.umulhi"
    )
}

/// One 32-bit word of a Philox state: a constant (folded while it stays one) or an i32 value.
#[derive(Clone, Copy, Debug)]
enum Word {
    Const(i32),
    Ir(Value),
}

/// The state of one Philox evaluation: counter words and key words.
struct State {
    c: [Word; 4],
    k: [Word; 2],
}

impl Cx<'_> {
    /// A call of a random-number function (see [`is_random`]).
    pub(crate) fn random(&mut self, name: &str, a: Args, o: u32) -> R<Val> {
        match name {
            "tl.randint" | "tl.randint4x" | "tl.rand" | "tl.rand4x" | "tl.randn" | "tl.randn4x" => self.seeded(name, a, o),
            "tl.philox" => {
                let b = a.bind_at(name, &["seed", "c0", "c1", "c2", "c3", "n_rounds"])?;
                let rounds = rounds(&b[5], o)?;
                let key = self.seed_key(name, &b[0], o)?;
                let mut c = [Word::Const(0); 4];
                for (i, w) in c.iter_mut().enumerate() {
                    *w = self.word(name, &b[1 + i], &format!("`c{i}`"), o)?;
                }
                Ok(self.words(State { c, k: key }, rounds))
            }
            "tl.philox_impl" => {
                let b = a.bind_at(name, &["c0", "c1", "c2", "c3", "k0", "k1", "n_rounds"])?;
                let rounds = rounds(&b[6], o)?;
                let names = ["`c0`", "`c1`", "`c2`", "`c3`", "`k0`", "`k1`"];
                let mut w = [Word::Const(0); 6];
                for (i, x) in w.iter_mut().enumerate() {
                    *x = self.word(name, &b[i], names[i], o)?;
                }
                Ok(self.words(State { c: [w[0], w[1], w[2], w[3]], k: [w[4], w[5]] }, rounds))
            }
            "tl.uint_to_uniform_float" => {
                let b = a.bind_at(name, &["x"])?;
                let x = self.int_tensor(name, &b[0], "`x`", o)?;
                Ok(Val::Tensor(self.uniform(x)))
            }
            "tl.pair_uniform_to_normal" => {
                let b = a.bind_at(name, &["u1", "u2"])?;
                let (u1, u2) = (self.float_tensor(name, &b[0], "`u1`", o)?, self.float_tensor(name, &b[1], "`u2`", o)?);
                let (n1, n2) = self.normal_pair(u1, u2);
                Ok(Val::Tuple(vec![Val::Tensor(n1), Val::Tensor(n2)]))
            }
            _ => self.umulhi_call(name, a, o),
        }
    }

    /// `randint`, `rand`, `randn` and their `4x` forms: `(seed, offset, n_rounds=10)`.
    fn seeded(&mut self, name: &str, a: Args, o: u32) -> R<Val> {
        let b = a.bind_at(name, &["seed", "offset", "n_rounds"])?;
        let rounds = rounds(&b[2], o)?;
        let k = self.seed_key(name, &b[0], o)?;
        let (lo, hi) = self.offset_words(name, &b[1], o)?;
        let state = State { c: [lo, hi, Word::Const(0), Word::Const(0)], k };
        let w = self.philox(state, rounds);
        let shape = self.shape_of(&w);
        let w: Vec<Value> = w.iter().map(|&x| self.materialize(x, &shape)).collect();
        Ok(match name {
            "tl.randint" => Val::Tensor(w[0]),
            "tl.randint4x" => Val::Tuple(w.iter().map(|&x| Val::Tensor(x)).collect()),
            "tl.rand" => Val::Tensor(self.uniform(w[0])),
            "tl.rand4x" => Val::Tuple(w.iter().map(|&x| Val::Tensor(self.uniform(x))).collect()),
            "tl.randn" => {
                let (u1, u2) = (self.uniform(w[0]), self.uniform(w[1]));
                let (r, th) = self.polar(u1, u2);
                let c = self.b.cos(th);
                Val::Tensor(self.b.mul(r, c))
            }
            _ => {
                let u: Vec<Value> = w.iter().map(|&x| self.uniform(x)).collect();
                let (n1, n2) = self.normal_pair(u[0], u[1]);
                let (n3, n4) = self.normal_pair(u[2], u[3]);
                Val::Tuple([n1, n2, n3, n4].into_iter().map(Val::Tensor).collect())
            }
        })
    }

    /// `philox`/`philox_impl`'s result: the four words after `rounds` rounds, in one shape.
    fn words(&mut self, s: State, rounds: u32) -> Val {
        let w = self.philox(s, rounds);
        let shape = self.shape_of(&w);
        Val::Tuple(w.iter().map(|&x| Val::Tensor(self.materialize(x, &shape))).collect())
    }

    /// `tl.umulhi(x, y)` (also `tl.math.umulhi`), with Triton's literal rules.
    fn umulhi_call(&mut self, name: &str, a: Args, o: u32) -> R<Val> {
        let b = a.bind_at(name, &["x", "y"])?;
        let (Some((x, xo)), Some((y, yo))) = (&b[0], &b[1]) else { return fail(o, format!("`{name}` needs two operands")) };
        let (x, y) = match (x, y) {
            (Val::Tensor(t), v) if v.is_const() => (*t, literal_like(&mut self.b, v, *t, *yo, "an operand")?),
            (v, Val::Tensor(t)) if v.is_const() => (literal_like(&mut self.b, v, *t, *xo, "an operand")?, *t),
            _ => (tensor(&mut self.b, x, *xo, "an operand")?, tensor(&mut self.b, y, *yo, "an operand")?),
        };
        for (v, vo) in [(x, *xo), (y, *yo)] {
            let t = self.b.ty(v);
            if !t.dtype().is_some_and(|d| d.is_int()) {
                return fail(vo, format!("`{name}` needs integer operands (i32 or i64), found {t}"));
            }
        }
        Ok(Val::Tensor(self.b.umulhi(x, y)))
    }

    // ---- the generator ------------------------------------------------------------------------

    /// `n` rounds of Philox-4x32 from `s`: the four counter words at the end.
    fn philox(&mut self, mut s: State, n: u32) -> [Word; 4] {
        for round in 0..n {
            let [c0, c1, c2, c3] = s.c;
            let (a, b) = (Word::Const(ROUND_A), Word::Const(ROUND_B));
            let hb = self.op(Op2::MulHi, b, c2);
            let x0 = self.op(Op2::Xor, hb, c1);
            let n0 = self.op(Op2::Xor, x0, s.k[0]);
            let ha = self.op(Op2::MulHi, a, c0);
            let x2 = self.op(Op2::Xor, ha, c3);
            let n2 = self.op(Op2::Xor, x2, s.k[1]);
            let n1 = self.op(Op2::Mul, b, c2);
            let n3 = self.op(Op2::Mul, a, c0);
            s.c = [n0, n1, n2, n3];
            // The key after the last round is never read: not emitted.
            if round + 1 < n {
                s.k = [self.op(Op2::Add, s.k[0], Word::Const(KEY_A)), self.op(Op2::Add, s.k[1], Word::Const(KEY_B))];
            }
        }
        s.c
    }

    /// One i32 op on two words, folded when both are constants.
    fn op(&mut self, op: Op2, x: Word, y: Word) -> Word {
        if let (Word::Const(p), Word::Const(q)) = (x, y) {
            return Word::Const(op.fold(p, q));
        }
        let (x, y) = (self.word_value(x), self.word_value(y));
        Word::Ir(match op {
            Op2::MulHi => self.b.umulhi(x, y),
            Op2::Mul => self.b.mul(x, y),
            Op2::Add => self.b.add(x, y),
            Op2::Xor => self.b.xor(x, y),
        })
    }

    /// The IR value of a word (a constant becomes an i32 scalar).
    fn word_value(&mut self, w: Word) -> Value {
        match w {
            Word::Const(c) => self.b.constant(c as i64, DType::I32),
            Word::Ir(v) => v,
        }
    }

    /// The shape the words broadcast to (where they do not, the builder reports it on use).
    fn shape_of(&self, w: &[Word]) -> Vec<usize> {
        let mut shape = crate::Shape::new();
        for x in w {
            if let Word::Ir(v) = x {
                shape = KernelBuilder::broadcast_shapes(&shape, &self.b.shape(*v)).unwrap_or(shape);
            }
        }
        shape.to_vec()
    }

    /// A word as an i32 value of `shape`.
    fn materialize(&mut self, w: Word, shape: &[usize]) -> Value {
        let v = self.word_value(w);
        if shape.is_empty() {
            v
        } else {
            self.b.broadcast_to(v, shape)
        }
    }

    // ---- seeds, offsets and counters ----------------------------------------------------------

    /// The key words `(seed_lo, seed_hi)` of `seed` converted to 64 bits (sign-extended).
    fn seed_key(&mut self, name: &str, seed: &Option<(Val, u32)>, o: u32) -> R<[Word; 2]> {
        match seed {
            Some((Val::Int(i), _)) => Ok(split_const(*i)),
            Some((Val::Bool(x), _)) => Ok(split_const(*x as i64)),
            Some((v, vo)) => {
                let t = tensor(&mut self.b, v, *vo, "the seed")?;
                match self.b.ty(t).dtype() {
                    Some(DType::I32) => {
                        let zero = self.b.i32(0);
                        let neg = self.b.lt(t, zero);
                        let (ones, zero) = (self.b.i32(-1), self.b.i32(0));
                        Ok([Word::Ir(t), Word::Ir(self.b.where_(neg, ones, zero))])
                    }
                    Some(DType::I64) => Ok(self.split64(t)),
                    _ => fail(*vo, format!("the seed of `{name}` must be an integer (i32 or i64), found {}", self.b.ty(t))),
                }
            }
            None => fail(o, format!("`{name}` needs a seed")),
        }
    }

    /// The counter words `(lo, hi)` of `offset`: an i32 offset is its own low word (high 0); an
    /// i64 offset splits.
    fn offset_words(&mut self, name: &str, offset: &Option<(Val, u32)>, o: u32) -> R<(Word, Word)> {
        let t = self.int_tensor(name, offset, "the offset", o)?;
        if self.b.ty(t).dtype() == Some(DType::I64) {
            let [lo, hi] = self.split64(t);
            Ok((lo, hi))
        } else {
            Ok((Word::Ir(t), Word::Const(0)))
        }
    }

    /// A 32-bit counter or key word of `philox`/`philox_impl`; 64-bit counters are refused.
    fn word(&mut self, name: &str, v: &Option<(Val, u32)>, what: &str, o: u32) -> R<Word> {
        if let Some((Val::Int(i), vo)) = v {
            return match i32::try_from(*i).or_else(|_| u32::try_from(*i).map(|u| u as i32)) {
                Ok(c) => Ok(Word::Const(c)),
                Err(_) => fail(*vo, format!("{what} of `{name}` is a 32-bit word: {i} does not fit")),
            };
        }
        let t = self.int_tensor(name, v, what, o)?;
        if self.b.ty(t).dtype() == Some(DType::I64) {
            let vo = v.as_ref().map_or(o, |x| x.1);
            return fail(vo, format!("{what} of `{name}` is i64: Philox on 64-bit counters is not supported (use i32 counters)"));
        }
        Ok(Word::Ir(t))
    }

    /// The low and high i32 words of an i64 value: `x - (x & 0xFFFFFFFF)` is a multiple of
    /// 2^32, so dividing it by 2^32 is exact (an arithmetic shift, which the IR does not have).
    fn split64(&mut self, x: Value) -> [Word; 2] {
        let lo = self.b.cast(x, DType::I32);
        let mask = self.b.i64(0xFFFF_FFFF);
        let low_bits = self.b.and(x, mask);
        let upper = self.b.sub(x, low_bits);
        let two32 = self.b.i64(1 << 32);
        let hi = self.b.floordiv(upper, two32);
        [Word::Ir(lo), Word::Ir(self.b.cast(hi, DType::I32))]
    }

    /// An argument that must be an integer tensor or int (i32 or i64).
    fn int_tensor(&mut self, name: &str, v: &Option<(Val, u32)>, what: &str, o: u32) -> R<Value> {
        let t = self.need(name, v, what, o)?;
        let ty = self.b.ty(t);
        match ty.dtype() {
            Some(DType::I32 | DType::I64) => Ok(t),
            _ => fail(v.as_ref().map_or(o, |x| x.1), format!("{what} of `{name}` must be an integer (i32 or i64), found {ty}")),
        }
    }

    /// An argument that must be a float tensor or number.
    fn float_tensor(&mut self, name: &str, v: &Option<(Val, u32)>, what: &str, o: u32) -> R<Value> {
        let t = self.need(name, v, what, o)?;
        let ty = self.b.ty(t);
        match ty.dtype() {
            Some(d) if d.is_float() => Ok(t),
            _ => fail(v.as_ref().map_or(o, |x| x.1), format!("{what} of `{name}` must be a float, found {ty}")),
        }
    }

    /// A required argument as an IR value.
    fn need(&mut self, name: &str, v: &Option<(Val, u32)>, what: &str, o: u32) -> R<Value> {
        match v {
            Some((v, vo)) => tensor(&mut self.b, v, *vo, what),
            None => fail(o, format!("`{name}` needs {what}")),
        }
    }

    // ---- floats ----------------------------------------------------------------------------------

    /// `uint_to_uniform_float(x)`: a uniform f32 in [0, 1) from random integer bits.
    fn uniform(&mut self, x: Value) -> Value {
        let d = self.b.ty(x).dtype().unwrap_or(DType::I32);
        let scale = if d == DType::I64 { SCALE_64 } else { SCALE_32 };
        let (zero, one) = (self.b.constant(0, d), self.b.constant(1, d));
        let neg = self.b.lt(x, zero);
        let flipped = self.b.neg(x);
        let flipped = self.b.sub(flipped, one);
        let x = self.b.where_(neg, flipped, x);
        let x = self.b.cast(x, DType::F32);
        let s = self.b.f32(scale as f32);
        self.b.mul(x, s)
    }

    /// `pair_uniform_to_normal(u1, u2)` (Box-Muller): `(r cos(th), r sin(th))`.
    fn normal_pair(&mut self, u1: Value, u2: Value) -> (Value, Value) {
        let (r, th) = self.polar(u1, u2);
        let (c, s) = (self.b.cos(th), self.b.sin(th));
        (self.b.mul(r, c), self.b.mul(r, s))
    }

    /// Box-Muller's radius `sqrt(-2 log(max(1e-7, u1)))` and angle `2 pi u2`, in the uniforms'
    /// dtype (Python float literals take a float tensor's dtype).
    fn polar(&mut self, u1: Value, u2: Value) -> (Value, Value) {
        let d = self.b.ty(u1).dtype().unwrap_or(DType::F32);
        let eps = self.b.constant(1.0e-7, d);
        let u1 = self.b.maximum(eps, u1);
        let two_pi = self.b.constant(std::f64::consts::TAU, d);
        let th = self.b.mul(two_pi, u2);
        let m2 = self.b.constant(-2.0, d);
        let l = self.b.log(u1);
        let l = self.b.mul(m2, l);
        (self.b.sqrt(l), th)
    }
}

/// The i32 ops Philox uses.
#[derive(Clone, Copy)]
enum Op2 {
    MulHi,
    Mul,
    Add,
    Xor,
}

impl Op2 {
    /// The op on two constants, as the IR computes it.
    fn fold(self, p: i32, q: i32) -> i32 {
        match self {
            Op2::MulHi => ((p as u32 as u64 * q as u32 as u64) >> 32) as u32 as i32,
            Op2::Mul => p.wrapping_mul(q),
            Op2::Add => p.wrapping_add(q),
            Op2::Xor => p ^ q,
        }
    }
}

/// The key words of a constant seed (a Python int: i32 or i64 in Triton, sign-extended).
fn split_const(seed: i64) -> [Word; 2] {
    let u = seed as u64;
    [Word::Const(u as u32 as i32), Word::Const((u >> 32) as u32 as i32)]
}

/// `n_rounds`: a constant int in 0..=MAX_ROUNDS (10 when absent).
fn rounds(v: &Option<(Val, u32)>, o: u32) -> R<u32> {
    let (n, no) = match v {
        None | Some((Val::None, _)) => (N_ROUNDS_DEFAULT, o),
        Some((Val::Int(i), vo)) => (*i, *vo),
        Some((other, vo)) => return fail(*vo, format!("`n_rounds` must be a constant int (a constexpr), found {}", other.kind())),
    };
    if !(0..=MAX_ROUNDS).contains(&n) {
        return fail(no, format!("`n_rounds` must be between 0 and {MAX_ROUNDS}, found {n}"));
    }
    Ok(n as u32)
}
