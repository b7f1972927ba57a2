//! The CPU reference interpreter of tile-kernel launches: the executable specification of tilegrad
//! (the embedded default backend, like Triton's `TRITON_INTERPRET=1`).
//!
//! A [`Launch`] runs every program instance of its grid (in parallel, with results identical for
//! any thread count) with the launch semantics of tilegrad's design: a load sees the launch's
//! initial memory overlaid with the program's own earlier stores; masked-off lanes yield `other`;
//! an unmasked out-of-bounds lane is an error naming kernel, op, source location, program id, lane
//! and offset; cross-program write/write and write/read conflicts are races, found from the access
//! sets; `atomic_add` contributions are summed in a deterministic order.
#![warn(missing_docs)]

mod error;
mod exec;
mod launch;
mod tensor;

pub use error::{ExecError, Race, RaceKind, Site};
pub use exec::{
    dot_f32, endless_while_message, long_for_message, needs_order, release_buffers, round_tf32, sum_in_order, tune_allocator,
    working_threads, NonFinite, ProgramRecord, Recorded, EXP2_POLY, SUM_LANES, WHILE_LIMIT,
};
pub use launch::{written_tensors, Arg, Grid, Launch, LaunchSummary, Memory, Options, RaceMode, TensorId, Writers, POISON_ALL};
pub use tensor::{
    available_memory, check_alloc, checked_numel, human_bytes, round_bf16, round_f16, round_to, storage_bytes, Data, HostTensor,
};
