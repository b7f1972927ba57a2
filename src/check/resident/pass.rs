//! A pass (the forward, its f64 ground truth, the backward, its f64 replay) run on tensors in
//! device memory: allocations and launches in place, with the notes the host's pass makes and,
//! for the ground truth's reverse sweep, each launch with a device copy of what it overwrote.

use super::env::{dev, Aside, DeviceEnv};
use crate::check::backend::Executor;
use crate::check::notes;
use crate::check::report::Finding;
use crate::check::steps::{has_unfilled_loads, resolve, Mode, Step};
use std::collections::BTreeMap;
use std::sync::Arc;
use tilegrad_gpu::{Backup, Gpu};
use tilegrad_ir::{DType, Inst, Kernel};
use tilegrad_reference::{Arg, Grid, Launch, Options, RaceMode, TensorId};

/// A launch of a pass as it ran, for the reverse sweep.
pub(crate) struct Ran {
    /// Its step.
    pub step: usize,
    /// The kernel as launched (promoted in an f64 pass).
    pub kernel: Arc<Kernel>,
    pub grid: Grid,
    /// Arguments by parameter name; tensors by their ids in the pass's environment.
    pub args: Vec<(String, Arg)>,
    /// Its tensors' names.
    pub names: Vec<(TensorId, String)>,
    /// Each loop's largest trip count (sizes the VJP kernel's tapes).
    pub max_trips: BTreeMap<Inst, u64>,
    /// Programs stored the same value to one element (the evaluator's case).
    pub same_value: bool,
    /// What it may write, as it was before it ran.
    pub before: Backup,
}

impl Ran {
    /// The launch again (without options).
    pub(crate) fn launch(&self) -> Launch<'_> {
        self.args.iter().fold(Launch::new(&self.kernel, self.grid), |l, (n, a)| l.arg(n, *a))
    }
}

/// Notes of a pass: which pass it is, and where they go.
pub(crate) type Noted<'a> = Option<(&'static str, &'a mut Vec<Finding>)>;

/// Runs `steps` on `env` in `mode` (native or every float in f64); with `keep`, returns each
/// launch as it ran. Any step but an allocation or a launch, and any failure, steps aside.
pub(crate) fn run(
    env: &mut DeviceEnv,
    steps: &[Step],
    mode: Mode,
    keep: bool,
    mut noted: Noted,
    exec: &Executor,
) -> Result<Vec<Ran>, Aside> {
    let gpu = exec.gpu().ok_or("no GPU")?;
    let mut out = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        match step {
            Step::Alloc { name, shape, dtype, init } => env.alloc(gpu, name, shape, mode.dtype(*dtype), *init)?,
            Step::Launch(kl) => {
                let kernel = match mode.float() {
                    None => kl.kernel.clone(),
                    Some(f) => Arc::new(tilegrad_ir::passes::promote_floats(&kl.kernel, f).map_err(|e| e.to_string())?),
                };
                let (grid, args) = resolve(kl, &kernel, env)?;
                exec.check_grid(&kernel.name, grid)?;
                let ran = launch(gpu, env, (&kernel, grid, &args), keep, noted.as_mut().map(|(p, l)| (*p, &mut **l)), exec, i, step)?;
                if let Some((max_trips, same_value, before)) = ran {
                    let mut names: Vec<(TensorId, String)> = Vec::new();
                    for (_, a) in &args {
                        if let Arg::Tensor(t) = a {
                            if names.iter().all(|(u, _)| u != t) {
                                names.push((*t, env.name_of(*t).to_string()));
                            }
                        }
                    }
                    out.push(Ran { step: i, kernel, grid, args, names, max_trips, same_value, before });
                }
            }
            Step::Sum { src, axis, dst } if env.get(src).is_some_and(|t| matches!(t.dtype, DType::F32 | DType::F64)) => {
                env.sum(gpu, src, *axis, dst)?
            }
            Step::Chunk { src, chunks, axis, dsts } => env.chunk(gpu, src, *chunks, *axis, dsts)?,
            Step::Cat { srcs, axis, dst } if one_dtype(env, srcs) => env.cat(gpu, srcs, *axis, dst)?,
            _ => env.on_host(gpu, step, mode, exec).map_err(|e| format!("step {i} ({}): {e}", step.describe()))?,
        }
    }
    Ok(out)
}

/// Whether the tensors named are all of one dtype (a concatenation that promotes none).
fn one_dtype(env: &DeviceEnv, names: &[String]) -> bool {
    let dtypes: Vec<_> = names.iter().map(|n| env.get(n).map(|t| t.dtype)).collect();
    dtypes.windows(2).all(|w| w[0] == w[1]) && dtypes.iter().all(Option::is_some)
}

/// What a kept launch tells the reverse sweep: its loops' trip counts, whether programs stored
/// the same value to one element, and what it overwrote.
type Kept = (BTreeMap<Inst, u64>, bool, Backup);

/// Runs one launch in place, with its notes where asked; with `keep`, what the sweep needs.
#[allow(clippy::too_many_arguments)]
fn launch(
    gpu: &Gpu,
    env: &DeviceEnv,
    (kernel, grid, args): (&Kernel, Grid, &[(String, Arg)]),
    keep: bool,
    noted: Noted,
    exec: &Executor,
    i: usize,
    step: &Step,
) -> Result<Option<Kept>, Aside> {
    let opts = Options { races: RaceMode::Error, ..Options::default() };
    let l = args.iter().fold(Launch::new(kernel, grid).options(opts), |l, (n, a)| l.arg(n, *a));
    let mem = env.memory()?;
    let lanes = noted.is_some() && has_unfilled_loads(kernel);
    let before = if keep || lanes { Some(gpu.back_up(&l, &mem).map_err(dev)?) } else { None };
    let summary = exec.run_in_place(&l, &mem).map_err(dev)?;
    if let Some((pass, list)) = noted {
        let b = before.as_ref().filter(|_| lanes);
        let shape_of = |t: TensorId| env.shape_of(env.name_of(t)).map(<[usize]>::to_vec);
        list.extend(notes::of_launch_in_place(&l, (&mem, b), &summary, exec, (pass, i, &step.describe()), &shape_of)?);
    }
    Ok(match before {
        Some(b) if keep => Some((summary.max_trips, summary.same_value_races > 0, b)),
        _ => None,
    })
}

/// Whether a check of `steps` keeps its tensors on the device: every step but an in-place
/// accumulation (whose operand's earlier contents the reverse sweep would need). Allocations,
/// launches, sums over an axis, chunks and concatenations run there; other host steps are
/// computed on the host from copies of what they read ([`DeviceEnv::on_host`]). The reverse
/// sweep ([`super::sweep`]) has the transposes of each.
pub(crate) fn on_device(steps: &[Step]) -> bool {
    !steps.iter().any(|s| matches!(s, Step::Accumulate { .. }))
}
