//! How high blame ranks the bug. For every broken variant of `examples/triton/` whose worst
//! element has a data-flow listing (a wrong or NaN value: the others are out-of-bounds accesses,
//! races and elements never written, which name their line in the failure itself), the check is
//! run and the rank of the variant's `# BUG:` line among the listed lines is recorded (1 = first).
//! The table is printed (`cargo test --test blame_rank -- --nocapture`); every bug line must be
//! among the first [`TARGET`] lines, but for the known misses of [`MISSES`].

use std::path::{Path, PathBuf};
use tilegrad::check::{check_backward, CheckOptions};
use tilegrad::spec::{self, KernelOverride};

mod cases;
use cases::{Case, Expect::*, CASES};

/// The first lines people read.
const TARGET: usize = 3;

/// Variants whose bug line blame does not yet list among the first [`TARGET`] lines, and why.
/// The test fails when one of them is fixed (take it out) as when another one misses.
const MISSES: &[(&str, &str)] = &[];

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

/// The file name of the kernel `name` of the Triton examples and its `# BUG:` line (1-based).
fn bug_line(name: &str) -> Option<(String, usize)> {
    for p in std::fs::read_dir(examples().join("triton")).ok()?.flatten().map(|e| e.path()) {
        let text = std::fs::read_to_string(&p).ok()?;
        let lines: Vec<&str> = text.lines().collect();
        let Some(def) = lines.iter().position(|l| l.starts_with(&format!("def {name}("))) else { continue };
        let end = def + lines[def..].iter().position(|l| l.starts_with('@')).unwrap_or(lines.len() - def);
        let bug = (def..end).find(|&i| lines[i].contains("# BUG:"))?;
        return Some((p.file_name()?.to_string_lossy().into_owned(), bug + 1));
    }
    None
}

/// One row of the table: the variant, the bug's `file:line`, its rank (`None`: not listed) and
/// how many lines were listed.
struct Row {
    variant: &'static str,
    bug: String,
    rank: Option<usize>,
    listed: usize,
}

/// Checks the variant of `case` and ranks its bug line in the worst element's listing.
fn rank(case: &Case) -> Result<Row, String> {
    let &(variant, spec_name, key, expect, _) = case;
    let input = match expect {
        Wrong { input, .. } | NanWritten { input, .. } | Downstream { input, .. } => input,
        _ => return Err(format!("{variant}: no listing for {expect:?}")),
    };
    let (file, bug) = bug_line(variant).ok_or_else(|| format!("{variant}: no `# BUG:` line"))?;
    let path = examples().join(format!("{spec_name}.toml"));
    let o = [KernelOverride { key: key.to_string(), reference: format!("::{variant}") }];
    let s = spec::load_with(&path, &o).map_err(|e| format!("{variant}: load: {e}"))?;
    let bwd = s.backward.as_ref().ok_or_else(|| format!("{variant}: no backward"))?;
    let opts = CheckOptions { trials: 1, ..CheckOptions::default() };
    let r = check_backward(&s.forward, bwd, &s.inputs, &opts).map_err(|e| format!("{variant}: check: {e}"))?;
    let g = r.gradients.iter().find(|g| g.name == input).ok_or_else(|| format!("{variant}: no gradient of `{input}`"))?;
    let slice = g.worst.as_ref().and_then(|w| w.blame.as_ref()).and_then(|b| b.slice.as_ref());
    let lines = slice.map_or(&[][..], |s| &s.lines[..]);
    let at = format!("{file}:{bug}:");
    let rank = lines.iter().position(|l| l.loc.contains(&at)).map(|p| p + 1);
    Ok(Row { variant, bug: format!("{file}:{bug}"), rank, listed: lines.len() + slice.map_or(0, |s| s.omitted) })
}

#[test]
fn every_bug_line_is_among_the_first_lines_listed() {
    let cases: Vec<&Case> = CASES.iter().filter(|c| matches!(c.3, Wrong { .. } | NanWritten { .. } | Downstream { .. })).collect();
    let rows: Vec<Result<Row, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = cases.iter().map(|c| s.spawn(|| rank(c))).collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("panicked".into()))).collect()
    });
    let mut misses = Vec::new();
    let (mut first, mut top) = (0, 0);
    println!("{:<52} {:<32} {:>5} {:>6}", "variant", "bug line", "rank", "listed");
    for row in &rows {
        match row {
            Ok(r) => {
                let shown = r.rank.map_or("-".to_string(), |k| k.to_string());
                println!("{:<52} {:<32} {:>5} {:>6}", r.variant, r.bug, shown, r.listed);
                first += (r.rank == Some(1)) as usize;
                top += r.rank.is_some_and(|k| k <= TARGET) as usize;
                let listed_miss = MISSES.iter().any(|(v, _)| *v == r.variant);
                if r.rank.is_none_or(|k| k > TARGET) != listed_miss {
                    misses.push(format!("{} (rank {shown}, listed as a miss: {listed_miss})", r.variant));
                }
            }
            Err(e) => misses.push(e.clone()),
        }
    }
    println!("bug line first: {first} of {}; among the first {TARGET}: {top} of {}", rows.len(), rows.len());
    assert!(
        misses.is_empty(),
        "{} of {} variants, against the first {TARGET} lines and MISSES:\n{}",
        misses.len(),
        rows.len(),
        misses.join("\n")
    );
}
