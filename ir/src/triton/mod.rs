//! The Triton front end: reads `@triton.jit` Python source (parsed with `ruff_python_parser`, never
//! executed) and converts one kernel to the tile IR by driving the [`KernelBuilder`](crate::KernelBuilder), which applies
//! Triton's surface rules (broadcasting, promotion, pointer arithmetic, block pointers).
//!
//! Parameters of the kernel become IR parameters in order:
//!
//! - annotated `tl.constexpr`: a constexpr, bound from [`ConvertOptions::constexprs`] (or the
//!   parameter's default value in the source); a constexpr with neither is an error naming it.
//!   Ints, bools and floats stay IR constexpr parameters; strings, `None` and dtypes
//!   ([`ConstValue`]) exist only at conversion, where comparisons on them fold as Triton folds
//!   them (`if ACTIVATION == "leaky_relu":`, `if X_dtype == tl.float16:`);
//! - named in [`ConvertOptions::pointer_dtypes`], or whose name ends in `ptr` (`x_ptr`, `Xptr`): a
//!   pointer to elements of that dtype ([`ConvertOptions::default_pointer_dtype`], f32, otherwise);
//! - anything else: a runtime scalar, of the dtype named in [`ConvertOptions::scalar_dtypes`] or
//!   [`ConvertOptions::default_scalar_dtype`] (i32).
//!
//! Every op carries the Python file:line:column of the expression that produced it. Anything the
//! front end does not support, or that Triton rejects, is an [`IrError::Parse`] at line:column
//! naming the construct; shape and type errors found by the builder are an [`IrError::Invalid`]
//! whose diagnostics carry the Python location.
//!
//! Loops: `range`/`tl.range` are IR loops; every variable defined before the loop and assigned in
//! its body is carried (a block pointer is carried through its offsets). `tl.static_range` is
//! unrolled. `if` on a compile-time constant converts only the branch taken; `if` on a scalar
//! tensor is an IR `if` whose results are the variables assigned in it (defined before it, or in
//! both branches); an `if` with a `return` in a branch (outside loops) takes the rest of its
//! block into each branch that does not return, so an early `return` ends the function on that
//! path. A conditional expression (`a if c else b`) evaluates one side, as Python and Triton do:
//! on a constant only that side is converted, on a scalar tensor it is an IR `if` whose branches
//! each compute one side (both of one type, as Triton requires; a tile condition is an error, as
//! in Triton). Helper `@triton.jit` functions are inlined.
//!
//! Kernels are the functions under a `triton.jit` decorator or bound to a `triton.jit(fn)` call
//! (possibly inside `triton.heuristics(...)(...)`/`triton.autotune(...)(...)`), or any function
//! when [`ConvertOptions::assume_jit`] says so. A file's top level is run as Python imports it: a
//! later binding of a name replaces an earlier one, and a module-level `if`/`try` takes the branch
//! Python takes for the program's Triton version, environment and device
//! ([`ConvertOptions::triton_version`], [`ConvertOptions::env`],
//! [`ConvertOptions::device_capability`]); a condition that cannot be decided is read as false,
//! and each name it binds that the kernel uses gets a [`Note`] ([`convert_noted`]). `from .utils
//! import helper` and the like are followed to the `.py` files beside the kernel's `file`, whose
//! helpers convert with their own locations. Where the running program says what a module-level
//! name is ([`ConvertOptions::globals`], which the Python package reads from the imported
//! modules), that binding is taken instead of the file's own reading, and never noted.
//!
//! Tensor descriptors (Triton 3.9 replaced block pointers with them):
//! `desc = tl.make_tensor_descriptor(base, shape=[...], strides=[...], block_shape=[...])` (also
//! positional) names a strided view with a constant block shape; the last stride must be 1 when it
//! is a constant. `desc.load([off0, ...])` (or `tl.load_tensor_descriptor(desc, offsets)`) reads
//! the block at those element offsets, zero where an index is outside `0 <= idx < shape` in any
//! dim; `desc.store([off0, ...], value)` (or `tl.store_tensor_descriptor`) writes the in-bounds
//! elements only. Each access lowers like a block pointer at those offsets with every dim
//! boundary-checked. A descriptor made before a loop can be used inside it; one reassigned inside a
//! loop or a tensor `if` is carried (base, shape and strides; the block shape must not change).
//!
//! ```
//! use tilegrad_ir::triton::{convert, ConvertOptions};
//! let src = r#"
//! import triton
//! import triton.language as tl
//!
//! @triton.jit
//! def copy(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
//!     offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
//!     mask = offs < n
//!     tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)
//! "#;
//! let k = convert(src, "copy.py", "copy", &ConvertOptions::with_constexprs(&[("BLOCK", 128)])).unwrap();
//! assert_eq!(k.params.len(), 4);
//! ```

mod atomics;
mod autotune;
mod builtins;
mod convert;
mod errors;
mod facts;
mod globals;
mod imports;
mod nesting;
mod random;
mod scan;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_bindings;
#[cfg(test)]
mod tests_globals;
#[cfg(test)]
mod tests_random;
#[cfg(test)]
mod tests_surface;
mod value;

use crate::{DType, IrError, Kernel, Loc, ParseError};
use errors::{fail, Lines};
pub use facts::{is_version, parse_device};
pub use globals::{GlobalBinding, GlobalFact};
pub use imports::{triton_dtype_name, ConstValue};
use imports::{Import, SourceFile};
use ruff_python_ast::{Expr, Stmt, StmtFunctionDef};
use ruff_text_size::Ranged;
use std::collections::HashMap;
use value::Val;

/// How to bind the parameters of a converted kernel (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct ConvertOptions {
    /// Values of the constexpr parameters (and of constexprs the source defaults otherwise): ints,
    /// floats, bools, strings, `None` or dtypes, folded at conversion as Triton does.
    pub constexprs: Vec<(String, ConstValue)>,
    /// Element dtypes of pointer parameters, by name; a parameter named here is a pointer.
    pub pointer_dtypes: Vec<(String, DType)>,
    /// The element dtype of other pointer parameters (names ending in `ptr`).
    pub default_pointer_dtype: DType,
    /// Dtypes of runtime scalar parameters, by name.
    pub scalar_dtypes: Vec<(String, DType)>,
    /// The dtype of other runtime scalar parameters.
    pub default_scalar_dtype: DType,
    /// Parameters that are tensor descriptors built on the host
    /// (`TensorDescriptor.from_tensor(t, block_shape)`), by name; see [`HostDescriptor`].
    pub descriptors: Vec<(String, HostDescriptor)>,
    /// Take the named function (and the helpers it calls) as Triton functions even when no
    /// `triton.jit` form is recognised on them (a third-party decorator that wraps `triton.jit`).
    pub assume_jit: bool,
    /// The pointer dtypes are those of an f64-promoted run (the Python package's ground truth,
    /// whose host code promotes every float tensor): a dtype the kernel names for what it reads
    /// through a descriptor is then taken as read in f64.
    pub promoted: bool,
    /// `triton.__version__` of the program, for module-level version checks
    /// ([`DEFAULT_TRITON_VERSION`] by default).
    pub triton_version: String,
    /// The program's environment variables, for module-level `os.environ` reads (none set by
    /// default: each read gets its default).
    pub env: Vec<(String, String)>,
    /// `torch.cuda.get_device_capability()` of the program's device ((9, 0), an sm_90, by
    /// default; see [`parse_device`]).
    pub device_capability: (u32, u32),
    /// What module-level names of the kernel's files are in the running program (none by
    /// default): each is taken over the conversion's own reading of its file's top level.
    pub globals: Vec<GlobalBinding>,
}

/// The newest Triton release tilegrad follows: the version module-level checks are decided
/// against unless [`ConvertOptions::triton_version`] says otherwise.
pub const DEFAULT_TRITON_VERSION: &str = "3.6.0";

/// Something a conversion assumed: a module-level binding it could not decide as the program
/// would (see [`convert_noted`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Where the assumption was made.
    pub loc: Loc,
    /// What was assumed.
    pub message: String,
}

impl std::fmt::Display for Note {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.loc, self.message)
    }
}

/// A tensor descriptor built on the host and passed as a kernel argument. In the kernel it is
/// used as `tl.make_tensor_descriptor` results are (`desc.load([offs])`, `desc.store([offs], v)`,
/// and the older `tl._experimental_descriptor_load/store`). The IR kernel takes it as a pointer
/// parameter of the parameter's own name and one i64 scalar parameter per dim for the shape
/// and for the strides, named by [`HostDescriptor::shape_param`] and
/// [`HostDescriptor::stride_param`]; a launcher binds them from the tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostDescriptor {
    /// The tensor's element dtype.
    pub dtype: DType,
    /// The block shape; its length is the tensor's rank.
    pub block_shape: Vec<usize>,
}

impl HostDescriptor {
    /// The name of the scalar parameter holding the size of dim `i` of descriptor `name`.
    pub fn shape_param(name: &str, i: usize) -> String {
        format!("{name}__shape{i}")
    }

    /// The name of the scalar parameter holding the stride (in elements) of dim `i`.
    pub fn stride_param(name: &str, i: usize) -> String {
        format!("{name}__stride{i}")
    }
}

impl Default for ConvertOptions {
    fn default() -> ConvertOptions {
        ConvertOptions {
            constexprs: Vec::new(),
            pointer_dtypes: Vec::new(),
            default_pointer_dtype: DType::F32,
            scalar_dtypes: Vec::new(),
            default_scalar_dtype: DType::I32,
            descriptors: Vec::new(),
            assume_jit: false,
            promoted: false,
            triton_version: DEFAULT_TRITON_VERSION.to_string(),
            env: Vec::new(),
            device_capability: (9, 0),
            globals: Vec::new(),
        }
    }
}

impl ConvertOptions {
    /// The defaults with these (integer) constexpr bindings.
    pub fn with_constexprs(constexprs: &[(&str, i64)]) -> ConvertOptions {
        ConvertOptions {
            constexprs: constexprs.iter().map(|&(n, v)| (n.to_string(), ConstValue::Int(v))).collect(),
            ..ConvertOptions::default()
        }
    }

    /// Binds one more constexpr (replacing an earlier binding of the name).
    pub fn bind(mut self, name: &str, value: impl Into<ConstValue>) -> ConvertOptions {
        self.constexprs.retain(|(n, _)| n != name);
        self.constexprs.push((name.to_string(), value.into()));
        self
    }
}

/// The parsed files of one conversion: the kernel's own (index 0) and those its imports lead to.
struct Program {
    files: Vec<SourceFile>,
}

impl Program {
    /// The kernel's file, the files its imports lead to, and those defining the jit functions
    /// that `globals` name.
    fn load(source: &str, file: &str, globals: &[GlobalBinding]) -> Result<Program, IrError> {
        Ok(Program { files: imports::load(source, file, &globals::files(globals))? })
    }

    /// Scans every file. Files that others import come later, so they are scanned from the last:
    /// a module-level condition on a name imported from another file sees its value; a second
    /// round catches what the first could not see. The running program's `globals` then replace
    /// what the scans made of the names they give.
    fn modules(&self, facts: &facts::Facts, globals: &[GlobalBinding]) -> Result<Vec<Module<'_>>, IrError> {
        let n = self.files.len();
        let mut exports: scan::Exports = vec![HashMap::new(); n];
        let mut mods: Vec<Option<Module<'_>>> = (0..n).map(|_| None).collect();
        for _round in 0..2 {
            for i in (0..n).rev() {
                let f = &self.files[i];
                let m = scan::Scanner::new(&f.lines, facts, &exports, &f.links, true).run(&f.suite).map_err(|e| f.lines.error(e))?;
                exports[i] = m.known.clone();
                mods[i] = Some(m);
            }
        }
        let mut mods: Vec<Module<'_>> = mods.into_iter().flatten().collect();
        globals::apply(&self.files, &mut mods, globals);
        Ok(mods)
    }
}

/// Converts the `@triton.jit` function `kernel` of the Python `source` (from `file`, used in
/// locations and errors, and to find the modules beside it that the source imports) to an IR
/// kernel.
pub fn convert(source: &str, file: &str, kernel: &str, options: &ConvertOptions) -> Result<Kernel, IrError> {
    convert_noted(source, file, kernel, options).map(|(k, _)| k)
}

/// [`convert`], with the notes of what the conversion assumed: each module-level name the kernel
/// uses whose binding depends on a condition not decided at conversion (see
/// [`ConvertOptions::triton_version`], [`ConvertOptions::env`],
/// [`ConvertOptions::device_capability`]) and that [`ConvertOptions::globals`] does not give,
/// with the binding taken and where.
pub fn convert_noted(source: &str, file: &str, kernel: &str, options: &ConvertOptions) -> Result<(Kernel, Vec<Note>), IrError> {
    let prog = Program::load(source, file, &options.globals)?;
    let mods = prog.modules(&facts::Facts::of(options), &options.globals)?;
    let f = lookup(&mods, kernel, options.assume_jit)?;
    convert::convert_kernel(&mods, f, kernel, options)
}

/// Checks that `kernel` names a function of `source` that converts as a kernel (a recognised
/// `triton.jit` form, or any function when `assume_jit`), with the error [`convert`] gives
/// otherwise.
pub fn find_kernel(source: &str, file: &str, kernel: &str, assume_jit: bool) -> Result<(), IrError> {
    let prog = Program::load(source, file, &[])?;
    let mods = prog.modules(&facts::Facts::default(), &[])?;
    lookup(&mods, kernel, assume_jit).map(|_| ())
}

/// The parameters of function `kernel` of `source` in order, each with whether it is annotated
/// `tl.constexpr`.
pub fn parameters(source: &str, file: &str, kernel: &str) -> Result<Vec<(String, bool)>, IrError> {
    let prog = Program::load(source, file, &[])?;
    let mods = prog.modules(&facts::Facts::default(), &[])?;
    let f = lookup(&mods, kernel, true)?;
    let p = &f.parameters;
    Ok(p.posonlyargs
        .iter()
        .chain(&p.args)
        .chain(&p.kwonlyargs)
        .map(|pw| {
            let c = pw.parameter.annotation.as_deref().and_then(dotted).is_some_and(|d| d == "constexpr" || d.ends_with(".constexpr"));
            (pw.parameter.name.id.to_string(), c)
        })
        .collect())
}

/// The function `kernel` names in the kernel's file (`mods[0]`), or the error saying why it is
/// not a kernel.
fn lookup<'a>(mods: &[Module<'a>], kernel: &str, assume_jit: bool) -> Result<&'a StmtFunctionDef, IrError> {
    let m = &mods[0];
    let lines = m.lines;
    let Some(&f) = m.funcs.get(kernel) else {
        if let Some((at, callee)) = m.unknown_forms.get(kernel) {
            return Err(lines.error(errors::Fail {
                off: *at,
                message: format!(
                    "`{kernel}` is bound to `{callee}(...)`, which is not a recognised form of `triton.jit`: name the function \
                     it wraps instead and mark it as a kernel (`jit = true` in the spec's kernel table, `--jit` for `tilegrad ir`)"
                ),
            }));
        }
        let names = m.jit.join(", ");
        let mut others: Vec<&str> = m.funcs.keys().filter(|n| !m.jit.contains(n)).map(|s| s.as_str()).collect();
        others.sort();
        let others = if others.is_empty() { String::new() } else { format!("; other functions: {}", others.join(", ")) };
        return Err(lines.error(errors::Fail {
            off: 0,
            message: format!("no `@triton.jit` function named `{kernel}` in this file (found: {names}{others})"),
        }));
    };
    if !assume_jit && !m.jit.iter().any(|n| n == kernel) {
        let decs: Vec<String> =
            f.decorator_list.iter().filter_map(|d| dotted(strip_call(&d.expression))).map(|d| format!("@{d}")).collect();
        let has = if decs.is_empty() { "no decorator".to_string() } else { format!("only {}", decs.join(", ")) };
        return Err(lines.error(errors::Fail {
            off: f.name.range.start().to_u32(),
            message: format!(
                "`{kernel}` is not a `@triton.jit` function (it has {has}); if a decorator wraps `triton.jit`, take the function \
                 as a kernel with `jit = true` in the spec's kernel table (`--jit` for `tilegrad ir`)"
            ),
        }));
    }
    Ok(f)
}

/// The names of the `@triton.jit` functions of `source`, in order (decorated, or made by
/// `name = triton.jit(fn)` and the like).
pub fn kernels(source: &str, file: &str) -> Result<Vec<String>, IrError> {
    let lines = Lines::new(file, source);
    let suite = parse(source, &lines)?;
    let module = Module::scan_alone(&suite, &lines)?;
    Ok(module.jit)
}

/// The constexpr bindings of each `triton.Config` of `kernel`'s `@triton.autotune` decorator (or
/// of a `triton.autotune(...)(...)` call wrapping it), in order (empty when it has none). A check
/// picks one by index; its values are constexprs of the conversion.
pub fn autotune_configs(source: &str, file: &str, kernel: &str) -> Result<Vec<Vec<(String, i64)>>, IrError> {
    let lines = Lines::new(file, source);
    let suite = parse(source, &lines)?;
    let module = Module::scan_alone(&suite, &lines)?;
    let Some(decs) = module.decorators.get(kernel) else {
        return Err(lines.error(errors::Fail { off: 0, message: format!("no function named `{kernel}` in this file") }));
    };
    autotune::configs(&module, decs).map_err(|f| lines.error(f))
}

pub(crate) fn parse(source: &str, lines: &Lines) -> Result<Vec<Stmt>, IrError> {
    let parsed = nesting::parse_module(source).map_err(|mib| IrError::Parse {
        file: lines_file(lines),
        error: ParseError {
            line: 1,
            col: 1,
            message: format!(
                "a file of {} bytes needs a {mib} MiB stack to be parsed safely, and no such thread could be started",
                source.len()
            ),
        },
    })?;
    match parsed {
        Ok(p) => {
            let suite: Vec<Stmt> = p.into_suite().into_iter().collect();
            let Some(at) = nesting::too_deep(&suite) else { return Ok(suite) };
            // Dropping the tree recurses as deep as it nests: it is left to the process's end.
            std::mem::forget(suite);
            let (line, col) = lines.line_col(at);
            Err(IrError::Parse {
                file: lines_file(lines),
                error: ParseError {
                    line,
                    col,
                    message: format!(
                        "code nested deeper than {} levels (a chain of that many operators counts as that deep): too deep to \
                         read, as for CPython's compiler",
                        nesting::MAX_NESTING
                    ),
                },
            })
        }
        Err(e) => {
            let (line, col) = lines.line_col(e.location.start().to_u32());
            Err(IrError::Parse {
                file: lines_file(lines),
                error: ParseError { line, col, message: format!("Python syntax error: {}", e.error) },
            })
        }
    }
}

fn lines_file(lines: &Lines) -> String {
    lines.loc(0).file.to_string()
}

/// The module-level facts the conversion needs: functions, constants, import aliases and the
/// `triton.jit` forms that make kernels, for one source file, each name as bound once the
/// file's top level has run (see [`scan`]).
pub(crate) struct Module<'a> {
    /// The file's line table (locations of its ops and errors).
    pub lines: &'a Lines,
    /// Every top-level function, by name (also names bound by `k = triton.jit(fn)`).
    pub funcs: HashMap<String, &'a StmtFunctionDef>,
    /// The `@triton.jit` ones, in source order.
    pub jit: Vec<String>,
    /// The decorators (or wrapping calls, `triton.autotune(...)(triton.jit(fn))`) of each function.
    pub decorators: HashMap<String, Vec<&'a Expr>>,
    /// Module-level constants (`BLOCK = 128`, `X: tl.constexpr = 4`).
    pub consts: HashMap<String, Val>,
    /// Import aliases: local name to module path (`tl` to `triton.language`).
    pub aliases: HashMap<String, String>,
    /// Names imported from source files beside this one.
    pub imports: HashMap<String, Import>,
    /// Module-level list literals (`configs = [triton.Config(...), ...]`).
    pub lists: HashMap<String, &'a Expr>,
    /// Names bound to a call of a function through a wrapper not recognised as `triton.jit`:
    /// where, and the wrapper's name.
    pub unknown_forms: HashMap<String, (u32, String)>,
    /// Module-level names whose values the facts decide (`IS_HOPPER = ...`), for conditions.
    pub known: HashMap<String, facts::Known>,
    /// Names whose binding depends on a condition not decided at conversion: the note to give
    /// when a kernel uses one.
    pub guessed: HashMap<String, Note>,
}

/// What a call over a function at module level makes of it (`k = triton.jit(fn)`).
pub(crate) enum Form<'a> {
    /// A kernel: the function and its decorators (wrapping calls first).
    Jit(&'a StmtFunctionDef, Vec<&'a Expr>),
    /// A call of a wrapper not recognised as `triton.jit`: where, and the wrapper's name.
    Unknown(u32, String),
}

impl<'a> Module<'a> {
    fn empty(lines: &'a Lines) -> Module<'a> {
        Module {
            lines,
            funcs: HashMap::new(),
            jit: Vec::new(),
            decorators: HashMap::new(),
            consts: HashMap::new(),
            aliases: HashMap::new(),
            imports: HashMap::new(),
            lists: HashMap::new(),
            unknown_forms: HashMap::new(),
            known: HashMap::new(),
            guessed: HashMap::new(),
        }
    }

    /// Forgets whatever `name` is bound to (before a new binding).
    fn unbind(&mut self, name: &str) {
        self.funcs.remove(name);
        self.decorators.remove(name);
        self.jit.retain(|j| j != name);
        self.consts.remove(name);
        self.aliases.remove(name);
        self.imports.remove(name);
        self.lists.remove(name);
        self.unknown_forms.remove(name);
        self.known.remove(name);
        self.guessed.remove(name);
    }

    /// A file scanned on its own (its imports of other files not followed), with the default
    /// facts.
    fn scan_alone(suite: &'a [Stmt], lines: &'a Lines) -> Result<Module<'a>, IrError> {
        let (facts, exports, links) = (facts::Facts::default(), Vec::new(), HashMap::new());
        scan::Scanner::new(lines, &facts, &exports, &links, false).run(suite).map_err(|f| lines.error(f))
    }

    /// `triton.jit(fn)`, `triton.heuristics({...})(triton.jit(fn))`, `triton.autotune(...)(fn)`
    /// over a jit `fn`, `my_jit(fn)` where `my_jit` wraps `triton.jit`: a kernel with the
    /// wrapping calls as its decorators. A call over a function through anything else is an
    /// unknown form (remembered for the error message).
    fn jit_form(&self, value: &'a Expr) -> Option<Form<'a>> {
        let mut wrappers: Vec<&'a Expr> = Vec::new();
        let mut saw_jit = false;
        let mut e = value;
        let mut outer: Option<String> = None;
        let inner = loop {
            match e {
                Expr::Name(n) if self.funcs.contains_key(n.id.as_str()) => break n.id.to_string(),
                Expr::Call(c) if c.arguments.args.len() == 1 && !matches!(c.arguments.args[0], Expr::Starred(_)) => {
                    if self.is_jit(&c.func) {
                        saw_jit = true;
                    } else {
                        outer.get_or_insert_with(|| dotted(strip_call(&c.func)).unwrap_or_else(|| "a call".into()));
                        wrappers.push(&c.func);
                    }
                    e = &c.arguments.args[0];
                }
                _ => return None,
            }
        };
        let f = self.funcs[inner.as_str()];
        let inner_jit = self.jit.contains(&inner);
        let known_wrappers = wrappers.iter().all(|w| self.is_triton_wrapper(w));
        if saw_jit || (inner_jit && known_wrappers) {
            let mut decs = wrappers;
            decs.extend(self.decorators.get(&inner).cloned().unwrap_or_default());
            return Some(Form::Jit(f, decs));
        }
        outer.map(|o| Form::Unknown(value.range().start().to_u32(), o))
    }

    /// A decorator or wrapper that leaves a jit function a Triton kernel: `triton.autotune(...)`,
    /// `triton.heuristics(...)`, or one recognised as `triton.jit`.
    fn is_triton_wrapper(&self, e: &Expr) -> bool {
        self.is_jit(e)
            || self.resolve(strip_call(e)).is_some_and(|d| {
                let last = d.rsplit('.').next().unwrap_or_default();
                d.starts_with("triton.") && matches!(last, "autotune" | "heuristics")
            })
    }

    /// The dotted name of `e` with its first part resolved through the import aliases.
    fn resolve(&self, e: &Expr) -> Option<String> {
        let d = dotted(e)?;
        let (first, rest) = d.split_once('.').unwrap_or((&d, ""));
        let base = self.aliases.get(first).cloned().or_else(|| builtin_module(first)).unwrap_or_else(|| first.to_string());
        Some(if rest.is_empty() { base } else { format!("{base}.{rest}") })
    }

    /// `triton.jit`, `jit`, `triton.jit(...)`, a name imported as `triton.jit` under another name,
    /// a decorator whose name ends in `jit` (`some_lib.jit`, `triton_jit`), or a function of this
    /// file that returns `triton.jit(...)` of its argument.
    fn is_jit(&self, e: &Expr) -> bool {
        let e = strip_call(e);
        let jitty = |d: &str| {
            let last = d.rsplit('.').next().unwrap_or_default();
            last == "jit" || last.ends_with("_jit")
        };
        if dotted(e).is_some_and(|d| jitty(&d)) || self.resolve(e).is_some_and(|d| jitty(&d)) {
            return true;
        }
        match e {
            Expr::Name(n) => self.funcs.get(n.id.as_str()).is_some_and(|f| returns_jit(&f.body)),
            _ => false,
        }
    }
}

/// Whether a function body returns `triton.jit(...)` (a decorator that wraps `triton.jit`).
fn returns_jit(body: &[Stmt]) -> bool {
    body.iter().any(|s| match s {
        Stmt::Return(r) => r.value.as_deref().is_some_and(|v| {
            let mut v = v;
            while let Expr::Call(c) = v {
                if dotted(&c.func).is_some_and(|d| d == "jit" || d.ends_with(".jit")) {
                    return true;
                }
                v = &c.func;
            }
            false
        }),
        Stmt::FunctionDef(f) => returns_jit(&f.body),
        Stmt::If(i) => returns_jit(&i.body) || i.elif_else_clauses.iter().any(|c| returns_jit(&c.body)),
        _ => false,
    })
}

/// `tl` and `triton` without an import (kernels sometimes rely on a star import).
fn builtin_module(first: &str) -> Option<String> {
    match first {
        "tl" => Some("triton.language".into()),
        "triton" => Some("triton".into()),
        _ => None,
    }
}

/// A decorator without its call: `triton.jit(...)` is `triton.jit`.
fn strip_call(e: &Expr) -> &Expr {
    match e {
        Expr::Call(c) => &c.func,
        e => e,
    }
}

/// A module-level constant: an int, float, bool or string literal, `None`, possibly negated,
/// possibly wrapped in `tl.constexpr(...)`.
fn module_const(e: &Expr) -> Option<Val> {
    // Iterative: runs of `-` and of `tl.constexpr(...)` are legal Python of any length.
    let mut negs = 0usize;
    let mut e = e;
    loop {
        match e {
            Expr::UnaryOp(u) if u.op == ruff_python_ast::UnaryOp::USub => {
                negs += 1;
                e = &u.operand;
            }
            Expr::Call(c) if dotted(&c.func).is_some_and(|d| d.ends_with("constexpr")) && c.arguments.args.len() == 1 => {
                e = &c.arguments.args[0];
            }
            _ => break,
        }
    }
    let v = match e {
        Expr::NumberLiteral(n) => match &n.value {
            ruff_python_ast::Number::Int(i) => i.as_i64().map(Val::Int),
            ruff_python_ast::Number::Float(f) => Some(Val::Float(*f)),
            _ => None,
        },
        Expr::BooleanLiteral(b) if negs == 0 => Some(Val::Bool(b.value)),
        Expr::StringLiteral(s) if negs == 0 => Some(Val::Str(s.value.to_str().to_string())),
        _ => None,
    }?;
    match v {
        v if negs % 2 == 0 => Some(v),
        Val::Int(i) => i.checked_neg().map(Val::Int),
        Val::Float(f) => Some(Val::Float(-f)),
        _ => None,
    }
}

/// `a.b.c` as a string, for names and attribute chains.
pub(crate) fn dotted(e: &Expr) -> Option<String> {
    // Iterative: an attribute chain can be as long as the source.
    let mut attrs = Vec::new();
    let mut e = e;
    while let Expr::Attribute(a) = e {
        attrs.push(a.attr.id.as_str());
        e = &a.value;
    }
    let Expr::Name(n) = e else { return None };
    let mut out = n.id.to_string();
    for a in attrs.iter().rev() {
        out.push('.');
        out.push_str(a);
    }
    Some(out)
}
