//! Module-level names as the running program binds them. From the command line the conversion
//! reads a module's top level itself (see [`super::scan`]) and may have to guess a condition; in
//! the Python package the module has been imported, and what each name the kernel uses is can be
//! read from its globals. Those [`GlobalBinding`]s replace the scan's reading of the names they
//! give, and a name given so is never noted as guessed.

use super::imports::{flatten, index_of, Import, SourceFile};
use super::{ConstValue, Module};
use ruff_python_ast::{Stmt, StmtFunctionDef};
use ruff_text_size::Ranged;

/// What a module-level name is in the running program.
#[derive(Clone, Debug, PartialEq)]
pub enum GlobalFact {
    /// A `@triton.jit` function (or an autotune or heuristics wrapper of one): the file that
    /// defines the function, its name there, and the line of its `def` or of its first decorator
    /// (Python's `co_firstlineno`), which tells apart functions of one name in one file.
    Jit {
        /// The defining file.
        file: String,
        /// The function's own name (`__name__`).
        name: String,
        /// The line of the `def` or of its first decorator.
        line: u32,
    },
    /// A Triton builtin function or module, by dotted path (`triton.language.cast`,
    /// `triton.language.extra.libdevice`, `triton.language.extra.libdevice.exp`).
    Builtin(String),
    /// A constant (an int, float, bool or string, or a `tl.constexpr` of one; a dtype).
    Const(ConstValue),
}

/// A module-level name of one file, with what it is in the running program.
#[derive(Clone, Debug, PartialEq)]
pub struct GlobalBinding {
    /// The file of the module (as the conversion is given it, or as Python names it).
    pub file: String,
    /// The name in that module.
    pub name: String,
    /// What it is.
    pub fact: GlobalFact,
}

/// The files that define the jit functions `globals` name, for the conversion to read.
pub(crate) fn files(globals: &[GlobalBinding]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for g in globals {
        if let GlobalFact::Jit { file, .. } = &g.fact {
            if !out.contains(&file.as_str()) {
                out.push(file);
            }
        }
    }
    out
}

/// Rebinds in `mods` (one per file of `files`) each name `globals` gives. A binding whose file is
/// not among those read, or whose function cannot be found, is left out: the scan's reading of
/// the name stands.
pub(crate) fn apply<'a>(files: &'a [SourceFile], mods: &mut [Module<'a>], globals: &[GlobalBinding]) {
    for g in globals {
        let Some(i) = index_of(files, &g.file) else { continue };
        match &g.fact {
            GlobalFact::Jit { file, name, line } => {
                let Some(at) = index_of(files, file) else { continue };
                let Some(f) = find_def(&files[at], &mods[at], name, *line) else { continue };
                if at == i {
                    bind_func(&mut mods[i], &g.name, f);
                } else {
                    bind_func(&mut mods[at], name, f);
                    mods[i].unbind(&g.name);
                    mods[i].imports.insert(g.name.clone(), Import::Name(at, name.clone()));
                }
            }
            GlobalFact::Builtin(path) => {
                mods[i].unbind(&g.name);
                mods[i].aliases.insert(g.name.clone(), path.clone());
            }
            GlobalFact::Const(v) => {
                mods[i].unbind(&g.name);
                mods[i].consts.insert(g.name.clone(), v.val());
            }
        }
    }
}

/// Binds `name` of module `m` to the jit function `f` (unless it is bound to it already, when
/// only the note of a guess goes).
fn bind_func<'a>(m: &mut Module<'a>, name: &str, f: &'a StmtFunctionDef) {
    let jit = m.jit.iter().any(|j| j == name);
    if jit && m.funcs.get(name).is_some_and(|&g| std::ptr::eq(g, f)) {
        m.guessed.remove(name);
        return;
    }
    m.unbind(name);
    m.funcs.insert(name.to_string(), f);
    m.decorators.insert(name.to_string(), f.decorator_list.iter().map(|d| &d.expression).collect());
    m.jit.push(name.to_string());
}

/// The function `name` of a file whose `def` (or first decorator) is on `line`; failing that, the
/// only function of that name in the file, or the one its scan bound the name to (the file may
/// have changed since the program imported it).
fn find_def<'a>(file: &'a SourceFile, m: &Module<'a>, name: &str, line: u32) -> Option<&'a StmtFunctionDef> {
    let defs: Vec<&'a StmtFunctionDef> = flatten(&file.suite)
        .into_iter()
        .filter_map(|s| match s {
            Stmt::FunctionDef(f) if f.name.id.as_str() == name => Some(f),
            _ => None,
        })
        .collect();
    let line_of = |o: u32| file.lines.line_col(o).0;
    let starts = |f: &StmtFunctionDef| {
        let first = f.decorator_list.first().map_or(f.range().start().to_u32(), |d| d.range().start().to_u32());
        line_of(first) == line || line_of(f.range().start().to_u32()) == line || line_of(f.name.range().start().to_u32()) == line
    };
    if let Some(f) = defs.iter().find(|f| starts(f)) {
        return Some(f);
    }
    match defs.as_slice() {
        [f] => Some(f),
        _ => m.funcs.get(name).copied(),
    }
}
