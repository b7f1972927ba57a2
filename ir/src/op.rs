//! The op vocabulary of the tile IR: one enum, matched exhaustively by every pass and backend.
//!
//! Ops are *canonical*: operands of elementwise ops already have equal shapes and dtypes (front ends
//! insert `broadcast`, `expand_dims` and `cast`), a store's value already has the pointee dtype, and
//! a load's `other` already has the loaded type. Backends trust this; the verifier checks it.
//!
//! Adding an op: add the variant here (with its mnemonic in [`Op::mnemonic`]), then follow the
//! compile errors: verifier (`verify.rs`), printer and parser (`text/`), builder method
//! (`builder.rs`), reference interpreter (`tilegrad-reference`), and every later backend.

use crate::kernel::Block;
use crate::types::Lit;
use smallvec::SmallVec;

macro_rules! named_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $var:ident => $s:literal,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vm])* $var,)* }
        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$var,)*];
            /// The text-format mnemonic.
            pub fn name(self) -> &'static str { match self { $($name::$var => $s,)* } }
            /// The variant with this mnemonic.
            pub fn from_name(s: &str) -> Option<$name> {
                match s { $($s => Some($name::$var),)* _ => None }
            }
        }
    };
}

named_enum! {
    /// Elementwise unary ops.
    UnaryOp {
        /// `-x` (wrapping for integers).
        Neg => "neg",
        /// `|x|`.
        Abs => "abs",
        /// Logical not for i1, bitwise not for integers.
        Not => "not",
        /// e^x.
        Exp => "exp",
        /// 2^x.
        Exp2 => "exp2",
        /// Natural logarithm.
        Log => "log",
        /// Base-2 logarithm.
        Log2 => "log2",
        /// Square root.
        Sqrt => "sqrt",
        /// 1/sqrt(x).
        Rsqrt => "rsqrt",
        /// Sine.
        Sin => "sin",
        /// Cosine.
        Cos => "cos",
        /// Hyperbolic tangent.
        Tanh => "tanh",
        /// 1/(1+e^-x).
        Sigmoid => "sigmoid",
        /// Error function.
        Erf => "erf",
        /// Round toward -inf.
        Floor => "floor",
        /// Round toward +inf.
        Ceil => "ceil",
    }
}

impl UnaryOp {
    /// True for ops defined only on floats.
    pub fn float_only(self) -> bool {
        !matches!(self, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Not)
    }
}

named_enum! {
    /// Elementwise binary ops on two operands of one type.
    BinaryOp {
        /// a + b (wrapping for integers).
        Add => "add",
        /// a - b.
        Sub => "sub",
        /// a * b.
        Mul => "mul",
        /// True division (floats only).
        Div => "div",
        /// Integer division truncating toward zero, as C and Triton (integers only).
        FloorDiv => "floordiv",
        /// Remainder with the sign of the dividend (C `%`, `fmod` for floats).
        Mod => "mod",
        /// Elementwise minimum (for floats IEEE 754-2019 `minimumNumber`: a NaN operand yields
        /// the other one, and -0 < +0).
        Min => "min",
        /// Elementwise maximum (for floats `maximumNumber`, as `min`).
        Max => "max",
        /// a^b (floats only).
        Pow => "pow",
        /// Logical/bitwise and (i1 and integers).
        And => "and",
        /// Logical/bitwise or.
        Or => "or",
        /// Logical/bitwise xor.
        Xor => "xor",
        /// The high half of the full product of the operands read as unsigned integers
        /// (`tl.umulhi`; CUDA's `__umulhi`/`__umul64hi`): integers only.
        UMulHi => "umulhi",
    }
}

impl BinaryOp {
    /// True for ops defined only on floats.
    pub fn float_only(self) -> bool {
        matches!(self, BinaryOp::Div | BinaryOp::Pow)
    }
    /// True for ops defined only on integers.
    pub fn int_only(self) -> bool {
        matches!(self, BinaryOp::FloorDiv | BinaryOp::UMulHi)
    }
    /// True for ops defined only on i1 and integers.
    pub fn bits_only(self) -> bool {
        matches!(self, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor)
    }
}

named_enum! {
    /// Comparisons; the result is i1.
    CmpOp {
        /// ==
        Eq => "eq",
        /// !=
        Ne => "ne",
        /// <
        Lt => "lt",
        /// <=
        Le => "le",
        /// >
        Gt => "gt",
        /// >=
        Ge => "ge",
    }
}

named_enum! {
    /// Reductions along one axis.
    ReduceOp {
        /// Sum.
        Sum => "sum",
        /// Maximum (by the elementwise `max`'s rule, in order).
        Max => "max",
        /// Minimum (by the elementwise `min`'s rule, in order).
        Min => "min",
        /// Index (i32) of the maximum; ties go to the lowest index.
        Argmax => "argmax",
        /// Index (i32) of the minimum; ties go to the lowest index.
        Argmin => "argmin",
    }
}

named_enum! {
    /// Atomic read-modify-write ops other than add (see [`Op::AtomicRmw`]).
    AtomicOp {
        /// `max(old, value)`.
        Max => "atomic_max",
        /// `min(old, value)`.
        Min => "atomic_min",
        /// `old & value` (integers).
        And => "atomic_and",
        /// `old | value` (integers).
        Or => "atomic_or",
        /// `old ^ value` (integers).
        Xor => "atomic_xor",
        /// `value` (exchange).
        Xchg => "atomic_xchg",
    }
}

named_enum! {
    /// How `dot` treats f32 operands.
    DotPrecision {
        /// Exact f32 products.
        Ieee => "ieee",
        /// Operands rounded to tf32 (10-bit mantissa), Triton's default for f32 on GPUs.
        Tf32 => "tf32",
    }
}

/// One IR operation. Operands are listed separately in the instruction (see
/// [`crate::InstData`]); the variant holds the static attributes. The arity and operand roles of
/// each variant are documented on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `program_id(axis)`: () -> i32.
    ProgramId {
        /// Grid axis 0..3.
        axis: u8,
    },
    /// `num_programs(axis)`: () -> i32.
    NumPrograms {
        /// Grid axis 0..3.
        axis: u8,
    },
    /// A scalar constant of the result's dtype: () -> scalar.
    Const {
        /// The value.
        value: Lit,
    },
    /// `arange(start, end)`: () -> i32[end - start].
    Arange {
        /// First value.
        start: i64,
        /// One past the last value.
        end: i64,
    },
    /// Broadcast a scalar, or a tile whose shape has 1s where the result is larger, to the
    /// result shape: (x) -> tile.
    Broadcast,
    /// Insert a dimension of size 1 at `axis`: (x) -> tile.
    ExpandDims {
        /// Position of the new dimension in the result.
        axis: u8,
    },
    /// Reinterpret the elements (row-major) with the result shape: (x) -> tile.
    Reshape,
    /// Permute dimensions: result dim i is operand dim `perm[i]`: (x) -> tile.
    Permute {
        /// The permutation.
        perm: SmallVec<[u8; 4]>,
    },
    /// Elementwise unary: (x) -> same type.
    Unary(UnaryOp),
    /// Elementwise binary: (a, b) -> same type.
    Binary(BinaryOp),
    /// Elementwise comparison: (a, b) -> i1 of the same shape.
    Cmp(CmpOp),
    /// `where(cond, a, b)`: (i1, T, T) -> T.
    Where,
    /// Convert to the result dtype: (x) -> same shape.
    Cast,
    /// Reduce along `axis`: (x) -> tile without (or with size 1 at) `axis`.
    Reduce {
        /// Which reduction.
        kind: ReduceOp,
        /// Reduced axis.
        axis: u8,
        /// Keep the reduced axis with size 1.
        keep_dims: bool,
    },
    /// Inclusive prefix sum along `axis`: (x) -> same type.
    Cumsum {
        /// Scanned axis.
        axis: u8,
        /// Scan from the end.
        reverse: bool,
    },
    /// `dot(a, b, acc)`: (`[M,K]`, `[K,N]`, `[M,N]`) -> `[M,N]` in acc's dtype.
    Dot {
        /// Treatment of f32 operands.
        precision: DotPrecision,
    },
    /// Pointer arithmetic: (ptr, int offsets) -> ptr; offsets are in elements.
    AddPtr,
    /// Read memory: (ptr, `[mask]`, `[other]`) -> pointee tile. Masked-off lanes yield `other`, or
    /// 0 when absent.
    Load {
        /// A mask operand follows the pointer.
        mask: bool,
        /// An `other` operand follows (requires `mask`).
        other: bool,
    },
    /// Write memory: (ptr, value, `[mask]`) -> ().
    Store {
        /// A mask operand follows the value.
        mask: bool,
    },
    /// Atomically add to memory: (ptr, value, `[mask]`) -> `[old]`. The optional result is the
    /// element's value before the addition (masked-off lanes read 0); it depends on the order of
    /// programs, which the reference fixes as program order (see `tilegrad-reference`).
    AtomicAdd {
        /// A mask operand follows the value.
        mask: bool,
    },
    /// Atomic read-modify-write: (ptr, value, `[mask]`) -> `[old]`, like [`Op::AtomicAdd`] with
    /// another combination of the element and the value.
    AtomicRmw {
        /// The combination.
        kind: AtomicOp,
        /// A mask operand follows the value.
        mask: bool,
    },
    /// Atomic compare-and-swap: (ptr, cmp, value) -> old. Each lane whose element equals `cmp`
    /// gets `value`; every lane returns the element's previous value.
    AtomicCas,
    /// Structured counted loop: (lo, hi, step, init...) -> carried... . The body block's
    /// parameters are the induction variable then the carried values; it ends in `yield`.
    For {
        /// The loop body.
        body: Block,
        /// Upper bound on the trip count (required for AD of dynamic loops; inferred when absent).
        max_iters: Option<u32>,
    },
    /// `while` loop: (init...) -> carried... . Each iteration runs `cond` on the carried values
    /// (its parameters); it ends in `yield %c` with an i1 scalar. When true, `body` runs on the
    /// same carried values (its parameters) and yields the next ones; when false, the loop
    /// returns them.
    While {
        /// Computes the condition.
        cond: Block,
        /// The loop body.
        body: Block,
        /// Upper bound on the number of body runs (inferred from a run when absent).
        max_iters: Option<u32>,
    },
    /// `if cond {then} else {else}`: (i1 scalar) -> results. Both blocks end in `yield`.
    If {
        /// Taken when the condition is true.
        then_block: Block,
        /// Taken otherwise.
        else_block: Block,
    },
    /// Ends a loop body or an `if` branch, passing its operands on: (values...) -> ().
    Yield,
}

impl Op {
    /// The text-format mnemonic of this op.
    pub fn mnemonic(&self) -> &'static str {
        match self {
            Op::ProgramId { .. } => "program_id",
            Op::NumPrograms { .. } => "num_programs",
            Op::Const { .. } => "const",
            Op::Arange { .. } => "arange",
            Op::Broadcast => "broadcast",
            Op::ExpandDims { .. } => "expand_dims",
            Op::Reshape => "reshape",
            Op::Permute { .. } => "permute",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Cmp(_) => "cmp",
            Op::Where => "where",
            Op::Cast => "cast",
            Op::Reduce { .. } => "reduce",
            Op::Cumsum { .. } => "cumsum",
            Op::Dot { .. } => "dot",
            Op::AddPtr => "addptr",
            Op::Load { .. } => "load",
            Op::Store { .. } => "store",
            Op::AtomicAdd { .. } => "atomic_add",
            Op::AtomicRmw { kind, .. } => kind.name(),
            Op::AtomicCas => "atomic_cas",
            Op::For { .. } => "for",
            Op::While { .. } => "while",
            Op::If { .. } => "if",
            Op::Yield => "yield",
        }
    }

    /// The blocks nested in this op, in order.
    pub fn blocks(&self) -> SmallVec<[Block; 2]> {
        match self {
            Op::For { body, .. } => smallvec::smallvec![*body],
            Op::While { cond, body, .. } => smallvec::smallvec![*cond, *body],
            Op::If { then_block, else_block } => smallvec::smallvec![*then_block, *else_block],
            _ => SmallVec::new(),
        }
    }

    /// True for ops that write memory.
    pub fn writes_memory(&self) -> bool {
        matches!(self, Op::Store { .. } | Op::AtomicAdd { .. } | Op::AtomicRmw { .. } | Op::AtomicCas)
    }

    /// True for the atomic ops (their old value depends on the order of programs).
    pub fn is_atomic(&self) -> bool {
        matches!(self, Op::AtomicAdd { .. } | Op::AtomicRmw { .. } | Op::AtomicCas)
    }
}
