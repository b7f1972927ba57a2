//! Kernel-to-kernel passes.
//!
//! [`promote_floats`] rewrites a kernel so that every float value is computed in one dtype (f64 in
//! practice). tilegrad's ground truth is computed in f64 whatever the kernel's dtypes, and the
//! engine checks its AD against central finite differences: a central difference with step `h` has
//! a rounding error of about `eps * |f| / h`, which in f32 (`eps` ~ 6e-8) swamps the derivative for
//! any useful `h`, and in f16/bf16 makes it meaningless. Running the same kernel with every float
//! promoted to f64 (and `dot` exact) evaluates the real-valued function the kernel approximates,
//! so both the finite differences and the AD it checks are accurate to ~1e-10.

use crate::error::{Diagnostic, IrError};
use crate::kernel::{Inst, InstData, Kernel, ParamKind, Value};
use crate::op::{DotPrecision, Op};
use crate::types::{DType, Elem};
use std::collections::HashSet;

mod dead_code;
pub use dead_code::remove_dead_code;

pub use crate::offsets::carry_offsets;

/// A copy of `k` in which every float dtype (f16, bf16, f32, f64) becomes `to`:
/// - value types, pointer element types and parameters (pointers, scalars, constexprs);
/// - `dot` runs with [`DotPrecision::Ieee`] (no tf32 rounding of operands);
/// - float `const` literals keep the value as written (they are no longer rounded to the
///   narrower dtype), and so do float constexprs;
/// - a cast between two float dtypes becomes a cast from `to` to `to`, a no-op that the verifier
///   and the interpreters accept; casts between floats and integers keep their integer side.
///
/// Integer and boolean values are unchanged, so offsets, masks and control flow are those of
/// the original kernel. Launches of the result take `to` tensors for every float pointer
/// parameter (see `tilegrad_reference::Launch::with_kernel`).
///
/// The result is canonicalized and verified. Errors: `to` is not a float dtype, or `k` itself
/// does not verify.
pub fn promote_floats(k: &Kernel, to: DType) -> Result<Kernel, IrError> {
    if !to.is_float() {
        return Err(refusal(k, format!("floats can only be promoted to a float dtype, not {to}")));
    }
    crate::verify::verify(k)?;
    let fix = |d: DType| if d.is_float() { to } else { d };
    let mut out = k.clone();
    for p in &mut out.params {
        p.kind = match &p.kind {
            ParamKind::Ptr(d) => ParamKind::Ptr(fix(*d)),
            ParamKind::Scalar(d) => ParamKind::Scalar(fix(*d)),
            ParamKind::Constexpr(d, lit) => ParamKind::Constexpr(fix(*d), *lit),
        };
    }
    for v in &mut out.values {
        v.ty.elem = match v.ty.elem {
            Elem::Num(d) => Elem::Num(fix(d)),
            Elem::Ptr(d) => Elem::Ptr(fix(d)),
        };
    }
    for inst in &mut out.insts {
        if let Op::Dot { precision } = &mut inst.op {
            *precision = DotPrecision::Ieee;
        }
    }
    out.canonicalize();
    crate::verify::verify(&out)?;
    Ok(out)
}

/// [`promote_floats`], except that the float tensors the kernel only reads, or only writes, keep
/// their dtype in memory: a load through them reads the tensor's dtype and casts the value to
/// `to` (a masked load with `other` becomes a load, a cast and a `where` on the mask, so that
/// `other` keeps its promoted value), and a store or `atomic_add` through them casts the value
/// to the tensor's dtype first. Arithmetic is the promoted kernel's: a tensor only read holds
/// exactly what the promoted kernel would read from a converted copy, and what a tensor only
/// written holds is read by nothing in this kernel. A launch of the result then needs no `to`
/// copy of those tensors (half the memory and the traffic, for f32 tensors promoted to f64).
///
/// A tensor parameter stays promoted (its name is not returned) when the kernel both reads and
/// writes it (an atomic that returns the old value does both), or when a pointer may point into
/// it and into another tensor (a `where` between them, a loop carrying either); pointers follow
/// [`crate::analysis::pointer_sources`]. Launches must bind distinct tensors to the parameters
/// kept (an aliased tensor would be read and written).
///
/// Returns the kernel and the names of the parameters kept in their dtype. The instructions of
/// [`promote_floats`]'s result keep their ids (records of a run of `k` keyed by instruction
/// apply). Errors as [`promote_floats`].
pub fn promote_floats_keeping_tensors(k: &Kernel, to: DType) -> Result<(Kernel, Vec<String>), IrError> {
    promote_floats_keeping_tensors_as(k, to, &|_, d| d)
}

/// [`promote_floats_keeping_tensors`], with each kept tensor in the dtype `stored(param, its
/// declared dtype)` says: the dtype its launch binds (a float tensor holding exactly the values
/// the kernel reads, such as an f64 tensor narrowed to f32 where every value is an f32).
pub fn promote_floats_keeping_tensors_as(
    k: &Kernel,
    to: DType,
    stored: &dyn Fn(&str, DType) -> DType,
) -> Result<(Kernel, Vec<String>), IrError> {
    let mut out = promote_floats(k, to)?;
    let src = crate::analysis::pointer_sources(&out);
    let uses = crate::analysis::param_uses(&out);
    let mut used: HashSet<Value> = HashSet::new();
    out.walk(&mut |_, d| used.extend(d.args.iter().copied()));
    let mut keep: Vec<bool> = k
        .params
        .iter()
        .zip(&uses)
        .map(|(p, u)| matches!(p.kind, ParamKind::Ptr(d) if d.is_float()) && !(u.loaded && (u.stored || u.atomic)))
        .collect();
    let drop_sources = |keep: &mut Vec<bool>, v: Value| {
        for (j, &b) in src[v.index()].iter().enumerate() {
            keep[j] &= !b;
        }
    };
    // A pointer that may point into two tensors would need one dtype for both.
    for (v, s) in src.iter().enumerate() {
        if s.iter().filter(|&&b| b).count() > 1 {
            drop_sources(&mut keep, Value(v as u32));
        }
    }
    // An atomic that returns the old value (any but an `atomic_add` whose result is unused)
    // reads the tensor too.
    out.walk(&mut |_, d| match d.op {
        Op::AtomicRmw { .. } | Op::AtomicCas => drop_sources(&mut keep, d.args[0]),
        Op::AtomicAdd { .. } if used.contains(&d.results[0]) => drop_sources(&mut keep, d.args[0]),
        _ => {}
    });
    // The one tensor parameter each pointer value points into, where it has one.
    let from = |v: Value| -> Option<usize> {
        let s = src.get(v.index())?;
        let mut it = s.iter().enumerate().filter(|(_, &b)| b).map(|(j, _)| j);
        let j = it.next()?;
        it.next().is_none().then_some(j)
    };
    let dtypes: Vec<DType> = k
        .params
        .iter()
        .map(|p| match p.kind {
            ParamKind::Ptr(d) if d.is_float() => stored(&p.name, d),
            _ => to,
        })
        .collect();
    if let Some((p, d)) = k.params.iter().zip(&dtypes).find(|(_, d)| !d.is_float()) {
        return Err(refusal(k, format!("float tensor parameter `{}` cannot be kept as {d}", p.name)));
    }
    let dtype_of = |v: Value| from(v).filter(|&j| keep[j]).map(|j| dtypes[j]);
    // Pointer types first, then the conversions at each access, block by block.
    for v in 0..out.values.len() {
        if let Some(d) = dtype_of(Value(v as u32)) {
            out.values[v].ty.elem = Elem::Ptr(d);
        }
    }
    for (i, p) in out.params.iter_mut().enumerate() {
        if keep[i] {
            p.kind = ParamKind::Ptr(dtypes[i]);
        }
    }
    for b in 0..out.blocks.len() {
        let insts = std::mem::take(&mut out.blocks[b].insts);
        let mut new = Vec::with_capacity(insts.len());
        for i in insts {
            let d = out.insts[i.index()].clone();
            let kept = d.args.first().and_then(|&a| dtype_of(a));
            match (&d.op, kept) {
                (Op::Load { mask, other }, Some(dt)) => {
                    // load (its own dtype) -> cast -> [where(mask, ., other)]
                    let r = d.results[0];
                    let ty = out.values[r.index()].ty.clone();
                    let raw = out.new_value(ty.with_dtype(dt));
                    let inst = &mut out.insts[i.index()];
                    inst.results[0] = raw;
                    let cast_to = if *other { out.new_value(ty.clone()) } else { r };
                    if *other {
                        let inst = &mut out.insts[i.index()];
                        inst.op = Op::Load { mask: *mask, other: false };
                        inst.args.truncate(2);
                    }
                    new.push(i);
                    new.push(push_inst(&mut out, Op::Cast, &[raw], cast_to, &d.loc));
                    if *other {
                        new.push(push_inst(&mut out, Op::Where, &[d.args[1], cast_to, d.args[2]], r, &d.loc));
                    }
                }
                (Op::Store { .. } | Op::AtomicAdd { .. }, Some(dt)) => {
                    let v = d.args[1];
                    let ty = out.values[v.index()].ty.with_dtype(dt);
                    let narrow = out.new_value(ty);
                    new.push(push_inst(&mut out, Op::Cast, &[v], narrow, &d.loc));
                    out.insts[i.index()].args[1] = narrow;
                    if let Op::AtomicAdd { .. } = d.op {
                        // Its old value (unused, or the tensor would count as read) in the
                        // tensor's dtype.
                        let old = out.new_value(out.ty(d.results[0]).with_dtype(dt));
                        out.insts[i.index()].results[0] = old;
                    }
                    new.push(i);
                }
                _ => new.push(i),
            }
        }
        out.blocks[b].insts = new;
    }
    // Not canonicalized: the instructions added go at the end of the arena, so that the ids of
    // the promoted kernel's instructions (those of `k`, where `k` is canonical) stay valid.
    crate::verify::verify(&out)?;
    let names = out.params.iter().zip(&keep).filter(|(_, &kp)| kp).map(|(p, _)| p.name.clone()).collect();
    Ok((out, names))
}

/// The error of a promotion that cannot be done, located at the kernel.
fn refusal(k: &Kernel, message: String) -> IrError {
    IrError::Invalid {
        kernel: k.name.clone(),
        diagnostics: vec![Diagnostic { kernel: k.name.clone(), op: "promote_floats".into(), loc: k.loc.clone(), message }],
    }
}

/// Appends an instruction of one result to the arena (its block places it).
fn push_inst(k: &mut Kernel, op: Op, args: &[Value], result: Value, loc: &crate::kernel::Loc) -> Inst {
    k.insts.push(InstData { op, args: args.iter().copied().collect(), results: smallvec::smallvec![result], loc: loc.clone() });
    Inst(k.insts.len() as u32 - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Lit, Type};
    use crate::KernelBuilder;

    /// f16 and f32 loads, a tf32 dot, float constants, float<->float and float<->int casts.
    fn mixed() -> Kernel {
        let mut b = KernelBuilder::new("mixed");
        let a = b.ptr_param("a", DType::F16);
        let w = b.ptr_param("w", DType::F32);
        let o = b.ptr_param("o", DType::BF16);
        let idx = b.ptr_param("idx", DType::I32);
        let s = b.scalar_param("s", DType::F32);
        let _n = b.scalar_param("n", DType::I32);
        let r = b.arange(0, 16);
        let r0 = b.expand_dims(r, 1);
        let r1 = b.expand_dims(r, 0);
        let c16 = b.i32(16);
        let rows = b.mul(r0, c16);
        let offs = b.add(rows, r1);
        let pa = b.add(a, offs);
        let xa = b.load(pa, None, None);
        let pw = b.add(w, offs);
        let xw = b.load(pw, None, None);
        let xa32 = b.cast(xa, DType::F32);
        let d = b.dot(xa32, xw, None);
        let tenth = b.f32(0.1);
        let d = b.mul(d, tenth);
        let d = b.mul(d, s);
        let pi = b.add(idx, offs);
        let iv = b.load(pi, None, None);
        let ivf = b.cast(iv, DType::F32);
        let d = b.add(d, ivf);
        let di = b.cast(d, DType::I32);
        b.store(pi, di, None);
        let h = b.cast(d, DType::BF16);
        let po = b.add(o, offs);
        b.store(po, h, None);
        b.finish().unwrap()
    }

    #[test]
    fn promotes_every_float() {
        let k = mixed();
        let p = promote_floats(&k, DType::F64).unwrap();
        assert_eq!(p.values.len(), k.values.len());
        // Values: floats become f64, everything else is unchanged.
        for (old, new) in k.values.iter().zip(&p.values) {
            let expect = match old.ty.elem {
                Elem::Num(d) if d.is_float() => Elem::Num(DType::F64),
                Elem::Ptr(d) if d.is_float() => Elem::Ptr(DType::F64),
                e => e,
            };
            assert_eq!(new.ty.elem, expect);
            assert_eq!(new.ty.shape, old.ty.shape);
        }
        let kinds: Vec<_> = p.params.iter().map(|p| p.kind.clone()).collect();
        assert_eq!(
            kinds,
            vec![
                ParamKind::Ptr(DType::F64),
                ParamKind::Ptr(DType::F64),
                ParamKind::Ptr(DType::F64),
                ParamKind::Ptr(DType::I32),
                ParamKind::Scalar(DType::F64),
                ParamKind::Scalar(DType::I32),
            ]
        );
        let mut dots = 0;
        let mut consts = Vec::new();
        let mut casts = Vec::new();
        p.walk(&mut |_, d| match &d.op {
            Op::Dot { precision } => {
                dots += 1;
                assert_eq!(*precision, DotPrecision::Ieee);
            }
            Op::Const { value } => consts.push((*value, p.ty(d.results[0]).clone())),
            Op::Cast => casts.push((p.ty(d.args[0]).dtype().unwrap(), p.ty(d.results[0]).dtype().unwrap())),
            _ => {}
        });
        assert_eq!(dots, 1);
        // The f32 literal 0.1 keeps its (f32-rounded, as the builder wrote it) value, now as f64.
        assert!(consts.contains(&(Lit::Float(0.1f32 as f64), Type::scalar(DType::F64))));
        assert!(consts.contains(&(Lit::Int(16), Type::scalar(DType::I32))));
        use DType::*;
        assert_eq!(casts, vec![(F64, F64), (I32, F64), (F64, I32), (F64, F64)]);
        // The original is untouched and had a tf32 dot.
        let mut orig_prec = None;
        k.walk(&mut |_, d| {
            if let Op::Dot { precision } = d.op {
                orig_prec = Some(precision);
            }
        });
        assert_eq!(orig_prec, Some(DotPrecision::Tf32));
        // Printing and parsing the promoted kernel round-trips.
        assert_eq!(crate::text::parse_kernel(&p.to_string(), "p.tgir").unwrap(), p);
    }

    #[test]
    fn promotion_is_idempotent_and_keeps_constexprs() {
        let mut k = mixed();
        k.params.push(crate::Param {
            name: "alpha".into(),
            kind: ParamKind::Constexpr(DType::F16, Lit::Float(0.3)),
            value: crate::Value(k.values.len() as u32),
        });
        k.values.push(crate::ValueData { ty: Type::scalar(DType::F16) });
        k.canonicalize();
        crate::verify(&k).unwrap();
        let p = promote_floats(&k, DType::F64).unwrap();
        assert_eq!(p.param("alpha").unwrap().kind, ParamKind::Constexpr(DType::F64, Lit::Float(0.3)));
        assert_eq!(*p.ty(p.param("alpha").unwrap().value), Type::scalar(DType::F64));
        assert_eq!(promote_floats(&p, DType::F64).unwrap(), p);
        // Promoting to f32 is allowed too (f64 values are narrowed in type).
        let p32 = promote_floats(&k, DType::F32).unwrap();
        assert!(p32.values.iter().all(|v| v.ty.elem.num().is_none_or(|d| !d.is_float() || d == DType::F32)));
    }

    #[test]
    fn keeps_tensors_only_read_or_only_written() {
        let mut b = KernelBuilder::new("keep");
        let a = b.ptr_param("a", DType::F16); // read, masked with `other`
        let io = b.ptr_param("io", DType::F32); // read and written
        let o = b.ptr_param("o", DType::BF16); // written
        let acc = b.ptr_param("acc", DType::F32); // atomic_add only
        let (p, q) = (b.ptr_param("p", DType::F32), b.ptr_param("q", DType::F32)); // mixed by a `where`
        let idx = b.ptr_param("idx", DType::I32);
        let r = b.arange(0, 16);
        let n = b.i32(10);
        let m = b.lt(r, n);
        let pa = b.add(a, r);
        let half = b.full(&[16], 0.5, DType::F16);
        let xa = b.load(pa, Some(m), Some(half));
        let xa = b.cast(xa, DType::F32);
        let pio = b.add(io, r);
        let xio = b.load(pio, None, None);
        let v = b.add(xa, xio);
        b.store(pio, v, None);
        let po = b.add(o, r);
        let vo = b.cast(v, DType::BF16);
        b.store(po, vo, Some(m));
        let pacc = b.add(acc, r);
        b.atomic_add(pacc, v, None);
        let (pp, pq) = (b.add(p, r), b.add(q, r));
        let sel = b.where_(m, pp, pq);
        let xs = b.load(sel, None, None);
        let pi = b.add(idx, r);
        let iv = b.load(pi, None, None);
        let ivf = b.cast(iv, DType::F32);
        let w = b.add(xs, ivf);
        b.store(pp, w, None);
        let k = b.finish().unwrap();
        let (kp, kept) = promote_floats_keeping_tensors(&k, DType::F64).unwrap();
        assert_eq!(kept, vec!["a", "o", "acc"]);
        let kinds: Vec<_> = kp.params.iter().map(|p| p.kind.clone()).collect();
        use ParamKind::Ptr;
        assert_eq!(
            kinds,
            vec![Ptr(DType::F16), Ptr(DType::F64), Ptr(DType::BF16), Ptr(DType::F32), Ptr(DType::F64), Ptr(DType::F64), Ptr(DType::I32)]
        );
        // Every float value computed is f64; loads through kept tensors give their dtype, cast
        // at once; the `other` of the masked load is applied by a `where` in f64.
        let mut seen = Vec::new();
        kp.walk(&mut |_, d| {
            let ty = |v: Value| kp.ty(v).clone();
            match &d.op {
                Op::Load { mask, other } => seen.push(format!("load {mask} {other} {}", ty(d.results[0]).elem)),
                Op::Store { .. } | Op::AtomicAdd { .. } => seen.push(format!("{} {}", d.op.mnemonic(), ty(d.args[1]).elem)),
                Op::Cast => seen.push(format!("cast {} {}", ty(d.args[0]).elem, ty(d.results[0]).elem)),
                Op::Where if !ty(d.results[0]).is_ptr() => seen.push(format!("where {}", ty(d.results[0]).elem)),
                _ => {}
            }
        });
        let want = [
            "load true false f16",
            "cast f16 f64",
            "where f64",
            "cast f64 f64", // a, then its cast to f32 promoted
            "load false false f64",
            "store f64", // io: promoted
            "cast f64 f64",
            "cast f64 bf16",
            "store bf16", // o: the kernel's cast, then the pass's
            "cast f64 f32",
            "atomic_add f32", // acc
            "load false false f64",
            "load false false i32",
            "cast i32 f64",
            "store f64", // p and q: promoted
        ];
        assert_eq!(seen, want);
        // Instructions of the promoted kernel keep their ids; the pass's come after them.
        let promoted = promote_floats(&k, DType::F64).unwrap();
        for (i, d) in promoted.insts.iter().enumerate() {
            assert_eq!(std::mem::discriminant(&kp.insts[i].op), std::mem::discriminant(&d.op), "inst {i}");
        }
    }

    #[test]
    fn refuses_integer_target_and_invalid_kernels() {
        let k = mixed();
        let e = promote_floats(&k, DType::I32).unwrap_err();
        assert!(e.to_string().contains("not i32"), "{e}");
        let mut bad = k.clone();
        bad.values[0].ty = Type::scalar(DType::F32);
        assert!(promote_floats(&bad, DType::F64).is_err());
    }
}
