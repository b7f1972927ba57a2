//! Conversion tests of Triton's random numbers: the ops a call lowers to (Philox's rounds, with
//! constant seeds folded), text round-trips, and errors at the argument's line:column. Their
//! values are tested against plain Philox in `tilegrad-reference`'s `tests/random.rs`.

use super::{convert, ConvertOptions};
use crate::{BinaryOp, DType, IrError, Kernel, Op};

const HEAD: &str = "import triton\nimport triton.language as tl\n\n@triton.jit\n";

/// A kernel `k(out_ptr, seed, n)` whose body (after `offs = tl.arange(0, 16)`) is `body`.
fn kernel(body: &str, seed: DType) -> Result<Kernel, IrError> {
    let src = format!("{HEAD}def k(out_ptr, seed, n):\n    offs = tl.arange(0, 16)\n{body}");
    let opts = ConvertOptions { scalar_dtypes: vec![("seed".into(), seed)], ..ConvertOptions::default() };
    convert(&src, "k.py", "k", &opts)
}

fn count(k: &Kernel, f: impl Fn(&Op) -> bool) -> usize {
    let mut n = 0;
    k.walk(&mut |_, d| n += f(&d.op) as usize);
    n
}

fn umulhis(k: &Kernel) -> usize {
    count(k, |o| *o == Op::Binary(BinaryOp::UMulHi))
}

/// The line:column and message of a conversion error.
fn err(body: &str, seed: DType) -> (u32, u32, String) {
    match kernel(body, seed) {
        Err(IrError::Parse { error, .. }) => (error.line, error.col, error.message),
        other => panic!("expected a parse error, got {other:?}"),
    }
}

#[test]
fn philox_rounds_lower_to_umulhi_with_constants_folded() {
    // Round one multiplies the zero third word (folded); the nine others two tiles each.
    let k = kernel("    tl.store(out_ptr + offs, tl.rand(seed, offs))\n", DType::I32).unwrap();
    assert_eq!(umulhis(&k), 19);
    let k = kernel("    tl.store(out_ptr + offs, tl.rand(seed, offs, n_rounds=3))\n", DType::I32).unwrap();
    assert_eq!(umulhis(&k), 5);
    // A constant seed folds the key schedule: no integer adds on keys remain.
    let k = kernel("    tl.store(out_ptr + offs, tl.randint(12345, offs))\n", DType::I32).unwrap();
    assert_eq!(count(&k, |o| *o == Op::Binary(BinaryOp::Add)), 0);
    let k = kernel("    tl.store(out_ptr + offs, tl.randint(seed, offs))\n", DType::I64).unwrap();
    assert_eq!(count(&k, |o| *o == Op::Binary(BinaryOp::Add)), 18);
    // randn: cos of the first pair only; randn4x: cos and sin of both pairs.
    let k = kernel("    tl.store(out_ptr + offs, tl.randn(seed, offs))\n", DType::I32).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::Unary(crate::UnaryOp::Cos | crate::UnaryOp::Sin))), 1);
    let body = "    a, b, c, d = tl.randn4x(seed, offs)\n    tl.store(out_ptr + offs, a + b + c + d)\n";
    let k = kernel(body, DType::I32).unwrap();
    assert_eq!(count(&k, |o| matches!(o, Op::Unary(crate::UnaryOp::Cos | crate::UnaryOp::Sin))), 4);
}

#[test]
fn random_kernels_round_trip_through_the_text_format() {
    for body in [
        "    tl.store(out_ptr + offs, tl.rand(seed, offs.to(tl.int64) * 3))\n",
        "    a, b, c, d = tl.randint4x(seed, offs)\n    tl.store(out_ptr + offs, (a ^ b ^ c ^ d).to(tl.float32))\n",
        "    x, y = tl.pair_uniform_to_normal(tl.rand(7, offs), tl.rand(8, offs))\n    tl.store(out_ptr + offs, x * y)\n",
        "    tl.store(out_ptr + offs, tl.umulhi(offs, seed).to(tl.float32))\n",
    ] {
        let k = kernel(body, DType::I64).unwrap();
        let text = k.to_string();
        let parsed = crate::text::parse_kernel(&text, "x").unwrap();
        assert_eq!(parsed.to_string(), text);
        assert!(text.contains("umulhi"), "{text}");
    }
}

#[test]
fn results_have_triton_shapes_and_dtypes() {
    let body = "    a, b, c, d = tl.philox(seed, offs, 0, 0, 0)\n    u = tl.uint_to_uniform_float(a)\n    tl.store(out_ptr + offs, u + b + c + d)\n";
    let k = kernel(body, DType::I32).unwrap();
    let stored: Vec<String> = {
        let mut v = Vec::new();
        k.walk(&mut |_, d| {
            if let Op::Store { .. } = d.op {
                v.push(k.ty(d.args[1]).to_string());
            }
        });
        v
    };
    assert_eq!(stored, ["f32[16]"]);
    // Scalars in, scalars out: philox_impl on scalar words.
    let body = "    a, b, c, d = tl.philox_impl(1, 2, 3, 4, seed, seed)\n    tl.store(out_ptr, a.to(tl.float32))\n";
    assert!(kernel(body, DType::I32).is_ok());
}

#[test]
fn bad_arguments_are_errors_at_their_location() {
    let (l, c, m) = err("    x = tl.rand(1.5, offs)\n", DType::I32);
    assert_eq!((l, c), (7, 17), "{m}");
    assert!(m.contains("seed of `tl.rand` must be an integer"), "{m}");
    let (l, c, m) = err("    x = tl.rand(seed, offs.to(tl.float32))\n", DType::I32);
    assert_eq!((l, c), (7, 23), "{m}");
    assert!(m.contains("offset of `tl.rand` must be an integer"), "{m}");
    let (l, c, m) = err("    x = tl.randint(seed, offs, n_rounds=-1)\n", DType::I32);
    assert_eq!((l, c), (7, 32), "{m}");
    assert!(m.contains("`n_rounds` must be between 0 and 1024, found -1"), "{m}");
    let (_, _, m) = err("    x = tl.randint(seed, offs, n_rounds=n)\n", DType::I32);
    assert!(m.contains("`n_rounds` must be a constant int"), "{m}");
    let (l, c, m) = err("    x = tl.philox(seed, offs.to(tl.int64), 0, 0, 0)\n", DType::I32);
    assert_eq!((l, c), (7, 25), "{m}");
    assert!(m.contains("64-bit counters is not supported"), "{m}");
    let (_, _, m) = err("    x = tl.randn(seed)\n", DType::I32);
    assert!(m.contains("`tl.randn` needs the offset"), "{m}");
    let (_, _, m) = err("    x = tl.umulhi(offs, 2.0)\n", DType::I32);
    assert!(m.contains("`tl.umulhi` needs integer operands"), "{m}");
    let (_, _, m) = err("    x = tl.uint_to_uniform_float(offs.to(tl.float16))\n", DType::I32);
    assert!(m.contains("must be an integer"), "{m}");
    let (_, _, m) = err("    x = tl.philox(seed, 1 << 40, 0, 0, 0)\n", DType::I32);
    assert!(m.contains("does not fit"), "{m}");
}
