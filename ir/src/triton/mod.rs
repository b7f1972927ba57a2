//! The Triton front end: reads `@triton.jit` Python source (parsed with `ruff_python_parser`, never
//! executed) and converts one kernel to the tile IR by driving the [`KernelBuilder`], which applies
//! Triton's surface rules (broadcasting, promotion, pointer arithmetic, block pointers).
//!
//! Parameters of the kernel become IR parameters in order:
//!
//! - annotated `tl.constexpr`: a constexpr, bound from [`ConvertOptions::constexprs`] (or the
//!   parameter's default value in the source); a constexpr with neither is an error naming it;
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
//! both branches). Helper `@triton.jit` functions are inlined.
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
#[cfg(test)]
mod tests;
mod value;

use crate::{DType, IrError, Kernel, ParseError};
use errors::{fail, Lines, R};
use ruff_python_ast::{Expr, Stmt, StmtFunctionDef};
use std::collections::HashMap;
use value::Val;

/// How to bind the parameters of a converted kernel (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct ConvertOptions {
    /// Values of the constexpr parameters (and of constexprs the source defaults otherwise).
    pub constexprs: Vec<(String, i64)>,
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
        }
    }
}

impl ConvertOptions {
    /// The defaults with these constexpr bindings.
    pub fn with_constexprs(constexprs: &[(&str, i64)]) -> ConvertOptions {
        ConvertOptions { constexprs: constexprs.iter().map(|&(n, v)| (n.to_string(), v)).collect(), ..ConvertOptions::default() }
    }
}

/// Converts the `@triton.jit` function `kernel` of the Python `source` (from `file`, used in
/// locations and errors) to an IR kernel.
pub fn convert(source: &str, file: &str, kernel: &str, options: &ConvertOptions) -> Result<Kernel, IrError> {
    let lines = Lines::new(file, source);
    let suite = parse(source, &lines)?;
    let module = Module::scan(&suite).map_err(|f| lines.error(f))?;
    let Some(&f) = module.funcs.get(kernel) else {
        let names = module.jit.join(", ");
        return Err(lines
            .error(errors::Fail { off: 0, message: format!("no `@triton.jit` function named `{kernel}` in this file (found: {names})") }));
    };
    if !module.jit.iter().any(|n| n == kernel) {
        return Err(lines.error(errors::Fail {
            off: f.name.range.start().to_u32(),
            message: format!("`{kernel}` is not decorated with `@triton.jit`"),
        }));
    }
    convert::convert_kernel(&module, &lines, f, options)
}

/// The names of the `@triton.jit` functions of `source`, in order.
pub fn kernels(source: &str, file: &str) -> Result<Vec<String>, IrError> {
    let lines = Lines::new(file, source);
    let suite = parse(source, &lines)?;
    let module = Module::scan(&suite).map_err(|f| lines.error(f))?;
    Ok(module.jit)
}

/// The constexpr bindings of each `triton.Config` of `kernel`'s `@triton.autotune` decorator, in
/// order (empty when it has none). A check picks one by index; its values are constexprs of the
/// conversion.
pub fn autotune_configs(source: &str, file: &str, kernel: &str) -> Result<Vec<Vec<(String, i64)>>, IrError> {
    let lines = Lines::new(file, source);
    let suite = parse(source, &lines)?;
    let module = Module::scan(&suite).map_err(|f| lines.error(f))?;
    let Some(&f) = module.funcs.get(kernel) else {
        return Err(lines.error(errors::Fail { off: 0, message: format!("no function named `{kernel}` in this file") }));
    };
    autotune::configs(&module, f).map_err(|f| lines.error(f))
}

fn parse(source: &str, lines: &Lines) -> Result<Vec<Stmt>, IrError> {
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

/// The module-level facts the conversion needs: functions, integer constants and import aliases.
pub(crate) struct Module<'a> {
    /// Every top-level function, by name.
    pub funcs: HashMap<String, &'a StmtFunctionDef>,
    /// The `@triton.jit` ones, in source order.
    pub jit: Vec<String>,
    /// Module-level constants (`BLOCK = 128`, `X: tl.constexpr = 4`).
    pub consts: HashMap<String, Val>,
    /// Import aliases: local name to module path (`tl` to `triton.language`).
    pub aliases: HashMap<String, String>,
    /// Module-level list literals (`configs = [triton.Config(...), ...]`).
    pub lists: HashMap<String, &'a Expr>,
}

impl<'a> Module<'a> {
    fn scan(suite: &'a [Stmt]) -> R<Module<'a>> {
        let mut m =
            Module { funcs: HashMap::new(), jit: Vec::new(), consts: HashMap::new(), aliases: HashMap::new(), lists: HashMap::new() };
        for s in suite {
            match s {
                Stmt::FunctionDef(f) => {
                    let name = f.name.id.to_string();
                    if f.decorator_list.iter().any(|d| is_jit(&d.expression)) && !m.jit.contains(&name) {
                        m.jit.push(name.clone());
                    }
                    m.funcs.insert(name, f);
                }
                Stmt::Import(i) => {
                    for a in &i.names {
                        let path = a.name.id.to_string();
                        match &a.asname {
                            Some(n) => m.aliases.insert(n.id.to_string(), path),
                            None => {
                                let first = path.split('.').next().unwrap_or_default().to_string();
                                m.aliases.insert(first.clone(), first)
                            }
                        };
                    }
                }
                Stmt::ImportFrom(i) => {
                    let base = i.module.as_ref().map(|n| n.id.to_string()).unwrap_or_default();
                    for a in &i.names {
                        let local = a.asname.as_ref().unwrap_or(&a.name).id.to_string();
                        m.aliases.insert(local, format!("{base}.{}", a.name.id));
                    }
                }
                Stmt::Assign(a) if a.targets.len() == 1 => {
                    if let (Expr::Name(n), Some(v)) = (&a.targets[0], module_const(&a.value)) {
                        m.consts.insert(n.id.to_string(), v);
                    }
                    if let (Expr::Name(n), Expr::List(_)) = (&a.targets[0], &*a.value) {
                        m.lists.insert(n.id.to_string(), &a.value);
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
}

/// A module-level constant: an int, float or bool literal, possibly negated, possibly wrapped in
/// `tl.constexpr(...)`.
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

/// `@triton.jit`, `@jit`, `@triton.jit(...)`.
fn is_jit(e: &Expr) -> bool {
    let e = match e {
        Expr::Call(c) => &*c.func,
        e => e,
    };
    dotted(e).is_some_and(|d| d == "jit" || d.ends_with(".jit"))
}
