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

use crate::GpuError;
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
    /// Loops by index in the trip counters: their instructions.
    pub loops: Vec<Inst>,
    /// Runtime error messages by id.
    pub messages: Vec<String>,
    /// Some `atomic_add` on floats: their contributions are applied in program order.
    pub float_atomics: bool,
    /// The instruction and error kind of each failure site, by number from 1 (an error record
    /// names its site).
    pub sites: Vec<(Inst, u64)>,
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

/// Scratch up to this many bytes is a block's shared memory; more is global memory.
pub const SHARED_SCRATCH: usize = 48 * 1024;

/// What a compiled form of a kernel can do beyond computing its results.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Flavor {
    /// Float atomics in program order (see [`generate_ordered`]).
    pub ordered: bool,
    /// Race marks, and writers for blame, can be kept. Without, their pointers are null
    /// constants, so that the compiler drops their code: fewer registers and instructions, and
    /// a faster compile (VJP kernels run so).
    pub marks: bool,
}

impl Default for Flavor {
    fn default() -> Flavor {
        Flavor { ordered: true, marks: true }
    }
}

/// Compiles a kernel (constexprs bound) to CUDA C: a thread per [`ELEMENTS_PER_THREAD`]
/// elements of its largest tile (32 to [`DEFAULT_THREADS`] threads a block), as many blocks an
/// SM as 64 registers a thread allow in 256-thread blocks, or 85 in smaller ones.
pub fn generate(k: &Kernel) -> Result<Generated, GpuError> {
    generate_ordered(k, true)
}

/// [`generate`], with float `atomic_add`s applied in program order (`ordered`, the reference's
/// sums bit for bit; programs then take turns to add) or by the hardware's atomics in whatever
/// order programs reach them (f32 and f64; f16 and bf16 stay ordered): sums equal up to the
/// rounding of their order, without turns. VJP kernels, whose every load adds into a shadow,
/// run unordered.
pub fn generate_ordered(k: &Kernel, ordered: bool) -> Result<Generated, GpuError> {
    generate_flavor(k, Flavor { ordered, marks: true })
}

/// [`generate`] in a [`Flavor`].
pub fn generate_flavor(k: &Kernel, flavor: Flavor) -> Result<Generated, GpuError> {
    let threads = largest_tile(k).div_ceil(ELEMENTS_PER_THREAD).next_power_of_two().clamp(32, DEFAULT_THREADS);
    let blocks = if threads >= DEFAULT_THREADS { MAX_THREADS / threads } else { 3 * MAX_THREADS / 4 / threads };
    generate_full(k, threads, Some(blocks), flavor)
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
        ordered: flavor.ordered,
        marks: flavor.marks,
        upper: false,
        sites: Vec::new(),
        pending: false,
        toggles: 0,
        dirty: false,
        tail_apart: false,
        resident: Default::default(),
        parity: None,
        defs,
    };
    g.check_pointers()?;
    g.block(k.body)?;
    g.flush();
    let body = std::mem::take(&mut g.out);
    let mut src = String::new();
    let poly = tilegrad_reference::EXP2_POLY;
    let _ = writeln!(src, "#define TG_LOG2E {:?}", std::f64::consts::LOG2_E);
    for (i, c) in poly.iter().enumerate() {
        let _ = writeln!(src, "#define TG_C{i} {c:?}");
    }
    src.push_str(include_str!("prelude.cu"));
    let _ = writeln!(src, "struct TgArgs {{ u64 w[{ARG_WORDS}]; }};");
    g.emit_entry(&mut src, &body);
    Ok(Generated {
        source: src,
        threads: threads as u32,
        min_blocks: g.min_blocks as u32,
        scratch_bytes: 2 * g.scratch,
        loops: g.loops,
        messages: g.messages,
        float_atomics: g.float_atomics,
        sites: g.sites,
    })
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
    /// Float atomics in program order (see [`generate_ordered`]).
    ordered: bool,
    /// Race marks can be kept (see [`Flavor::marks`]).
    marks: bool,
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
}

/// The C type that holds values of a dtype in registers (f16/bf16 as rounded f32, as the
/// reference holds them).
fn ctype(d: DType) -> &'static str {
    match d {
        DType::I1 => "bool",
        DType::I32 => "int",
        DType::I64 => "i64",
        DType::F16 | DType::BF16 | DType::F32 => "float",
        DType::F64 => "double",
    }
}

/// The C type of a dtype in memory.
fn storage(d: DType) -> &'static str {
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
fn from_storage(d: DType, x: &str) -> String {
    match d {
        DType::I1 => format!("({x} != 0)"),
        DType::F16 => format!("tg_h2f({x})"),
        DType::BF16 => format!("tg_bf2f({x})"),
        _ => x.to_string(),
    }
}

/// Converts register value `x` of dtype `d` to its storage.
fn to_storage(d: DType, x: &str) -> String {
    match d {
        DType::I1 => format!("(u8)({x})"),
        DType::F16 => format!("tg_f2h({x})"),
        DType::BF16 => format!("tg_f2bf({x})"),
        _ => x.to_string(),
    }
}

/// Rounds an f32 expression to dtype `d` when it is f16 or bf16.
fn narrow(d: DType, x: &str) -> String {
    match d {
        DType::F16 => format!("tg_f16((double)({x}))"),
        DType::BF16 => format!("tg_bf16((double)({x}))"),
        _ => x.to_string(),
    }
}

/// An exact C literal of a value of dtype `d` (as the reference's `lit_data` converts it).
fn literal(l: Lit, d: DType) -> String {
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
fn convert(from: DType, to: DType, x: &str) -> String {
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

fn cmp_op(c: CmpOp) -> &'static str {
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
fn broadcast_source(to: &[usize], from: &[usize], idx: &str) -> String {
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
fn permute_source(to: &[usize], from: &[usize], perm: &[u8], idx: &str) -> String {
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
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

impl<'k> Gen<'k> {
    fn line(&mut self, s: &str) {
        for _ in 0..self.depth {
            self.out.push_str("    ");
        }
        self.out.push_str(s);
        self.out.push('\n');
    }

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
        self.line(&s);
    }

    /// `for each element e of out (held by this thread as register j): body`. For scalars the
    /// body runs once, in every thread, with `j = 0` and `e = 0`.
    fn each(&mut self, out: Value, body: &str) {
        if self.scalar(out) {
            self.line(&format!("{{ const int j = 0; const int e = 0; (void)j; (void)e; {body} }}"));
        } else {
            let (r, n, nt) = (self.regs(out), self.numel(out), self.nt);
            // Registers past the tile's end are set too: a register some path leaves unset
            // would be carried around loops, and held, by the compiler.
            if r * nt == n {
                self.line(&format!("#pragma unroll\nfor (int j = 0; j < {r}; ++j) {{ const int e = tid + j * {nt}; {{ {body} }} }}"));
            } else {
                let t = ctype(self.dtype(out));
                self.line(&format!(
                    "#pragma unroll\nfor (int j = 0; j < {r}; ++j) {{ const int e = tid + j * {nt}; if (e < {n}) {{ {body} }} else v{}[j] = ({t})0; }}",
                    out.0
                ));
            }
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
            self.line(&format!(
                "#pragma unroll\nfor (int j = 0; j < {r}; ++j) {{ const int e = tid + j * {nt}; {guard}(({t}*)(sb + {at}))[e] = v{}[j]; }}",
                v.0
            ));
        }
    }

    /// A failure of lane `lane` (an expression) of instruction `i` with the given kind, offset
    /// and aux word. Each failure site has a number, increasing in the order the sites run
    /// between two checks, so that the first failing site and its lowest lane can be told.
    fn fail(&mut self, i: Inst, kind: u64, lane: &str, off: &str, aux: &str) -> String {
        self.sites.push((i, kind));
        format!("TG_FAIL({}u, {lane}, (u64)({off}), (u64)({aux}))", self.sites.len())
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

    /// Emits the instructions of a block; returns the operands of its final `yield`.
    fn block(&mut self, b: Block) -> Result<Vec<Value>, GpuError> {
        // Scratch left by ops outside the block may be overwritten before (or while) it runs.
        self.resident.clear();
        let k = self.k;
        let mut ys = Vec::new();
        for &i in &k.block(b).insts {
            let d = k.inst(i);
            if let Op::Yield = d.op {
                ys = d.args.to_vec();
                break;
            }
            self.inst(i)?;
        }
        Ok(ys)
    }

    /// Copies value `from` into `to` (same type).
    fn copy(&mut self, to: Value, from: Value) {
        let r = self.regs(to);
        self.line(&format!("#pragma unroll\nfor (int j = 0; j < {r}; ++j) v{}[j] = v{}[j];", to.0, from.0));
    }

    fn inst(&mut self, i: Inst) -> Result<(), GpuError> {
        let k = self.k;
        let d = k.inst(i);
        let a = &d.args;
        let loc = &d.loc;
        self.line(&format!("// {} {}", d.op.mnemonic(), loc));
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
                self.each(r, &format!("v{}[j] = (int)({} + e);", r.0, start));
            }
            Op::Broadcast => {
                let (r, x) = (d.results[0], a[0]);
                self.declare(r);
                if self.scalar(x) {
                    self.each(r, &format!("v{}[j] = v{}[0];", r.0, x.0));
                } else if let (1, Some(ex)) = (self.numel(x), self.expr_at(x, "0", &mut { Self::RECOMPUTE_OPS })) {
                    // One element to all: computed once.
                    self.line(&format!("{{ const {} tg_one = {ex};", ctype(self.dtype(x))));
                    self.each(r, &format!("v{}[j] = tg_one;", r.0));
                    self.line("}");
                } else if let Some(ex) =
                    self.expr_at(x, &broadcast_source(&k.ty(r).shape, &k.ty(x).shape, "e"), &mut { Self::RECOMPUTE_OPS })
                {
                    self.each(r, &format!("v{}[j] = {ex};", r.0));
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
                    self.each(r, &format!("v{}[j] = v{}[0];", r.0, x.0));
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
                    self.each(r, &format!("v{}[j] = {ex};", r.0));
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
                self.each(r, &format!("v{}[j] = {};", r.0, e));
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
                    self.each(r, &format!("v{}[j] = {};", r.0, e));
                }
            }
            Op::Cmp(c) => {
                let (r, x, y) = (d.results[0], a[0], a[1]);
                self.declare(r);
                let op = cmp_op(*c);
                self.each(r, &format!("v{}[j] = (v{}[j] {op} v{}[j]);", r.0, x.0, y.0));
            }
            Op::Where => {
                let (r, c, x, y) = (d.results[0], a[0], a[1], a[2]);
                self.declare(r);
                self.each(r, &format!("v{}[j] = v{}[j] ? v{}[j] : v{}[j];", r.0, c.0, x.0, y.0));
            }
            Op::Cast => {
                let (r, x) = (d.results[0], a[0]);
                self.declare(r);
                let e = convert(self.dtype(x), self.dtype(r), &format!("v{}[j]", x.0));
                self.each(r, &format!("v{}[j] = {e};", r.0));
            }
            Op::Reduce { kind, axis, .. } => self.reduce(i, *kind, *axis as usize)?,
            Op::Cumsum { axis, reverse } => self.cumsum(i, *axis as usize, *reverse)?,
            Op::Dot { precision } => self.dot(i, *precision)?,
            Op::AddPtr => {
                let (r, p, o) = (d.results[0], a[0], a[1]);
                self.declare(r);
                self.each(r, &format!("v{}[j] = tg_add64(v{}[j], (i64)v{}[j]);", r.0, p.0, o.0));
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

    fn branch(&mut self, i: Inst, b: Block) -> Result<(), GpuError> {
        self.depth += 1;
        let ys = self.block(b)?;
        let results = self.k.inst(i).results.clone();
        for (r, y) in results.iter().zip(ys) {
            self.copy(*r, y);
        }
        self.fence();
        self.depth -= 1;
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
        let bytes = self.numel(x) * self.dtype(x).size_bytes().max(1);
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
                    FloorDiv | And | Or | Xor => return None,
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
                FloorDiv | And | Or | Xor => return None,
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

    fn reduce(&mut self, i: Inst, kind: ReduceOp, axis: usize) -> Result<(), GpuError> {
        let k = self.k;
        let d = k.inst(i);
        let (r, x) = (d.results[0], d.args[0]);
        let xd = self.dtype(x);
        if xd == DType::I1 {
            return Err(self.unsupported(i, "cannot reduce i1"));
        }
        self.declare(r);
        let shape = k.ty(x).shape.clone();
        let outer: usize = shape[..axis].iter().product();
        let n = shape[axis];
        let inner: usize = shape[axis + 1..].iter().product();
        let t = ctype(xd);
        let rd = self.dtype(r);
        let xbytes = self.numel(x) * xd.size_bytes();
        let at = |o: &str, kk: &str, ii: &str| format!("(({t}*)sb)[({o} * {n} + {kk}) * {inner} + {ii}]");
        let float = xd.is_float();
        let (plus, max2, min2) = match xd {
            DType::I32 => ("tg_add32(A, B)", "(B > A ? B : A)", "(B < A ? B : A)"),
            DType::I64 => ("tg_add64(A, B)", "(B > A ? B : A)", "(B < A ? B : A)"),
            DType::F64 => ("(A + B)", "tg_maxd(A, B)", "tg_mind(A, B)"),
            _ => ("(A + B)", "tg_maxf(A, B)", "tg_minf(A, B)"),
        };
        let f = |tmpl: &str, a: &str, b: &str| tmpl.replace('A', a).replace('B', b);
        if matches!(kind, ReduceOp::Max | ReduceOp::Min) && inner == 1 && !self.scalar(x) && n % self.nt == 0 {
            // Rows of whole multiples of the block: each thread folds its registers of a row,
            // a warp its threads by shuffles, and one barrier later every output folds the
            // warps' partials. Pairs of value and index pick what the in-order fold would.
            let mx = if kind == ReduceOp::Max { "true" } else { "false" };
            let (nw, per, nt) = (self.nt / 32, n / self.nt, self.nt);
            let ioff = (outer * nw * xd.size_bytes()).div_ceil(16) * 16;
            self.need_scratch(ioff + outer * nw * 4);
            self.open_scratch();
            let base = self.scratch_base();
            self.line(&format!(
                "{{ const int lane = tid % 32, warp = tid / 32;\n#pragma unroll\nfor (int o = 0; o < {outer}; ++o) {{ {t} m = v{x}[o * {per}]; int mi = tid;\n#pragma unroll\nfor (int q = 1; q < {per}; ++q) tg_pick<{t}, {mx}>(m, mi, v{x}[o * {per} + q], tid + q * {nt});\nfor (int w = 16; w >= 1; w /= 2) {{ const {t} om = __shfl_xor_sync(0xffffffffu, m, w); const int oi = __shfl_xor_sync(0xffffffffu, mi, w); tg_pick<{t}, {mx}>(m, mi, om, oi); }}\nif (lane == 0) {{ (({t}*)sb)[o * {nw} + warp] = m; ((int*)(sb + {ioff}))[o * {nw} + warp] = mi; }} }} }}",
                x = x.0
            ));
            self.sync();
            let at_index = narrow(
                rd,
                &format!("(tg_fold<{t}, {mx}>((const {t}*)({base}) + (@) * {nw}, (const int*)({base} + {ioff}) + (@) * {nw}, {nw}))"),
            );
            self.each(r, &format!("v{}[j] = {};", r.0, at_index.replace('@', "e")));
            self.resident.insert(r.0, at_index);
            self.close_scratch();
            return Ok(());
        }
        self.open_scratch();
        self.spill(x, 0);
        self.sync();
        // Output element e is (o, ii) with o = e / inner, ii = e % inner.
        let oi = format!("const int o = e / {inner}; const int ii = e % {inner}; (void)o; (void)ii;");
        match kind {
            ReduceOp::Sum if inner == 1 => {
                // The reference's order (`sum_run`): 64 interleaved chains from 0, in parallel
                // threads; then per output a warp folds them pairwise with shuffles (lane j takes
                // lane j + w for w = 32, ..., 1) and adds the remainder in order.
                const L: usize = tilegrad_reference::SUM_LANES;
                let part = xbytes.div_ceil(16) * 16;
                let res = part + (outer * L * xd.size_bytes()).div_ceil(16) * 16;
                self.need_scratch(res + outer * xd.size_bytes());
                let chunks = n / L;
                // With one chunk or none a lane's chain is its first element (or zero): read
                // where it is, without a pass and its barrier.
                let zero = format!("({t})0");
                let first = |q: &str| f(plus, &zero, &at("o", q, "0"));
                let pp: Box<dyn Fn(&str) -> String> = if chunks >= 2 {
                    self.line(&format!(
                        "for (int q = tid; q < {}; q += {}) {{ const int o = q / {L}; const int c = q % {L}; {t} acc = ({t})0; for (int ch = 0; ch < {chunks}; ++ch) acc = {}; (({t}*)(sb + {part}))[q] = acc; }}",
                        outer * L,
                        self.nt,
                        f(plus, "acc", &at("o", &format!("(ch * {L} + c)"), "0"))
                    ));
                    self.sync();
                    Box::new(|q: &str| format!("(({t}*)(sb + {part}))[o * {L} + {q}]"))
                } else if chunks == 1 {
                    Box::new(move |q: &str| first(q))
                } else {
                    Box::new(|_: &str| format!("({t})0"))
                };
                self.line(&format!(
                    "for (int o = tid / 32; o < {outer}; o += {}) {{ const int lane = tid % 32; {t} s = {}; for (int w = 16; w >= 1; w /= 2) {{ const {t} other = __shfl_down_sync(0xffffffffu, s, w); s = {}; }} if (lane == 0) {{ for (int kk = {}; kk < {n}; ++kk) s = {}; (({t}*)(sb + {res}))[o] = s; }} }}",
                    self.nt / 32,
                    f(plus, &pp("lane"), &pp("lane + 32")),
                    f(plus, "s", "other"),
                    chunks * L,
                    f(plus, "s", &at("o", "kk", "0")),
                ));
                self.sync();
                let at_index = narrow(rd, &format!("(({t}*)({} + {res}))[@]", self.scratch_base()));
                self.each(r, &format!("v{}[j] = {};", r.0, at_index.replace('@', "e")));
                self.resident.insert(r.0, at_index);
                self.close_scratch();
                // Written before the first barrier: the spilled tile (below `part`); read after
                // the last: the results (from `res`).
                self.tail_apart = true;
                return Ok(());
            }
            ReduceOp::Max | ReduceOp::Min if n >= 16 => {
                // Max and min are exact in any order (a NaN operand yields the other): chains
                // of a strided part of each row in parallel threads, then combined in order.
                let outputs = outer * inner;
                let mut ch = 1usize;
                while outputs * ch * 2 <= self.nt && ch * 2 <= 32 && ch * 2 <= n {
                    ch *= 2;
                }
                let part = xbytes.div_ceil(16) * 16;
                self.need_scratch(part + outputs * ch * xd.size_bytes());
                let op = if kind == ReduceOp::Max { max2 } else { min2 };
                self.line(&format!(
                    "for (int q = tid; q < {}; q += {}) {{ const int ov = q / {ch}; const int c = q % {ch}; const int o = ov / {inner}; const int ii = ov % {inner}; {t} acc = {}; for (int kk = c + {ch}; kk < {n}; kk += {ch}) acc = {}; (({t}*)(sb + {part}))[q] = acc; }}",
                    outputs * ch,
                    self.nt,
                    at("o", "c", "ii"),
                    f(op, "acc", &at("o", "kk", "ii"))
                ));
                self.sync();
                let p = |q: &str| format!("(({t}*)(sb + {part}))[e * {ch} + {q}]");
                let body = format!(
                    "{t} s = {}; for (int c = 1; c < {ch}; ++c) s = {}; v{}[j] = {};",
                    p("0"),
                    f(op, "s", &p("c")),
                    r.0,
                    narrow(rd, "s")
                );
                self.each(r, &body);
            }
            ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min => {
                self.need_scratch(xbytes);
                let op = match kind {
                    ReduceOp::Sum => plus,
                    ReduceOp::Max => max2,
                    _ => min2,
                };
                let body = format!(
                    "{oi} {t} s = {}; for (int kk = 1; kk < {n}; ++kk) s = {}; v{}[j] = {};",
                    at("o", "0", "ii"),
                    f(op, "s", &at("o", "kk", "ii")),
                    r.0,
                    narrow(rd, "s")
                );
                self.each(r, &body);
            }
            ReduceOp::Argmax | ReduceOp::Argmin => {
                self.need_scratch(xbytes);
                let better = if kind == ReduceOp::Argmax { "xv > bv" } else { "xv < bv" };
                let nan = if float { "(bv != bv && xv == xv)" } else { "false" };
                let body = format!(
                    "{oi} int best = 0; for (int kk = 1; kk < {n}; ++kk) {{ {t} xv = {}; {t} bv = {}; if ({better} || {nan}) best = kk; }} v{}[j] = best;",
                    at("o", "kk", "ii"),
                    at("o", "best", "ii"),
                    r.0
                );
                self.each(r, &body);
            }
        }
        self.close_scratch();
        Ok(())
    }

    fn cumsum(&mut self, i: Inst, axis: usize, reverse: bool) -> Result<(), GpuError> {
        let k = self.k;
        let d = k.inst(i);
        let (r, x) = (d.results[0], d.args[0]);
        let xd = self.dtype(x);
        if xd == DType::I1 {
            return Err(self.unsupported(i, "cannot scan i1"));
        }
        self.declare(r);
        let shape = k.ty(x).shape.clone();
        let outer: usize = shape[..axis].iter().product();
        let n = shape[axis];
        let inner: usize = shape[axis + 1..].iter().product();
        let t = ctype(xd);
        self.need_scratch(self.numel(x) * xd.size_bytes());
        let plus = match xd {
            DType::I32 => "tg_add32(P, C)".to_string(),
            DType::I64 => "tg_add64(P, C)".to_string(),
            _ => narrow(xd, "(P + C)"),
        };
        let (k_of, prev_of) = if reverse { (format!("({n} - 1 - st)"), format!("({n} - st)")) } else { ("st".into(), "(st - 1)".into()) };
        let at = |kk: &str| format!("(({t}*)sb)[(o * {n} + {kk}) * {inner} + ii]");
        self.open_scratch();
        self.spill(x, 0);
        self.sync();
        let step = plus.replace('P', &at(&prev_of)).replace('C', &at(&k_of));
        self.line(&format!(
            "for (int q = tid; q < {}; q += {}) {{ const int o = q / {inner}; const int ii = q % {inner}; for (int st = 1; st < {n}; ++st) {} = {step}; }}",
            outer * inner,
            self.nt,
            at(&k_of)
        ));
        self.sync();
        self.each(r, &format!("v{}[j] = (({t}*)sb)[e];", r.0));
        self.close_scratch();
        Ok(())
    }

    fn dot(&mut self, i: Inst, precision: DotPrecision) -> Result<(), GpuError> {
        let k = self.k;
        let d = k.inst(i);
        let (r, a, b, c) = (d.results[0], d.args[0], d.args[1], d.args[2]);
        let rd = self.dtype(r);
        let (m, kk, n) = (k.ty(a).shape[0], k.ty(a).shape[1], k.ty(b).shape[1]);
        let acc = match rd {
            DType::F16 | DType::BF16 | DType::F32 => DType::F32,
            DType::F64 => DType::F64,
            _ => return Err(self.unsupported(i, "dot accumulates in floats only")),
        };
        self.declare(r);
        let t = ctype(acc);
        let sz = acc.size_bytes();
        let tf32 = precision == DotPrecision::Tf32 && self.dtype(a) == DType::F32 && acc == DType::F32;
        let conv = |v: Value, g: &Gen| {
            let e = convert(g.dtype(v), acc, &format!("v{}[j]", v.0));
            if tf32 {
                format!("tg_tf32({e})")
            } else {
                e
            }
        };
        let (ca, cb) = (conv(a, self), conv(b, self));
        let (regs, numel, nt) = (self.regs(r), self.numel(r), self.nt);
        // Every register of a thread in one column (`tid % n`), at rows `tid / n + S * j`: a is
        // kept transposed, with each thread's rows side by side, so that a step over k reads
        // them in a few wide loads (one address for a warp) and one element of b.
        let strip = !self.scalar(r) && nt % n == 0 && regs * nt == numel && m % (nt / n) == 0 && regs == m / (nt / n);
        let stride = nt / n;
        // Rows of transposed a padded by 4 elements (16 bytes apart stay 16 bytes apart):
        // a warp writing one row of a, 32 steps of k, then meets 4 banks at a time, not 1.
        let pitch = if strip && m % 4 == 0 { m + 4 } else { m };
        let boff = (pitch * kk * sz).div_ceil(16) * 16;
        self.need_scratch(boff + kk * n * sz);
        self.open_scratch();
        if strip {
            self.each_of(
                a,
                &format!("(({t}*)sb)[(e % {kk}) * {pitch} + ((e / {kk}) % {stride}) * {regs} + (e / {kk}) / {stride}] = {ca};"),
            );
        } else {
            self.each_of(a, &format!("(({t}*)sb)[e] = {ca};"));
        }
        self.each_of(b, &format!("(({t}*)(sb + {boff}))[e] = {cb};"));
        self.sync();
        let (mul, add) = if acc == DType::F32 { ("__fmul_rn", "__fadd_rn") } else { ("__dmul_rn", "__dadd_rn") };
        // Each output accumulates over k in order (products and sums rounded separately); k is
        // the outer loop so that a column of b, when every register of a thread is in one
        // column, is read once.
        let cv = convert(self.dtype(c), acc, &format!("v{}[j]", c.0));
        let one_col = !self.scalar(r) && nt % n == 0;
        let bq = if one_col { "bq".to_string() } else { format!("(({t}*)(sb + {boff}))[q * {n} + (e % {n})]") };
        let hoist = if one_col { format!("const {t} bq = (({t}*)(sb + {boff}))[q * {n} + (tid % {n})];") } else { String::new() };
        self.line("{");
        self.line(&format!("{t} s[{regs}];"));
        let guard = if regs * nt == numel { String::new() } else { format!("if (e < {numel}) ") };
        let otherwise = if regs * nt == numel { String::new() } else { format!(" else s[j] = ({t})0;") };
        self.line(&format!(
            "#pragma unroll\nfor (int j = 0; j < {regs}; ++j) {{ const int e = tid + j * {nt}; {guard}s[j] = {cv};{otherwise} }}"
        ));
        if strip {
            let (wide, w) = match acc {
                DType::F32 if regs % 4 == 0 => ("float4", 4),
                DType::F64 if regs % 2 == 0 => ("double2", 2),
                _ => (t, 1),
            };
            // Steps over k unrolled until they read about 512 bytes of a a thread (8 steps of 16
            // floats): the loop's own instructions are then 7 beside 256 products and sums.
            let unroll = (512 / (regs * sz)).clamp(2, 8);
            let lanes = ["x", "y", "z", "w"];
            let mut step = String::new();
            for l in lanes.iter().take(w) {
                let el = if w == 1 { "a4".to_string() } else { format!("a4.{l}") };
                let at = lanes.iter().position(|x| x == l).unwrap_or(0);
                let _ = write!(step, " s[{w} * jw + {at}] = {add}(s[{w} * jw + {at}], {mul}({el}, bq));");
            }
            self.line(&format!(
                "#pragma unroll {unroll}\nfor (int q = 0; q < {kk}; ++q) {{ {hoist} const {wide}* ap = (const {wide}*)((({t}*)sb) + q * {pitch} + (tid / {n}) * {regs});\n#pragma unroll\nfor (int jw = 0; jw < {}; ++jw) {{ const {wide} a4 = ap[jw];{step} }} }}",
                regs / w
            ));
        } else {
            self.line(&format!(
                "for (int q = 0; q < {kk}; ++q) {{ {hoist}\n#pragma unroll\nfor (int j = 0; j < {regs}; ++j) {{ const int e = tid + j * {nt}; if (e < {numel}) s[j] = {add}(s[j], {mul}((({t}*)sb)[(e / {n}) * {kk} + q], {bq})); }} }}"
            ));
        }
        let body = format!("v{}[j] = {};", r.0, narrow(rd, "s[j]"));
        self.each(r, &body);
        self.line("}");
        self.close_scratch();
        Ok(())
    }

    /// Like [`Gen::each`] over the elements of `v` (a tile), without a result.
    fn each_of(&mut self, v: Value, body: &str) {
        if self.scalar(v) {
            self.line(&format!("if (tid == 0) {{ const int j = 0; const int e = 0; {body} }}"));
        } else {
            let (r, n, nt) = (self.regs(v), self.numel(v), self.nt);
            let guard = if r * nt == n { String::new() } else { format!("if (e < {n}) ") };
            self.line(&format!("#pragma unroll\nfor (int j = 0; j < {r}; ++j) {{ const int e = tid + j * {nt}; {guard}{{ {body} }} }}"));
        }
    }

    /// The lane guard and lane index of an access: scalar accesses are made by thread 0.
    fn access_lane(&self, p: Value) -> (&'static str, &'static str) {
        if self.scalar(p) {
            ("tid == 0", "0")
        } else {
            ("true", "e")
        }
    }

    fn load(&mut self, i: Inst, mask: bool, other: bool) {
        let k = self.k;
        let d = k.inst(i);
        let (r, p) = (d.results[0], d.args[0]);
        let j = self.param_of(p);
        let dt = self.pointee(p);
        self.declare(r);
        let m = if mask { format!("v{}[j]", d.args[1].0) } else { "true".into() };
        let fill = if other { format!("v{}[j]", d.args[2].0) } else { self.fill(dt) };
        let (lead, lane) = self.access_lane(p);
        let fail = self.fail(i, ERR_OOB, lane, "off", &j.to_string());
        let read = from_storage(dt, &format!("tg_b{j}[off]"));
        // Where the launch keeps them, the read marks and the check for reads of this
        // program's own atomics; then the reads, with nothing between them that waits (so that
        // a thread's loads are in flight together, and its offsets then free).
        let body = format!(
            "if ({m}) {{ const i64 off = v{p}[j]; if ((u64)off >= (u64)tg_n{j}) {{ if ({lead}) {fail} v{r}[j] = ({t})0; }} else {{ v{r}[j] = {read}; if ({lead}) tg_ok++; }} }} else v{r}[j] = {fill};",
            p = p.0,
            r = r.0,
            t = ctype(dt),
        );
        self.line(&format!("if (tg_r{j} || tg_a{j}) {{"));
        self.each_of(
            p,
            &format!(
                "if ({m}) {{ const i64 off = v{}[j]; if ((u64)off < (u64)tg_n{j} && {lead}) {{ if (tg_r{j}) tg_mark(tg_r{j} + off, tg_p + 1); if (tg_a{j} && tg_a{j}[off] == tg_p + 1) atomicOr(TG_FLAGS, {FLAG_OWN_ATOMIC}u); }} }}",
                p.0
            ),
        );
        self.line("}");
        // Counted in 32 bits, added once an op (a 64-bit count per lane costs an instruction).
        self.line("{ u32 tg_ok = 0;");
        self.each(r, &body);
        self.line("tg_cl += tg_ok; }");
        self.check(i);
    }

    /// What a masked-off lane of a load without `other` reads: NaN for floats where the launch
    /// poisons masked loads, else zero.
    fn fill(&self, dt: DType) -> String {
        if dt.is_float() {
            let nan = if dt == DType::F64 { "TG_NAN_D" } else { "TG_NAN_F" };
            format!("(TG_POISON ? {nan} : ({})0)", ctype(dt))
        } else {
            format!("({})0", ctype(dt))
        }
    }

    fn store(&mut self, i: Inst, mask: bool) {
        let k = self.k;
        let d = k.inst(i);
        let (p, v) = (d.args[0], d.args[1]);
        let j = self.param_of(p);
        let dt = self.pointee(p);
        let m = if mask { format!("v{}[j]", d.args[2].0) } else { "true".into() };
        let (_, lane) = self.access_lane(p);
        let fail = self.fail(i, ERR_OOB, lane, "off", &j.to_string());
        let val = to_storage(dt, &format!("v{}[j]", v.0));
        // Each written element's mark takes a stamp of program and store count: another
        // program's stamp is a conflict, this store's own a duplicate lane. 32-bit stamps keep
        // the count's low 8 bits, so that a program's 257th store of one element looks like a
        // duplicate and goes to the reference. They are taken after the writes, and the
        // exchanges of a thread are in flight together: what they return is only or-ed into a
        // flag word.
        self.flush();
        self.line("tg_sseq++; tg_nev++;");
        let stamp_check = |wide: bool| {
            let (ty, stamp, xchg, other) = if wide {
                (
                    "u64",
                    "((u64)(tg_p + 1) << 32) | tg_sseq",
                    format!("(u64)atomicExch((unsigned long long*)(tg_w{j} + off), (unsigned long long)stamp)"),
                    "(u32)(old >> 32)",
                )
            } else {
                ("u32", "((tg_p + 1u) << 8) | (tg_sseq & 0xffu)", format!("atomicExch((u32*)tg_w{j} + off, stamp)"), "(old >> 8)")
            };
            format!(
                "if ({m}) {{ const i64 off = v{}[j]; if ((u64)off < (u64)tg_n{j}) {{ if (tg_w{j}) {{ const {ty} stamp = {stamp}; const {ty} old = {xchg}; tg_fl |= old == stamp ? {FLAG_DUPLICATE}u : (old != 0 && {other} != tg_p + 1u ? {FLAG_CONFLICT}u : 0u); }} if (tg_wi{j}) tg_wi{j}[off] = {}u; }} }}",
                p.0,
                i.0 + 1
            )
        };
        // Each active lane checks its bounds and writes. A launch with an out-of-bounds lane
        // fails, so what its other lanes wrote is never seen (and a write another program reads
        // is a conflict the reference then settles). The check's barrier also makes the writes
        // visible to the block's later loads.
        self.line("{ u32 tg_ok = 0;");
        self.each_of(
            p,
            &format!(
                "if ({m}) {{ const i64 off = v{}[j]; if ((u64)off >= (u64)tg_n{j}) {fail} else {{ tg_b{j}[off] = {val}; tg_ok++; }} }}",
                p.0
            ),
        );
        self.line("tg_cs += tg_ok; }");
        let (narrow_marks, wide_marks) = (stamp_check(false), stamp_check(true));
        self.line(&format!("if (tg_w{j} || tg_wi{j}) {{ u32 tg_fl = 0; if (TG_WIDE) {{"));
        self.each_of(p, &wide_marks);
        self.line("} else {");
        self.each_of(p, &narrow_marks);
        self.line("}");
        self.line("if (tg_fl) atomicOr(TG_FLAGS, tg_fl); }");
        self.check(i);
    }

    fn atomic_add(&mut self, i: Inst, mask: bool) -> Result<(), GpuError> {
        let k = self.k;
        let d = k.inst(i);
        let (p, v) = (d.args[0], d.args[1]);
        let j = self.param_of(p);
        let dt = self.pointee(p);
        if let Some(&r) = d.results.first() {
            // Unused (launches that use the old values are ordered and run on the reference).
            self.declare(r);
            self.each(r, &format!("v{}[j] = ({})0;", r.0, ctype(dt)));
        }
        let m = if mask { format!("v{}[j]", d.args[2].0) } else { "true".into() };
        let (_, lane) = self.access_lane(p);
        self.flush();
        let fail = self.fail(i, ERR_OOB, lane, "off", &j.to_string());
        self.line("tg_nev++; tg_aseq++;");
        if i.0 > 0xffff {
            self.line(&format!("if (tg_ak{j}) atomicOr(TG_FLAGS, {FLAG_WRITERS}u);"));
        }
        // For blame: the last atomic on each element in program order has the largest key.
        let key = format!("(((u64)(tg_p + 1) << 32) | ((u64)(tg_aseq & 0xffffu) << 16) | {}ULL)", i.0 & 0xffff);
        let mark = format!(
            "tg_ca++; if (tg_a{j}) tg_mark(tg_a{j} + off, tg_p + 1); if (tg_ak{j}) {{ if (tg_aseq > 0xffffu) atomicOr(TG_FLAGS, {FLAG_WRITERS}u); atomicMax((unsigned long long*)(tg_ak{j} + off), (unsigned long long){key}); }}"
        );
        let x = format!("v{}[j]", v.0);
        let body = match dt {
            DType::I32 => format!("atomicAdd((int*)(tg_b{j} + off), {x});"),
            DType::I64 => format!("atomicAdd((unsigned long long*)(tg_b{j} + off), (unsigned long long){x});"),
            DType::I1 => {
                format!("if ({x}) {{ const u64 ad = (u64)(tg_b{j} + off); atomicOr((u32*)(ad & ~3ULL), 1u << (8 * (ad & 3ULL))); }}")
            }
            DType::F64 if !self.ordered => format!("atomicAdd((double*)(tg_b{j} + off), {x});"),
            DType::F32 if !self.ordered => format!("atomicAdd((float*)(tg_b{j} + off), {x});"),
            _ => {
                // Floats: logged, then added in program order when the program ends.
                self.float_atomics = true;
                let bits = if dt == DType::F64 { format!("(u64)__double_as_longlong({x})") } else { format!("(u64)__float_as_uint({x})") };
                let n = self.numel(p).max(1);
                self.line(&format!("const u32 tg_base{} = tg_alen; tg_alen += {n};", i.0));
                let body = format!(
                    "const i64 off = v{}[j]; const bool act = ({m}) && (u64)off < (u64)tg_n{j}; if (({m}) && !act) {fail} u64* le = TG_LOG + 3 * (u64)(tg_base{} + e); if (tg_base{} + e < TG_LOGCAP) {{ le[0] = act ? (u64)off : ~0ULL; le[1] = {j}; le[2] = {bits}; }} else atomicOr(TG_FLAGS, {FLAG_LOG_FULL}u); if (act) {{ {mark} }}",
                    p.0,
                    i.0,
                    i.0,
                );
                self.each_of(p, &body);
                self.check(i);
                return Ok(());
            }
        };
        self.each_of(
            p,
            &format!("if ({m}) {{ const i64 off = v{}[j]; if ((u64)off >= (u64)tg_n{j}) {fail} else {{ {body} {mark} }} }}", p.0),
        );
        self.check(i);
        Ok(())
    }

    fn loop_index(&mut self, i: Inst) -> usize {
        self.loops.push(i);
        self.loops.len() - 1
    }

    fn for_loop(&mut self, i: Inst, body: Block, max_iters: Option<u32>) -> Result<(), GpuError> {
        let k = self.k;
        let d = k.inst(i);
        let li = self.loop_index(i);
        for &r in &d.results {
            self.declare(r);
        }
        for (r, &init) in d.results.iter().zip(&d.args[3..]) {
            self.copy(*r, init);
        }
        // The bounds must not come from a failed lane's stand-in values.
        self.fence();
        let n = i.0;
        let step0 = self.message("loop step is zero".into());
        self.line(&format!(
            "const i64 tg_lo{n} = (i64)v{}[0], tg_hi{n} = (i64)v{}[0], tg_st{n} = (i64)v{}[0];",
            d.args[0].0, d.args[1].0, d.args[2].0
        ));
        let f = self.fail(i, ERR_RUNTIME, "0", "0", &step0.to_string());
        self.line(&format!("if (tg_st{n} == 0 && tid == 0) {f}"));
        self.check(i);
        self.flush();
        self.line(&format!(
            "const u64 tg_as{n} = tg_st{n} > 0 ? (u64)tg_st{n} : (u64)0 - (u64)tg_st{n}; const bool tg_pos{n} = tg_st{n} > 0 ? tg_hi{n} > tg_lo{n} : tg_lo{n} > tg_hi{n}; const u64 tg_span{n} = tg_st{n} > 0 ? (u64)tg_hi{n} - (u64)tg_lo{n} : (u64)tg_lo{n} - (u64)tg_hi{n}; const u64 tg_trips{n} = tg_pos{n} ? tg_span{n} / tg_as{n} + (tg_span{n} % tg_as{n} != 0) : 0;"
        ));
        if let Some(m) = max_iters {
            let f = self.fail(i, ERR_LOOP, "0", "0", &format!("tg_trips{n}"));
            self.line(&format!("if (tg_trips{n} > {m}ULL && tid == 0) {f}"));
            self.check(i);
            self.flush();
        }
        self.line(&format!("if (tid == 0) atomicMax((unsigned long long*)(TG_TRIPS + {li}), (unsigned long long)tg_trips{n} + 1ULL);"));
        let iv_ty = self.dtype(d.args[0]);
        let params = k.block(body).params.clone();
        self.line(&format!("for (u64 tg_t{n} = 0; tg_t{n} < tg_trips{n}; ++tg_t{n}) {{"));
        self.depth += 1;
        let ivp = params[0];
        self.declare(ivp);
        self.line(&format!("v{}[0] = ({})((u64)tg_lo{n} + (u64)tg_st{n} * tg_t{n});", ivp.0, ctype(iv_ty)));
        for (p, r) in params[1..].iter().zip(&d.results) {
            self.declare(*p);
            self.copy(*p, *r);
        }
        // An innermost loop's body with an odd number of scratch ops would have its first op
        // use the half its last one read the iteration before: the halves are flipped on odd
        // iterations instead (the parity is settled once the body is emitted), so that they
        // alternate across iterations too, and no barrier is needed at the end of the body.
        let innermost = !k.block(body).insts.iter().any(|&x| matches!(k.inst(x).op, Op::For { .. } | Op::While { .. } | Op::If { .. }));
        let parity = format!("TG_PARITY_{n}_");
        if innermost {
            self.parity = Some(parity.clone());
        }
        let (before, start) = (self.toggles, self.out.len());
        let ys = self.block(body)?;
        for (r, y) in d.results.iter().zip(ys) {
            self.copy(*r, y);
        }
        self.parity = None;
        let odd = (self.toggles - before) % 2 == 1;
        let flips = innermost && odd;
        let bit = if flips { format!("(int)(tg_t{n} & 1)") } else { "0".to_string() };
        let text = self.out.split_off(start).replace(&parity, &bit);
        self.out.push_str(&text);
        // One scratch op whose reads after its last barrier are apart from its writes before
        // its first: the next iteration's writes cannot meet this one's reads.
        let alone = self.toggles - before == 1 && self.tail_apart;
        if odd && !alone && !flips {
            self.fence();
        } else {
            self.flush();
        }
        self.depth -= 1;
        self.line("}");
        self.resident.clear();
        if flips {
            // After an odd number of iterations the next op's half is the last one's.
            self.fence();
        }
        Ok(())
    }

    fn while_loop(&mut self, i: Inst, cond: Block, body: Block, max_iters: Option<u32>) -> Result<(), GpuError> {
        let k = self.k;
        let d = k.inst(i);
        let li = self.loop_index(i);
        let n = i.0;
        for &r in &d.results {
            self.declare(r);
        }
        for (r, &init) in d.results.iter().zip(&d.args) {
            self.copy(*r, init);
        }
        self.fence();
        let limit = max_iters.map_or(tilegrad_reference::WHILE_LIMIT, u64::from);
        let endless = self.message(
            "this `while` loop can never end: an iteration changed neither memory nor its carried values (a spin lock \
             that no earlier program released? programs run in program order, so a program never waits on a later one)"
                .into(),
        );
        let unbounded = self.message(format!(
            "`while` loop ran more than {} iterations without ending (give it a `max_iters` bound if it is meant to)",
            tilegrad_reference::WHILE_LIMIT
        ));
        self.line(&format!("u64 tg_wt{n} = 0;"));
        self.line("for (;;) {");
        self.depth += 1;
        self.line(&format!("bool tg_go{n};"));
        self.line("{");
        self.depth += 1;
        let cparams = k.block(cond).params.clone();
        for (p, r) in cparams.iter().zip(&d.results) {
            self.declare(*p);
            self.copy(*p, *r);
        }
        let c = self.block(cond)?;
        // The loop may end here: scratch the condition read is fenced.
        self.fence();
        self.line(&format!("tg_go{n} = v{}[0];", c[0].0));
        self.depth -= 1;
        self.line("}");
        self.line(&format!("if (!tg_go{n}) break;"));
        self.line(&format!("tg_wt{n}++;"));
        let fail = match max_iters {
            Some(_) => self.fail(i, ERR_LOOP, "0", "0", &format!("tg_wt{n}")),
            None => self.fail(i, ERR_RUNTIME, "0", "0", &unbounded.to_string()),
        };
        self.line(&format!("if (tg_wt{n} > {limit}ULL && tid == 0) {fail}"));
        self.check(i);
        self.flush();
        self.line(&format!("const u64 tg_ev{n} = tg_nev; int tg_changed{n} = 0;"));
        self.line("{");
        self.depth += 1;
        let bparams = k.block(body).params.clone();
        for (p, r) in bparams.iter().zip(&d.results) {
            self.declare(*p);
            self.copy(*p, *r);
        }
        let ys = self.block(body)?;
        for (r, y) in d.results.iter().zip(ys) {
            // Changed, with the reference's `==` (a NaN always counts as a change).
            let cmp = format!("if (!(v{}[j] == v{}[j])) tg_changed{n} = 1;", r.0, y.0);
            if self.scalar(*r) {
                self.line(&format!("{{ const int j = 0; {cmp} }}"));
            } else {
                self.each(*r, &cmp);
            }
            self.copy(*r, y);
        }
        self.fence();
        self.depth -= 1;
        self.line("}");
        let f = self.fail(i, ERR_RUNTIME, "0", "0", &endless.to_string());
        self.line(&format!("if (!__syncthreads_or(tg_changed{n}) && tg_nev == tg_ev{n} && tid == 0) {f}"));
        self.check(i);
        self.flush();
        self.depth -= 1;
        self.line("}");
        self.line(&format!("if (tid == 0) atomicMax((unsigned long long*)(TG_TRIPS + {li}), (unsigned long long)tg_wt{n} + 1ULL);"));
        Ok(())
    }

    fn emit_entry(&self, src: &mut String, body: &str) {
        let k = self.k;
        let nt = self.nt;
        let _ = writeln!(src, "\n// kernel `{}`", k.name);
        let min_blocks = self.min_blocks;
        let _ = writeln!(src, "extern \"C\" __global__ void __launch_bounds__({nt}, {min_blocks}) {ENTRY}(const TgArgs A) {{");
        // The argument block is a kernel parameter: read from the constant bank where used,
        // holding no registers.
        src.push_str(
            "    __shared__ u32 tg_sh_p[2]; __shared__ u64 tg_sh_key;\n\
             \x20   const int tid = threadIdx.x;\n\
             #define TG_G0 ((u32)A.w[0])\n#define TG_G1 ((u32)A.w[1])\n#define TG_G2 ((u32)A.w[2])\n#define TG_TOTAL (A.w[3])\n\
             #define TG_NEXT ((u32*)A.w[4])\n#define TG_TICKET ((u32*)A.w[5])\n#define TG_LOGMAX ((u32*)A.w[4] + 2)\n#define TG_ERR ((u64*)A.w[6])\n\
             #define TG_FLAGS ((u32*)A.w[7])\n#define TG_COUNT ((u64*)A.w[8])\n#define TG_TRIPS ((u64*)A.w[8] + 3)\n\
             #define TG_LOG ((u64*)A.w[11] + 3 * A.w[12] * (u64)blockIdx.x)\n#define TG_LOGCAP (A.w[12])\n\
             #define TG_POISON (A.w[13] != 0)\n#define TG_WIDE (A.w[14] != 0)\n\
             \x20   u64 tg_cl = 0, tg_cs = 0, tg_ca = 0;\n",
        );
        let _ = writeln!(src, "#define TG_HALF {}", self.scratch);
        if 2 * self.scratch <= SHARED_SCRATCH {
            // Small scratch in shared memory (a static size, so loads from it are `ld.shared`).
            let _ = writeln!(src, "    __shared__ __align__(16) unsigned char scr[{}]; (void)scr;", (2 * self.scratch).max(16));
        } else {
            let _ = writeln!(src, "#define scr ((unsigned char*)A.w[9] + (u64)blockIdx.x * A.w[10])");
        }
        for (j, p) in k.params.iter().enumerate() {
            match &p.kind {
                tilegrad_ir::ParamKind::Ptr(d) => {
                    let w = HEADER_WORDS + PTR_WORDS * j;
                    if !self.marks {
                        let _ = writeln!(
                            src,
                            "#define tg_b{j} (({st}*)A.w[{w}])\n#define tg_n{j} ((i64)A.w[{}])\n#define tg_w{j} ((u64*)0)\n#define tg_r{j} ((u32*)0)\n#define tg_a{j} ((u32*)0)\n#define tg_wi{j} ((u32*)0)\n#define tg_ak{j} ((u64*)0)",
                            w + 1,
                            st = storage(*d)
                        );
                        continue;
                    }
                    let _ = writeln!(
                        src,
                        "#define tg_b{j} (({st}*)A.w[{w}])\n#define tg_n{j} ((i64)A.w[{}])\n#define tg_w{j} ((u64*)A.w[{}])\n#define tg_r{j} ((u32*)A.w[{}])\n#define tg_a{j} ((u32*)A.w[{}])\n#define tg_wi{j} ((u32*)A.w[{}])\n#define tg_ak{j} ((u64*)A.w[{}])",
                        w + 1,
                        w + 2,
                        w + 3,
                        w + 4,
                        w + 5,
                        w + 6,
                        st = storage(*d)
                    );
                }
                tilegrad_ir::ParamKind::Scalar(_) | tilegrad_ir::ParamKind::Constexpr(..) => {}
            }
        }
        // Programs from a counter: the next one is taken before the barrier that ends the
        // current one (into the other slot), except where float atomics pass a turn from
        // program to program, which every program taken must take.
        src.push_str("    if (tid == 0) { tg_sh_p[0] = atomicAdd(TG_NEXT, 1u); tg_sh_key = ~0ULL; }\n    __syncthreads();\n");
        let _ = writeln!(src, "    for (u32 tg_it = 0;; ++tg_it) {{");
        src.push_str(
            "        const u32 tg_p = tg_sh_p[tg_it & 1u];\n\
             \x20       if ((u64)tg_p >= TG_TOTAL) break;\n\
             \x20       int tg_stopped = 0;\n\
             \x20       const int pid0 = (int)(tg_p % TG_G0); const int pid1 = (int)((tg_p / TG_G0) % TG_G1); const int pid2 = (int)(tg_p / (TG_G0 * TG_G1));\n\
             \x20       (void)pid0; (void)pid1; (void)pid2;\n\
             \x20       u64 tg_eo = 0, tg_ea = 0, tg_key = ~0ULL;\n\
             \x20       u64 tg_nev = 0; u32 tg_sseq = 0; u32 tg_aseq = 0; u32 tg_alen = 0; (void)tg_nev; (void)tg_sseq; (void)tg_aseq; (void)tg_alen;\n\
             \x20       (void)tg_eo; (void)tg_ea; (void)tg_key;\n",
        );
        // A thread keeps its first failure; the block's first is the smallest key (failure
        // site, then lane). A failed program ends its block's work: the key is never reset.
        let _ = writeln!(src, "#define TG_FAIL(site, lane, off, aux) {{ if (tg_key == ~0ULL) {{ tg_key = ((u64)(site) << 32) | (u64)(u32)(lane); tg_eo = (off); tg_ea = (aux); atomicMin((unsigned long long*)&tg_sh_key, (unsigned long long)tg_key); }} }}");
        let _ = writeln!(src, "#define TG_SYNC {{ if (__syncthreads_or(tg_key != ~0ULL)) {{ if (tg_key == tg_sh_key) {{ u64* er = TG_ERR + {ERR_WORDS} * (u64)blockIdx.x; er[0] = tg_p; er[1] = tg_key >> 32; er[2] = 0; er[3] = tg_key & 0xffffffffULL; er[4] = tg_eo; er[5] = tg_ea; }} tg_stopped = 1; goto tg_end; }} }}");
        for (j, p) in k.params.iter().enumerate() {
            let v = p.value.0;
            match &p.kind {
                tilegrad_ir::ParamKind::Ptr(_) => {
                    let _ = writeln!(src, "        i64 v{v}[1] = {{0}}; (void)v{v};");
                }
                tilegrad_ir::ParamKind::Scalar(d) | tilegrad_ir::ParamKind::Constexpr(d, _) => {
                    let w = format!("A.w[{}]", HEADER_WORDS + PTR_WORDS * k.params.len() + j);
                    let e = match d {
                        DType::I1 => format!("({w} != 0)"),
                        DType::I32 => format!("(int)(i64){w}"),
                        DType::I64 => format!("(i64){w}"),
                        DType::F64 => format!("__longlong_as_double((i64){w})"),
                        // f16/bf16/f32 scalars arrive as the f32 bits of their value.
                        _ => format!("__uint_as_float((u32){w})"),
                    };
                    let _ = writeln!(src, "        const {} v{v}[1] = {{ {e} }}; (void)v{v};", ctype(*d));
                }
            }
        }
        src.push_str("        {\n");
        src.push_str(body);
        src.push_str("        }\n        tg_end: ;\n");
        if !self.float_atomics {
            src.push_str("        if (tid == 0 && !tg_stopped) tg_sh_p[(tg_it + 1u) & 1u] = atomicAdd(TG_NEXT, 1u);\n");
        }
        src.push_str("        const int tg_stop = __syncthreads_or(tg_stopped);\n");
        if self.float_atomics {
            // Float atomics in program order: wait for this program's turn, add its logged
            // contributions (each element's in log order, by the thread its address hashes to),
            // then pass the turn on. Every program takes its turn, failed or not.
            // A log too short: the longest one wanted, for the launch run again.
            src.push_str("        if (tid == 0 && tg_alen > TG_LOGCAP) atomicMax(TG_LOGMAX, tg_alen);\n");
            src.push_str("        if (tid == 0) { while (atomicAdd(TG_TICKET, 0u) != tg_p) { } }\n        __syncthreads();\n        __threadfence();\n");
            // Once some log ran out the launch runs again: no program adds its log.
            let _ =
                writeln!(src, "        const int tg_full = __syncthreads_or(tid == 0 && (*(volatile u32*)TG_FLAGS & {FLAG_LOG_FULL}u));");
            src.push_str("        if (!tg_stop && !tg_full) {\n            const u32 tg_n = tg_alen < TG_LOGCAP ? tg_alen : (u32)TG_LOGCAP;\n            for (u32 q = 0; q < tg_n; ++q) {\n                const u64* le = TG_LOG + 3 * (u64)q;\n                if (le[0] == ~0ULL) continue;\n                const i64 off = (i64)le[0];\n                switch ((int)le[1]) {\n");
            for (j, p) in k.params.iter().enumerate() {
                if let tilegrad_ir::ParamKind::Ptr(dt) = &p.kind {
                    if !dt.is_float() {
                        continue;
                    }
                    let add = match dt {
                        DType::F64 => format!("volatile double* x = (volatile double*)(tg_b{j} + off); if ((((u64)(tg_b{j} + off)) / 8) % {nt} == (u64)tid) *x = *x + __longlong_as_double((i64)le[2]);"),
                        DType::F32 => format!("volatile float* x = (volatile float*)(tg_b{j} + off); if ((((u64)(tg_b{j} + off)) / 4) % {nt} == (u64)tid) *x = *x + __uint_as_float((u32)le[2]);"),
                        DType::F16 => format!("volatile u16* x = (volatile u16*)(tg_b{j} + off); if ((((u64)(tg_b{j} + off)) / 2) % {nt} == (u64)tid) *x = tg_f2h(tg_f16((double)(tg_h2f(*x) + __uint_as_float((u32)le[2]))));"),
                        _ => format!("volatile u16* x = (volatile u16*)(tg_b{j} + off); if ((((u64)(tg_b{j} + off)) / 2) % {nt} == (u64)tid) *x = tg_f2bf(tg_bf16((double)(tg_bf2f(*x) + __uint_as_float((u32)le[2]))));"),
                    };
                    let _ = writeln!(src, "                    case {j}: {{ {add} }} break;");
                }
            }
            src.push_str("                    default: break;\n                }\n            }\n        }\n        __threadfence();\n        __syncthreads();\n        if (tid == 0) atomicExch(TG_TICKET, tg_p + 1);\n");
        }
        src.push_str("        if (tg_stop) break;\n");
        if self.float_atomics {
            src.push_str("        if (tid == 0) tg_sh_p[(tg_it + 1u) & 1u] = atomicAdd(TG_NEXT, 1u);\n        __syncthreads();\n");
        }
        src.push_str("#undef TG_FAIL\n#undef TG_SYNC\n    }\n");
        src.push_str("    if (tg_cl) atomicAdd((unsigned long long*)TG_COUNT, (unsigned long long)tg_cl);\n    if (tg_cs) atomicAdd((unsigned long long*)(TG_COUNT + 1), (unsigned long long)tg_cs);\n    if (tg_ca) atomicAdd((unsigned long long*)(TG_COUNT + 2), (unsigned long long)tg_ca);\n}\n");
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
