//! The device side: finding a usable GPU, loading compiled kernels (kept in memory by source
//! hash; compiling is [`crate::compile`]'s), moving tensors, launching, and turning what the
//! device found into the reference's errors.

use crate::codegen::{
    self, Flavor, Generated, ScratchIn, ARG_WORDS, ERR_LOOP, ERR_OOB, ERR_RUNTIME, ERR_WORDS, FLAG_LOG_FULL, HEADER_WORDS, LOG_WORDS,
    PTR_WORDS,
};
use crate::compile::{cache_file, nvrtc, nvrtc_cubin, source_key, write_cache, Ahead, Compile, Job, Target};
use crate::in_place::{Backup, DeviceMemory};
use crate::{GpuError, GpuOptions, Outcome, RanOn};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tilegrad_ir::{DType, Kernel, Lit, Op, ParamKind};
use tilegrad_reference::{Arg, Data, ExecError, Launch, LaunchSummary, Memory, RaceMode, Site, TensorId, Writers};

/// Entries of the float-atomic log per block.
const LOG_CAP: u64 = 1 << 15;

/// Most float atomics (longest log times programs) a launch adds in program order: the programs
/// take turns at adding theirs, at about 0.4 us an add on an H100 (2^22: under 2 s). Beyond,
/// the device's order.
const ORDERED_LOG_WORK: u64 = 1 << 22;

/// Whether `programs` programs of generated code add float atomics known, before a run, too
/// many to add in program order ([`ORDERED_LOG_WORK`]; each loop's body counted once:
/// [`Generated::log_per_program`]).
fn ordered_too_long(gen: &Generated, programs: u64) -> bool {
    gen.float_atomics && gen.log_per_program.saturating_mul(programs) > ORDERED_LOG_WORK
}

/// How a run on the device went.
enum Ran {
    /// It ran: its summary (the written tensors are in the memory).
    Done(LaunchSummary),
    /// Programs conflict: the reference must settle the launch.
    Conflict,
    /// Its programs log this many float atomics each, too many to add in program order.
    LogsTooLong(u64),
}

/// Why no GPU is usable here, or `Ok` when one is (without creating a context).
pub fn usable() -> Result<(), String> {
    // SAFETY: these only try to open the shared libraries.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("the CUDA driver library (libcuda.so.1) is not installed".into());
    }
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err("NVRTC (libnvrtc.so) is not installed; it compiles the generated kernels".into());
    }
    match CudaContext::device_count() {
        Ok(0) => Err("the CUDA driver sees no device".into()),
        Ok(_) => Ok(()),
        Err(e) => Err(format!("the CUDA driver failed to start: {e}")),
    }
}

/// Whether NVRTC can be loaded (it compiles generated kernels; no device is needed for that).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the shared library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Generates and compiles a kernel for a virtual architecture (`compute_90`) without a device:
/// its PTX, or the error a launch of it would meet. Needs NVRTC ([`nvrtc_present`]).
pub fn compile_only(k: &Kernel, arch: &str) -> Result<String, GpuError> {
    compile_generated(k, &codegen::generate(k)?, arch)
}

/// [`compile_only`] of code already generated for `k` (e.g. by [`codegen::generate_with`]).
pub fn compile_generated(k: &Kernel, gen: &Generated, arch: &str) -> Result<String, GpuError> {
    if !nvrtc_present() {
        return Err(GpuError::Unavailable("NVRTC (libnvrtc.so) is not installed".into()));
    }
    Ok(nvrtc(k, &gen.source, arch)?.to_src())
}

/// A GPU with its context and the kernels compiled for it.
pub struct Gpu {
    /// The context and its stream, created on a thread of their own while the first kernels
    /// compile (see [`Gpu::new`]).
    cuda: Started<Cuda>,
    name: String,
    arch: (i32, i32),
    sms: u32,
    /// Loaded kernels by the source hash of their first form, and whether the choice of form
    /// is provisional (the first form spills and the other was compiling, or a small launch did
    /// not compile it).
    modules: Mutex<HashMap<u128, (Arc<Compiled>, bool)>>,
    /// Compiles ahead of launches.
    ahead: Arc<Ahead>,
    /// Loaded modules of fixed CUDA C (draws, summaries) by source hash.
    utilities: Mutex<HashMap<u128, Arc<CudaModule>>>,
    /// Whether kernels for small launches compile quickly ([`Target`]; on unless
    /// `TILEGRAD_GPU_QUICK=0`).
    quick: bool,
    /// Whether every launch whose kernel's optimised form is not compiled yet runs its quick
    /// form meanwhile ([`Gpu::quick_first`]).
    quick_first: std::sync::atomic::AtomicBool,
}

/// A kernel's compile in words, for the compile log: its name, "in f64" where a tensor it takes
/// is f64 (the ground truth's forms), and which form.
fn compile_what(k: &Kernel, other_form: bool, quick: bool) -> String {
    let f64 = k.params.iter().any(|p| p.kind == ParamKind::Ptr(DType::F64));
    let form = match (other_form, quick) {
        (true, _) => ", form for fewer blocks an SM",
        (false, true) => ", compiled quickly",
        (false, false) => "",
    };
    format!("{}{}{form}", k.name, if f64 { " in f64" } else { "" })
}

/// A device's context and the one stream launches go to.
pub(crate) struct Cuda {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
}

/// A value made on a thread of its own: the first to ask for it waits for that thread.
struct Started<T> {
    thread: Mutex<Option<std::thread::JoinHandle<Result<T, String>>>>,
    value: std::sync::OnceLock<Result<T, String>>,
}

impl<T: Send + Sync + 'static> Started<T> {
    fn spawn(make: impl FnOnce() -> Result<T, String> + Send + 'static) -> Started<T> {
        Started { thread: Mutex::new(Some(std::thread::spawn(make))), value: std::sync::OnceLock::new() }
    }

    fn get(&self) -> Result<&T, &str> {
        let v = self.value.get_or_init(|| {
            let thread = self.thread.lock().expect("starting thread").take();
            thread.map_or_else(
                || Err("the thread that made it is gone".into()),
                |t| t.join().unwrap_or_else(|_| Err("its thread panicked".into())),
            )
        });
        v.as_ref().map_err(|e| e.as_str())
    }
}

struct Compiled {
    gen: Generated,
    main: CudaFunction,
    races: CudaFunction,
    _module: Arc<CudaModule>,
    /// The longest log of float atomics (in program order) a program of a launch of it wanted,
    /// where longer than the default: later launches start with logs that long.
    log_hint: std::sync::atomic::AtomicU64,
}

pub(crate) fn driver(e: impl std::fmt::Display) -> GpuError {
    GpuError::Driver(e.to_string())
}

/// The forms a launch of `k` may use: the first, and the form for half as many blocks an SM
/// that [`Gpu::compiled`] loads when the first spills registers. `TILEGRAD_GPU_THREADS=N` (a
/// power of two, 32 to 1024) forces at most N threads a block, with no register cap below 255,
/// and `N:B` asks the compiler to fit B blocks an SM (for tests and tuning: results do not
/// depend on either).
fn forms(k: &Kernel, flavor: Flavor) -> Result<(Generated, Option<Generated>), GpuError> {
    let (first, forced) = first_form(k, flavor)?;
    let blocks = first.min_blocks as usize;
    let alt = (!forced && blocks >= 2).then(|| codegen::generate_full(k, first.threads as usize, Some(blocks / 2), flavor).ok()).flatten();
    Ok((first, alt))
}

/// The first of [`forms`], and whether `TILEGRAD_GPU_THREADS` forced it.
fn first_form(k: &Kernel, flavor: Flavor) -> Result<(Generated, bool), GpuError> {
    let forced = std::env::var("TILEGRAD_GPU_THREADS").ok().and_then(|v| {
        let (n, b) = v.split_once(':').unwrap_or((v.as_str(), "1"));
        Some((n.parse::<usize>().ok()?, b.parse::<usize>().ok()?))
    });
    Ok(match forced {
        Some((n, b)) => (codegen::generate_full(k, n, Some(b), flavor)?, true),
        None => (codegen::generate_flavor(k, flavor)?, false),
    })
}

impl Gpu {
    /// Device 0, or why no GPU is usable. Its context is created on a thread of its own
    /// (about 0.1-0.2 s), in parallel with the first compiles ([`Gpu::precompile`] needs only the
    /// architecture); [`Gpu::ready`] waits for it, and a failure to create it is reported by the
    /// first call that needs it.
    pub fn new() -> Result<Gpu, GpuError> {
        usable().map_err(GpuError::Unavailable)?;
        use cudarc::driver::{result::device, sys::CUdevice_attribute as A};
        let dev = device::get(0).map_err(driver)?;
        // SAFETY: `dev` is a device handle the driver gave.
        let attr = |a: A| unsafe { device::get_attribute(dev, a) }.map_err(driver);
        let arch = (attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?, attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?);
        let sms = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        let name = device::get_name(dev).map_err(driver)?;
        // Scratch past static shared memory goes to dynamic shared memory where a block may
        // opt in to it (less a margin for the entry's own static shared words).
        let opt_in = attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN).unwrap_or(0).max(0) as usize;
        let per_sm = attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR).unwrap_or(0).max(0) as usize;
        codegen::set_dynamic_shared_limit(opt_in.saturating_sub(1024), per_sm);
        let cuda = Started::spawn(|| {
            let ctx = CudaContext::new(0).map_err(|e| format!("cannot create a CUDA context: {e}"))?;
            // One stream, synchronised by hand: no per-buffer events.
            // SAFETY: every buffer is used on the one stream, which is synchronised before reads.
            unsafe { ctx.disable_event_tracking() };
            let stream = ctx.default_stream();
            Ok(Cuda { ctx, stream })
        });
        let quick = std::env::var("TILEGRAD_GPU_QUICK").map_or(true, |v| v != "0");
        Ok(Gpu {
            cuda,
            name,
            arch,
            sms,
            modules: Mutex::new(HashMap::new()),
            ahead: Arc::default(),
            utilities: Mutex::default(),
            quick,
            quick_first: Default::default(),
        })
    }

    /// For a process that meets kernels one launch at a time and launches them again later (the
    /// Python package): a launch whose kernel's optimised form is not compiled yet (neither in
    /// memory nor on disk) runs its quick form (`Target`: several times less NVRTC time for
    /// large tiles, code several times slower, the same results), and the optimised form
    /// compiles in the background for later launches. Compiles ahead take the quick form too.
    /// Off by default: a CLI check compiles each kernel once, ahead, and exits; its exit would
    /// wait for optimised forms it never runs. No effect with `TILEGRAD_GPU_QUICK=0`.
    pub fn quick_first(&self, on: bool) {
        self.quick_first.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether kernels for small launches compile quickly (`Target`; on by default, off with
    /// `TILEGRAD_GPU_QUICK=0`). Results do not depend on it.
    pub fn quick_compiles(mut self, on: bool) -> Gpu {
        self.quick = on;
        self
    }

    /// Waits for the device's context: an error where it could not be created.
    pub fn ready(&self) -> Result<(), GpuError> {
        self.cuda().map(|_| ())
    }

    pub(crate) fn cuda(&self) -> Result<&Cuda, GpuError> {
        self.cuda.get().map_err(|e| GpuError::Unavailable(e.to_string()))
    }

    /// Bytes of device memory free now.
    pub fn free_memory(&self) -> Result<u64, GpuError> {
        Ok(self.cuda()?.ctx.mem_get_info().map_err(driver)?.0 as u64)
    }

    /// The device, in words.
    pub fn describe(&self) -> String {
        format!("{} (sm_{}{}, {} SMs)", self.name, self.arch.0, self.arch.1, self.sms)
    }

    /// What kernels compile for here: quickly, or optimised fully.
    fn target(&self, quick: bool) -> Target {
        Target { sm: format!("sm_{}{}", self.arch.0, self.arch.1), quick }
    }

    /// Whether a launch of this many programs (no more than the device has SMs) is small: its
    /// kernel may compile quickly, and the form for fewer blocks an SM is not worth compiling.
    fn small(&self, programs: u64) -> bool {
        programs <= self.sms as u64
    }

    /// The target of a kernel's first form (`source`) for a launch of this many programs:
    /// quick for a small launch, unless its fully optimised form is compiled already.
    fn first_target(&self, source: &str, programs: u64) -> Target {
        let full = self.target(false);
        let key = source_key(&full, source);
        let quick_first = self.quick_first.load(std::sync::atomic::Ordering::Relaxed);
        let quick = self.quick && !self.compiled_already(key) && (quick_first || (self.small(programs) && !self.available(key)));
        if quick {
            self.target(true)
        } else {
            full
        }
    }

    /// Whether `key` is compiled: loaded, on disk or compiled ahead (not compiling).
    fn compiled_already(&self, key: u128) -> bool {
        self.modules.lock().expect("module cache").contains_key(&key) || cache_file(key).is_some_and(|f| f.exists()) || self.ahead.has(key)
    }

    /// Whether `key` is compiled: loaded, on disk, compiled ahead or compiling.
    fn available(&self, key: u128) -> bool {
        self.modules.lock().expect("module cache").contains_key(&key)
            || cache_file(key).is_some_and(|f| f.exists())
            || self.ahead.has(key)
            || self.ahead.compiling(key)
    }

    /// The kernel compiled for this device: from memory, from the disk cache, or by NVRTC.
    ///
    /// A small launch ([`Gpu::small`]) takes the kernel's fully optimised form where that is
    /// compiled already, else its quick form ([`Target`]).
    ///
    /// A kernel whose blocks spill registers to local memory has a form for half as many
    /// blocks an SM (twice the registers), used where it is compiled and spills less. Only
    /// [`Gpu::precompile_in_background`] compiles it, for a process that launches the kernel
    /// again later (the Python package). No launch waits for it while it compiles (it runs
    /// the first; later launches take the other), and none starts its compile: a process
    /// would wait at its exit for a form it may never run (a CLI check of the causal
    /// attention, 5 s).
    fn compiled(&self, k: &Kernel, flavor: Flavor, programs: u64) -> Result<Arc<Compiled>, GpuError> {
        let (first, alt) = forms(k, flavor)?;
        let target = self.first_target(&first.source, programs);
        if target.quick {
            let key = source_key(&target, &first.source);
            if let Some((c, _)) = self.modules.lock().expect("module cache").get(&key) {
                return Ok(c.clone());
            }
            self.optimise_later(k, &first, programs);
            let c = Arc::new(self.load(k, first, &target)?);
            self.modules.lock().expect("module cache").insert(key, (c.clone(), false));
            return Ok(c);
        }
        let full = target;
        let key = source_key(&full, &first.source);
        let small = self.small(programs);
        let known = self.modules.lock().expect("module cache").get(&key).cloned();
        let alt_compiling = || alt.as_ref().is_some_and(|a| self.ahead.compiling(source_key(&full, &a.source)));
        let first = match known {
            Some((c, false)) => return Ok(c),
            Some((c, true)) if small || alt_compiling() => return Ok(c),
            Some((c, true)) => c,
            None => Arc::new(self.load(k, first, &full)?),
        };
        let spill = |c: &Compiled| c.main.local_size_bytes().unwrap_or(0);
        let mut c = first;
        let mut provisional = false;
        if let Some(alt) = alt.filter(|_| spill(&c) > 0) {
            let alt_key = source_key(&full, &alt.source);
            let compiling = self.ahead.compiling(alt_key);
            let compiled = cache_file(alt_key).is_some_and(|f| f.exists()) || self.ahead.has(alt_key);
            if compiling {
                provisional = true;
            } else if !compiled {
                // Compiled only where asked for ahead (`Gpu::precompile_in_background`).
            } else if let Ok(alt) = self.load(k, alt, &full) {
                // The other form is an optimisation: if it fails to load, the first serves.
                if spill(&alt) < spill(&c) {
                    c = Arc::new(alt);
                }
            }
        }
        self.modules.lock().expect("module cache").insert(key, (c.clone(), provisional));
        Ok(c)
    }

    /// With [`Gpu::quick_first`], the optimised form of a large launch's kernel (`gen`), which
    /// runs quickly compiled meanwhile, compiled in the background unless compiled or compiling.
    fn optimise_later(&self, k: &Kernel, gen: &Generated, programs: u64) {
        if !self.quick_first.load(std::sync::atomic::Ordering::Relaxed) || self.small(programs) {
            return;
        }
        let target = self.target(false);
        let key = source_key(&target, &gen.source);
        if self.available(key) {
            return;
        }
        let what = compile_what(k, false, false);
        self.ahead.expect([key]);
        self.ahead.compile_in_background(vec![Job { key, source: gen.source.clone(), target, what }]);
    }

    /// The kernels' forms in their flavors (see [`GpuOptions::flavor`]) compiled ahead, so that
    /// a check's first launches find them compiled: NVRTC takes a fraction of a second for each
    /// (without its own cache, up to a second). The first form of each is compiled now, on
    /// threads: quickly for a kernel whose launches will be small (`Gpu::small`; `programs`
    /// is an estimate of its largest). The other form of a large kernel (for fewer blocks, used
    /// where the first spills) is left to the first launch that finds the first form spilling,
    /// which starts it in the background (see `Gpu::compiled`): compiled ahead for every large
    /// kernel, those a process never used made its exit wait for them (2.4 s of a 5.5 s cold
    /// softmax check). Those compiled before (in memory or on disk) are skipped; a kernel that
    /// fails to compile is left to its launch, which reports the error.
    pub fn precompile(&self, kernels: &[(&Kernel, Flavor, u64)]) {
        let (now, _) = self.compile_jobs(kernels, false);
        self.ahead.compile(&now);
    }

    /// [`Gpu::precompile`] in the background: for kernels a caller will launch later (the
    /// VJP kernels of a CLI check, which run last; the f64 forms and VJP kernels of a launch
    /// the Python package has just seen), so that their compiles overlap what runs before. A
    /// launch of one waits for it. With `other_forms`, the forms for fewer blocks an SM of
    /// large launches compile too, in a batch of their own (see `Gpu::compiled`).
    pub fn precompile_in_background(&self, kernels: &[(&Kernel, Flavor, u64)], other_forms: bool) {
        let (now, later) = self.compile_jobs(kernels, other_forms);
        self.ahead.compile_in_background(now);
        self.ahead.compile_in_background(later);
    }

    /// The compiles [`Gpu::precompile`] runs: the first forms, and with `other_forms` the
    /// others; each marked as compiling.
    fn compile_jobs(&self, kernels: &[(&Kernel, Flavor, u64)], other_forms: bool) -> (Vec<Job>, Vec<Job>) {
        let mut now: Vec<Job> = Vec::new();
        let mut later: Vec<Job> = Vec::new();
        for (k, flavor, programs) in kernels {
            // The stamps' width its launch will ask for (`GpuOptions::flavor`).
            let flavor = &flavor.for_programs(*programs);
            let Ok((first, alt)) = forms(k, *flavor) else { continue };
            // A launch whose float atomics are known too many for program order runs in the
            // device's order (see `Gpu::known_too_long`): that form is the one it takes.
            let unordered = Flavor { ordered: false, ..*flavor };
            let (first, alt) = match flavor.ordered && *programs != u64::MAX && ordered_too_long(&first, *programs) {
                true => match forms(k, unordered) {
                    Ok(f) => f,
                    Err(_) => continue,
                },
                false => (first, alt),
            };
            let first_target = self.first_target(&first.source, *programs);
            let alt = alt.filter(|_| other_forms && !self.small(*programs)).map(|a| (a, self.target(false)));
            for (j, (gen, target)) in std::iter::once((first, first_target)).chain(alt).enumerate() {
                let key = source_key(&target, &gen.source);
                let listed = now.iter().chain(&later).any(|t| t.key == key);
                if !self.available(key) && !listed {
                    let what = compile_what(k, j == 1, target.quick);
                    if j == 0 { &mut now } else { &mut later }.push(Job { key, source: gen.source, target, what });
                }
            }
        }
        self.ahead.expect(now.iter().chain(&later).map(|j| j.key));
        (now, later)
    }

    /// This device's NVRTC compiles that started at or after `since`, in the order they ended
    /// (for `--timings`).
    pub fn compiles_since(&self, since: std::time::Instant) -> Vec<Compile> {
        self.ahead.compiles_since(since)
    }

    /// Every NVRTC compile of this device's kernels in this process, in the order they ended.
    pub fn compiles(&self) -> Vec<Compile> {
        self.ahead.compiles()
    }

    /// The device's streaming multiprocessors.
    pub(crate) fn sms(&self) -> u32 {
        self.sms
    }

    /// Compiles the fixed CUDA C of draws, conversions and summaries in the background (a
    /// check's first draw or comparison waits for it), where not compiled before; with `traced`,
    /// also the reading of writers off the marks of a traced launch.
    pub fn precompile_utilities(&self, traced: bool) {
        let target = self.target(false);
        let mut sources = vec![
            (crate::summary::SOURCE.to_string(), "summaries"),
            (crate::draw::cuda_source(), "draws"),
            (crate::convert::source().to_string(), "conversions"),
        ];
        if traced {
            sources.push((crate::runs::SOURCE.to_string(), "writers off the marks"));
        }
        let jobs: Vec<Job> = sources
            .into_iter()
            .map(|(source, what)| Job { key: source_key(&target, &source), source, target: target.clone(), what: what.into() })
            .filter(|j| !self.available(j.key) && !self.utilities.lock().expect("utility modules").contains_key(&j.key))
            .collect();
        self.ahead.expect(jobs.iter().map(|j| j.key));
        self.ahead.compile_in_background(jobs);
    }

    /// Function `name` of fixed CUDA C `source` (not generated from a kernel: draws and
    /// summaries), compiled once with the generated kernels' options (the disk cache keeps it)
    /// and loaded once.
    pub(crate) fn utility(&self, source: &str, name: &str) -> Result<CudaFunction, GpuError> {
        let target = self.target(false);
        let key = source_key(&target, source);
        let known = self.utilities.lock().expect("utility modules").get(&key).cloned();
        let module = match known {
            Some(m) => m,
            None => {
                // Compiled ahead (waiting while it compiles), kept in memory or on disk.
                let image = self.ahead.take(key).or_else(|| cache_file(key).and_then(|f| std::fs::read(f).ok()));
                let image = match image {
                    Some(image) => image,
                    None => {
                        let job = Job { key, source: source.to_string(), target: target.clone(), what: name.to_string() };
                        let image = self.ahead.compile_now(&job).map_err(|log| GpuError::Compile { kernel: name.to_string(), log })?;
                        write_cache(key, &image);
                        image
                    }
                };
                let m = self.cuda()?.ctx.load_module(cudarc::nvrtc::Ptx::from_binary(image)).map_err(driver)?;
                self.utilities.lock().expect("utility modules").insert(key, m.clone());
                m
            }
        };
        module.load_function(name).map_err(driver)
    }

    /// Compiles generated code (or takes its machine code from the disk cache, or from
    /// [`Gpu::precompile`]) and loads it.
    fn load(&self, k: &Kernel, gen: Generated, target: &Target) -> Result<Compiled, GpuError> {
        let key = source_key(target, &gen.source);
        // Compiled ahead (waiting while it compiles in the background), then kept in memory or
        // written to the disk cache.
        let image = self.ahead.take(key).or_else(|| cache_file(key).and_then(|f| std::fs::read(f).ok()));
        let image = match image {
            Some(image) => image,
            None => {
                let job = Job { key, source: gen.source.clone(), target: target.clone(), what: compile_what(k, false, target.quick) };
                let image = self.ahead.compile_now(&job).map_err(|log| GpuError::Compile { kernel: k.name.clone(), log })?;
                write_cache(key, &image);
                image
            }
        };
        let ptx = cudarc::nvrtc::Ptx::from_binary(image);
        let module = self.cuda()?.ctx.load_module(ptx).map_err(driver)?;
        let main = module.load_function(codegen::ENTRY).map_err(driver)?;
        if gen.scratch_in == ScratchIn::DynamicShared {
            use cudarc::driver::sys::CUfunction_attribute as F;
            main.set_attribute(F::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, gen.scratch_bytes as i32).map_err(driver)?;
        }
        let races = module.load_function("tg_races").map_err(driver)?;
        Ok(Compiled { gen, main, races, _module: module, log_hint: std::sync::atomic::AtomicU64::new(LOG_CAP) })
    }

    /// Facts about a kernel's compiled form in a flavor, in words: threads, registers and local
    /// memory per thread (spills), scratch bytes per block, blocks per SM.
    pub fn describe_kernel(&self, k: &Kernel, flavor: Flavor) -> Result<String, GpuError> {
        let c = self.compiled(k, flavor, u64::MAX)?;
        let f = &c.main;
        let regs = f.num_regs().map_err(driver)?;
        let local = f.local_size_bytes().map_err(driver)?;
        let per_sm = f.occupancy_max_active_blocks_per_multiprocessor(c.gen.threads, c.gen.dynamic_shared_bytes(), None).map_err(driver)?;
        Ok(format!(
            "{} threads, {regs} registers, {local} B local per thread, {} B scratch, {per_sm} blocks/SM",
            c.gen.threads, c.gen.scratch_bytes
        ))
    }

    /// Compiles generated code of `k` to this device's machine code, optimised fully, past
    /// every cache of tilegrad's (NVRTC's own is off with `CUDA_CACHE_DISABLE=1`): the seconds
    /// NVRTC took, for measurements.
    pub fn compile_seconds(&self, k: &Kernel, gen: &Generated) -> Result<f64, GpuError> {
        let start = std::time::Instant::now();
        nvrtc_cubin(&gen.source, &self.target(false)).map_err(|log| GpuError::Compile { kernel: k.name.clone(), log })?;
        Ok(start.elapsed().as_secs_f64())
    }

    /// Runs a launch: on success the written tensors of `mem` hold their final contents, as
    /// [`Launch::run`] would leave them.
    pub fn run(&self, launch: &Launch, mem: &mut Memory, opts: GpuOptions) -> Result<Outcome, GpuError> {
        self.run_place(launch, &mut Place::Host(mem), opts)
    }

    /// [`Gpu::run`] on host memory or on device memory in place.
    pub(crate) fn run_place(&self, launch: &Launch, place: &mut Place, opts: GpuOptions) -> Result<Outcome, GpuError> {
        launch.check_arguments(place.layout())?;
        let k = launch.kernel();
        let o = launch.get_options();
        if o.races == RaceMode::Warn {
            let why = "races resolved in program order (a racy backward's provisional table) are the reference's";
            return self.settle(launch, place, why);
        }
        if let Some(why) = codegen::needs_reference(k) {
            return self.settle(launch, place, why);
        }
        let programs = launch.program_range().end - launch.program_range().start;
        if let Place::Device { mem, backup } = place {
            *backup = Some(self.back_up(launch, mem)?);
        }
        let conflict = "the device found a conflict between programs, which the reference reports exactly";
        // Atomics known too many ahead go to the device's order without their form in program
        // order compiled or run (its compile took 1.4 s of a cold layer-norm check).
        let ran = match self.known_too_long(k, opts, launch, programs)? {
            Some(n) => Ran::LogsTooLong(n),
            None => {
                let c = self.compiled(k, opts.flavor(launch), programs)?;
                self.run_compiled(&c, launch, place, opts)?
            }
        };
        match ran {
            Ran::Done(summary) => Ok(Outcome { summary, ran_on: RanOn::Gpu }),
            Ran::Conflict => self.settle(launch, place, conflict),
            Ran::LogsTooLong(n) => {
                // Adding in program order would take the programs' turns far longer than the
                // launch: the device's order instead, as the kernel runs on a GPU.
                let unordered = GpuOptions { ordered_atomics: false, ..opts };
                let c = self.compiled(k, unordered.flavor(launch), programs)?;
                self.rewind(place)?;
                match self.run_compiled(&c, launch, place, unordered)? {
                    Ran::Done(summary) => {
                        let why = format!("a program adds {n} floats atomically or more, too many to add in program order");
                        Ok(Outcome { summary, ran_on: RanOn::GpuDeviceOrder(why) })
                    }
                    Ran::Conflict | Ran::LogsTooLong(_) => self.settle(launch, place, conflict),
                }
            }
        }
    }

    /// The float atomics a program of `launch` logs, where known before a run too many to add
    /// in program order (see [`ordered_too_long`]): none where the launch adds in the device's
    /// order anyway, or in program order whatever it costs ([`GpuOptions::exact_order`]).
    fn known_too_long(&self, k: &Kernel, opts: GpuOptions, launch: &Launch, programs: u64) -> Result<Option<u64>, GpuError> {
        let flavor = opts.flavor(launch);
        if !flavor.ordered || opts.exact_order {
            return Ok(None);
        }
        let (first, _) = first_form(k, flavor)?;
        Ok(ordered_too_long(&first, programs).then_some(first.log_per_program))
    }

    /// Runs a launch the device cannot settle on the reference, from the memory it started
    /// from.
    fn settle(&self, launch: &Launch, place: &mut Place, why: &str) -> Result<Outcome, GpuError> {
        self.rewind(place)?;
        match place {
            Place::Host(mem) => reference(launch, mem, why),
            Place::Device { mem, .. } => self.reference_in_place(launch, mem, why),
        }
    }

    /// Puts device memory back as it was before the launch (host memory is written only once
    /// a run has settled).
    fn rewind(&self, place: &Place) -> Result<(), GpuError> {
        match place {
            Place::Device { mem, backup: Some(b) } => self.restore(b, mem),
            _ => Ok(()),
        }
    }

    /// Binds the device's context to this thread (for the driver's synchronous copies).
    pub(crate) fn bind(&self) -> Result<(), GpuError> {
        self.cuda()?.ctx.bind_to_thread().map_err(driver)
    }

    /// Runs on the device (see [`Ran`]).
    ///
    /// Float atomics added in program order are logged per program: a launch whose programs
    /// log more than the default capacity runs again with logs as long as its longest, where
    /// they fit in a quarter of the free memory (fewer blocks then run at once) and where the
    /// programs' turns at adding them stay short ([`ORDERED_LOG_WORK`], unless
    /// [`GpuOptions::exact_order`]).
    fn run_compiled(&self, c: &Compiled, launch: &Launch, place: &mut Place, opts: GpuOptions) -> Result<Ran, GpuError> {
        use std::sync::atomic::Ordering::Relaxed;
        let range = launch.program_range();
        let programs = range.end - range.start;
        let fits = |cap: u64| -> Result<bool, GpuError> { Ok(LOG_WORDS as u64 * 8 * cap <= self.free_memory()? / 4) };
        let short = |cap: u64| opts.exact_order || cap.saturating_mul(programs) <= ORDERED_LOG_WORK;
        let mut cap = LOG_CAP;
        let hint = c.log_hint.load(Relaxed);
        if c.gen.float_atomics && opts.ordered_atomics && hint > LOG_CAP {
            // Known from an earlier launch of the kernel.
            if !short(hint) {
                return Ok(Ran::LogsTooLong(hint));
            }
            if fits(hint)? {
                cap = hint;
            }
        }
        let mut again = true;
        loop {
            let mut p = self.upload(c, launch, place, opts, cap)?;
            self.execute(c, &mut p)?;
            let s = &self.cuda()?.stream;
            s.synchronize().map_err(driver)?;
            let flag = s.clone_dtoh(&p.flags).map_err(driver)?[0];
            if flag == FLAG_LOG_FULL && std::mem::take(&mut again) {
                let want = s.clone_dtoh(&p.counters).map_err(driver)?[2] as u64;
                c.log_hint.fetch_max(want, Relaxed);
                if !short(want) {
                    return Ok(Ran::LogsTooLong(want));
                }
                if want > cap && fits(want)? {
                    drop(p);
                    cap = want;
                    self.rewind(place)?;
                    continue;
                }
            }
            return Ok(match self.finish(c, launch, place, &p)? {
                Some(summary) => Ran::Done(summary),
                None => Ran::Conflict,
            });
        }
    }

    /// Times a launch on the device: its tensors are uploaded once, then the launch (with the
    /// race check when `opts.races`) runs `reps` times; the fastest run's seconds, from CUDA
    /// events. Launches the reference must run are an error. `mem` is left as one run leaves it.
    pub fn time(&self, launch: &Launch, mem: &mut Memory, opts: GpuOptions, reps: usize) -> Result<f64, GpuError> {
        launch.check_arguments(mem)?;
        if let Some(why) = codegen::needs_reference(launch.kernel()) {
            return Err(GpuError::Unsupported {
                kernel: launch.kernel().name.clone(),
                op: "launch",
                loc: launch.kernel().loc.clone(),
                why: why.to_string(),
            });
        }
        // Timed as checks run after their first launches: in the form chosen once the forms
        // compiling in the background are done.
        self.compiled(launch.kernel(), opts.flavor(launch), u64::MAX)?;
        self.ahead.wait_all();
        let c = self.compiled(launch.kernel(), opts.flavor(launch), u64::MAX)?;
        let mut p = self.upload(&c, launch, &Place::Host(mem), opts, LOG_CAP)?;
        let mut best = f64::INFINITY;
        for _ in 0..reps.max(1) {
            let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
            let Cuda { ctx, stream } = self.cuda()?;
            let start = ctx.new_event(timing).map_err(driver)?;
            let end = ctx.new_event(timing).map_err(driver)?;
            start.record(stream).map_err(driver)?;
            self.execute(&c, &mut p)?;
            end.record(stream).map_err(driver)?;
            end.synchronize().map_err(driver)?;
            best = best.min(start.elapsed_ms(&end).map_err(driver)? as f64 / 1e3);
        }
        self.finish(&c, launch, &mut Place::Host(mem), &p)?
            .ok_or_else(|| GpuError::Driver("the timed launch has a conflict between programs".into()))?;
        Ok(best)
    }

    /// Uploads a launch's tensors and allocates its marks, counters and scratch.
    fn upload(&self, c: &Compiled, launch: &Launch, place: &Place, opts: GpuOptions, log_cap: u64) -> Result<Prepared, GpuError> {
        let k = launch.kernel();
        let s = &self.cuda()?.stream;
        let grid = launch.grid();
        let total = grid.programs();
        // A batch of the grid's programs: the counters start at its first.
        let range = launch.program_range();
        if total > u32::MAX as u64 - 1 {
            return Err(ExecError::Grid {
                kernel: k.name.clone(),
                grid: grid.0,
                message: "more programs than the GPU backend counts (2^32 - 2)".into(),
            }
            .into());
        }
        let uses = tilegrad_ir::analysis::param_uses(k);
        // Tensors of the launch (aliasing parameters share one), uploaded.
        let mut slots: Vec<(TensorId, Slot)> = Vec::new();
        let mut param_slot: Vec<Option<usize>> = Vec::new();
        for (j, p) in k.params.iter().enumerate() {
            let arg = launch.args().iter().find(|(n, _)| *n == p.name).map(|(_, a)| *a);
            match (&p.kind, arg) {
                (ParamKind::Ptr(_), Some(Arg::Tensor(t))) => {
                    let at = match slots.iter().position(|(id, _)| *id == t) {
                        Some(at) => at,
                        None => {
                            // Scratch (bound to scratch parameters only) is allocated here, not copied.
                            let scratch = launch
                                .args()
                                .iter()
                                .filter(|(_, a)| *a == Arg::Tensor(t))
                                .all(|(n, _)| launch.get_options().scratch.contains(n));
                            let (buf, numel) = self.buffer(place, t, scratch)?;
                            slots.push((t, Slot { buf, numel, loaded: false, stored: false, atomic: false, scratch, marks: None }));
                            slots.len() - 1
                        }
                    };
                    slots[at].1.loaded |= uses[j].loaded;
                    slots[at].1.stored |= uses[j].stored;
                    slots[at].1.atomic |= uses[j].atomic;
                    param_slot.push(Some(at));
                }
                _ => param_slot.push(None),
            }
        }
        // Writers (for blame) are read off the race marks, with the storing instruction and the
        // last atomic's key of each element.
        let writers = launch.get_options().record_writers;
        // Store stamps of 32 bits hold programs + 1 below 2^24: past that the form stamps in 64
        // (the flavor a launch asks for, `GpuOptions::flavor`).
        let wide = c.gen.wide;
        if (opts.races || writers) && wide != (total >= codegen::WIDE_PROGRAMS) {
            return Err(GpuError::Driver(format!(
                "`{}`: a form with {}-bit store stamps for {total} programs",
                k.name,
                if wide { 64 } else { 32 }
            )));
        }
        if opts.races || writers {
            for (_, sl) in &mut slots {
                if sl.stored || sl.atomic {
                    let n = sl.numel.max(1);
                    let w = if sl.stored { Some(s.alloc_zeros::<u32>(if wide { 2 * n } else { n }).map_err(driver)?) } else { None };
                    // Readers only of tensors some program both reads and writes.
                    let r = if sl.loaded { Some(s.alloc_zeros::<u32>(n).map_err(driver)?) } else { None };
                    let a = if sl.atomic { Some(s.alloc_zeros::<u32>(n).map_err(driver)?) } else { None };
                    let wi = if writers && sl.stored { Some(s.alloc_zeros::<u32>(n).map_err(driver)?) } else { None };
                    let ak = if writers && sl.atomic { Some(s.alloc_zeros::<u64>(n).map_err(driver)?) } else { None };
                    sl.marks = Some(Marks { w, r, a, wi, ak });
                }
            }
        }
        // Blocks: as many as fit at once, taking programs from a counter.
        let nt = c.gen.threads;
        let smem = c.gen.dynamic_shared_bytes();
        let global_scratch = c.gen.scratch_in == ScratchIn::Global;
        let per_sm = c.main.occupancy_max_active_blocks_per_multiprocessor(nt, smem, None).map_err(driver)?.max(1);
        let mut blocks = (self.sms as u64 * per_sm as u64).min(range.end - range.start).max(1);
        if c.gen.float_atomics {
            blocks = blocks.min(self.sms as u64 * 2);
            // Logs beyond the default take at most a quarter of the free memory.
            if log_cap > LOG_CAP {
                let free = self.free_memory()?;
                blocks = blocks.min((free / 4 / (LOG_WORDS as u64 * 8 * log_cap)).max(1));
            }
        }
        // The program counter, the turn (ordered atomics), the longest atomic log a program wanted.
        let counters = s.alloc_zeros::<u32>(3).map_err(driver)?;
        let errs = s.clone_htod(&vec![u64::MAX; ERR_WORDS * blocks as usize]).map_err(driver)?;
        let flags = s.alloc_zeros::<u32>(1).map_err(driver)?;
        let counts = s.alloc_zeros::<u64>(3 + c.gen.loops.len()).map_err(driver)?;
        let scratch = if global_scratch { Some(s.alloc_zeros::<u8>(c.gen.scratch_bytes * blocks as usize).map_err(driver)?) } else { None };
        let log_cap = if c.gen.float_atomics { log_cap } else { 0 };
        let log = s.alloc_zeros::<u64>((LOG_WORDS as u64 * log_cap * blocks).max(1) as usize).map_err(driver)?;
        let ptr = |b: &CudaSlice<u8>| b.device_ptr(s).0;
        let mut words = vec![0u64; HEADER_WORDS + (PTR_WORDS + 1) * k.params.len()];
        words[0] = grid.0[0] as u64;
        words[1] = grid.0[1] as u64;
        words[2] = grid.0[2] as u64;
        words[3] = range.end;
        let cp = counters.device_ptr(s).0;
        words[4] = cp;
        words[5] = cp + 4;
        words[6] = errs.device_ptr(s).0;
        words[7] = flags.device_ptr(s).0;
        words[8] = counts.device_ptr(s).0;
        if let Some(sc) = &scratch {
            words[9] = ptr(sc);
            words[10] = c.gen.scratch_bytes as u64;
        }
        words[11] = log.device_ptr(s).0;
        words[12] = log_cap;
        words[13] = launch.get_options().poison_masked_loads;
        for (j, p) in k.params.iter().enumerate() {
            if let Some(at) = param_slot[j] {
                let sl = &slots[at].1;
                let w = HEADER_WORDS + PTR_WORDS * j;
                words[w] = sl.buf.ptr(s);
                words[w + 1] = sl.numel as u64;
                if let Some(m) = &sl.marks {
                    words[w + 2] = m.w.as_ref().map_or(0, |b| b.device_ptr(s).0);
                    words[w + 3] = m.r.as_ref().map_or(0, |b| b.device_ptr(s).0);
                    words[w + 4] = m.a.as_ref().map_or(0, |b| b.device_ptr(s).0);
                    words[w + 5] = m.wi.as_ref().map_or(0, |b| b.device_ptr(s).0);
                    words[w + 6] = m.ak.as_ref().map_or(0, |b| b.device_ptr(s).0);
                }
            } else {
                let given = launch.args().iter().find(|(n, _)| *n == p.name).map(|(_, a)| *a);
                let (d, lit) = match (&p.kind, given) {
                    (ParamKind::Scalar(d), Some(Arg::Scalar(l))) => (*d, l),
                    (ParamKind::Constexpr(d, v), _) => (*d, *v),
                    _ => unreachable!("check_arguments bound every parameter"),
                };
                words[HEADER_WORDS + PTR_WORDS * k.params.len() + j] = scalar_bits(lit, d);
            }
        }
        if words.len() > ARG_WORDS {
            return Err(GpuError::Unsupported {
                kernel: k.name.clone(),
                op: "launch",
                loc: k.loc.clone(),
                why: format!("{} parameters are more than the GPU backend's argument block holds", k.params.len()),
            });
        }
        let mut args = Box::new(ArgBlock([0; ARG_WORDS]));
        args.0[..words.len()].copy_from_slice(&words);
        let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (nt, 1, 1), shared_mem_bytes: smem as u32 };
        Ok(Prepared {
            slots,
            param_slot,
            counters,
            errs,
            flags,
            counts,
            _scratch: scratch,
            _log: log,
            args,
            cfg,
            races: opts.races || writers,
            writers,
            wide,
            first: range.start as u32,
            total: range.end - range.start,
        })
    }

    /// A launch's device storage of tensor `t` and its elements: the host tensor's contents
    /// copied, the caller's device tensor itself, or zeros for scratch.
    fn buffer(&self, place: &Place, t: TensorId, scratch: bool) -> Result<(Buf, usize), GpuError> {
        let s = &self.cuda()?.stream;
        let (dtype, numel) = match place {
            Place::Host(mem) => (mem.get(t).dtype(), mem.get(t).numel()),
            Place::Device { mem, .. } => (mem.get(t).dtype, mem.get(t).numel),
        };
        if scratch {
            let bytes = (numel * tilegrad_reference::storage_bytes(dtype)).div_ceil(4).max(1) * 4;
            return Ok((Buf::Owned(s.alloc_zeros::<u8>(bytes).map_err(driver)?), numel));
        }
        Ok(match place {
            Place::Host(mem) => (Buf::Owned(s.clone_htod(&*stored_bytes(dtype, mem.get(t).data())).map_err(driver)?), numel),
            Place::Device { mem, .. } => (Buf::Borrowed(mem.get(t).addr), numel),
        })
    }

    /// Queues one run: counters, errors and marks reset, the launch, the race check.
    fn execute(&self, c: &Compiled, p: &mut Prepared) -> Result<(), GpuError> {
        let s = &self.cuda()?.stream;
        s.memcpy_htod(&[p.first, p.first, 0], &mut p.counters).map_err(driver)?;
        s.memset_zeros(&mut p.flags).map_err(driver)?;
        s.memset_zeros(&mut p.counts).map_err(driver)?;
        let n = p.errs.len();
        s.memcpy_htod(&vec![u64::MAX; n], &mut p.errs).map_err(driver)?;
        for (_, sl) in &mut p.slots {
            if let Some(m) = &mut sl.marks {
                if let Some(r) = &mut m.r {
                    s.memset_zeros(r).map_err(driver)?;
                }
                if let Some(w) = &mut m.w {
                    s.memset_zeros(w).map_err(driver)?;
                }
                if let Some(a) = &mut m.a {
                    s.memset_zeros(a).map_err(driver)?;
                }
                if let Some(wi) = &mut m.wi {
                    s.memset_zeros(wi).map_err(driver)?;
                }
                if let Some(ak) = &mut m.ak {
                    s.memset_zeros(ak).map_err(driver)?;
                }
            }
        }
        // SAFETY: the argument block holds what the generated kernel reads (codegen's layout):
        // live device buffers of the sizes given, on this stream.
        unsafe { s.launch_builder(&c.main).arg(&*p.args).launch(p.cfg) }.map_err(driver)?;
        if p.races {
            for (_, sl) in &p.slots {
                if let Some(m) = &sl.marks {
                    if m.r.is_none() && m.a.is_none() {
                        // Two programs storing one element were seen by the stores themselves;
                        // with no reads or atomics on the tensor there is nothing else to check.
                        continue;
                    }
                    let n = sl.numel as i64;
                    let wp = m.w.as_ref().map_or(0, |b| b.device_ptr(s).0);
                    let rp = m.r.as_ref().map_or(0, |b| b.device_ptr(s).0);
                    let ap = m.a.as_ref().map_or(0, |b| b.device_ptr(s).0);
                    let fp = p.flags.device_ptr(s).0;
                    let wide = p.wide as i32;
                    let g = (sl.numel as u64).div_ceil(256).clamp(1, self.sms as u64 * 8) as u32;
                    let cfg = LaunchConfig { grid_dim: (g, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
                    // SAFETY: mark buffers of `n` elements (or null) and the flag word.
                    unsafe { s.launch_builder(&c.races).arg(&wp).arg(&wide).arg(&rp).arg(&ap).arg(&n).arg(&fp).launch(cfg) }
                        .map_err(driver)?;
                }
            }
        }
        Ok(())
    }

    /// After a run: the reference's error, `None` for a conflict, or the summary with the
    /// written tensors copied back into `mem`.
    fn finish(&self, c: &Compiled, launch: &Launch, place: &mut Place, p: &Prepared) -> Result<Option<LaunchSummary>, GpuError> {
        let s = &self.cuda()?.stream;
        let flag = s.clone_dtoh(&p.flags).map_err(driver)?[0];
        if flag != 0 {
            return Ok(None);
        }
        let errs = s.clone_dtoh(&p.errs).map_err(driver)?;
        let first = errs.chunks(ERR_WORDS).filter(|r| r[0] != u64::MAX).min_by_key(|r| r[0]);
        if let Some(r) = first {
            return Err(decode_error(c, launch, place.layout(), &p.param_slot, &p.slots, r).into());
        }
        let counts = s.clone_dtoh(&p.counts).map_err(driver)?;
        let mut summary = LaunchSummary {
            programs: p.total,
            elements_loaded: counts[0],
            elements_stored: counts[1],
            elements_atomic: counts[2],
            ..Default::default()
        };
        for (li, &inst) in c.gen.loops.iter().enumerate() {
            let t = counts[3 + li];
            if t > 0 {
                let e = summary.max_trips.entry(inst).or_insert(0);
                *e = (*e).max(t - 1);
            }
        }
        if p.writers {
            for (t, sl) in &p.slots {
                if let (true, Some(m)) = (sl.stored || sl.atomic, &sl.marks) {
                    let marks = (m.w.as_ref(), m.a.as_ref(), m.wi.as_ref(), m.ak.as_ref());
                    let w = match self.writer_runs(*t, sl.numel, marks, p.wide)? {
                        Some(w) => w,
                        None => writers_of(s, *t, sl.numel, m, p.wide)?,
                    };
                    summary.writers.push(w);
                }
            }
        }
        let Place::Host(mem) = place else { return Ok(Some(summary)) };
        for (t, sl) in &p.slots {
            if let (true, false, Buf::Owned(buf)) = (sl.stored || sl.atomic, sl.scratch, &sl.buf) {
                let old = mem.get(*t);
                let data = data_from_device(old.dtype(), sl.numel, |dst| {
                    s.memcpy_dtoh(&buf.slice(0..dst.len()), dst).map_err(driver)?;
                    s.synchronize().map_err(driver)
                })?;
                let nt = tilegrad_reference::HostTensor::new(old.dtype(), old.shape(), data)?;
                *mem.get_mut(*t) = nt;
            }
        }
        Ok(Some(summary))
    }
}

/// The argument block of a generated kernel, passed by value (codegen's `TgArgs`).
#[repr(C)]
struct ArgBlock([u64; ARG_WORDS]);

// SAFETY: plain words, laid out as the kernel's `struct TgArgs { u64 w[ARG_WORDS]; }`.
unsafe impl DeviceRepr for ArgBlock {}

/// A launch's device buffers and argument block.
struct Prepared {
    slots: Vec<(TensorId, Slot)>,
    param_slot: Vec<Option<usize>>,
    counters: CudaSlice<u32>,
    errs: CudaSlice<u64>,
    flags: CudaSlice<u32>,
    counts: CudaSlice<u64>,
    _scratch: Option<CudaSlice<u8>>,
    _log: CudaSlice<u64>,
    args: Box<ArgBlock>,
    cfg: LaunchConfig,
    races: bool,
    writers: bool,
    /// Store marks are 64-bit stamps (else 32-bit).
    wide: bool,
    /// The first program that runs (where the counters start) and how many run.
    first: u32,
    total: u64,
}

struct Marks {
    /// Each element's last store stamp: (program + 1) << 8 | store count in 32 bits, or
    /// (program + 1) << 32 | store count in 64 (two words, low first) where the launch is wide.
    w: Option<CudaSlice<u32>>,
    r: Option<CudaSlice<u32>>,
    a: Option<CudaSlice<u32>>,
    /// For blame: each element's storing instruction + 1.
    wi: Option<CudaSlice<u32>>,
    /// For blame: each element's largest atomic key (program + 1, atomic count, instruction).
    ak: Option<CudaSlice<u64>>,
}

struct Slot {
    buf: Buf,
    numel: usize,
    loaded: bool,
    stored: bool,
    atomic: bool,
    /// Never copied in or back ([`tilegrad_reference::Options::scratch`]).
    scratch: bool,
    marks: Option<Marks>,
}

/// Who wrote each element of a tensor, as the reference's [`Writers`] says it: the storing
/// program and its last store there, else the atomic updater (or `MANY`) and the last atomic
/// in program order.
fn writers_of(s: &Arc<CudaStream>, t: TensorId, n: usize, m: &Marks, wide: bool) -> Result<Writers, GpuError> {
    // Marks the launch did not keep read as 0 (no copy of zeros).
    let get32 = |b: &Option<CudaSlice<u32>>| b.as_ref().map(|b| s.clone_dtoh(b).map_err(driver)).transpose();
    let get64 = |b: &Option<CudaSlice<u64>>| b.as_ref().map(|b| s.clone_dtoh(b).map_err(driver)).transpose();
    let (w, a, wi, ak) = (get32(&m.w)?, get32(&m.a)?, get32(&m.wi)?, get64(&m.ak)?);
    let at32 = |v: &Option<Vec<u32>>, e: usize| v.as_ref().map_or(0, |v| v[e]);
    // The storing program + 1 of each element (0: none).
    let stored = |e: usize| match &w {
        None => 0,
        Some(w) if wide => w[2 * e + 1],
        Some(w) => w[e] >> 8,
    };
    let each = (0..n).map(|e| {
        let (st, ae) = (stored(e), at32(&a, e));
        if st != 0 {
            (st - 1, at32(&wi, e).wrapping_sub(1))
        } else if ae != 0 {
            let key = ak.as_ref().map_or(0, |v| v[e]);
            (if ae == Writers::MANY { Writers::MANY } else { ae - 1 }, (key & 0xffff) as u32)
        } else {
            (Writers::NONE, Writers::NONE)
        }
    });
    Ok(Writers::from_elements(t, each))
}

/// A tensor's device storage during a launch: a copy of host memory, or the caller's own.
enum Buf {
    Owned(CudaSlice<u8>),
    Borrowed(u64),
}

impl Buf {
    fn ptr(&self, s: &Arc<CudaStream>) -> u64 {
        match self {
            Buf::Owned(b) => b.device_ptr(s).0,
            Buf::Borrowed(addr) => *addr,
        }
    }
}

/// Where a launch's tensors are: host memory (copied to the device and the written ones back),
/// or the caller's device memory, used in place (with a copy of what the launch writes, until
/// it has settled).
pub(crate) enum Place<'a> {
    Host(&'a mut Memory),
    Device { mem: &'a DeviceMemory, backup: Option<Backup> },
}

impl Place<'_> {
    /// Tensors of the right names and dtypes, for checking a launch's arguments.
    fn layout(&self) -> &Memory {
        match self {
            Place::Host(m) => m,
            Place::Device { mem, .. } => mem.layout(),
        }
    }
}

/// Runs a launch on the reference interpreter.
pub(crate) fn reference(launch: &Launch, mem: &mut Memory, why: &str) -> Result<Outcome, GpuError> {
    let summary = launch.run(mem)?;
    Ok(Outcome { summary, ran_on: RanOn::Reference(why.to_string()) })
}

/// The bits a scalar parameter arrives in (f16/bf16/f32 as the f32 bits of their rounded value).
fn scalar_bits(l: Lit, d: DType) -> u64 {
    match d {
        DType::I1 => (l.as_i64() != 0) as u64,
        DType::I32 => l.as_i64() as i32 as i64 as u64,
        DType::I64 => l.as_i64() as u64,
        DType::F16 => half::f16::from_f64(l.as_f64()).to_f32().to_bits() as u64,
        DType::BF16 => half::bf16::from_f64(l.as_f64()).to_f32().to_bits() as u64,
        DType::F32 => (l.as_f64() as f32).to_bits() as u64,
        DType::F64 => l.as_f64().to_bits(),
    }
}

/// A tensor's data as device storage bytes (i1 as one byte; f16/bf16, held as f32 values, as
/// their 16 bits), padded to a multiple of 4 bytes (atomics on i1 update whole words).
pub(crate) fn tensor_bytes(dt: DType, d: &Data) -> Vec<u8> {
    let mut out: Vec<u8> = match (dt, d) {
        (DType::F16, Data::F32(v)) => v.iter().flat_map(|&x| half::f16::from_f32(x).to_bits().to_le_bytes()).collect(),
        (DType::BF16, Data::F32(v)) => v.iter().flat_map(|&x| half::bf16::from_f32(x).to_bits().to_le_bytes()).collect(),
        (_, Data::I1(v)) => v.iter().map(|&b| b as u8).collect(),
        (_, Data::I32(v)) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        (_, Data::I64(v)) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        (_, Data::F64(v)) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        (_, Data::F32(v)) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    };
    out.resize(out.len().div_ceil(4).max(1) * 4, 0);
    out
}

/// A tensor's data as the bytes the device stores: the host's own bytes where their layout is
/// the device's (f32, f64, i32 and i64 on a little-endian host: no copy of a large tensor
/// before its upload), else converted ([`tensor_bytes`]).
pub(crate) fn stored_bytes(dt: DType, d: &Data) -> std::borrow::Cow<'_, [u8]> {
    fn raw<T: Copy>(v: &[T]) -> &[u8] {
        // SAFETY: plain numbers without padding, viewed as their bytes for the slice's life.
        unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
    }
    let native = cfg!(target_endian = "little") && !d.is_empty();
    match (dt, d) {
        (DType::F32, Data::F32(v)) if native => raw(v).into(),
        (DType::F64, Data::F64(v)) if native => raw(v).into(),
        (DType::I32, Data::I32(v)) if native => raw(v).into(),
        (DType::I64, Data::I64(v)) if native => raw(v).into(),
        _ => tensor_bytes(dt, d).into(),
    }
}

/// A tensor's data from the device: `copy` fills a host buffer of the `n` elements' stored
/// bytes; f32, f64, i32 and i64 land in their vectors directly (no second copy).
pub(crate) fn data_from_device(dt: DType, n: usize, copy: impl FnOnce(&mut [u8]) -> Result<(), GpuError>) -> Result<Data, GpuError> {
    fn typed<T: Copy + Default>(
        n: usize,
        copy: impl FnOnce(&mut [u8]) -> Result<(), GpuError>,
        wrap: fn(Vec<T>) -> Data,
    ) -> Result<Data, GpuError> {
        let mut v = vec![T::default(); n];
        // SAFETY: plain numbers: every bit pattern written into their bytes is a value.
        let bytes = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v.as_slice())) };
        if !bytes.is_empty() {
            copy(bytes)?;
        }
        Ok(wrap(v))
    }
    let le = cfg!(target_endian = "little");
    match dt {
        DType::F32 if le => typed(n, copy, Data::F32),
        DType::F64 if le => typed(n, copy, Data::F64),
        DType::I32 if le => typed(n, copy, Data::I32),
        DType::I64 if le => typed(n, copy, Data::I64),
        _ => {
            let mut b = vec![0u8; n * crate::device_bytes(dt)];
            if !b.is_empty() {
                copy(&mut b)?;
            }
            Ok(from_bytes(dt, &b, n))
        }
    }
}

/// Device storage bytes back to a tensor's data.
pub(crate) fn from_bytes(dt: DType, b: &[u8], n: usize) -> Data {
    match dt {
        DType::I1 => Data::I1(b[..n].iter().map(|&x| x != 0).collect()),
        DType::I32 => Data::I32(b.chunks_exact(4).take(n).map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()),
        DType::I64 => Data::I64(b.chunks_exact(8).take(n).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()),
        DType::F64 => Data::F64(b.chunks_exact(8).take(n).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()),
        DType::F32 => Data::F32(b.chunks_exact(4).take(n).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()),
        DType::F16 => {
            Data::F32(b.chunks_exact(2).take(n).map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()).collect())
        }
        DType::BF16 => {
            Data::F32(b.chunks_exact(2).take(n).map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()).collect())
        }
    }
}

/// The reference's error for a device error record.
fn decode_error(
    c: &Compiled,
    launch: &Launch,
    mem: &Memory,
    param_slot: &[Option<usize>],
    slots: &[(TensorId, Slot)],
    r: &[u64],
) -> ExecError {
    let k = launch.kernel();
    let (inst, kind) = c.gen.sites[r[1] as usize - 1];
    let d = k.inst(inst);
    let site = Box::new(Site { kernel: k.name.clone(), op: d.op.mnemonic(), loc: d.loc.clone(), pid: launch.grid().pid(r[0]) });
    match kind {
        ERR_OOB => {
            let j = r[5] as usize;
            let t = param_slot[j].map(|at| slots[at].0).expect("out-of-bounds records name a pointer parameter");
            let shape = k.ty(d.args[0]).shape.clone();
            let mut lane = vec![0; shape.len()];
            let mut l = r[3] as usize;
            for dim in (0..shape.len()).rev() {
                lane[dim] = l % shape[dim];
                l /= shape[dim];
            }
            let numel = param_slot[j].map_or(0, |at| slots[at].1.numel);
            ExecError::OutOfBounds { site, tensor: mem.name(t).to_string(), offset: r[4] as i64, numel, lane }
        }
        ERR_LOOP => {
            let max_iters = match &d.op {
                Op::For { max_iters, .. } | Op::While { max_iters, .. } => max_iters.unwrap_or(0),
                _ => 0,
            };
            ExecError::LoopBound { site, trips: r[5], max_iters }
        }
        ERR_RUNTIME => ExecError::Runtime { site, message: c.gen.messages.get(r[5] as usize).cloned().unwrap_or_default() },
        other => ExecError::Runtime { site, message: format!("unknown device error kind {other}") },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_bytes_round_trip() {
        let f = Data::F32(vec![1.5, -0.0, 65504.0, 6.1e-5]);
        for dt in [DType::F32, DType::F16, DType::BF16] {
            let data = match (&f, dt) {
                (Data::F32(v), DType::BF16) => Data::F32(v.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect()),
                (Data::F32(v), DType::F16) => Data::F32(v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()),
                _ => f.clone(),
            };
            let b = tensor_bytes(dt, &data);
            assert_eq!(b.len() % 4, 0);
            assert_eq!(from_bytes(dt, &b, 4), data, "{dt}");
        }
        let i = Data::I1(vec![true, false, true]);
        assert_eq!(from_bytes(DType::I1, &tensor_bytes(DType::I1, &i), 3), i);
        let l = Data::I64(vec![i64::MIN, 3, -7]);
        assert_eq!(from_bytes(DType::I64, &tensor_bytes(DType::I64, &l), 3), l);
    }

    /// The uploads' borrowed bytes and the downloads' direct copies are those of the converting
    /// paths, in every dtype, empty tensors included.
    #[test]
    fn stored_bytes_and_direct_downloads_match_the_conversions() {
        let cases = [
            (DType::F32, Data::F32(vec![1.5, -0.0, f32::MIN_POSITIVE, 3.25e7, f32::NAN])),
            (DType::F64, Data::F64(vec![0.1, -2.5e-300, 7.0])),
            (DType::I32, Data::I32(vec![i32::MIN, -1, 5])),
            (DType::I64, Data::I64(vec![i64::MAX, 0, -9])),
            (DType::F16, Data::F32(vec![0.5, -2.0, 65504.0])),
            (DType::I1, Data::I1(vec![true, false, true])),
            (DType::F32, Data::F32(Vec::new())),
        ];
        for (dt, data) in cases {
            let n = data.len();
            let want = tensor_bytes(dt, &data);
            let got = stored_bytes(dt, &data);
            assert_eq!(&got[..], &want[..got.len()], "{dt}");
            assert!(got.len() >= n * crate::device_bytes(dt), "{dt}");
            let back = data_from_device(dt, n, |dst| {
                dst.copy_from_slice(&want[..dst.len()]);
                Ok(())
            })
            .unwrap();
            assert_eq!(format!("{back:?}"), format!("{:?}", from_bytes(dt, &want, n)), "{dt}");
        }
    }

    #[test]
    fn compiles_to_machine_code_where_nvrtc_is_installed() {
        if !nvrtc_present() {
            eprintln!("skipped: NVRTC is not installed");
            return;
        }
        let k = tilegrad_ir::text::parse_kernel(include_str!("../../examples/vector_add.tgir"), "vector_add.tgir").unwrap();
        let sm90 = Target { sm: "sm_90".into(), quick: false };
        let image = nvrtc_cubin(&codegen::generate(&k).unwrap().source, &sm90).unwrap();
        assert_eq!(&image[..4], b"\x7fELF", "an ELF image, not PTX text");
        let log = nvrtc_cubin("extern \"C\" __global__ void f() { undefined_name(); }", &sm90).unwrap_err();
        assert!(log.contains("undefined_name"), "{log}");
        let quick = nvrtc_cubin(&codegen::generate(&k).unwrap().source, &Target { quick: true, ..sm90 }).unwrap();
        assert_eq!(&quick[..4], b"\x7fELF");
        assert_ne!(quick, image, "a quick compile gives other machine code");
    }

    /// The compile log has each compile, named, with the time a caller waited for it: a wait
    /// for a background compile, or all of a compile in line.
    #[test]
    fn the_compile_log_tells_what_compiled_and_how_long_it_was_waited_for() {
        if !nvrtc_present() {
            eprintln!("skipped: NVRTC is not installed");
            return;
        }
        let k = tilegrad_ir::text::parse_kernel(include_str!("../../examples/vector_add.tgir"), "vector_add.tgir").unwrap();
        // A source of its own (a comment), so that no cache has it.
        let source = format!("// {:?}\n{}", std::time::SystemTime::now(), codegen::generate(&k).unwrap().source);
        let target = Target { sm: "sm_90".into(), quick: false };
        let job = |what: &str, target: &Target| Job {
            key: source_key(target, &source),
            source: source.clone(),
            target: target.clone(),
            what: what.into(),
        };
        let ahead = Arc::new(Ahead::default());
        let start = std::time::Instant::now();
        let background = job("vector_add", &target);
        let key = background.key;
        ahead.expect([key]);
        ahead.compile_in_background(vec![background]);
        ahead.take(key);
        let quick = Target { quick: true, ..target.clone() };
        ahead.compile_now(&job("vector_add, compiled quickly", &quick)).unwrap();
        let log = ahead.compiles_since(start);
        let what: Vec<&str> = log.iter().map(|c| c.what.as_str()).collect();
        assert_eq!(what, ["vector_add", "vector_add, compiled quickly"]);
        let (bg, now) = (&log[0], &log[1]);
        assert!(bg.waited > std::time::Duration::ZERO && bg.waited <= start.elapsed(), "{bg:?}");
        assert_eq!(now.waited, now.ended - now.started, "a compile in line is waited for whole");
        assert!(bg.ended <= now.started);
        assert!(ahead.compiles_since(std::time::Instant::now()).is_empty());
    }

    #[test]
    fn a_compile_is_named_by_its_kernel_its_floats_and_its_form() {
        let k = tilegrad_ir::text::parse_kernel(include_str!("../../examples/vector_add.tgir"), "vector_add.tgir").unwrap();
        let mut wide = k.clone();
        for p in &mut wide.params {
            if let ParamKind::Ptr(d) = &mut p.kind {
                *d = DType::F64;
            }
        }
        assert_eq!(compile_what(&k, false, false), "vector_add");
        assert_eq!(compile_what(&k, false, true), "vector_add, compiled quickly");
        assert_eq!(compile_what(&wide, true, false), "vector_add in f64, form for fewer blocks an SM");
    }

    /// A quick compile differs from a full one only in how hard NVRTC optimises (the numerics
    /// flags are the same), and has a cache key of its own; a full one keeps the keys it had.
    #[test]
    fn quick_compiles_keep_the_numerics_and_a_cache_key_of_their_own() {
        let full = Target { sm: "sm_90".into(), quick: false };
        let quick = Target { quick: true, ..full.clone() };
        let (f, q) = (full.flags(), quick.flags());
        for flag in ["--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false", "--gpu-architecture=sm_90"] {
            assert!(f.iter().any(|x| x == flag) && q.iter().any(|x| x == flag), "{flag}: {f:?} {q:?}");
        }
        let extra: Vec<_> = q.iter().filter(|x| !f.contains(x)).collect();
        assert_eq!(extra, ["-Ofc=mid"]);
        assert!(!f.iter().any(|x| x.starts_with("-Ofc")));
        let src = "extern \"C\" __global__ void f() {}";
        assert_ne!(source_key(&full, src), source_key(&quick, src));
        assert_eq!(source_key(&full, src), crate::compile::hash128(&format!("sm_90\n{src}")));
    }

    #[test]
    fn hashes_are_stable() {
        use crate::compile::hash128;
        assert_eq!(hash128(""), 0x6c62272e07bb014262b821756295c58d);
        assert_ne!(hash128("a"), hash128("b"));
    }
}
