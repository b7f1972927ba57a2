//! The cost of a mutant spec, judged in a child process (this test binary run again, so that an
//! abort while loading is caught too): whether it loads, whether its error says where, and
//! whether checking it is cheap (small inputs, small grids, small integer arguments), so that the
//! campaign runs `tilegrad check` only on mutants that check in milliseconds.

use std::path::Path;
use tilegrad::check::{expr::Scope, tensor_expr::Operand, Scalar, Source, Step};
use tilegrad::spec::{load, Spec, SpecError};
use tilegrad_ir::DType;

/// The environment variable that makes the test binary a probe of one spec.
pub const PROBE_ENV: &str = "TILEGRAD_FUZZ_PROBE";
/// The line a probe prints its verdict on.
pub const PROBE_MARK: &str = "fuzz-probe: ";

/// A probe's verdict on a spec.
#[derive(Debug, PartialEq, Eq)]
pub enum Cost {
    /// It does not load (with a located error).
    Error,
    /// It loads and checks in milliseconds.
    Cheap,
    /// It loads but checking it may take long.
    Costly,
}

/// Loads the spec at `path`: its cost, or what is wrong with its error's location.
pub fn probe(path: &Path) -> Result<Cost, String> {
    match load(path) {
        Err(e) => spec_error_unlocated(&e).map_or(Ok(Cost::Error), Err),
        Ok(s) if cheap(&s) => Ok(Cost::Cheap),
        Ok(_) => Ok(Cost::Costly),
    }
}

/// Prints the probe's verdict on the spec named by `PROBE_ENV`, when set.
pub fn probe_from_env() {
    if let Some(p) = std::env::var_os(PROBE_ENV) {
        match probe(Path::new(&p)) {
            Ok(c) => println!("{PROBE_MARK}{c:?}"),
            Err(why) => println!("{PROBE_MARK}unlocated {}", why.replace('\n', " | ")),
        }
    }
}

/// Reads a probe's verdict from its stdout.
pub fn verdict(stdout: &str) -> Option<Result<Cost, String>> {
    // libtest prints the test's name on the same line.
    let line = stdout.lines().find_map(|l| l.find(PROBE_MARK).map(|at| &l[at + PROBE_MARK.len()..]))?;
    Some(match line {
        "Error" => Ok(Cost::Error),
        "Cheap" => Ok(Cost::Cheap),
        "Costly" => Ok(Cost::Costly),
        other => Err(other.strip_prefix("unlocated ").unwrap_or(other).to_string()),
    })
}

/// What is wrong with a spec error's location, if anything: it names a key, or the line:column
/// in the spec; one that comes from a kernel's conversion carries the kernel's line:column.
pub fn spec_error_unlocated(e: &SpecError) -> Option<String> {
    if e.key == "-" && !(e.message.contains("line ") && e.message.contains(", column ")) {
        return Some(format!("neither a key nor a line: {e}"));
    }
    if e.key.ends_with(".launch") && e.message.contains(": kernel `") && !crate::child::has_line_col(&e.message) {
        return Some(format!("a conversion error without line:column: {e}"));
    }
    None
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
pub fn cheap(spec: &Spec) -> bool {
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
