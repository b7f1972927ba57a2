//! What a kernel's module brings in from outside the function: module-level statements guarded by
//! `try`/`except` or `if` (imports that depend on the Triton version), the Python source files
//! beside the kernel that its `from .utils import helper` imports name (read and converted like
//! the kernel's own file), and the values that constexprs are bound to ([`ConstValue`]).

use super::errors::Lines;
use super::value::Val;
use crate::{DType, IrError, ParseError};
use ruff_python_ast::Stmt;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// The most source files one conversion reads (the kernel's and the modules it imports).
const MAX_FILES: usize = 64;
/// How many directories above the kernel's a package import (`from pkg.utils import f`) is looked for.
const MAX_ANCESTORS: usize = 6;

/// A value bound to a constexpr parameter: Triton folds each kind at compile time.
#[derive(Clone, Debug, PartialEq)]
pub enum ConstValue {
    /// An int (`BLOCK: tl.constexpr` = 128).
    Int(i64),
    /// A float (`eps: tl.constexpr` = 1e-6).
    Float(f64),
    /// A bool (`HAS_BIAS: tl.constexpr` = True).
    Bool(bool),
    /// A string (`reduction: tl.constexpr` = "mean").
    Str(String),
    /// `None` (`ACTIVATION: tl.constexpr = None`).
    None,
    /// A dtype, by its Triton name (`float32`, `bfloat16`, `float8e5`).
    DType(String),
}

impl From<i64> for ConstValue {
    fn from(v: i64) -> ConstValue {
        ConstValue::Int(v)
    }
}

impl From<f64> for ConstValue {
    fn from(v: f64) -> ConstValue {
        ConstValue::Float(v)
    }
}

impl From<bool> for ConstValue {
    fn from(v: bool) -> ConstValue {
        ConstValue::Bool(v)
    }
}

impl From<&str> for ConstValue {
    fn from(v: &str) -> ConstValue {
        ConstValue::Str(v.to_string())
    }
}

impl fmt::Display for ConstValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConstValue::Int(i) => write!(f, "{i}"),
            ConstValue::Float(x) => write!(f, "{x:?}"),
            ConstValue::Bool(b) => f.write_str(if *b { "True" } else { "False" }),
            ConstValue::Str(s) => write!(f, "{s:?}"),
            ConstValue::None => f.write_str("None"),
            ConstValue::DType(d) => write!(f, "tl.{d}"),
        }
    }
}

/// Triton's dtype names outside the IR's dtypes: usable as values (compared, bound), not computed in.
const OTHER_DTYPES: &[&str] =
    &["int8", "int16", "uint8", "uint16", "uint32", "uint64", "float8e5", "float8e5b16", "float8e4nv", "float8e4b8", "float8e4b15"];

/// The Triton name of a dtype written as Triton, PyTorch or tilegrad spell it (`tl.float16`,
/// `torch.float8_e5m2`, `f32`), if it is one.
pub fn triton_dtype_name(text: &str) -> Option<String> {
    let t = text.trim();
    let t = ["triton.language.", "tl.", "torch."].iter().find_map(|p| t.strip_prefix(p)).unwrap_or(t);
    let name = match t {
        "float8_e5m2" => "float8e5",
        "float8_e4m3fn" => "float8e4nv",
        "float8_e5m2fnuz" => "float8e5b16",
        "float8_e4m3fnuz" => "float8e4b8",
        "bool" => "int1",
        "half" => "float16",
        "float" => "float32",
        "double" => "float64",
        t => t,
    };
    if let Some(d) = DType::from_name(name) {
        return Some(triton_name(d).to_string());
    }
    OTHER_DTYPES.contains(&name).then(|| name.to_string())
}

/// The Triton name of an IR dtype.
fn triton_name(d: DType) -> &'static str {
    match d {
        DType::I1 => "int1",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::F32 => "float32",
        DType::F64 => "float64",
    }
}

impl ConstValue {
    /// Parses a value as a spec or the command line writes it: an int, a float, `True`/`False`,
    /// `None`, a quoted string (`'mean'` or `"mean"`), or a dtype (`tl.float32`, `torch.bfloat16`,
    /// `tl.float8e5`). `None` for anything else (a bare word is not a value by itself).
    pub fn parse(text: &str) -> Option<ConstValue> {
        let t = text.trim();
        if let Ok(i) = t.parse::<i64>() {
            return Some(ConstValue::Int(i));
        }
        if t.chars().next().is_some_and(|c| c.is_ascii_digit() || c == '-' || c == '.') {
            if let Ok(x) = t.parse::<f64>() {
                return Some(ConstValue::Float(x));
            }
        }
        match t {
            "True" | "true" => return Some(ConstValue::Bool(true)),
            "False" | "false" => return Some(ConstValue::Bool(false)),
            "None" => return Some(ConstValue::None),
            _ => {}
        }
        for q in ['\'', '"'] {
            if t.len() >= 2 && t.starts_with(q) && t.ends_with(q) {
                return Some(ConstValue::Str(t[1..t.len() - 1].to_string()));
            }
        }
        if t.contains('.') {
            return triton_dtype_name(t).map(ConstValue::DType);
        }
        None
    }

    /// The conversion's value for it.
    pub(crate) fn val(&self) -> Val {
        match self {
            ConstValue::Int(i) => Val::Int(*i),
            ConstValue::Float(x) => Val::Float(*x),
            ConstValue::Bool(b) => Val::Bool(*b),
            ConstValue::Str(s) => Val::Str(s.clone()),
            ConstValue::None => Val::None,
            ConstValue::DType(d) => match super::builtins::dtype_name(d) {
                Some(d) => Val::DType(d),
                None => Val::OtherDType(d.clone()),
            },
        }
    }

    /// True for the kinds a launch passes as a scalar argument too (ints, floats, bools); strings,
    /// `None` and dtypes exist only at conversion.
    pub fn is_number(&self) -> bool {
        matches!(self, ConstValue::Int(_) | ConstValue::Float(_) | ConstValue::Bool(_))
    }
}

/// A name imported from a source file beside the kernel.
#[derive(Clone, Debug)]
pub(crate) enum Import {
    /// `from .utils import helper`: file index and name in it.
    Name(usize, String),
    /// `from . import utils`, `import utils`: the file itself.
    Module(usize),
}

/// One parsed Python file of a conversion.
pub(crate) struct SourceFile {
    /// Where it was read from (the kernel's `file` for the kernel's own).
    pub path: PathBuf,
    pub lines: Lines,
    pub suite: Vec<Stmt>,
    /// What its imports of other source files bind, by (offset of the import statement, local
    /// name).
    pub links: HashMap<(u32, String), Import>,
}

/// The module-level statements of a suite with the bodies of `try`/`except`/`else`/`finally`,
/// `if`/`elif`/`else` and `with` blocks spliced in where they stand, in order: every import or
/// definition a guard may make is seen (the first one of a name counts).
pub(crate) fn flatten(suite: &[Stmt]) -> Vec<&Stmt> {
    fn go<'a>(suite: &'a [Stmt], out: &mut Vec<&'a Stmt>) {
        for s in suite {
            match s {
                Stmt::Try(t) => {
                    go(&t.body, out);
                    go(&t.orelse, out);
                    for h in &t.handlers {
                        let ruff_python_ast::ExceptHandler::ExceptHandler(h) = h;
                        go(&h.body, out);
                    }
                    go(&t.finalbody, out);
                }
                Stmt::If(i) => {
                    go(&i.body, out);
                    for c in &i.elif_else_clauses {
                        go(&c.body, out);
                    }
                }
                Stmt::With(w) => go(&w.body, out),
                s => out.push(s),
            }
        }
    }
    let mut out = Vec::new();
    go(suite, &mut out);
    out
}

/// Reads the kernel's file (`source`, at `file`) and, transitively, the Python files beside it
/// that its module-level imports name; index 0 is the kernel's own file. The `extra` files (those
/// the running program says define functions the kernel uses) are read too, with the files their
/// imports name, where the imports did not reach them; one that cannot be read or parsed is left
/// out (the conversion then keeps its own reading of the names that lead to it).
pub(crate) fn load(source: &str, file: &str, extra: &[&str]) -> Result<Vec<SourceFile>, IrError> {
    let lines = Lines::new(file, source);
    let suite = super::parse(source, &lines)?;
    let mut files = vec![SourceFile { path: PathBuf::from(file), lines, suite, links: HashMap::new() }];
    let mut extra = extra.iter();
    let mut i = 0;
    loop {
        while i < files.len() {
            link_imports(&mut files, i, file)?;
            i += 1;
        }
        let Some(next) = extra.find(|p| index_of(&files, p).is_none()) else { break };
        if files.len() < MAX_FILES {
            files.extend(read_extra(next));
        }
    }
    Ok(files)
}

/// The index of the file at `path` among `files`.
pub(crate) fn index_of(files: &[SourceFile], path: &str) -> Option<usize> {
    let p = Path::new(path);
    files.iter().position(|f| same_file(&f.path, p))
}

/// A file the running program imported, read and parsed, or `None` where it cannot be.
fn read_extra(path: &str) -> Option<SourceFile> {
    let text = std::fs::read_to_string(path).ok()?;
    let lines = Lines::new(path, &text);
    let suite = super::parse(&text, &lines).ok()?;
    Some(SourceFile { path: PathBuf::from(path), lines, suite, links: HashMap::new() })
}

/// Finds the files that the module-level imports of `files[i]` name (reading those not read yet)
/// and records them in its links. `file` is the kernel's, for errors.
fn link_imports(files: &mut Vec<SourceFile>, i: usize, file: &str) -> Result<(), IrError> {
    let dir = files[i].path.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut wanted: Vec<(u32, String, PathBuf, Option<String>)> = Vec::new();
    for s in flatten(&files[i].suite) {
        match s {
            Stmt::ImportFrom(imp) => {
                let at = imp.range.start().to_u32();
                let module = imp.module.as_ref().map(|m| m.id.to_string());
                for a in &imp.names {
                    let local = a.asname.as_ref().unwrap_or(&a.name).id.to_string();
                    let name = a.name.id.to_string();
                    if name == "*" {
                        continue;
                    }
                    // The module itself, or a submodule named like the imported name.
                    if let Some(m) = &module {
                        if let Some(p) = find(&dir, imp.level, m) {
                            wanted.push((at, local, p, Some(name)));
                            continue;
                        }
                        if let Some(p) = find(&dir, imp.level, &format!("{m}.{name}")) {
                            wanted.push((at, local, p, None));
                        }
                    } else if let Some(p) = find(&dir, imp.level, &name) {
                        wanted.push((at, local, p, None));
                    }
                }
            }
            Stmt::Import(imp) => {
                let at = imp.range.start().to_u32();
                for a in &imp.names {
                    let m = a.name.id.to_string();
                    if let (Some(asname), Some(p)) = (&a.asname, find(&dir, 0, &m)) {
                        wanted.push((at, asname.id.to_string(), p, None));
                    } else if !m.contains('.') {
                        if let Some(p) = find(&dir, 0, &m) {
                            wanted.push((at, m.clone(), p, None));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    for (at, local, path, name) in wanted {
        let idx = match files.iter().position(|f| same_file(&f.path, &path)) {
            Some(k) => k,
            None => {
                if files.len() >= MAX_FILES {
                    let msg = format!("more than {MAX_FILES} source files are imported");
                    return Err(IrError::Parse { file: file.to_string(), error: ParseError { line: 1, col: 1, message: msg } });
                }
                let text = std::fs::read_to_string(&path).map_err(|e| IrError::Parse {
                    file: path.display().to_string(),
                    error: ParseError { line: 1, col: 1, message: format!("cannot read this module (imported by {file}): {e}") },
                })?;
                let lines = Lines::new(&path.display().to_string(), &text);
                let suite = super::parse(&text, &lines)?;
                files.push(SourceFile { path, lines, suite, links: HashMap::new() });
                files.len() - 1
            }
        };
        let link = match name {
            Some(n) => Import::Name(idx, n),
            None => Import::Module(idx),
        };
        files[i].links.entry((at, local)).or_insert(link);
    }
    Ok(())
}

/// The file a module path names, relative to `dir` (`level` dots: 1 is `dir` itself, 2 its
/// parent); an absolute import (`level` 0) is looked for in `dir` and the directories above it.
/// Triton, PyTorch and the standard library are never looked for.
fn find(dir: &Path, level: u32, module: &str) -> Option<PathBuf> {
    let first = module.split('.').next().unwrap_or_default();
    if level == 0
        && matches!(
            first,
            "triton" | "torch" | "numpy" | "math" | "typing" | "functools" | "os" | "sys" | "operator" | "enum" | "dataclasses"
        )
    {
        return None;
    }
    let rel: PathBuf = module.split('.').filter(|s| !s.is_empty()).collect();
    if rel.as_os_str().is_empty() {
        return None;
    }
    let probe = |base: &Path| [base.join(&rel).with_extension("py"), base.join(&rel).join("__init__.py")].into_iter().find(|p| p.is_file());
    if level > 0 {
        let mut base = dir.to_path_buf();
        for _ in 1..level {
            base = base.parent()?.to_path_buf();
        }
        return probe(&base);
    }
    let mut base = Some(dir.to_path_buf());
    for _ in 0..=MAX_ANCESTORS {
        let b = base?;
        if let Some(p) = probe(&b) {
            return Some(p);
        }
        base = b.parent().map(Path::to_path_buf);
    }
    None
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}
