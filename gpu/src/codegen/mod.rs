//! Tile IR to CUDA C: one CUDA block runs one program instance at a time (blocks take programs
//! from a counter, in program order), and every tile is spread over the block's threads: element
//! `e` of a tile lives in thread `e % NT`, register `e / NT`. Scalars are held, identically, by
//! every thread. Ops that move elements between threads (broadcast, permute, reductions, scans,
//! `dot`) go through a scratch area (shared memory, or global memory when large), in two halves
//! that consecutive ops alternate between; values computed from `arange`s and scalars alone are
//! recomputed where a broadcast needs them instead.
//!
//! The numerics are the reference interpreter's, op by op: f16/bf16 results rounded after each
//! op, `dot` accumulated over k in order with separately rounded products, sums reduced in the
//! reference's order, wrapping integers. Errors (out-of-bounds lanes, loop bounds, runtime
//! errors) are found by each program and the first one in program order is reported, as the
//! reference does.
//!
//! The generator matches [`Op`] exhaustively: a new op does not compile until it has a rule here.

mod control;
mod ctypes;
mod entry;
mod hoist;
mod memory;
mod merge;
mod scratch_ops;
mod sink;

use crate::GpuError;
use ctypes::*;
use std::fmt::Write;
use tilegrad_ir::{BinaryOp, Block, CmpOp, DType, DotPrecision, Elem, Inst, Kernel, Lit, Op, ReduceOp, UnaryOp, Value};

/// Words of the argument block before the per-parameter words (see [`Layout`]).
pub(crate) const HEADER_WORDS: usize = 16;
/// Words per pointer parameter: base, numel, write marks, read marks, atomic marks, and for
/// blame the storing instruction and the last atomic's key of each element.
pub(crate) const PTR_WORDS: usize = 7;
/// Words of the argument block (a kernel parameter: at most 4 KiB).
pub(crate) const ARG_WORDS: usize = 512;
/// Words of one atomic-log entry: offset, parameter, value bits.
pub(crate) const LOG_WORDS: usize = 3;
/// Words of one block's error record: program, failure site (`Generated::sites`), unused, lane,
/// offset, aux.
pub(crate) const ERR_WORDS: usize = 6;

/// Error kinds in an error record.
pub(crate) const ERR_OOB: u64 = 1;
pub(crate) const ERR_LOOP: u64 = 2;
pub(crate) const ERR_RUNTIME: u64 = 3;

/// Fallback flags (the launch is settled by the reference instead).
pub(crate) const FLAG_CONFLICT: u32 = 1;
pub(crate) const FLAG_LOG_FULL: u32 = 2;
pub(crate) const FLAG_OWN_ATOMIC: u32 = 4;
pub(crate) const FLAG_DUPLICATE: u32 = 8;
pub(crate) const FLAG_WRITERS: u32 = 16;

/// A kernel compiled to CUDA C, with what the launcher needs to know about it.
#[derive(Clone, Debug)]
pub struct Generated {
    /// The CUDA C source (prelude included).
    pub source: String,
    /// Threads per block.
    pub threads: u32,
    /// Blocks an SM the compiler was asked to fit (`__launch_bounds__`).
    pub min_blocks: u32,
    /// Scratch bytes one block needs.
    pub scratch_bytes: usize,
    /// Where they are.
    pub scratch_in: ScratchIn,
    /// Loops by index in the trip counters: their instructions.
    pub loops: Vec<Inst>,
    /// Runtime error messages by id.
    pub messages: Vec<String>,
    /// Some `atomic_add` on floats: their contributions are applied in program order.
    pub float_atomics: bool,
    /// Its store marks stamp in 64 bits ([`Flavor::wide`]).
    pub wide: bool,
    /// The float atomics a program logs (the lanes of each) with each branch taken and each
    /// loop's body run once: with the programs, what adding them in program order costs at
    /// least, known before a run, where every loop runs. A loop of more trips logs more, which
    /// a run in program order finds.
    pub log_per_program: u64,
    /// The instruction and error kind of each failure site, by number from 1 (an error record
    /// names its site).
    pub sites: Vec<(Inst, u64)>,
}

impl Generated {
    /// The dynamic shared memory a launch of it asks for: its scratch, where that is in
    /// dynamic shared memory ([`ScratchIn::DynamicShared`]), else none.
    pub fn dynamic_shared_bytes(&self) -> usize {
        if self.scratch_in == ScratchIn::DynamicShared {
            self.scratch_bytes
        } else {
            0
        }
    }
}

/// The name of the generated entry point.
pub const ENTRY: &str = "tg_main";

/// Most threads per block.
const MAX_THREADS: usize = 1024;

/// Most threads a block by default. Smaller blocks, several to an SM, keep more loads in flight
/// and overlap one block's barriers with another's work: on an H100, 256-thread blocks (4 an
/// SM) ran the weighted sum, matmul and row softmax forwards 1.7x, 1.04x and 1.8x faster than
/// 1024-thread blocks, and faster than 512 or 128 threads.
pub const DEFAULT_THREADS: usize = 256;

/// Elements of the largest tile a thread holds by default, where that leaves fewer than
/// [`DEFAULT_THREADS`] threads: the weighted sum's 16x64 tiles ran 1.15x faster in 128-thread
/// blocks (6 an SM) than in 256-thread ones.
pub const ELEMENTS_PER_THREAD: usize = 8;

/// Elements of the largest tile a thread of a VJP kernel holds (see `vjp_block_shape`).
pub const VJP_ELEMENTS_PER_THREAD: usize = 4;

/// Registers a thread holds of one value up to which the loops over them are unrolled fully.
/// Past it (at [`DEFAULT_THREADS`] threads), a kernel's block grows to up to `MAX_THREADS`
/// threads (fewer registers each), and in such blocks loops over more than half as many
/// registers are unrolled [`PARTIAL_UNROLL`] at a time: their arrays live in local memory, and
/// NVRTC's time no longer grows with the tile. Measured on an H200 (`cargo bench --bench gpu --
/// --compile`, `docs/benchmarks.md`): an 8x4096 layer-norm tile, 128 registers a value unrolled
/// fully, took 36 s (forward) and 55 s (its f64 VJP kernel) with compiles side by side; now
/// 0.6-0.7 s and 1.9-2.2 s, its forward 4.17 ms instead of 5.09. Kernels within the limit
/// (the weighted sum's, the matmul's and the row softmax's of the benchmark) generate the same
/// code as before. `TILEGRAD_GPU_UNROLL=N` sets it.
pub const UNROLLED_REGISTERS: usize = 16;

/// Registers up to which a loop unrolled fully is written out as straight-line code, one block
/// a register (`{ const int j = 2; ... }`), rather than as a loop for NVRTC to unroll: the
/// same machine code, but NVVM's loop passes over hundreds of small loops were most of its
/// time. Measured on an H100 with NVRTC's `--time` (`docs/benchmarks.md`): the causal
/// attention's f64 VJP kernel, about 650 loops of 1 to 4 registers, took 4.0-4.3 s (NVVM
/// 2.9-3.2 s) as loops and 2.2-2.3 s (NVVM 1.0-1.2 s) written out; writing out loops of up to
/// 8 or 16 registers as well gave the examples' kernels no more (12 kernels: 35.5 s as loops,
/// 28.5 s up to 4, 29.3 s up to 8, 31.2 s up to 16, two rounds each).
pub const STRAIGHT_REGISTERS: usize = 4;

/// Registers a loop past [`UNROLLED_REGISTERS`] handles an iteration.
pub const PARTIAL_UNROLL: usize = 4;

/// [`PARTIAL_UNROLL`] of a kernel that takes an f64 tensor: the ground truth's forms (VJP
/// kernels, forwards and backward replays promoted to f64), which a cold check waits for the
/// compiles of and which run once. Measured on an H200 (`docs/benchmarks.md`), an iteration a
/// register against 4: the layer norm's f64 VJP kernel 0.94 s in NVRTC against 1.46 s, 15.3 ms
/// against 14.0; the 4-row softmax's 0.75 s against 1.52 s, 12.3 ms against 11.1.
pub const PARTIAL_UNROLL_F64: usize = 1;

/// Registers a loop past the full-unroll limit of kernel `k` handles an iteration.
fn partial_unroll(k: &Kernel) -> usize {
    match k.params.iter().any(|p| p.kind == tilegrad_ir::ParamKind::Ptr(DType::F64)) {
        true => PARTIAL_UNROLL_F64,
        false => PARTIAL_UNROLL,
    }
}

/// Registers of its tile values a thread of a kernel with race marks (a check's forward) may
/// hold in all where its loops are unrolled fully; past it the block takes twice the threads
/// (up to `MAX_THREADS`), each holding half as many. NVRTC's time grows with the code a
/// thread's elements unroll to, and a kernel with much work an element (a cross entropy's two
/// passes, exponentials and divisions over a 4096-wide tile) took over 2 s in 256 threads.
/// Measured with NVRTC 13.2 on one core (`docs/benchmarks.md`): Liger-Kernel's cross-entropy
/// forward, 784 registers a thread in 256 threads, 1.45 s; in 512, 0.73-0.80 s. The examples'
/// other forwards hold 96 to 496 and keep their blocks. `TILEGRAD_GPU_WORK` sets it; it scales
/// with the registers of a value unrolled fully (`TILEGRAD_GPU_UNROLL`).
pub const UNROLLED_WORK: usize = 512;

/// [`UNROLLED_WORK`], or `TILEGRAD_GPU_WORK` where set to a number.
pub fn unrolled_work() -> usize {
    std::env::var("TILEGRAD_GPU_WORK").ok().and_then(|v| v.parse().ok()).unwrap_or(UNROLLED_WORK)
}

/// Elements of its tile values a thread of a VJP kernel may hold in all where its loops are
/// unrolled fully (an element of f64 takes two registers); past it the block takes twice the
/// threads (up to `MAX_THREADS`), as [`UNROLLED_WORK`] does for forwards. Measured on an
/// H200 (`docs/benchmarks.md`): Liger-Kernel's cross-entropy VJP kernel (4096-wide tiles, an
/// early return, its gradient written over its logits), 1654 elements a thread in 512
/// threads, took 2.5-2.8 s in NVRTC and 1.16-1.18 ms to run; in 1024 threads (64 registers
/// each, spilling) 1.6-2.0 s and 1.82 ms. Spreading costs run time, so the limit is high: the
/// fused cross entropy's (1098) would compile in 1.2-1.7 s instead of 1.4-2.2, but run in
/// 6.54 ms instead of 4.61, and keeps its block, as every example's VJP kernel does.
/// `TILEGRAD_GPU_VJP_WORK` sets it; it scales with `TILEGRAD_GPU_UNROLL` as that does.
pub const UNROLLED_VJP_WORK: usize = 1536;

/// [`UNROLLED_VJP_WORK`], or `TILEGRAD_GPU_VJP_WORK` where set to a number.
pub fn unrolled_vjp_work() -> usize {
    std::env::var("TILEGRAD_GPU_VJP_WORK").ok().and_then(|v| v.parse().ok()).unwrap_or(UNROLLED_VJP_WORK)
}

/// Registers a thread of `threads` holds of kernel `k`'s tile values, one per element of each.
fn thread_work(k: &Kernel, threads: usize) -> usize {
    let mut w = 0;
    k.walk(&mut |_, d| {
        for &r in &d.results {
            let n = k.ty(r).numel();
            if n > 1 {
                w += n.div_ceil(threads);
            }
        }
    });
    w
}

/// `shape` ([`block_shape`]'s) with twice the threads, as often as a thread of a kernel whose
/// loops are unrolled fully would hold more than `work` registers of tile values (see
/// [`UNROLLED_WORK`]), up to [`MAX_THREADS`].
fn spread(k: &Kernel, largest: usize, shape: (usize, usize, usize), work: usize) -> (usize, usize, usize) {
    let (threads, _, unrolled) = shape;
    let mut t = threads;
    while t < MAX_THREADS && largest.div_ceil(t) <= unrolled && thread_work(k, t) > work {
        t *= 2;
    }
    match t == threads {
        true => shape,
        false => (t, (MAX_THREADS / t).max(1), unrolled),
    }
}

/// [`UNROLLED_REGISTERS`], or `TILEGRAD_GPU_UNROLL` where set to a number.
pub fn unrolled_registers() -> usize {
    std::env::var("TILEGRAD_GPU_UNROLL").ok().and_then(|v| v.parse().ok()).unwrap_or(UNROLLED_REGISTERS)
}

/// Scratch up to this many bytes is a block's static shared memory; more is dynamic shared
/// memory, up to what the device lets a block opt in to ([`set_dynamic_shared_limit`]), and
/// past that global memory.
pub const SHARED_SCRATCH: usize = 48 * 1024;

/// The most dynamic shared memory a block of generated code may take: 0 (none) until
/// [`set_dynamic_shared_limit`] sets it (the GPU backend does, from its device).
static DYNAMIC_SHARED_LIMIT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The shared memory of an SM, which bounds the blocks of such kernels an SM runs at once.
static SHARED_PER_SM: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Lets kernels generated from now on keep scratch of up to `per_block` bytes in dynamic
/// shared memory (the device's opt-in limit a block), rather than in global memory, and ask
/// the compiler for no more blocks an SM than `per_sm` bytes of shared memory hold (their
/// registers then go further). On an H200 the f64 forms of the causal attention's kernels (66
/// KB of scratch a block) ran their `dot`s through global memory before. The generated source
/// says where its scratch is, so that the disk cache tells the forms apart.
pub fn set_dynamic_shared_limit(per_block: usize, per_sm: usize) {
    DYNAMIC_SHARED_LIMIT.store(per_block, std::sync::atomic::Ordering::Relaxed);
    SHARED_PER_SM.store(per_sm, std::sync::atomic::Ordering::Relaxed);
}

/// Blocks an SM whose `bytes` of dynamic shared memory (and 1 KB the driver reserves for each)
/// fit at once.
fn blocks_sharing_an_sm(bytes: usize) -> usize {
    (SHARED_PER_SM.load(std::sync::atomic::Ordering::Relaxed) / (bytes + 1024)).max(1)
}

/// Where a block's scratch is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScratchIn {
    /// Static shared memory (up to [`SHARED_SCRATCH`]).
    Shared,
    /// Dynamic shared memory: a launch asks for [`Generated::scratch_bytes`] of it.
    DynamicShared,
    /// Global memory, [`Generated::scratch_bytes`] a block, allocated by the launch.
    Global,
}

impl ScratchIn {
    /// Where `bytes` of scratch a block go.
    fn of(bytes: usize) -> ScratchIn {
        if bytes <= SHARED_SCRATCH {
            ScratchIn::Shared
        } else if bytes <= DYNAMIC_SHARED_LIMIT.load(std::sync::atomic::Ordering::Relaxed) {
            ScratchIn::DynamicShared
        } else {
            ScratchIn::Global
        }
    }
}

/// What a compiled form of a kernel can do beyond computing its results.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Flavor {
    /// Float atomics in program order (see [`generate_ordered`]).
    pub ordered: bool,
    /// Race marks, and writers for blame, can be kept. Without, their pointers are null
    /// constants, so that the compiler drops their code: fewer registers and instructions, and
    /// a faster compile (VJP kernels run so).
    pub marks: bool,
    /// Store marks stamped in 64 bits, for launches of [`WIDE_PROGRAMS`] programs or more
    /// ([`Flavor::for_programs`]); 32 bits otherwise. One kind's code a form, not both behind
    /// a branch: a library-style RMS-norm backward's marked form took 1.19 s in NVRTC (one
    /// core) with both, 0.97 s with one (`docs/benchmarks.md`).
    pub wide: bool,
}

/// Programs of a launch from which its store marks' stamps take 64 bits: a 32-bit stamp holds
/// the program + 1 in 24 bits (and the store's count in 8).
pub const WIDE_PROGRAMS: u64 = 1 << 24;

impl Flavor {
    /// The flavor VJP kernels run in (a check's ground truth): no race marks, float atomics in
    /// the device's order.
    pub const VJP: Flavor = Flavor { ordered: false, marks: false, wide: false };

    /// This flavor for a launch of `programs` programs (its grid's; `u64::MAX` where not known
    /// yet, taken as fewer than [`WIDE_PROGRAMS`]): wide where it keeps marks and has that many.
    pub fn for_programs(self, programs: u64) -> Flavor {
        Flavor { wide: self.marks && programs != u64::MAX && programs >= WIDE_PROGRAMS, ..self }
    }
}

impl Default for Flavor {
    fn default() -> Flavor {
        Flavor { ordered: true, marks: true, wide: false }
    }
}

/// The helpers every generated kernel starts with (`prelude.cu`, with the reference's `exp2`
/// coefficients): the reference's numerics, also for the device conversions of
/// [`crate::Gpu::convert`].
pub(crate) fn prelude() -> String {
    let mut src = String::new();
    let _ = writeln!(src, "#define TG_LOG2E {:?}", std::f64::consts::LOG2_E);
    for (i, c) in tilegrad_reference::EXP2_POLY.iter().enumerate() {
        let _ = writeln!(src, "#define TG_C{i} {c:?}");
    }
    src.push_str(include_str!("prelude.cu"));
    src
}

/// Compiles a kernel (constexprs bound) to CUDA C: a thread per [`ELEMENTS_PER_THREAD`]
/// elements of its largest tile (32 to [`DEFAULT_THREADS`] threads a block, more for tiles
/// that would leave a thread over [`UNROLLED_REGISTERS`] registers a value), as many blocks an
/// SM as 64 registers a thread allow in blocks of 256 threads or more, or 85 in smaller ones.
pub fn generate(k: &Kernel) -> Result<Generated, GpuError> {
    generate_ordered(k, true)
}

/// [`generate`], with float `atomic_add`s applied in program order (`ordered`, the reference's
/// sums bit for bit; programs then take turns to add) or by the hardware's atomics in whatever
/// order programs reach them (f32 and f64; f16 and bf16 stay ordered): sums equal up to the
/// rounding of their order, without turns. VJP kernels, whose every load adds into a shadow,
/// run unordered.
pub fn generate_ordered(k: &Kernel, ordered: bool) -> Result<Generated, GpuError> {
    generate_flavor(k, Flavor { ordered, ..Flavor::default() })
}

/// [`generate`] in a [`Flavor`].
pub fn generate_flavor(k: &Kernel, flavor: Flavor) -> Result<Generated, GpuError> {
    generate_flavor_unrolling(k, flavor, unrolled_registers())
}

/// [`generate_flavor`] with loops over up to `unrolled` registers of a value unrolled fully
/// (see [`UNROLLED_REGISTERS`]), for measurements.
pub fn generate_flavor_unrolling(k: &Kernel, flavor: Flavor, unrolled: usize) -> Result<Generated, GpuError> {
    let largest = largest_tile(k);
    let (threads, blocks, unrolled) = match flavor.marks {
        // The budget in proportion to the registers of a value unrolled fully (all of them
        // where every loop is).
        true => spread(k, largest, block_shape(largest, unrolled), unrolled_work().saturating_mul(unrolled) / UNROLLED_REGISTERS),
        false => spread(k, largest, vjp_block_shape(largest, unrolled), unrolled_vjp_work().saturating_mul(unrolled) / UNROLLED_REGISTERS),
    };
    generate_unrolling(k, threads, Some(blocks), flavor, unrolled)
}

/// [`block_shape`] for kernels without marks (VJP kernels, which compute in f64): a thread
/// per 4 elements of the largest tile, up to 512 threads, with half as many blocks an SM (an f64
/// value takes two registers an element: each thread gets twice the registers), where that
/// leaves a thread within `unrolled` registers a value. On an H200 the causal attention's VJP
/// kernel (32x64 tiles) took 4.3-5.4 s in NVRTC in 256 threads of 8 registers a value, about 2
/// s less in 512 threads of 4 (a cold check 6.97 s against 4.64 s), and ran as fast.
fn vjp_block_shape(largest: usize, unrolled: usize) -> (usize, usize, usize) {
    let threads = largest.div_ceil(VJP_ELEMENTS_PER_THREAD).next_power_of_two().clamp(32, 2 * DEFAULT_THREADS);
    if largest.div_ceil(threads) > unrolled {
        return block_shape(largest, unrolled);
    }
    let (_, blocks, _) = block_shape(largest, unrolled);
    (threads, (MAX_THREADS / threads / 2).clamp(1, blocks), unrolled)
}

/// Threads a block, blocks an SM and the registers up to which loops are unrolled fully, for a
/// kernel whose largest tile has `largest` elements: a thread per [`ELEMENTS_PER_THREAD`]
/// elements, 32 to [`DEFAULT_THREADS`], loops unrolled up to `unrolled`; where a thread would
/// then hold more than `unrolled` registers of a value, [`MAX_THREADS`] or as many as hold
/// `unrolled` (one block an SM, 64 registers a thread), loops unrolled up to half as many.
/// (On an H200, the 4x4096 softmax's f64 VJP kernel, 16 registers a value in 1024 threads,
/// took 3.0 s in NVRTC unrolled fully, 1.8 s thus; its forward then ran in 3.9 ms, not 2.6.)
fn block_shape(largest: usize, unrolled: usize) -> (usize, usize, usize) {
    let threads = largest.div_ceil(ELEMENTS_PER_THREAD).next_power_of_two().clamp(32, DEFAULT_THREADS);
    if largest.div_ceil(threads) > unrolled {
        let more = largest.div_ceil(unrolled.max(1)).next_power_of_two().clamp(threads, MAX_THREADS);
        return (more, (MAX_THREADS / more).max(1), unrolled / 2);
    }
    let blocks = if threads >= DEFAULT_THREADS { MAX_THREADS / threads } else { 3 * MAX_THREADS / 4 / threads };
    (threads, blocks, unrolled)
}

/// Elements of a kernel's largest tile.
fn largest_tile(k: &Kernel) -> usize {
    let mut largest = 1usize;
    k.walk(&mut |_, d| {
        for &v in d.results.iter().chain(d.args.iter()) {
            largest = largest.max(k.ty(v).numel());
        }
    });
    largest
}

/// [`generate`] with at most `max_threads` threads a block (a power of two from 32), and with
/// `min_blocks` blocks an SM asked of the compiler instead of `1024 / threads` (fewer blocks
/// leave more registers to each thread). Results do not depend on either.
pub fn generate_with(k: &Kernel, max_threads: usize, min_blocks: Option<usize>) -> Result<Generated, GpuError> {
    generate_full(k, max_threads, min_blocks, Flavor::default())
}

/// [`generate_with`] and [`generate_flavor`] together.
pub fn generate_full(k: &Kernel, max_threads: usize, min_blocks: Option<usize>, flavor: Flavor) -> Result<Generated, GpuError> {
    generate_unrolling(k, max_threads, min_blocks, flavor, unrolled_registers())
}

/// [`generate_full`] with loops over up to `unrolled` registers of a value unrolled fully (see
/// [`UNROLLED_REGISTERS`]).
pub fn generate_unrolling(
    k: &Kernel,
    max_threads: usize,
    min_blocks: Option<usize>,
    flavor: Flavor,
    unrolled: usize,
) -> Result<Generated, GpuError> {
    let sunk = sink::sink_pure_ops(&hoist::hoist_invariants(k));
    debug_assert!(tilegrad_ir::verify(&sunk).is_ok(), "`{}` rewritten: {:?}", k.name, tilegrad_ir::verify(&sunk));
    let k = &sunk;
    let largest = largest_tile(k);
    let mut defs = vec![None; k.values.len()];
    k.walk(&mut |i, d| {
        for &r in d.results.iter() {
            defs[r.index()] = Some(i);
        }
    });
    let threads = largest.next_power_of_two().clamp(32, max_threads.clamp(32, MAX_THREADS));
    let mut g = Gen {
        k,
        nt: threads,
        min_blocks: min_blocks.unwrap_or((MAX_THREADS / threads).max(1)).max(1),
        out: String::new(),
        depth: 2,
        sources: tilegrad_ir::analysis::pointer_sources(k),
        loops: Vec::new(),
        messages: Vec::new(),
        scratch: 0,
        float_atomics: false,
        log_per_program: 0,
        ordered: flavor.ordered,
        marks: flavor.marks,
        wide: flavor.wide,
        upper: false,
        sites: Vec::new(),
        pending: false,
        toggles: 0,
        dirty: false,
        tail_apart: false,
        resident: Default::default(),
        parity: None,
        defs,
        unrolled,
        partial: partial_unroll(k),
        merged: None,
    };
    g.check_pointers()?;
    g.block(k.body)?;
    g.flush();
    g.write_merged();
    let (scratch_bytes, scratch_in) = (2 * g.scratch, ScratchIn::of(2 * g.scratch));
    if scratch_in == ScratchIn::DynamicShared {
        g.min_blocks = g.min_blocks.min(blocks_sharing_an_sm(scratch_bytes));
    }
    let body = std::mem::take(&mut g.out);
    let mut src = prelude();
    let _ = writeln!(src, "struct TgArgs {{ u64 w[{ARG_WORDS}]; }};");
    g.emit_entry(&mut src, &body);
    Ok(Generated {
        source: src,
        threads: threads as u32,
        min_blocks: g.min_blocks as u32,
        scratch_bytes,
        scratch_in,
        loops: g.loops,
        messages: g.messages,
        float_atomics: g.float_atomics,
        wide: g.wide,
        log_per_program: g.log_per_program,
        sites: g.sites,
    })
}

/// A failure site's arguments (site, lane, offset, aux word). Shown, it records the failure
/// where it stands (`TG_FAIL`: the thread's key, then the block's smallest by an atomic); a
/// path run only when some lane failed notes each lane's ([`Failure::noted`]) and posts the key
/// once after them (`TG_POST`). In a hot path the atomic keeps each lane's record a branch
/// that is not taken; in a cold one, noting spares NVRTC a branch and an atomic a lane.
struct Failure(String);

impl Failure {
    fn noted(&self) -> String {
        format!("TG_NOTE({})", self.0)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TG_FAIL({})", self.0)
    }
}

struct Gen<'k> {
    k: &'k Kernel,
    nt: usize,
    /// Blocks an SM the compiler is asked to fit (`__launch_bounds__`).
    min_blocks: usize,
    out: String,
    depth: usize,
    sources: Vec<Vec<bool>>,
    loops: Vec<Inst>,
    messages: Vec<String>,
    scratch: usize,
    float_atomics: bool,
    /// See [`Generated::log_per_program`].
    log_per_program: u64,
    /// Float atomics in program order (see [`generate_ordered`]).
    ordered: bool,
    /// Race marks can be kept (see [`Flavor::marks`]).
    marks: bool,
    /// Store marks' stamps in 64 bits (see [`Flavor::wide`]).
    wide: bool,
    /// Which half of the (double-buffered) scratch the next op uses.
    upper: bool,
    /// Failure sites emitted so far, by number (from 1; the numbers order the failures between
    /// two checks): instruction and error kind.
    sites: Vec<(Inst, u64)>,
    /// A check is due ([`Gen::check`]).
    pending: bool,
    /// Scratch ops opened so far.
    toggles: usize,
    /// Some thread may still be reading scratch (no barrier since the last op's reads).
    dirty: bool,
    /// The last scratch op reads, after its last barrier, only bytes it does not write before
    /// its first.
    tail_apart: bool,
    /// The instruction defining each value (none for parameters and block parameters).
    defs: Vec<Option<Inst>>,
    /// The placeholder for the iteration parity of the innermost loop being emitted.
    parity: Option<String>,
    /// Reduction results still in scratch, where every thread may read them until the next
    /// scratch op or block boundary: element `@` of the value, as a C expression.
    resident: std::collections::HashMap<u32, String>,
    /// Loops over up to this many registers are unrolled fully ([`UNROLLED_REGISTERS`]).
    unrolled: usize,
    /// Registers a longer loop handles an iteration ([`partial_unroll`]).
    partial: usize,
    /// The loop over registers being merged ([`merge`]).
    merged: Option<merge::Merged>,
}

impl<'k> Gen<'k> {
    fn unsupported(&self, i: Inst, why: &str) -> GpuError {
        let d = self.k.inst(i);
        GpuError::Unsupported { kernel: self.k.name.clone(), op: d.op.mnemonic(), loc: d.loc.clone(), why: why.to_string() }
    }

    /// Every pointer value points into one parameter's tensor.
    fn check_pointers(&self) -> Result<(), GpuError> {
        match multi_source_pointer(self.k, &self.sources) {
            Some(i) => Err(self.unsupported(i, "this pointer may point into more than one tensor")),
            None => Ok(()),
        }
    }

    /// The parameter a pointer value points into.
    fn param_of(&self, v: Value) -> usize {
        self.sources[v.index()].iter().position(|&b| b).expect("check_pointers found one source")
    }

    fn numel(&self, v: Value) -> usize {
        self.k.ty(v).numel()
    }

    fn scalar(&self, v: Value) -> bool {
        self.k.ty(v).is_scalar()
    }

    /// Registers per thread of a value.
    fn regs(&self, v: Value) -> usize {
        if self.scalar(v) {
            1
        } else {
            self.numel(v).div_ceil(self.nt)
        }
    }

    fn dtype(&self, v: Value) -> DType {
        match self.k.ty(v).elem {
            Elem::Num(d) => d,
            Elem::Ptr(_) => DType::I64,
        }
    }

    fn pointee(&self, v: Value) -> DType {
        match self.k.ty(v).elem {
            Elem::Ptr(d) | Elem::Num(d) => d,
        }
    }

    fn declare(&mut self, v: Value) {
        let s = format!("{} v{}[{}];", ctype(self.dtype(v)), v.0, self.regs(v));
        self.line_before(&s);
    }

    /// The `#pragma` of a loop over `count` registers of a thread (see [`UNROLLED_REGISTERS`]),
    /// with its line break.
    fn unroll(&self, count: usize) -> String {
        if count <= self.unrolled {
            "#pragma unroll\n".to_string()
        } else {
            format!("#pragma unroll {}\n", self.partial)
        }
    }

    /// `body` (a statement or a block, reading the register index `j`) for each of `count`
    /// registers of a thread: written out one block a register where it would be unrolled
    /// fully (see [`STRAIGHT_REGISTERS`]), else a loop with its `#pragma` ([`Gen::unroll`]).
    fn registers(&self, count: usize, body: &str) -> String {
        if count <= self.unrolled.min(STRAIGHT_REGISTERS) {
            (0..count).map(|j| format!("{{ const int j = {j}; {body} }}")).collect::<Vec<_>>().join("\n")
        } else {
            format!("{}for (int j = 0; j < {count}; ++j) {body}", self.unroll(count))
        }
    }

    /// `for each element e of out (held by this thread as register j): body`. For scalars the
    /// body runs once, in every thread, with `j = 0` and `e = 0`.
    fn each(&mut self, out: Value, body: &str) {
        if self.scalar(out) {
            self.line(&format!("{{ const int j = 0; const int e = 0; (void)j; (void)e; {body} }}"));
        } else {
            let (r, each) = self.each_register(out, body);
            self.line(&self.registers(r, &each));
        }
    }

    /// [`Gen::each`] for a body that only computes in registers (no memory, no scratch, no
    /// failure): its loop may merge with the loops beside it ([`merge`]).
    fn each_pure(&mut self, out: Value, body: &str) {
        if self.scalar(out) {
            return self.each(out, body);
        }
        let (r, each) = self.each_register(out, body);
        self.merge_registers(r, out, &each);
    }

    /// A tile's registers a thread, and the block computing register `j` of it: `body` at its
    /// element `e`.
    fn each_register(&self, out: Value, body: &str) -> (usize, String) {
        let (r, n, nt) = (self.regs(out), self.numel(out), self.nt);
        // Registers past the tile's end are set too: a register some path leaves unset would
        // be carried around loops, and held, by the compiler.
        let each = if r * nt == n {
            format!("{{ const int e = tid + j * {nt}; {{ {body} }} }}")
        } else {
            let t = ctype(self.dtype(out));
            format!("{{ const int e = tid + j * {nt}; if (e < {n}) {{ {body} }} else v{}[j] = ({t})0; }}", out.0)
        };
        (r, each)
    }

    /// Like [`Gen::each`] over the elements of `v` (a tile), without a result.
    fn each_of(&mut self, v: Value, body: &str) {
        if self.scalar(v) {
            self.line(&format!("if (tid == 0) {{ const int j = 0; const int e = 0; {body} }}"));
        } else {
            let (r, n, nt) = (self.regs(v), self.numel(v), self.nt);
            let guard = if r * nt == n { String::new() } else { format!("if (e < {n}) ") };
            self.line(&self.registers(r, &format!("{{ const int e = tid + j * {nt}; {guard}{{ {body} }} }}")));
        }
    }

    /// Opens an op's use of scratch: the half other than the previous op's, so that it need not
    /// wait for that op's threads to finish reading (the op before that passed a barrier since).
    fn open_scratch(&mut self) {
        // The next op may write the half results were left in before this one's.
        self.resident.clear();
        self.upper = !self.upper;
        self.toggles += 1;
        let base = self.scratch_base();
        self.line(&format!("{{ unsigned char* const sb = {base};"));
    }

    /// The half of scratch the current op uses: in the body of an innermost loop, flipped on
    /// odd iterations where the body has an odd number of scratch ops (see [`Gen::for_loop`]).
    fn scratch_base(&self) -> String {
        let u = self.upper as u8;
        match &self.parity {
            Some(p) => format!("(scr + (({u} ^ {p}) ? TG_HALF : 0))"),
            None if self.upper => "(scr + TG_HALF)".to_string(),
            None => "scr".to_string(),
        }
    }

    fn close_scratch(&mut self) {
        self.line("}");
        // The op's threads read scratch after its last barrier.
        self.dirty = true;
        self.tail_apart = false;
    }

    /// A barrier where an op's reads of scratch may still be under way and control flow may
    /// break the alternation of halves: at the entry of a loop or branch, the end of a branch,
    /// and the end of a loop body with an odd number of scratch ops (whose next iteration
    /// would use the half its last op read). Within straight-line code halves alternate.
    fn fence(&mut self) {
        if self.dirty {
            self.sync();
        } else {
            self.flush();
        }
    }

    fn need_scratch(&mut self, bytes: usize) {
        self.scratch = self.scratch.max(bytes.div_ceil(16) * 16);
    }

    /// Writes tile `v` to scratch (as its register type) at byte offset `at`.
    fn spill(&mut self, v: Value, at: usize) {
        let t = ctype(self.dtype(v));
        if self.scalar(v) {
            self.line(&format!("if (tid == 0) (({t}*)(sb + {at}))[0] = v{}[0];", v.0));
        } else {
            let (r, n, nt) = (self.regs(v), self.numel(v), self.nt);
            let guard = if r * nt == n { String::new() } else { format!("if (e < {n}) ") };
            let each = format!("{{ const int e = tid + j * {nt}; {guard}(({t}*)(sb + {at}))[e] = v{}[j]; }}", v.0);
            self.line(&self.registers(r, &each));
        }
    }

    /// A failure of lane `lane` (an expression) of instruction `i` with the given kind, offset
    /// and aux word. Each failure site has a number, increasing in the order the sites run
    /// between two checks, so that the first failing site and its lowest lane can be told.
    fn fail(&mut self, i: Inst, kind: u64, lane: &str, off: &str, aux: &str) -> Failure {
        self.sites.push((i, kind));
        Failure(format!("{}u, {lane}, (u64)({off}), (u64)({aux})", self.sites.len()))
    }

    /// After an op that may fail: a check is due. It is made at the next barrier the block
    /// passes anyway, or at the latest before the next store, atomic, branch or loop bound
    /// ([`Gen::flush`]): ops in between only compute on a failed lane's stand-in values, and
    /// the failure of the earliest site (lowest lane) is the one reported, as the reference
    /// reports the first failing op.
    fn check(&mut self, _i: Inst) {
        self.pending = true;
    }

    /// Makes a due check now: if any thread failed, the first failure reports and the program
    /// ends.
    fn flush(&mut self) {
        if self.pending {
            self.pending = false;
            self.line("TG_SYNC;");
        }
    }

    /// A barrier of the block's threads, which also makes a due check.
    fn sync(&mut self) {
        self.dirty = false;
        if self.pending {
            self.pending = false;
            self.line("TG_SYNC;");
        } else {
            self.line("__syncthreads();");
        }
    }

    fn message(&mut self, m: String) -> usize {
        match self.messages.iter().position(|x| *x == m) {
            Some(p) => p,
            None => {
                self.messages.push(m);
                self.messages.len() - 1
            }
        }
    }

    /// Copies value `from` into `to` (same type).
    fn copy(&mut self, to: Value, from: Value) {
        let r = self.regs(to);
        self.merge_registers(r, to, &format!("{{ v{}[j] = v{}[j]; }}", to.0, from.0));
    }

    fn inst(&mut self, i: Inst) -> Result<(), GpuError> {
        let k = self.k;
        let d = k.inst(i);
        let a = &d.args;
        let loc = &d.loc;
        self.line_before(&format!("// {} {}", d.op.mnemonic(), loc));
        match &d.op {
            Op::ProgramId { axis } => {
                let r = d.results[0];
                self.declare(r);
                self.line(&format!("v{}[0] = pid{};", r.0, axis));
            }
            Op::NumPrograms { axis } => {
                let r = d.results[0];
                self.declare(r);
                self.line(&format!("v{}[0] = (int)TG_G{};", r.0, axis));
            }
            Op::Const { value } => {
                let r = d.results[0];
                self.declare(r);
                let lit = literal(*value, self.dtype(r));
                self.line(&format!("v{}[0] = {lit};", r.0));
            }
            Op::Arange { start, .. } => {
                let r = d.results[0];
                self.declare(r);
                self.each_pure(r, &format!("v{}[j] = (int)({} + e);", r.0, start));
            }
            Op::Broadcast => {
                let (r, x) = (d.results[0], a[0]);
                self.declare(r);
                if self.scalar(x) {
                    self.each_pure(r, &format!("v{}[j] = v{}[0];", r.0, x.0));
                } else if let (1, Some(ex)) = (self.numel(x), self.expr_at(x, "0", &mut { Self::RECOMPUTE_OPS })) {
                    // One element to all: computed once.
                    self.line(&format!("{{ const {} tg_one = {ex};", ctype(self.dtype(x))));
                    self.each_pure(r, &format!("v{}[j] = tg_one;", r.0));
                    self.line("}");
                } else if let Some(ex) =
                    self.expr_at(x, &broadcast_source(&k.ty(r).shape, &k.ty(x).shape, "e"), &mut { Self::RECOMPUTE_OPS })
                {
                    self.each_pure(r, &format!("v{}[j] = {ex};", r.0));
                } else {
                    let (rs, xs) = (k.ty(r).shape.clone(), k.ty(x).shape.clone());
                    let xst = strides(&xs);
                    let mut idx = String::from("int s = 0; int q = e;");
                    for dim in (0..rs.len()).rev() {
                        let _ = write!(idx, " {{ int c = q % {}; q /= {};", rs[dim], rs[dim]);
                        if xs[dim] != 1 {
                            let _ = write!(idx, " s += c * {};", xst[dim]);
                        }
                        idx.push_str(" }");
                    }
                    self.gather(r, x, &idx);
                }
            }
            Op::ExpandDims { .. } | Op::Reshape => {
                // Row-major element order is unchanged: each element stays in its thread.
                let (r, x) = (d.results[0], a[0]);
                self.declare(r);
                if self.scalar(x) && !self.scalar(r) {
                    self.each_pure(r, &format!("v{}[j] = v{}[0];", r.0, x.0));
                } else if !self.scalar(x) && self.scalar(r) {
                    // A one-element tile becomes a scalar every thread holds.
                    match self.expr_at(x, "0", &mut { Self::RECOMPUTE_OPS }) {
                        Some(ex) => self.line(&format!("v{}[0] = {ex};", r.0)),
                        None => self.gather(r, x, "int s = 0;"),
                    }
                } else {
                    self.copy(r, x);
                }
            }
            Op::Permute { perm } => {
                let (r, x) = (d.results[0], a[0]);
                self.declare(r);
                let src = permute_source(&k.ty(r).shape, &k.ty(x).shape, perm, "e");
                if let Some(ex) = self.expr_at(x, &src, &mut { Self::RECOMPUTE_OPS }) {
                    self.each_pure(r, &format!("v{}[j] = {ex};", r.0));
                    return Ok(());
                }
                let rs = k.ty(r).shape.clone();
                let xst = strides(&k.ty(x).shape);
                let mut idx = String::from("int s = 0; int q = e;");
                for dim in (0..rs.len()).rev() {
                    let _ = write!(idx, " {{ int c = q % {}; q /= {}; s += c * {}; }}", rs[dim], rs[dim], xst[perm[dim] as usize]);
                }
                self.gather(r, x, &idx);
            }
            Op::Unary(u) => {
                let (r, x) = (d.results[0], a[0]);
                self.declare(r);
                let dt = self.dtype(r);
                let xv = format!("v{}[j]", x.0);
                let e = match self.unary(*u, dt, &xv) {
                    Some(e) => e,
                    None => return Err(self.unsupported(i, &format!("`{}` is not defined on {dt}", u.name()))),
                };
                self.each_pure(r, &format!("v{}[j] = {};", r.0, e));
            }
            Op::Binary(b) => {
                let (r, x, y) = (d.results[0], a[0], a[1]);
                self.declare(r);
                let dt = self.dtype(r);
                let (xv, yv) = (format!("v{}[j]", x.0), format!("v{}[j]", y.0));
                if matches!(b, BinaryOp::FloorDiv | BinaryOp::Mod) && dt.is_int() {
                    let m = self.message("integer division by zero".into());
                    let lane = if self.scalar(r) { "0" } else { "e" };
                    let guard = if self.scalar(r) { "tid == 0 && " } else { "" };
                    let f = self.fail(i, ERR_RUNTIME, lane, "0", &m.to_string());
                    let w = if dt == DType::I32 { "32" } else { "64" };
                    let op = if *b == BinaryOp::FloorDiv { "div" } else { "rem" };
                    self.each(
                        r,
                        &format!("if ({yv} == 0) {{ if ({guard}true) {f} v{}[j] = 0; }} else v{}[j] = tg_{op}{w}({xv}, {yv});", r.0, r.0),
                    );
                    self.check(i);
                } else {
                    let e = match self.binary(*b, dt, &xv, &yv) {
                        Some(e) => e,
                        None => return Err(self.unsupported(i, &format!("`{}` is not defined on {dt}", b.name()))),
                    };
                    self.each_pure(r, &format!("v{}[j] = {};", r.0, e));
                }
            }
            Op::Cmp(c) => {
                let (r, x, y) = (d.results[0], a[0], a[1]);
                self.declare(r);
                let op = cmp_op(*c);
                self.each_pure(r, &format!("v{}[j] = (v{}[j] {op} v{}[j]);", r.0, x.0, y.0));
            }
            Op::Where => {
                let (r, c, x, y) = (d.results[0], a[0], a[1], a[2]);
                self.declare(r);
                self.each_pure(r, &format!("v{}[j] = v{}[j] ? v{}[j] : v{}[j];", r.0, c.0, x.0, y.0));
            }
            Op::Cast => {
                let (r, x) = (d.results[0], a[0]);
                self.declare(r);
                let e = convert(self.dtype(x), self.dtype(r), &format!("v{}[j]", x.0));
                self.each_pure(r, &format!("v{}[j] = {e};", r.0));
            }
            Op::Reduce { kind, axis, .. } => self.reduce(i, *kind, *axis as usize)?,
            Op::Cumsum { axis, reverse } => self.cumsum(i, *axis as usize, *reverse)?,
            Op::Dot { precision } => self.dot(i, *precision)?,
            Op::AddPtr => {
                let (r, p, o) = (d.results[0], a[0], a[1]);
                self.declare(r);
                self.each_pure(r, &format!("v{}[j] = tg_add64(v{}[j], (i64)v{}[j]);", r.0, p.0, o.0));
            }
            Op::Load { mask, other } => self.load(i, *mask, *other),
            Op::Store { mask } => self.store(i, *mask),
            Op::AtomicAdd { mask } => self.atomic_add(i, *mask)?,
            Op::AtomicRmw { .. } | Op::AtomicCas => {
                return Err(self.unsupported(i, "its programs depend on each other's order; such launches run on the reference interpreter"))
            }
            Op::For { body, max_iters } => self.for_loop(i, *body, *max_iters)?,
            Op::While { cond, body, max_iters } => self.while_loop(i, *cond, *body, *max_iters)?,
            Op::If { then_block, else_block } => {
                for &r in &d.results {
                    self.declare(r);
                }
                self.fence();
                self.line(&format!("if (v{}[0]) {{", a[0].0));
                self.branch(i, *then_block)?;
                self.line("} else {");
                self.branch(i, *else_block)?;
                self.line("}");
            }
            Op::Yield => unreachable!("yield is emitted by its enclosing op"),
        }
        Ok(())
    }

    /// Element `idx` (a C expression of the flat index) of `v`, computed where it is needed
    /// from `v`'s definition: `v` is a scalar, or built from `arange`s and scalars by
    /// broadcasts, reshapes, permutes and elementwise ops (Triton's `offs_m[:, None] * stride +
    /// offs_n[None, :]` and its masks). A broadcast of such a value needs no scratch and no
    /// barrier; the same ops on the same operands give the values the op would have moved.
    /// `None` for other values, or past `budget` ops.
    fn expr_at(&self, v: Value, idx: &str, budget: &mut usize) -> Option<String> {
        if self.scalar(v) {
            return Some(format!("v{}[0]", v.0));
        }
        if let Some(at) = self.resident.get(&v.0) {
            return Some(at.replace('@', idx));
        }
        if *budget == 0 {
            return None;
        }
        *budget -= 1;
        let k = self.k;
        let d = k.inst(self.defs[v.index()]?);
        let a = &d.args;
        let dt = self.dtype(v);
        let x = |i: usize, budget: &mut usize| self.expr_at(a[i], idx, budget);
        Some(match &d.op {
            Op::Arange { start, .. } => format!("(int)({start} + ({idx}))"),
            Op::Broadcast if self.scalar(a[0]) => x(0, budget)?,
            Op::Broadcast => self.expr_at(a[0], &broadcast_source(&k.ty(v).shape, &k.ty(a[0]).shape, idx), budget)?,
            Op::ExpandDims { .. } | Op::Reshape => x(0, budget)?,
            Op::Permute { perm } => self.expr_at(a[0], &permute_source(&k.ty(v).shape, &k.ty(a[0]).shape, perm, idx), budget)?,
            Op::Unary(u) => self.unary(*u, dt, &x(0, budget)?)?,
            Op::Binary(b) => {
                if matches!(b, BinaryOp::FloorDiv | BinaryOp::Mod) && dt.is_int() {
                    return None;
                }
                let (l, r) = (x(0, budget)?, x(1, budget)?);
                self.binary(*b, dt, &l, &r)?
            }
            Op::Cmp(c) => {
                let (l, r) = (x(0, budget)?, x(1, budget)?);
                format!("({l} {} {r})", cmp_op(*c))
            }
            Op::Where => {
                let (c, l, r) = (x(0, budget)?, x(1, budget)?, x(2, budget)?);
                format!("({c} ? {l} : {r})")
            }
            Op::Cast => convert(self.dtype(a[0]), dt, &x(0, budget)?),
            Op::AddPtr => {
                let (p, o) = (x(0, budget)?, x(1, budget)?);
                format!("tg_add64({p}, (i64){o})")
            }
            Op::ProgramId { .. }
            | Op::NumPrograms { .. }
            | Op::Load { .. }
            | Op::Const { .. }
            | Op::Reduce { .. }
            | Op::Cumsum { .. }
            | Op::Dot { .. }
            | Op::Store { .. }
            | Op::AtomicAdd { .. }
            | Op::AtomicRmw { .. }
            | Op::AtomicCas
            | Op::For { .. }
            | Op::While { .. }
            | Op::If { .. }
            | Op::Yield => return None,
        })
    }

    /// Most ops one recomputed element may cost ([`Gen::expr_at`]).
    const RECOMPUTE_OPS: usize = 48;

    /// `out[e] = x[s]` where `idx` computes `s` from `e`, through scratch.
    fn gather(&mut self, out: Value, x: Value, idx: &str) {
        let bytes = self.numel(x) * reg_bytes(self.dtype(x));
        self.need_scratch(bytes.max(8));
        let t = ctype(self.dtype(x));
        self.open_scratch();
        self.spill(x, 0);
        self.sync();
        self.each(out, &format!("{idx} v{}[j] = (({t}*)sb)[s];", out.0));
        self.close_scratch();
    }

    fn unary(&self, u: UnaryOp, dt: DType, x: &str) -> Option<String> {
        use UnaryOp::*;
        Some(match dt {
            DType::F16 | DType::BF16 | DType::F32 => {
                let e = match u {
                    Neg => format!("(-{x})"),
                    Abs => format!("fabsf({x})"),
                    Exp => format!("tg_exp32({x})"),
                    Exp2 => format!("(float)exp2((double){x})"),
                    Log => format!("(float)log((double){x})"),
                    Log2 => format!("(float)log2((double){x})"),
                    Sqrt => format!("sqrtf({x})"),
                    Rsqrt => format!("(1.0f / sqrtf({x}))"),
                    Sin => format!("(float)sin((double){x})"),
                    Cos => format!("(float)cos((double){x})"),
                    Tanh => format!("(float)tanh((double){x})"),
                    Sigmoid => format!("tg_sigmoid32({x})"),
                    Erf => format!("(float)erf((double){x})"),
                    Floor => format!("floorf({x})"),
                    Ceil => format!("ceilf({x})"),
                    Not => return None,
                };
                narrow(dt, &e)
            }
            DType::F64 => match u {
                Neg => format!("(-{x})"),
                Abs => format!("fabs({x})"),
                Exp => format!("exp({x})"),
                Exp2 => format!("exp2({x})"),
                Log => format!("log({x})"),
                Log2 => format!("log2({x})"),
                Sqrt => format!("sqrt({x})"),
                Rsqrt => format!("(1.0 / sqrt({x}))"),
                Sin => format!("sin({x})"),
                Cos => format!("cos({x})"),
                Tanh => format!("tanh({x})"),
                Sigmoid => format!("tg_sigmoid64({x})"),
                Erf => format!("erf({x})"),
                Floor => format!("floor({x})"),
                Ceil => format!("ceil({x})"),
                Not => return None,
            },
            DType::I32 | DType::I64 => {
                let w = if dt == DType::I32 { "32" } else { "64" };
                match u {
                    Neg => format!("tg_neg{w}({x})"),
                    Abs => format!("tg_abs{w}({x})"),
                    Not => format!("(~{x})"),
                    _ => return None,
                }
            }
            DType::I1 => match u {
                Not => format!("(!{x})"),
                _ => return None,
            },
        })
    }

    fn binary(&self, b: BinaryOp, dt: DType, x: &str, y: &str) -> Option<String> {
        use BinaryOp::*;
        Some(match dt {
            DType::F16 | DType::BF16 | DType::F32 => {
                let e = match b {
                    Add => format!("({x} + {y})"),
                    Sub => format!("({x} - {y})"),
                    Mul => format!("({x} * {y})"),
                    Div => format!("({x} / {y})"),
                    Mod => format!("fmodf({x}, {y})"),
                    Min => format!("tg_minf({x}, {y})"),
                    Max => format!("tg_maxf({x}, {y})"),
                    Pow => format!("(float)pow((double){x}, (double){y})"),
                    FloorDiv | And | Or | Xor | UMulHi => return None,
                };
                narrow(dt, &e)
            }
            DType::F64 => match b {
                Add => format!("({x} + {y})"),
                Sub => format!("({x} - {y})"),
                Mul => format!("({x} * {y})"),
                Div => format!("({x} / {y})"),
                Mod => format!("fmod({x}, {y})"),
                Min => format!("tg_mind({x}, {y})"),
                Max => format!("tg_maxd({x}, {y})"),
                Pow => format!("pow({x}, {y})"),
                FloorDiv | And | Or | Xor | UMulHi => return None,
            },
            DType::I32 | DType::I64 => {
                let w = if dt == DType::I32 { "32" } else { "64" };
                match b {
                    Add => format!("tg_add{w}({x}, {y})"),
                    Sub => format!("tg_sub{w}({x}, {y})"),
                    Mul => format!("tg_mul{w}({x}, {y})"),
                    Min => format!("({y} < {x} ? {y} : {x})"),
                    Max => format!("({y} > {x} ? {y} : {x})"),
                    And => format!("({x} & {y})"),
                    Or => format!("({x} | {y})"),
                    Xor => format!("({x} ^ {y})"),
                    UMulHi if dt == DType::I32 => format!("(int)__umulhi((u32)({x}), (u32)({y}))"),
                    UMulHi => format!("(i64)__umul64hi((u64)({x}), (u64)({y}))"),
                    FloorDiv | Mod => unreachable!("emitted with their zero check"),
                    Div | Pow => return None,
                }
            }
            DType::I1 => match b {
                And => format!("({x} && {y})"),
                Or => format!("({x} || {y})"),
                Xor => format!("({x} != {y})"),
                _ => return None,
            },
        })
    }
}

/// The ops of a kernel the GPU cannot run, with why (for `auto` to fall back before compiling).
pub fn needs_reference(k: &Kernel) -> Option<&'static str> {
    if tilegrad_reference::needs_order(k) {
        return Some("its programs depend on each other's order (atomics that return values, compare-and-swap, exchange)");
    }
    if multi_source_pointer(k, &tilegrad_ir::analysis::pointer_sources(k)).is_some() {
        return Some("a pointer may point into more than one tensor");
    }
    None
}

/// The first instruction defining a pointer that may point into more than one parameter's tensor
/// (`sources` from [`tilegrad_ir::analysis::pointer_sources`]).
fn multi_source_pointer(k: &Kernel, sources: &[Vec<bool>]) -> Option<Inst> {
    let mut bad = None;
    k.walk(&mut |i, d| {
        if bad.is_none() && d.results.iter().any(|&r| k.ty(r).is_ptr() && sources[r.index()].iter().filter(|&&b| b).count() != 1) {
            bad = Some(i);
        }
    });
    bad
}

#[cfg(test)]
mod atomic_log_tests;
#[cfg(test)]
mod failure_tests;
#[cfg(test)]
mod scratch_tests;
#[cfg(test)]
mod stamp_tests;
#[cfg(test)]
mod unroll_tests;
#[cfg(test)]
mod while_tests;
