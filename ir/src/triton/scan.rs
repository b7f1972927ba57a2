//! The module scan: runs a file's top level in order, as Python imports it, recording what each
//! name is bound to when the last statement has run ([`Module`]). A later binding replaces an
//! earlier one of the same name, whatever either is (a function, an import, a constant).
//!
//! Module-level `if`s and `try`s take the branch Python takes where the [`Facts`] decide it
//! (Triton version comparisons, environment reads, device capability checks, imports of modules
//! this Triton lacks; see [`eval`]). The rules where they do not:
//!
//! - an `if` whose condition cannot be decided is read as **false**: the next clause whose
//!   condition is true, else the `else` branch, binds its names. A name bound only under the
//!   undecided condition (and not bound before) is still bound by it, as a module whose kernels
//!   sit under an unknown guard needs. Each name bound in such an `if` gets a note
//!   ([`Module::guessed`]) that the converter reports when a kernel uses the name;
//! - a `try` runs its body; an `except` runs only when something in the body is known to raise
//!   (an import of a module this Triton lacks or a relative import of a missing file,
//!   `os.environ["X"]` of an unset variable, a `raise`).

mod eval;

use super::errors::R;
use super::facts::{module_absent, Facts, Known};
use super::imports::Import;
use super::value::Val;
use super::{dotted, fail, module_const, strip_call, Lines, Module, Note};
use ruff_python_ast::{self as ast, ExceptHandler, Expr, Stmt};
use ruff_text_size::Ranged;
use std::collections::{HashMap, HashSet};

/// An exception a module-level statement is known to raise, by class name.
#[derive(Clone, Debug)]
pub(crate) struct Raise(pub String);

/// Statement results: `Err` when the statement raises.
type Ran = Result<(), Raise>;

/// The known module-level values of each file scanned so far, by file index.
pub(crate) type Exports = Vec<HashMap<String, Known>>;

/// The state of one file's scan.
pub(crate) struct Scanner<'a, 'f> {
    pub m: Module<'a>,
    facts: &'f Facts,
    exports: &'f Exports,
    /// What the imports of other source files bind, by (statement offset, local name).
    links: &'f HashMap<(u32, String), Import>,
    /// Whether `links` were resolved (a relative import without one names a missing file).
    links_known: bool,
    /// Names that the branch being run may not rebind (it is one Python may not take).
    shadow: HashSet<String>,
    /// Local scopes of the module-level helpers being evaluated (`is_hopper()`).
    locals: Vec<HashMap<String, Known>>,
    /// Nesting of the expression being evaluated.
    depth: usize,
}

impl<'a, 'f> Scanner<'a, 'f> {
    pub(crate) fn new(
        lines: &'a Lines,
        facts: &'f Facts,
        exports: &'f Exports,
        links: &'f HashMap<(u32, String), Import>,
        links_known: bool,
    ) -> Scanner<'a, 'f> {
        Scanner { m: Module::empty(lines), facts, exports, links, links_known, shadow: HashSet::new(), locals: Vec::new(), depth: 0 }
    }

    /// Runs the top level of a file. A statement that raises binds nothing and the scan goes
    /// on (a module that raises on import cannot have been imported; the rest is the best
    /// guess of what the user meant).
    pub(crate) fn run(mut self, suite: &'a [Stmt]) -> R<Module<'a>> {
        for s in suite {
            let _ = self.stmt(s);
        }
        if self.m.funcs.len() > 10_000 {
            return fail(0, "too many functions");
        }
        Ok(self.m)
    }

    fn exec(&mut self, suite: &'a [Stmt]) -> Ran {
        suite.iter().try_for_each(|s| self.stmt(s))
    }

    fn stmt(&mut self, s: &'a Stmt) -> Ran {
        match s {
            Stmt::If(i) => self.if_stmt(i),
            Stmt::Try(t) => self.try_stmt(t),
            Stmt::With(w) => self.exec(&w.body),
            Stmt::FunctionDef(f) => {
                self.def(f);
                Ok(())
            }
            Stmt::ClassDef(c) => {
                self.claim(c.name.as_str());
                Ok(())
            }
            Stmt::Import(i) => self.import(i),
            Stmt::ImportFrom(i) => self.import_from(i),
            Stmt::Assign(a) => {
                let v = self.eval(&a.value)?;
                for t in &a.targets {
                    match t {
                        Expr::Name(n) => self.bind_value(n.id.as_str(), &a.value, v.clone()),
                        t => target_names(t).iter().for_each(|n| {
                            self.claim(n);
                        }),
                    }
                }
                Ok(())
            }
            Stmt::AnnAssign(a) => {
                if let (Expr::Name(n), Some(value)) = (&*a.target, &a.value) {
                    let v = self.eval(value)?;
                    self.bind_value(n.id.as_str(), value, v);
                }
                Ok(())
            }
            Stmt::AugAssign(a) => {
                target_names(&a.target).iter().for_each(|n| {
                    self.claim(n);
                });
                Ok(())
            }
            Stmt::Raise(r) => Err(Raise(r.exc.as_deref().and_then(|e| dotted(strip_call(e))).unwrap_or_else(|| "Exception".into()))),
            _ => Ok(()),
        }
    }

    // ---- bindings -----------------------------------------------------------------------------

    /// Unbinds `name` before a new binding; `false` when the branch being run may not bind it.
    fn claim(&mut self, name: &str) -> bool {
        if self.shadow.contains(name) {
            return false;
        }
        self.m.unbind(name);
        true
    }

    /// Whether `name` is bound to anything now.
    fn is_bound(&self, name: &str) -> bool {
        let m = &self.m;
        m.funcs.contains_key(name)
            || m.consts.contains_key(name)
            || m.aliases.contains_key(name)
            || m.imports.contains_key(name)
            || m.lists.contains_key(name)
            || m.known.contains_key(name)
    }

    fn def(&mut self, f: &'a ast::StmtFunctionDef) {
        let name = f.name.id.as_str();
        if !self.claim(name) {
            return;
        }
        let decs: Vec<&'a Expr> = f.decorator_list.iter().map(|d| &d.expression).collect();
        if decs.iter().any(|d| self.m.is_jit(d)) {
            self.m.jit.push(name.to_string());
        }
        self.m.decorators.insert(name.to_string(), decs);
        self.m.funcs.insert(name.to_string(), f);
    }

    fn import(&mut self, i: &'a ast::StmtImport) -> Ran {
        if let Some(a) = i.names.iter().find(|a| module_absent(a.name.id.as_str(), self.facts)) {
            return Err(Raise(format!("ModuleNotFoundError ({})", a.name.id)));
        }
        for a in &i.names {
            let path = a.name.id.to_string();
            let (local, target) = match &a.asname {
                Some(n) => (n.id.to_string(), path),
                None => {
                    let first = path.split('.').next().unwrap_or_default().to_string();
                    (first.clone(), first)
                }
            };
            self.bind_import(i.range.start().to_u32(), local, target);
        }
        Ok(())
    }

    fn import_from(&mut self, i: &'a ast::StmtImportFrom) -> Ran {
        let o = i.range.start().to_u32();
        let base = i.module.as_ref().map(|n| n.id.to_string()).unwrap_or_default();
        let linked = i.names.iter().any(|a| self.links.contains_key(&(o, local_name(a))));
        let missing_file = self.links_known && i.level > 0 && i.module.is_some() && !linked;
        let absent =
            module_absent(&base, self.facts) || i.names.iter().any(|a| module_absent(&format!("{base}.{}", a.name.id), self.facts));
        if missing_file || absent {
            return Err(Raise(format!("ModuleNotFoundError ({base})")));
        }
        for a in &i.names {
            if a.name.id.as_str() != "*" {
                self.bind_import(o, local_name(a), format!("{base}.{}", a.name.id));
            }
        }
        Ok(())
    }

    fn bind_import(&mut self, o: u32, local: String, path: String) {
        if !self.claim(&local) {
            return;
        }
        if let Some(link) = self.links.get(&(o, local.clone())) {
            self.m.imports.insert(local.clone(), link.clone());
        }
        self.m.aliases.insert(local, path);
    }

    /// `name = value`, where `value` evaluated to `known` (when known).
    fn bind_value(&mut self, name: &str, value: &'a Expr, known: Option<Known>) {
        // Before claiming: the value may name the function `name` is bound to now.
        let form = match value {
            Expr::Call(_) => self.m.jit_form(value),
            _ => None,
        };
        if let Some(super::Form::Unknown(at, wrapper)) = &form {
            // An unrecognised wrapper: the function keeps its binding, for the error message.
            self.m.unknown_forms.insert(name.to_string(), (*at, wrapper.clone()));
            return;
        }
        let alias = dotted(value).and_then(|d| self.alias_of(&d));
        if !self.claim(name) {
            return;
        }
        let n = name.to_string();
        if let Some(v) = module_const(value) {
            self.m.consts.insert(n.clone(), v);
        } else if let Expr::List(_) = value {
            self.m.lists.insert(n.clone(), value);
        } else if let Some(super::Form::Jit(f, decs)) = form {
            self.m.funcs.insert(n.clone(), f);
            self.m.decorators.insert(n.clone(), decs);
            self.m.jit.push(n.clone());
        } else if let Some(a) = alias {
            self.bind_alias(&n, a);
        }
        if let Some(k) = known {
            if let (false, Some(v)) = (self.m.consts.contains_key(&n), const_val(&k)) {
                self.m.consts.insert(n.clone(), v);
            }
            self.m.known.insert(n, k);
        }
    }

    /// What `name = a.b.c` binds: the function, import or module path it names now.
    fn alias_of(&self, d: &str) -> Option<Alias<'a>> {
        let (first, rest) = d.split_once('.').unwrap_or((d, ""));
        let m = &self.m;
        if rest.is_empty() {
            if let Some(&f) = m.funcs.get(first) {
                let decs = m.decorators.get(first).cloned().unwrap_or_default();
                return Some(Alias::Func(f, decs, m.jit.iter().any(|j| j == first)));
            }
        }
        match (m.imports.get(first), rest) {
            (Some(imp), "") => return Some(Alias::Import(imp.clone())),
            (Some(Import::Module(f)), r) if !r.contains('.') => return Some(Alias::Import(Import::Name(*f, r.to_string()))),
            _ => {}
        }
        let base = m.aliases.get(first).cloned().or_else(|| super::builtin_module(first))?;
        Some(Alias::Path(if rest.is_empty() { base } else { format!("{base}.{rest}") }))
    }

    fn bind_alias(&mut self, n: &str, a: Alias<'a>) {
        let m = &mut self.m;
        match a {
            Alias::Func(f, decs, jit) => {
                m.funcs.insert(n.to_string(), f);
                m.decorators.insert(n.to_string(), decs);
                if jit {
                    m.jit.push(n.to_string());
                }
            }
            Alias::Import(i) => {
                m.imports.insert(n.to_string(), i);
            }
            Alias::Path(p) => {
                m.aliases.insert(n.to_string(), p);
            }
        }
    }

    // ---- control flow -------------------------------------------------------------------------

    fn if_stmt(&mut self, i: &'a ast::StmtIf) -> Ran {
        let clauses: Vec<(Option<&'a Expr>, &'a [Stmt])> = std::iter::once((Some(&*i.test), &i.body[..]))
            .chain(i.elif_else_clauses.iter().map(|c| (c.test.as_ref(), &c.body[..])))
            .collect();
        for (k, (test, body)) in clauses.iter().enumerate() {
            let Some(t) = test else { return self.exec(body) };
            match self.eval(t)? {
                Some(v) if v.truthy() => return self.exec(body),
                Some(_) => {}
                None => return self.undecided(t, &clauses[k..]),
            }
        }
        Ok(())
    }

    /// The clauses of an `if` from the first whose condition cannot be decided (`test`): the
    /// conditions not decided are read as false (see the module docs).
    fn undecided(&mut self, test: &'a Expr, clauses: &[(Option<&'a Expr>, &'a [Stmt])]) -> Ran {
        let mut maybe: Vec<&'a [Stmt]> = vec![clauses[0].1];
        let mut chosen: Option<&'a [Stmt]> = None;
        for (t, body) in &clauses[1..] {
            let v = match t {
                None => Some(Known::Bool(true)),
                Some(t) => self.eval(t).unwrap_or(None),
            };
            match v {
                Some(v) if v.truthy() => {
                    chosen = Some(body);
                    break;
                }
                Some(_) => {}
                None => maybe.push(body),
            }
        }
        let chosen_names = chosen.map(bound_names).unwrap_or_default();
        let mut all: Vec<String> = Vec::new();
        for b in maybe.iter().copied().chain(chosen) {
            for n in bound_names(b) {
                if !all.contains(&n) {
                    all.push(n);
                }
            }
        }
        let before: Vec<String> = all.iter().filter(|n| self.is_bound(n)).cloned().collect();
        let outer = self.shadow.clone();
        self.shadow.extend(before.iter().cloned().chain(chosen_names.iter().cloned()));
        for b in &maybe {
            let _ = self.exec(b);
        }
        self.shadow = outer;
        let r = chosen.map_or(Ok(()), |b| self.exec(b));
        self.note_guesses(test, &all, &chosen_names, &before);
        r
    }

    /// Records, for each name an undecided `if` binds, which binding was taken.
    fn note_guesses(&mut self, test: &'a Expr, names: &[String], chosen: &[String], before: &[String]) {
        let cond = self.m.lines.text(test.range().start().to_u32(), test.range().end().to_u32(), 60);
        for n in names {
            if self.shadow.contains(n) {
                continue;
            }
            let which = if chosen.contains(n) {
                "the binding of the branch taken when it is false".to_string()
            } else if before.contains(n) {
                "its binding from before the `if`".to_string()
            } else {
                "the binding under it (the only one)".to_string()
            };
            let message = format!("`{n}` is bound under `if {cond}`, which is not decided at conversion: read as false, `{n}` is {which}");
            self.m.guessed.insert(n.clone(), Note { loc: self.m.lines.loc(test.range().start().to_u32()), message });
        }
    }

    fn try_stmt(&mut self, t: &'a ast::StmtTry) -> Ran {
        let r = match self.exec(&t.body) {
            Ok(()) => self.exec(&t.orelse),
            Err(e) => match t.handlers.iter().find(|h| catches(h, &e)) {
                Some(ExceptHandler::ExceptHandler(h)) => {
                    if let Some(n) = &h.name {
                        self.claim(n.as_str());
                    }
                    self.exec(&h.body)
                }
                None => Err(e),
            },
        };
        let f = self.exec(&t.finalbody);
        r.and(f)
    }
}

/// What `name = a.b` binds.
enum Alias<'a> {
    /// A function of this file (its decorators, and whether it is a jit function).
    Func(&'a ast::StmtFunctionDef, Vec<&'a Expr>, bool),
    /// A name or module of another source file.
    Import(Import),
    /// A module path (`tl.exp`, `triton.language.math`).
    Path(String),
}

/// Whether an `except` clause catches `e`.
fn catches(h: &ExceptHandler, e: &Raise) -> bool {
    let ExceptHandler::ExceptHandler(h) = h;
    let Some(t) = h.type_.as_deref() else { return true };
    let class = e.0.split(' ').next().unwrap_or_default();
    let bases: &[&str] = match class {
        "ModuleNotFoundError" => &["ModuleNotFoundError", "ImportError"],
        "KeyError" => &["KeyError", "LookupError"],
        _ => &[],
    };
    let names: Vec<String> = match t {
        Expr::Tuple(tu) => tu.elts.iter().filter_map(dotted).collect(),
        t => dotted(t).into_iter().collect(),
    };
    names
        .iter()
        .map(|n| n.rsplit('.').next().unwrap_or_default())
        .any(|n| n == class || bases.contains(&n) || n == "Exception" || n == "BaseException")
}

/// The local name an `import ... as` alias binds.
fn local_name(a: &ast::Alias) -> String {
    a.asname.as_ref().unwrap_or(&a.name).id.to_string()
}

/// The conversion's value of a known module-level value, where it has one.
fn const_val(k: &Known) -> Option<Val> {
    Some(match k {
        Known::Bool(b) => Val::Bool(*b),
        Known::Int(i) => Val::Int(*i),
        Known::Float(x) => Val::Float(*x),
        Known::Str(s) => Val::Str(s.clone()),
        _ => return None,
    })
}

/// The names a target binds (`a`, `a, (b, c)`).
fn target_names(e: &Expr) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![e];
    while let Some(e) = stack.pop() {
        match e {
            Expr::Name(n) => out.push(n.id.to_string()),
            Expr::Tuple(ast::ExprTuple { elts, .. }) | Expr::List(ast::ExprList { elts, .. }) | Expr::Set(ast::ExprSet { elts, .. }) => {
                stack.extend(elts.iter())
            }
            Expr::Starred(s) => stack.push(&s.value),
            _ => {}
        }
    }
    out
}

/// The names a module-level body binds, in order (nested `if`/`try`/`with` bodies too).
fn bound_names(body: &[Stmt]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in super::imports::flatten(body) {
        let names = match s {
            Stmt::FunctionDef(f) => vec![f.name.id.to_string()],
            Stmt::ClassDef(c) => vec![c.name.id.to_string()],
            Stmt::Assign(a) => a.targets.iter().flat_map(target_names).collect(),
            Stmt::AnnAssign(a) if a.value.is_some() => target_names(&a.target),
            Stmt::AugAssign(a) => target_names(&a.target),
            Stmt::Import(i) => i
                .names
                .iter()
                .map(|a| {
                    a.asname.as_ref().map_or_else(|| a.name.id.split('.').next().unwrap_or_default().to_string(), |n| n.id.to_string())
                })
                .collect(),
            Stmt::ImportFrom(i) => i.names.iter().filter(|a| a.name.id.as_str() != "*").map(local_name).collect(),
            _ => Vec::new(),
        };
        for n in names {
            if !out.contains(&n) {
                out.push(n);
            }
        }
    }
    out
}
