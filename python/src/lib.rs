//! `tilegrad._native`: the engine behind the `tilegrad` Python package.
//!
//! The Python side intercepts the user's kernel launches and hands them here as a converted
//! kernel (`convert`), a grid, arguments and raw host storages (`memory`); `launch` runs them
//! in place on the reference interpreter (or on a GPU, through an [`Executor`]), `vjp` gives
//! the ground-truth f64 VJP of a launch, and `compare` / `make_report` build the same report as
//! the CLI.
#![warn(missing_docs)]

mod kernel;
mod memory;

use kernel::{base_param, KernelVariants};
use memory::{dtype, f64_slice, read_f64, write_f64, RawMem};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt};
use std::sync::Arc;
use tilegrad::check::{
    calibration, compare as compare_tensors, compare_by,
    device_compare::{compare_on_device, Compared, Naming},
    unravel, verdict, Backend, Blame, BlameSite, Executor, Failure, Finding, Formula, Init, RecordedLaunch, RecordedPass, RecordedTensor,
    Report, Rounding, TensorReport, Tolerance,
};
use tilegrad_ad::{GradOptions, Precision, VjpKernel};
use tilegrad_ir::analysis::param_uses;
use tilegrad_ir::triton::{ConstValue, ConvertOptions, GlobalBinding, GlobalFact, HostDescriptor};
use tilegrad_ir::{DType, DotPrecision, Kernel, Lit, Loc, Op, ParamKind, Value};
use tilegrad_reference::{Arg, ExecError, Grid, HostTensor, Launch, Memory, Options, TensorId, Writers};

pyo3::create_exception!(_native, UsageError, PyException, "The kernel, its arguments or the check are wrong.");
pyo3::create_exception!(_native, LaunchError, PyException, "A launch failed while running (out of bounds, race, loop bound).");

fn usage(m: impl ToString) -> PyErr {
    UsageError::new_err(m.to_string())
}

/// A kernel converted from `@triton.jit` source.
#[pyclass(name = "Kernel", module = "tilegrad._native", frozen)]
struct PyKernel {
    inner: KernelVariants,
    /// Parameters some store or atomic_add writes through.
    written: Vec<String>,
    /// What the conversion assumed (module-level bindings it could not decide), as text.
    notes: Vec<String>,
}

#[pymethods]
impl PyKernel {
    /// The kernel's name.
    #[getter]
    fn name(&self) -> String {
        self.inner.kernel.name.clone()
    }

    /// Parameters: (name, kind `ptr` | `scalar` | `constexpr`, dtype).
    fn params(&self) -> Vec<(String, &'static str, String)> {
        self.inner
            .kernel
            .params
            .iter()
            .map(|p| match &p.kind {
                ParamKind::Ptr(d) => (p.name.clone(), "ptr", d.to_string()),
                ParamKind::Scalar(d) => (p.name.clone(), "scalar", d.to_string()),
                ParamKind::Constexpr(d, _) => (p.name.clone(), "constexpr", d.to_string()),
            })
            .collect()
    }

    /// Pointer parameters some store or atomic_add writes through.
    fn written(&self) -> Vec<String> {
        self.written.clone()
    }

    /// What the conversion assumed: `file:line:col: message` for each module-level binding the
    /// kernel uses that it could not decide as the program does.
    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }

    /// Some `dot` computes on f32 operands in tf32 (looser default tolerances).
    fn uses_tf32(&self) -> bool {
        let k = &self.inner.kernel;
        let mut found = false;
        k.walk(&mut |_, d| {
            if let Op::Dot { precision: DotPrecision::Tf32 } = d.op {
                found |= d.args.iter().any(|&a| k.ty(a).dtype() == Some(DType::F32));
            }
        });
        found
    }

    /// The kernel's IR as text.
    fn ir(&self) -> String {
        self.inner.kernel.to_string()
    }
}

/// A constexpr's value as the Python side tags it: `int`, `float`, `bool`, `str`, `none`, or
/// `dtype` (the value is its text, `tl.float16` or `torch.bfloat16`).
fn const_value(name: &str, kind: &str, v: &Bound<'_, PyAny>) -> PyResult<ConstValue> {
    let bad = || usage(format!("constexpr `{name}`: a {kind} value cannot be read from {v}"));
    Ok(match kind {
        "int" => ConstValue::Int(v.extract().map_err(|_| usage(format!("constexpr `{name}`: integer out of the i64 range")))?),
        "float" => ConstValue::Float(v.extract().map_err(|_| bad())?),
        "bool" => ConstValue::Bool(v.extract().map_err(|_| bad())?),
        "str" => ConstValue::Str(v.extract().map_err(|_| bad())?),
        "none" => ConstValue::None,
        "dtype" => {
            let text: String = v.extract().map_err(|_| bad())?;
            ConstValue::DType(
                tilegrad_ir::triton::triton_dtype_name(&text)
                    .ok_or_else(|| usage(format!("constexpr `{name}` = {text}: not a dtype Triton knows")))?,
            )
        }
        _ => return Err(usage(format!("constexpr `{name}`: unknown kind `{kind}`"))),
    })
}

/// A module-level name as the Python side reads it from a module's globals: (file, name, kind,
/// value), where kind is `jit` (value: the defining file, the function's name and its first
/// line), `builtin` (value: a dotted path), or a constant kind of [`const_value`].
type PyGlobal<'py> = (String, String, String, Bound<'py, PyAny>);

/// The [`GlobalBinding`] a [`PyGlobal`] describes.
fn global_binding((file, name, kind, v): PyGlobal<'_>) -> PyResult<GlobalBinding> {
    let fact = match kind.as_str() {
        "jit" => {
            let (file, name, line): (String, String, u32) =
                v.extract().map_err(|_| usage(format!("global `{name}`: a jit function is (file, name, line), not {v}")))?;
            GlobalFact::Jit { file, name, line }
        }
        "builtin" => GlobalFact::Builtin(v.extract().map_err(|_| usage(format!("global `{name}`: a builtin's path is a str, not {v}")))?),
        k => GlobalFact::Const(const_value(&name, k, &v)?),
    };
    Ok(GlobalBinding { file, name, fact })
}

/// Converts kernel `name` of the Python source `source` (from file `file`). `constexprs`:
/// (parameter, kind, value) as [`const_value`] reads them; `descriptors`: (parameter, dtype,
/// block shape) of the host-built tensor descriptors passed; `promoted`: the tensors are the
/// ground truth's f64 promotion of the user's (see `ConvertOptions::promoted`);
/// `triton_version`, `env`, `device`: what the running program has (`triton.__version__`,
/// `os.environ`, `torch.cuda.get_device_capability()`), which module-level checks of the
/// kernel's files are decided against (the defaults of `ConvertOptions` where not given);
/// `globals`: what module-level names of the kernel's files are in the running program (see
/// [`PyGlobal`]), taken over the converter's reading of those files.
#[pyfunction]
#[pyo3(signature = (source, file, name, constexprs, pointer_dtypes, scalar_dtypes, descriptors, promoted=false, triton_version=None, env=None, device=None, globals=None))]
#[allow(clippy::too_many_arguments)]
fn convert(
    source: &str,
    file: &str,
    name: &str,
    constexprs: Vec<(String, String, Bound<'_, PyAny>)>,
    pointer_dtypes: Vec<(String, String)>,
    scalar_dtypes: Vec<(String, String)>,
    descriptors: Vec<(String, String, Vec<usize>)>,
    promoted: bool,
    triton_version: Option<String>,
    env: Option<Vec<(String, String)>>,
    device: Option<(u32, u32)>,
    globals: Option<Vec<PyGlobal<'_>>>,
) -> PyResult<PyKernel> {
    let defaults = ConvertOptions::default();
    let parse = |v: Vec<(String, String)>| -> PyResult<Vec<_>> { v.into_iter().map(|(n, d)| Ok((n, dtype(&d).map_err(usage)?))).collect() };
    let opts = ConvertOptions {
        constexprs: constexprs.into_iter().map(|(n, k, v)| Ok((n.clone(), const_value(&n, &k, &v)?))).collect::<PyResult<_>>()?,
        pointer_dtypes: parse(pointer_dtypes)?,
        scalar_dtypes: parse(scalar_dtypes)?,
        descriptors: descriptors
            .into_iter()
            .map(|(n, d, block_shape)| Ok((n, HostDescriptor { dtype: dtype(&d).map_err(usage)?, block_shape })))
            .collect::<PyResult<_>>()?,
        // The function was launched as a JITFunction: whatever form made it one (an alias of
        // `triton.jit(fn)`, a wrapper of another package), it is a kernel.
        assume_jit: true,
        promoted,
        triton_version: triton_version.unwrap_or(defaults.triton_version),
        env: env.unwrap_or_default(),
        device_capability: device.unwrap_or(defaults.device_capability),
        globals: globals.unwrap_or_default().into_iter().map(global_binding).collect::<PyResult<_>>()?,
        ..ConvertOptions::default()
    };
    let (k, notes) = tilegrad_ir::triton::convert_noted(source, file, name, &opts).map_err(usage)?;
    let uses = param_uses(&k);
    let written = k.params.iter().zip(&uses).filter(|(_, u)| u.stored || u.atomic).map(|(p, _)| p.name.clone()).collect();
    let notes = notes.iter().map(|n| n.to_string()).collect();
    Ok(PyKernel { inner: KernelVariants::new(k), written, notes })
}

/// A launch as the Python side describes it, resolved against host memory.
struct Call {
    kernel: Arc<Kernel>,
    grid: Grid,
    args: Vec<(String, Arg)>,
    mems: Vec<RawMem>,
    /// The pointer parameters taking a base offset (the kernel variant's).
    based: Vec<String>,
}

fn scalar(v: &Bound<'_, PyAny>, name: &str) -> PyResult<Lit> {
    if v.is_instance_of::<PyBool>() {
        Ok(Lit::Bool(v.extract()?))
    } else if v.is_instance_of::<PyInt>() {
        Ok(Lit::Int(v.extract().map_err(|_| usage(format!("argument `{name}`: integer out of the i64 range")))?))
    } else if v.is_instance_of::<PyFloat>() {
        Ok(Lit::Float(v.extract()?))
    } else {
        Err(usage(format!("argument `{name}`: expected a bool, int or float scalar")))
    }
}

impl Call {
    #[allow(clippy::too_many_arguments)]
    fn new(
        k: &PyKernel,
        grid: (u32, u32, u32),
        ptr_args: Vec<(String, usize, i64)>,
        scalars: &[(String, Bound<'_, PyAny>)],
        mems: Vec<(String, String, usize, usize)>,
        promote: bool,
    ) -> PyResult<Call> {
        let mems: Vec<RawMem> = mems
            .into_iter()
            .map(|(name, d, addr, numel)| Ok(RawMem { name, dtype: dtype(&d).map_err(usage)?, addr, numel }))
            .collect::<PyResult<_>>()?;
        let mut based: Vec<String> = ptr_args.iter().filter(|(_, _, b)| *b != 0).map(|(p, _, _)| p.clone()).collect();
        based.sort();
        let kernel = k.inner.variant(&based, promote).map_err(usage)?;
        let mut args = Vec::new();
        for (p, m, b) in ptr_args {
            if m >= mems.len() {
                return Err(usage(format!("argument `{p}`: storage {m} is not given")));
            }
            if b != 0 {
                args.push((base_param(&p), Arg::Scalar(Lit::Int(b))));
            }
            args.push((p, Arg::Tensor(TensorId(m as u32))));
        }
        for (p, v) in scalars {
            args.push((p.clone(), Arg::Scalar(scalar(v, p)?)));
        }
        Ok(Call { kernel, grid: Grid([grid.0, grid.1, grid.2]), args, mems, based })
    }

    fn memory(&self, promote: bool) -> Result<Memory, String> {
        let mut m = Memory::new();
        for r in &self.mems {
            m.add(&r.name, r.read(promote)?);
        }
        Ok(m)
    }

    fn launch(&self, options: Options) -> Launch<'_> {
        let mut l = Launch::new(&self.kernel, self.grid).options(options);
        for (n, a) in &self.args {
            l = l.arg(n, *a);
        }
        l
    }
}

fn exec_err(e: ExecError) -> PyErr {
    match e {
        ExecError::Invalid(_) | ExecError::Argument { .. } | ExecError::Grid { .. } | ExecError::BadTensor { .. } => usage(e),
        e => LaunchError::new_err(e.to_string()),
    }
}

/// Who wrote what in one launch, for blame.
#[pyclass(module = "tilegrad._native", frozen)]
struct LaunchRecord {
    kernel: Arc<Kernel>,
    grid: Grid,
    writers: Vec<Writers>,
    notes: Vec<Finding>,
    /// With `snapshot`: what re-running one of its programs needs.
    snapshot: Option<Snapshot>,
}

/// A launch's arguments, options and memory before and after it ran.
struct Snapshot {
    args: Vec<(String, Arg)>,
    options: Options,
    before: Memory,
    after: Memory,
}

/// A note of a report: what a launch relies on that Triton does not promise (see
/// `tilegrad::check::notes`).
#[pyclass(module = "tilegrad._native", frozen)]
struct Note(Finding);

#[pymethods]
impl Note {
    /// `masked_lanes` or `same_value_race`.
    #[getter]
    fn kind(&self) -> String {
        serde_json::to_value(self.0.kind).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()
    }

    fn __str__(&self) -> String {
        self.0.message.clone()
    }
}

/// Where the instruction defining `v` is, when an instruction defines it.
fn def_loc(k: &Kernel, v: Value) -> Option<Loc> {
    let mut found = None;
    k.walk(&mut |_, d| {
        if found.is_none() && d.results.contains(&v) {
            found = Some(d.loc.clone());
        }
    });
    found.filter(|l| !l.is_unknown())
}

#[pymethods]
impl LaunchRecord {
    /// What the launch relies on that Triton does not promise (when run with `notes`).
    fn notes(&self) -> Vec<Note> {
        self.notes.iter().cloned().map(Note).collect()
    }

    /// Which of `elements` of storage `mem` this launch wrote.
    fn wrote(&self, mem: usize, elements: Vec<usize>) -> Vec<bool> {
        let w = self.writers.iter().find(|w| w.tensor == TensorId(mem as u32));
        elements.iter().map(|&e| w.is_some_and(|w| w.of(e).is_some())).collect()
    }

    /// The store that wrote element `element` of storage `mem` in this launch (step `step` of
    /// the pass), or None when the launch did not write it.
    fn site(&self, mem: usize, element: usize, step: usize) -> Option<Site> {
        let w = self.writers.iter().find(|w| w.tensor == TensorId(mem as u32))?;
        let (p, inst) = w.of(element)?;
        let k = &self.kernel;
        let d = k.inst(inst);
        let loc = d.loc.to_string();
        if p == Writers::MANY {
            return Some(Site(BlameSite::ManyPrograms { step, kernel: k.name.clone(), loc }));
        }
        let other = |v: Option<&Value>| {
            v.and_then(|&v| def_loc(k, v)).filter(|l| l.line != d.loc.line || l.file != d.loc.file).map(|l| l.to_string())
        };
        Some(Site(BlameSite::Store {
            step,
            kernel: k.name.clone(),
            op: d.op.mnemonic().to_string(),
            loc,
            value_loc: other(d.args.get(1)),
            address_loc: other(d.args.first()),
            programs: vec![self.grid.pid(p as u64)],
            elements: 1,
        }))
    }
}

/// Where launches run: `Executor("cpu" | "gpu" | "auto" | "compare")`, the CLI's `--backend`
/// choices. `gpu` (and `compare`) raise `UsageError` saying why when no GPU is usable; `auto`
/// then uses the CPU. `describe()` says where the launches it ran went. With
/// `ground="kernels"`, [`vjp`] computes launches' ground truth by their VJP kernels run there
/// (the CLI's `--ground kernels`).
#[pyclass(frozen, name = "Executor")]
struct PyExecutor(Executor, bool);

#[pymethods]
impl PyExecutor {
    #[new]
    #[pyo3(signature = (backend, ground="auto", max_programs=None))]
    fn new(backend: &str, ground: &str, max_programs: Option<u64>) -> PyResult<PyExecutor> {
        // "auto": on the GPU the ground truth is each launch's VJP kernel, on the CPU the evaluator.
        let kernels = match ground {
            "evaluator" => Some(false),
            "kernels" => Some(true),
            "auto" => None,
            other => return Err(usage(format!("ground `{other}`: expected \"auto\", \"evaluator\" or \"kernels\""))),
        };
        let b = match backend {
            "cpu" => Backend::Cpu,
            "gpu" => Backend::Gpu,
            "auto" => Backend::Auto,
            "compare" => Backend::Compare,
            other => return Err(usage(format!("backend `{other}`: expected \"cpu\", \"gpu\", \"auto\" or \"compare\""))),
        };
        let e = Executor::new(b).map_err(usage)?.max_programs(max_programs.unwrap_or(tilegrad::check::DEFAULT_MAX_PROGRAMS));
        if let Some(g) = e.gpu() {
            // The cotangents' draws and the comparisons' kernels, while the check's first
            // launches run.
            g.precompile_utilities(true);
            // Kernels are met one launch at a time and launched again by later checks: each
            // runs quickly compiled until its optimised form is.
            g.quick_first(true);
        }
        let kernels = kernels.unwrap_or_else(|| e.on_gpu());
        Ok(PyExecutor(e, kernels))
    }

    /// Where the launches ran: `cpu`, or the GPU and the launches it passed to the reference.
    fn describe(&self) -> String {
        self.0.describe()
    }

    /// Whether launches go to the GPU (where CUDA tensors are used in place).
    #[getter]
    fn on_gpu(&self) -> bool {
        self.0.on_gpu()
    }

    /// With `compare`: where the GPU and the reference differed.
    fn mismatches(&self) -> Vec<String> {
        self.0.mismatches()
    }

    /// The GPU's NVRTC compiles in this process so far, in the order they ended: (what was
    /// compiled, seconds NVRTC took, seconds launches waited for it). Empty on the CPU.
    fn compiles(&self) -> Vec<(String, f64, f64)> {
        let Some(g) = self.0.gpu() else { return Vec::new() };
        g.compiles().into_iter().map(|c| (c.what, (c.ended - c.started).as_secs_f64(), c.waited.as_secs_f64())).collect()
    }
}

/// Runs a launch in place on host memory (on device memory with `device`). `ptr_args`:
/// (parameter, storage index, element offset of the pointer in the storage); `mems`: (name,
/// dtype, address, elements). With `promote`, floats compute in f64 (the ground truth's
/// forward). Returns who wrote what when `record`. `f64_kernel`: the kernel as the ground
/// truth converts it, whose f64 forms the GPU compiles ahead during a check's launch in the
/// kernels' dtypes (else this kernel's own).
#[pyfunction]
#[pyo3(signature = (kernel, grid, ptr_args, scalars, mems, *, poison=false, record=false, exact=false, promote=false, executor=None, notes=None, snapshot=false, device=false, f64_kernel=None))]
#[allow(clippy::too_many_arguments)]
fn launch(
    py: Python<'_>,
    kernel: &PyKernel,
    grid: (u32, u32, u32),
    ptr_args: Vec<(String, usize, i64)>,
    scalars: Vec<(String, Bound<'_, PyAny>)>,
    mems: Vec<(String, String, usize, usize)>,
    poison: bool,
    record: bool,
    exact: bool,
    promote: bool,
    executor: Option<&PyExecutor>,
    notes: Option<(String, usize, String)>,
    snapshot: bool,
    device: bool,
    f64_kernel: Option<PyRef<'_, PyKernel>>,
) -> PyResult<Option<LaunchRecord>> {
    // `notes`: (pass, step, what the step is) to note what the launch relies on.
    let pass: Option<&'static str> = match notes.as_ref().map(|n| n.0.as_str()) {
        None => None,
        Some("forward") => Some("forward"),
        Some("backward") => Some("backward"),
        Some(other) => return Err(usage(format!("notes: pass `{other}`: expected \"forward\" or \"backward\""))),
    };
    let call = Call::new(kernel, grid, ptr_args, &scalars, mems, promote)?;
    let cpu = Executor::cpu();
    let exec = executor.map_or(&cpu, |e| &e.0);
    // An absurd grid is refused before it runs, as the CLI refuses it.
    exec.check_grid(&call.kernel.name, call.grid).map_err(usage)?;
    if let (Some(p), false, true) = (pass, promote, exec.on_gpu()) {
        // The check will launch the f64 forms next (and a forward's VJP kernel): their compiles
        // overlap this launch and the host work after it. They are the forms of `f64_kernel`,
        // the kernel as the ground truth converts it, where given.
        let f64_kernel = f64_kernel.as_deref().unwrap_or(kernel);
        f64_kernel.inner.compile_ahead(&call.based, p == "forward", exec, call.grid.programs());
    }
    let poison = if poison { tilegrad_reference::POISON_ALL } else { 0 };
    // The backward under test (`exact`, and every recorded launch) reports the first error in
    // program order, as the CLI's backward does.
    let opts = Options {
        poison_masked_loads: poison,
        record_writers: record || snapshot,
        exact: exact || record || snapshot,
        ..Options::default()
    };
    let noting = pass.zip(notes.as_ref()).map(|(pass, (_, step, what))| (pass, *step, what.as_str()));
    let ran = py.allow_threads(|| -> Result<Result<_, ExecError>, String> {
        // The memory before and after, for a snapshot, and for notes where the kernel has loads
        // without `other` (whose masked-off lanes the notes run again poisoned).
        // On the device, notes run the launch again from device copies of what it writes.
        let lanes = noting.is_some() && !tilegrad_ir::analysis::unfilled_loads(&call.kernel).is_empty();
        let keep = snapshot || (lanes && !device);
        let l = call.launch(opts.clone());
        let ran = match if device { on_device(&call, &l, exec, promote, keep, lanes) } else { on_host(&call, &l, exec, promote, keep) }? {
            Ok(ran) => ran,
            Err(e) => return Ok(Err(e)),
        };
        let none = Memory::new();
        let noted = match (noting, &ran.device) {
            (Some((pass, step, what)), Some((mem, backup))) if !keep => {
                tilegrad::check::notes::of_launch_in_place(&l, (mem, backup.as_ref()), &ran.summary, exec, (pass, step, what), &|_| None)?
            }
            (Some((pass, step, what)), _) => {
                let (before, after) = (ran.before.as_ref().unwrap_or(&none), ran.after.as_ref().unwrap_or(&none));
                tilegrad::check::notes::of_launch(&l, before, after, &ran.summary, exec, pass, step, what)
            }
            (None, _) => Vec::new(),
        };
        let snap = match (ran.before, snapshot) {
            (Some(before), true) => Some(Snapshot {
                args: call.args.clone(),
                options: Options { record_writers: false, ..opts },
                before,
                after: ran.after.expect("kept"),
            }),
            _ => None,
        };
        Ok(Ok((ran.summary, noted, snap)))
    });
    let (summary, notes, snapshot) = ran.map_err(usage)?.map_err(exec_err)?;
    let wanted = record || pass.is_some() || snapshot.is_some();
    Ok(wanted.then(|| LaunchRecord { kernel: call.kernel.clone(), grid: call.grid, writers: summary.writers, notes, snapshot }))
}

/// A launch that ran, with host copies of its memory before and after where they were kept.
struct Ran {
    summary: tilegrad_reference::LaunchSummary,
    before: Option<Memory>,
    after: Option<Memory>,
    /// A launch in place: its device memory, and what it wrote as it was before it ran, where
    /// notes run it again poisoned on the device.
    device: Option<(tilegrad_gpu::DeviceMemory, Option<tilegrad_gpu::Backup>)>,
}

/// Runs a launch over host storages: read into the engine's memory, run, the written storages
/// written back.
fn on_host(call: &Call, l: &Launch, exec: &Executor, promote: bool, keep: bool) -> Result<Result<Ran, ExecError>, String> {
    let mut mem = call.memory(promote)?;
    let before = keep.then(|| mem.clone());
    let summary = match exec.run(l, &mut mem) {
        Ok(s) => s,
        Err(e) => return Ok(Err(e)),
    };
    for t in tilegrad_reference::written_tensors(&call.kernel, &call.args) {
        call.mems[t.0 as usize].write(mem.get(t))?;
    }
    Ok(Ok(Ran { summary, before, after: keep.then_some(mem), device: None }))
}

/// Runs a launch on the GPU over device storages (CUDA tensors), in place: nothing is copied to
/// the host but the memory before and after where `keep` (for notes and blame).
fn on_device(call: &Call, l: &Launch, exec: &Executor, promote: bool, keep: bool, lanes: bool) -> Result<Result<Ran, ExecError>, String> {
    let Some(gpu) = exec.gpu() else {
        return Err("CUDA tensors are used in place by the GPU backend only (backend=\"gpu\")".into());
    };
    if let Some(r) = call.mems.iter().find(|r| promote && r.dtype.is_float() && r.dtype != DType::F64) {
        return Err(format!("`{}`: a launch in f64 in place needs f64 storages, not {}", r.name, r.dtype));
    }
    let mem = device_memory(call)?;
    let before = if keep { Some(gpu.download_all(&mem).map_err(|e| e.to_string())?) } else { None };
    let backup = if lanes && !keep { Some(gpu.back_up(l, &mem).map_err(|e| e.to_string())?) } else { None };
    let summary = match exec.run_in_place(l, &mem) {
        Ok(s) => s,
        Err(tilegrad_gpu::GpuError::Exec(e)) => return Ok(Err(e)),
        Err(e) => return Err(e.to_string()),
    };
    let after = if keep { Some(gpu.download_all(&mem).map_err(|e| e.to_string())?) } else { None };
    Ok(Ok(Ran { summary, before, after, device: Some((mem, backup)) }))
}

/// A call's storages as device memory (CUDA tensors).
fn device_memory(call: &Call) -> Result<tilegrad_gpu::DeviceMemory, String> {
    let tensors = call
        .mems
        .iter()
        .map(|r| tilegrad_gpu::DeviceTensor { name: r.name.clone(), dtype: r.dtype, numel: r.numel, addr: r.addr as u64 })
        .collect();
    tilegrad_gpu::DeviceMemory::new(tensors).map_err(|e| e.to_string())
}

/// The ground-truth VJP of a launch (f64 unless `native`): given the storages' initial contents
/// (`mems`, as in [`launch`]) and f64 cotangents of the final contents of `outputs` (storage
/// index, address of a contiguous f64 buffer), writes the cotangents of the initial contents of
/// `inputs` (storage index, address of a contiguous f64 buffer to fill). With `device`, every
/// address is device memory (CUDA tensors, on the GPU backend): with `ground="kernels"` the VJP
/// kernel runs there in place; otherwise the storages and cotangents are copied to the host
/// and the gradients back. Returns a note where the launch's VJP kernel was refused and the
/// evaluator gave its ground truth (`what` names the launch).
#[pyfunction]
#[pyo3(signature = (kernel, grid, ptr_args, scalars, mems, inputs, outputs, *, native=false, executor=None, device=false, what=String::from("a launch")))]
#[allow(clippy::too_many_arguments)]
fn vjp(
    py: Python<'_>,
    kernel: &PyKernel,
    grid: (u32, u32, u32),
    ptr_args: Vec<(String, usize, i64)>,
    scalars: Vec<(String, Bound<'_, PyAny>)>,
    mems: Vec<(String, String, usize, usize)>,
    inputs: Vec<(usize, usize)>,
    outputs: Vec<(usize, usize)>,
    native: bool,
    executor: Option<PyRef<'_, PyExecutor>>,
    device: bool,
    what: String,
) -> PyResult<Option<Note>> {
    let kernels = executor.as_ref().filter(|e| e.1).map(|e| &e.0);
    let exec = executor.as_ref().map(|e| &e.0);
    let call = Call::new(kernel, grid, ptr_args, &scalars, mems, !native)?;
    let precision = if native { Precision::Native } else { Precision::F64 };
    let r = py.allow_threads(|| -> Result<Result<Option<Finding>, String>, String> {
        let launch = call.launch(Options::default());
        let vjp = Vjp { launch: &launch, kernels, precision, what: &what };
        if device {
            return device_vjp(&call, &vjp, exec, &inputs, &outputs);
        }
        let mem = call.memory(!native)?;
        let numel = |m: usize| call.mems.get(m).map(|r| r.numel).ok_or_else(|| "bad storage index".to_string());
        let outs: Vec<(TensorId, Vec<f64>)> =
            outputs.iter().map(|&(m, addr)| Ok((TensorId(m as u32), read_f64(addr, numel(m)?)?))).collect::<Result<_, String>>()?;
        let ins: Vec<TensorId> = inputs.iter().map(|&(m, _)| TensorId(m as u32)).collect();
        let (g, note) = match vjp.on_host(&mem, &ins, &outs) {
            Ok(g) => g,
            Err(e) => return Ok(Err(e)),
        };
        for (&(_, addr), gi) in inputs.iter().zip(g) {
            write_f64(addr, gi)?;
        }
        Ok(Ok(note))
    });
    Ok(r.map_err(usage)?.map_err(LaunchError::new_err)?.map(Note))
}

/// A launch's ground-truth VJP: by its VJP kernels on `kernels` where given (the evaluator where
/// the kernel is refused), else by the evaluator.
struct Vjp<'a> {
    launch: &'a Launch<'a>,
    kernels: Option<&'a Executor>,
    precision: Precision,
    what: &'a str,
}

impl Vjp<'_> {
    /// Over host memory: the gradients, and the note of a refused VJP kernel. Errors are the
    /// launch's (or the ground truth's).
    fn on_host(&self, mem: &Memory, ins: &[TensorId], outs: &[(TensorId, Vec<f64>)]) -> Result<(Vec<Vec<f64>>, Option<Finding>), String> {
        let mut note = None;
        if let Some(exec) = self.kernels {
            let float = tilegrad::check::vjp_float(self.launch.kernel(), self.precision);
            let vk = match exec.refuses_vjp_kernel(self.launch) {
                Some(refused) => Err(refused),
                None => tilegrad_ad::vjp_kernel_for(self.launch, mem, float),
            };
            match vk {
                Ok(vk) => return vjp_by_kernel(exec, &vk, self.launch, mem, ins, outs).map(|g| (g, None)),
                Err(refused @ tilegrad_ad::AdError::Unsupported { .. }) => {
                    note = Some(tilegrad::check::evaluator_note(&refused, self.what))
                }
                Err(e) => return Err(format!("ground \"kernels\": {e}")),
            }
        }
        let opts = GradOptions { precision: self.precision, ..GradOptions::default() };
        let g = tilegrad_ad::vjp(self.launch, mem, ins, outs, &opts).map_err(|e| e.to_string())?;
        Ok((g.inputs, note))
    }
}

/// [`vjp`] on device memory: the VJP kernel in place where it can, else through host copies.
fn device_vjp(
    call: &Call,
    vjp: &Vjp,
    exec: Option<&Executor>,
    inputs: &[(usize, usize)],
    outputs: &[(usize, usize)],
) -> Result<Result<Option<Finding>, String>, String> {
    let Some(gpu) = exec.and_then(|e| e.gpu()) else {
        return Err("CUDA tensors are used in place by the GPU backend only (backend=\"gpu\")".into());
    };
    let dm = device_memory(call)?;
    let at = |v: &[(usize, usize)]| v.iter().map(|&(m, a)| (TensorId(m as u32), a as u64)).collect::<Vec<_>>();
    if let Some(exec) = vjp.kernels {
        use tilegrad::check::vjp_in_place::{vjp_in_place, vjp_kernel};
        match vjp_kernel(exec, vjp.launch, &dm, vjp.precision) {
            Ok(vk) => {
                if vjp_in_place(exec, vjp.launch, &vk, &dm, (&at(inputs), &at(outputs)), None)? {
                    return Ok(Ok(None));
                }
            }
            // Refused: the evaluator, through the host (which notes it).
            Err(tilegrad_ad::AdError::Unsupported { .. }) => {}
            Err(e) => return Err(format!("ground \"kernels\": {e}")),
        }
    }
    // Through the host.
    let f64_buffer = |m: usize, addr: usize| -> Result<tilegrad_gpu::DeviceTensor, String> {
        let numel = call.mems.get(m).ok_or("bad storage index")?.numel;
        Ok(tilegrad_gpu::DeviceTensor { name: "cotangent".into(), dtype: DType::F64, numel, addr: addr as u64 })
    };
    let err = |e: tilegrad_gpu::GpuError| e.to_string();
    let mut mem = gpu.download_all(&dm).map_err(err)?;
    if vjp.precision == Precision::F64 {
        mem = promoted(mem);
    }
    let outs = outputs
        .iter()
        .map(|&(m, addr)| Ok((TensorId(m as u32), gpu.download_tensor(&f64_buffer(m, addr)?).map_err(err)?.to_f64_vec())))
        .collect::<Result<Vec<_>, String>>()?;
    let ins: Vec<TensorId> = inputs.iter().map(|&(m, _)| TensorId(m as u32)).collect();
    let (g, note) = match vjp.on_host(&mem, &ins, &outs) {
        Ok(g) => g,
        Err(e) => return Ok(Err(e)),
    };
    for (&(m, addr), gi) in inputs.iter().zip(g) {
        gpu.upload_tensor(&f64_buffer(m, addr)?, &HostTensor::from_f64(&[gi.len()], gi)).map_err(err)?;
    }
    Ok(Ok(note))
}

/// Float tensors of `mem` promoted to f64.
fn promoted(mem: Memory) -> Memory {
    let mut out = Memory::new();
    for i in 0..mem.len() as u32 {
        let h = mem.get(TensorId(i));
        let t = if h.dtype().is_float() && h.dtype() != DType::F64 { HostTensor::from_f64(h.shape(), h.to_f64_vec()) } else { h.clone() };
        out.add(mem.name(TensorId(i)), t);
    }
    out
}

/// The VJP of `launch` by its VJP kernel `vk` run on `exec`, its loops' tapes sized by a
/// forward run there.
fn vjp_by_kernel(
    exec: &Executor,
    vk: &VjpKernel,
    launch: &Launch,
    mem: &Memory,
    inputs: &[TensorId],
    outputs: &[(TensorId, Vec<f64>)],
) -> Result<Vec<Vec<f64>>, String> {
    use tilegrad_ad::vjp_kernel::{gradient_by_kernel, TapeBounds};
    let max_trips = exec.run(launch, &mut mem.clone()).map_err(|e| e.to_string())?.max_trips;
    let bounds = TapeBounds { max_trips: &max_trips, memory: exec.vjp_launch_memory(GradOptions::default().memory_budget as u64) };
    let mut run = |l: &Launch, m: &mut Memory| exec.run_vjp(l, m).map(|_| ()).map_err(tilegrad_ad::AdError::from);
    gradient_by_kernel(vk, launch, mem, inputs, outputs, bounds, &mut run).map_err(|e| e.to_string())
}

/// One writer of a blamed element (a store, an atomic add, nobody, a given tensor).
#[pyclass(module = "tilegrad._native", frozen)]
#[derive(Clone)]
struct Site(BlameSite);

#[pymethods]
impl Site {
    /// No program wrote the element: `tensor`[`index`] kept its initial value `init`.
    #[staticmethod]
    fn never_written(tensor: String, index: Vec<usize>, elements: usize, init: String) -> Site {
        Site(BlameSite::NeverWritten { tensor, index, elements, init })
    }

    /// The element was given to the pass, not computed by it.
    #[staticmethod]
    fn given(tensor: String) -> Site {
        Site(BlameSite::Given { tensor })
    }

    fn __repr__(&self) -> String {
        Blame { via: Vec::new(), sites: vec![self.0.clone()], slice: None }.to_string().trim().to_string()
    }
}

/// The launches of a backward recorded for blame, in order ([`RecordedPass`]): what the CLI's
/// blame and data-flow slices need, for a pass the user's host code ran.
#[pyclass(name = "Pass", module = "tilegrad._native")]
#[derive(Default)]
struct PyPass(RecordedPass);

/// How a tensor of a recorded launch came to the pass: `given` (or made on the host), `empty`
/// (allocated without contents: NaN) or `zeros`.
fn alloc_kind(kind: &str) -> PyResult<Option<Init>> {
    match kind {
        "given" => Ok(None),
        "empty" => Ok(Some(Init::Empty)),
        "zeros" => Ok(Some(Init::Zeros)),
        other => Err(usage(format!("tensor origin `{other}`: expected \"given\", \"empty\" or \"zeros\""))),
    }
}

#[pymethods]
impl PyPass {
    #[new]
    fn new() -> PyPass {
        PyPass::default()
    }

    /// Records the next launch (run with `snapshot=True`); `tensors`: (name in the pass, origin)
    /// of each of its storages, in the launch's order. Returns its step.
    fn push(&mut self, record: &LaunchRecord, tensors: Vec<(String, String)>) -> PyResult<usize> {
        let snap = record.snapshot.as_ref().ok_or_else(|| usage("the launch was not run with `snapshot=True`"))?;
        if tensors.len() != snap.before.len() {
            return Err(usage(format!("the launch has {} storages, {} names were given", snap.before.len(), tensors.len())));
        }
        let tensors = tensors
            .into_iter()
            .enumerate()
            .map(|(i, (name, kind))| {
                let id = TensorId(i as u32);
                Ok(RecordedTensor {
                    name,
                    alloc: alloc_kind(&kind)?,
                    before: snap.before.get(id).clone(),
                    after: snap.after.get(id).clone(),
                })
            })
            .collect::<PyResult<_>>()?;
        Ok(self.0.push(RecordedLaunch {
            kernel: record.kernel.clone(),
            grid: record.grid,
            args: snap.args.clone(),
            options: snap.options.clone(),
            tensors,
            writers: record.writers.clone(),
        }))
    }

    /// Blames `elements` (flat) of tensor `tensor` as they were after step `upto`: the CLI's
    /// blame and data-flow slice; `via`: the host steps from the compared tensor to them;
    /// `expected`, `got`: the compared element's values.
    #[pyo3(signature = (upto, tensor, elements, via, expected=None, got=None))]
    fn blame(&self, upto: usize, tensor: &str, elements: Vec<usize>, via: Vec<String>, expected: Option<f64>, got: Option<f64>) -> PyBlame {
        let values = expected.zip(got);
        PyBlame(self.0.blame(upto, tensor, &elements, via, values))
    }

    fn __len__(&self) -> usize {
        self.0.len()
    }
}

/// The blame of a compared element, as the report prints it.
#[pyclass(name = "Blame", module = "tilegrad._native", frozen)]
#[derive(Clone)]
struct PyBlame(Blame);

#[pymethods]
impl PyBlame {
    /// Some store or atomic add of a kernel wrote the elements blamed.
    #[getter]
    fn written(&self) -> bool {
        self.0.sites.iter().any(|s| matches!(s, BlameSite::Store { .. } | BlameSite::ManyPrograms { .. }))
    }

    fn __str__(&self) -> String {
        self.0.to_string()
    }
}

/// One compared tensor.
#[pyclass(module = "tilegrad._native")]
struct Comparison {
    report: TensorReport,
    worst: Option<(usize, f64)>,
}

#[pymethods]
impl Comparison {
    /// Within tolerance.
    #[getter]
    fn passed(&self) -> bool {
        self.report.passed
    }

    /// Flat index of the worst element.
    #[getter]
    fn worst_index(&self) -> Option<usize> {
        self.worst.map(|w| w.0)
    }

    /// How far over its tolerance the worst element is (infinite for NaN).
    #[getter]
    fn badness(&self) -> f64 {
        self.worst.map_or(0.0, |w| w.1)
    }

    /// Attaches to the worst element the blames made by [`PyPass::blame`] of the elements it
    /// was computed from, merged (host steps in order without repeats; the first data flow),
    /// then the further sites `sites` (elements no kernel wrote) after the host steps `via`.
    #[pyo3(signature = (blames, via=Vec::new(), sites=Vec::new()))]
    fn attach(&mut self, blames: Vec<PyRef<'_, PyBlame>>, via: Vec<String>, sites: Vec<Site>) {
        let Some(w) = self.report.worst.as_mut() else { return };
        let mut b = Blame { via: Vec::new(), sites: Vec::new(), slice: None };
        for one in
            blames.iter().map(|p| &p.0).chain(std::iter::once(&Blame { via, sites: sites.into_iter().map(|s| s.0).collect(), slice: None }))
        {
            for v in &one.via {
                if !b.via.contains(v) {
                    b.via.push(v.clone());
                }
            }
            b.sites.extend(one.sites.iter().cloned());
            if b.slice.is_none() {
                b.slice = one.slice.clone();
            }
        }
        w.blame = Some(b);
    }

    /// Attaches blame to the worst element.
    fn set_blame(&mut self, via: Vec<String>, sites: Vec<Site>) {
        if let Some(w) = self.report.worst.as_mut() {
            w.blame = Some(Blame { via, sites: sites.into_iter().map(|s| s.0).collect(), slice: None });
        }
    }
}

/// Compares `got` with `expected` (contiguous f64 buffers of the product of `shape` elements) with
/// the tolerances given or the CLI's defaults for `dtype`. With `noisy` (the ground truth computed
/// in the kernels' own dtypes, same layout), the comparison is also calibrated as the CLI's is
/// for f16/bf16 gradients and f32 ones through a tf32 `dot`: the normwise error must be within
/// the limit that noise sets. `replay_f32_storage`: the replay kept its tensors in f32 between
/// launches (see `verdict::FORMULA_LIMIT_F32_STORAGE`). With `device` (the GPU `executor`'s),
/// every address is device memory (CUDA tensors) and the figures are reduced there; only they
/// come to the host (and every element where some are over tolerance).
#[pyfunction]
#[pyo3(signature = (name, tensor, dtype_name, shape, expected, got, trial, rtol=None, atol=None, tf32=false, noisy=None, replay=None, cot_rms=1.0, replay_f32_storage=false, device=false, executor=None))]
#[allow(clippy::too_many_arguments)]
fn compare(
    py: Python<'_>,
    name: &str,
    tensor: &str,
    dtype_name: &str,
    shape: Vec<usize>,
    expected: usize,
    got: usize,
    trial: usize,
    rtol: Option<f64>,
    atol: Option<f64>,
    tf32: bool,
    noisy: Option<usize>,
    replay: Option<usize>,
    cot_rms: f64,
    replay_f32_storage: bool,
    device: bool,
    executor: Option<PyRef<'_, PyExecutor>>,
) -> PyResult<Comparison> {
    let d = dtype(dtype_name).map_err(usage)?;
    let def = Tolerance::for_dtype(d, tf32);
    let tol = Tolerance { rtol: rtol.unwrap_or(def.rtol), atol: atol.unwrap_or(def.atol) };
    let n: usize = shape.iter().product();
    let (mut report, mut worst, judged) = if device {
        let gpu = executor.as_ref().and_then(|e| e.0.gpu()).ok_or_else(|| usage("a comparison on the device needs the GPU executor"))?;
        let c = Compared {
            n,
            expected: expected as u64,
            got: got as u64,
            replay: replay.map(|a| a as u64),
            noisy: noisy.map(|a| a as u64),
            noisy_of_replay: false,
            terms: None,
        };
        let at = Naming { name, tensor, dtype: d, shape: &shape, trial };
        let r = py.allow_threads(|| compare_on_device(gpu, c, at, tol, tf32)).map_err(usage)?;
        (r.report, r.worst, r.norms.map(|m| m.judge(n, cot_rms, d, tf32)))
    } else {
        compare_on_host(name, tensor, d, &shape, tol, (expected, got, noisy, replay), trial, tf32, cot_rms)?
    };
    if let Some((mut formula, rounding)) = judged {
        if replay_f32_storage {
            formula = formula.against(verdict::FORMULA_LIMIT_F32_STORAGE);
        }
        let badness = verdict::apply(&mut report, (formula, rounding), rtol.is_some() || atol.is_some());
        if let Some(w) = worst.as_mut() {
            w.1 = w.1.max(badness);
        }
    }
    Ok(Comparison { report, worst })
}

/// A comparison's report, its worst element and, with a replay, its verdicts.
type Judged = (TensorReport, Option<(usize, f64)>, Option<(Formula, Rounding)>);

/// A comparison over host buffers (see [`compare`]): the report, its worst element and, with a
/// replay, the verdicts; without one, a given `noisy` calibrates the report.
#[allow(clippy::too_many_arguments)]
fn compare_on_host(
    name: &str,
    tensor: &str,
    d: DType,
    shape: &[usize],
    tol: Tolerance,
    (expected, got, noisy, replay): (usize, usize, Option<usize>, Option<usize>),
    trial: usize,
    tf32: bool,
    cot_rms: f64,
) -> PyResult<Judged> {
    let n = shape.iter().product();
    // SAFETY: the Python side keeps the buffers alive and unchanged during the call.
    let slice = |addr: usize| unsafe { f64_slice(addr, n) }.map_err(usage);
    let e = slice(expected)?;
    let g = slice(got)?;
    let noisy = noisy.map(slice).transpose()?;
    if let Some(addr) = replay {
        // Formula and rounding, as the CLI judges them; the ground truth in the kernels' dtypes
        // (`noisy`) stands for the f32 replay: its distance is the error a computation of the
        // same quantity in the kernels' dtypes has (cancellation).
        let r64 = slice(addr)?;
        let got = |i: usize| g[i];
        let f32_pass = d == DType::F32 && !tf32;
        let floor = match &noisy {
            Some(n) => verdict::elementwise_scale(e, Some(n), &got, false, tol.atol),
            None => verdict::elementwise_scale(r64, None, &got, f32_pass, tol.atol),
        };
        let (report, worst) = compare_by(name, tensor, d, shape, tol, e, got, trial, floor);
        let judged = verdict::Replayed { truth: e, got: &got, r64, r32: noisy, r32_of: e, cot_rms };
        return Ok((report, worst, Some(judged.judge(d, tf32))));
    }
    let (mut report, mut worst) = compare_tensors(name, tensor, d, shape, tol, e, g, trial);
    if let Some(noisy) = noisy {
        let c = calibration(d, tf32, e, noisy, g);
        report.passed &= c.margin >= 1.0;
        // Over the calibrated limit with every element within the elementwise tolerance: the
        // worst element still ranks the comparison.
        if let Some(w) = worst.as_mut() {
            w.1 = w.1.max(1.0 / c.margin);
        }
        report.calibration = Some(c);
    }
    Ok((report, worst, None))
}

/// Waits (at most a minute) for the GPU backend's compiles in the background: a process that
/// exits while NVRTC compiles on another thread crashes in its teardown. Registered with
/// Python's `atexit`, which runs before the interpreter releases the CUDA libraries.
#[pyfunction]
fn wait_for_compiles(py: Python<'_>) {
    py.allow_threads(|| tilegrad_gpu::wait_for_background_compiles(std::time::Duration::from_secs(60)));
}

/// Fills the buffer at `addr` with `n` standard normal values keyed by `seed` alone
/// (`tilegrad_gpu::draw::normal_at`), as f64. With `device` (the GPU `executor`'s), `addr` is
/// device memory and the values are drawn there, the same bit for bit, as f64 or, where `f32`,
/// rounded to f32.
#[pyfunction]
#[pyo3(signature = (addr, n, seed, *, f32=false, device=false, executor=None))]
fn standard_normal(
    py: Python<'_>,
    addr: usize,
    n: usize,
    seed: u64,
    f32: bool,
    device: bool,
    executor: Option<PyRef<'_, PyExecutor>>,
) -> PyResult<()> {
    if device {
        let gpu = executor.as_ref().and_then(|e| e.0.gpu()).ok_or_else(|| usage("drawing on the device needs the GPU executor"))?;
        return py.allow_threads(|| gpu.draw_normal(addr as u64, n, seed, 0.0, 1.0, f32)).map_err(usage);
    }
    if f32 {
        return Err(usage("host draws are f64 (round them to f32 after)"));
    }
    // SAFETY: the caller's buffer holds `n` f64 values and nothing else uses it meanwhile
    // (memory.rs's contract).
    let out = unsafe { memory::f64_slice_mut(addr, n) }.map_err(usage)?;
    py.allow_threads(|| tilegrad::check::standard_normal_into(out, seed));
    Ok(())
}

/// The multi-index of flat element `i` of a row-major tensor of `shape`.
#[pyfunction(name = "unravel")]
fn unravel_index(i: usize, shape: Vec<usize>) -> Vec<usize> {
    unravel(i, &shape)
}

/// A check's outcome: the CLI's report, and the differentiable inputs it did not compare.
#[pyclass(name = "NativeReport", module = "tilegrad._native", frozen)]
struct PyReport(Report, Vec<NotCompared>);

/// A differentiable input whose gradient was not compared: (input, shape, dtype, why), as
/// PyTorch's rules have it (the backward returned `None` for an input no one asked a gradient of).
type NotCompared = (String, Vec<usize>, String, String);

impl PyReport {
    /// The `not compared` lines the table ends with.
    fn not_compared_text(&self) -> String {
        let mut s = String::new();
        if !self.1.is_empty() {
            s.push_str("not compared\n");
        }
        for (name, shape, dtype, why) in &self.1 {
            s.push_str(&format!("  {name:<14} {:<14} {dtype:<5} {why}\n", format!("{shape:?}")));
        }
        s
    }
}

#[pymethods]
impl PyReport {
    /// Everything within tolerance and the backward ran cleanly.
    #[getter]
    fn passed(&self) -> bool {
        self.0.passed
    }

    /// The same report under another name.
    fn renamed(&self, name: String) -> PyReport {
        PyReport(Report { name, ..self.0.clone() }, self.1.clone())
    }

    /// The report as JSON (the CLI's `--json`).
    /// With `not_compared`: `[{"name", "shape", "dtype", "reason"}]`, where there are any.
    fn to_json(&self) -> String {
        if self.1.is_empty() {
            return self.0.to_json();
        }
        let mut v = serde_json::to_value(&self.0).expect("reports serialise");
        let rows =
            self.1.iter().map(|(name, shape, dtype, why)| serde_json::json!({"name": name, "shape": shape, "dtype": dtype, "reason": why}));
        v["not_compared"] = serde_json::Value::Array(rows.collect());
        serde_json::to_string_pretty(&v).expect("reports serialise")
    }

    fn __str__(&self) -> String {
        format!("{}{}", self.0, self.not_compared_text())
    }

    /// The report as one self-contained HTML page (the CLI's `--html`).
    fn to_html(&self) -> String {
        self.0.to_html()
    }
}

/// Builds a report. `failure`: (step, what, message, trial) when the backward failed to run;
/// `not_compared`: (input, shape, dtype, why) of differentiable inputs whose gradient was not
/// compared.
#[pyfunction]
#[pyo3(signature = (name, seed, trials, precision, forward, gradients, failure=None, executor=None, notes=Vec::new(), strict=false, not_compared=Vec::new()))]
#[allow(clippy::too_many_arguments)]
fn make_report(
    name: String,
    seed: u64,
    trials: usize,
    precision: String,
    forward: Vec<PyRef<'_, Comparison>>,
    gradients: Vec<PyRef<'_, Comparison>>,
    failure: Option<(usize, String, String, usize)>,
    executor: Option<&PyExecutor>,
    notes: Vec<PyRef<'_, Note>>,
    strict: bool,
    not_compared: Vec<NotCompared>,
) -> PyReport {
    let forward: Vec<TensorReport> = forward.iter().map(|c| c.report.clone()).collect();
    let gradients: Vec<TensorReport> = gradients.iter().map(|c| c.report.clone()).collect();
    let failure = failure.map(|(step, what, message, trial)| Failure { step, what, message, trial });
    let mut r = Report::new(name, seed, trials, precision, forward, gradients, failure);
    if let Some(e) = executor {
        r.backend = e.0.describe();
        r.backend_mismatches = e.0.mismatches();
    }
    PyReport(r.with_notes(notes.iter().map(|n| n.0.clone()).collect(), strict), not_compared)
}

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("UsageError", m.py().get_type::<UsageError>())?;
    m.add("LaunchError", m.py().get_type::<LaunchError>())?;
    m.add_class::<PyKernel>()?;
    m.add_class::<LaunchRecord>()?;
    m.add_class::<Note>()?;
    m.add_class::<Site>()?;
    m.add_class::<Comparison>()?;
    m.add_class::<PyReport>()?;
    m.add_class::<PyExecutor>()?;
    m.add_class::<PyPass>()?;
    m.add_class::<PyBlame>()?;
    m.add_function(wrap_pyfunction!(convert, m)?)?;
    m.add_function(wrap_pyfunction!(launch, m)?)?;
    m.add_function(wrap_pyfunction!(vjp, m)?)?;
    m.add_function(wrap_pyfunction!(compare, m)?)?;
    m.add_function(wrap_pyfunction!(unravel_index, m)?)?;
    m.add_function(wrap_pyfunction!(standard_normal, m)?)?;
    m.add_function(wrap_pyfunction!(wait_for_compiles, m)?)?;
    m.add_function(wrap_pyfunction!(make_report, m)?)?;
    Ok(())
}
