//! Kernels: parameters plus a body of structured blocks, with values, instructions and blocks held
//! in arenas and named by `u32` ids (as cranelift does), so that analyses attach side tables.
//!
//! Values are in SSA form. A value defined in a block is visible in the rest of that block and in
//! the blocks nested in it; a loop body's parameters are its induction variable and carried values.

use crate::op::Op;
use crate::types::{DType, Lit, Type};
use smallvec::SmallVec;
use std::fmt;
use std::sync::Arc;

macro_rules! entity {
    ($(#[$m:meta])* $name:ident, $prefix:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u32);
        impl $name {
            /// The id as an index into its arena.
            pub fn index(self) -> usize { self.0 as usize }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

entity!(
    /// An SSA value.
    Value,
    "%"
);
entity!(
    /// An instruction.
    Inst,
    "inst"
);
entity!(
    /// A block (kernel body, loop body or branch).
    Block,
    "block"
);

/// Where an op came from in the user's source: a builder call site, a text-IR line, or a Python
/// line:column. Lines and columns count from 1; `line == 0` means unknown.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Loc {
    /// Source file (Rust file of the builder call, `.tgir` file, or `.py` file).
    pub file: Arc<str>,
    /// Line, from 1.
    pub line: u32,
    /// Column, from 1.
    pub col: u32,
}

impl Loc {
    /// A location.
    pub fn new(file: impl Into<Arc<str>>, line: u32, col: u32) -> Loc {
        Loc { file: file.into(), line, col }
    }

    /// The location of the caller of a `#[track_caller]` function.
    #[track_caller]
    pub fn caller() -> Loc {
        let l = std::panic::Location::caller();
        Loc { file: Arc::from(l.file()), line: l.line(), col: l.column() }
    }

    /// True when nothing is known.
    pub fn is_unknown(&self) -> bool {
        self.line == 0
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_unknown() {
            f.write_str("<unknown>")
        } else {
            write!(f, "{}:{}:{}", self.file, self.line, self.col)
        }
    }
}

/// What a kernel parameter is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// A pointer to a tensor with elements of this dtype.
    Ptr(DType),
    /// A runtime scalar.
    Scalar(DType),
    /// A compile-time constant, bound when the kernel was built.
    Constexpr(DType, Lit),
}

/// A kernel parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    /// Name, as launches refer to it.
    pub name: String,
    /// Kind and dtype.
    pub kind: ParamKind,
    /// The SSA value the body uses for it.
    pub value: Value,
}

/// Facts about one value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueData {
    /// Its type.
    pub ty: Type,
}

/// One instruction: an op applied to operands, defining results.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstData {
    /// The operation.
    pub op: Op,
    /// Operands.
    pub args: SmallVec<[Value; 4]>,
    /// Results.
    pub results: SmallVec<[Value; 2]>,
    /// Source location.
    pub loc: Loc,
}

/// A straight-line sequence of instructions with parameters.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct BlockData {
    /// Block parameters (a loop body's induction variable and carried values).
    pub params: Vec<Value>,
    /// Instructions, in order.
    pub insts: Vec<Inst>,
}

/// A tile kernel: what one program instance of a launch executes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    /// Kernel name.
    pub name: String,
    /// Parameters, in declaration order.
    pub params: Vec<Param>,
    /// Value arena.
    pub values: Vec<ValueData>,
    /// Instruction arena.
    pub insts: Vec<InstData>,
    /// Block arena.
    pub blocks: Vec<BlockData>,
    /// The kernel body.
    pub body: Block,
    /// Where the kernel was defined.
    pub loc: Loc,
}

impl Kernel {
    /// An empty kernel with an empty body.
    pub fn new(name: impl Into<String>, loc: Loc) -> Kernel {
        Kernel {
            name: name.into(),
            params: Vec::new(),
            values: Vec::new(),
            insts: Vec::new(),
            blocks: vec![BlockData::default()],
            body: Block(0),
            loc,
        }
    }

    /// Type of a value.
    pub fn ty(&self, v: Value) -> &Type {
        &self.values[v.index()].ty
    }

    /// An instruction.
    pub fn inst(&self, i: Inst) -> &InstData {
        &self.insts[i.index()]
    }

    /// A block.
    pub fn block(&self, b: Block) -> &BlockData {
        &self.blocks[b.index()]
    }

    /// A parameter by name.
    pub fn param(&self, name: &str) -> Option<&Param> {
        self.params.iter().find(|p| p.name == name)
    }

    /// Allocates a new value of type `ty`.
    pub fn new_value(&mut self, ty: Type) -> Value {
        self.values.push(ValueData { ty });
        Value(self.values.len() as u32 - 1)
    }

    /// Allocates a new empty block.
    pub fn new_block(&mut self) -> Block {
        self.blocks.push(BlockData::default());
        Block(self.blocks.len() as u32 - 1)
    }

    /// Calls `f` on every instruction in program (pre-)order: an op before the ops of its blocks.
    pub fn walk(&self, f: &mut impl FnMut(Inst, &InstData)) {
        self.walk_block(self.body, f);
    }

    fn walk_block(&self, b: Block, f: &mut impl FnMut(Inst, &InstData)) {
        for &i in &self.block(b).insts {
            let d = self.inst(i);
            f(i, d);
            for nb in d.op.blocks() {
                self.walk_block(nb, f);
            }
        }
    }

    /// Renumbers values, instructions and blocks in program order (parameters first, then each
    /// instruction's results before its blocks' parameters and contents), dropping anything
    /// unreachable. Two kernels that print the same are equal after this, which makes
    /// `parse(print(k)) == k` a meaningful check.
    pub fn canonicalize(&mut self) {
        let mut vmap = vec![u32::MAX; self.values.len()];
        let mut new_values = Vec::with_capacity(self.values.len());
        let mut new_insts = Vec::with_capacity(self.insts.len());
        let mut new_blocks = Vec::with_capacity(self.blocks.len());
        let mut map_v = |v: Value, vmap: &mut Vec<u32>, nv: &mut Vec<ValueData>| -> Value {
            if vmap[v.index()] == u32::MAX {
                vmap[v.index()] = nv.len() as u32;
                nv.push(self.values[v.index()].clone());
            }
            Value(vmap[v.index()])
        };
        for p in &mut self.params {
            p.value = map_v(p.value, &mut vmap, &mut new_values);
        }
        // Iterative pre-order walk that reserves block ids before filling them.
        fn visit(
            k: &Kernel,
            b: Block,
            vmap: &mut Vec<u32>,
            nv: &mut Vec<ValueData>,
            ni: &mut Vec<InstData>,
            nb: &mut Vec<BlockData>,
            map_v: &mut dyn FnMut(Value, &mut Vec<u32>, &mut Vec<ValueData>) -> Value,
        ) -> Block {
            let id = nb.len();
            nb.push(BlockData::default());
            let params = k.block(b).params.iter().map(|&v| map_v(v, vmap, nv)).collect();
            let mut insts = Vec::new();
            for &i in &k.block(b).insts {
                let d = k.inst(i);
                let args = d.args.iter().map(|&v| Value(vmap.get(v.index()).copied().unwrap_or(u32::MAX))).collect();
                let results = d.results.iter().map(|&v| map_v(v, vmap, nv)).collect();
                let iid = ni.len();
                ni.push(InstData { op: Op::Yield, args, results, loc: d.loc.clone() });
                let op = match &d.op {
                    Op::For { body, max_iters } => Op::For { body: visit(k, *body, vmap, nv, ni, nb, map_v), max_iters: *max_iters },
                    Op::If { then_block, else_block } => {
                        let t = visit(k, *then_block, vmap, nv, ni, nb, map_v);
                        let e = visit(k, *else_block, vmap, nv, ni, nb, map_v);
                        Op::If { then_block: t, else_block: e }
                    }
                    other => other.clone(),
                };
                ni[iid].op = op;
                insts.push(Inst(iid as u32));
            }
            nb[id] = BlockData { params, insts };
            Block(id as u32)
        }
        // Operands are mapped when their instruction is visited; in a well-formed kernel every
        // operand is defined earlier, so the mapping exists. Malformed uses map to u32::MAX,
        // which the verifier reports.
        let body = visit(self, self.body, &mut vmap, &mut new_values, &mut new_insts, &mut new_blocks, &mut map_v);
        self.values = new_values;
        self.insts = new_insts;
        self.blocks = new_blocks;
        self.body = body;
    }
}
