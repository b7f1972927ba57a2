//! What a Python expression evaluates to during conversion: an IR value, a compile-time Python
//! constant (Triton's constexprs and literals), a dtype, a block pointer, a tensor descriptor, a
//! tuple, or a name
//! (module or helper function). Also Triton's literal rules (a literal takes the dtype of the
//! tensor it meets) and the flattening of values carried through loops and `if`s.

use super::errors::{fail, R};
use crate::{BlockPtr, DType, KernelBuilder, Value};

/// A converted Python value.
#[derive(Clone, Debug)]
pub(crate) enum Val {
    /// An IR value (scalar or tile, number or pointer).
    Tensor(Value),
    /// A Python int (a literal, a constexpr, or arithmetic on them).
    Int(i64),
    /// A Python float.
    Float(f64),
    /// A Python bool.
    Bool(bool),
    /// A Python string (docstrings, `padding_option=`).
    Str(String),
    /// `None`.
    None,
    /// A dtype such as `tl.float32`.
    DType(DType),
    /// A Triton dtype the IR does not compute in (`tl.float8e5`, `tl.int8`): a value that
    /// constexpr comparisons can fold, by its Triton name.
    OtherDType(String),
    /// The type of a pointer (`ptr.dtype` or `ptr.type`); `.element_ty` is the pointee dtype.
    PtrType(DType),
    /// A tuple or list.
    Tuple(Vec<Val>),
    /// A block pointer (`tl.make_block_ptr`).
    BlockPtr(BlockPtr),
    /// A tensor descriptor (`tl.make_tensor_descriptor`).
    TensorDesc(TensorDesc),
    /// A module or a name inside one, fully qualified (`triton.language.math`).
    Module(String),
    /// A function of a source file (index into the converted files: the kernel's own is 0), by name.
    Func(usize, String),
    /// A Python module read from a file beside the kernel (`from . import utils`), by index.
    SourceModule(usize),
}

impl Val {
    /// A short description for error messages.
    pub(crate) fn kind(&self) -> String {
        match self {
            Val::Tensor(_) => "a tensor".into(),
            Val::Int(i) => format!("the int {i}"),
            Val::Float(f) => format!("the float {f}"),
            Val::Bool(b) => format!("the bool {b}"),
            Val::Str(_) => "a string".into(),
            Val::None => "None".into(),
            Val::DType(d) => format!("the dtype {d}"),
            Val::OtherDType(d) => format!("the dtype tl.{d}"),
            Val::PtrType(d) => format!("the pointer type ptr<{d}>"),
            Val::Tuple(_) => "a tuple".into(),
            Val::BlockPtr(_) => "a block pointer".into(),
            Val::TensorDesc(_) => "a tensor descriptor".into(),
            Val::Module(m) => format!("`{m}`"),
            Val::Func(_, f) => format!("the function `{f}`"),
            Val::SourceModule(_) => "a module".into(),
        }
    }

    /// True for Python constants (int, float, bool).
    pub(crate) fn is_const(&self) -> bool {
        matches!(self, Val::Int(_) | Val::Float(_) | Val::Bool(_))
    }
}

/// A tensor descriptor (`tl.make_tensor_descriptor(base, shape, strides, block_shape)`): a strided
/// N-d view of the tensor at `base` read and written a block at a time. Its parts are fixed IR
/// values (defined where it is created, so it may be used inside later loops and `if`s); each
/// `desc.load(offsets)`/`desc.store(offsets, value)` lowers to a block pointer at those offsets
/// with every dimension boundary-checked. Offsets are given at each access, so a descriptor is
/// carried through a loop or a tensor `if` only when it is reassigned there (its base, shape and
/// strides; the block shape must stay the same).
#[derive(Clone, Debug)]
pub(crate) struct TensorDesc {
    /// Base pointer (scalar).
    pub base: Value,
    /// Logical shape of the view (integer scalars).
    pub shape: Vec<Value>,
    /// Strides in elements (integer scalars).
    pub strides: Vec<Value>,
    /// The block every access reads or writes.
    pub block_shape: Vec<usize>,
}

/// The IR value of `v`, materialising a Python constant with its default dtype (int: i32, or i64
/// when it does not fit; float: f32; bool: i1).
pub(crate) fn tensor(b: &mut KernelBuilder, v: &Val, off: u32, what: &str) -> R<Value> {
    match v {
        Val::Tensor(t) => Ok(*t),
        Val::Int(i) => Ok(b.constant(*i, int_dtype(*i))),
        Val::Float(f) => Ok(b.constant(*f, DType::F32)),
        Val::Bool(x) => Ok(b.constant(*x, DType::I1)),
        other => fail(off, format!("{what} must be a tensor or a number, found {}", other.kind())),
    }
}

/// The dtype a Python int literal gets on its own.
pub(crate) fn int_dtype(i: i64) -> DType {
    if i32::try_from(i).is_ok() {
        DType::I32
    } else {
        DType::I64
    }
}

/// The IR value of the literal `v` where it meets the tensor `other` (Triton's rules: an int
/// literal takes an integer or float tensor's dtype, a float literal a float tensor's dtype, f32
/// otherwise).
pub(crate) fn literal_like(b: &mut KernelBuilder, v: &Val, other: Value, off: u32, what: &str) -> R<Value> {
    let od = b.ty(other).dtype();
    match (v, od) {
        (Val::Int(i), Some(d)) if d.is_float() => Ok(b.constant(*i, d)),
        (Val::Int(i), Some(d)) if d.is_int() && (d == DType::I64 || i32::try_from(*i).is_ok()) => Ok(b.constant(*i, d)),
        (Val::Float(f), Some(d)) if d.is_float() => Ok(b.constant(*f, d)),
        _ => tensor(b, v, off, what),
    }
}

/// Python-level arithmetic on two constants (constexpr folding); `None` when the operator does not
/// apply. Errors on overflow and division by zero.
pub(crate) fn fold_binary(op: &str, a: &Val, c: &Val, off: u32) -> R<Option<Val>> {
    let as_int = |v: &Val| match v {
        Val::Int(i) => Some(*i),
        Val::Bool(b) => Some(*b as i64),
        _ => None,
    };
    let as_f = |v: &Val| match v {
        Val::Int(i) => Some(*i as f64),
        Val::Bool(b) => Some(*b as i64 as f64),
        Val::Float(f) => Some(*f),
        _ => None,
    };
    if let (Some(x), Some(y)) = (as_int(a), as_int(c)) {
        let overflow = || fail(off, format!("integer overflow in constant expression `{x} {op} {y}`"));
        let zero = || fail(off, format!("division by zero in constant expression `{x} {op} {y}`"));
        let r = match op {
            "+" => x.checked_add(y),
            "-" => x.checked_sub(y),
            "*" => x.checked_mul(y),
            "//" => {
                if y == 0 {
                    return zero();
                }
                x.checked_div_euclid(y).map(|q| if y < 0 && x.rem_euclid(y) != 0 { q + 1 } else { q })
            }
            "%" => {
                if y == 0 {
                    return zero();
                }
                x.checked_rem(y).map(|r| if r != 0 && ((r < 0) != (y < 0)) { r + y } else { r })
            }
            "<<" => u32::try_from(y).ok().and_then(|s| x.checked_shl(s)).filter(|v| v >> y.clamp(0, 63) == x),
            ">>" => u32::try_from(y).ok().map(|s| x >> s.min(63)),
            "&" => Some(x & y),
            "|" => Some(x | y),
            "^" => Some(x ^ y),
            "**" => u32::try_from(y).ok().and_then(|e| x.checked_pow(e)),
            "/" => {
                if y == 0 {
                    return zero();
                }
                return Ok(Some(Val::Float(x as f64 / y as f64)));
            }
            _ => return fold_cmp(op, x as f64, y as f64),
        };
        return match r {
            Some(v) => Ok(Some(Val::Int(v))),
            None => overflow(),
        };
    }
    if let (Some(x), Some(y)) = (as_f(a), as_f(c)) {
        let r = match op {
            "+" => x + y,
            "-" => x - y,
            "*" => x * y,
            "/" => x / y,
            "//" => (x / y).floor(),
            "%" => x - y * (x / y).floor(),
            "**" => x.powf(y),
            _ => return fold_cmp(op, x, y),
        };
        return Ok(Some(Val::Float(r)));
    }
    Ok(None)
}

fn fold_cmp(op: &str, x: f64, y: f64) -> R<Option<Val>> {
    Ok(Some(Val::Bool(match op {
        "<" => x < y,
        "<=" => x <= y,
        ">" => x > y,
        ">=" => x >= y,
        "==" => x == y,
        "!=" => x != y,
        _ => return Ok(None),
    })))
}

/// Python truthiness of a constant.
pub(crate) fn truthy(v: &Val) -> Option<bool> {
    match v {
        Val::Int(i) => Some(*i != 0),
        Val::Float(f) => Some(*f != 0.0),
        Val::Bool(b) => Some(*b),
        Val::None => Some(false),
        Val::Str(s) => Some(!s.is_empty()),
        Val::DType(_) | Val::OtherDType(_) | Val::PtrType(_) => Some(true),
        _ => None,
    }
}

/// `==`/`!=` between compile-time values that are not numbers (strings, `None`, dtypes), as
/// Python folds them: `None` equals only `None`, a string only an equal string, a dtype only the
/// same dtype. `None` when neither side is such a value (numbers fold in [`fold_binary`]).
pub(crate) fn fold_eq(op: &str, a: &Val, c: &Val) -> Option<Val> {
    if op != "==" && op != "!=" {
        return None;
    }
    let special = |v: &Val| matches!(v, Val::Str(_) | Val::None | Val::DType(_) | Val::OtherDType(_) | Val::PtrType(_));
    if !special(a) && !special(c) {
        return None;
    }
    let same = match (a, c) {
        (Val::Str(x), Val::Str(y)) => x == y,
        (Val::None, Val::None) => true,
        (Val::DType(x), Val::DType(y)) => x == y,
        (Val::OtherDType(x), Val::OtherDType(y)) => x == y,
        (Val::PtrType(x), Val::PtrType(y)) => x == y,
        (Val::Tensor(_) | Val::BlockPtr(_) | Val::TensorDesc(_), _) | (_, Val::Tensor(_) | Val::BlockPtr(_) | Val::TensorDesc(_)) => {
            return None
        }
        _ => false,
    };
    Some(Val::Bool(same == (op == "==")))
}

/// The IR values a carried Python value consists of: a tensor itself, a constant materialised, a
/// block pointer's offsets, a tensor descriptor's base, shape and strides, a tuple's elements in
/// order. Other values cannot be carried.
pub(crate) fn flatten(b: &mut KernelBuilder, v: &Val, off: u32, name: &str, out: &mut Vec<Value>) -> R<()> {
    match v {
        Val::Tensor(_) | Val::Int(_) | Val::Float(_) | Val::Bool(_) => out.push(tensor(b, v, off, name)?),
        Val::BlockPtr(bp) => out.extend_from_slice(&bp.offsets),
        Val::TensorDesc(d) => desc_parts(d, out),
        Val::Tuple(vs) => {
            for x in vs {
                flatten(b, x, off, name, out)?;
            }
        }
        other => return fail(off, format!("`{name}` holds {} and cannot change inside a loop or an `if` on a tensor", other.kind())),
    }
    Ok(())
}

/// Whether `v` can be carried (see [`flatten`]).
pub(crate) fn carriable(v: &Val) -> bool {
    match v {
        Val::Tensor(_) | Val::Int(_) | Val::Float(_) | Val::Bool(_) | Val::BlockPtr(_) | Val::TensorDesc(_) => true,
        Val::Tuple(vs) => vs.iter().all(carriable),
        _ => false,
    }
}

/// Like [`flatten`], but shaped by `template` (the value before the loop): the yielded value must
/// have the same structure.
pub(crate) fn flatten_like(b: &mut KernelBuilder, template: &Val, v: &Val, off: u32, name: &str, out: &mut Vec<Value>) -> R<()> {
    match (template, v) {
        (Val::BlockPtr(t), Val::BlockPtr(x)) if t.offsets.len() == x.offsets.len() => {
            out.extend_from_slice(&x.offsets);
            Ok(())
        }
        (Val::TensorDesc(t), Val::TensorDesc(x)) if t.block_shape == x.block_shape => {
            desc_parts(x, out);
            Ok(())
        }
        (Val::Tuple(t), Val::Tuple(x)) if t.len() == x.len() => {
            for (tt, xx) in t.iter().zip(x) {
                flatten_like(b, tt, xx, off, name, out)?;
            }
            Ok(())
        }
        (Val::TensorDesc(t), Val::TensorDesc(x)) => fail(
            off,
            format!(
                "`{name}` changes from a tensor descriptor of block shape {:?} to one of block shape {:?} inside a loop or an `if`",
                t.block_shape, x.block_shape
            ),
        ),
        (Val::BlockPtr(_) | Val::TensorDesc(_) | Val::Tuple(_), _) | (_, Val::BlockPtr(_) | Val::TensorDesc(_) | Val::Tuple(_)) => {
            fail(off, format!("`{name}` changes from {} to {} inside a loop or an `if`", template.kind(), v.kind()))
        }
        _ => {
            out.push(tensor(b, v, off, name)?);
            Ok(())
        }
    }
}

/// Rebuilds a value of `template`'s structure from carried IR values (consumed from the front).
pub(crate) fn rebuild(template: &Val, vals: &mut impl Iterator<Item = Value>) -> Val {
    match template {
        Val::BlockPtr(bp) => {
            let offs: Vec<Value> = bp.offsets.iter().map(|&o| vals.next().unwrap_or(o)).collect();
            Val::BlockPtr(bp.with_offsets(&offs))
        }
        Val::TensorDesc(d) => {
            let mut next = |v: &Value| vals.next().unwrap_or(*v);
            let base = next(&d.base);
            let shape = d.shape.iter().map(&mut next).collect();
            let strides = d.strides.iter().map(&mut next).collect();
            Val::TensorDesc(TensorDesc { base, shape, strides, block_shape: d.block_shape.clone() })
        }
        Val::Tuple(vs) => Val::Tuple(vs.iter().map(|t| rebuild(t, vals)).collect()),
        other => match vals.next() {
            Some(v) => Val::Tensor(v),
            None => other.clone(),
        },
    }
}

/// The carried parts of a tensor descriptor: base, shape, strides.
fn desc_parts(d: &TensorDesc, out: &mut Vec<Value>) {
    out.push(d.base);
    out.extend_from_slice(&d.shape);
    out.extend_from_slice(&d.strides);
}
