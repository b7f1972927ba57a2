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
use crate::kernel::{Kernel, ParamKind};
use crate::op::{DotPrecision, Op};
use crate::types::{DType, Elem};

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
        return Err(IrError::Invalid {
            kernel: k.name.clone(),
            diagnostics: vec![Diagnostic {
                kernel: k.name.clone(),
                op: "promote_floats".into(),
                loc: k.loc.clone(),
                message: format!("floats can only be promoted to a float dtype, not {to}"),
            }],
        });
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
    fn refuses_integer_target_and_invalid_kernels() {
        let k = mixed();
        let e = promote_floats(&k, DType::I32).unwrap_err();
        assert!(e.to_string().contains("not i32"), "{e}");
        let mut bad = k.clone();
        bad.values[0].ty = Type::scalar(DType::F32);
        assert!(promote_floats(&bad, DType::F64).is_err());
    }
}
