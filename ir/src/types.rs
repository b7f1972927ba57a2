//! Element dtypes, value types and literals: the static facts every op is checked against.
//!
//! A value is a scalar or a tile with a static shape (`shape.is_empty()` means scalar). Its element
//! is a number of some [`DType`] or a pointer into a tensor of some `DType`.

use smallvec::SmallVec;
use std::fmt;

/// A static tile shape; empty for scalars.
pub type Shape = SmallVec<[usize; 4]>;

/// The largest rank a tile may have.
pub const MAX_RANK: usize = 4;

/// The most elements a tile may have: Triton's `TRITON_MAX_TENSOR_NUMEL` (2^20), so a kernel
/// Triton would refuse is refused here too, before an interpreter allocates it.
pub const MAX_NUMEL: usize = 1 << 20;

/// Element data types, as Triton names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// Boolean (`tl.int1`).
    I1,
    /// 32-bit signed integer, wrapping.
    I32,
    /// 64-bit signed integer, wrapping.
    I64,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
}

impl DType {
    /// All dtypes, in promotion order within each kind.
    pub const ALL: [DType; 7] = [DType::I1, DType::I32, DType::I64, DType::F16, DType::BF16, DType::F32, DType::F64];

    /// The name used by the text format (`f32`, `i1`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::I1 => "i1",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// Parses a dtype name; accepts the text-format names and `bool`.
    pub fn from_name(s: &str) -> Option<DType> {
        Some(match s {
            "i1" | "bool" | "int1" => DType::I1,
            "i32" | "int32" => DType::I32,
            "i64" | "int64" => DType::I64,
            "f16" | "float16" | "fp16" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "f32" | "float32" | "fp32" => DType::F32,
            "f64" | "float64" | "fp64" => DType::F64,
            _ => return None,
        })
    }

    /// True for the floating-point dtypes.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// True for i32 and i64 (not i1).
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    /// True for i1.
    pub fn is_bool(self) -> bool {
        self == DType::I1
    }

    /// Size of one element in bytes (i1 is stored as one byte).
    pub fn size_bytes(self) -> usize {
        match self {
            DType::I1 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// The dtype two operands of a binary op are promoted to (Triton's rules, without the
    /// Python-literal special cases, which front ends apply before calling this).
    pub fn promote(a: DType, b: DType) -> DType {
        use DType::*;
        if a == b {
            return a;
        }
        match (a.is_float(), b.is_float()) {
            (true, true) => match (a, b) {
                (F64, _) | (_, F64) => F64,
                (F32, _) | (_, F32) => F32,
                // f16 with bf16: Triton promotes to f32.
                _ => F32,
            },
            (true, false) => a,
            (false, true) => b,
            (false, false) => {
                if a == I64 || b == I64 {
                    I64
                } else if a == I32 || b == I32 {
                    I32
                } else {
                    I1
                }
            }
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The element of a value: a number, or a pointer into a tensor of numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    /// A number of this dtype.
    Num(DType),
    /// A pointer to elements of this dtype.
    Ptr(DType),
}

impl Elem {
    /// The numeric dtype, if this is a number.
    pub fn num(self) -> Option<DType> {
        match self {
            Elem::Num(d) => Some(d),
            Elem::Ptr(_) => None,
        }
    }
}

impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Elem::Num(d) => write!(f, "{d}"),
            Elem::Ptr(d) => write!(f, "ptr<{d}>"),
        }
    }
}

/// The static type of a value: element and shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Type {
    /// Element type.
    pub elem: Elem,
    /// Tile shape; empty for a scalar.
    pub shape: Shape,
}

impl Type {
    /// A scalar number.
    pub fn scalar(d: DType) -> Type {
        Type { elem: Elem::Num(d), shape: Shape::new() }
    }

    /// A tile of numbers.
    pub fn tile(d: DType, shape: &[usize]) -> Type {
        Type { elem: Elem::Num(d), shape: Shape::from_slice(shape) }
    }

    /// A pointer (scalar or tile).
    pub fn ptr(d: DType, shape: &[usize]) -> Type {
        Type { elem: Elem::Ptr(d), shape: Shape::from_slice(shape) }
    }

    /// Same element, other shape.
    pub fn with_shape(&self, shape: &[usize]) -> Type {
        Type { elem: self.elem, shape: Shape::from_slice(shape) }
    }

    /// Same shape, numeric element of dtype `d`.
    pub fn with_dtype(&self, d: DType) -> Type {
        Type { elem: Elem::Num(d), shape: self.shape.clone() }
    }

    /// The numeric dtype, if the element is a number.
    pub fn dtype(&self) -> Option<DType> {
        self.elem.num()
    }

    /// True when the element is a pointer.
    pub fn is_ptr(&self) -> bool {
        matches!(self.elem, Elem::Ptr(_))
    }

    /// True for rank 0.
    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }

    /// Number of elements (1 for scalars); `usize::MAX` when the count overflows, never a
    /// wrapped-around small number (the verifier refuses such types).
    pub fn numel(&self) -> usize {
        self.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).unwrap_or(usize::MAX)
    }

    /// Rank of the tile.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.elem)?;
        if !self.shape.is_empty() {
            f.write_str("[")?;
            for (i, d) in self.shape.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{d}")?;
            }
            f.write_str("]")?;
        }
        Ok(())
    }
}

/// A literal scalar constant. Floats compare by bit pattern so that NaN constants round-trip.
#[derive(Clone, Copy, Debug)]
pub enum Lit {
    /// Boolean.
    Bool(bool),
    /// Integer (any integer dtype).
    Int(i64),
    /// Float (any float dtype; rounded to it when used).
    Float(f64),
}

impl PartialEq for Lit {
    fn eq(&self, other: &Lit) -> bool {
        match (self, other) {
            (Lit::Bool(a), Lit::Bool(b)) => a == b,
            (Lit::Int(a), Lit::Int(b)) => a == b,
            (Lit::Float(a), Lit::Float(b)) => a.to_bits() == b.to_bits(),
            _ => false,
        }
    }
}

impl Eq for Lit {}

impl Lit {
    /// The literal converted to f64.
    pub fn as_f64(self) -> f64 {
        match self {
            Lit::Bool(b) => b as i64 as f64,
            Lit::Int(i) => i as f64,
            Lit::Float(x) => x,
        }
    }

    /// The literal converted to i64 (floats truncate).
    pub fn as_i64(self) -> i64 {
        match self {
            Lit::Bool(b) => b as i64,
            Lit::Int(i) => i,
            Lit::Float(x) => x as i64,
        }
    }

    /// True when the literal fits dtype `d` exactly as written (bools in i1, ints in integer or
    /// float dtypes, floats in float dtypes).
    pub fn fits(self, d: DType) -> bool {
        match self {
            Lit::Bool(_) => d == DType::I1,
            Lit::Int(i) => match d {
                DType::I1 => i == 0 || i == 1,
                DType::I32 => i32::try_from(i).is_ok(),
                _ => true,
            },
            Lit::Float(_) => d.is_float(),
        }
    }
}

impl fmt::Display for Lit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Lit::Bool(b) => write!(f, "{b}"),
            Lit::Int(i) => write!(f, "{i}"),
            Lit::Float(x) => {
                if x.is_nan() {
                    f.write_str("nan")
                } else if x.is_infinite() {
                    f.write_str(if x > 0.0 { "inf" } else { "-inf" })
                } else {
                    // `{:?}` prints the shortest string that reads back to the same f64, and
                    // always with a '.' or an exponent, so it cannot be mistaken for an integer.
                    write!(f, "{x:?}")
                }
            }
        }
    }
}

impl From<bool> for Lit {
    fn from(b: bool) -> Lit {
        Lit::Bool(b)
    }
}
impl From<i32> for Lit {
    fn from(i: i32) -> Lit {
        Lit::Int(i as i64)
    }
}
impl From<i64> for Lit {
    fn from(i: i64) -> Lit {
        Lit::Int(i)
    }
}
impl From<f32> for Lit {
    fn from(x: f32) -> Lit {
        Lit::Float(x as f64)
    }
}
impl From<f64> for Lit {
    fn from(x: f64) -> Lit {
        Lit::Float(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion_follows_triton() {
        use DType::*;
        assert_eq!(DType::promote(I32, F32), F32);
        assert_eq!(DType::promote(I64, I32), I64);
        assert_eq!(DType::promote(F16, BF16), F32);
        assert_eq!(DType::promote(F16, F64), F64);
        assert_eq!(DType::promote(I1, I32), I32);
        assert_eq!(DType::promote(F16, I64), F16);
    }

    #[test]
    fn type_display() {
        assert_eq!(Type::tile(DType::F32, &[16, 128]).to_string(), "f32[16, 128]");
        assert_eq!(Type::ptr(DType::F16, &[]).to_string(), "ptr<f16>");
        assert_eq!(Lit::Float(1.0).to_string(), "1.0");
        assert_eq!(Lit::Float(-1e-30).to_string(), "-1e-30");
    }
}
