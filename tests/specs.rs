//! The example specs (`examples/*.toml`), through the library and through the command line.
//!
//! - Every spec loads, its backward passes [`check_backward`] with the default options and its
//!   forward's ground truth passes [`gradcheck`] (AD against central finite differences).
//! - Every deliberately broken backward of `examples/triton/*_bwd.py` (the table of broken
//!   variants in `tests/triton_bwd.rs`), swapped into its spec with a [`KernelOverride`], fails,
//!   and the report points at the right place: the failure message names the file and line of an
//!   out-of-bounds access or a race; for a wrong or NaN gradient, the worst element's blame names
//!   the store (file, line, kernel) that wrote it, or says that it was never written. [`CASES`]
//!   says, per variant, what the report must say, and notes where that is not the `# BUG:` line
//!   of the variant (a wrong value is blamed on the store that wrote it, not on the line that
//!   computed it; an access is reported where it happens, not where its mask or pointer was set
//!   up; an element never written has no line at all).
//! - The `tilegrad` binary: exit codes (0 pass, 1 fail, 2 bad input), `--json`, `grad --out` and
//!   `run --out`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use tilegrad::check::{check_backward, gradcheck, BlameSite, CheckOptions, Report};
use tilegrad::spec::{self, KernelOverride};

mod cases;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

/// The spec files of `examples/`, sorted.
fn spec_files() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> =
        std::fs::read_dir(examples()).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "toml")).collect();
    v.sort();
    v
}

/// Runs `f` on every item in its own thread and returns the error messages, in order.
fn all<T: Sync>(items: &[T], f: impl Fn(&T) -> Result<(), String> + Sync) -> Vec<String> {
    std::thread::scope(|s| {
        let handles: Vec<_> = items.iter().map(|it| s.spawn(|| f(it))).collect();
        handles.into_iter().filter_map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())).err()).collect()
    })
}

// ---------------------------------------------------------------- every spec passes

/// Loads a spec, checks its backward and its ground truth; `Err` says what went wrong.
fn check_spec(path: &Path) -> Result<(), String> {
    let shown = path.display();
    let s = spec::load(path).map_err(|e| format!("{shown}: load: {e}"))?;
    let bwd = s.backward.as_ref().ok_or_else(|| format!("{shown}: no [backward]"))?;
    let r = check_backward(&s.forward, bwd, &s.inputs, &CheckOptions::default()).map_err(|e| format!("{shown}: check: {e}"))?;
    if !r.passed {
        return Err(format!("{shown}: the check fails:\n{r}"));
    }
    // A pass must have compared something: one gradient per differentiable input, each finite.
    let compared: Vec<&str> = r.gradients.iter().map(|g| g.name.as_str()).collect();
    if compared != s.forward.differentiable.iter().map(String::as_str).collect::<Vec<_>>() || r.forward.is_empty() {
        return Err(format!("{shown}: gradients compared {compared:?}, differentiable {:?}", s.forward.differentiable));
    }
    let g = gradcheck(&s.forward, &s.inputs, &CheckOptions::default(), &s.name).map_err(|e| format!("{shown}: gradcheck: {e}"))?;
    if !g.passed || g.trials.is_empty() {
        return Err(format!("{shown}: gradcheck fails:\n{g}"));
    }
    Ok(())
}

#[test]
fn every_example_spec_passes_check_and_gradcheck() {
    let files = spec_files();
    let names: BTreeSet<String> = files.iter().map(|p| p.file_stem().unwrap().to_string_lossy().into_owned()).collect();
    for want in [
        "weighted_sum",
        "vector_add",
        "vector_add_ir",
        "copy",
        "grey",
        "weighted_sum_desc",
        "matmul",
        "l2_norm",
        "atomic_sum",
        "softmax",
        "layer_norm",
        "layer_norm_saved",
        "layer_norm_lock",
        "row_scale_desc",
        "flash_attention",
        "flash_attention_causal",
        "cross_entropy_mean",
        "kl_div",
        "kl_div_log_target",
        "jsd",
        "jsd_forward_kl",
        "glu",
        "glu_geglu_bf16",
        "embedding",
        "pointwise_loss",
        "pointwise_loss_smooth_l1_f16",
        "bce_with_logits",
        "cumsum",
        "cumsum_exclusive",
        "group_norm",
        "fused_add_rms_norm",
        "log_softmax",
        "linear_act",
        "linear_tf32",
        "layer_scale",
        "dyt",
        "batch_norm",
        "smooth_ce",
        "smooth_ce_bf16",
        "dropout",
        "scale_leaky_relu",
        "cross_entropy_fused",
    ] {
        assert!(names.contains(want), "examples/{want}.toml is missing (specs: {names:?})");
    }
    let failures = all(&files, |p| check_spec(p));
    assert!(failures.is_empty(), "{} of {} specs fail:\n{}", failures.len(), files.len(), failures.join("\n"));
}

// ---------------------------------------------------------------- broken variants

pub(crate) use cases::{Case, Expect::*, CASES};

/// A kernel of `examples/triton/`: its file name, the lines of its `def` to the next decorator
/// (1-based, inclusive) and the line carrying `# BUG:` in that range, if any.
struct Source {
    file: String,
    lines: (usize, usize),
    bug: Option<usize>,
}

/// Finds `@triton.jit def name` in the Triton examples.
fn source(name: &str) -> Source {
    for p in std::fs::read_dir(examples().join("triton")).unwrap().map(|e| e.unwrap().path()) {
        let text = std::fs::read_to_string(&p).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let Some(def) = lines.iter().position(|l| l.starts_with(&format!("def {name}("))) else { continue };
        let end = def + lines[def..].iter().position(|l| l.starts_with('@')).unwrap_or(lines.len() - def);
        let bug = (def..end).find(|&i| lines[i].contains("# BUG:")).map(|i| i + 1);
        return Source { file: p.file_name().unwrap().to_string_lossy().into_owned(), lines: (def + 1, end), bug };
    }
    panic!("no kernel `{name}` in examples/triton")
}

/// Every `_broken_` kernel of the Triton examples.
fn broken_kernels() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for p in std::fs::read_dir(examples().join("triton")).unwrap().map(|e| e.unwrap().path()) {
        for l in std::fs::read_to_string(&p).unwrap().lines() {
            if let Some(n) = l.strip_prefix("def ").and_then(|r| r.split('(').next()).filter(|n| n.contains("_broken_")) {
                out.insert(n.to_string());
            }
        }
    }
    out
}

/// Whether `site` is a write by `kernel` at `file:line`.
fn site_at(site: &BlameSite, kernel: &str, file: &str, line: usize) -> bool {
    let at = |loc: &str| {
        loc.contains(&format!("{file}:{line}:")) && (loc.starts_with(&format!("{file}:")) || loc.contains(&format!("/{file}:")))
    };
    match site {
        BlameSite::Store { kernel: k, loc, .. } | BlameSite::ManyPrograms { kernel: k, loc, .. } => k == kernel && at(loc),
        _ => false,
    }
}

/// Checks the report of a broken variant against its expectation.
fn judge(case: &Case, r: &Report) -> Result<(), String> {
    let &(variant, _, _, expect, note) = case;
    let src = source(variant);
    let file = &src.file;
    if r.passed {
        return Err("the check passes".into());
    }
    let line = match expect {
        Oob(l) | Race(l) | Wrong { line: l, .. } | NanWritten { line: l, .. } | ForwardFails { line: l, .. } => Some(l),
        Unwritten { .. } | Downstream { .. } => None,
    };
    if let Some(l) = line {
        if l < src.lines.0 || l > src.lines.1 {
            return Err(format!("the table's line {l} is outside `{variant}` ({file}:{}-{})", src.lines.0, src.lines.1));
        }
    }
    // The table notes exactly the cases where the report cannot name the `# BUG:` line.
    let bug = src.bug.ok_or_else(|| format!("`{variant}` has no `# BUG:` line"))?;
    if note.is_empty() != (line == Some(bug)) {
        return Err(format!("the bug is at line {bug}, the report points at {line:?}, and the note is `{note}`"));
    }
    match expect {
        Oob(l) | Race(l) => {
            let f = r.failure.as_ref().ok_or("no failure: the backward ran")?;
            let what = if matches!(expect, Oob(_)) { "out-of-bounds" } else { "race" };
            let at = format!("{file}:{l}:");
            if !f.message.contains(what) || !f.message.contains(&at) || !f.message.contains(&format!("kernel `{variant}`")) {
                return Err(format!("expected {what} at {at} in `{variant}`, got: {}", f.message));
            }
        }
        Wrong { input, line } | NanWritten { input, line } => {
            if let Some(f) = &r.failure {
                return Err(format!("the backward failed to run: {}", f.message));
            }
            let g = r.gradients.iter().find(|g| g.name == input).ok_or_else(|| format!("no gradient of `{input}`"))?;
            let nan = g.nan + g.inf > 0;
            if g.passed || nan != matches!(expect, NanWritten { .. }) {
                return Err(format!("expected {expect:?}, got gradient of `{input}` passed = {}, nan/inf = {}", g.passed, g.nan + g.inf));
            }
            let blame = g.worst.as_ref().and_then(|w| w.blame.as_ref()).ok_or("the worst element has no blame")?;
            if !blame.sites.iter().any(|s| site_at(s, variant, file, line)) {
                return Err(format!(
                    "expected the worst element of `{input}` blamed on {file}:{line} in `{variant}`, got {:?}",
                    blame.sites
                ));
            }
        }
        Downstream { input, kernel, file: at, line } => {
            if let Some(f) = &r.failure {
                return Err(format!("the backward failed to run: {}", f.message));
            }
            let g = r.gradients.iter().find(|g| g.name == input).ok_or_else(|| format!("no gradient of `{input}`"))?;
            if g.passed || g.nan + g.inf > 0 {
                return Err(format!(
                    "expected a wrong finite gradient of `{input}`, got passed = {}, nan/inf = {}",
                    g.passed,
                    g.nan + g.inf
                ));
            }
            let blame = g.worst.as_ref().and_then(|w| w.blame.as_ref()).ok_or("the worst element has no blame")?;
            if !blame.sites.iter().any(|s| site_at(s, kernel, at, line)) {
                return Err(format!("expected the worst element of `{input}` blamed on {at}:{line} in `{kernel}`, got {:?}", blame.sites));
            }
            // The data flow reaches the variant's launch.
            if !blame.slice.as_ref().is_some_and(|s| s.lines.iter().any(|l| l.kernel == variant)) {
                return Err(format!("the data flow of the worst element of `{input}` does not reach `{variant}`"));
            }
        }
        ForwardFails { what, line } => {
            let f = r.forward_failure.as_ref().ok_or("no forward failure: the forward ran")?;
            let at = format!("{file}:{line}:");
            if !f.message.contains(what) || !f.message.contains(&at) || !f.message.contains(&format!("kernel `{variant}`")) {
                return Err(format!("expected a forward {what} at {at} in `{variant}`, got: {}", f.message));
            }
        }
        Unwritten { input, tensor } => {
            if let Some(f) = &r.failure {
                return Err(format!("the backward failed to run: {}", f.message));
            }
            let g = r.gradients.iter().find(|g| g.name == input).ok_or_else(|| format!("no gradient of `{input}`"))?;
            let blame = g.worst.as_ref().and_then(|w| w.blame.as_ref()).ok_or("the worst element has no blame")?;
            let never =
                blame.sites.iter().any(|s| matches!(s, BlameSite::NeverWritten { tensor: t, init, .. } if t == tensor && init == "NaN"));
            if g.passed || g.nan == 0 || !never {
                return Err(format!("expected `{tensor}` never written, got nan = {}, blame {:?}", g.nan, blame.sites));
            }
        }
    }
    // Whatever else failed is blamed on the variant, never on a correct kernel.
    for g in r.gradients.iter().filter(|g| !g.passed) {
        for s in g.worst.iter().filter_map(|w| w.blame.as_ref()).flat_map(|b| &b.sites) {
            if let BlameSite::Store { kernel, .. } | BlameSite::ManyPrograms { kernel, .. } = s {
                if kernel != variant && !matches!(expect, Downstream { kernel: k, .. } if k == kernel) {
                    return Err(format!("gradient of `{}` blamed on kernel `{kernel}`", g.name));
                }
            }
        }
    }
    Ok(())
}

#[test]
fn the_table_covers_every_broken_variant() {
    let table: BTreeSet<String> = CASES.iter().map(|c| c.0.to_string()).collect();
    assert_eq!(table.len(), CASES.len(), "a variant is listed twice");
    assert_eq!(table, broken_kernels(), "CASES and the `_broken_` kernels of examples/triton differ");
}

#[test]
fn every_broken_variant_fails_and_the_report_points_at_it() {
    let failures = all(CASES, |case| {
        let (variant, spec_name, key, ..) = *case;
        let path = examples().join(format!("{spec_name}.toml"));
        let o = [KernelOverride { key: key.to_string(), reference: format!("::{variant}") }];
        let s = spec::load_with(&path, &o).map_err(|e| format!("{variant}: load: {e}"))?;
        // One cotangent trial: every variant fails on any random cotangent.
        let opts = CheckOptions { trials: 1, ..CheckOptions::default() };
        let r = check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &opts).map_err(|e| format!("{variant}: check: {e}"))?;
        judge(case, &r).map_err(|e| format!("{variant} ({spec_name}.toml, {key}): {e}\n{r}"))
    });
    assert!(failures.is_empty(), "{} of {} broken variants:\n{}", failures.len(), CASES.len(), failures.join("\n\n"));
}

/// Variants whose `# BUG:` line the data-flow slice does not reach within its shown lines, and
/// why.
const SLICE_MISSES: &[(&str, &str)] = &[];

/// For a wrong or NaN gradient, the worst element's data-flow slice names the variant's `# BUG:`
/// line (with its source text) among at most a dozen lines.
#[test]
fn the_slice_of_every_wrong_value_names_the_bug_line() {
    let cases: Vec<&Case> = CASES.iter().filter(|c| matches!(c.3, Wrong { .. } | NanWritten { .. } | Downstream { .. })).collect();
    let failures = all(&cases, |case| {
        let (variant, spec_name, key, expect, _) = **case;
        let input = match expect {
            Wrong { input, .. } | NanWritten { input, .. } | Downstream { input, .. } => input,
            _ => unreachable!("filtered"),
        };
        let path = examples().join(format!("{spec_name}.toml"));
        let o = [KernelOverride { key: key.to_string(), reference: format!("::{variant}") }];
        let s = spec::load_with(&path, &o).map_err(|e| format!("{variant}: load: {e}"))?;
        let opts = CheckOptions { trials: 1, ..CheckOptions::default() };
        let r = check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &opts).map_err(|e| format!("{variant}: check: {e}"))?;
        let src = source(variant);
        let bug = src.bug.ok_or_else(|| format!("{variant}: no BUG line"))?;
        let g = r.gradients.iter().find(|g| g.name == input).ok_or_else(|| format!("{variant}: no gradient of `{input}`"))?;
        let slice = g
            .worst
            .as_ref()
            .and_then(|w| w.blame.as_ref())
            .and_then(|b| b.slice.as_ref())
            .ok_or_else(|| format!("{variant}: no slice\n{r}"))?;
        let at = |loc: &str| loc.contains(&format!("{}:{bug}:", src.file));
        let named = slice.lines.len() + slice.nonfinite.is_some() as usize;
        // Quoted sources are cut at 100 characters, which may cut the comment.
        let hit = slice.lines.iter().any(|l| at(&l.loc) && (l.source.contains("# BUG:") || l.source.ends_with("...")))
            || slice.nonfinite.as_deref().is_some_and(at);
        let miss = SLICE_MISSES.iter().any(|(v, _)| *v == variant);
        if named > 12 {
            return Err(format!("{variant}: {named} lines named\n{r}"));
        }
        if hit == miss {
            return Err(format!("{variant}: bug line {bug} named: {hit}, listed as a miss: {miss}\n{r}"));
        }
        Ok(())
    });
    assert!(failures.is_empty(), "{} of {} variants:\n{}", failures.len(), cases.len(), failures.join("\n\n"));
}

// ---------------------------------------------------------------- the command line

fn tilegrad(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tilegrad")).args(args).current_dir(env!("CARGO_MANIFEST_DIR")).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// A fresh folder under cargo's temporary folder for tests (`target/tmp`).
fn temp_dir(tag: &str) -> PathBuf {
    let d = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("specs-{tag}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn cli_exit_codes_pass_fail_and_bad_spec() {
    let (code, out, err) = tilegrad(&["check", "examples/vector_add.toml"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("check `vector_add`: PASS"), "{out}");
    let (code, out, err) = tilegrad(&["gradcheck", "examples/vector_add_ir.toml"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("gradcheck `vector_add_ir`: PASS"), "{out}");

    // A wrong value: blamed on the store that wrote it.
    let (code, out, err) = tilegrad(&["check", "examples/copy.toml", "--kernel", "bwd=::copy_bwd_broken_shift"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("FAIL") && out.contains("examples/triton/copy_bwd.py:34:"), "{out}");
    // An out-of-bounds access: reported at its line.
    let (code, out, err) = tilegrad(&["check", "examples/copy.toml", "--kernel", "bwd=::copy_bwd_broken_mask"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("out-of-bounds") && out.contains("examples/triton/copy_bwd.py:25:"), "{out}");
    // Several specs: one failing fails the run.
    let (code, out, _) = tilegrad(&["check", "examples/vector_add.toml", "examples/copy.toml", "--kernel", "bwd=::copy_bwd_broken_shift"]);
    assert_ne!(code, 0, "{out}");

    // A typo'd key in a copy of a spec (kernels by absolute path, so that only the key is wrong).
    let dir = temp_dir("bad");
    let text = std::fs::read_to_string(examples().join("vector_add.toml")).unwrap();
    let triton = format!("\"{}/", examples().join("triton").display());
    let good = text.replace("\"triton/", &triton);
    let good_path = dir.join("good.toml");
    std::fs::write(&good_path, &good).unwrap();
    let (code, out, err) = tilegrad(&["check", good_path.to_str().unwrap()]);
    assert_eq!(code, 0, "the copy itself must pass: {out}{err}");
    assert!(good.contains("differentiable = "));
    let bad_path = dir.join("typo.toml");
    std::fs::write(&bad_path, good.replace("differentiable = ", "diferentiable = ")).unwrap();
    let (code, out, err) = tilegrad(&["check", bad_path.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains(&bad_path.display().to_string()) && err.contains("forward.diferentiable") && err.contains("unknown key"), "{err}");
    // A kernel override naming no kernel of the spec.
    let (code, _, err) = tilegrad(&["check", "examples/vector_add.toml", "--kernel", "nope=::vector_add_bwd"]);
    assert_eq!(code, 2);
    assert!(err.contains("kernels.nope"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cli_defects_and_notes_of_the_code_as_it_runs_on_a_gpu() {
    // A launcher that allocates too few partial sums: the forward's last program stores past the
    // buffer, a defect of the user's code (exit 1), not a usage error (exit 2).
    let (code, out, err) = tilegrad(&["check", "examples/defects/block_sum_short_partials.toml", "--json"]);
    assert_eq!(code, 1, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let f = &v[0]["findings"][0];
    assert_eq!(
        (f["kind"].as_str(), f["pass"].as_str(), f["tensor"].as_str()),
        (Some("forward_out_of_bounds"), Some("forward"), Some("partials"))
    );
    assert!(f["locations"][0]["file"].as_str().is_some_and(|p| p.ends_with("block_sum.py")) && f["locations"][0]["line"] == 17, "{f}");
    // A backward that reads its rows' tails without `other`: a pass with a note, a failure with
    // `--strict`.
    let (code, out, err) = tilegrad(&["check", "examples/layer_norm_tail.toml"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("reads masked-off lanes of loads without `other` as 0") && out.contains("layer_norm_tail_bwd.py at 21:"), "{out}");
    let (code, out, err) = tilegrad(&["check", "examples/layer_norm_tail.toml", "--strict"]);
    assert_eq!(code, 1, "{out}{err}");
    // Programs of a row storing the same statistic: notes in both passes, not races.
    let (code, out, err) = tilegrad(&["check", "examples/row_rms_scale.toml", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let notes: Vec<(&str, &str)> =
        v[0]["notes"].as_array().unwrap().iter().map(|n| (n["kind"].as_str().unwrap(), n["pass"].as_str().unwrap())).collect();
    assert_eq!(notes, [("same_value_race", "forward"), ("same_value_race", "backward")], "{out}");
    assert_eq!(v[0]["notes"][1]["tensor"], "grad_g");
    assert_eq!(v[0]["notes"][1]["element"], serde_json::json!([0]));
}

/// Per gradient: (input, formula passed, rounding passed, rounding units).
type VerdictLine = (String, bool, bool, f64);

/// The formula and rounding lines of a spec checked with a kernel swapped in, whether it passed,
/// and the kinds of its findings.
fn verdict_lines(spec_name: &str, swap: Option<(&str, &str)>) -> (bool, Vec<VerdictLine>, Vec<String>) {
    let o: Vec<KernelOverride> = swap.iter().map(|(k, v)| KernelOverride { key: k.to_string(), reference: format!("::{v}") }).collect();
    let s = spec::load_with(&examples().join(format!("{spec_name}.toml")), &o).unwrap();
    let r = check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &CheckOptions::default()).unwrap();
    let lines = r
        .gradients
        .iter()
        .map(|g| {
            let (f, ro) = (g.formula.as_ref().expect("formula"), g.rounding.as_ref().expect("rounding"));
            (g.name.clone(), f.passed, ro.passed, ro.units)
        })
        .collect();
    let kinds = r.findings.iter().map(|f| format!("{:?}", f.kind)).collect();
    (r.passed, lines, kinds)
}

#[test]
fn sixteen_bit_backwards_fail_on_the_line_they_should() {
    // Correct: within the rounding budget by a wide margin.
    let (passed, lines, _) = verdict_lines("col_scale_f16", None);
    assert!(passed && lines.iter().all(|l| l.1 && l.2 && l.3 < 1.0), "{lines:?}");
    // A 2000-term sum accumulated in f16: the right formula, too much rounding.
    let (passed, lines, kinds) = verdict_lines("col_scale_f16", Some(("bwd_dw", "col_scale_bwd_dw_broken_f16_acc")));
    let w = lines.iter().find(|l| l.0 == "w").unwrap();
    assert!(!passed && w.1 && !w.2 && w.3 > 8.0, "{lines:?}");
    assert_eq!(kinds, ["Precision"], "{lines:?}");
    // A z-loss term with the wrong factor in bf16: far below bf16's roundoff, a wrong formula.
    let (passed, lines, _) = verdict_lines("smooth_ce_zloss_bf16", None);
    assert!(passed && lines[0].1 && lines[0].2, "{lines:?}");
    let (passed, lines, kinds) = verdict_lines("smooth_ce_zloss_bf16", Some(("bwd", "_smooth_ce_bwd_broken_z_loss")));
    assert!(!passed && !lines[0].1 && lines[0].2 && lines[0].3 < 1.0, "{lines:?}");
    assert_eq!(kinds, ["WrongValue"], "{lines:?}");
}

#[test]
fn cancellation_at_a_divergences_minimum_passes() {
    // JSD with the input equal to the target: the loss is 0 and its gradient too in exact
    // arithmetic; the ground truth's f64 rounding leaves ~1e-19, the kernels' f32 rounding more.
    // Judged against what was summed (and the cotangent's size), not the result, it passes
    // (every broken variant of jsd_bwd.py fails on inputs away from the minimum: CASES).
    let s = spec::load(&examples().join("jsd.toml")).unwrap();
    let x = tilegrad::check::run_forward(&s.forward, &s.inputs, 0).unwrap().0.into_iter().find(|(n, _)| n == "x").unwrap().1;
    let mut inputs = tilegrad::check::Inputs::new().given("x", x.clone()).given("y", x);
    inputs.constants = s.inputs.constants.clone();
    let r = check_backward(&s.forward, s.backward.as_ref().unwrap(), &inputs, &CheckOptions::default()).unwrap();
    assert!(r.passed, "{r}");
    assert!(r.forward[0].max_abs_err < 1e-6 && r.gradients.iter().all(|g| g.formula.as_ref().is_some_and(|f| f.passed)), "{r}");
    // The loss in f32 (0, or of the order of 1e-9) against f64's 1e-18 or so: a relative error
    // of 1 or more, far over any rtol, within f32's rounding of the terms summed.
    assert!(r.forward[0].normwise_rel_err >= 1.0 && r.forward[0].rounding.as_ref().is_some_and(|ro| ro.passed), "{r}");
}

#[test]
fn one_tensor_the_gradient_of_two_inputs_is_explained_once() {
    // x + y: both gradients are the cotangent, so one tensor may serve as both.
    let dir = temp_dir("shared_grad");
    let text = std::fs::read_to_string(examples().join("vector_add.toml")).unwrap();
    let triton = format!("\"{}/", examples().join("triton").display());
    let shared = text
        .replace("\"triton/", &triton)
        .replace("gradients = { x = \"grad_x\", y = \"grad_y\" }", "gradients = { x = \"grad_x\", y = \"grad_x\" }");
    assert!(shared.contains("y = \"grad_x\""));
    let path = dir.join("shared.toml");
    std::fs::write(&path, &shared).unwrap();
    let (code, out, err) = tilegrad(&["check", path.to_str().unwrap(), "--kernel", "bwd=::vector_add_bwd_broken_off_by_one"]);
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(out.matches("FAIL").count(), 3, "both rows fail: {out}");
    assert_eq!(out.matches("worst element of `grad_x`").count(), 1, "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cli_blame_element_explains_any_element() {
    let args = ["check", "examples/softmax.toml", "--kernel", "bwd=::softmax_bwd_broken_no_dot", "--trials", "1"];
    let (code, out, err) = tilegrad(&[&args[..], &["--blame-element", "grad_x[3, 5]"]].concat());
    assert_eq!(code, 1, "{out}{err}");
    let at = out.find("element `grad_x`[3, 5]: expected").unwrap_or_else(|| panic!("{out}"));
    // The element's slice quotes the bug's line.
    assert!(out[at..].contains("softmax_bwd.py:59") && out[at..].contains("# BUG:"), "{out}");
    let (code, out, err) = tilegrad(&[&args[..], &["--json", "--blame-element", "x[3,5]"]].concat());
    assert_eq!(code, 1, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let x = &v[0]["explained"][0];
    assert_eq!(x["tensor"], "grad_x", "{out}");
    assert_eq!(x["element"]["index"], serde_json::json!([3, 5]), "{out}");
    assert!(x["element"]["blame"]["slice"]["lines"].as_array().is_some_and(|l| !l.is_empty()), "{out}");
    // Outside the tensor, or not a gradient: bad input.
    let (code, _, err) = tilegrad(&[&args[..], &["--blame-element", "grad_x[1001,0]"]].concat());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("outside `grad_x`"), "{err}");
    let (code, _, err) = tilegrad(&[&args[..], &["--blame-element", "y[0,0]"]].concat());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not a gradient"), "{err}");
}

#[test]
fn cli_json_report() {
    let (code, out, err) = tilegrad(&["check", "--json", "examples/atomic_sum.toml"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v[0]["passed"], serde_json::Value::Bool(true), "{out}");
    assert_eq!(v[0]["gradients"][0]["tensor"], "grad_x", "{out}");

    let (code, out, err) = tilegrad(&["check", "--json", "examples/atomic_sum.toml", "--kernel", "bwd=::atomic_sum_bwd_broken_mean"]);
    assert_eq!(code, 1, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v[0]["passed"], serde_json::Value::Bool(false), "{out}");
    let site = &v[0]["gradients"][0]["worst"]["blame"]["sites"][0];
    assert_eq!(site["kind"], "store", "{out}");
    assert_eq!(site["kernel"], "atomic_sum_bwd_broken_mean", "{out}");
    assert!(site["loc"].as_str().unwrap().contains("atomic_sum_bwd.py:34:"), "{out}");
}

/// Reads `dir/name.npy`.
fn npy(dir: &Path, name: &str) -> tilegrad_reference::HostTensor {
    let p = dir.join(format!("{name}.npy"));
    assert!(p.is_file(), "{} was not written", p.display());
    tilegrad::npy::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn cli_grad_writes_the_ground_truth_as_npy() {
    let dir = temp_dir("grad");
    let (code, out, err) = tilegrad(&["grad", "examples/matmul.toml", "--out", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let (a, b, c, gc, ga, gb) = (
        npy(&dir, "input_a"),
        npy(&dir, "input_b"),
        npy(&dir, "output_c"),
        npy(&dir, "cotangent_c"),
        npy(&dir, "grad_a"),
        npy(&dir, "grad_b"),
    );
    let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    assert_eq!((a.shape(), b.shape(), c.shape(), gc.shape()), (&[m, k][..], &[k, n][..], &[m, n][..], &[m, n][..]));
    assert_eq!((ga.shape(), gb.shape()), (a.shape(), b.shape()));
    assert_eq!(ga.dtype().to_string(), "f64");
    // The gradients are those of c = a b: grad_a = grad_c b^T, grad_b = a^T grad_c.
    let (av, bv, cv, gcv, gav, gbv) = (a.to_f64_vec(), b.to_f64_vec(), c.to_f64_vec(), gc.to_f64_vec(), ga.to_f64_vec(), gb.to_f64_vec());
    let close = |x: f64, y: f64, scale: f64| (x - y).abs() <= 1e-9 * scale;
    for i in 0..m {
        for j in 0..k {
            let e: f64 = (0..n).map(|l| gcv[i * n + l] * bv[j * n + l]).sum();
            assert!(close(gav[i * k + j], e, 1.0 + e.abs()), "grad_a[{i}, {j}] = {} vs {e}", gav[i * k + j]);
        }
    }
    for j in 0..k {
        for l in 0..n {
            let e: f64 = (0..m).map(|i| av[i * k + j] * gcv[i * n + l]).sum();
            assert!(close(gbv[j * n + l], e, 1.0 + e.abs()), "grad_b[{j}, {l}] = {} vs {e}", gbv[j * n + l]);
        }
    }
    let c00: f64 = (0..k).map(|j| av[j] * bv[j * n]).sum();
    assert!((cv[0] - c00).abs() <= 1e-4 * (1.0 + c00.abs()), "c[0, 0] = {} vs {c00}", cv[0]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cli_run_writes_inputs_and_outputs_as_npy() {
    let dir = temp_dir("run");
    let (code, out, err) = tilegrad(&["run", "examples/l2_norm.toml", "--out", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let (x, o) = (npy(&dir, "input_x"), npy(&dir, "output_out"));
    assert_eq!(o.shape(), &[1]);
    assert_eq!(x.shape().len(), 1);
    let norm = x.to_f64_vec().iter().map(|v| v * v).sum::<f64>().sqrt();
    let got = o.to_f64_vec()[0];
    assert!((got - norm).abs() <= 1e-5 * norm, "out = {got}, |x| = {norm}");
    // `run` writes no gradients.
    assert!(!dir.join("grad_x.npy").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
