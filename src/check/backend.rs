//! Where a check's launches run: the CPU reference interpreter, or the GPU backend
//! (`tilegrad-gpu`), which gives the same results and the same errors. One [`Executor`] serves a
//! whole check and keeps count of where each launch ran, for the report.

use super::{Backend, CheckError};
use std::sync::{Arc, Mutex, OnceLock};
use tilegrad_gpu::{DeviceMemory, Gpu, GpuError, GpuOptions, RanOn};
use tilegrad_reference::{Data, ExecError, Grid, Launch, LaunchSummary, Memory};

/// The process's GPU, created on first use (a CUDA context costs a fraction of a second).
fn gpu() -> Result<Arc<Gpu>, String> {
    static GPU: OnceLock<Result<Arc<Gpu>, String>> = OnceLock::new();
    GPU.get_or_init(|| Gpu::new().map(Arc::new).map_err(|e| e.to_string())).clone()
}

/// Runs launches on the chosen backend (for a whole check, or for the Python package's launches).
pub struct Executor {
    gpu: Option<Arc<Gpu>>,
    /// Also run every launch on the reference and record where the two differ (tests).
    compare: bool,
    /// VJP kernels add in program order ([`Executor::deterministic`]).
    ordered_vjp: bool,
    /// Bytes a VJP kernel's launch may take ([`Executor::vjp_memory`]).
    vjp_memory: Option<u64>,
    /// Programs a launch may run ([`Executor::max_programs`]).
    max_programs: u64,
    /// Why `--backend auto` runs on the CPU.
    fallback: Option<String>,
    log: Mutex<Log>,
}

/// The programs a launch may run unless raised ([`Executor::max_programs`]): at a microsecond
/// a program at the least, about a minute of work; a grid larger than this is likelier a typo
/// or a size in elements where one in blocks was meant.
pub const DEFAULT_MAX_PROGRAMS: u64 = 1 << 26;

#[derive(Default)]
struct Log {
    on_gpu: usize,
    on_reference: Vec<(String, String)>,
    /// Launches on the GPU whose float atomics added in the device's order, and why.
    device_order: Vec<(String, String)>,
    mismatches: Vec<String>,
}

impl Executor {
    /// The reference interpreter only.
    pub fn cpu() -> Executor {
        Executor {
            gpu: None,
            compare: false,
            ordered_vjp: false,
            vjp_memory: None,
            max_programs: DEFAULT_MAX_PROGRAMS,
            fallback: None,
            log: Mutex::default(),
        }
    }

    /// The executor of a backend choice: `Gpu` fails when no GPU is usable, `Auto` then uses the
    /// CPU.
    pub fn new(backend: Backend) -> Result<Executor, CheckError> {
        let mut fallback = None;
        let gpu = match backend {
            Backend::Cpu => None,
            // `Auto` uses the CPU where the GPU's context cannot be created either, and says why.
            Backend::Auto => match gpu().and_then(|g| g.ready().map(|_| g).map_err(|e| e.to_string())) {
                Ok(g) => Some(g),
                Err(e) => {
                    fallback = Some(e.to_string());
                    None
                }
            },
            Backend::Gpu | Backend::Compare => Some(gpu().map_err(|e| CheckError::Unsupported(format!("--backend gpu: {e}")))?),
        };
        Ok(Executor {
            gpu,
            compare: backend == Backend::Compare,
            ordered_vjp: false,
            vjp_memory: None,
            max_programs: DEFAULT_MAX_PROGRAMS,
            fallback,
            log: Mutex::default(),
        })
    }

    /// VJP kernels add their float atomics in program order on the GPU too, as the reference
    /// does (programs take turns): the ground truth is then the same bit for bit on every run
    /// and on both backends, where the hardware's order makes f64 sums differ by ~1e-16.
    pub fn deterministic(mut self, on: bool) -> Executor {
        self.ordered_vjp = on;
        self
    }

    /// Why `launch`'s VJP kernel cannot run here, where it cannot: on the GPU in program order
    /// (`--deterministic`) a program keeps its float adds in a log until its turn, so a VJP
    /// kernel would miss its own adds into the cotangent of what its launch loads after storing
    /// it (`loads_after_own_writes`): the reverse adds the load's cotangent, then reads it back
    /// at the store. The
    /// evaluator differentiates such a launch instead (see `check::ground`).
    pub fn refuses_vjp_kernel(&self, launch: &Launch) -> Option<tilegrad_ad::AdError> {
        if !(self.on_gpu() && self.ordered_vjp && loads_after_own_writes(launch.kernel())) {
            return None;
        }
        let k = launch.kernel();
        Some(tilegrad_ad::AdError::Unsupported {
            kernel: k.name.clone(),
            op: "kernel".into(),
            loc: k.loc.clone(),
            message: "it reads a tensor it writes, and with `--deterministic` the GPU adds a program's cotangents in \
                      its turn, after the program would read them back"
                .into(),
        })
    }

    /// The GPU launches go to, if any.
    pub fn gpu(&self) -> Option<&Gpu> {
        self.gpu.as_deref()
    }

    /// Whether launches go to the GPU.
    pub fn on_gpu(&self) -> bool {
        self.gpu.is_some()
    }

    /// Whether every launch runs on the reference too, to compare ([`Backend::Compare`]).
    pub fn comparing(&self) -> bool {
        self.compare
    }

    /// Compiles ahead, in parallel, kernels about to be launched on the GPU (nothing on the
    /// CPU): `(kernel, whether it is a VJP kernel, programs of its largest launch)` (VJP kernels
    /// run with float atomics in the hardware's order, see [`Executor::run_vjp`]; the programs,
    /// an estimate, say whether the forms for large launches are worth compiling).
    pub fn precompile(&self, kernels: &[(&tilegrad_ir::Kernel, bool, u64)]) {
        if let Some(g) = &self.gpu {
            g.precompile(&self.flavored(kernels));
        }
    }

    /// [`Executor::precompile`] in the background: for kernels launched later, while other work
    /// runs (a launch of one waits for its compile); with `other_forms`, also the forms for
    /// fewer blocks an SM of large launches, for a process that launches them again
    /// ([`tilegrad_gpu::Gpu::precompile_in_background`]).
    pub fn precompile_in_background(&self, kernels: &[(&tilegrad_ir::Kernel, bool, u64)], other_forms: bool) {
        if let Some(g) = &self.gpu {
            g.precompile_in_background(&self.flavored(kernels), other_forms);
        }
    }

    /// Kernels with the flavors `run` and `run_vjp` launch them in (a traced run adds writers to
    /// marks it has).
    fn flavored<'k>(
        &self,
        kernels: &[(&'k tilegrad_ir::Kernel, bool, u64)],
    ) -> Vec<(&'k tilegrad_ir::Kernel, tilegrad_gpu::codegen::Flavor, u64)> {
        let flavor = |vjp: bool| tilegrad_gpu::codegen::Flavor { ordered: !vjp || self.ordered_vjp, marks: !vjp, wide: false };
        kernels.iter().map(|&(k, vjp, programs)| (k, flavor(vjp), programs)).collect()
    }

    /// VJP kernels' launches take at most `bytes` ([`Executor::vjp_launch_memory`]).
    pub fn vjp_memory(mut self, bytes: Option<u64>) -> Executor {
        self.vjp_memory = bytes;
        self
    }

    /// Launches may run at most `programs` programs each (default [`DEFAULT_MAX_PROGRAMS`]).
    pub fn max_programs(mut self, programs: u64) -> Executor {
        self.max_programs = programs;
        self
    }

    /// Refuses a launch of `kernel` on `grid` with more programs than
    /// [`Executor::max_programs`] allows, saying how long it would take at the least.
    pub fn check_grid(&self, kernel: &str, grid: Grid) -> Result<(), String> {
        let programs = grid.programs();
        if programs <= self.max_programs {
            return Ok(());
        }
        let threads = rayon::current_num_threads().max(1) as u64;
        let secs = programs / threads / 1_000_000;
        Err(format!(
            "kernel `{kernel}` on grid {:?}: {programs} programs, more than the {} a launch may run (at a microsecond a \
             program on {threads} threads, at least {}); raise the limit with `--max-programs` (`max_programs=` in Python) if the grid is meant",
            grid.0,
            self.max_programs,
            duration(secs)
        ))
    }

    /// Bytes a VJP kernel's launch may take where it runs (its tensors, shadows and tapes; see
    /// [`tilegrad_ad::vjp_kernel::gradient_by_kernel`]): as [`Executor::vjp_memory`] set it,
    /// else on the GPU most of the device memory free now, on the CPU 4 GiB or `host_budget`
    /// where larger, but at most a quarter of what the process may still take (the tapes are
    /// host memory the reference writes: a tape's tensor and each program's pages of it).
    pub fn vjp_launch_memory(&self, host_budget: u64) -> u64 {
        if let Some(b) = self.vjp_memory {
            return b;
        }
        match self.gpu.as_ref().map(|g| g.free_memory()) {
            // A margin for the launch's own buffers (error words, scratch) and the allocator.
            Some(Ok(free)) => free / 10 * 8,
            Some(Err(_)) | None => {
                let cpu = host_budget.max(4 << 30);
                tilegrad_reference::available_memory().map_or(cpu, |a| cpu.min(a / 4))
            }
        }
    }

    /// Runs a launch, as [`Launch::run`] does.
    pub fn run(&self, launch: &Launch, mem: &mut Memory) -> Result<LaunchSummary, ExecError> {
        let Some(g) = &self.gpu else { return launch.run(mem) };
        let before = self.compare.then(|| mem.clone());
        let out = self.on(g, launch, mem, GpuOptions::default());
        if let Some(mut m) = before {
            let want = launch.run(&mut m);
            if let Some(d) = differ(launch, &want, &out, &m, mem, false) {
                self.log.lock().expect("executor log").mismatches.push(d);
            }
        }
        out
    }

    /// Runs a VJP kernel's launch ([`tilegrad_ad::vjp_kernel()`]): on the GPU without race marks
    /// and with float atomics in the hardware's order unless [`Executor::deterministic`] (the
    /// forward it differentiates was run with every check). With [`Backend::Compare`] the
    /// reference runs it too: in program order the two must agree bit for bit; in the
    /// hardware's order the shadows' sums differ by rounding, so float tensors must agree
    /// within `VJP_F64_TOLERANCE` (f64) or `VJP_F32_TOLERANCE` of their largest element.
    pub fn run_vjp(&self, launch: &Launch, mem: &mut Memory) -> Result<LaunchSummary, ExecError> {
        let Some(g) = &self.gpu else { return launch.run(mem) };
        let before = self.compare.then(|| mem.clone());
        let out = self.on(g, launch, mem, self.vjp_options());
        if let Some(mut m) = before {
            let want = launch.run(&mut m);
            let rounding = !self.ordered_vjp;
            if let Some(d) = differ(launch, &want, &out, &m, mem, rounding) {
                self.log.lock().expect("executor log").mismatches.push(d);
            }
        }
        out
    }

    /// Runs a launch on the GPU with `opts`, logging where it ran.
    fn on(&self, g: &Gpu, launch: &Launch, mem: &mut Memory, opts: GpuOptions) -> Result<LaunchSummary, ExecError> {
        let out = g.run(launch, mem, opts);
        match self.logged(launch, out) {
            Ok(r) => r,
            // Not the launch's fault (said in the log): the reference runs it.
            Err(()) => launch.run(mem),
        }
    }

    /// Runs a launch on device memory in place, as [`Executor::run`] (the GPU backend only: on
    /// the CPU it is an error). Where the GPU fails, not the launch, the reference runs it over
    /// host copies of the memory, and the report says why.
    pub fn run_in_place(&self, launch: &Launch, mem: &DeviceMemory) -> Result<LaunchSummary, GpuError> {
        self.in_place(launch, mem, GpuOptions::default())
    }

    /// Runs a VJP kernel's launch on device memory in place, as [`Executor::run_vjp`] runs it
    /// on host memory (without the comparison with the reference).
    pub fn run_vjp_in_place(&self, launch: &Launch, mem: &DeviceMemory) -> Result<LaunchSummary, GpuError> {
        self.in_place(launch, mem, self.vjp_options())
    }

    /// How VJP kernels run on the GPU: without race marks, float atomics in the hardware's order
    /// unless [`Executor::deterministic`].
    fn vjp_options(&self) -> GpuOptions {
        GpuOptions { races: false, ordered_atomics: self.ordered_vjp, exact_order: self.ordered_vjp }
    }

    fn in_place(&self, launch: &Launch, mem: &DeviceMemory, opts: GpuOptions) -> Result<LaunchSummary, GpuError> {
        let Some(g) = &self.gpu else {
            return Err(GpuError::Unavailable("device memory is used in place by the GPU backend only".into()));
        };
        let out = g.run_in_place(launch, mem, opts);
        match self.logged(launch, out) {
            Ok(r) => r.map_err(GpuError::Exec),
            Err(()) => g.reference_in_place(launch, mem, "the GPU failed").map(|o| o.summary),
        }
    }

    /// Logs where a launch ran: its result, or `Err` where the GPU failed for a reason of its own
    /// (logged as a launch passed to the reference, which the caller must then run).
    fn logged(&self, launch: &Launch, out: Result<tilegrad_gpu::Outcome, GpuError>) -> Result<Result<LaunchSummary, ExecError>, ()> {
        let mut log = self.log.lock().expect("executor log");
        match out {
            Ok(o) => {
                match o.ran_on {
                    RanOn::Gpu => log.on_gpu += 1,
                    RanOn::GpuDeviceOrder(why) => {
                        log.on_gpu += 1;
                        log.device_order.push((launch.kernel().name.clone(), why));
                    }
                    RanOn::Reference(why) => log.on_reference.push((launch.kernel().name.clone(), why)),
                }
                Ok(Ok(o.summary))
            }
            Err(GpuError::Exec(e)) => {
                log.on_gpu += 1;
                Ok(Err(e))
            }
            Err(e) => {
                log.on_reference.push((launch.kernel().name.clone(), format!("the GPU failed ({e})")));
                Err(())
            }
        }
    }

    /// Where launches ran, for the report: `cpu`, or the GPU and the launches it passed on.
    pub fn describe(&self) -> String {
        let Some(g) = &self.gpu else {
            return match &self.fallback {
                Some(why) => format!("cpu (--backend auto: {why})"),
                None => "cpu".into(),
            };
        };
        let log = self.log.lock().expect("executor log");
        let whys = |list: &[(String, String)]| {
            let mut whys: Vec<String> = Vec::new();
            for (k, why) in list {
                let w = format!("`{k}`: {why}");
                if !whys.contains(&w) {
                    whys.push(w);
                }
            }
            whys.join("; ")
        };
        let mut s = format!("gpu: {}; {} launches on the GPU", g.describe(), log.on_gpu);
        if !log.device_order.is_empty() {
            s += &format!(" ({} adding float atomics in the device's order: {})", log.device_order.len(), whys(&log.device_order));
        }
        if !log.on_reference.is_empty() {
            s += &format!(", {} on the reference ({})", log.on_reference.len(), whys(&log.on_reference));
        }
        s
    }

    /// Where the GPU and the reference differed (with [`Backend::Compare`]).
    pub fn mismatches(&self) -> Vec<String> {
        self.log.lock().expect("executor log").mismatches.clone()
    }
}

/// How far a VJP kernel's f64 tensors may be from the reference's, relative to their largest
/// element, where its float atomics add in the hardware's order.
pub const VJP_F64_TOLERANCE: f64 = 1e-12;
/// [`VJP_F64_TOLERANCE`] for f32, f16 and bf16 tensors (VJP kernels computing in f32).
pub const VJP_F32_TOLERANCE: f64 = 1e-4;

/// Whether two runs of one launch differ: in outcome, error, summary counts, or any element of
/// any tensor but scratch ([`first_difference`]; with `rounding`, as VJP kernels' sums in the
/// hardware's order allow).
fn differ(
    launch: &Launch,
    want: &Result<LaunchSummary, ExecError>,
    got: &Result<LaunchSummary, ExecError>,
    want_mem: &Memory,
    got_mem: &Memory,
    rounding: bool,
) -> Option<String> {
    let k = &launch.kernel().name;
    match (want, got) {
        (Err(a), Err(b)) => {
            return (a.to_string() != b.to_string()).then(|| format!("`{k}`: the reference fails with\n  {a}\nthe GPU with\n  {b}"));
        }
        (Err(a), Ok(_)) => return Some(format!("`{k}`: the reference fails ({a}), the GPU does not")),
        (Ok(_), Err(b)) => return Some(format!("`{k}`: the GPU fails ({b}), the reference does not")),
        (Ok(a), Ok(b)) => {
            let counts = |s: &LaunchSummary| {
                (s.programs, s.elements_loaded, s.elements_stored, s.elements_atomic, s.max_trips.clone(), s.writers.clone())
            };
            if counts(a) != counts(b) {
                let (ca, cb) = (counts(a), counts(b));
                if ca.5 != cb.5 {
                    let at =
                        ca.5.iter()
                            .zip(&cb.5)
                            .find_map(|(x, y)| x.iter().zip(y.iter()).position(|(a, b)| a != b).map(|e| (x.tensor, e, x.of(e), y.of(e))));
                    return Some(format!("`{k}`: writers differ (tensor, element, reference, GPU): {at:?}"));
                }
                return Some(format!(
                    "`{k}`: summaries differ: reference {:?}, GPU {:?}",
                    (ca.0, ca.1, ca.2, ca.3, ca.4),
                    (cb.0, cb.1, cb.2, cb.3, cb.4)
                ));
            }
        }
    }
    // Scratch (a VJP kernel's tapes) is the launch's own: not copied back from the GPU.
    let scratch = |id: tilegrad_reference::TensorId| {
        let bound: Vec<&String> = launch.args().iter().filter(|(_, a)| *a == tilegrad_reference::Arg::Tensor(id)).map(|(n, _)| n).collect();
        !bound.is_empty() && bound.iter().all(|n| launch.get_options().scratch.contains(n))
    };
    for i in 0..want_mem.len() {
        let id = tilegrad_reference::TensorId(i as u32);
        if scratch(id) {
            continue;
        }
        if let Some(e) = first_difference(want_mem.get(id).data(), got_mem.get(id).data(), rounding) {
            return Some(format!(
                "`{k}`: tensor `{}` differs at element {e}: reference {}, GPU {}",
                want_mem.name(id),
                want_mem.get(id).get_f64(e),
                got_mem.get(id).get_f64(e)
            ));
        }
    }
    None
}

/// The first element where two runs' tensors differ: integers bit for bit; floats the same bits,
/// or both NaN, or within a tolerance of the reference's largest finite element: f32 none and
/// f64 1e-13 (CUDA's and libm's `exp`, `log`, `tanh`, ... may differ in the last bit, and a sum
/// that cancels makes that larger relative to its result), or with `rounding` (sums in another
/// order) [`VJP_F32_TOLERANCE`] and [`VJP_F64_TOLERANCE`].
fn first_difference(a: &Data, b: &Data, rounding: bool) -> Option<usize> {
    fn first<T: Copy>(a: &[T], b: &[T], same: impl Fn(T, T) -> bool) -> Option<usize> {
        if a.len() != b.len() {
            return Some(a.len().min(b.len()));
        }
        a.iter().zip(b).position(|(&x, &y)| !same(x, y))
    }
    fn floats<T: Copy + Into<f64>>(a: &[T], b: &[T], tol: f64) -> Option<usize> {
        let scale = a.iter().map(|&v| v.into()).filter(|v: &f64| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs()));
        first(a, b, |p, q| {
            let (p, q): (f64, f64) = (p.into(), q.into());
            p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()) || (tol > 0.0 && (p - q).abs() <= tol * scale)
        })
    }
    match (a, b) {
        (Data::F32(x), Data::F32(y)) => floats(x, y, if rounding { VJP_F32_TOLERANCE } else { 0.0 }),
        (Data::F64(x), Data::F64(y)) => floats(x, y, if rounding { VJP_F64_TOLERANCE } else { 1e-13 }),
        (Data::I32(x), Data::I32(y)) => first(x, y, |p, q| p == q),
        (Data::I64(x), Data::I64(y)) => first(x, y, |p, q| p == q),
        (Data::I1(x), Data::I1(y)) => first(x, y, |p, q| p == q),
        _ => Some(0),
    }
}

/// `secs` seconds in words, in the largest unit that keeps it above one.
fn duration(secs: u64) -> String {
    match secs {
        s if s >= 7200 => format!("{} hours", s / 3600),
        s if s >= 120 => format!("{} minutes", s / 60),
        s => format!("{s} seconds"),
    }
}

/// Whether kernel `k` may load, in a program, from a tensor it stored or added into before in
/// that program (in instruction order; in a loop, a trip after another).
pub(crate) fn loads_after_own_writes(k: &tilegrad_ir::Kernel) -> bool {
    use tilegrad_ir::Op;
    fn walk(k: &tilegrad_ir::Kernel, blk: tilegrad_ir::Block, src: &[Vec<bool>], written: &mut Vec<bool>) -> bool {
        for &i in &k.block(blk).insts {
            let d = k.inst(i);
            match &d.op {
                Op::Load { .. } => {
                    if src[d.args[0].index()].iter().zip(written.iter()).any(|(&s, &w)| s && w) {
                        return true;
                    }
                }
                Op::Store { .. } | Op::AtomicAdd { .. } | Op::AtomicRmw { .. } | Op::AtomicCas => {
                    for (w, &s) in written.iter_mut().zip(&src[d.args[0].index()]) {
                        *w |= s;
                    }
                }
                Op::If { then_block, else_block } => {
                    let mut other = written.clone();
                    if walk(k, *then_block, src, written) || walk(k, *else_block, src, &mut other) {
                        return true;
                    }
                    for (w, o) in written.iter_mut().zip(other) {
                        *w |= o;
                    }
                }
                // Twice: a later trip after an earlier one.
                op => {
                    for _ in 0..2 {
                        for b in op.blocks() {
                            if walk(k, b, src, written) {
                                return true;
                            }
                        }
                    }
                }
            }
        }
        false
    }
    let src = tilegrad_ir::analysis::pointer_sources(k);
    let mut written = vec![false; k.params.len()];
    walk(k, k.body, &src, &mut written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tilegrad_ir::{DType, KernelBuilder};
    use tilegrad_reference::HostTensor;

    #[test]
    fn a_grid_past_the_limit_is_refused_with_the_kernel_the_grid_and_the_least_time() {
        let e = Executor::cpu().max_programs(1000);
        assert!(e.check_grid("k", Grid([1000, 1, 1])).is_ok());
        let m = e.check_grid("k", Grid([100, 20, 1])).unwrap_err();
        assert!(m.contains("kernel `k` on grid [100, 20, 1]: 2000 programs, more than the 1000"), "{m}");
        assert_eq!((duration(59), duration(7200), duration(600)), ("59 seconds".into(), "2 hours".into(), "10 minutes".into()));
    }

    /// Two runs' memories: an f64 tensor (sums of about 1), an f32 one and an i64 one, the
    /// second run's f64 elements moved by `df` (element 2 a NaN where `nan`), its f32 ones by
    /// `ds`, and element 0 of its i64 tensor by `di`.
    fn runs(df: f64, ds: f32, di: i64, nan: bool) -> (Memory, Memory) {
        let make = |df: f64, ds: f32, di: i64, nan: bool| {
            let mut m = Memory::new();
            let x = (0..5).map(|i| if nan && i == 2 { f64::NAN } else { 0.3 + i as f64 * 0.17 + df }).collect();
            m.add("d_x", HostTensor::from_f64(&[5], x));
            m.add("d_w", HostTensor::from_f32(&[3], vec![1.5 + ds, -0.25 + ds, 0.75]));
            m.add("n", HostTensor::from_i64(&[2], vec![7 + di, 9]));
            m
        };
        (make(0.0, 0.0, 0, false), make(df, ds, di, nan))
    }

    #[test]
    fn vjp_launches_agree_within_rounding_and_plain_launches_bit_for_bit() {
        let mut b = KernelBuilder::new("k_vjp");
        let _ = b.ptr_param("d_x", DType::F64);
        let k = b.finish().unwrap();
        let launch = Launch::new(&k, 1);
        let ok = || -> Result<LaunchSummary, ExecError> { Ok(LaunchSummary::default()) };
        let d = |df, ds, di, rounding| {
            let (a, b) = runs(df, ds, di, false);
            differ(&launch, &ok(), &ok(), &a, &b, rounding)
        };
        // Equal runs agree either way.
        assert_eq!(d(0.0, 0.0, 0, false), None);
        assert_eq!(d(0.0, 0.0, 0, true), None);
        // Rounding of the sums: f64 within 1e-12 of the largest element, f32 within 1e-4.
        assert_eq!(d(1e-15, 1e-6, 0, true), None);
        // ... which plain launches do not allow (f32 bit for bit, f64 within 1e-13 for libm's
        // last bits).
        assert!(d(0.0, 1e-6, 0, false).is_some());
        assert!(d(1e-12, 0.0, 0, false).is_some());
        // Beyond the tolerances.
        let far = d(1e-9, 0.0, 0, true).expect("an f64 difference beyond 1e-12");
        assert!(far.contains("d_x") && far.contains("element 0"), "{far}");
        assert!(d(0.0, 1e-3, 0, true).expect("an f32 difference").contains("d_w"));
        // Integers: bit for bit always.
        assert!(d(0.0, 0.0, 1, true).expect("an integer difference").contains("`n`"));
        // A NaN on one side only.
        let (a, b) = runs(0.0, 0.0, 0, true);
        assert!(differ(&launch, &ok(), &ok(), &a, &b, true).expect("a NaN on one side").contains("element 2"));
        // Scratch (a tape the GPU keeps on the device) is not compared.
        let mut b = KernelBuilder::new("k_vjp");
        let _ = b.ptr_param("d_x", DType::F64);
        let _ = b.ptr_param("n", DType::I64);
        let k2 = b.finish().unwrap();
        let (a, b) = runs(0.0, 0.0, 1, false);
        let (x, n) = (tilegrad_reference::TensorId(0), tilegrad_reference::TensorId(2));
        let plain = Launch::new(&k2, 1).arg("d_x", x).arg("n", n);
        assert!(differ(&plain, &ok(), &ok(), &a, &b, true).is_some());
        let opts = tilegrad_reference::Options { scratch: vec!["n".into()], ..Default::default() };
        let taped = Launch::new(&k2, 1).arg("d_x", x).arg("n", n).options(opts);
        assert_eq!(differ(&taped, &ok(), &ok(), &a, &b, true), None);
    }

    /// Loads after the program's own stores: in order, or in a later trip of a loop; a load
    /// before the store (an in-place rotation) is not one.
    #[test]
    fn loads_after_a_programs_own_writes_are_found_in_order_and_across_trips() {
        let build = |store_first: bool, looped: bool| {
            let mut b = KernelBuilder::new("k");
            let (x, y) = (b.ptr_param("x", DType::F32), b.ptr_param("y", DType::F32));
            let body = |b: &mut KernelBuilder| {
                let r = b.arange(0, 4);
                let p = b.add(x, r);
                let q = b.add(y, r);
                let z = b.load(q, None, None);
                if store_first {
                    b.store(p, z, None);
                    let v = b.load(p, None, None);
                    b.store(q, v, None);
                } else {
                    let v = b.load(p, None, None);
                    let w = b.add(v, z);
                    b.store(p, w, None);
                }
            };
            if looped {
                let (lo, hi, one) = (b.i32(0), b.i32(3), b.i32(1));
                b.for_range(lo, hi, one, None, &[], |b, _, _| {
                    body(b);
                    vec![]
                });
            } else {
                body(&mut b);
            }
            b.finish().unwrap()
        };
        assert!(!loads_after_own_writes(&build(false, false)), "a load, then a store in place");
        assert!(loads_after_own_writes(&build(true, false)), "a store, then a load of it");
        assert!(loads_after_own_writes(&build(false, true)), "a later trip loads what an earlier one stored");
    }
}
