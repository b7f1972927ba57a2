//! Notes: what a launch relies on that runs the same on a GPU today but that Triton does not
//! promise, reported without failing the check (`strict` makes them failures).
//!
//! - **Masked-off lanes read as 0.** Triton documents the masked-off lanes of a load without
//!   `other` as undefined; its NVIDIA and AMD backends zero them, and libraries rely on it. A
//!   launch with such loads runs a second time with those lanes poisoned (NaN); where its results
//!   change, the loads they depend on (found by poisoning one at a time) are named.
//! - **Conflicts whose outcome does not depend on the order of programs**: two programs storing
//!   the same bits to one element, a load of an element every store left unchanged
//!   ([`tilegrad_reference::LaunchSummary::same_value`]).

use super::backend::Executor;
use super::report::{unravel, Finding, FindingKind, Location};
use tilegrad_gpu::{Backup, DeviceMemory};
use tilegrad_ir::{Inst, Kernel};
use tilegrad_reference::{Arg, Grid, Launch, LaunchSummary, Memory, Options, Race, Site, TensorId, POISON_ALL};

/// The notes of one launch that ran from `before` to `after` with `summary` (for front ends
/// that run launches themselves, as the Python package does): masked-off lanes its results
/// depend on, and conflicts whose outcome does not depend on the order of programs. `before`
/// and `after` are read only where the kernel has loads without `other`
/// ([`tilegrad_ir::analysis::unfilled_loads`]): a caller may pass empty memories otherwise.
#[allow(clippy::too_many_arguments)]
pub fn of_launch(
    launch: &Launch,
    before: &Memory,
    after: &Memory,
    summary: &LaunchSummary,
    exec: &Executor,
    pass: &'static str,
    step: usize,
    what: &str,
) -> Vec<Finding> {
    let at = At { pass, step, what };
    let args: Vec<(String, Arg)> = launch.args().to_vec();
    let mut out: Vec<Finding> =
        masked_lanes(launch.kernel(), launch.grid(), &args, launch.get_options(), before, after, exec, at).into_iter().collect();
    out.extend(same_value(summary, at, &|_, _| None));
    out
}

/// Where a launch ran: the pass, its step and the step's description.
#[derive(Clone, Copy)]
pub(crate) struct At<'a> {
    pub pass: &'static str,
    pub step: usize,
    pub what: &'a str,
}

/// Loads poisoned one at a time to name those a launch depends on; past this many, all are named.
const ATTRIBUTED: usize = 8;

/// The note of a launch whose results depend on the masked-off lanes of its loads without
/// `other`: `before` is the memory before it ran, `after` after (lanes read as 0). `None` when
/// the kernel has no such load or nothing changes with them poisoned.
#[allow(clippy::too_many_arguments)]
pub(crate) fn masked_lanes(
    kernel: &Kernel,
    grid: Grid,
    args: &[(String, Arg)],
    opts: &Options,
    before: &Memory,
    after: &Memory,
    exec: &Executor,
    at: At,
) -> Option<Finding> {
    let loads = tilegrad_ir::analysis::unfilled_loads(kernel);
    if loads.is_empty() {
        return None;
    }
    let written = super::steps::written_tensors(kernel, args);
    let mut differs = |mask: u64| -> Option<Difference> {
        let mut mem = before.clone();
        match exec.run(&poisoned(kernel, grid, args, opts, mask), &mut mem) {
            Err(e) => Some(Difference::Failed(e.to_string())),
            Ok(_) => first_difference(&written, after, &mem),
        }
    };
    masked_lanes_by(kernel, loads, &|t| (after.name(t).to_string(), after.get(t).shape().to_vec()), at, &mut differs)
}

/// The launch of `kernel` over `args` with the masked-off lanes of the loads in `mask` poisoned.
fn poisoned<'k>(kernel: &'k Kernel, grid: Grid, args: &[(String, Arg)], opts: &Options, mask: u64) -> Launch<'k> {
    let o = Options { poison_masked_loads: mask, record_writers: false, ..opts.clone() };
    let mut launch = Launch::new(kernel, grid).options(o);
    for (n, a) in args {
        launch = launch.arg(n, *a);
    }
    launch
}

/// The note of a launch whose results depend on the masked-off lanes of its `loads` (the
/// kernel's loads without `other`): `differs(mask)` runs it again with the loads of `mask`
/// poisoned and says how its results changed (`named` gives a tensor's name and shape). All loads are poisoned
/// first, then (up to [`ATTRIBUTED`]) one at a time to name those the results depend on.
fn masked_lanes_by(
    kernel: &Kernel,
    loads: Vec<Inst>,
    named: &dyn Fn(TensorId) -> (String, Vec<usize>),
    at: At,
    differs: &mut dyn FnMut(u64) -> Option<Difference>,
) -> Option<Finding> {
    let diff = differs(POISON_ALL)?;
    let relied: Vec<Inst> = if loads.len() == 1 {
        loads
    } else if loads.len() <= ATTRIBUTED {
        let one: Vec<Inst> = loads.iter().enumerate().filter(|(i, _)| differs(1 << i).is_some()).map(|(_, &l)| l).collect();
        if one.is_empty() {
            loads
        } else {
            one
        }
    } else {
        loads
    };
    Some(masked_note(kernel, &relied, &diff, named, at))
}

/// The notes of a launch that ran in place on device memory `mem` (the GPU backend over CUDA
/// tensors), as [`of_launch`] gives them: `before` holds what the launch writes as it was before
/// it ran ([`tilegrad_gpu::Gpu::back_up`], taken where the kernel has loads without `other`;
/// `None` otherwise). The poisoned runs go on the device from those contents and are compared
/// with the launch's results there (only a differing element comes to the host: copying a
/// 1 GB tensor for each poisoned run made these notes 1.5 s of a cross entropy's check), and the
/// launch's own results are put back. `at` is the
/// pass, the step and what it is; `shape_of` gives a tensor's shape where known (an element is
/// named by its flat index otherwise).
pub fn of_launch_in_place(
    launch: &Launch,
    (mem, before): (&DeviceMemory, Option<&Backup>),
    summary: &LaunchSummary,
    exec: &Executor,
    (pass, step, what): (&'static str, usize, &str),
    shape_of: &dyn Fn(TensorId) -> Option<Vec<usize>>,
) -> Result<Vec<Finding>, String> {
    let at = At { pass, step, what };
    let mut out = Vec::new();
    let loads = tilegrad_ir::analysis::unfilled_loads(launch.kernel());
    if let (Some(before), Some(gpu), false) = (before, exec.gpu(), loads.is_empty()) {
        let err = |e: tilegrad_gpu::GpuError| e.to_string();
        // The results stay on the device: each poisoned run is compared with them there, and
        // only the first differing element comes to the host.
        let written = super::steps::written_tensors(launch.kernel(), launch.args());
        let results = gpu.back_up(launch, mem).map_err(err)?;
        let mut differs = |mask: u64| -> Option<Difference> {
            let l = poisoned(launch.kernel(), launch.grid(), launch.args(), launch.get_options(), mask);
            let ran = gpu.restore(before, mem).map_err(err).and_then(|()| exec.run_in_place(&l, mem).map_err(err));
            match ran.and_then(|_| first_change(gpu, &results, mem, &written)) {
                Err(e) => Some(Difference::Failed(e)),
                Ok(d) => d,
            }
        };
        let named = |t: TensorId| {
            let d = mem.get(t);
            (d.name.clone(), shape_of(t).unwrap_or_else(|| vec![d.numel]))
        };
        out.extend(masked_lanes_by(launch.kernel(), loads, &named, at, &mut differs));
        gpu.restore(&results, mem).map_err(err)?;
    }
    // The device's tensors are flat: the element by its tensor's shape.
    let index_of = |name: &str, offset: i64| -> Option<Vec<usize>> {
        let i = mem.tensors().iter().position(|t| t.name == name)?;
        Some(super::report::unravel(usize::try_from(offset).ok()?, &shape_of(TensorId(i as u32))?))
    };
    out.extend(same_value(summary, at, &index_of));
    Ok(out)
}

/// The first element of `written` (in order) whose bits in `mem` differ from `results` (a
/// backup of them), compared on the device.
fn first_change(gpu: &tilegrad_gpu::Gpu, results: &Backup, mem: &DeviceMemory, written: &[TensorId]) -> Result<Option<Difference>, String> {
    for &t in written {
        if let Some((i, zero, poisoned)) = gpu.first_difference(results, mem, t).map_err(|e| e.to_string())? {
            return Ok(Some(Difference::Element(t, i, zero, poisoned)));
        }
    }
    Ok(None)
}

/// How a launch's results changed with masked-off lanes poisoned.
enum Difference {
    /// An element: tensor, flat index, its value with the lanes read as 0, and poisoned.
    Element(TensorId, usize, f64, f64),
    /// The poisoned run failed (a NaN became an index, a loop bound, ...).
    Failed(String),
}

/// The first element of `tensors` whose bits differ between `a` and `b`.
fn first_difference(tensors: &[TensorId], a: &Memory, b: &Memory) -> Option<Difference> {
    for &t in tensors {
        let (x, y) = (a.get(t), b.get(t));
        if x.data() == y.data() {
            continue;
        }
        let (xv, yv) = (x.to_f64_vec(), y.to_f64_vec());
        if let Some(i) = (0..xv.len()).find(|&i| xv[i].to_bits() != yv[i].to_bits()) {
            return Some(Difference::Element(t, i, xv[i], yv[i]));
        }
    }
    None
}

fn masked_note(kernel: &Kernel, loads: &[Inst], diff: &Difference, named: &dyn Fn(TensorId) -> (String, Vec<usize>), at: At) -> Finding {
    let locations: Vec<Location> = loads.iter().map(|&l| location(kernel, l, "load")).collect();
    let lines = match locations.first() {
        Some(first) if locations.iter().all(|l| l.file == first.file) => {
            let at: Vec<String> = locations.iter().map(|l| format!("{}:{}", l.line, l.col)).collect();
            format!("{} at {}", first.file, at.join(", "))
        }
        _ => locations.iter().map(|l| format!("{}:{}:{}", l.file, l.line, l.col)).collect::<Vec<_>>().join(", "),
    };
    let mut f = note(FindingKind::MaskedLanes, at);
    let effect = match diff {
        Difference::Element(t, i, zero, poisoned) => {
            let (tensor, shape) = named(*t);
            let index = unravel(*i, &shape);
            f.element = Some(index.iter().map(|&x| x as i64).collect());
            (f.expected, f.got) = (Some(*zero), Some(*poisoned));
            let r = format!("with them undefined (NaN here), `{tensor}`{index:?} is {poisoned:e}, not {zero:e}");
            f.tensor = Some(tensor);
            r
        }
        Difference::Failed(e) => format!("with them undefined (NaN here) the launch fails: {e}"),
    };
    f.message = format!(
        "{} step {} ({}): reads masked-off lanes of loads without `other` as 0\n\
         as Triton's NVIDIA and AMD backends do; Triton documents them as undefined (`other=` says what they hold)\n\
         {} of kernel `{}`: {}\n{effect}",
        at.pass,
        at.step,
        at.what,
        if loads.len() == 1 { "load" } else { "loads" },
        kernel.name,
        lines,
    );
    f.locations = locations;
    f
}

fn location(k: &Kernel, i: Inst, op: &str) -> Location {
    let loc = &k.inst(i).loc;
    Location { file: loc.file.to_string(), line: loc.line, col: loc.col, kernel: k.name.clone(), op: op.to_string() }
}

fn site_location(s: &Site) -> Location {
    Location { file: s.loc.file.to_string(), line: s.loc.line, col: s.loc.col, kernel: s.kernel.clone(), op: s.op.to_string() }
}

/// The note of a launch's conflicts whose outcome does not depend on the order of programs.
/// `index_of` (tensor, flat offset) gives the element's multi-index where the launch's run knew
/// only flat tensors (a run on device memory), `None` to take the run's.
pub(crate) fn same_value(summary: &LaunchSummary, at: At, index_of: &dyn Fn(&str, i64) -> Option<Vec<usize>>) -> Option<Finding> {
    let r: &Race = summary.same_value.first()?;
    let mut f = note(FindingKind::SameValueRace, at);
    let index = index_of(&r.tensor, r.offset).unwrap_or_else(|| r.index.clone());
    let element = format!("{index:?}");
    f.element = Some(index.iter().map(|&x| x as i64).collect());
    f.tensor = Some(r.tensor.clone());
    f.count = Some(summary.same_value_races as usize);
    for s in [&r.first, &r.second] {
        f.programs.push(s.pid);
        let l = site_location(s);
        if !f.locations.contains(&l) {
            f.locations.push(l);
        }
    }
    let what = match r.kind {
        tilegrad_reference::RaceKind::ReadWrite => "loads what another program stores, the value it already held",
        _ => "store the same value to",
    };
    let n = summary.same_value_races;
    f.message = format!(
        "{} step {} ({}): programs {:?} and {:?} {what} `{}`{element}\n\
         the same whatever their order, so not a race ({n} such access{} in the launch)\nfirst:  {}\nsecond: {}",
        at.pass,
        at.step,
        at.what,
        r.first.pid,
        r.second.pid,
        r.tensor,
        if n == 1 { "" } else { "es" },
        r.first,
        r.second
    );
    Some(f)
}

fn note(kind: FindingKind, at: At) -> Finding {
    Finding { step: Some(at.step), ..Finding::new(kind, at.pass) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tilegrad_ir::Loc;
    use tilegrad_reference::{Race, RaceKind, Site};

    /// A same-value note names its element by the tensor's shape where the run knew only a flat
    /// tensor (device memory), and as the run named it otherwise.
    #[test]
    fn a_same_value_note_names_the_element_by_its_tensors_shape() {
        let site = |p: u32| Site { kernel: "k".into(), op: "store", loc: Loc::new("k.py", 7, 5), pid: [p, 0, 0] };
        let race =
            Race { kind: RaceKind::WriteWrite, tensor: "grad_x".into(), offset: 4000, index: vec![4000], first: site(0), second: site(1) };
        let summary = LaunchSummary { same_value: vec![race], same_value_races: 3, ..LaunchSummary::default() };
        let at = At { pass: "backward", step: 1, what: "launch" };
        let shaped = |name: &str, offset: i64| (name == "grad_x").then(|| crate::check::report::unravel(offset as usize, &[10, 1000]));
        let f = same_value(&summary, at, &shaped).expect("a note");
        assert_eq!(f.element, Some(vec![4, 0]));
        assert!(f.message.contains("`grad_x`[4, 0]"), "{}", f.message);
        let f = same_value(&summary, at, &|_, _| None).expect("a note");
        assert_eq!(f.element, Some(vec![4000]));
    }
}
