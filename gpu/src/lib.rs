//! The GPU backend of tilegrad: tile-IR launches compiled to CUDA C (NVRTC) and run on an NVIDIA
//! GPU through cudarc, with the reference interpreter's semantics and diagnostics.
//!
//! The crate builds and its tests pass on machines without CUDA: cudarc loads the driver and
//! NVRTC at run time, and [`Gpu::new`] says why no GPU is usable before touching them.
//!
//! What runs where:
//! - a launch runs on the device, in place, one CUDA block per program at a time (see
//!   [`codegen`]); out-of-bounds lanes, loop bounds and runtime errors are found there and the
//!   first in program order is reported, as the reference reports it;
//! - races are found on the device from per-element marks (writer, readers, atomic updaters);
//!   a launch with any conflict, or with a case the device cannot settle exactly (two lanes of one
//!   store writing one element, a program reading back its own float atomics, a full atomic log),
//!   is run again by the reference interpreter, whose verdict is the answer: the same error at
//!   the same place;
//! - the writer of each element, for blame ([`tilegrad_reference::Options::record_writers`]), is
//!   read off the marks, with each element's storing instruction and its last atomic in program
//!   order;
//! - launches whose programs depend on each other's order (atomics whose old values are used,
//!   compare-and-swap, exchange) and launches that resolve races in program order (a racy
//!   backward's provisional table) run on the reference.
//!
//! [`Outcome::ran_on`] says which it was.
#![warn(missing_docs)]

pub mod codegen;
mod compile;
mod convert;
mod device;
pub mod draw;
mod in_place;
mod runs;
mod summary;

pub use compile::{wait_for_background_compiles, Compile};
pub use convert::Along;
pub use device::{compile_generated, compile_only, nvrtc_present, usable, Gpu};
pub use in_place::{device_bytes, Backup, DeviceBuffer, DeviceMemory, DeviceTensor};
pub use summary::{Spread, Tallied, TallyRule};

use tilegrad_ir::Loc;
use tilegrad_reference::{ExecError, LaunchSummary};

/// Errors of the GPU backend.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No GPU can be used here.
    #[error("no usable GPU: {0}")]
    Unavailable(String),
    /// The kernel has an op the GPU code generator cannot compile.
    #[error("{loc}: kernel `{kernel}`, op `{op}`: the GPU backend cannot compile it: {why}")]
    Unsupported {
        /// Kernel name.
        kernel: String,
        /// Op mnemonic.
        op: &'static str,
        /// Source location of the op.
        loc: Loc,
        /// Why.
        why: String,
    },
    /// NVRTC rejected the generated source (a bug of the code generator).
    #[error("NVRTC could not compile the CUDA C generated for kernel `{kernel}`: {log}")]
    Compile {
        /// Kernel name.
        kernel: String,
        /// NVRTC's log.
        log: String,
    },
    /// The CUDA driver failed.
    #[error("CUDA driver: {0}")]
    Driver(String),
    /// The launch failed as the reference would fail it (same error, same place).
    #[error(transparent)]
    Exec(#[from] ExecError),
}

/// Where a launch ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RanOn {
    /// On the GPU.
    Gpu,
    /// On the GPU, its float atomics added in the device's order rather than in program order
    /// (sums that differ from the reference's by rounding), and why.
    GpuDeviceOrder(String),
    /// On the reference interpreter, and why.
    Reference(String),
}

/// What a launch did, and where it ran.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The launch's summary (as the reference's).
    pub summary: LaunchSummary,
    /// Where it ran.
    pub ran_on: RanOn,
}

/// Options of GPU launches.
#[derive(Clone, Copy, Debug)]
pub struct GpuOptions {
    /// Find races on the device (per-element marks: 16 bytes per written element). Without it
    /// a racy launch gives whatever the hardware's order gave.
    pub races: bool,
    /// Float `atomic_add`s in program order, as the reference adds them (bit for bit); without
    /// it, in the hardware's order (sums equal up to rounding; see
    /// [`codegen::generate_ordered`]).
    pub ordered_atomics: bool,
    /// With `ordered_atomics`: program order whatever it costs. Without, a launch whose programs
    /// add too many floats atomically to take turns at adding them in order adds them in the
    /// device's order (and says so: [`RanOn::GpuDeviceOrder`]); with it, it takes the turns
    /// (or goes to the reference where the logs do not fit), so that the results stay the same
    /// bit for bit from run to run.
    pub exact_order: bool,
}

impl GpuOptions {
    /// The form of a kernel a launch with these options runs: with race marks where it finds
    /// races or records writers (for blame), without otherwise.
    pub fn flavor(&self, launch: &tilegrad_reference::Launch) -> codegen::Flavor {
        let marks = self.races || launch.get_options().record_writers;
        codegen::Flavor { ordered: self.ordered_atomics, marks, wide: false }.for_programs(launch.grid().programs())
    }
}

impl Default for GpuOptions {
    fn default() -> GpuOptions {
        GpuOptions { races: true, ordered_atomics: true, exact_order: false }
    }
}
