//! Findings: every reason a check failed, as fields (kind, tensor, element, programs, source
//! locations) for machines, built from the compared tensors and from the error that stopped the
//! backward.

use super::report::{BlameSite, Failure, Finding, FindingKind, Location, TensorReport};
use tilegrad_reference::{ExecError, Site};

/// A location from a site of the reference interpreter.
fn site_location(s: &Site) -> Location {
    Location { file: s.loc.file.to_string(), line: s.loc.line, col: s.loc.col, kernel: s.kernel.clone(), op: s.op.to_string() }
}

/// A location from a blame site's `file:line:col` (unknown locations give none).
fn parse_location(loc: &str, kernel: &str, op: &str) -> Option<Location> {
    let mut it = loc.rsplitn(3, ':');
    let col = it.next()?.parse().ok()?;
    let line = it.next()?.parse().ok()?;
    let file = it.next()?.to_string();
    Some(Location { file, line, col, kernel: kernel.to_string(), op: op.to_string() })
}

/// The finding of a compared tensor that failed (`None` when it passed).
pub(crate) fn of_tensor(pass: &'static str, r: &TensorReport) -> Option<Finding> {
    if r.passed {
        return None;
    }
    let mut f = Finding {
        name: Some(r.name.clone()),
        tensor: Some(r.tensor.clone()),
        count: Some(r.over_tolerance),
        trial: Some(r.trial),
        ..Finding::new(FindingKind::WrongValue, pass)
    };
    let Some(w) = &r.worst else {
        f.message = format!("`{}` is wrong", r.tensor);
        return Some(f);
    };
    f.element = Some(w.index.iter().map(|&i| i as i64).collect());
    (f.expected, f.got) = (Some(w.expected), Some(w.got));
    if !w.got.is_finite() && w.expected.is_finite() {
        f.kind = FindingKind::NonFinite;
    }
    for s in w.blame.iter().flat_map(|b| &b.sites) {
        match s {
            BlameSite::Store { step, kernel, op, loc, programs, .. } => {
                f.step = f.step.or(Some(*step));
                f.programs.extend(programs.iter().copied());
                f.locations.extend(parse_location(loc, kernel, op));
            }
            BlameSite::ManyPrograms { step, kernel, loc } => {
                f.step = f.step.or(Some(*step));
                f.locations.extend(parse_location(loc, kernel, "atomic_add"));
            }
            BlameSite::NeverWritten { tensor, index, init, .. } => {
                f.kind = FindingKind::NeverWritten;
                if init == "NaN" {
                    f.origin = Some(format!("`{tensor}`{index:?} was never written: its memory was allocated empty (NaN)"));
                }
            }
            BlameSite::Given { .. } => {}
        }
    }
    if let Some(n) = w.blame.as_ref().and_then(|b| b.slice.as_ref()).and_then(|s| s.nonfinite.clone()) {
        f.origin = Some(n);
    }
    let over = match (&r.formula, &r.rounding, &r.calibration) {
        (Some(fo), ..) if !fo.passed => format!("the formula is wrong: the exact replay is off by {:.3e} of the scale", fo.error),
        (_, Some(ro), _) if !ro.passed => {
            if f.kind == FindingKind::WrongValue {
                f.kind = FindingKind::Precision;
            }
            format!("the formula is right; the {} rounding is {:.1} u (budget {} u)", ro.of, ro.units, ro.budget)
        }
        (.., Some(c)) if r.over_tolerance == 0 => format!("normwise error {:.3e} over its calibrated limit {:.3e}", c.error, c.limit),
        _ => format!("{} element{} over tolerance", r.over_tolerance, if r.over_tolerance == 1 { "" } else { "s" }),
    };
    f.message = format!("`{}`: {over}; worst {:?}: expected {:e}, got {:e}", r.tensor, w.index, w.expected, w.got);
    Some(f)
}

/// The finding of an error that stopped step `step` of the backward in trial `trial`, or of the
/// forward (`pass`: a defect of the user's forward kernels, a finding of its own kind).
pub(crate) fn of_error(e: &ExecError, pass: &'static str, step: usize, trial: usize) -> Finding {
    let mut f = Finding { trial: Some(trial), step: Some(step), message: e.to_string(), ..Finding::new(FindingKind::RuntimeError, pass) };
    let mut at = |s: &Site| {
        if !f.programs.contains(&s.pid) {
            f.programs.push(s.pid);
        }
        let l = site_location(s);
        if !f.locations.contains(&l) {
            f.locations.push(l);
        }
    };
    match e {
        ExecError::Race(r) => {
            at(&r.first);
            at(&r.second);
            f.kind = FindingKind::Race;
            f.tensor = Some(r.tensor.clone());
            f.element = Some(r.index.iter().map(|&i| i as i64).collect());
        }
        ExecError::OutOfBounds { site, tensor, offset, .. } => {
            at(site);
            f.kind = FindingKind::OutOfBounds;
            f.tensor = Some(tensor.clone());
            f.element = Some(vec![*offset]);
        }
        ExecError::LoopBound { site, .. } => {
            at(site);
            f.kind = FindingKind::LoopBound;
        }
        ExecError::Runtime { site, .. } => at(site),
        ExecError::Invalid(_) | ExecError::BadTensor { .. } | ExecError::Argument { .. } | ExecError::Grid { .. } => {}
    }
    if pass == "forward" {
        f.kind = match f.kind {
            FindingKind::Race => FindingKind::ForwardRace,
            FindingKind::OutOfBounds => FindingKind::ForwardOutOfBounds,
            FindingKind::LoopBound => FindingKind::ForwardLoopBound,
            _ => FindingKind::ForwardRuntimeError,
        };
    }
    f
}

/// The finding of a gradient tensor whose shape is not its input's.
pub(crate) fn shape_mismatch(input: &str, tensor: &str, message: String, step: usize, trial: usize) -> Finding {
    Finding {
        name: Some(input.to_string()),
        tensor: Some(tensor.to_string()),
        trial: Some(trial),
        step: Some(step),
        message,
        ..Finding::new(FindingKind::ShapeMismatch, "backward")
    }
}

/// The finding of a failure known only by its message (a front end that ran the backward
/// itself): the kind from the message, as the reference interpreter words its errors.
pub(crate) fn of_failure(f: &Failure) -> Finding {
    let m = &f.message;
    let kind = if m.starts_with("race:") || m.contains(": race:") {
        FindingKind::Race
    } else if m.contains("out-of-bounds access") {
        FindingKind::OutOfBounds
    } else if m.contains("more than its max_iters") {
        FindingKind::LoopBound
    } else if f.what == "gradients" {
        FindingKind::ShapeMismatch
    } else {
        FindingKind::RuntimeError
    };
    Finding { trial: Some(f.trial), step: Some(f.step), message: m.clone(), ..Finding::new(kind, "backward") }
}
