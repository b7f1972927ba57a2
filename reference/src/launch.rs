//! Launches: a kernel, a grid and arguments bound by parameter name, run against a [`Memory`] of
//! named host tensors.

use crate::error::ExecError;
use crate::tensor::HostTensor;
use std::collections::BTreeMap;
use tilegrad_ir::{DType, Inst, Kernel, Lit, ParamKind};

/// Identifies a tensor in a [`Memory`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub u32);

/// The tensors a launch may read and write, each with a name used in diagnostics.
#[derive(Clone, Debug, Default)]
pub struct Memory {
    tensors: Vec<(String, HostTensor)>,
}

impl Memory {
    /// An empty memory.
    pub fn new() -> Memory {
        Memory::default()
    }

    /// Adds a tensor.
    pub fn add(&mut self, name: &str, t: HostTensor) -> TensorId {
        self.tensors.push((name.to_string(), t));
        TensorId(self.tensors.len() as u32 - 1)
    }

    /// A tensor. Panics on an id from another memory.
    pub fn get(&self, id: TensorId) -> &HostTensor {
        &self.tensors[id.0 as usize].1
    }

    /// A tensor, mutably.
    pub fn get_mut(&mut self, id: TensorId) -> &mut HostTensor {
        &mut self.tensors[id.0 as usize].1
    }

    /// A tensor's name.
    pub fn name(&self, id: TensorId) -> &str {
        &self.tensors[id.0 as usize].0
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// True when there are no tensors.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// A tensor by id, if the id is valid.
    pub(crate) fn try_get(&self, id: TensorId) -> Option<&HostTensor> {
        self.tensors.get(id.0 as usize).map(|t| &t.1)
    }

    /// Replaces a tensor, returning the old one.
    pub(crate) fn set(&mut self, id: TensorId, t: HostTensor) -> HostTensor {
        std::mem::replace(&mut self.tensors[id.0 as usize].1, t)
    }
}

impl std::ops::Index<TensorId> for Memory {
    type Output = HostTensor;
    fn index(&self, id: TensorId) -> &HostTensor {
        self.get(id)
    }
}

/// A launch argument.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    /// A tensor, for a pointer parameter.
    Tensor(TensorId),
    /// A scalar, for a scalar or constexpr parameter.
    Scalar(Lit),
}

impl From<TensorId> for Arg {
    fn from(t: TensorId) -> Arg {
        Arg::Tensor(t)
    }
}
macro_rules! arg_from_lit {
    ($($t:ty),*) => { $(impl From<$t> for Arg { fn from(x: $t) -> Arg { Arg::Scalar(Lit::from(x)) } })* };
}
arg_from_lit!(bool, i32, i64, f32, f64);
impl From<usize> for Arg {
    fn from(x: usize) -> Arg {
        Arg::Scalar(Lit::Int(x as i64))
    }
}

/// A launch grid (g0, g1, g2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid(pub [u32; 3]);

impl Grid {
    /// Number of program instances.
    pub fn programs(&self) -> u64 {
        self.0.iter().map(|&g| g as u64).product()
    }

    /// The program id of linear index `i` (axis 0 fastest, as CUDA orders blocks).
    pub fn pid(&self, i: u64) -> [u32; 3] {
        let g = self.0;
        let p0 = i % g[0] as u64;
        let p1 = (i / g[0] as u64) % g[1] as u64;
        let p2 = i / (g[0] as u64 * g[1] as u64);
        [p0 as u32, p1 as u32, p2 as u32]
    }
}

impl From<u32> for Grid {
    fn from(g: u32) -> Grid {
        Grid([g, 1, 1])
    }
}
impl From<usize> for Grid {
    fn from(g: usize) -> Grid {
        Grid([g as u32, 1, 1])
    }
}
/// Integer literals: a negative size becomes an empty (rejected) axis.
impl From<i32> for Grid {
    fn from(g: i32) -> Grid {
        Grid([g.max(0) as u32, 1, 1])
    }
}
impl From<(u32, u32)> for Grid {
    fn from(g: (u32, u32)) -> Grid {
        Grid([g.0, g.1, 1])
    }
}
impl From<(u32, u32, u32)> for Grid {
    fn from(g: (u32, u32, u32)) -> Grid {
        Grid([g.0, g.1, g.2])
    }
}
impl From<[u32; 3]> for Grid {
    fn from(g: [u32; 3]) -> Grid {
        Grid(g)
    }
}

/// What to do when a race is found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RaceMode {
    /// Fail the launch (the default).
    #[default]
    Error,
    /// Report races in the summary and resolve them as the sequential emulation would (the
    /// program with the highest linear id wins).
    Warn,
}

/// [`Options::poison_masked_loads`]: every unfilled load poisoned.
pub const POISON_ALL: u64 = u64::MAX;

/// Launch options.
#[derive(Clone, Debug)]
pub struct Options {
    /// Race handling.
    pub races: RaceMode,
    /// Programs run per parallel chunk (memory bound for store logs). Results do not depend on it.
    pub chunk_programs: usize,
    /// Masked-off lanes of these float loads without `other` read NaN instead of 0: a bit mask
    /// over [`tilegrad_ir::analysis::unfilled_loads`] ([`POISON_ALL`]: every one; 0: none, the
    /// default, as Triton's NVIDIA and AMD backends read them). Running a launch again with
    /// them poisoned tells whether its results depend on lanes Triton documents as undefined.
    pub poison_masked_loads: u64,
    /// Record which program and store wrote every element of every written tensor
    /// ([`LaunchSummary::writers`]), for blame in reports: from the store runs the fast path
    /// logs anyway (8 bytes per element written while the table is built), or from the exact
    /// path's owner tables; the result is kept as runs of elements with one writer.
    pub record_writers: bool,
    /// Run on the exact path (every program's accesses committed in program order), never the
    /// fast one: the first error in program order is the one returned (the fast path finds a
    /// race only once every program ran, after an access out of bounds of a later program).
    pub exact: bool,
    /// Parameters whose tensors are scratch: never read before the launch writes them, and not
    /// needed after it (a VJP kernel's tapes). A backend that runs elsewhere may keep them
    /// there: the GPU allocates them on the device and neither copies them in nor back, so
    /// their host tensors are left as they were. The reference keeps each program's writes to
    /// them as its own (8 bytes an element written, no log of stores; they are neither
    /// committed nor checked for races, and atomics on them are errors).
    pub scratch: Vec<String>,
    /// Only the programs of this range of linear program ids ([`Grid::pid`]) run: a batch of the
    /// grid's programs, as a VJP kernel's launch runs them to bound its tapes. Program ids and
    /// `num_programs` stay those of the whole grid. `None`: every program.
    pub programs: Option<std::ops::Range<u64>>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            races: RaceMode::Error,
            chunk_programs: 4096,
            poison_masked_loads: 0,
            record_writers: false,
            exact: false,
            scratch: Vec::new(),
            programs: None,
        }
    }
}

/// Who wrote each element of one tensor in a launch (see [`Options::record_writers`]), as runs
/// of consecutive elements with one writer: programs write rows and tiles, so a written tensor
/// takes a few bytes per tile rather than per element.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Writers {
    /// The tensor.
    pub tensor: TensorId,
    /// Elements of the tensor.
    len: usize,
    /// Maximal runs of elements with one writer, in element order: (first element, the linear
    /// program id of its last writer ([`Writers::NONE`] when no program wrote it,
    /// [`Writers::MANY`] when several programs added to it atomically), the store or
    /// `atomic_add` instruction that wrote it (index of an [`Inst`])).
    runs: Vec<(usize, u32, u32)>,
}

impl Writers {
    /// No program wrote the element.
    pub const NONE: u32 = u32::MAX;
    /// Several programs wrote the element (atomically).
    pub const MANY: u32 = u32::MAX - 1;

    /// From per-element writers: `(program, instruction)` of each element in order.
    pub fn from_elements(tensor: TensorId, elements: impl IntoIterator<Item = (u32, u32)>) -> Writers {
        let mut runs: Vec<(usize, u32, u32)> = Vec::new();
        let mut len = 0;
        for (e, (p, i)) in elements.into_iter().enumerate() {
            let i = if p == Writers::NONE { Writers::NONE } else { i };
            if runs.last().is_none_or(|&(_, lp, li)| (lp, li) != (p, i)) {
                runs.push((e, p, i));
            }
            len = e + 1;
        }
        runs.shrink_to_fit();
        Writers { tensor, len, runs }
    }

    /// From runs `(first element, program, instruction)` in element order, over `len` elements
    /// (runs of one writer next to each other are merged).
    pub fn from_runs(tensor: TensorId, len: usize, runs: impl IntoIterator<Item = (usize, u32, u32)>) -> Writers {
        let mut out: Vec<(usize, u32, u32)> = Vec::new();
        for (e, p, i) in runs {
            let i = if p == Writers::NONE { Writers::NONE } else { i };
            if out.last().is_none_or(|&(_, lp, li)| (lp, li) != (p, i)) {
                out.push((e, p, i));
            }
        }
        Writers { tensor, len, runs: out }
    }

    /// Elements of the tensor.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a tensor of no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The writer of element `e`: (linear program id, instruction), or `None` when unwritten.
    pub fn of(&self, e: usize) -> Option<(u32, Inst)> {
        let r = self.runs.partition_point(|&(start, ..)| start <= e).checked_sub(1)?;
        let (_, p, i) = self.runs[r];
        (e < self.len && p != Writers::NONE).then_some((p, Inst(i)))
    }

    /// The writer of every element in order (as [`Writers::of`]).
    pub fn iter(&self) -> impl Iterator<Item = Option<(u32, Inst)>> + '_ {
        self.runs.iter().enumerate().flat_map(move |(r, &(start, p, i))| {
            let end = self.runs.get(r + 1).map_or(self.len, |n| n.0);
            std::iter::repeat_n((p != Writers::NONE).then_some((p, Inst(i))), end - start)
        })
    }
}

/// What a launch did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LaunchSummary {
    /// Program instances run.
    pub programs: u64,
    /// Active (unmasked) lanes loaded.
    pub elements_loaded: u64,
    /// Active lanes stored.
    pub elements_stored: u64,
    /// Active lanes atomically added.
    pub elements_atomic: u64,
    /// For each loop, the largest trip count any program took (by the `for` instruction).
    pub max_trips: BTreeMap<Inst, u64>,
    /// Races found (only filled with [`RaceMode::Warn`]).
    pub races: Vec<crate::error::Race>,
    /// Conflicts between programs whose outcome does not depend on their order (every program
    /// stored the same bits to the element; a load of an element every store left unchanged):
    /// deterministic on a GPU, so not races; the first ones as examples.
    pub same_value: Vec<crate::error::Race>,
    /// How many such conflicting accesses there were (element by element).
    pub same_value_races: u64,
    /// Writers of every written tensor (only filled with [`Options::record_writers`]).
    pub writers: Vec<Writers>,
}

/// A kernel launch: kernel, grid and arguments by parameter name.
#[derive(Clone, Debug)]
pub struct Launch<'k> {
    pub(crate) kernel: &'k Kernel,
    pub(crate) grid: Grid,
    pub(crate) args: Vec<(String, Arg)>,
    pub(crate) options: Options,
}

/// A parameter bound to its argument, after checking.
#[derive(Clone, Debug)]
pub(crate) enum Bound {
    Tensor(TensorId),
    Scalar(Lit, DType),
}

impl<'k> Launch<'k> {
    /// A launch of `kernel` on `grid`.
    pub fn new(kernel: &'k Kernel, grid: impl Into<Grid>) -> Launch<'k> {
        Launch { kernel, grid: grid.into(), args: Vec::new(), options: Options::default() }
    }

    /// Binds parameter `name`.
    pub fn arg(mut self, name: &str, value: impl Into<Arg>) -> Launch<'k> {
        self.args.push((name.to_string(), value.into()));
        self
    }

    /// Sets the options.
    pub fn options(mut self, options: Options) -> Launch<'k> {
        self.options = options;
        self
    }

    /// The kernel.
    pub fn kernel(&self) -> &'k Kernel {
        self.kernel
    }

    /// The grid.
    pub fn grid(&self) -> Grid {
        self.grid
    }

    /// The arguments, by parameter name, as given.
    pub fn args(&self) -> &[(String, Arg)] {
        &self.args
    }

    /// The options.
    pub fn get_options(&self) -> &Options {
        &self.options
    }

    /// The linear ids of the programs that run ([`Options::programs`] within the grid).
    pub fn program_range(&self) -> std::ops::Range<u64> {
        let total = self.grid.programs();
        match &self.options.programs {
            // `check_arguments` refuses a range outside the grid.
            Some(r) => r.start.min(total)..r.end.clamp(r.start.min(total), total),
            None => 0..total,
        }
    }

    /// The same launch of another kernel with the same parameters (e.g. the kernel promoted to
    /// f64).
    pub fn with_kernel<'j>(&self, kernel: &'j Kernel) -> Launch<'j> {
        Launch { kernel, grid: self.grid, args: self.args.clone(), options: self.options.clone() }
    }

    /// Runs the launch: on success the written tensors of `mem` hold their final contents.
    pub fn run(&self, mem: &mut Memory) -> Result<LaunchSummary, ExecError> {
        tilegrad_ir::verify(self.kernel)?;
        let bound = self.bind(mem)?;
        crate::exec::execute(self, &bound, mem)
    }

    /// Runs the launch with every check of [`Launch::run`] (arguments, bounds, races, loop
    /// bounds) and the same summary, without changing `mem`: the final contents are discarded.
    pub fn check(&self, mem: &Memory) -> Result<LaunchSummary, ExecError> {
        tilegrad_ir::verify(self.kernel)?;
        let bound = self.bind(mem)?;
        crate::exec::check(self, &bound, mem)
    }

    /// Runs program instance `pid` alone against `mem` (which it does not change) and records
    /// the value of every op it runs: the last execution of each, or, with `target` (a store or
    /// `atomic_add` instruction, a tensor and a flat element), the execution current when that
    /// instruction last wrote that element. Also records the ops whose results became
    /// non-finite from finite operands. For explaining one element of a launch's output.
    pub fn record_program(
        &self,
        mem: &Memory,
        pid: [u32; 3],
        target: Option<(Inst, TensorId, usize)>,
    ) -> Result<crate::exec::ProgramRecord, ExecError> {
        tilegrad_ir::verify(self.kernel)?;
        let bound = self.bind(mem)?;
        crate::exec::record(self, &bound, mem, pid, target.map(|(i, t, e)| (i, t, e as i64)))
    }

    /// The checks of [`Launch::check`] that need no program to run: the kernel verifies, the
    /// grid is valid, and every argument matches its parameter and its tensor's data.
    pub fn check_arguments(&self, mem: &Memory) -> Result<(), ExecError> {
        tilegrad_ir::verify(self.kernel)?;
        self.bind(mem).map(|_| ())
    }

    /// [`Launch::check_arguments`], where an f64 pointer parameter also takes a tensor stored
    /// in a narrower float dtype, standing for its values read exactly as f64: how the records
    /// of a forward run in f64 keep tensors whose values all fit a narrower dtype. Only for
    /// readers of the memory that convert every element to f64 (the AD engine), not for runs.
    pub fn check_arguments_widened(&self, mem: &Memory) -> Result<(), ExecError> {
        tilegrad_ir::verify(self.kernel)?;
        self.bind_as(mem, true).map(|_| ())
    }

    /// Checks the arguments against the parameters and returns them in parameter order.
    pub(crate) fn bind(&self, mem: &Memory) -> Result<Vec<Bound>, ExecError> {
        self.bind_as(mem, false)
    }

    /// [`Launch::bind`]; with `widened`, an f64 pointer takes a narrower float tensor.
    fn bind_as(&self, mem: &Memory, widened: bool) -> Result<Vec<Bound>, ExecError> {
        let k = self.kernel;
        let err = |param: &str, message: String| ExecError::Argument { kernel: k.name.clone(), param: param.into(), message };
        if self.grid.0.contains(&0) {
            return Err(ExecError::Grid { kernel: k.name.clone(), grid: self.grid.0, message: "every axis must be at least 1".into() });
        }
        if self.grid.0.iter().any(|&g| g > i32::MAX as u32) {
            return Err(ExecError::Grid { kernel: k.name.clone(), grid: self.grid.0, message: "an axis exceeds i32::MAX".into() });
        }
        if let Some(r) = &self.options.programs {
            if r.start > r.end || r.end > self.grid.programs() {
                return Err(ExecError::Grid {
                    kernel: k.name.clone(),
                    grid: self.grid.0,
                    message: format!("programs {}..{} run of a grid of {}", r.start, r.end, self.grid.programs()),
                });
            }
        }
        for (i, (name, _)) in self.args.iter().enumerate() {
            if k.param(name).is_none() {
                let known: Vec<&str> = k.params.iter().map(|p| p.name.as_str()).collect();
                return Err(err(name, format!("the kernel has no such parameter (parameters: {})", known.join(", "))));
            }
            if self.args[..i].iter().any(|(n, _)| n == name) {
                return Err(err(name, "given twice".into()));
            }
        }
        let mut out = Vec::with_capacity(k.params.len());
        for p in &k.params {
            let given = self.args.iter().find(|(n, _)| *n == p.name).map(|(_, a)| *a);
            let b = match (&p.kind, given) {
                (ParamKind::Ptr(d), Some(Arg::Tensor(t))) => {
                    let Some(ten) = mem.try_get(t) else { return Err(err(&p.name, format!("tensor id {} is not in this memory", t.0))) };
                    if ten.dtype() != *d && !(widened && *d == DType::F64 && ten.dtype().is_float()) {
                        return Err(err(&p.name, format!("expected a tensor of {d}, got `{}` of {}", mem.name(t), ten.dtype())));
                    }
                    Bound::Tensor(t)
                }
                (ParamKind::Ptr(d), Some(Arg::Scalar(l))) => {
                    return Err(err(&p.name, format!("expected a tensor of {d}, got the scalar {l}")))
                }
                (ParamKind::Scalar(d), Some(Arg::Scalar(l))) => Bound::Scalar(check_lit(l, *d).map_err(|m| err(&p.name, m))?, *d),
                (ParamKind::Constexpr(d, v), Some(Arg::Scalar(l))) => {
                    let l = check_lit(l, *d).map_err(|m| err(&p.name, m))?;
                    if l != *v {
                        return Err(err(&p.name, format!("the kernel was built with {} = {v}, the launch passes {l}", p.name)));
                    }
                    Bound::Scalar(*v, *d)
                }
                (ParamKind::Scalar(d) | ParamKind::Constexpr(d, _), Some(Arg::Tensor(_))) => {
                    return Err(err(&p.name, format!("expected a {d} scalar, got a tensor")))
                }
                (ParamKind::Constexpr(d, v), None) => Bound::Scalar(*v, *d),
                (_, None) => return Err(err(&p.name, "missing argument".into())),
            };
            out.push(b);
        }
        Ok(out)
    }
}

/// The tensors among `args` that a launch of `kernel` may write: those bound to parameters it
/// stores to or updates atomically, each once, in parameter order.
pub fn written_tensors(kernel: &Kernel, args: &[(String, Arg)]) -> Vec<TensorId> {
    let uses = tilegrad_ir::analysis::param_uses(kernel);
    let mut out = Vec::new();
    for (p, u) in kernel.params.iter().zip(&uses) {
        if let Some((_, Arg::Tensor(t))) = args.iter().find(|(n, _)| *n == p.name) {
            if (u.stored || u.atomic) && !out.contains(t) {
                out.push(*t);
            }
        }
    }
    out
}

/// Converts a literal argument to a scalar parameter's dtype, refusing lossy conversions.
fn check_lit(l: Lit, d: DType) -> Result<Lit, String> {
    match (l, d) {
        (Lit::Bool(_), DType::I1) => Ok(l),
        (Lit::Int(i), DType::I1) if i == 0 || i == 1 => Ok(Lit::Bool(i == 1)),
        (Lit::Int(i), DType::I32) if i32::try_from(i).is_ok() => Ok(l),
        (Lit::Int(_), DType::I64) => Ok(l),
        (Lit::Int(i), f) if f.is_float() => Ok(Lit::Float(i as f64)),
        (Lit::Float(_), f) if f.is_float() => Ok(l),
        _ => Err(format!("expected a {d} scalar, got {l}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writers_as_runs_give_every_element_its_writer() {
        // Rows of one program, an unwritten gap, atomics by several programs, single elements.
        let mut each: Vec<(u32, u32)> = Vec::new();
        for p in 0..5u32 {
            each.extend(std::iter::repeat_n((p, 3), 7));
        }
        each.extend(std::iter::repeat_n((Writers::NONE, 9), 4));
        each.extend(std::iter::repeat_n((Writers::MANY, 5), 3));
        each.extend((0..6u32).map(|i| (i % 2, 4 + i % 3)));
        let w = Writers::from_elements(TensorId(2), each.iter().copied());
        assert_eq!(w.len(), each.len());
        assert!(w.runs.len() < each.len() / 2, "runs, not elements: {}", w.runs.len());
        let want: Vec<Option<(u32, Inst)>> = each.iter().map(|&(p, i)| (p != Writers::NONE).then_some((p, Inst(i)))).collect();
        let got: Vec<_> = (0..each.len()).map(|e| w.of(e)).collect();
        assert_eq!(got, want);
        assert_eq!(w.iter().collect::<Vec<_>>(), want);
        assert_eq!(w.of(each.len()), None, "past the end");
        assert_eq!(w.of(35), None);
        assert_eq!(w.of(39), Some((Writers::MANY, Inst(5))));
        // Equal writers give equal values, whatever the unwritten elements' instructions said.
        let mut other = each.clone();
        other[36].1 = 0;
        assert_eq!(Writers::from_elements(TensorId(2), other), w);
        assert!(Writers::from_elements(TensorId(0), std::iter::empty()).is_empty());
    }
}
