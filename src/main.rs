//! The `tilegrad` command line.

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tilegrad::check::{self, Backend, CheckOptions, Ground, Precision};
use tilegrad::spec::{self, KernelOverride, Spec};
use tilegrad::{npy, zoo};

/// `println!` that ends the process quietly when stdout is closed (`tilegrad check ... | head`),
/// with the status a shell gives a process ended by SIGPIPE, instead of panicking.
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write;
        if let Err(e) = writeln!(std::io::stdout().lock(), $($t)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(141);
            }
            eprintln!("error: writing to stdout: {e}");
            std::process::exit(2);
        }
    }};
}

#[derive(Parser)]
#[command(
    name = "tilegrad",
    version,
    about = "Ground-truth gradients for GPU tile kernels",
    after_help = "See docs/spec.md in the repository for the commands, their options and the spec format;\n\
                  docs/verdicts.md, docs/blame.md, docs/error-map.md, docs/triton.md, docs/python.md and\n\
                  docs/rust.md for the rest. `tilegrad COMMAND --help` names the page of each command."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum BackendArg {
    /// The CPU reference interpreter.
    Cpu,
    /// A CUDA GPU (an error when none is usable).
    Gpu,
    /// The GPU when one is usable, else the CPU.
    Auto,
}

#[derive(Clone, Copy, ValueEnum)]
enum GroundArg {
    /// VJP kernels where launches run on the GPU, else the CPU evaluator.
    Auto,
    /// The CPU evaluator.
    Evaluator,
    /// Each launch's VJP kernel, run on the backend.
    Kernels,
}

#[derive(Clone, Copy, ValueEnum)]
enum PrecisionArg {
    F64,
    Native,
}

/// Options shared by the commands that load a spec.
#[derive(Args)]
struct SpecArgs {
    /// Seed of the random inputs and cotangents (default: the spec's, else 0).
    #[arg(long)]
    seed: Option<u64>,
    /// Random cotangent trials (default: the spec's, else 2).
    #[arg(long)]
    trials: Option<usize>,
    /// Where launches run (the ground truth's reverse sweep too, with `--ground auto` or
    /// `kernels`).
    #[arg(long, value_enum, default_value = "cpu")]
    backend: BackendArg,
    /// How the ground truth of launches is computed: by the CPU evaluator, or by each launch's
    /// VJP kernel (a tile-IR kernel of its derivative) run on the backend; `auto`: VJP kernels
    /// where launches run on the GPU, else the evaluator. With `--precision native`, VJP kernels
    /// compute in f32 (f64 for kernels with f64 values).
    #[arg(long, value_enum, default_value = "auto")]
    ground: GroundArg,
    /// With VJP kernels on the GPU (`--backend gpu`): they add in program order, as on the CPU,
    /// so that the ground truth is the same bit for bit on every run (slower: programs take
    /// turns); otherwise the GPU's order of float atomics varies the f64 sums by ~1e-16.
    #[arg(long)]
    deterministic: bool,
    /// With VJP kernels on the GPU (`--backend gpu`): every launch's tensors cross to the device and
    /// back, instead of the check keeping its tensors on the device (slower).
    #[arg(long)]
    host_copies: bool,
    /// With VJP kernels: MiB a VJP kernel's launch may take (tensors, shadows and its
    /// loops' tapes), its programs running in batches whose tapes fit (default: 80% of the
    /// GPU's free memory; on the CPU 4 GiB, at most a quarter of the memory left).
    #[arg(long, value_name = "MIB")]
    vjp_memory: Option<u64>,
    /// Programs a launch may run (default 67108864): a larger grid is refused before it runs,
    /// naming the kernel and the grid, with the least time it would take.
    #[arg(long, value_name = "N")]
    max_programs: Option<u64>,
    /// Precision of the ground truth (default: the spec's, else f64).
    #[arg(long, value_enum)]
    precision: Option<PrecisionArg>,
    /// Accept NaN or infinite inputs and ground truth (by default a usage error naming the
    /// tensor and element: NaN would match NaN whatever the backward computes).
    #[arg(long)]
    allow_non_finite: bool,
    /// Make notes failures: a launch whose results depend on masked-off lanes of loads without
    /// `other` (read as 0, as Triton's GPU backends read them; Triton documents them as
    /// undefined), programs that conflict on an element with the same value.
    #[arg(long)]
    strict: bool,
    /// Replace a kernel of the spec: `KEY=FILE::NAME` (relative to the working directory) or
    /// `KEY=::NAME` (another kernel of the same file). Repeatable.
    #[arg(long = "kernel", value_name = "KEY=REF")]
    kernels: Vec<String>,
    /// The Triton version the module-level checks of the kernels' files see
    /// (`Version(triton.__version__) >= ...`; default: the spec's, else 3.6.0).
    #[arg(long, value_name = "X.Y.Z")]
    triton_version: Option<String>,
    /// An environment variable as the program sees it, for module-level `os.environ` reads in
    /// the kernels' files (unset by default). Repeatable.
    #[arg(long = "env", value_name = "NAME=VALUE")]
    env: Vec<String>,
    /// The device's compute capability for module-level device checks, e.g. `sm_80` (default:
    /// the spec's, else sm_90).
    #[arg(long, value_name = "SM")]
    device: Option<String>,
}

impl SpecArgs {
    fn load(&self, path: &Path) -> Result<(Spec, CheckOptions)> {
        let mut overrides = Vec::new();
        for k in &self.kernels {
            let (key, reference) = k.split_once('=').with_context(|| format!("--kernel `{k}`: expected KEY=FILE::NAME or KEY=::NAME"))?;
            overrides.push(KernelOverride { key: key.trim().to_string(), reference: reference.trim().to_string() });
        }
        let spec = spec::load_configured(path, &overrides, &self.convert_settings()?)?;
        for n in &spec.notes {
            eprintln!("note: {n}");
        }
        let mut o = spec.options.clone();
        if let Some(s) = self.seed {
            o.seed = s;
        }
        if let Some(t) = self.trials {
            o.trials = t;
        }
        o.allow_non_finite |= self.allow_non_finite;
        o.strict |= self.strict;
        if let Some(p) = self.precision {
            o.precision = match p {
                PrecisionArg::F64 => Precision::F64,
                PrecisionArg::Native => Precision::Native,
            };
        }
        o.deterministic |= self.deterministic;
        o.device_resident &= !self.host_copies;
        if let Some(m) = self.vjp_memory {
            o.vjp_memory = Some(m.saturating_mul(1 << 20));
        }
        if let Some(n) = self.max_programs {
            o.max_programs = n;
        }
        o.ground = match self.ground {
            GroundArg::Auto => Ground::Auto,
            GroundArg::Evaluator => Ground::Evaluator,
            GroundArg::Kernels => Ground::Kernels,
        };
        o.backend = match self.backend {
            BackendArg::Cpu => Backend::Cpu,
            BackendArg::Gpu => Backend::Gpu,
            BackendArg::Auto => Backend::Auto,
        };
        Ok((spec, o))
    }

    /// The conversion settings the flags give.
    fn convert_settings(&self) -> Result<spec::ConvertSettings> {
        let mut s = spec::ConvertSettings::default();
        if let Some(v) = &self.triton_version {
            if !tilegrad_ir::triton::is_version(v) {
                bail!("--triton-version `{v}`: expected a version such as 3.6.0");
            }
            s.triton_version = Some(v.clone());
        }
        for e in &self.env {
            let (k, v) = e.split_once('=').with_context(|| format!("--env `{e}`: expected NAME=VALUE"))?;
            s.env.push((k.trim().to_string(), v.to_string()));
        }
        if let Some(d) = &self.device {
            let cap = tilegrad_ir::triton::parse_device(d)
                .with_context(|| format!("--device `{d}`: expected a compute capability such as sm_90 or 8.0"))?;
            s.device = Some(cap);
        }
        Ok(s)
    }
}

#[derive(Subcommand)]
enum Command {
    /// Check the backward of each spec against the ground-truth gradient of its forward: a table
    /// of errors per gradient, the worst element and the line that wrote it. Exit status 0 when
    /// every check passes, 1 when one fails, 2 on bad input.
    #[command(after_help = "See docs/spec.md (specs, the report, options); docs/verdicts.md, docs/blame.md, docs/error-map.md.")]
    Check {
        /// Spec files (TOML).
        #[arg(required = true)]
        specs: Vec<PathBuf>,
        /// Print the reports as JSON (an array, one per spec).
        #[arg(long)]
        json: bool,
        /// Print the seconds spent per phase (spec and inputs, forward, ground truth, backward,
        /// comparison, blame, output); the JSON always has them.
        #[arg(long)]
        timings: bool,
        /// Explain a gradient element whatever its error: who wrote it and the source lines its
        /// value was computed through, e.g. `grad_x[3,7]` (or by input name, `x[3,7]`). Repeatable.
        #[arg(long = "blame-element", value_name = "TENSOR[I,J,..]")]
        blame_elements: Vec<String>,
        /// Also write the reports as one self-contained HTML page: a heatmap of where each
        /// failing tensor is wrong (hover a cell for its elements), the blamed source lines and
        /// the text report.
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
        #[command(flatten)]
        opts: SpecArgs,
    },
    /// Write the ground truth of a spec's forward as `.npy` files: inputs, outputs, the random
    /// cotangent of each output (`grad_<output>.npy`) and the gradient of each differentiable
    /// input for it (`grad_<input>.npy`, f64).
    #[command(after_help = "See docs/spec.md#computing-a-ground-truth-gradient (the files written).")]
    Grad {
        /// Spec file.
        spec: PathBuf,
        /// Output folder (created).
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        opts: SpecArgs,
    },
    /// Run a spec's forward only and write its inputs and outputs as `.npy` files.
    #[command(after_help = "See docs/spec.md (the spec format).")]
    Run {
        /// Spec file.
        spec: PathBuf,
        /// Output folder (created).
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        opts: SpecArgs,
    },
    /// The engine's self-check: the ground-truth gradient of a spec's forward against central
    /// finite differences in f64 along random directions.
    #[command(after_help = "See docs/architecture.md (how the ground truth is computed and tested).")]
    Gradcheck {
        /// Spec file.
        spec: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        opts: SpecArgs,
    },
    /// Run kernels of the built-in zoo on random data through the CPU reference interpreter and
    /// compare them with plain-Rust f64 references (all cases when none is named).
    #[command(after_help = "See docs/architecture.md (the zoo) and docs/rust.md (the kernel builder).")]
    Zoo {
        /// Case names (see --list).
        cases: Vec<String>,
        /// Seed of the random inputs.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// List the cases and exit.
        #[arg(long)]
        list: bool,
    },
    /// Print the IR of a text-IR file (`FILE.tgir`) or of a Triton kernel (`FILE.py::NAME`),
    /// verified.
    #[command(after_help = "See docs/triton.md (the Triton surface tilegrad reads).")]
    Ir {
        /// A `.tgir` file, or `path/to/file.py::kernel_name`.
        file: String,
        /// Constexpr bindings for a Triton kernel, `NAME=VALUE` (repeatable): an int, a float,
        /// `True`/`False`, `None`, a dtype (`tl.float16`), or a string (`mean` or `'mean'`).
        #[arg(long = "const", value_name = "NAME=VALUE")]
        consts: Vec<String>,
        /// Pointer parameters of a Triton kernel and their element dtypes, `NAME` (f32) or
        /// `NAME=DTYPE` (repeatable); parameters named `*ptr` are pointers to f32 without it.
        #[arg(long = "ptr", value_name = "NAME[=DTYPE]")]
        ptrs: Vec<String>,
        /// Dtypes of runtime scalar parameters of a Triton kernel, `NAME=DTYPE` (i32 otherwise).
        #[arg(long = "scalar", value_name = "NAME=DTYPE")]
        scalars: Vec<String>,
        /// Take the named function as a Triton kernel even without a recognised `triton.jit`
        /// form (a decorator from another package that wraps `triton.jit`).
        #[arg(long)]
        jit: bool,
    },
}

fn main() -> ExitCode {
    tilegrad_reference::tune_allocator();
    let cli = Cli::parse();
    let ran = run(cli);
    // Compiles ahead that the check did not wait for end first: the C library's exit handlers
    // may unload NVRTC under a compile still running.
    tilegrad_gpu::wait_for_background_compiles(Duration::from_secs(60));
    match ran {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// A progress bar on stderr, shown only when stderr is a terminal and the work has taken more
/// than a second.
struct Progress {
    start: Instant,
    bar: Option<indicatif::ProgressBar>,
    label: String,
}

impl Progress {
    fn new(label: &str) -> Progress {
        Progress { start: Instant::now(), bar: None, label: label.to_string() }
    }

    /// `phase` starts now; `done` of `total` trials are done.
    fn update(&mut self, phase: &str, done: usize, total: usize) {
        if self.bar.is_none() && self.start.elapsed() > Duration::from_secs(1) && std::io::stderr().is_terminal() && done < total {
            // Set up hidden, shown once it has its phase (no frame with an empty message).
            let b = indicatif::ProgressBar::with_draw_target(Some(total as u64), indicatif::ProgressDrawTarget::hidden())
                .with_elapsed(self.start.elapsed());
            if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {prefix}: {msg} [trial {pos}/{len}] {elapsed}") {
                b.set_style(style);
            }
            b.set_prefix(self.label.clone());
            b.set_message(phase.to_string());
            b.set_position(done as u64);
            b.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            b.enable_steady_tick(Duration::from_millis(200));
            self.bar = Some(b);
        }
        if let Some(b) = &self.bar {
            b.set_position(done as u64);
            b.set_message(phase.to_string());
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

/// Writes `<prefix><name>.npy` for each tensor of each group into `dir`.
/// The files are written in parallel (one thread per file, at most the machine's cores).
fn write_npy(dir: &Path, groups: &[(&str, &check::Named)]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let files: Vec<(PathBuf, &tilegrad_reference::HostTensor)> =
        groups.iter().flat_map(|(prefix, tensors)| tensors.iter().map(move |(n, t)| (dir.join(format!("{prefix}{n}.npy")), t))).collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(files.len()).max(1);
    let results: Vec<Result<(), npy::NpyError>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..threads)
            .map(|k| {
                let files = &files;
                sc.spawn(move || files.iter().skip(k).step_by(threads).map(|(p, t)| npy::write(p, t)).collect::<Vec<_>>())
            })
            .collect();
        let mut per: Vec<Vec<Result<(), npy::NpyError>>> = handles.into_iter().map(|h| h.join().expect("npy writer")).collect();
        // Back in the files' order.
        (0..files.len()).map(|i| std::mem::replace(&mut per[i % threads][i / threads], Ok(()))).collect()
    });
    for ((p, t), r) in files.iter().zip(results) {
        r?;
        out!("wrote {} {:?} {}", p.display(), t.shape(), t.dtype());
    }
    Ok(())
}

/// Parses `TENSOR[I,J,..]` (`TENSOR[]` or a bare name for a scalar).
fn parse_element(s: &str) -> Result<(String, Vec<usize>)> {
    let s = s.trim();
    let Some(open) = s.find('[') else {
        return Ok((s.to_string(), Vec::new()));
    };
    let (name, rest) = s.split_at(open);
    let inner = rest
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .with_context(|| format!("--blame-element `{s}`: expected TENSOR[I,J,..]"))?;
    let index = inner
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| t.parse::<usize>().with_context(|| format!("--blame-element `{s}`: `{t}` is not an index")))
        .collect::<Result<Vec<_>>>()?;
    if name.trim().is_empty() {
        bail!("--blame-element `{s}`: no tensor named");
    }
    Ok((name.trim().to_string(), index))
}

/// Runs a command; `Ok(false)` means it ran and found a failure.
fn run(cli: Cli) -> Result<bool> {
    match cli.command {
        Command::Check { specs, json, timings, blame_elements, html, opts } => {
            let elements = blame_elements.iter().map(|e| parse_element(e)).collect::<Result<Vec<_>>>()?;
            let mut reports = Vec::new();
            for path in &specs {
                let t_spec = Instant::now();
                let (spec, mut o) = opts.load(path)?;
                o.blame_elements = elements.clone();
                let spec_seconds = t_spec.elapsed().as_secs_f64();
                let bwd = spec.backward.as_ref().with_context(|| {
                    format!("{}: backward: missing table (a check compares the backward with the ground truth)", path.display())
                })?;
                let mut progress = Progress::new(&spec.name);
                let mut report = check::check_backward_with(&spec.forward, bwd, &spec.inputs, &o, &spec.name, &mut |phase, d, t| {
                    progress.update(phase, d, t)
                })
                .with_context(|| format!("{}", path.display()))?;
                drop(progress);
                report.timings.phases.insert(0, ("spec and kernels".into(), spec_seconds));
                if !json {
                    let t_out = Instant::now();
                    out!("{report}");
                    report.timings.add("output", t_out.elapsed().as_secs_f64());
                    if timings {
                        out!("{}", report.timings);
                    }
                }
                reports.push(report);
            }
            let passed = reports.iter().all(|r| r.passed);
            if let Some(path) = &html {
                std::fs::write(path, check::html_page(&reports)).with_context(|| format!("--html {}", path.display()))?;
            }
            if json {
                out!("{}", serde_json::to_string_pretty(&reports)?);
            } else if specs.len() > 1 {
                out!("{} of {} checks passed", reports.iter().filter(|r| r.passed).count(), reports.len());
            }
            Ok(passed)
        }
        Command::Grad { spec, out, opts } => {
            let (s, o) = opts.load(&spec)?;
            let g = check::ground_truth(&s.forward, &s.inputs, &o).with_context(|| format!("{}", spec.display()))?;
            for n in &g.notes {
                eprintln!("note: {}", n.message.replace('\n', "\n      "));
            }
            write_npy(&out, &[("input_", &g.inputs), ("output_", &g.outputs), ("cotangent_", &g.cotangents), ("grad_", &g.gradients)])?;
            Ok(true)
        }
        Command::Run { spec, out, opts } => {
            let (s, o) = opts.load(&spec)?;
            let (i, t, ran) = check::run_forward_with(&s.forward, &s.inputs, &o).with_context(|| format!("{}", spec.display()))?;
            write_npy(&out, &[("input_", &i), ("output_", &t)])?;
            if ran != "cpu" {
                eprintln!("backend: {ran}");
            }
            Ok(true)
        }
        Command::Gradcheck { spec, json, opts } => {
            let (s, o) = opts.load(&spec)?;
            let r = check::gradcheck(&s.forward, &s.inputs, &o, &s.name).with_context(|| format!("{}", spec.display()))?;
            if json {
                out!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                out!("{r}");
            }
            Ok(r.passed)
        }
        Command::Zoo { cases, seed, list } => {
            if list {
                for n in zoo::names() {
                    out!("{n}");
                }
                return Ok(true);
            }
            let cases: Vec<String> = if cases.is_empty() { zoo::names().iter().map(|s| s.to_string()).collect() } else { cases };
            out!(
                "{:<18} {:>8} {:>8} {:>10} {:>10} {:>11} {:>11} {:>10} {:>10}  result",
                "case",
                "programs",
                "launches",
                "loaded",
                "stored",
                "max abs err",
                "max rel err",
                "tolerance",
                "time"
            );
            let mut passed = 0usize;
            for c in &cases {
                let r = zoo::run_case(c, seed).with_context(|| format!("zoo case `{c}`"))?;
                let ok = r.passed();
                passed += ok as usize;
                out!(
                    "{:<18} {:>8} {:>8} {:>10} {:>10} {:>11.3e} {:>11.3e} {:>10.1e} {:>8.2}ms  {}",
                    r.name,
                    r.programs,
                    r.launches,
                    r.elements_loaded,
                    r.elements_stored + r.elements_atomic,
                    r.max_abs_err,
                    r.max_rel_err,
                    r.tolerance,
                    r.elapsed.as_secs_f64() * 1e3,
                    if ok { "ok" } else { "MISMATCH" }
                );
                for (name, shape) in &r.outputs {
                    out!("{:<18}   output `{name}` {shape:?}", "");
                }
            }
            out!("{passed} of {} cases match their reference (seed {seed})", cases.len());
            Ok(passed == cases.len())
        }
        Command::Ir { file, consts, ptrs, scalars, jit } => {
            if let Some((path, name)) = file.split_once("::") {
                let src = tilegrad_ir::source_text(std::fs::read(path).with_context(|| format!("reading {path}"))?, path)?;
                let opts = ir_options(&consts, &ptrs, &scalars, jit)?;
                let k = tilegrad_ir::triton::convert(&src, path, name, &opts)?;
                out!("{}", k.to_string().trim_end());
                return Ok(true);
            }
            if !consts.is_empty() || !ptrs.is_empty() || !scalars.is_empty() || jit {
                bail!("--const, --ptr, --scalar and --jit apply to Triton kernels (FILE.py::NAME)");
            }
            let text = tilegrad_ir::source_text(std::fs::read(&file).with_context(|| format!("reading {file}"))?, &file)?;
            let kernels = tilegrad_ir::text::parse(&text, &file)?;
            if kernels.is_empty() {
                bail!("{file}: no kernels");
            }
            out!("{}", tilegrad_ir::text::print_module(&kernels).trim_end());
            Ok(true)
        }
    }
}

/// The conversion options of `tilegrad ir` from its `--const`, `--ptr`, `--scalar` and `--jit`.
fn ir_options(consts: &[String], ptrs: &[String], scalars: &[String], jit: bool) -> Result<tilegrad_ir::triton::ConvertOptions> {
    use tilegrad_ir::triton::ConstValue;
    let mut opts = tilegrad_ir::triton::ConvertOptions { assume_jit: jit, ..Default::default() };
    for c in consts {
        let (n, v) = c.split_once('=').with_context(|| format!("--const `{c}`: expected NAME=VALUE"))?;
        // A bare word that is no other kind of value is a string (`--const reduction=mean`).
        let v = ConstValue::parse(v).unwrap_or_else(|| ConstValue::Str(v.trim().to_string()));
        opts = opts.bind(n.trim(), v);
    }
    let dtype = |flag: &str, item: &str, d: &str| {
        tilegrad_ir::DType::from_name(d.trim().trim_start_matches("tl.").trim_start_matches("torch."))
            .with_context(|| format!("{flag} `{item}`: unknown dtype `{d}` (i1, i32, i64, f16, bf16, f32, f64)"))
    };
    for p in ptrs {
        let (n, d) = match p.split_once('=') {
            Some((n, d)) => (n.trim(), dtype("--ptr", p, d)?),
            None => (p.trim(), tilegrad_ir::DType::F32),
        };
        opts.pointer_dtypes.push((n.to_string(), d));
    }
    for sc in scalars {
        let (n, d) = sc.split_once('=').with_context(|| format!("--scalar `{sc}`: expected NAME=DTYPE"))?;
        opts.scalar_dtypes.push((n.trim().to_string(), dtype("--scalar", sc, d)?));
    }
    Ok(opts)
}
