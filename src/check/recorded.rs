//! Blame for a pass that a host program ran launch by launch.
//!
//! The CLI runs a spec's steps itself and traces them ([`super::steps`]). The Python package runs
//! the user's own host code, which launches kernels one at a time; to explain a wrong element it
//! records each launch here ([`RecordedPass::push`]): the kernel, grid and arguments, the
//! contents of its tensors before and after it ran, and who wrote every element. The blame and
//! the data-flow slice of an element are then the CLI's own ([`super::blame`], [`super::slice`]),
//! following loads into the earlier launches that wrote what was read.
//!
//! Tensors are named by the host program: one name per storage of the pass, kept for as long as
//! the storage lives, so that launches reading what an earlier one wrote meet it again.

use super::blame::blame_elements;
use super::report::Blame;
use super::steps::{Env, Init, Origin, Snapshot, Trace, TracedLaunch};
use std::sync::Arc;
use tilegrad_ir::Kernel;
use tilegrad_reference::{Arg, Grid, HostTensor, Options, TensorId, Writers};

/// One tensor of a recorded launch: its name in the pass, how the pass came by it, and its
/// contents before and after the launch ran.
#[derive(Clone, Debug)]
pub struct RecordedTensor {
    /// The pass's name of the storage.
    pub name: String,
    /// `None` for a tensor the pass was given (or made on the host); `Some(init)` for one it
    /// allocated without writing it on the host.
    pub alloc: Option<Init>,
    /// Contents before the launch.
    pub before: HostTensor,
    /// Contents after the launch.
    pub after: HostTensor,
}

/// One launch as a host program ran it.
#[derive(Clone, Debug)]
pub struct RecordedLaunch {
    /// The kernel as launched.
    pub kernel: Arc<Kernel>,
    /// The grid.
    pub grid: Grid,
    /// Arguments by parameter name; tensors are indices into `tensors`.
    pub args: Vec<(String, Arg)>,
    /// The options it ran with.
    pub options: Options,
    /// Its tensors, in the order of the arguments' [`TensorId`]s.
    pub tensors: Vec<RecordedTensor>,
    /// Who wrote each element of the tensors it wrote (tensor ids as in `tensors`).
    pub writers: Vec<Writers>,
}

/// The launches of a pass, recorded in order, for blame.
#[derive(Clone, Debug, Default)]
pub struct RecordedPass {
    trace: Trace,
    env: Env,
}

impl RecordedPass {
    /// An empty pass.
    pub fn new() -> RecordedPass {
        RecordedPass::default()
    }

    /// Launches recorded so far.
    pub fn len(&self) -> usize {
        self.trace.launches.len()
    }

    /// No launch recorded yet.
    pub fn is_empty(&self) -> bool {
        self.trace.launches.is_empty()
    }

    /// Records the next launch; returns its step.
    pub fn push(&mut self, launch: RecordedLaunch) -> usize {
        let step = self.trace.launches.len();
        let ids: Vec<TensorId> = launch.tensors.iter().map(|t| self.tensor(t)).collect();
        let args = launch
            .args
            .into_iter()
            .map(|(n, a)| match a {
                Arg::Tensor(t) => (n, Arg::Tensor(ids.get(t.0 as usize).copied().unwrap_or(t))),
                s => (n, s),
            })
            .collect();
        let before = ids.iter().zip(&launch.tensors).map(|(&id, t)| (id, Snapshot::Tensor(t.before.clone()))).collect();
        for w in launch.writers {
            let Some(t) = launch.tensors.get(w.tensor.0 as usize) else { continue };
            if let Some(entry) = self.trace.tensors.iter_mut().find(|(n, ..)| *n == t.name) {
                entry.2.push((step, launch.kernel.clone(), launch.grid, w));
            }
        }
        self.trace.launches.push(TracedLaunch { step, kernel: launch.kernel, grid: launch.grid, args, options: launch.options, before });
        step
    }

    /// The pass's id of tensor `t`, registered on first use; its contents become `t.after`.
    fn tensor(&mut self, t: &RecordedTensor) -> TensorId {
        match self.env.id(&t.name) {
            Some(id) => {
                *self.env.mem.get_mut(id) = t.after.clone();
                id
            }
            None => {
                let id = self.env.mem.add(&t.name, t.after.clone());
                self.env.names.push((t.name.clone(), id));
                let origin = match t.alloc {
                    Some(init) => Origin::Alloc { step: self.trace.launches.len(), init },
                    None => Origin::Given,
                };
                self.trace.tensors.push((t.name.clone(), origin, Vec::new()));
                id
            }
        }
    }

    /// Blames `elements` (flat) of tensor `tensor` as they were after step `upto`: the stores
    /// that wrote them and the data flow of the first (ranked with `values`, the compared
    /// element's expected and checked values, when no host step lies in between). `via`: the
    /// host steps, outermost first, from the compared tensor to these elements.
    pub fn blame(&self, upto: usize, tensor: &str, elements: &[usize], via: Vec<String>, values: Option<(f64, f64)>) -> Blame {
        let mut trace = self.trace.clone();
        trace.launches.retain(|l| l.step <= upto);
        for (_, _, layers) in &mut trace.tensors {
            layers.retain(|(s, ..)| *s <= upto);
        }
        blame_elements(&trace, &self.env, &[], tensor, elements, via, values)
    }
}
