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

    pub(crate) fn walk_block(&self, b: Block, f: &mut impl FnMut(Inst, &InstData)) {
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
        let mut r = Renumber {
            k: self,
            vmap: vec![u32::MAX; self.values.len()],
            values: Vec::with_capacity(self.values.len()),
            insts: Vec::with_capacity(self.insts.len()),
            blocks: Vec::with_capacity(self.blocks.len()),
        };
        let params: Vec<Value> = self.params.iter().map(|p| r.def(p.value)).collect();
        let body = r.block(self.body);
        let Renumber { values, insts, blocks, .. } = r;
        for (p, v) in self.params.iter_mut().zip(params) {
            p.value = v;
        }
        self.values = values;
        self.insts = insts;
        self.blocks = blocks;
        self.body = body;
    }
}

/// State of [`Kernel::canonicalize`]: the new arenas and the old-to-new value map.
struct Renumber<'k> {
    k: &'k Kernel,
    vmap: Vec<u32>,
    values: Vec<ValueData>,
    insts: Vec<InstData>,
    blocks: Vec<BlockData>,
}

impl Renumber<'_> {
    /// Assigns the next id to a value at its definition.
    fn def(&mut self, v: Value) -> Value {
        if let Some(slot) = self.vmap.get_mut(v.index()) {
            if *slot == u32::MAX {
                *slot = self.values.len() as u32;
                self.values.push(self.k.values[v.index()].clone());
            }
            Value(*slot)
        } else {
            // Out of the arena: left for the verifier to report.
            v
        }
    }

    /// Maps a use. Operands are defined before their uses in a well-formed kernel; others map
    /// to an id past the arena, which the verifier reports.
    fn use_(&self, v: Value) -> Value {
        Value(self.vmap.get(v.index()).copied().unwrap_or(u32::MAX))
    }

    fn block(&mut self, b: Block) -> Block {
        let id = self.blocks.len();
        self.blocks.push(BlockData::default());
        let old = &self.k.blocks[b.index()];
        let params = old.params.iter().map(|&v| self.def(v)).collect();
        let mut insts = Vec::with_capacity(old.insts.len());
        for &i in &old.insts {
            let d = &self.k.insts[i.index()];
            let args = d.args.iter().map(|&v| self.use_(v)).collect();
            let results = d.results.iter().map(|&v| self.def(v)).collect();
            let iid = self.insts.len();
            // Reserve the instruction's id before its blocks' contents (pre-order).
            self.insts.push(InstData { op: Op::Yield, args, results, loc: d.loc.clone() });
            let op = match &d.op {
                Op::For { body, max_iters } => Op::For { body: self.block(*body), max_iters: *max_iters },
                Op::While { cond, body, max_iters } => {
                    let c = self.block(*cond);
                    let b = self.block(*body);
                    Op::While { cond: c, body: b, max_iters: *max_iters }
                }
                Op::If { then_block, else_block } => {
                    let t = self.block(*then_block);
                    let e = self.block(*else_block);
                    Op::If { then_block: t, else_block: e }
                }
                other => other.clone(),
            };
            self.insts[iid].op = op;
            insts.push(Inst(iid as u32));
        }
        self.blocks[id] = BlockData { params, insts };
        Block(id as u32)
    }
}
