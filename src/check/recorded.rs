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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::report::BlameSite;
    use tilegrad_ir::triton::{convert, ConstValue, ConvertOptions};
    use tilegrad_ir::DType;
    use tilegrad_reference::{Launch, Memory};

    const SRC: &str = "
@triton.jit
def double(X, T, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask)
    t = x * 2.0
    tl.store(T + offs, t, mask=mask)

@triton.jit
def shift(T, Z, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(Z + offs, tl.load(T + offs, mask=mask) + 1.0, mask=mask)

@triton.jit
def guarded(T, Z, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    if pid == n:
        return
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(Z + offs, tl.load(T + offs, mask=offs < n), mask=offs < n)
";

    fn kernel(name: &str) -> Arc<Kernel> {
        let opts = ConvertOptions {
            constexprs: vec![("BLOCK".into(), ConstValue::Int(4))],
            pointer_dtypes: ["X", "T", "Z"].iter().map(|p| (p.to_string(), DType::F32)).collect(),
            ..ConvertOptions::default()
        };
        Arc::new(convert(SRC, "k.py", name, &opts).expect("the test kernel converts"))
    }

    /// Runs `name` on `(names, contents)` with writers recorded and pushes it; its step and
    /// the contents after.
    fn run(pass: &mut RecordedPass, name: &str, tensors: [(&str, HostTensor); 2]) -> (usize, Vec<HostTensor>) {
        let k = kernel(name);
        let mut mem = Memory::new();
        for (n, t) in &tensors {
            mem.add(n, t.clone());
        }
        let before = mem.clone();
        let options = Options { record_writers: true, ..Options::default() };
        let params: Vec<String> = k.params.iter().take(2).map(|p| p.name.clone()).collect();
        let args: Vec<(String, Arg)> = vec![
            (params[0].clone(), Arg::Tensor(TensorId(0))),
            (params[1].clone(), Arg::Tensor(TensorId(1))),
            ("n".into(), Arg::Scalar(tilegrad_ir::Lit::Int(10))),
        ];
        let mut l = Launch::new(&k, Grid([3, 1, 1])).options(options.clone());
        for (n, a) in &args {
            l = l.arg(n, *a);
        }
        let summary = l.run(&mut mem).expect("the test launch runs");
        let recorded = (0..2)
            .map(|i| RecordedTensor {
                name: tensors[i].0.to_string(),
                alloc: None,
                before: before.get(TensorId(i as u32)).clone(),
                after: mem.get(TensorId(i as u32)).clone(),
            })
            .collect();
        let step = pass.push(RecordedLaunch {
            kernel: k.clone(),
            grid: Grid([3, 1, 1]),
            args,
            options,
            tensors: recorded,
            writers: summary.writers,
        });
        (step, (0..2).map(|i| mem.get(TensorId(i)).clone()).collect())
    }

    fn store_line(b: &Blame) -> Option<(usize, String)> {
        b.sites.iter().find_map(|s| match s {
            BlameSite::Store { step, loc, .. } => Some((*step, loc.split(':').nth(1)?.to_string())),
            _ => None,
        })
    }

    #[test]
    fn the_slice_reaches_the_condition_of_an_early_return() {
        let t = HostTensor::from_f32(&[10], (0..10).map(|i| i as f32).collect());
        let mut pass = RecordedPass::new();
        let (s0, _) = run(&mut pass, "guarded", [("t", t), ("z", HostTensor::zeros(DType::F32, &[10]))]);
        let b = pass.blame(s0, "z", &[5], Vec::new(), Some((5.0, 6.0)));
        let slice = b.slice.as_ref().expect("a data-flow slice");
        assert!(slice.lines.iter().any(|l| l.loc.starts_with("k.py:19:") && l.role == "mask"), "{b}");
    }

    #[test]
    fn blame_follows_loads_into_earlier_launches_and_stops_at_the_step_given() {
        let x = HostTensor::from_f32(&[10], (0..10).map(|i| i as f32).collect());
        let z = HostTensor::zeros(DType::F32, &[10]);
        let mut pass = RecordedPass::new();
        let (s0, after) = run(&mut pass, "double", [("x", x), ("t", z.clone())]);
        let (s1, _) = run(&mut pass, "shift", [("t", after[1].clone()), ("z", z.clone())]);
        // A later launch writes `t` again: blame of `t` as of step 0 is still `double`'s.
        run(&mut pass, "shift", [("z", z.clone()), ("t", after[1].clone())]);
        assert_eq!((s0, s1, pass.len()), (0, 1, 3));

        let b = pass.blame(s1, "z", &[5], Vec::new(), Some((11.0, 12.0)));
        assert_eq!(store_line(&b), Some((1, "14".into())), "{b}");
        let slice = b.slice.as_ref().expect("a data-flow slice");
        assert!(slice.lines.iter().any(|l| l.step == 0 && l.loc.starts_with("k.py:7:")), "{b}");

        let b = pass.blame(s0, "t", &[5, 6], vec!["`w = t.sum()`".into()], None);
        assert_eq!(store_line(&b), Some((0, "8".into())), "{b}");
        assert_eq!(b.via, vec!["`w = t.sum()`".to_string()]);
        let b = pass.blame(2, "t", &[5], Vec::new(), None);
        assert_eq!(store_line(&b), Some((2, "14".into())), "{b}");
    }
}
