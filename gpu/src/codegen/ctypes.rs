//! C types of dtypes, literals and conversions as CUDA C expressions, and index arithmetic of
//! broadcasts and permutes.

use super::*;

/// The C type that holds values of a dtype in registers (f16/bf16 as rounded f32, as the
/// reference holds them).
pub(super) fn ctype(d: DType) -> &'static str {
    match d {
        DType::I1 => "bool",
        DType::I32 => "int",
        DType::I64 => "i64",
        DType::F16 | DType::BF16 | DType::F32 => "float",
        DType::F64 => "double",
    }
}

/// Bytes of [`ctype`]: what a value takes in registers and in scratch (f16/bf16 as f32).
pub(super) fn reg_bytes(d: DType) -> usize {
    match d {
        DType::I1 => 1,
        DType::I32 | DType::F16 | DType::BF16 | DType::F32 => 4,
        DType::I64 | DType::F64 => 8,
    }
}

/// The C type of a dtype in memory.
pub(super) fn storage(d: DType) -> &'static str {
    match d {
        DType::I1 => "u8",
        DType::I32 => "int",
        DType::I64 => "i64",
        DType::F16 | DType::BF16 => "u16",
        DType::F32 => "float",
        DType::F64 => "double",
    }
}

/// Reads storage `x` of dtype `d` as a register value.
pub(super) fn from_storage(d: DType, x: &str) -> String {
    match d {
        DType::I1 => format!("({x} != 0)"),
        DType::F16 => format!("tg_h2f({x})"),
        DType::BF16 => format!("tg_bf2f({x})"),
        _ => x.to_string(),
    }
}

/// Converts register value `x` of dtype `d` to its storage.
pub(super) fn to_storage(d: DType, x: &str) -> String {
    match d {
        DType::I1 => format!("(u8)({x})"),
        DType::F16 => format!("tg_f2h({x})"),
        DType::BF16 => format!("tg_f2bf({x})"),
        _ => x.to_string(),
    }
}

/// Rounds an f32 expression to dtype `d` when it is f16 or bf16.
pub(super) fn narrow(d: DType, x: &str) -> String {
    match d {
        DType::F16 => format!("tg_f16((double)({x}))"),
        DType::BF16 => format!("tg_bf16((double)({x}))"),
        _ => x.to_string(),
    }
}

/// An exact C literal of a value of dtype `d` (as the reference's `lit_data` converts it).
pub(super) fn literal(l: Lit, d: DType) -> String {
    match d {
        DType::I1 => (if l.as_i64() != 0 { "true" } else { "false" }).to_string(),
        DType::I32 => format!("((int){})", l.as_i64() as i32),
        DType::I64 => format!("((i64){}LL)", l.as_i64()),
        DType::F16 => format!("__int_as_float({:#x})", half::f16::from_f64(l.as_f64()).to_f32().to_bits()),
        DType::BF16 => format!("__int_as_float({:#x})", half::bf16::from_f64(l.as_f64()).to_f32().to_bits()),
        DType::F32 => format!("__int_as_float({:#x})", (l.as_f64() as f32).to_bits()),
        DType::F64 => format!("__longlong_as_double({:#x}LL)", l.as_f64().to_bits() as i64),
    }
}

/// A conversion of `x` from dtype `from` to `to`, as the reference's `cast_data`.
pub(super) fn convert(from: DType, to: DType, x: &str) -> String {
    use DType::*;
    if from == to {
        return x.to_string();
    }
    let as_double = match from {
        I1 => format!("(double)(int)({x})"),
        _ => format!("(double)({x})"),
    };
    match to {
        I1 => match from {
            F16 | BF16 | F32 => format!("(({x}) != 0.0f)"),
            F64 => format!("(({x}) != 0.0)"),
            _ => format!("(({x}) != 0)"),
        },
        I32 => match from {
            I1 => format!("(int)({x})"),
            I64 => format!("(int)(u32)(u64)({x})"),
            _ => format!("tg_d2i32((double)({x}))"),
        },
        I64 => match from {
            I1 | I32 => format!("(i64)({x})"),
            _ => format!("tg_d2i64((double)({x}))"),
        },
        F32 => match from {
            I1 => format!("(float)(int)({x})"),
            I64 => format!("(float)({x})"),
            F16 | BF16 => x.to_string(),
            _ => format!("(float)({as_double})"),
        },
        F16 => format!("tg_f16({as_double})"),
        BF16 => format!("tg_bf16({as_double})"),
        F64 => as_double,
    }
}

pub(super) fn cmp_op(c: CmpOp) -> &'static str {
    match c {
        CmpOp::Eq => "==",
        CmpOp::Ne => "!=",
        CmpOp::Lt => "<",
        CmpOp::Le => "<=",
        CmpOp::Gt => ">",
        CmpOp::Ge => ">=",
    }
}

/// The flat index into `from` (a shape broadcast to `to`, same rank) of the element at flat
/// index `idx` of `to`, as a C expression.
pub(super) fn broadcast_source(to: &[usize], from: &[usize], idx: &str) -> String {
    let (ts, fs) = (strides(to), strides(from));
    let mut terms = Vec::new();
    for dim in 0..to.len() {
        if from[dim] != 1 && to[dim] != 1 {
            terms.push(format!("((({idx}) / {}) % {}) * {}", ts[dim], to[dim], fs[dim]));
        }
    }
    if terms.is_empty() {
        "0".into()
    } else {
        format!("({})", terms.join(" + "))
    }
}

/// The flat index into `from` of element `idx` of `to = permute(from, perm)`, as a C expression.
pub(super) fn permute_source(to: &[usize], from: &[usize], perm: &[u8], idx: &str) -> String {
    let (ts, fs) = (strides(to), strides(from));
    let mut terms = Vec::new();
    for dim in 0..to.len() {
        if to[dim] != 1 {
            terms.push(format!("((({idx}) / {}) % {}) * {}", ts[dim], to[dim], fs[perm[dim] as usize]));
        }
    }
    if terms.is_empty() {
        "0".into()
    } else {
        format!("({})", terms.join(" + "))
    }
}

/// Row-major strides of a shape.
pub(super) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}
