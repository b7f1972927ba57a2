//! The Triton front end: reads `@triton.jit` Python source (parsed with `ruff_python_parser`, never
//! executed) and converts one kernel to the tile IR by driving the [`KernelBuilder`], which applies
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
//! path. Helper `@triton.jit` functions are inlined.
//!
//! Kernels are the functions under a `triton.jit` decorator or bound to a `triton.jit(fn)` call
//! (possibly inside `triton.heuristics(...)(...)`/`triton.autotune(...)(...)`), or any function
//! when [`ConvertOptions::assume_jit`] says so. Module-level statements under `try`/`if`/`with`
//! count (version-dependent imports), and `from .utils import helper` and the like are followed
//! to the `.py` files beside the kernel's `file`, whose helpers convert with their own locations.
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
mod imports;
mod random;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_random;
#[cfg(test)]
mod tests_surface;
mod value;

use crate::{DType, IrError, Kernel, ParseError};
use errors::{fail, Lines, R};
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
    fn load(source: &str, file: &str) -> Result<Program, IrError> {
        Ok(Program { files: imports::load(source, file)? })
    }

    fn modules(&self) -> Result<Vec<Module<'_>>, IrError> {
        self.files.iter().map(|f| Module::scan(&f.suite, &f.lines, f.links.clone()).map_err(|e| f.lines.error(e))).collect()
    }
}

/// Converts the `@triton.jit` function `kernel` of the Python `source` (from `file`, used in
/// locations and errors, and to find the modules beside it that the source imports) to an IR
/// kernel.
pub fn convert(source: &str, file: &str, kernel: &str, options: &ConvertOptions) -> Result<Kernel, IrError> {
    let prog = Program::load(source, file)?;
    let mods = prog.modules()?;
    let f = lookup(&mods, kernel, options.assume_jit)?;
    convert::convert_kernel(&mods, f, kernel, options)
}

/// Checks that `kernel` names a function of `source` that converts as a kernel (a recognised
/// `triton.jit` form, or any function when `assume_jit`), with the error [`convert`] gives
/// otherwise.
pub fn find_kernel(source: &str, file: &str, kernel: &str, assume_jit: bool) -> Result<(), IrError> {
    let prog = Program::load(source, file)?;
    let mods = prog.modules()?;
    lookup(&mods, kernel, assume_jit).map(|_| ())
}

/// The parameters of function `kernel` of `source` in order, each with whether it is annotated
/// `tl.constexpr`.
pub fn parameters(source: &str, file: &str, kernel: &str) -> Result<Vec<(String, bool)>, IrError> {
    let prog = Program::load(source, file)?;
    let mods = prog.modules()?;
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
    let module = Module::scan(&suite, &lines, HashMap::new()).map_err(|f| lines.error(f))?;
    Ok(module.jit)
}

/// The constexpr bindings of each `triton.Config` of `kernel`'s `@triton.autotune` decorator (or
/// of a `triton.autotune(...)(...)` call wrapping it), in order (empty when it has none). A check
/// picks one by index; its values are constexprs of the conversion.
pub fn autotune_configs(source: &str, file: &str, kernel: &str) -> Result<Vec<Vec<(String, i64)>>, IrError> {
    let lines = Lines::new(file, source);
    let suite = parse(source, &lines)?;
    let module = Module::scan(&suite, &lines, HashMap::new()).map_err(|f| lines.error(f))?;
    let Some(decs) = module.decorators.get(kernel) else {
        return Err(lines.error(errors::Fail { off: 0, message: format!("no function named `{kernel}` in this file") }));
    };
    autotune::configs(&module, decs).map_err(|f| lines.error(f))
}

pub(crate) fn parse(source: &str, lines: &Lines) -> Result<Vec<Stmt>, IrError> {
    match ruff_python_parser::parse_module(source) {
        Ok(p) => Ok(p.into_suite().into_iter().collect()),
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
/// `triton.jit` forms that make kernels, for one source file.
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
}

impl<'a> Module<'a> {
    fn scan(suite: &'a [Stmt], lines: &'a Lines, imports: HashMap<String, Import>) -> R<Module<'a>> {
        let mut m = Module {
            lines,
            funcs: HashMap::new(),
            jit: Vec::new(),
            decorators: HashMap::new(),
            consts: HashMap::new(),
            aliases: HashMap::new(),
            imports,
            lists: HashMap::new(),
            unknown_forms: HashMap::new(),
        };
        let stmts = imports::flatten(suite);
        // Imports and functions first: the jit forms below refer to them.
        for s in &stmts {
            match s {
                Stmt::FunctionDef(f) => {
                    let name = f.name.id.to_string();
                    m.decorators.entry(name.clone()).or_insert_with(|| f.decorator_list.iter().map(|d| &d.expression).collect());
                    m.funcs.entry(name).or_insert(f);
                }
                Stmt::Import(i) => {
                    for a in &i.names {
                        let path = a.name.id.to_string();
                        match &a.asname {
                            Some(n) => m.aliases.entry(n.id.to_string()).or_insert(path),
                            None => {
                                let first = path.split('.').next().unwrap_or_default().to_string();
                                m.aliases.entry(first.clone()).or_insert(first)
                            }
                        };
                    }
                }
                Stmt::ImportFrom(i) => {
                    let base = i.module.as_ref().map(|n| n.id.to_string()).unwrap_or_default();
                    for a in &i.names {
                        let local = a.asname.as_ref().unwrap_or(&a.name).id.to_string();
                        m.aliases.entry(local).or_insert(format!("{base}.{}", a.name.id));
                    }
                }
                _ => {}
            }
        }
        for s in &stmts {
            if let Stmt::FunctionDef(f) = s {
                let name = f.name.id.to_string();
                if f.decorator_list.iter().any(|d| m.is_jit(&d.expression)) && !m.jit.contains(&name) {
                    m.jit.push(name);
                }
            }
        }
        for s in &stmts {
            match s {
                Stmt::Assign(a) if a.targets.len() == 1 => {
                    let Expr::Name(n) = &a.targets[0] else { continue };
                    let name = n.id.to_string();
                    if let Some(v) = module_const(&a.value) {
                        m.consts.insert(name, v);
                    } else if let Expr::List(_) = &*a.value {
                        m.lists.insert(name, &a.value);
                    } else if let Expr::Call(_) = &*a.value {
                        m.jit_form(&name, &a.value);
                    } else if let Some(d) = dotted(&a.value) {
                        // `libdevice = tl.math`, `rsqrt = libdevice.rsqrt`, `kernel = _kernel`.
                        let (first, rest) = d.split_once('.').unwrap_or((&d, ""));
                        if rest.is_empty() && m.funcs.contains_key(first) {
                            let f = m.funcs[first];
                            m.funcs.insert(name.clone(), f);
                            if m.jit.iter().any(|j| j == first) && !m.jit.contains(&name) {
                                m.jit.push(name.clone());
                            }
                            let decs = m.decorators.get(first).cloned().unwrap_or_default();
                            m.decorators.insert(name, decs);
                        } else if let Some(base) = m.aliases.get(first).cloned().or_else(|| builtin_module(first)) {
                            let path = if rest.is_empty() { base } else { format!("{base}.{rest}") };
                            m.aliases.entry(name).or_insert(path);
                        }
                    }
                }
                Stmt::AnnAssign(a) => {
                    if let (Expr::Name(n), Some(v)) = (&*a.target, a.value.as_deref().and_then(module_const)) {
                        m.consts.insert(n.id.to_string(), v);
                    }
                }
                _ => {}
            }
        }
        if m.funcs.len() > 10_000 {
            return fail(0, "too many functions");
        }
        Ok(m)
    }

    /// `name = triton.jit(fn)`, `name = triton.heuristics({...})(triton.jit(fn))`,
    /// `name = triton.autotune(...)(fn)` over a jit `fn`, `name = my_jit(fn)` where `my_jit`
    /// wraps `triton.jit`: records `name` as a kernel with the wrapping calls as its decorators.
    /// A call over a function through anything else is remembered for the error message.
    fn jit_form(&mut self, name: &str, value: &'a Expr) {
        let mut wrappers: Vec<&'a Expr> = Vec::new();
        let mut saw_jit = false;
        let mut e = value;
        let mut outer: Option<String> = None;
        let inner = loop {
            match e {
                Expr::Name(n) if self.funcs.contains_key(n.id.as_str()) => break Some(n.id.to_string()),
                Expr::Call(c) if c.arguments.args.len() == 1 && !matches!(c.arguments.args[0], Expr::Starred(_)) => {
                    if self.is_jit(&c.func) {
                        saw_jit = true;
                    } else {
                        outer.get_or_insert_with(|| dotted(strip_call(&c.func)).unwrap_or_else(|| "a call".into()));
                        wrappers.push(&c.func);
                    }
                    e = &c.arguments.args[0];
                }
                _ => break None,
            }
        };
        let Some(inner) = inner else { return };
        let f = self.funcs[inner.as_str()];
        let inner_jit = self.jit.contains(&inner);
        let known_wrappers = wrappers.iter().all(|w| self.is_triton_wrapper(w));
        if saw_jit || (inner_jit && known_wrappers) {
            let mut decs = wrappers;
            decs.extend(self.decorators.get(&inner).cloned().unwrap_or_default());
            self.funcs.insert(name.to_string(), f);
            self.decorators.insert(name.to_string(), decs);
            if !self.jit.iter().any(|j| j == name) {
                self.jit.push(name.to_string());
            }
        } else if let Some(o) = outer {
            self.unknown_forms.insert(name.to_string(), (value.range().start().to_u32(), o));
        }
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
