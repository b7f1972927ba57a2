//! Launch spec files (TOML): everything [`check_backward`](crate::check_backward) needs, said
//! without writing Rust. Paths in a spec are relative to the spec file.
//!
//! ```toml
//! name = "weighted_sum"                 # optional; the file name otherwise
//!
//! [kernels]                             # FILE.py::NAME (Triton), FILE.tgir::NAME or FILE.tgir
//! fwd = "triton/weighted_sum.py::weighted_sum_fwd"
//! bwd = "triton/weighted_sum_bwd.py::weighted_sum_bwd"
//! # tuned = { kernel = "k.py::NAME", config = 2 }   # constexprs of its 3rd @triton.autotune config
//! # other = { kernel = "k.py::NAME", jit = true }    # a kernel under a decorator not known as triton.jit
//!
//! [constants]                           # names for expressions (numbers, or expressions
//! ROWS = 1000                           # of the constants above them)
//! D = 300
//! D_TILE = "min(next_power_of_2(D), 128)"
//!
//! [inputs]                              # shape, dtype (f32), init: normal | normal(m, s) |
//! x = { shape = ["ROWS", "D"] }         # uniform(lo, hi) | randint(lo, hi) | const(v) |
//!                                       # arange(start, step[, modulus]) (row-major); or file
//! w = { shape = ["D"], init = "uniform(-1, 1)" }   # = "w.npy"
//! # labels = { shape = ["ROWS"], dtype = "i64", slices = [    # consecutive slices along `axis`
//! #   { len = "ROWS - 8", init = "randint(0, D)" },          # (default 0), each from its own
//! #   { len = 8, init = "const(-100)" } ] }                   # distribution
//!
//! [forward]
//! differentiable = ["x", "w"]           # default: every float input
//! outputs = ["out"]                     # each gets a random cotangent `grad_<output>`
//! cotangents = { out = "const(1)" }     # optional, per output: a distribution or "FILE.npy"
//! saved = []                            # checked like outputs, no cotangent (e.g. mean, rstd)
//! steps = [
//!   { alloc = "out", shape = ["ROWS"], dtype = "f32" },      # init = "empty" (NaN) | "zeros"
//!   { launch = "fwd", grid = ["cdiv(ROWS, 16)"], args = { x_ptr = "x", weight_ptr = "w",
//!     output_ptr = "out", x_stride_row = "x.stride(0)", x_stride_dim = "x.stride(1)",
//!     weight_stride_dim = "w.stride(0)", output_stride_row = "out.stride(0)", ROWS = "ROWS",
//!     D = "D", ROWS_TILE_SIZE = 16, D_TILE_SIZE = 64 } },
//! ]
//!
//! [backward]                            # cotangents are `grad_<output>`
//! gradients = { x = "grad_x", w = "grad_w" }
//! steps = [
//!   { alloc = "grad_x", like = "x" },
//!   { alloc = "partial", shape = ["cdiv(ROWS, 16)", "D"], dtype = "f32" },
//!   { launch = "bwd", grid = ["cdiv(ROWS, 16)"], args = { ... } },
//!   { sum = "partial", axis = 0, into = "grad_w" },     # host steps: see below
//! ]
//!
//! [check]                               # defaults for the CLI's options
//! seed = 0
//! trials = 2
//! precision = "f64"                     # or "native"
//! rtol = 1e-4                           # both or neither: override the defaults by dtype
//! atol = 1e-5                           # (and turn off the calibrated tolerance of f16/bf16)
//! allow_non_finite = false              # true: accept NaN/inf inputs and ground truth
//! strict = false                        # true: notes fail the check (masked-off lanes read as 0,
//!                                       # conflicts whose outcome does not depend on the order)
//! triton_version = "3.6.0"              # what the kernels' module-level checks see: the
//! env = { FLA_USE_FAST_OPS = "0" }      # Triton version, environment variables (unset by
//! device = "sm_90"                      # default) and device capability (sm_90)
//! ```
//!
//! Host steps, what a launcher does with torch between launches (each a table with one kind key;
//! `into` names the new tensor, except for `accumulate`, which updates one in place):
//!
//! - `{ sum = "t", axis = 0, into = "s" }`, and likewise `mean`, `logsumexp` (of floats) and
//!   `max` (`amax`: the cotangent is shared among tied maxima): a reduction over one axis
//!   (negative counts from the end), which is removed (a 1-d tensor gives a 0-d one); computed in
//!   f64 and rounded once to `t`'s dtype.
//! - `{ reshape = "t", shape = ["R", "C"], into = "r" }` and `{ scale = "t", by = "EXPR", into =
//!   "s" }` (a size expression, as launch arguments).
//! - `{ compute = "grad_x * grad_loss", into = "g" }`: an elementwise expression of tensors,
//!   constants and numbers (see [`crate::check::tensor_expr`]): `+ - * / **`, unary minus, one
//!   comparison `< <= > >= == !=` (a bool), `exp log sqrt abs tanh sigmoid`, `min(a, b)`,
//!   `max(a, b)` and `where(cond, a, b)` (`where(labels == -100, 0.0, x)`). Shapes broadcast as
//!   in NumPy and torch (0-d tensors and numbers everywhere); the dtype is torch's promotion
//!   (float beats int; among floats a dimensioned tensor's dtype wins over a 0-d tensor's, which
//!   wins over a number's, which is f32) or `dtype = "f16"`. Natively the value is computed in
//!   f64 and rounded once to that dtype (torch rounds after each operation); the ground truth
//!   keeps floats in f64.
//! - `{ cast = "x", dtype = "f16", into = "x16" }`: `x.to(torch.float16)`.
//! - `{ accumulate = "src", into = "dst" }`: `dst += src` in place, `src` broadcast to `dst`'s
//!   shape and the sum rounded to `dst`'s dtype (not a float into an integer tensor).
//!
//! - `{ chunk = "x", chunks = 2, axis = -1, into = ["a", "b"] }`: `a, b = x.chunk(2, -1)`, with
//!   torch's sizes: each chunk `ceil(n / chunks)` along the axis, the last what remains, so
//!   there may be fewer chunks than asked (`n = 5`, 4 chunks: sizes 2, 2, 1) and `into` names
//!   exactly as many as torch gives (an error says how many); `axis` defaults to 0.
//! - `{ slice = "x", axis = 1, start = "0", stop = "H", into = "x1" }`: `x1 = x[:, 0:H]`, with
//!   Python's rules (negative bounds count from the end, bounds past the ends are clamped);
//!   `start`, `stop` and `step` (positive, default 1) are optional size expressions.
//! - `{ cat = ["a", "b"], axis = -1, into = "c" }`: `c = torch.cat([a, b], -1)`: the same rank
//!   (at least 1) and extents but along the axis; dtypes promote as torch promotes them (f16
//!   with f32 gives f32, an int with a float the float).
//!
//!   Chunks and slices are copies where torch gives views: a launch that writes into one does
//!   not change its source (write into the source, or `cat` the pieces back).
//! - `{ item = "sum(target != IGNORE)", into = "n_non_ignore" }`: a host scalar computed from
//!   data, `(target != IGNORE).sum().item()`: `sum`, `mean`, `max` or `min` of an elementwise
//!   expression over all its elements (or an expression of one element, `{ item = "loss" }`).
//!   It becomes a constant of the later steps of its pass (and, from the forward, of the
//!   backward): launch arguments (passed as runtime scalars, i32 or f32, never folded into a
//!   constexpr), grids, `scale` factors and expressions; not shapes or slice bounds, which are
//!   fixed when the spec loads. It is computed in each pass from that pass's tensors; an integer
//!   when the expression is (a count), else a float rounded to the expression's dtype. **No
//!   gradient flows through it**: a count is piecewise constant, and a float computed in the
//!   forward from a tensor that depends on a differentiable input is refused (its gradient
//!   would be missing from the ground truth).
//!
//! The ground truth differentiates each host step exactly (an expression per element, with no
//! gradient through comparisons, `where`'s condition or integer tensors; a cast as the identity;
//! a chunk or slice scattering its cotangent back into the source's positions, `cat` splitting
//! its cotangent among its sources;
//! `accumulate` passing `dst`'s cotangent through and summing it into `src` over the axes `src`
//! was broadcast along), at the operands as the step read them, even where a later launch or
//! `accumulate` overwrites them. Shapes and dtypes are checked when the spec loads: an error
//! names the step's key (`backward.steps[2].compute`) and, in an expression, the column.
//!
//! Constants, launch arguments and grids are size expressions (see [`crate::check::expr`]):
//! Python's arithmetic with `**`, comparisons, `and`/`or`/`not` and conditionals, so that a
//! heuristic reads as the launcher writes it (`BLOCK = "1024 if N > 4096 else 512"` in
//! `[constants]`, a string that is an expression of the constants above it). `compute`
//! expressions have `**` too (`x ** 2`, `x ** 0.5`, `a ** b`, differentiated in both operands).
//!
//! Launch arguments are expressions (see [`crate::check::expr`]); a bare tensor name passes the
//! tensor; `"descriptor(q, [BLOCK_M, HEAD_DIM])"` passes what `TensorDescriptor.from_tensor(q,
//! [BLOCK_M, HEAD_DIM])` builds on the host (the kernel uses it with `desc.load([..])`,
//! `desc.store([..], v)` or `tl._experimental_descriptor_load/store`). A Triton kernel is
//! converted per launch: its constexprs from the launch's constant arguments, its pointer dtypes
//! from the tensors passed, float arguments as f32 scalars. A constexpr may also be bound to a
//! value that exists only at conversion: a quoted string (`reduction = "'mean'"`), `"None"`, or a
//! dtype (`X_dtype = "tl.float16"`); TOML `true`/`false` bind bools and floats bind float
//! constexprs (`eps = 1e-6`). Errors name the file, the key and what was expected.

use crate::check::tensor_expr::{broadcast, Operand};
use crate::check::{
    expr::Scope, Backward, CheckOptions, Cotangent, Dist, Expr, Forward, Init, Inputs, KernelLaunch, Precision, Reduction, Scalar, Source,
    Step, TensorExpr, Tolerance,
};

/// The keys that say what a step is.
const STEP_KINDS: [&str; 15] = [
    "alloc",
    "launch",
    "sum",
    "mean",
    "logsumexp",
    "max",
    "reshape",
    "scale",
    "compute",
    "cast",
    "accumulate",
    "chunk",
    "slice",
    "cat",
    "item",
];
mod host;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tilegrad_ir::triton::{convert_noted, ConstValue, ConvertOptions, HostDescriptor};
use tilegrad_ir::{DType, Kernel};
use toml::{Table, Value};

/// An error in a spec file: the file, the key, what was expected.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {key}: {message}")]
pub struct SpecError {
    /// The spec file.
    pub file: String,
    /// The key (dotted path), or `-` for the whole file.
    pub key: String,
    /// What is wrong.
    pub message: String,
}

/// A loaded spec.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Name of the check.
    pub name: String,
    /// The spec file.
    pub path: PathBuf,
    /// The forward.
    pub forward: Forward,
    /// The backward, when the spec has one.
    pub backward: Option<Backward>,
    /// Inputs and constants.
    pub inputs: Inputs,
    /// Options from the `[check]` table (the CLI may override them).
    pub options: CheckOptions,
    /// What converting its Triton kernels assumed (module-level bindings whose condition was not
    /// decided), each with its file:line:column.
    pub notes: Vec<String>,
}

/// What the program around the kernels is like, for the module-level checks of their files
/// (`if Version(triton.__version__) >= ...`, `os.environ.get(...)`, device capability): each
/// overrides the spec's `[check]` key of the same name when given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConvertSettings {
    /// `triton.__version__` (`triton_version`).
    pub triton_version: Option<String>,
    /// Environment variables (`env`), added to the spec's.
    pub env: Vec<(String, String)>,
    /// The device's compute capability (`device`, e.g. `sm_90`).
    pub device: Option<(u32, u32)>,
}

/// Replaces kernel `key` of a spec with another kernel reference: `FILE::NAME` (relative to the
/// working directory) or `::NAME` (another kernel of the same file).
#[derive(Clone, Debug)]
pub struct KernelOverride {
    /// Key in `[kernels]`.
    pub key: String,
    /// The new reference.
    pub reference: String,
}

/// Loads a spec file.
pub fn load(path: &Path) -> Result<Spec, SpecError> {
    load_with(path, &[])
}

/// Loads a spec file with some of its kernels replaced.
pub fn load_with(path: &Path, overrides: &[KernelOverride]) -> Result<Spec, SpecError> {
    load_configured(path, overrides, &ConvertSettings::default())
}

/// Loads a spec file with some of its kernels replaced and conversion settings overridden.
pub fn load_configured(path: &Path, overrides: &[KernelOverride], settings: &ConvertSettings) -> Result<Spec, SpecError> {
    let file = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| SpecError { file: file.clone(), key: "-".into(), message: e.to_string() })?;
    let text = tilegrad_ir::source_text(bytes, &file).map_err(|e| {
        let message = match e {
            tilegrad_ir::IrError::Parse { error, .. } => format!("line {}, column {}: {}", error.line, error.col, error.message),
            e => e.to_string(),
        };
        SpecError { file: file.clone(), key: "-".into(), message }
    })?;
    let table: Table = text.parse().map_err(|e: toml::de::Error| {
        let at = e.span().map(|s| line_col(&text, s.start)).map_or(String::new(), |(l, c)| format!("line {l}, column {c}: "));
        SpecError { file: file.clone(), key: "-".into(), message: format!("{at}{}", e.message()) }
    })?;
    let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
    let mut l = Loader {
        file,
        dir,
        kernels: HashMap::new(),
        sources: HashMap::new(),
        cache: Vec::new(),
        tensors: Vec::new(),
        convert: ConvertOptions::default(),
        notes: Vec::new(),
        items: Vec::new(),
        tainted: None,
    };
    l.convert_settings(table.get("check"), settings)?;
    l.load(&table, path, overrides)
}

fn line_col(text: &str, at: usize) -> (usize, usize) {
    let before = &text[..at.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, col)
}

/// A kernel reference: a Triton function (converted per launch) or a text-IR kernel.
#[derive(Clone, Debug)]
enum KernelRef {
    /// `config`: constexprs of the chosen `@triton.autotune` config.
    Triton {
        file: PathBuf,
        name: String,
        config: Vec<(String, i64)>,
        /// Taken as a kernel without a recognised `triton.jit` form.
        jit: bool,
    },
    Text(Arc<Kernel>),
}

type ConvertKey = (String, Vec<(String, ConstValue)>, Vec<(String, DType)>, Vec<(String, DType)>, Vec<(String, HostDescriptor)>);

struct Loader {
    file: String,
    dir: PathBuf,
    kernels: HashMap<String, KernelRef>,
    sources: HashMap<PathBuf, String>,
    cache: Vec<(ConvertKey, Arc<Kernel>)>,
    /// Tensors known statically: name, dtype, shape.
    tensors: Vec<(String, DType, Vec<usize>)>,
    /// The Triton version, environment and device every conversion sees.
    convert: ConvertOptions,
    /// The conversions' notes, in order, each once.
    notes: Vec<String>,
    /// Host scalars computed from data by `item` steps: name, a stand-in value of their kind
    /// (their values are known only as a pass runs), and the step's key.
    items: Vec<(String, Scalar, String)>,
    /// While the forward's steps load: the tensors whose values depend on a differentiable
    /// input.
    tainted: Option<Vec<String>>,
}

struct Static<'a> {
    constants: &'a [(String, Scalar)],
    tensors: &'a [(String, DType, Vec<usize>)],
}

impl Scope for Static<'_> {
    fn constant(&self, name: &str) -> Option<Scalar> {
        self.constants.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.tensors.iter().find(|(n, ..)| n == name).map(|(_, _, s)| s.clone())
    }
}

impl Loader {
    fn err(&self, key: &str, message: impl Into<String>) -> SpecError {
        SpecError { file: self.file.clone(), key: key.to_string(), message: message.into() }
    }

    fn load(&mut self, t: &Table, path: &Path, overrides: &[KernelOverride]) -> Result<Spec, SpecError> {
        for k in t.keys() {
            if !["name", "kernels", "constants", "inputs", "forward", "backward", "check"].contains(&k.as_str()) {
                return Err(self.err(k, "unknown key (expected name, kernels, constants, inputs, forward, backward, check)"));
            }
        }
        let name = match t.get("name") {
            Some(v) => self.string(v, "name")?,
            None => path.file_stem().map_or("check".into(), |s| s.to_string_lossy().into_owned()),
        };
        self.kernel_table(t.get("kernels"), overrides)?;
        let mut inputs = Inputs::new();
        if let Some(c) = t.get("constants") {
            for (k, v) in self.table(c, "constants")? {
                let key = format!("constants.{k}");
                let e = self.expr(v, &key)?;
                let scope = Static { constants: &inputs.constants, tensors: &[] };
                let s =
                    e.eval(&scope).map_err(|err| self.err(&key, format!("`{e}`: {err} (a constant may use the constants above it)")))?;
                inputs.constants.push((k.clone(), s));
            }
        }
        if let Some(c) = t.get("inputs") {
            for (k, v) in self.table(c, "inputs")? {
                let it = self.input(k, v, &inputs.constants)?;
                inputs.tensors.push(it);
            }
        }
        if inputs.tensors.is_empty() {
            return Err(self.err("inputs", "a spec needs at least one input tensor"));
        }
        let ftab = self.table(t.get("forward").ok_or_else(|| self.err("forward", "missing table"))?, "forward")?;
        self.only(ftab, "forward", &["differentiable", "outputs", "saved", "steps", "cotangents"])?;
        let differentiable = match ftab.get("differentiable") {
            Some(v) => self.strings(v, "forward.differentiable")?,
            None => self.tensors.iter().filter(|(_, d, _)| d.is_float()).map(|(n, ..)| n.clone()).collect(),
        };
        let outputs = self.strings(ftab.get("outputs").ok_or_else(|| self.err("forward.outputs", "missing"))?, "forward.outputs")?;
        self.tainted = Some(differentiable.clone());
        let fsteps = self.steps(ftab.get("steps"), "forward.steps", &inputs.constants)?;
        self.tainted = None;
        let saved = match ftab.get("saved") {
            Some(v) => self.strings(v, "forward.saved")?,
            None => Vec::new(),
        };
        for o in &saved {
            if !self.tensors.iter().any(|(n, ..)| n == o) {
                return Err(self.err("forward.saved", format!("`{o}` is not a tensor of the forward")));
            }
        }
        let mut cotangents = Vec::new();
        if let Some(c) = ftab.get("cotangents") {
            for (o, v) in self.table(c, "forward.cotangents")? {
                let key = format!("forward.cotangents.{o}");
                if !outputs.contains(o) {
                    return Err(self.err(&key, format!("`{o}` is not an output (outputs: {})", outputs.join(", "))));
                }
                let s = self.string(v, &key)?;
                let c = if s.ends_with(".npy") {
                    let p = self.dir.join(&s);
                    Cotangent::Given(crate::npy::read(&p).map_err(|e| self.err(&key, e.to_string()))?)
                } else {
                    Cotangent::Random(self.dist(&s, &key)?)
                };
                cotangents.push((o.clone(), c));
            }
        }
        let forward = Forward { steps: fsteps, differentiable, outputs: outputs.clone(), saved, cotangents };
        for o in &outputs {
            let Some((_, d, s)) = self.tensors.iter().find(|(n, ..)| n == o).cloned() else {
                return Err(self.err("forward.outputs", format!("`{o}` is not a tensor of the forward")));
            };
            self.tensors.push((format!("grad_{o}"), d, s));
        }
        let backward = match t.get("backward") {
            None => None,
            Some(b) => {
                let b = self.table(b, "backward")?;
                self.only(b, "backward", &["gradients", "steps"])?;
                let steps = self.steps(b.get("steps"), "backward.steps", &inputs.constants)?;
                let g = self.table(b.get("gradients").ok_or_else(|| self.err("backward.gradients", "missing"))?, "backward.gradients")?;
                let mut gradients = Vec::new();
                for (k, v) in g {
                    gradients.push((k.clone(), self.string(v, &format!("backward.gradients.{k}"))?));
                }
                // In the order of the differentiable inputs (TOML tables are unordered).
                gradients.sort_by_key(|(i, _)| forward.differentiable.iter().position(|d| d == i).unwrap_or(usize::MAX));
                Some(Backward { steps, gradients })
            }
        };
        let options = self.options(t.get("check"))?;
        let notes = std::mem::take(&mut self.notes);
        Ok(Spec { name, path: path.to_path_buf(), forward, backward, inputs, options, notes })
    }

    fn only(&self, t: &Table, key: &str, allowed: &[&str]) -> Result<(), SpecError> {
        for k in t.keys() {
            if !allowed.contains(&k.as_str()) {
                return Err(self.err(&format!("{key}.{k}"), format!("unknown key (expected {})", allowed.join(", "))));
            }
        }
        Ok(())
    }

    fn table<'v>(&self, v: &'v Value, key: &str) -> Result<&'v Table, SpecError> {
        v.as_table().ok_or_else(|| self.err(key, format!("expected a table, found {}", v.type_str())))
    }

    fn string(&self, v: &Value, key: &str) -> Result<String, SpecError> {
        v.as_str().map(str::to_string).ok_or_else(|| self.err(key, format!("expected a string, found {}", v.type_str())))
    }

    fn strings(&self, v: &Value, key: &str) -> Result<Vec<String>, SpecError> {
        let a = v.as_array().ok_or_else(|| self.err(key, format!("expected an array of strings, found {}", v.type_str())))?;
        a.iter().enumerate().map(|(i, x)| self.string(x, &format!("{key}[{i}]"))).collect()
    }

    /// An expression: a string, or a number written as one.
    fn expr(&self, v: &Value, key: &str) -> Result<Expr, SpecError> {
        match v {
            Value::Integer(i) => Ok(Expr::from(*i)),
            Value::Float(f) => Ok(Expr::from(*f)),
            Value::Boolean(b) => Ok(Expr::from(*b as i64)),
            Value::String(s) => Expr::parse(s).map_err(|e| self.err(key, format!("`{s}`: {e}"))),
            _ => Err(self.err(key, format!("expected an expression (string or number), found {}", v.type_str()))),
        }
    }

    fn exprs(&self, v: &Value, key: &str) -> Result<Vec<Expr>, SpecError> {
        match v {
            Value::Array(a) => a.iter().enumerate().map(|(i, x)| self.expr(x, &format!("{key}[{i}]"))).collect(),
            other => Ok(vec![self.expr(other, key)?]),
        }
    }

    fn dtype(&self, v: Option<&Value>, key: &str) -> Result<DType, SpecError> {
        let Some(v) = v else { return Ok(DType::F32) };
        let s = self.string(v, key)?;
        let d = match s.trim_start_matches("torch.").trim_start_matches("tl.") {
            "f32" | "float32" => DType::F32,
            "f64" | "float64" => DType::F64,
            "f16" | "float16" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "i32" | "int32" => DType::I32,
            "i64" | "int64" => DType::I64,
            "i1" | "bool" => DType::I1,
            _ => return Err(self.err(key, format!("unknown dtype `{s}` (f32, f64, f16, bf16, i32, i64, bool)"))),
        };
        Ok(d)
    }

    fn kernel_table(&mut self, v: Option<&Value>, overrides: &[KernelOverride]) -> Result<(), SpecError> {
        let Some(v) = v else { return Err(self.err("kernels", "missing table")) };
        let mut refs: Vec<(String, String, PathBuf)> = Vec::new();
        let mut configs: HashMap<String, usize> = HashMap::new();
        let mut jits: Vec<String> = Vec::new();
        for (k, r) in self.table(v, "kernels")? {
            let key = format!("kernels.{k}");
            let r = match r {
                Value::Table(t) => {
                    self.only(t, &key, &["kernel", "config", "jit"])?;
                    match t.get("jit") {
                        None | Some(Value::Boolean(false)) => {}
                        Some(Value::Boolean(true)) => jits.push(k.clone()),
                        Some(_) => return Err(self.err(&format!("{key}.jit"), "expected true or false")),
                    }
                    if let Some(c) = t.get("config") {
                        let c = c.as_integer().and_then(|c| usize::try_from(c).ok());
                        configs.insert(
                            k.clone(),
                            c.ok_or_else(|| self.err(&format!("{key}.config"), "expected the index of an autotune config"))?,
                        );
                    }
                    self.string(t.get("kernel").ok_or_else(|| self.err(&format!("{key}.kernel"), "missing"))?, &format!("{key}.kernel"))?
                }
                r => self.string(r, &key)?,
            };
            refs.push((k.clone(), r, self.dir.clone()));
        }
        for o in overrides {
            let Some(slot) = refs.iter_mut().find(|(k, ..)| *k == o.key) else {
                let keys: Vec<&str> = refs.iter().map(|(k, ..)| k.as_str()).collect();
                return Err(self.err(&format!("kernels.{}", o.key), format!("no such kernel to replace (kernels: {})", keys.join(", "))));
            };
            if let Some(name) = o.reference.strip_prefix("::") {
                let file = slot.1.split("::").next().unwrap_or_default().to_string();
                slot.1 = format!("{file}::{name}");
            } else {
                slot.1 = o.reference.clone();
                slot.2 = PathBuf::from(".");
            }
        }
        for (k, r, base) in refs {
            let key = format!("kernels.{k}");
            let (file, name) = match r.split_once("::") {
                Some((f, n)) => (f.to_string(), Some(n.to_string())),
                None => (r.clone(), None),
            };
            let path = base.join(&file);
            let src = match self.sources.get(&path) {
                Some(s) => s.clone(),
                None => {
                    let bytes = std::fs::read(&path).map_err(|e| self.err(&key, format!("{}: {e}", path.display())))?;
                    let s = tilegrad_ir::source_text(bytes, &path.display().to_string()).map_err(|e| self.err(&key, e.to_string()))?;
                    self.sources.insert(path.clone(), s.clone());
                    s
                }
            };
            let shown = path.display().to_string();
            let kr = if file.ends_with(".py") {
                let name = name.ok_or_else(|| self.err(&key, format!("`{r}`: name the kernel, as `{file}::KERNEL`")))?;
                let jit = jits.contains(&k);
                tilegrad_ir::triton::find_kernel(&src, &shown, &name, jit).map_err(|e| self.err(&key, e.to_string()))?;
                let config = match configs.get(&k) {
                    None => Vec::new(),
                    Some(&c) => {
                        let all = tilegrad_ir::triton::autotune_configs(&src, &shown, &name).map_err(|e| self.err(&key, e.to_string()))?;
                        if all.is_empty() {
                            return Err(self.err(&format!("{key}.config"), format!("`{name}` has no @triton.autotune configs")));
                        }
                        all.get(c)
                            .cloned()
                            .ok_or_else(|| self.err(&format!("{key}.config"), format!("config {c} of `{name}`, which has {}", all.len())))?
                    }
                };
                KernelRef::Triton { file: path, name, config, jit }
            } else {
                if configs.contains_key(&k) {
                    return Err(self.err(&format!("{key}.config"), "autotune configs are for Triton kernels"));
                }
                let ks = tilegrad_ir::text::parse(&src, &shown).map_err(|e| self.err(&key, e.to_string()))?;
                let found = match &name {
                    Some(n) => ks.into_iter().find(|k| k.name == *n),
                    None if ks.len() == 1 => ks.into_iter().next(),
                    None => return Err(self.err(&key, format!("{shown} holds several kernels: name one, as `{file}::KERNEL`"))),
                };
                KernelRef::Text(Arc::new(
                    found.ok_or_else(|| self.err(&key, format!("{shown} has no kernel `{}`", name.unwrap_or_default())))?,
                ))
            };
            self.kernels.insert(k, kr);
        }
        Ok(())
    }

    fn input(&mut self, name: &str, v: &Value, constants: &[(String, Scalar)]) -> Result<crate::check::InputTensor, SpecError> {
        let key = format!("inputs.{name}");
        let t = self.table(v, &key)?;
        self.only(t, &key, &["shape", "dtype", "init", "file", "slices", "axis"])?;
        let source = if let Some(f) = t.get("file") {
            let f = self.string(f, &format!("{key}.file"))?;
            let p = self.dir.join(&f);
            let h = crate::npy::read(&p).map_err(|e| self.err(&format!("{key}.file"), e.to_string()))?;
            if let Some(d) = t.get("dtype") {
                let d = self.dtype(Some(d), &format!("{key}.dtype"))?;
                if d != h.dtype() {
                    return Err(self.err(&format!("{key}.dtype"), format!("{d}, but {} holds {}", p.display(), h.dtype())));
                }
            }
            Source::Given(h)
        } else {
            let dtype = self.dtype(t.get("dtype"), &format!("{key}.dtype"))?;
            let shape_v = t.get("shape").ok_or_else(|| self.err(&format!("{key}.shape"), "missing (or give `file`)"))?;
            let shape = self.exprs(shape_v, &format!("{key}.shape"))?;
            let scope = Static { constants, tensors: &self.tensors };
            let shape = crate::check::steps_eval_shape(&shape, &scope).map_err(|m| self.err(&format!("{key}.shape"), m))?;
            tilegrad_reference::check_alloc(dtype, &shape).map_err(|e| self.err(&format!("{key}.shape"), e.to_string()))?;
            if let Some(sl) = t.get("slices") {
                if t.contains_key("init") {
                    return Err(self.err(&key, "give `init` or `slices`, not both"));
                }
                self.slices(sl, t.get("axis"), &key, dtype, shape, &scope)?
            } else {
                if t.contains_key("axis") {
                    return Err(self.err(&format!("{key}.axis"), "`axis` goes with `slices`"));
                }
                let dist = match t.get("init") {
                    None => Dist::default(),
                    Some(v) => self.dist(&self.string(v, &format!("{key}.init"))?, &format!("{key}.init"))?,
                };
                crate::check::check_dist(dtype, dist).map_err(|m| self.err(&format!("{key}.init"), m))?;
                Source::Random { dtype, shape, dist }
            }
        };
        let (d, s) = match &source {
            Source::Given(h) => (h.dtype(), h.shape().to_vec()),
            Source::Random { dtype, shape, .. } | Source::Slices { dtype, shape, .. } => (*dtype, shape.clone()),
        };
        self.tensors.push((name.to_string(), d, s));
        Ok(crate::check::InputTensor { name: name.to_string(), source })
    }

    /// `slices = [{ len = "ROWS - 8", init = "randint(0, V)" }, { len = 8, init = "const(-100)" }]`
    /// (with `axis`, default 0): consecutive slices along the axis, each from its distribution.
    fn slices(
        &self,
        v: &Value,
        axis: Option<&Value>,
        key: &str,
        dtype: DType,
        shape: Vec<usize>,
        scope: &Static,
    ) -> Result<Source, SpecError> {
        let akey = format!("{key}.axis");
        let axis = match axis {
            None => 0,
            Some(a) => a.as_integer().ok_or_else(|| self.err(&akey, "expected an integer axis"))?,
        };
        let Some((a, ..)) = crate::check::split_axis(&shape, axis) else {
            return Err(self.err(&akey, format!("axis {axis} of shape {shape:?}")));
        };
        let skey = format!("{key}.slices");
        let arr = v
            .as_array()
            .filter(|a| !a.is_empty())
            .ok_or_else(|| self.err(&skey, "expected a non-empty array of `{ len = .., init = \"..\" }` tables"))?;
        let mut parts = Vec::new();
        for (i, p) in arr.iter().enumerate() {
            let k = format!("{skey}[{i}]");
            let pt = self.table(p, &k)?;
            self.only(pt, &k, &["len", "init"])?;
            let len =
                self.expr(pt.get("len").ok_or_else(|| self.err(&format!("{k}.len"), "missing: the slice's extent"))?, &format!("{k}.len"))?;
            let len = len.eval_size(scope).map_err(|e| self.err(&format!("{k}.len"), format!("`{len}`: {e}")))?;
            let init = pt.get("init").ok_or_else(|| self.err(&format!("{k}.init"), "missing: the slice's distribution"))?;
            let dist = self.dist(&self.string(init, &format!("{k}.init"))?, &format!("{k}.init"))?;
            crate::check::check_dist(dtype, dist).map_err(|m| self.err(&format!("{k}.init"), m))?;
            parts.push((len, dist));
        }
        let total: usize = parts.iter().map(|p| p.0).sum();
        if total != shape[a] {
            return Err(self.err(&skey, format!("the slices' lengths add up to {total}, axis {axis} of shape {shape:?} is {}", shape[a])));
        }
        Ok(Source::Slices { dtype, shape, axis: a, parts })
    }

    fn dist(&self, s: &str, key: &str) -> Result<Dist, SpecError> {
        let s = s.trim();
        let (f, texts) = match s.split_once('(') {
            Some((f, rest)) => {
                let inner = rest.strip_suffix(')').ok_or_else(|| self.err(key, format!("`{s}`: missing `)`")))?;
                (f.trim(), inner.split(',').map(str::trim).collect::<Vec<_>>())
            }
            None => (s, Vec::new()),
        };
        let args: Vec<f64> = texts
            .iter()
            .map(|a| a.parse::<f64>())
            .collect::<Result<_, _>>()
            .map_err(|_| self.err(key, format!("`{s}`: arguments must be numbers")))?;
        // Integer arguments as written (an f64 rounds integers above 2^53).
        let ints: Option<Vec<i64>> = texts
            .iter()
            .zip(&args)
            .map(|(t, &x)| {
                t.replace('_', "")
                    .parse::<i64>()
                    .ok()
                    .or_else(|| (x.fract() == 0.0 && x.abs() <= 9_007_199_254_740_992.0).then_some(x as i64))
            })
            .collect();
        let d = match (f, &args[..], ints.as_deref()) {
            ("normal", [], _) => Dist::default(),
            ("normal", [m, sd], _) => Dist::Normal { mean: *m, std: *sd },
            ("uniform", [], _) => Dist::Uniform { lo: -1.0, hi: 1.0 },
            ("uniform", [lo, hi], _) if !(lo.is_finite() && hi.is_finite()) => {
                return Err(self.err(key, format!("`{s}`: the bounds must be finite")));
            }
            ("uniform", [lo, hi], _) if lo < hi => Dist::Uniform { lo: *lo, hi: *hi },
            ("randint", [..], Some(&[lo, hi])) if lo < hi => Dist::RandInt { lo, hi },
            ("randint", [_, _], None) => {
                return Err(self.err(key, format!("`{s}`: randint takes integer bounds that fit 64 bits")));
            }
            ("const", [_], Some(&[c])) => Dist::ConstInt(c),
            ("const", [c], _) => Dist::Constant(*c),
            ("arange", [], _) => Dist::Arange { start: 0.0, step: 1.0 },
            ("arange", [a], _) => Dist::Arange { start: *a, step: 1.0 },
            ("arange", [a, st], _) => Dist::Arange { start: *a, step: *st },
            ("arange", [a, st, m], _) if *m != 0.0 && m.is_finite() => Dist::ArangeMod { start: *a, step: *st, modulus: *m },
            _ => {
                return Err(self.err(
                    key,
                    format!(
                        "`{s}`: expected normal, normal(mean, std), uniform(lo, hi), randint(lo, hi), const(v), arange, \
                         arange(start), arange(start, step) or arange(start, step, modulus)"
                    ),
                ))
            }
        };
        Ok(d)
    }

    /// The `[check]` keys that set what conversions see, overridden by `cli`.
    fn convert_settings(&mut self, v: Option<&Value>, cli: &ConvertSettings) -> Result<(), SpecError> {
        let t = match v {
            Some(v) => Some(self.table(v, "check")?),
            None => None,
        };
        let get = |k: &str| t.and_then(|t| t.get(k));
        let version = match (&cli.triton_version, get("triton_version")) {
            (Some(v), _) => Some(v.clone()),
            (None, Some(v)) => Some(self.string(v, "check.triton_version")?),
            (None, None) => None,
        };
        if let Some(v) = version {
            if !tilegrad_ir::triton::is_version(&v) {
                return Err(self.err("check.triton_version", format!("`{v}`: expected a version such as \"3.6.0\"")));
            }
            self.convert.triton_version = v;
        }
        if let Some(e) = get("env") {
            for (k, v) in self.table(e, "check.env")? {
                let v = self.string(v, &format!("check.env.{k}"))?;
                self.convert.env.push((k.clone(), v));
            }
        }
        self.convert.env.extend(cli.env.iter().cloned());
        match (cli.device, get("device")) {
            (Some(d), _) => self.convert.device_capability = d,
            (None, Some(v)) => {
                let s = self.string(v, "check.device")?;
                self.convert.device_capability = tilegrad_ir::triton::parse_device(&s).ok_or_else(|| {
                    self.err("check.device", format!("`{s}`: expected a compute capability such as \"sm_90\" or \"8.0\""))
                })?;
            }
            (None, None) => {}
        }
        Ok(())
    }

    fn options(&self, v: Option<&Value>) -> Result<CheckOptions, SpecError> {
        let mut o = CheckOptions::default();
        let Some(v) = v else { return Ok(o) };
        let t = self.table(v, "check")?;
        self.only(
            t,
            "check",
            &["seed", "trials", "precision", "rtol", "atol", "allow_non_finite", "strict", "triton_version", "env", "device"],
        )?;
        let int = |k: &str| -> Result<Option<u64>, SpecError> {
            t.get(k)
                .map(|v| {
                    v.as_integer()
                        .and_then(|i| u64::try_from(i).ok())
                        .ok_or_else(|| self.err(&format!("check.{k}"), "expected a non-negative integer"))
                })
                .transpose()
        };
        if let Some(s) = int("seed")? {
            o.seed = s;
        }
        if let Some(n) = int("trials")? {
            o.trials = n as usize;
        }
        if let Some(p) = t.get("precision") {
            o.precision = match self.string(p, "check.precision")?.as_str() {
                "f64" => Precision::F64,
                "native" => Precision::Native,
                s => return Err(self.err("check.precision", format!("`{s}`: expected \"f64\" or \"native\""))),
            };
        }
        let num = |k: &str| -> Result<Option<f64>, SpecError> {
            t.get(k)
                .map(|v| match v {
                    Value::Float(f) if *f >= 0.0 => Ok(*f),
                    Value::Integer(i) if *i >= 0 => Ok(*i as f64),
                    _ => Err(self.err(&format!("check.{k}"), "expected a non-negative number")),
                })
                .transpose()
        };
        if let Some(v) = t.get("allow_non_finite") {
            o.allow_non_finite = v.as_bool().ok_or_else(|| self.err("check.allow_non_finite", "expected true or false"))?;
        }
        if let Some(v) = t.get("strict") {
            o.strict = v.as_bool().ok_or_else(|| self.err("check.strict", "expected true or false"))?;
        }
        match (num("rtol")?, num("atol")?) {
            (Some(rtol), Some(atol)) => o.tolerance = Some(Tolerance { rtol, atol }),
            (None, None) => {}
            _ => return Err(self.err("check", "give both rtol and atol, or neither")),
        }
        Ok(o)
    }

    fn steps(&mut self, v: Option<&Value>, key: &str, constants: &[(String, Scalar)]) -> Result<Vec<Step>, SpecError> {
        let Some(v) = v else { return Ok(Vec::new()) };
        let a = v.as_array().ok_or_else(|| self.err(key, format!("expected an array of step tables, found {}", v.type_str())))?;
        let mut out = Vec::new();
        for (i, s) in a.iter().enumerate() {
            let key = format!("{key}[{i}]");
            let t = self.table(s, &key)?;
            let kinds: Vec<&str> = STEP_KINDS.into_iter().filter(|k| t.contains_key(*k)).collect();
            // The constants, and the host scalars of earlier `item` steps (stand-ins).
            let all: Vec<(String, Scalar)> = constants.iter().cloned().chain(self.items.iter().map(|(n, v, _)| (n.clone(), *v))).collect();
            let constants = &all[..];
            let step = match kinds[..] {
                ["alloc"] => self.alloc(t, &key, constants)?,
                ["launch"] => self.launch(t, &key, constants)?,
                ["compute"] => self.compute(t, &key, constants)?,
                ["accumulate"] => self.accumulate(t, &key)?,
                ["chunk"] => self.chunk(t, &key)?,
                ["slice"] => self.slice(t, &key, constants)?,
                ["cat"] => self.cat(t, &key)?,
                ["item"] => self.item(t, &key, constants)?,
                [kind] => self.host(t, kind, &key, constants)?,
                _ => return Err(self.err(&key, format!("a step has exactly one of {}", STEP_KINDS.join(", ")))),
            };
            self.spread_taint(&step);
            out.push(step);
        }
        Ok(out)
    }

    fn alloc(&mut self, t: &Table, key: &str, constants: &[(String, Scalar)]) -> Result<Step, SpecError> {
        self.only(t, key, &["alloc", "shape", "dtype", "init", "like"])?;
        let name = self.string(&t["alloc"], &format!("{key}.alloc"))?;
        let (shape, dtype) = match t.get("like") {
            Some(l) => {
                let l = self.string(l, &format!("{key}.like"))?;
                let (d, s) = self.known(&l, &format!("{key}.like"))?;
                if t.contains_key("shape") {
                    return Err(self.err(key, "give `like` or `shape`, not both"));
                }
                let d = if t.contains_key("dtype") { self.dtype(t.get("dtype"), &format!("{key}.dtype"))? } else { d };
                (s.iter().map(|&x| Expr::from(x as i64)).collect::<Vec<_>>(), d)
            }
            None => {
                let sv = t.get("shape").ok_or_else(|| self.err(&format!("{key}.shape"), "missing (or give `like`)"))?;
                (self.exprs(sv, &format!("{key}.shape"))?, self.dtype(t.get("dtype"), &format!("{key}.dtype"))?)
            }
        };
        let init = match t.get("init").map(|v| self.string(v, &format!("{key}.init"))).transpose()?.as_deref() {
            None | Some("empty") => Init::Empty,
            Some("zeros") => Init::Zeros,
            Some(s) => return Err(self.err(&format!("{key}.init"), format!("`{s}`: expected \"empty\" or \"zeros\""))),
        };
        self.fixed(&shape, &format!("{key}.shape"), "a shape")?;
        let scope = Static { constants, tensors: &self.tensors };
        let sh = crate::check::steps_eval_shape(&shape, &scope).map_err(|m| self.err(&format!("{key}.shape"), m))?;
        tilegrad_reference::check_alloc(dtype, &sh).map_err(|e| self.err(&format!("{key}.shape"), e.to_string()))?;
        self.define(&name, dtype, sh, key)?;
        Ok(Step::Alloc { name, shape, dtype, init })
    }

    /// The dtype and shape of a tensor defined so far.
    fn known(&self, name: &str, key: &str) -> Result<(DType, Vec<usize>), SpecError> {
        let found = self.tensors.iter().find(|(n, ..)| n == name);
        found.map(|(_, d, s)| (*d, s.clone())).ok_or_else(|| self.err(key, format!("no tensor `{name}` here")))
    }

    fn define(&mut self, name: &str, dtype: DType, shape: Vec<usize>, key: &str) -> Result<(), SpecError> {
        if self.tensors.iter().any(|(n, ..)| n == name) {
            return Err(self.err(key, format!("tensor `{name}` is already defined")));
        }
        if self.items.iter().any(|(n, ..)| n == name) {
            return Err(self.err(key, format!("`{name}` is already defined (by an `item` step)")));
        }
        self.tensors.push((name.to_string(), dtype, shape));
        Ok(())
    }

    /// The `into` key of a step: the tensor it makes (or updates).
    fn target(&self, t: &Table, key: &str) -> Result<String, SpecError> {
        self.string(
            t.get("into").ok_or_else(|| self.err(&format!("{key}.into"), "missing: the new tensor's name"))?,
            &format!("{key}.into"),
        )
    }

    /// `{ compute = "EXPR", into = "t", dtype = "f16" }`: an elementwise expression.
    fn compute(&mut self, t: &Table, key: &str, constants: &[(String, Scalar)]) -> Result<Step, SpecError> {
        self.only(t, key, &["compute", "dtype", "into"])?;
        let ekey = format!("{key}.compute");
        let text = self.string(&t["compute"], &ekey)?;
        let dst = self.target(t, key)?;
        let expr = TensorExpr::parse(&text).map_err(|e| self.err(&ekey, format!("`{text}`: {e}")))?;
        let lookup = |n: &str| match self.tensors.iter().find(|(x, ..)| x == n) {
            Some((_, d, s)) => Some(Operand::Tensor(*d, s.clone())),
            None => constants.iter().find(|(c, _)| c == n).map(|(_, v)| Operand::Scalar(*v)),
        };
        let typed = expr.check(&lookup).map_err(|e| self.err(&ekey, format!("`{text}`: {e}")))?;
        let dtype = match t.get("dtype") {
            Some(v) => Some(self.dtype(Some(v), &format!("{key}.dtype"))?),
            None => None,
        };
        self.define(&dst, dtype.unwrap_or(typed.dtype), typed.shape, &format!("{key}.into"))?;
        Ok(Step::Compute { expr, dtype, dst })
    }

    /// `{ accumulate = "src", into = "dst" }`: `dst += src` in place.
    fn accumulate(&mut self, t: &Table, key: &str) -> Result<Step, SpecError> {
        self.only(t, key, &["accumulate", "into"])?;
        let skey = format!("{key}.accumulate");
        let src = self.string(&t["accumulate"], &skey)?;
        let dst = self.target(t, key)?;
        let (sd, ss) = self.known(&src, &skey)?;
        let (dd, ds) = self
            .known(&dst, &format!("{key}.into"))
            .map_err(|e| self.err(&e.key, format!("{} (`into` of `accumulate` names an existing tensor, updated in place)", e.message)))?;
        if broadcast(&ss, &ds).as_deref() != Some(&ds[..]) {
            return Err(self.err(&skey, format!("`{src}` of shape {ss:?} does not broadcast to `{dst}` of shape {ds:?}")));
        }
        if !crate::check::can_accumulate(sd, dd) {
            return Err(self.err(&skey, format!("cannot add `{src}` ({sd}) into `{dst}` ({dd}) in place")));
        }
        Ok(Step::Accumulate { src, dst })
    }

    fn host(&mut self, t: &Table, kind: &str, key: &str, constants: &[(String, Scalar)]) -> Result<Step, SpecError> {
        let extra: &[&str] = match kind {
            "sum" | "mean" | "logsumexp" | "max" => &["axis", "into"],
            "reshape" => &["shape", "into"],
            "cast" => &["dtype", "into"],
            _ => &["by", "into"],
        };
        self.only(t, key, &[&[kind], extra].concat())?;
        let src = self.string(&t[kind], &format!("{key}.{kind}"))?;
        let dst = self.target(t, key)?;
        let (d, s) = self.known(&src, &format!("{key}.{kind}"))?;
        let scope = Static { constants, tensors: &self.tensors };
        let (step, shape, d) = match kind {
            "sum" | "mean" | "logsumexp" | "max" => {
                let axis = t
                    .get("axis")
                    .and_then(Value::as_integer)
                    .ok_or_else(|| self.err(&format!("{key}.axis"), "expected an integer axis"))?;
                let Some((a, ..)) = crate::check::split_axis(&s, axis) else {
                    return Err(self.err(&format!("{key}.axis"), format!("axis {axis} of `{src}`, which has shape {s:?}")));
                };
                let mut ns = s.clone();
                ns.remove(a);
                let op = match kind {
                    "sum" => return self.define(&dst, d, ns, &format!("{key}.into")).map(|_| Step::Sum { src, axis, dst }),
                    "mean" => Reduction::Mean,
                    "logsumexp" => Reduction::LogSumExp,
                    _ => Reduction::Max,
                };
                if op.needs_float() && !d.is_float() {
                    return Err(self.err(&format!("{key}.{kind}"), format!("`{src}` is {d}: {kind} needs a float tensor (cast it first)")));
                }
                (Step::Reduce { op, src, axis, dst: dst.clone() }, ns, d)
            }
            "cast" => {
                let dv = t.get("dtype").ok_or_else(|| self.err(&format!("{key}.dtype"), "missing: the new dtype"))?;
                let dtype = self.dtype(Some(dv), &format!("{key}.dtype"))?;
                (Step::Cast { src, dtype, dst: dst.clone() }, s, dtype)
            }
            "reshape" => {
                let shape =
                    self.exprs(t.get("shape").ok_or_else(|| self.err(&format!("{key}.shape"), "missing"))?, &format!("{key}.shape"))?;
                self.fixed(&shape, &format!("{key}.shape"), "a shape")?;
                let ns = crate::check::steps_eval_shape(&shape, &scope).map_err(|m| self.err(&format!("{key}.shape"), m))?;
                if ns.iter().product::<usize>() != s.iter().product::<usize>() {
                    return Err(self.err(&format!("{key}.shape"), format!("cannot reshape `{src}` of shape {s:?} to {ns:?}")));
                }
                (Step::Reshape { src, shape, dst: dst.clone() }, ns, d)
            }
            _ => {
                let by =
                    self.expr(t.get("by").ok_or_else(|| self.err(&format!("{key}.by"), "missing: the factor"))?, &format!("{key}.by"))?;
                if self.dependent(&by).is_none() {
                    by.eval(&scope).map_err(|e| self.err(&format!("{key}.by"), format!("`{by}`: {e}")))?;
                }
                (Step::Scale { src, factor: by, dst: dst.clone() }, s, d)
            }
        };
        self.define(&dst, d, shape, &format!("{key}.into"))?;
        Ok(step)
    }

    /// A host-built tensor descriptor argument, `descriptor(t, [B0, B1, ...])` (what
    /// `TensorDescriptor.from_tensor(t, block_shape)` passes): the descriptor and the launch
    /// arguments it stands for (the tensor, then its shape and strides).
    fn descriptor_arg(
        &self,
        n: &str,
        rest: &str,
        key: &str,
        constants: &[(String, Scalar)],
    ) -> Result<(HostDescriptor, Vec<(String, Expr)>), SpecError> {
        let usage = "expected `descriptor(TENSOR, [BLOCK0, BLOCK1, ...])`";
        let body = rest.trim_end().strip_suffix(')').ok_or_else(|| self.err(key, usage))?;
        let (tn, blocks) = body.split_once(',').ok_or_else(|| self.err(key, usage))?;
        let tn = tn.trim();
        let blocks = blocks.trim().strip_prefix('[').and_then(|b| b.strip_suffix(']')).ok_or_else(|| self.err(key, usage))?;
        let (_, dtype, shape) = self
            .tensors
            .iter()
            .find(|(x, ..)| x == tn)
            .ok_or_else(|| self.err(key, format!("no tensor `{tn}` is defined before this launch")))?
            .clone();
        let scope = Static { constants, tensors: &self.tensors };
        let mut block_shape = Vec::new();
        for b in blocks.split(',').map(str::trim).filter(|b| !b.is_empty()) {
            let e = Expr::parse(b).map_err(|e| self.err(key, format!("`{b}`: {e}")))?;
            let v = e.eval_int(&scope).map_err(|e| self.err(key, format!("`{b}`: {e}")))?;
            if v <= 0 {
                return Err(self.err(key, format!("block dims must be positive, `{b}` is {v}")));
            }
            block_shape.push(v as usize);
        }
        if block_shape.len() != shape.len() {
            return Err(self.err(key, format!("`{tn}` has rank {} but the block shape has {} dims", shape.len(), block_shape.len())));
        }
        let mut args = vec![(n.to_string(), Expr::parse(tn).map_err(|e| self.err(key, e.to_string()))?)];
        for (i, &d) in shape.iter().enumerate() {
            args.push((HostDescriptor::shape_param(n, i), Expr::from(d as i64)));
            let st = Expr::parse(&format!("{tn}.stride({i})")).map_err(|e| self.err(key, e.to_string()))?;
            args.push((HostDescriptor::stride_param(n, i), st));
        }
        Ok((HostDescriptor { dtype, block_shape }, args))
    }

    fn launch(&mut self, t: &Table, key: &str, constants: &[(String, Scalar)]) -> Result<Step, SpecError> {
        self.only(t, key, &["launch", "grid", "args"])?;
        let kname = self.string(&t["launch"], &format!("{key}.launch"))?;
        let kr = self.kernels.get(&kname).cloned().ok_or_else(|| {
            let mut keys: Vec<&String> = self.kernels.keys().collect();
            keys.sort();
            self.err(&format!("{key}.launch"), format!("no kernel `{kname}` in [kernels] (kernels: {keys:?})"))
        })?;
        let grid = self.exprs(t.get("grid").ok_or_else(|| self.err(&format!("{key}.grid"), "missing"))?, &format!("{key}.grid"))?;
        if grid.is_empty() || grid.len() > 3 {
            return Err(self.err(&format!("{key}.grid"), format!("a grid has 1 to 3 axes, got {}", grid.len())));
        }
        let mut args = Vec::new();
        let mut descs: Vec<(String, HostDescriptor)> = Vec::new();
        // Constexprs bound to values that exist only at conversion (strings, None, dtypes).
        let mut compile_only: Vec<(String, ConstValue)> = Vec::new();
        if let Some(a) = t.get("args") {
            for (n, v) in self.table(a, &format!("{key}.args"))? {
                if let Some(d) = v.as_str().and_then(|s| s.trim().strip_prefix("descriptor(")) {
                    let (hd, more) = self.descriptor_arg(n, d, &format!("{key}.args.{n}"), constants)?;
                    descs.push((n.clone(), hd));
                    args.extend(more);
                    continue;
                }
                if let Some(c) = v.as_str().and_then(ConstValue::parse).filter(|c| !c.is_number()) {
                    compile_only.push((n.clone(), c));
                    continue;
                }
                args.push((n.clone(), self.expr(v, &format!("{key}.args.{n}"))?));
            }
        }
        if !compile_only.is_empty() && matches!(kr, KernelRef::Text(_)) {
            return Err(
                self.err(&format!("{key}.args.{}", compile_only[0].0), "strings, None and dtypes bind constexprs of Triton kernels only")
            );
        }
        let scope = Static { constants, tensors: &self.tensors };
        for e in grid.iter().filter(|e| self.dependent(e).is_none()) {
            e.eval_int(&scope).map_err(|err| self.err(&format!("{key}.grid"), format!("`{e}`: {err}")))?;
        }
        let kernel = match kr {
            KernelRef::Text(_) if !descs.is_empty() => {
                return Err(self.err(&format!("{key}.args.{}", descs[0].0), "descriptor arguments need a Triton kernel (FILE.py::NAME)"))
            }
            KernelRef::Text(k) => k,
            KernelRef::Triton { file, name, config, jit } => {
                let mut ptrs = Vec::new();
                let mut consts: Vec<(String, ConstValue)> = config.iter().map(|(n, v)| (n.clone(), ConstValue::Int(*v))).collect();
                consts.extend(compile_only.iter().cloned());
                let mut scalars = Vec::new();
                for (n, e) in &args {
                    if descs.iter().any(|(dn, hd)| {
                        (0..hd.block_shape.len())
                            .any(|i| *n == HostDescriptor::shape_param(dn, i) || *n == HostDescriptor::stride_param(dn, i))
                    }) {
                        scalars.push((n.clone(), DType::I64));
                        continue;
                    }
                    if let Some((_, d, _)) = e.as_name().and_then(|tn| self.tensors.iter().find(|(x, ..)| x == tn)) {
                        ptrs.push((n.clone(), *d));
                        continue;
                    }
                    if let Some(d) = self.runtime_arg(e, n, &file, &name, &format!("{key}.args.{n}"), &scope)? {
                        scalars.push((n.clone(), d));
                        continue;
                    }
                    match e.eval(&scope) {
                        Ok(Scalar::Int(i)) => {
                            if let Some((_, c)) = config.iter().find(|(cn, _)| cn == n) {
                                if *c != i {
                                    return Err(self
                                        .err(&format!("{key}.args.{n}"), format!("{i}, but the kernel's autotune config sets {n} = {c}")));
                                }
                                continue;
                            }
                            consts.push((n.clone(), ConstValue::Int(i)));
                            if i32::try_from(i).is_err() {
                                scalars.push((n.clone(), DType::I64));
                            }
                        }
                        Ok(Scalar::Float(x)) => {
                            consts.push((n.clone(), ConstValue::Float(x)));
                            scalars.push((n.clone(), DType::F32));
                        }
                        Err(err) => {
                            let hint = if e.as_name().is_some() {
                                " (a string constexpr is written quoted: `'mean'`; a dtype as `tl.float16`)"
                            } else {
                                ""
                            };
                            return Err(self.err(&format!("{key}.args.{n}"), format!("`{e}`: {err}{hint}")));
                        }
                    }
                }
                let ck: ConvertKey = (format!("{}::{name}", file.display()), consts.clone(), ptrs.clone(), scalars.clone(), descs.clone());
                match self.cache.iter().find(|(k, _)| *k == ck) {
                    Some((_, k)) => k.clone(),
                    None => {
                        let opts = ConvertOptions {
                            constexprs: consts,
                            pointer_dtypes: ptrs,
                            scalar_dtypes: scalars,
                            descriptors: descs,
                            assume_jit: jit,
                            ..self.convert.clone()
                        };
                        let src = &self.sources[&file];
                        let params = tilegrad_ir::triton::parameters(src, &file.display().to_string(), &name)
                            .map_err(|e| self.err(&format!("{key}.launch"), format!("kernel `{kname}`: {e}")))?;
                        for (n, v) in &compile_only {
                            // `None` may be passed for any parameter (an optional pointer).
                            if !params.iter().any(|(p, c)| p == n && (*c || *v == ConstValue::None)) {
                                return Err(self.err(
                                    &format!("{key}.args.{n}"),
                                    format!("kernel `{name}` has no constexpr parameter `{n}` to bind to a string or a dtype (nor any parameter `{n}` for None)"),
                                ));
                            }
                        }
                        let (k, notes) = convert_noted(src, &file.display().to_string(), &name, &opts)
                            .map_err(|e| self.err(&format!("{key}.launch"), format!("kernel `{kname}`: {e}")))?;
                        for n in notes.iter().map(|n| n.to_string()) {
                            if !self.notes.contains(&n) {
                                self.notes.push(n);
                            }
                        }
                        let k = Arc::new(k);
                        self.cache.push((ck, k.clone()));
                        k
                    }
                }
            }
        };
        for (n, _) in &args {
            if kernel.param(n).is_none() {
                let ps: Vec<&str> = kernel.params.iter().map(|p| p.name.as_str()).collect();
                return Err(self.err(
                    &format!("{key}.args.{n}"),
                    format!("kernel `{}` has no parameter `{n}` (parameters: {})", kernel.name, ps.join(", ")),
                ));
            }
        }
        for (n, e) in &args {
            let constexpr = kernel.param(n).is_some_and(|p| matches!(p.kind, tilegrad_ir::ParamKind::Constexpr(..)));
            if let (true, Some(item)) = (constexpr, self.dependent(e)) {
                return Err(self.err(
                    &format!("{key}.args.{n}"),
                    format!("`{e}` uses `{item}`, which an `item` step computes from data: it cannot bind the constexpr `{n}`"),
                ));
            }
        }
        for p in &kernel.params {
            let given = args.iter().any(|(n, _)| *n == p.name);
            if !given && !matches!(p.kind, tilegrad_ir::ParamKind::Constexpr(..)) {
                return Err(self.err(&format!("{key}.args"), format!("missing argument `{}` of kernel `{}`", p.name, kernel.name)));
            }
        }
        Ok(Step::Launch(KernelLaunch { kernel, grid, args }))
    }
}
