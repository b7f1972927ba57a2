//! A bounded, seeded mutation fuzzer over every parser a user's files reach: Triton source (the
//! example kernels, loaded through the example specs that bind their constexprs), text IR, spec
//! TOML (loaded, then checked when the mutant is small enough to check in milliseconds) and
//! `.npy` bytes. Each mutant must give a result or an error that says where (line:column for
//! text, the key for a spec); a panic is a failure, and so would be an abort (stack overflow,
//! allocation failure), which ends the test process.
//!
//! `TILEGRAD_FUZZ=N` sets the mutations per target (default 200) and `TILEGRAD_FUZZ_SEED` the
//! seed (default 0), for longer campaigns by hand:
//! `TILEGRAD_FUZZ=5000 cargo test --test fuzz -- --nocapture`.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use tilegrad::check::{expr::Scope, tensor_expr::Operand, CheckOptions, Scalar, Source, Step};
use tilegrad::spec::{load, Spec, SpecError};
use tilegrad_ir::{DType, IrError};

/// Tokens a mutation inserts: syntax, names and numbers that reach the corners of each parser.
const TOKENS: &[&str] = &[
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    "=",
    "\"",
    "'",
    "\n",
    "\n    ",
    "#",
    "-",
    "+",
    "*",
    "//",
    "%",
    "/",
    "**",
    "<<",
    "@",
    ".",
    "::",
    "\\",
    "\u{e9}",
    "\u{1F600}",
    "\u{0}",
    "tl.",
    "tl.arange(0, ",
    "tl.zeros((",
    "tl.load(",
    "tl.store(",
    "tl.sum(",
    "range(",
    "tl.static_range(",
    "if ",
    "else:",
    "for ",
    "return ",
    "None",
    "True",
    "%x",
    "f32",
    "i64",
    "ptr<",
    "[1048576]",
    "constexpr",
    "shape",
    "dtype",
    "init",
    "like",
    "launch",
    "grid",
    "args",
    "alloc",
    "sum",
    "axis",
    "into",
    "stride(0)",
    "numel()",
    "cdiv(",
    "uniform(",
    "randint(",
    "const(",
    "normal(",
    "file",
    "'descr'",
    "'shape'",
    "<f8",
    "|b1",
    "True",
    "fortran_order",
];

/// Numbers a mutation writes over a number: limits of every integer type, float extremes.
const NUMBERS: &[&str] = &[
    "0",
    "-1",
    "1",
    "2",
    "3",
    "7",
    "0.5",
    "-0.0",
    "1e-320",
    "1e308",
    "-1e308",
    "1e309",
    "inf",
    "-inf",
    "nan",
    "127",
    "255",
    "65535",
    "65536",
    "1048576",
    "1048577",
    "16777216",
    "2147483647",
    "2147483648",
    "-2147483649",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "18446744073709551616",
    "6148914691236517206",
    "1000000000000",
    "1_000",
];

/// Runs that nest or chain deeply when repeated.
const RUNS: &[&str] = &["(", "-", "[", "x + (", "tl.abs(", "1.0 + ", "max(", "{ a = ", "a.", "    "];

struct Mutator(StdRng);

impl Mutator {
    fn pos(&mut self, v: &[u8]) -> usize {
        self.0.gen_range(0..=v.len())
    }

    /// One or two random edits of `input`.
    fn mutate(&mut self, input: &[u8]) -> Vec<u8> {
        let mut v = input.to_vec();
        for _ in 0..self.0.gen_range(1..=2) {
            match self.0.gen_range(0..12) {
                0 => {
                    let a = self.pos(&v);
                    let b = (a + self.0.gen_range(1..24)).min(v.len());
                    v.drain(a..b);
                }
                1 => {
                    let a = self.pos(&v);
                    let b = (a + self.0.gen_range(1..80)).min(v.len());
                    let piece = v[a..b].to_vec();
                    let at = self.pos(&v);
                    v.splice(at..at, piece);
                }
                2 | 3 => {
                    let t = TOKENS[self.0.gen_range(0..TOKENS.len())].as_bytes().to_vec();
                    let at = self.pos(&v);
                    v.splice(at..at, t);
                }
                4..=7 => {
                    // Overwrite a number (a run of digits) with an interesting one.
                    let starts: Vec<usize> =
                        (0..v.len()).filter(|&i| v[i].is_ascii_digit() && (i == 0 || !v[i - 1].is_ascii_alphanumeric())).collect();
                    if let Some(&a) = starts.get(self.0.gen_range(0..starts.len().max(1))) {
                        let b = (a..v.len()).find(|&i| !(v[i].is_ascii_digit() || v[i] == b'.' || v[i] == b'_')).unwrap_or(v.len());
                        let n = NUMBERS[self.0.gen_range(0..NUMBERS.len())].as_bytes().to_vec();
                        v.splice(a..b, n);
                    }
                }
                8 => {
                    if !v.is_empty() {
                        let i = self.0.gen_range(0..v.len());
                        v[i] = self.0.gen();
                    }
                }
                9 | 10 => {
                    let r = RUNS[self.0.gen_range(0..RUNS.len())].repeat(self.0.gen_range(10..6000));
                    let at = self.pos(&v);
                    v.splice(at..at, r.into_bytes());
                }
                _ => {
                    let at = self.pos(&v);
                    v.truncate(at);
                }
            }
        }
        v
    }
}

/// Whether `s` holds a `:LINE:COL` location.
fn has_line_col(s: &str) -> bool {
    let b = s.as_bytes();
    (0..b.len()).any(|i| {
        let digits = |from: usize| (from..b.len()).take_while(|&j| b[j].is_ascii_digit()).count();
        b[i] == b':' && {
            let n = digits(i + 1);
            n > 0 && b.get(i + 1 + n) == Some(&b':') && digits(i + 2 + n) > 0
        }
    })
}

/// What is wrong with an IR error's location, if anything.
fn ir_error_unlocated(e: &IrError) -> Option<String> {
    match e {
        IrError::Parse { error, .. } if error.line == 0 || error.col == 0 => Some(format!("no line:column: {e}")),
        IrError::Parse { .. } => None,
        IrError::Invalid { diagnostics, .. } if diagnostics.is_empty() => Some(format!("no diagnostics: {e}")),
        IrError::Invalid { diagnostics, .. } => {
            diagnostics.iter().find(|d| d.loc.line == 0).map(|d| format!("a diagnostic without a line: {d}"))
        }
    }
}

/// What is wrong with a spec error's location, if anything: it names a key, or the line:column
/// in the spec; one that comes from a kernel's conversion carries the kernel's line:column.
fn spec_error_unlocated(e: &SpecError) -> Option<String> {
    if e.key == "-" && !(e.message.contains("line ") && e.message.contains(", column ")) {
        return Some(format!("neither a key nor a line: {e}"));
    }
    if e.key.ends_with(".launch") && e.message.contains(": kernel `") && !has_line_col(&e.message) {
        return Some(format!("a conversion error without line:column: {e}"));
    }
    None
}

/// The examples folder (specs shrunk), copied where mutants can be written next to the files they refer to.
fn scratch(tag: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let dst = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fuzz-{tag}"));
    let _ = std::fs::remove_dir_all(&dst);
    for sub in ["", "triton"] {
        std::fs::create_dir_all(dst.join(sub)).unwrap();
        for e in std::fs::read_dir(src.join(sub)).unwrap() {
            let p = e.unwrap().path();
            let to = dst.join(sub).join(p.file_name().unwrap());
            if p.extension().is_some_and(|x| x == "toml") {
                std::fs::write(&to, shrink(&std::fs::read_to_string(&p).unwrap())).unwrap();
            } else if p.is_file() {
                std::fs::copy(&p, to).unwrap();
            }
        }
    }
    dst
}

fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == ext)).collect();
    v.sort();
    v
}

/// Mutations per target and the seed.
fn budget() -> (usize, u64) {
    let n = std::env::var("TILEGRAD_FUZZ").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
    let seed = std::env::var("TILEGRAD_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    (n, seed)
}

/// Runs `case` on `n` mutants of the seeds; returns the failures (panics, unlocated errors), each
/// with the file its input was saved to.
fn campaign(name: &str, seeds: &[Vec<u8>], n: usize, seed: u64, mut case: impl FnMut(&[u8]) -> Option<String>) -> Vec<String> {
    let mut m = Mutator(StdRng::seed_from_u64(seed ^ name.bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64))));
    let mut failures = Vec::new();
    for i in 0..n {
        let base = &seeds[m.0.gen_range(0..seeds.len())];
        let input = m.mutate(base);
        let verdict = match catch_unwind(AssertUnwindSafe(|| case(&input))) {
            Ok(None) => continue,
            Ok(Some(why)) => why,
            Err(p) => format!(
                "panic: {}",
                p.downcast_ref::<String>().cloned().or(p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
            ),
        };
        let saved = std::env::temp_dir().join(format!("tilegrad-fuzz-failure-{name}-{seed}-{i}"));
        std::fs::write(&saved, &input).unwrap();
        failures.push(format!("{name} #{i} ({}): {}", saved.display(), verdict.chars().take(400).collect::<String>()));
    }
    eprintln!(
        "fuzz {name}: {n} mutants, {} failures (specs so far: {} loaded, {} checked)",
        failures.len(),
        LOADED.load(Ordering::Relaxed),
        CHECKED.load(Ordering::Relaxed)
    );
    failures
}

/// Constants, and shapes of inputs and allocations, for evaluating a spec's grids and arguments.
struct Shapes<'a>(&'a Spec, Vec<(String, Vec<usize>)>);

impl Scope for Shapes<'_> {
    fn constant(&self, name: &str) -> Option<Scalar> {
        self.0.inputs.constants.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.1.iter().rev().find(|(n, _)| n == name).map(|(_, s)| s.clone())
    }
}

/// Axis `axis` of a tensor of `shape` (negative counts from the end).
fn axis_index(shape: &[usize], axis: i64) -> Option<usize> {
    let a = if axis < 0 { axis + shape.len() as i64 } else { axis };
    usize::try_from(a).ok().filter(|&a| a < shape.len())
}

/// Whether checking `spec` is cheap: small inputs, small grids, small integer arguments.
fn cheap(spec: &Spec) -> bool {
    let mut sh = Shapes(spec, Vec::new());
    let mut total = 0usize;
    for t in &spec.inputs.tensors {
        let shape = match &t.source {
            Source::Given(h) => h.shape().to_vec(),
            Source::Random { shape, .. } | Source::Slices { shape, .. } => shape.clone(),
        };
        total = total.saturating_add(shape.iter().product());
        sh.1.push((t.name.clone(), shape));
    }
    for o in &spec.forward.outputs {
        sh.1.push((format!("grad_{o}"), Vec::new()));
    }
    let bsteps = spec.backward.as_ref().map_or(&[][..], |b| &b.steps[..]);
    for step in spec.forward.steps.iter().chain(bsteps) {
        match step {
            Step::Alloc { name, shape, .. } => {
                let Some(s) = shape.iter().map(|e| e.eval_size(&sh).ok()).collect::<Option<Vec<usize>>>() else { return false };
                total = total.saturating_add(s.iter().product());
                sh.1.push((name.clone(), s));
            }
            Step::Launch(l) => {
                let mut programs = 1i64;
                for g in &l.grid {
                    match g.eval_int(&sh) {
                        Ok(v) if (1..=4096).contains(&v) => programs = programs.saturating_mul(v),
                        _ => return false,
                    }
                }
                let big_arg = l.args.iter().any(|(_, e)| match e.as_name().and_then(|n| sh.shape(n)) {
                    Some(_) => false,
                    None => match e.eval(&sh) {
                        Ok(Scalar::Int(i)) => i.unsigned_abs() > 1 << 16,
                        Ok(Scalar::Float(_)) => false,
                        Err(_) => true,
                    },
                });
                if programs > 4096 || big_arg {
                    return false;
                }
            }
            Step::Sum { src, axis, dst } => {
                let Some(mut s) = sh.shape(src) else { return false };
                let a = if *axis < 0 { *axis + s.len() as i64 } else { *axis };
                if !(0..s.len() as i64).contains(&a) {
                    return false;
                }
                s.remove(a as usize);
                sh.1.push((dst.clone(), s));
            }
            Step::Reshape { shape, dst, .. } => {
                let Some(s) = shape.iter().map(|e| e.eval_size(&sh).ok()).collect::<Option<Vec<usize>>>() else { return false };
                sh.1.push((dst.clone(), s));
            }
            Step::Scale { src, dst, .. } | Step::Cast { src, dst, .. } => {
                let Some(s) = sh.shape(src) else { return false };
                sh.1.push((dst.clone(), s));
            }
            Step::Reduce { src, axis, dst, .. } => {
                let Some(mut s) = sh.shape(src) else { return false };
                let a = if *axis < 0 { *axis + s.len() as i64 } else { *axis };
                if !(0..s.len() as i64).contains(&a) {
                    return false;
                }
                s.remove(a as usize);
                sh.1.push((dst.clone(), s));
            }
            Step::Compute { expr, dst, .. } => {
                // Shapes only: every tensor taken as f32 (a spec this misjudges is skipped).
                let lookup = |n: &str| match sh.shape(n) {
                    Some(s) => Some(Operand::Tensor(DType::F32, s)),
                    None => sh.constant(n).map(Operand::Scalar),
                };
                let Ok(t) = expr.check(&lookup) else { return false };
                total = total.saturating_add(t.shape.iter().product());
                sh.1.push((dst.clone(), t.shape));
            }
            Step::Chunk { src, chunks, axis, dsts } => {
                let Some(s) = sh.shape(src) else { return false };
                let Some(a) = axis_index(&s, *axis) else { return false };
                let size = s[a].div_ceil((*chunks).max(1)).max(1);
                for (k, d) in dsts.iter().enumerate() {
                    let mut p = s.clone();
                    p[a] = size.min(s[a].saturating_sub(k * size));
                    sh.1.push((d.clone(), p));
                }
            }
            Step::Slice { src, dst, .. } => {
                // At most the source's shape: enough to judge the cost.
                let Some(s) = sh.shape(src) else { return false };
                sh.1.push((dst.clone(), s));
            }
            Step::Cat { srcs, axis, dst } => {
                let Some(parts) = srcs.iter().map(|n| sh.shape(n)).collect::<Option<Vec<_>>>() else { return false };
                let Some(a) = parts.first().and_then(|s| axis_index(s, *axis)) else { return false };
                let mut s = parts[0].clone();
                s[a] = parts.iter().map(|p| p.get(a).copied().unwrap_or(0)).sum();
                total = total.saturating_add(s.iter().product());
                sh.1.push((dst.clone(), s));
            }
            Step::Accumulate { .. } | Step::Item { .. } => {}
        }
    }
    total <= 1 << 15
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

/// Mutant specs that loaded, and that were checked.
static LOADED: AtomicUsize = AtomicUsize::new(0);
static CHECKED: AtomicUsize = AtomicUsize::new(0);

/// Loads a spec and, when cheap, checks it once; `Some` says what is wrong.
fn load_and_check(path: &Path) -> Option<String> {
    let s = match load(path) {
        Ok(s) => s,
        Err(e) => return spec_error_unlocated(&e),
    };
    LOADED.fetch_add(1, Ordering::Relaxed);
    if let (Some(b), true) = (&s.backward, cheap(&s)) {
        CHECKED.fetch_add(1, Ordering::Relaxed);
        let o = CheckOptions { trials: 1, ..s.options.clone() };
        // A failed check or a usage error is a fine outcome for a mutant; only panics are not.
        let _ = tilegrad::check_backward(&s.forward, b, &s.inputs, &o);
    }
    None
}

fn run_all() -> Vec<String> {
    let (n, seed) = budget();
    let mut failures = Vec::new();

    // Triton source: each mutant replaces one example kernel file; every example spec using it
    // is loaded (converting its kernels with the spec's constexprs), then listed directly.
    let dir = scratch("py");
    let pys = files(&dir.join("triton"), "py");
    let specs = files(&dir, "toml");
    let originals: Vec<Vec<u8>> = pys.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let mut which = 0usize;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut m = Mutator(StdRng::seed_from_u64(seed.wrapping_add(1)));
    let mut bad = Vec::new();
    for i in 0..n {
        which = (which + rng.gen_range(1..=pys.len())) % pys.len();
        let input = m.mutate(&originals[which]);
        let path = &pys[which];
        let fname = format!("triton/{}", path.file_name().unwrap().to_string_lossy());
        std::fs::write(path, &input).unwrap();
        let verdict = catch_unwind(AssertUnwindSafe(|| {
            if let Ok(text) = tilegrad_ir::source_text(input.clone(), "k.py") {
                match tilegrad_ir::triton::kernels(&text, "k.py") {
                    Err(e) => {
                        if let Some(why) = ir_error_unlocated(&e) {
                            return Some(why);
                        }
                    }
                    Ok(names) => {
                        for k in names {
                            let o = tilegrad_ir::triton::ConvertOptions::with_constexprs(&[("BLOCK", 64), ("BLOCK_SIZE", 64)]);
                            if let Err(e) = tilegrad_ir::triton::convert(&text, "k.py", &k, &o) {
                                if let Some(why) = ir_error_unlocated(&e) {
                                    return Some(why);
                                }
                            }
                        }
                    }
                }
            }
            for s in &specs {
                if std::fs::read_to_string(s).unwrap().contains(&fname) {
                    if let Some(why) = load_and_check(s) {
                        return Some(why);
                    }
                }
            }
            None
        }));
        std::fs::write(path, &originals[which]).unwrap();
        let why = match verdict {
            Ok(None) => continue,
            Ok(Some(w)) => w,
            Err(_) => "panic".to_string(),
        };
        let saved = std::env::temp_dir().join(format!("tilegrad-fuzz-failure-triton-{seed}-{i}.py"));
        std::fs::write(&saved, &input).unwrap();
        bad.push(format!("triton #{i} ({}): {}", saved.display(), why.chars().take(400).collect::<String>()));
    }
    eprintln!(
        "fuzz triton: {n} mutants, {} failures (specs: {} loaded, {} checked)",
        bad.len(),
        LOADED.load(Ordering::Relaxed),
        CHECKED.load(Ordering::Relaxed)
    );
    failures.extend(bad);

    // Text IR, parsed directly and through the spec that uses it.
    let dir = scratch("tgir");
    let tgirs: Vec<Vec<u8>> = files(&dir, "tgir").iter().map(|p| std::fs::read(p).unwrap()).collect();
    let target = dir.join("vector_add.tgir");
    let spec = dir.join("vector_add_ir.toml");
    failures.extend(campaign("tgir", &tgirs, n, seed, |input| {
        match tilegrad_ir::source_text(input.to_vec(), "k.tgir").and_then(|t| tilegrad_ir::text::parse(&t, "k.tgir")) {
            Err(e) => {
                if let Some(why) = ir_error_unlocated(&e) {
                    return Some(why);
                }
            }
            Ok(ks) => {
                // What parses prints and parses back to the same kernels.
                let printed = tilegrad_ir::text::print_module(&ks);
                match tilegrad_ir::text::parse(&printed, "k.tgir") {
                    Ok(again) if again.len() == ks.len() => {}
                    other => return Some(format!("printed text does not parse back: {other:?}\n{printed}")),
                }
            }
        }
        std::fs::write(&target, input).unwrap();
        load_and_check(&spec)
    }));

    // Spec TOML, with constants shrunk so that what loads can be checked.
    let dir = scratch("toml");
    let seeds: Vec<Vec<u8>> = files(&dir, "toml").iter().map(|p| std::fs::read(p).unwrap()).collect();
    let target = dir.join("fuzz.toml");
    for (i, s) in seeds.iter().enumerate() {
        std::fs::write(&target, s).unwrap();
        if let Err(e) = load(&target) {
            failures.push(format!("seed spec {i} does not load: {e}"));
        }
    }
    failures.extend(campaign("spec", &seeds, n, seed, |input| {
        std::fs::write(&target, input).unwrap();
        load_and_check(&target)
    }));

    // `.npy` bytes: headers and data of every dtype.
    let dir = scratch("npy");
    let seeds: Vec<Vec<u8>> = [
        tilegrad_reference::HostTensor::from_f32(&[2, 3], vec![1.5, -2.0, 3.25, 0.0, 1e-7, -4.0]),
        tilegrad_reference::HostTensor::from_f64(&[4], vec![0.1, -0.2, 1e300, -1e-300]),
        tilegrad_reference::HostTensor::from_i32(&[3, 1], vec![-1, 7, i32::MAX]),
        tilegrad_reference::HostTensor::from_i64(&[2], vec![i64::MIN, 42]),
        tilegrad_reference::HostTensor::from_f64_as(tilegrad_ir::DType::F16, &[3], &[0.5, -1.25, 3.0]),
        tilegrad_reference::HostTensor::from_f64_as(tilegrad_ir::DType::I1, &[2, 2], &[1.0, 0.0, 0.0, 1.0]),
    ]
    .iter()
    .enumerate()
    .map(|(i, t)| {
        let p = dir.join(format!("seed{i}.npy"));
        tilegrad::npy::write(&p, t).unwrap();
        std::fs::read(&p).unwrap()
    })
    .collect();
    failures.extend(campaign("npy", &seeds, n, seed, |input| {
        if let Ok(t) = tilegrad::npy::parse(input) {
            // What reads writes back and reads the same.
            let p = dir.join("again.npy");
            tilegrad::npy::write(&p, &t).unwrap();
            let again = tilegrad::npy::read(&p).unwrap();
            if again.shape() != t.shape() || again.dtype() != t.dtype() {
                return Some(format!("round trip changed {:?} {} to {:?} {}", t.shape(), t.dtype(), again.shape(), again.dtype()));
            }
        }
        None
    }));
    failures
}

#[test]
fn mutated_inputs_never_panic_and_every_error_is_located() {
    // The command line's main thread has 8 MiB of stack; so does this fuzzer's (a test thread has
    // 2 MiB), since mutants nest as deep as the parsers allow.
    let failures = std::thread::Builder::new().stack_size(8 << 20).spawn(run_all).unwrap().join().unwrap();
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}
