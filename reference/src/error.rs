//! The error type of the reference interpreter. Every error that happens while a program runs
//! names the kernel, the op with its source location and the program id.

use tilegrad_ir::Loc;

/// Where in a launch something happened: kernel, op, source location, program id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    /// Kernel name.
    pub kernel: String,
    /// Op mnemonic.
    pub op: &'static str,
    /// Source location of the op.
    pub loc: Loc,
    /// Program id (p0, p1, p2).
    pub pid: [u32; 3],
}

impl std::fmt::Display for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: kernel `{}`, op `{}`, program ({}, {}, {})", self.loc, self.kernel, self.op, self.pid[0], self.pid[1], self.pid[2])
    }
}

/// How two accesses conflict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RaceKind {
    /// Two programs store to one element.
    WriteWrite,
    /// One program loads an element that another program stores or atomically updates.
    ReadWrite,
    /// One program stores an element that another program atomically updates.
    StoreAtomic,
    /// The active lanes of one store write one element twice (the winner is undefined on a GPU).
    DuplicateLanes,
}

impl Race {
    /// A race on the element at flat `offset` of a tensor of `shape` (row-major).
    pub fn at(kind: RaceKind, tensor: &str, shape: &[usize], offset: i64, first: Site, second: Site) -> Race {
        let mut index = vec![0; shape.len()];
        let mut rest = offset.max(0) as usize;
        for (i, &d) in shape.iter().enumerate().rev() {
            index[i] = rest % d.max(1);
            rest /= d.max(1);
        }
        Race { kind, tensor: tensor.to_string(), offset, index, first, second }
    }
}

/// A data race found from the access sets of a launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Race {
    /// What kind of conflict.
    pub kind: RaceKind,
    /// Tensor (launch argument) name.
    pub tensor: String,
    /// Flat element offset.
    pub offset: i64,
    /// The element's multi-index in the tensor's shape.
    pub index: Vec<usize>,
    /// The first access.
    pub first: Site,
    /// The conflicting access.
    pub second: Site,
}

impl std::fmt::Display for Race {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.kind {
            RaceKind::WriteWrite => "two programs store to",
            RaceKind::ReadWrite => "one program loads what another program writes to",
            RaceKind::StoreAtomic => "one program stores while another atomically updates",
            RaceKind::DuplicateLanes => "two lanes of one store write",
        };
        let at = self.index.iter().map(usize::to_string).collect::<Vec<_>>().join(", ");
        write!(f, "race: {what} `{}`[{at}]\n  first:  {}\n  second: {}", self.tensor, self.first, self.second)
    }
}

/// The lane of an access in words: `scalar` for a scalar access, else its index in the tile.
fn lane_words(lane: &[usize]) -> String {
    if lane.is_empty() {
        "scalar".into()
    } else {
        format!("lane {lane:?}")
    }
}

/// Errors of the reference interpreter.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum ExecError {
    /// The kernel does not verify.
    #[error(transparent)]
    Invalid(#[from] tilegrad_ir::IrError),
    /// A tensor's data does not match its dtype or shape.
    #[error("bad tensor: {message}")]
    BadTensor {
        /// What is wrong.
        message: String,
    },
    /// A launch argument is missing, unknown, or of the wrong kind or dtype.
    #[error("kernel `{kernel}`, argument `{param}`: {message}")]
    Argument {
        /// Kernel name.
        kernel: String,
        /// Parameter name.
        param: String,
        /// What is wrong.
        message: String,
    },
    /// The grid is empty or too large.
    #[error("kernel `{kernel}`: bad grid {grid:?}: {message}")]
    Grid {
        /// Kernel name.
        kernel: String,
        /// The grid.
        grid: [u32; 3],
        /// What is wrong.
        message: String,
    },
    /// An unmasked lane accessed memory outside its tensor.
    #[error("{site}: out-of-bounds access to `{tensor}` (numel {numel}) at offset {offset}, {}", lane_words(lane))]
    OutOfBounds {
        /// Where.
        site: Box<Site>,
        /// Tensor name.
        tensor: String,
        /// Offending flat offset.
        offset: i64,
        /// Number of elements of the tensor.
        numel: usize,
        /// Multi-index of the lane within the tile.
        lane: Vec<usize>,
    },
    /// A data race (see [`Race`]).
    #[error("{0}")]
    Race(Box<Race>),
    /// A loop ran more iterations than its `max_iters`.
    #[error("{site}: loop ran {trips} iterations, more than its max_iters = {max_iters}")]
    LoopBound {
        /// Where (the `for` op).
        site: Box<Site>,
        /// Trip count this program needed.
        trips: u64,
        /// The bound.
        max_iters: u32,
    },
    /// Something is undefined at run time (integer division by zero, a zero loop step, a pointer
    /// select between two tensors, ...).
    #[error("{site}: {message}")]
    Runtime {
        /// Where.
        site: Box<Site>,
        /// What.
        message: String,
    },
}
