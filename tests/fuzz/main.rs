//! A seeded mutation fuzzer over every parser a user's files reach, run through the `tilegrad`
//! command line: Triton source (the example kernels, converted alone by `tilegrad ir` and checked
//! through the example specs that use them), text IR (printed, parsed back, checked), spec TOML
//! (checked when cheap) and `.npy` inputs (read, then written back). Each mutant runs in a child
//! process under an address-space cap and a timeout, so that an abort (stack overflow, allocation
//! failure, SIGKILL) or a hang is a failure of this test rather than its end. Every mutant must
//! give a result, a failed check, or an error that says where (line:column for text, the key for
//! a spec, kernel/op/line for a run); what is read must be what is written back.
//!
//! Settings (environment):
//! - `TILEGRAD_FUZZ=N`: mutants per target (default 100; four targets);
//! - `TILEGRAD_FUZZ_SEED=S`: the campaign's seed (default 0);
//! - `TILEGRAD_FUZZ_CASE=TARGET:INDEX`: run that one mutant again and leave it in place;
//! - `TILEGRAD_FUZZ_TIMEOUT=SECONDS`: per child (default 60);
//! - `TILEGRAD_FUZZ_MEM_MIB=MIB`: address space per child (default 4096);
//! - `TILEGRAD_FUZZ_WORKERS=W`: children run at once (default 2);
//! - `TILEGRAD_FUZZ_BIN=PATH`: the `tilegrad` binary to run (default: this build's).
//!
//! A longer campaign, on the release binary: `cargo build --release && TILEGRAD_FUZZ=2500
//! TILEGRAD_FUZZ_SEED=7 TILEGRAD_FUZZ_BIN=target/release/tilegrad cargo test --test fuzz -- --nocapture`
//! (docs/reliability.md).

mod child;
mod mutator;
mod npy_view;
mod probe;

use child::{Cmd, Fault, FaultKind, Limits, Outcome};
use mutator::Mutator;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What a campaign runs, and how.
struct Settings {
    per_target: usize,
    seed: u64,
    only: Option<(String, usize)>,
    limits: Limits,
    workers: usize,
    bin: PathBuf,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn settings() -> Settings {
    let only = std::env::var("TILEGRAD_FUZZ_CASE").ok().map(|c| {
        let (t, i) = c.split_once(':').expect("TILEGRAD_FUZZ_CASE: expected TARGET:INDEX");
        (t.to_string(), i.parse().expect("TILEGRAD_FUZZ_CASE: expected TARGET:INDEX"))
    });
    Settings {
        per_target: env_or("TILEGRAD_FUZZ", 100),
        seed: env_or("TILEGRAD_FUZZ_SEED", 0),
        only,
        limits: Limits {
            timeout: Duration::from_secs(env_or("TILEGRAD_FUZZ_TIMEOUT", 60)),
            mem_kib: env_or("TILEGRAD_FUZZ_MEM_MIB", 4096u64) << 10,
        },
        workers: env_or("TILEGRAD_FUZZ_WORKERS", 2usize).max(1),
        // Absolute: children run in scratch folders.
        bin: std::env::var_os("TILEGRAD_FUZZ_BIN").map_or_else(
            || PathBuf::from(env!("CARGO_BIN_EXE_tilegrad")),
            |p| std::fs::canonicalize(&p).expect("TILEGRAD_FUZZ_BIN: no such file"),
        ),
    }
}

/// The four targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TargetKind {
    Triton,
    Tgir,
    Spec,
    Npy,
}

impl TargetKind {
    const ALL: [TargetKind; 4] = [TargetKind::Triton, TargetKind::Tgir, TargetKind::Spec, TargetKind::Npy];

    fn name(self) -> &'static str {
        match self {
            TargetKind::Triton => "triton",
            TargetKind::Tgir => "tgir",
            TargetKind::Spec => "spec",
            TargetKind::Npy => "npy",
        }
    }

    fn ext(self) -> &'static str {
        match self {
            TargetKind::Triton => "py",
            TargetKind::Tgir => "tgir",
            TargetKind::Spec => "toml",
            TargetKind::Npy => "npy",
        }
    }
}

/// A file a target mutates: where it lives in the scratch folder and its original bytes.
struct SeedFile {
    rel: String,
    bytes: Vec<u8>,
    /// Jit kernels of a Triton file, with their constexpr parameters.
    kernels: Vec<(String, Vec<String>)>,
    /// Specs that use the file, relative to the scratch folder.
    specs: Vec<String>,
}

/// A failed mutant: what went wrong, the command that showed it and where the mutant was saved.
struct Failure {
    target: &'static str,
    index: usize,
    fault: Fault,
    command: String,
    saved: PathBuf,
}

/// A fault and the command that showed it.
type Failed = Box<(Fault, Cmd)>;

/// How one mutant ended (the last command's exit status), or its failure.
type CaseResult = Result<&'static str, Failed>;

/// The spec through which `.npy` mutants are read: a copy of `x` (any shape, any dtype).
const NPY_SPEC: &str = r#"[kernels]
fwd = "triton/copy.py::copy"

[inputs]
x = { file = "x.npy" }

[forward]
outputs = ["y"]
steps = [
  { alloc = "y", like = "x" },
  { launch = "fwd", grid = ["cdiv(x.numel(), 64)"], args = { src_ptr = "x", dst_ptr = "y", n = "x.numel()", BLOCK = 64 } },
]
"#;

/// The examples folder, with constants shrunk, copied into `dir`, where mutants are written
/// next to the files they refer to.
fn scratch(dir: &Path) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let _ = std::fs::remove_dir_all(dir);
    for sub in ["", "triton"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
        for e in std::fs::read_dir(src.join(sub)).unwrap() {
            let p = e.unwrap().path();
            let to = dir.join(sub).join(p.file_name().unwrap());
            if p.extension().is_some_and(|x| x == "toml") {
                std::fs::write(&to, shrink(&std::fs::read_to_string(&p).unwrap())).unwrap();
            } else if p.is_file() {
                std::fs::copy(&p, to).unwrap();
            }
        }
    }
    std::fs::write(dir.join("npy.toml"), NPY_SPEC).unwrap();
}

/// Integer constants above 256 scaled down, so that the example specs check in milliseconds:
/// sizes to 33..94, powers of two (block sizes) to 128, which still covers every shrunk size.
fn shrink(spec: &str) -> String {
    let mut t: toml::Table = spec.parse().unwrap();
    if let Some(toml::Value::Table(c)) = t.get_mut("constants") {
        for (_, v) in c.iter_mut() {
            if let toml::Value::Integer(i) = v {
                if *i > 256 {
                    *i = if (*i as u64).is_power_of_two() { 128 } else { 33 + *i % 61 };
                }
            }
        }
    }
    toml::to_string(&t).unwrap()
}

fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == ext)).collect();
    v.sort();
    v
}

/// The `@triton.jit` functions of a file and their constexpr parameters (a plain scan of the
/// original text: `def NAME(` at the margin after a decorator naming `jit`).
fn jit_kernels(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut jit = false;
    for at in std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1)) {
        let line = text[at..].lines().next().unwrap_or("");
        if line.starts_with('@') {
            jit |= line.contains("jit");
            continue;
        }
        if let (true, Some(rest)) = (jit, line.strip_prefix("def ")) {
            let name = rest.split('(').next().unwrap_or("").trim().to_string();
            let sig = text[at..].split("):").next().unwrap_or("");
            let constexprs = sig
                .split([',', '('])
                .filter(|p| p.contains("constexpr"))
                .filter_map(|p| p.split(':').next())
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_alphanumeric() || c == '_'))
                .collect();
            out.push((name, constexprs));
        }
        if !line.trim().is_empty() {
            jit = false;
        }
    }
    out.sort();
    out
}

/// The `.npy` seeds: one tensor of each dtype, and the example label files.
fn npy_seeds(dir: &Path) -> Vec<SeedFile> {
    use tilegrad_reference::HostTensor;
    let tensors = [
        HostTensor::from_f32(&[2, 3], vec![1.5, -2.0, 3.25, 0.0, 1e-7, -4.0]),
        HostTensor::from_f64(&[4], vec![0.1, -0.2, 1e300, -1e-300]),
        HostTensor::from_i32(&[3, 1], vec![-1, 7, i32::MAX]),
        HostTensor::from_i64(&[2], vec![i64::MIN, 42]),
        HostTensor::from_f64_as(tilegrad_ir::DType::F16, &[3], &[0.5, -1.25, 3.0]),
        HostTensor::from_f64_as(tilegrad_ir::DType::I1, &[2, 2], &[1.0, 0.0, 0.0, 1.0]),
    ];
    let mut seeds: Vec<Vec<u8>> = tensors
        .iter()
        .map(|t| {
            let p = dir.join("seed.npy");
            tilegrad::npy::write(&p, t).unwrap();
            std::fs::read(&p).unwrap()
        })
        .collect();
    seeds.extend(files(dir, "npy").iter().filter(|p| !p.ends_with("seed.npy")).map(|p| std::fs::read(p).unwrap()));
    seeds.into_iter().map(|bytes| SeedFile { rel: "x.npy".into(), bytes, kernels: Vec::new(), specs: Vec::new() }).collect()
}

/// The files each target mutates, read from a scratch folder.
fn seed_files(kind: TargetKind, dir: &Path) -> Vec<SeedFile> {
    let specs: Vec<(String, String)> = files(dir, "toml")
        .iter()
        .filter(|p| !p.ends_with("npy.toml"))
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read_to_string(p).unwrap()))
        .collect();
    let users =
        |rel: &str| -> Vec<String> { specs.iter().filter(|(_, t)| t.contains(&format!("\"{rel}"))).map(|(n, _)| n.clone()).collect() };
    let plain = |p: &PathBuf, rel: String| {
        let bytes = std::fs::read(p).unwrap();
        SeedFile { specs: users(&rel), kernels: jit_kernels(&String::from_utf8_lossy(&bytes)), rel, bytes }
    };
    match kind {
        TargetKind::Triton => files(&dir.join("triton"), "py")
            .iter()
            .map(|p| plain(p, format!("triton/{}", p.file_name().unwrap().to_string_lossy())))
            .collect(),
        TargetKind::Tgir => files(dir, "tgir").iter().map(|p| plain(p, p.file_name().unwrap().to_string_lossy().into_owned())).collect(),
        TargetKind::Spec => specs
            .iter()
            .map(|(_, t)| SeedFile { rel: "fuzz.toml".into(), bytes: t.clone().into_bytes(), kernels: Vec::new(), specs: Vec::new() })
            .collect(),
        TargetKind::Npy => npy_seeds(dir),
    }
}

/// One worker's scratch folder and the campaign's settings.
struct Worker<'a> {
    dir: PathBuf,
    s: &'a Settings,
}

impl Worker<'_> {
    fn tilegrad(&self, args: &[&str]) -> Cmd {
        Cmd::new(&self.s.bin, &self.dir, args)
    }

    /// Runs `cmd`; its fault, if any, with the command.
    fn run(&self, cmd: Cmd) -> Result<Outcome, Failed> {
        let o = child::run(&cmd, &self.s.limits);
        match child::fault(&o) {
            Some(f) => Err(Box::new((f, cmd))),
            None => Ok(o),
        }
    }

    /// Mutant `index` of `kind`, written in place, run, and (unless it is replayed) put back.
    fn case(&self, kind: TargetKind, seeds: &[SeedFile], index: usize) -> (Vec<u8>, CaseResult) {
        let mut m = Mutator::for_case(self.s.seed, kind.name(), index);
        let seed = &seeds[m.pick(seeds.len())];
        let mutant = m.mutate(&seed.bytes);
        let path = self.dir.join(&seed.rel);
        std::fs::write(&path, &mutant).unwrap();
        let result = match kind {
            TargetKind::Triton => self.triton(&mut m, seed),
            TargetKind::Tgir => self.tgir(seed),
            TargetKind::Spec => self.spec(),
            TargetKind::Npy => self.npy(&mutant),
        };
        if self.s.only.is_none() {
            std::fs::write(&path, &seed.bytes).unwrap();
        }
        (mutant, result)
    }

    /// A kernel of the mutated file converted alone (with every constexpr 64), its IR printed
    /// and parsed back; then one spec that uses the file, checked.
    fn triton(&self, m: &mut Mutator, seed: &SeedFile) -> CaseResult {
        let mut label = "no kernel";
        if !seed.kernels.is_empty() {
            let (name, constexprs) = &seed.kernels[m.pick(seed.kernels.len())];
            let target = format!("{}::{name}", seed.rel);
            let binds: Vec<String> = constexprs.iter().map(|c| format!("{c}=64")).collect();
            let mut args = vec!["ir", target.as_str()];
            for b in &binds {
                args.extend(["--const", b.as_str()]);
            }
            let o = self.run(self.tilegrad(&args))?;
            self.round_trip(&o)?;
            label = exit_label(&o);
        }
        if !seed.specs.is_empty() {
            let spec = &seed.specs[m.pick(seed.specs.len())];
            label = self.check(spec)?;
        }
        Ok(label)
    }

    /// The mutated text IR printed and parsed back, then the spec that uses it, checked.
    fn tgir(&self, seed: &SeedFile) -> CaseResult {
        let o = self.run(self.tilegrad(&["ir", &seed.rel]))?;
        self.round_trip(&o)?;
        let mut label = exit_label(&o);
        for spec in &seed.specs {
            label = self.check(spec)?;
        }
        Ok(label)
    }

    /// `tilegrad check SPEC --trials 1` on one thread; a check that ran is run again on three
    /// threads and must report the same, bit for bit.
    fn check(&self, spec: &str) -> CaseResult {
        let with_threads = |n: &str| {
            let mut c = self.tilegrad(&["check", spec, "--trials", "1"]);
            c.env.push(("RAYON_NUM_THREADS".into(), n.into()));
            c
        };
        let o = self.run(with_threads("1"))?;
        if let Outcome::Exit { code: code @ (0 | 1), stdout, .. } = &o {
            let cmd = with_threads("3");
            if let Outcome::Exit { code: again, stdout: report, .. } = self.run(cmd.clone())? {
                if again != *code || report != *stdout {
                    return Err(Box::new((
                        Fault::new(FaultKind::Wrong, "the report on three threads differs from the report on one"),
                        cmd,
                    )));
                }
            }
        }
        Ok(exit_label(&o))
    }

    /// IR that `tilegrad ir` printed must parse back and print the same.
    fn round_trip(&self, o: &Outcome) -> Result<(), Failed> {
        let Outcome::Exit { code: 0, stdout, .. } = o else { return Ok(()) };
        std::fs::write(self.dir.join("roundtrip.tgir"), stdout).unwrap();
        let cmd = self.tilegrad(&["ir", "roundtrip.tgir"]);
        match self.run(cmd.clone())? {
            Outcome::Exit { code: 0, stdout: again, .. } if &again == stdout => Ok(()),
            Outcome::Exit { code: 0, .. } => Err(Box::new((Fault::new(FaultKind::Wrong, "printed IR parses back to different IR"), cmd))),
            Outcome::Exit { stderr, .. } => {
                Err(Box::new((Fault::new(FaultKind::Wrong, format!("printed IR does not parse back: {}", child::tail(&stderr))), cmd)))
            }
            other => Err(Box::new((Fault::new(FaultKind::Status, format!("{other:?}")), cmd))),
        }
    }

    /// The mutated spec, probed by this test binary (does it load, is it cheap?), then checked
    /// by the command line unless it is costly.
    fn spec(&self) -> CaseResult {
        let mut probe =
            Cmd::new(&std::env::current_exe().unwrap(), &self.dir, &["probe_child", "--exact", "--nocapture", "--test-threads=1"]);
        probe.env = vec![(probe::PROBE_ENV.into(), "fuzz.toml".into()), ("RUST_MIN_STACK".into(), (8 << 20).to_string())];
        let Outcome::Exit { stdout, .. } = self.run(probe.clone())? else { unreachable!("a fault") };
        match probe::verdict(&String::from_utf8_lossy(&stdout)) {
            None => Err(Box::new((
                Fault::new(FaultKind::Status, format!("the probe printed no verdict: {}", child::tail(&String::from_utf8_lossy(&stdout)))),
                probe,
            ))),
            Some(Err(why)) => Err(Box::new((Fault::new(FaultKind::Unlocated, why), probe))),
            Some(Ok(probe::Cost::Costly)) => Ok("costly (loaded, not checked)"),
            Some(Ok(_)) => self.check("fuzz.toml"),
        }
    }

    /// The mutated `.npy` read by `tilegrad run`, which writes it back: what it wrote must be what
    /// numpy would read from the mutant.
    fn npy(&self, mutant: &[u8]) -> CaseResult {
        let out = self.dir.join("npy-out");
        let _ = std::fs::remove_dir_all(&out);
        let cmd = self.tilegrad(&["run", "npy.toml", "--out", "npy-out"]);
        let o = self.run(cmd.clone())?;
        if let Outcome::Exit { code: 0, .. } = o {
            let written = std::fs::read(out.join("input_x.npy")).unwrap_or_default();
            if let Err(why) = npy_view::same_array(mutant, &written) {
                return Err(Box::new((Fault::new(FaultKind::Wrong, why), cmd)));
            }
        }
        Ok(exit_label(&o))
    }
}

fn exit_label(o: &Outcome) -> &'static str {
    match o {
        Outcome::Exit { code: 0, .. } => "exit 0",
        Outcome::Exit { code: 1, .. } => "exit 1",
        _ => "exit 2 (located)",
    }
}

/// A target's mutants, spread over the workers; the count of each ending, and the failures.
fn campaign(kind: TargetKind, s: &Settings) -> (BTreeMap<&'static str, usize>, Vec<Failure>) {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let indices: Vec<usize> = match &s.only {
        Some((t, i)) if t == kind.name() => vec![*i],
        Some(_) => return (BTreeMap::new(), Vec::new()),
        None => (0..s.per_target).collect(),
    };
    let workers: Vec<Worker> = (0..s.workers.min(indices.len()).max(1))
        .map(|k| {
            let dir = tmp.join(if s.only.is_some() { "fuzz-replay".to_string() } else { format!("fuzz-{}-{k}", kind.name()) });
            scratch(&dir);
            Worker { dir, s }
        })
        .collect();
    let seeds = seed_files(kind, &workers[0].dir);
    let count = workers.len();
    let results: Vec<(usize, Vec<u8>, CaseResult)> = std::thread::scope(|sc| {
        let handles: Vec<_> = workers
            .iter()
            .enumerate()
            .map(|(k, w)| {
                let (seeds, indices) = (&seeds, &indices);
                sc.spawn(move || {
                    indices
                        .iter()
                        .skip(k)
                        .step_by(count)
                        .map(|&i| (i, w.case(kind, seeds, i)))
                        .map(|(i, (m, r))| (i, m, r))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let mut counts = BTreeMap::new();
    let mut failures = Vec::new();
    for (index, mutant, r) in results {
        match r {
            Ok(label) => *counts.entry(label).or_insert(0) += 1,
            Err(b) => {
                let (fault, cmd) = *b;
                let saved = tmp.join("fuzz-failures").join(format!("{}-{}-{index}.{}", kind.name(), s.seed, kind.ext()));
                std::fs::create_dir_all(saved.parent().unwrap()).unwrap();
                std::fs::write(&saved, &mutant).unwrap();
                failures.push(Failure { target: kind.name(), index, fault, command: cmd.shell_line(&s.limits), saved });
            }
        }
    }
    failures.sort_by_key(|f| f.index);
    (counts, failures)
}

/// One line per failure: the fault, how to make the mutant again, the command and the saved mutant.
fn describe(f: &Failure, s: &Settings) -> String {
    // The binary too, when it is not this build's.
    let bin = std::env::var_os("TILEGRAD_FUZZ_BIN").map_or(String::new(), |_| format!("TILEGRAD_FUZZ_BIN={} ", s.bin.display()));
    format!(
        "{} #{} {}: {}\n  reproduce: {bin}TILEGRAD_FUZZ_SEED={} TILEGRAD_FUZZ_CASE={}:{} cargo test --test fuzz -- --nocapture \
         (mutant saved as {}; failing command: {})",
        f.target,
        f.index,
        f.fault.kind.name(),
        f.fault.message,
        s.seed,
        f.target,
        f.index,
        f.saved.display(),
        f.command
    )
}

/// Runs every target; prints a summary line per target; returns the failures, described.
fn run_all(s: &Settings) -> Vec<String> {
    let mut all = Vec::new();
    for kind in TargetKind::ALL {
        let start = Instant::now();
        let (counts, failures) = campaign(kind, s);
        let n: usize = counts.values().sum::<usize>() + failures.len();
        if n == 0 {
            continue;
        }
        let endings: Vec<String> = counts.iter().map(|(k, v)| format!("{v} {k}")).collect();
        let faults: Vec<String> =
            FaultKind::ALL.iter().map(|k| format!("{} {}", failures.iter().filter(|f| f.fault.kind == *k).count(), k.name())).collect();
        eprintln!(
            "fuzz {} (seed {}): {n} mutants in {:.1} s: {}; faults: {}",
            kind.name(),
            s.seed,
            start.elapsed().as_secs_f64(),
            endings.join(", "),
            faults.join(", ")
        );
        all.extend(failures.iter().map(|f| describe(f, s)));
    }
    all
}

#[test]
fn mutants_never_panic_abort_hang_or_give_an_unlocated_error() {
    let s = settings();
    let failures = run_all(&s);
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// The probe's entry point: this test binary, run again with `probe::PROBE_ENV` naming a spec,
/// judges it and prints its verdict; without the variable it does nothing.
#[test]
fn probe_child() {
    probe::probe_from_env();
}

#[test]
fn jit_kernels_are_found_with_their_constexprs() {
    let text = "import triton\n\n@triton.jit\ndef k(x_ptr, n,\n      BLOCK: tl.constexpr, R: tl.constexpr = 2):\n    pass\n\n\
                def host(x):\n    pass\n\n@triton.autotune(configs=[])\n@triton.jit\ndef j(y, N: tl.constexpr):\n    pass\n";
    assert_eq!(
        jit_kernels(text),
        vec![("j".to_string(), vec!["N".to_string()]), ("k".to_string(), vec!["BLOCK".to_string(), "R".to_string()])]
    );
}
