//! Compiling generated CUDA C: NVRTC's options, machine code for the device's architecture, the
//! disk cache by source hash, and compiles ahead of launches, in parallel.
//!
//! NVRTC (CUDA 13) keeps a cache of its own, beside the driver's (`~/.nv/ComputeCache`;
//! `CUDA_CACHE_DISABLE=1` turns it off). A compile it has seen before takes 40-70 ms on a
//! 16-core H100 host; a new one 0.4-1.0 s for the kernels of `examples/` (the weighted sum's
//! forward, backward and VJP kernels, one after another: 1.7-3.4 s). Compiles ahead therefore
//! run on threads: four new ones side by side took 1.0-1.3 s. Helper processes did worse, each
//! paying NVRTC's start (about 0.2 s), and kernels for small launches compile quickly
//! ([`Target`]), which brought those four to 0.8-0.9 s.
//!
//! The forms for fewer blocks an SM of kernels about to run large launches compile in the
//! background. A compile still running on a thread when the process exits would meet NVRTC torn
//! down under it (the process crashed, after its last line of output, with SIGSEGV): the process
//! waits for them at exit. Small launches queue none, so that a small check neither waits at
//! exit nor compiles forms it does not run (waiting cost one 0.9 s).

use crate::GpuError;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use tilegrad_ir::Kernel;

/// What generated code is compiled for: a real architecture (`sm_90`), and whether NVRTC
/// compiles it quickly (`-Ofc=mid`) rather than optimising it fully.
///
/// A quick compile takes about a third less time (cold, on an H100 host: 0.3-0.7 s a kernel
/// instead of 0.4-1.0 s) and gives code that runs several times slower (the weighted-sum
/// forward at 65536x1024: 1.97 ms against 0.26 ms). It suits small launches, whose run takes
/// far less than their compile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) sm: String,
    pub(crate) quick: bool,
}

impl Target {
    /// NVRTC's flags for generated kernels: [`nvrtc_options`]' for this architecture, and how
    /// hard to optimise.
    pub(crate) fn flags(&self) -> Vec<String> {
        let o = nvrtc_options(&self.sm);
        let on = |name: &str, v: Option<bool>| v.map(|v| format!("--{name}={v}"));
        let mut f: Vec<String> = [on("ftz", o.ftz), on("prec-sqrt", o.prec_sqrt), on("prec-div", o.prec_div), on("fmad", o.fmad)]
            .into_iter()
            .flatten()
            .chain(o.options)
            .collect();
        if self.quick {
            f.push("-Ofc=mid".into());
        }
        f
    }
}

/// NVRTC's options for generated kernels: no contraction of `a * b + c` (the reference rounds
/// twice; the fused steps of an f32 `dot` are written out), IEEE division and square root, no
/// flush to zero; for a real architecture (`sm_90`, [`Target::flags`]) or PTX of a virtual one
/// (`compute_90`).
fn nvrtc_options(arch: &str) -> cudarc::nvrtc::CompileOptions {
    cudarc::nvrtc::CompileOptions {
        fmad: Some(false),
        prec_div: Some(true),
        prec_sqrt: Some(true),
        ftz: Some(false),
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
        ..Default::default()
    }
}

pub(crate) fn nvrtc(k: &Kernel, source: &str, arch: &str) -> Result<cudarc::nvrtc::Ptx, GpuError> {
    cudarc::nvrtc::compile_ptx_with_opts(source, nvrtc_options(arch)).map_err(|e| GpuError::Compile {
        kernel: k.name.clone(),
        log: match &e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => format!("{other:?}"),
        },
    })
}

/// Compiles CUDA C to machine code for a real architecture (`sm_90`): NVRTC runs the assembler
/// too, so that loading the module costs no JIT in the driver. The CUBIN, or the compiler's log.
pub(crate) fn nvrtc_cubin(source: &str, target: &Target) -> Result<Vec<u8>, String> {
    use cudarc::nvrtc::{result, sys};
    let src = std::ffi::CString::new(source).map_err(|_| "the generated source holds a NUL byte".to_string())?;
    let prog = result::create_program(&src, None).map_err(|e| format!("NVRTC: {e:?}"))?;
    let flags = target.flags();
    // SAFETY: `prog` was created above from `src`, which outlives it, and is destroyed once, last.
    let out = unsafe {
        match result::compile_program(prog, &flags) {
            Err(e) => Err(match result::get_program_log(prog) {
                Ok(log) => std::ffi::CStr::from_ptr(log.as_ptr()).to_string_lossy().into_owned(),
                Err(_) => format!("NVRTC: {e:?}"),
            }),
            Ok(()) => {
                let mut n = 0usize;
                sys::nvrtcGetCUBINSize(prog, &mut n).result().map_err(|e| format!("NVRTC: {e:?}")).and_then(|()| {
                    let mut image = vec![0u8; n];
                    sys::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast()).result().map_err(|e| format!("NVRTC: {e:?}"))?;
                    Ok(image)
                })
            }
        }
    };
    // SAFETY: as above; nothing uses `prog` after this.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// A compile to do: the source, its target, its cache key ([`source_key`]) and what it is, in
/// words, for the compile log ([`Compile`]).
pub(crate) struct Job {
    pub(crate) key: u128,
    pub(crate) source: String,
    pub(crate) target: Target,
    pub(crate) what: String,
}

/// One NVRTC compile of this process, for `--timings`: what was compiled, when it started and
/// ended, and how long launches waited for it (a launch whose kernel is still compiling in the
/// background waits; one compiled in line waits for all of it).
#[derive(Clone, Debug)]
pub struct Compile {
    /// The kernel (its name and form), or the fixed CUDA C (draws, summaries, conversions).
    pub what: String,
    /// When NVRTC started on it.
    pub started: std::time::Instant,
    /// When it ended.
    pub ended: std::time::Instant,
    /// How long launches (or draws and summaries) waited for it.
    pub waited: std::time::Duration,
}

/// Writes `job`'s source into the folder `TILEGRAD_GPU_SOURCES` names, if any, as
/// `<kernel>-<cache key>.cu`: to read what NVRTC compiles, and which forms of a kernel a process
/// compiles (a name with two keys is two forms). Best effort: a write that fails is skipped.
fn keep_source(job: &Job) {
    let Some(dir) = std::env::var_os("TILEGRAD_GPU_SOURCES") else { return };
    let name: String = job.what.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
    let dir = std::path::PathBuf::from(dir);
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(format!("{name}-{:032x}.cu", job.key)), format!("// {}\n{}", job.what, job.source));
}

/// Runs NVRTC on `job`, writing down the compile in `log` (by cache key).
fn logged(job: &Job, log: &Mutex<Vec<(u128, Compile)>>) -> Option<Vec<u8>> {
    keep_source(job);
    let started = std::time::Instant::now();
    let image = nvrtc_cubin(&job.source, &job.target).ok();
    let c = Compile { what: job.what.clone(), started, ended: std::time::Instant::now(), waited: Default::default() };
    log.lock().expect("compile log").push((job.key, c));
    image
}

/// Compiles `jobs` on up to as many threads as the host has cores, handing each image (or
/// `None` where NVRTC failed) to `done` with its job's index as soon as it is compiled.
fn compile_on_threads(jobs: &[Job], log: &Mutex<Vec<(u128, Compile)>>, done: &(dyn Fn(usize, Option<Vec<u8>>) + Sync)) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(jobs.len());
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                done(i, logged(job, log));
            });
        }
    });
}

/// Background compiles still running (see [`wait_at_exit`]).
static RUNNING: Mutex<usize> = Mutex::new(0);
static RUNNING_DONE: Condvar = Condvar::new();

/// Waits until no compile runs in the background, at most `limit`. A process must not exit
/// while one runs; where a host program tears the process down before the C library's
/// `atexit` handlers (the Python interpreter's finalization releases the CUDA libraries torch
/// loaded), it calls this first (the Python package does, from its own `atexit`).
pub fn wait_for_background_compiles(limit: std::time::Duration) {
    let deadline = std::time::Instant::now() + limit;
    let Ok(mut n) = RUNNING.lock() else { return };
    while *n > 0 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return;
        }
        n = match RUNNING_DONE.wait_timeout(n, left) {
            Ok((n, _)) => n,
            Err(_) => return,
        };
    }
}

/// Makes the process wait, when it exits, for the compiles [`RUNNING`] counts (at most a
/// minute): registered once, with the C library's `atexit`.
fn wait_at_exit() {
    #[cfg(unix)]
    {
        extern "C" fn wait() {
            wait_for_background_compiles(std::time::Duration::from_secs(60));
        }
        extern "C" {
            fn atexit(f: extern "C" fn()) -> std::os::raw::c_int;
        }
        static ONCE: std::sync::Once = std::sync::Once::new();
        // SAFETY: `wait` is a plain function that only takes a lock and waits on a condvar.
        ONCE.call_once(|| unsafe {
            atexit(wait);
        });
    }
}

/// Machine code compiled ahead ([`crate::Gpu::precompile`]): images where no disk cache keeps
/// them, and the sources still compiling in the background, by source hash.
#[derive(Default)]
pub(crate) struct Ahead {
    images: Mutex<HashMap<u128, Vec<u8>>>,
    pending: Mutex<std::collections::HashSet<u128>>,
    done: Condvar,
    /// Every compile of this device's kernels, by cache key, in the order they ended.
    log: Mutex<Vec<(u128, Compile)>>,
}

impl Ahead {
    /// Marks `keys` as compiling, before [`Ahead::compile`] or [`Ahead::compile_in_background`].
    pub(crate) fn expect(&self, keys: impl IntoIterator<Item = u128>) {
        self.pending.lock().expect("compiling ahead").extend(keys);
    }

    /// Compiles `todo` side by side: each image to the disk cache, or kept, and available (to a
    /// launch waiting for it) as soon as it is compiled, not when the last of `todo` is.
    pub(crate) fn compile(&self, todo: &[Job]) {
        if todo.is_empty() {
            return;
        }
        compile_on_threads(todo, &self.log, &|i, image| {
            let key = todo[i].key;
            if let Some(image) = image {
                if !write_cache(key, &image) {
                    self.images.lock().expect("compiled ahead").insert(key, image);
                }
            }
            self.pending.lock().expect("compiling ahead").remove(&key);
            self.done.notify_all();
        });
    }

    /// [`Ahead::compile`] on a thread of its own. The process's exit waits for it
    /// ([`wait_at_exit`]).
    pub(crate) fn compile_in_background(self: &Arc<Self>, todo: Vec<Job>) {
        if todo.is_empty() {
            return;
        }
        wait_at_exit();
        *RUNNING.lock().expect("running compiles") += 1;
        let ahead = self.clone();
        std::thread::spawn(move || {
            ahead.compile(&todo);
            *RUNNING.lock().expect("running compiles") -= 1;
            RUNNING_DONE.notify_all();
        });
    }

    /// Waits until nothing compiles in the background for this device.
    pub(crate) fn wait_all(&self) {
        let mut pending = self.pending.lock().expect("compiling ahead");
        while !pending.is_empty() {
            pending = self.done.wait(pending).expect("compiling ahead");
        }
    }

    /// Whether `key` is still compiling in the background.
    pub(crate) fn compiling(&self, key: u128) -> bool {
        self.pending.lock().expect("compiling ahead").contains(&key)
    }

    /// Whether an image of `key` compiled ahead is kept in memory.
    pub(crate) fn has(&self, key: u128) -> bool {
        self.images.lock().expect("compiled ahead").contains_key(&key)
    }

    /// The image of `key` compiled ahead, waiting while it compiles in the background (the
    /// wait written down in the compile log).
    pub(crate) fn take(&self, key: u128) -> Option<Vec<u8>> {
        let start = std::time::Instant::now();
        let mut pending = self.pending.lock().expect("compiling ahead");
        let waits = pending.contains(&key);
        while pending.contains(&key) {
            pending = self.done.wait(pending).expect("compiling ahead");
        }
        drop(pending);
        if waits {
            let mut log = self.log.lock().expect("compile log");
            if let Some((_, c)) = log.iter_mut().rev().find(|(k, _)| *k == key) {
                c.waited += start.elapsed();
            }
        }
        self.images.lock().expect("compiled ahead").remove(&key)
    }

    /// Compiles `job` now, on this thread (no compile ahead had it): the image, or NVRTC's log.
    /// The caller waits for all of it.
    pub(crate) fn compile_now(&self, job: &Job) -> Result<Vec<u8>, String> {
        keep_source(job);
        let started = std::time::Instant::now();
        let image = nvrtc_cubin(&job.source, &job.target);
        let ended = std::time::Instant::now();
        let c = Compile { what: job.what.clone(), started, ended, waited: ended - started };
        self.log.lock().expect("compile log").push((job.key, c));
        image
    }

    /// The compiles that started at or after `since`, in the order they ended.
    pub(crate) fn compiles_since(&self, since: std::time::Instant) -> Vec<Compile> {
        let log = self.log.lock().expect("compile log");
        log.iter().filter(|(_, c)| c.started >= since).map(|(_, c)| c.clone()).collect()
    }

    /// Every compile, in the order they ended.
    pub(crate) fn compiles(&self) -> Vec<Compile> {
        self.log.lock().expect("compile log").iter().map(|(_, c)| c.clone()).collect()
    }
}

/// FNV-1a, 128 bits: a hash that stays the same across builds (for the disk cache).
pub(crate) fn hash128(s: &str) -> u128 {
    let mut h: u128 = 0x6c62272e07bb014262b821756295c58d;
    for b in s.bytes() {
        h ^= b as u128;
        h = h.wrapping_mul(0x0000000001000000000000000000013B);
    }
    h
}

fn cache_dir() -> Option<std::path::PathBuf> {
    if let Some(d) = std::env::var_os("TILEGRAD_CACHE_DIR") {
        return Some(d.into());
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")))?;
    Some(base.join("tilegrad").join("cuda"))
}

/// The cache key of generated source compiled for a target.
pub(crate) fn source_key(target: &Target, source: &str) -> u128 {
    hash128(&format!("{}{}\n{source}", target.sm, if target.quick { " -Ofc=mid" } else { "" }))
}

/// The disk cache's file of a compiled kernel (by the hash of its architecture and source).
pub(crate) fn cache_file(key: u128) -> Option<std::path::PathBuf> {
    cache_dir().map(|d| d.join(format!("{key:032x}.cubin")))
}

/// Writes machine code to the disk cache; says whether it did. The cache is an optimisation: a
/// failed write only costs a later compile.
pub(crate) fn write_cache(key: u128, image: &[u8]) -> bool {
    let Some(f) = cache_file(key) else { return false };
    if let Some(dir) = f.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    // Written aside and renamed, so that a reader never sees half a file.
    let tmp = f.with_extension(format!("tmp{}-{:?}", std::process::id(), std::thread::current().id()).replace(['(', ')'], ""));
    std::fs::write(&tmp, image).is_ok() && std::fs::rename(&tmp, &f).is_ok()
}
