//! Module-level expressions evaluated against the [`Facts`]: what a condition guarding a
//! version- or device-dependent binding comes to in the program being checked. Recognised:
//!
//! - the Triton version: `triton.__version__` (a string: compared as Python compares strings),
//!   `Version(...)`/`version.parse(...)`/`parse_version(...)`/`LooseVersion(...)` of it (packaging's
//!   ordering of release numbers), `importlib.metadata.version("triton")`, and helpers named
//!   `compare_version("triton", operator.ge, "3.0.0")`;
//! - the environment: `os.environ.get("X", default)`, `os.getenv("X", default)`,
//!   `os.environ["X"]` (a `KeyError` when unset), `"X" in os.environ`;
//! - the device: `torch.cuda.get_device_capability(...)`, `torch.cuda.is_available()` (true),
//!   `torch.version.hip` (`None`: an NVIDIA device);
//! - `typing.TYPE_CHECKING` (false), `__name__` (not `"__main__"`);
//! - literals, names bound to known values (here or in an imported source file), comparisons,
//!   `and`/`or`/`not`, tuples and their indexing and slicing, string methods (`split`, `lower`,
//!   `upper`, `strip`, `startswith`, `endswith`), `int`/`str`/`bool`/`tuple`/`map`, and calls of
//!   module-level functions whose body is assignments and a `return` (`def is_hopper(): return
//!   torch.cuda.get_device_capability()[0] >= 9`).
//!
//! Anything else is unknown (`Ok(None)`); an error Python would raise there is a [`Raise`].

use super::super::dotted;
use super::super::facts::{operator_fn, parse_version, Known};
use super::super::imports::Import;
use super::{Raise, Scanner};
use ruff_python_ast::{self as ast, Expr, Stmt};

/// An evaluation: a known value, unknown, or an exception.
pub(super) type Ev = Result<Option<Known>, Raise>;

/// How deep expressions and helper calls are followed.
const MAX_DEPTH: usize = 64;
/// How many helper calls deep.
const MAX_CALLS: usize = 8;

impl Scanner<'_, '_> {
    pub(super) fn eval(&mut self, e: &Expr) -> Ev {
        if self.depth >= MAX_DEPTH {
            return Ok(None);
        }
        self.depth += 1;
        let r = self.eval_inner(e);
        self.depth -= 1;
        r
    }

    fn eval_inner(&mut self, e: &Expr) -> Ev {
        Ok(match e {
            Expr::NumberLiteral(n) => match &n.value {
                ast::Number::Int(i) => i.as_i64().map(Known::Int),
                ast::Number::Float(x) => Some(Known::Float(*x)),
                ast::Number::Complex { .. } => None,
            },
            Expr::StringLiteral(s) => Some(Known::Str(s.value.to_str().to_string())),
            Expr::BooleanLiteral(b) => Some(Known::Bool(b.value)),
            Expr::NoneLiteral(_) => Some(Known::None),
            Expr::Tuple(ast::ExprTuple { elts, .. }) | Expr::List(ast::ExprList { elts, .. }) => self.all(elts)?.map(Known::Tuple),
            Expr::Name(n) => self.name_value(n.id.as_str()),
            Expr::Attribute(a) => self.attr_value(e, a)?,
            Expr::Call(c) => return self.call_value(c),
            Expr::Compare(c) => return self.compare(c),
            Expr::BoolOp(b) => return self.bool_op(b),
            Expr::UnaryOp(u) => match (u.op, self.eval(&u.operand)?) {
                (ast::UnaryOp::Not, Some(v)) => Some(Known::Bool(!v.truthy())),
                (ast::UnaryOp::USub, Some(Known::Int(i))) => i.checked_neg().map(Known::Int),
                (ast::UnaryOp::USub, Some(Known::Float(x))) => Some(Known::Float(-x)),
                _ => None,
            },
            Expr::Subscript(s) => return self.subscript(s),
            Expr::If(i) => match self.eval(&i.test)? {
                Some(t) if t.truthy() => return self.eval(&i.body),
                Some(_) => return self.eval(&i.orelse),
                None => None,
            },
            _ => None,
        })
    }

    fn all(&mut self, es: &[Expr]) -> Result<Option<Vec<Known>>, Raise> {
        let mut out = Vec::new();
        for e in es {
            match self.eval(e)? {
                Some(v) => out.push(v),
                None => return Ok(None),
            }
        }
        Ok(Some(out))
    }

    /// The dotted name of `e` with its first part resolved through the imports.
    fn path(&self, e: &Expr) -> Option<String> {
        let d = dotted(e)?;
        let (first, rest) = d.split_once('.').unwrap_or((&d, ""));
        if self.locals.last().is_some_and(|l| l.contains_key(first)) {
            return None;
        }
        let base = self.m.aliases.get(first).cloned().unwrap_or_else(|| first.to_string());
        Some(if rest.is_empty() { base } else { format!("{base}.{rest}") })
    }

    fn name_value(&self, id: &str) -> Option<Known> {
        if let Some(v) = self.locals.last().and_then(|l| l.get(id)) {
            return Some(v.clone());
        }
        if let Some(v) = self.m.known.get(id) {
            return Some(v.clone());
        }
        if id == "__name__" {
            return Some(Known::Str("<imported module>".into()));
        }
        match self.m.imports.get(id) {
            Some(Import::Name(f, n)) => return self.exports.get(*f)?.get(n).cloned(),
            Some(Import::Module(_)) => return None,
            None => {}
        }
        self.m.aliases.get(id).and_then(|p| path_value(p, self))
    }

    fn attr_value(&mut self, e: &Expr, a: &ast::ExprAttribute) -> Ev {
        if let Some(d) = dotted(e) {
            let (first, rest) = d.split_once('.').unwrap_or((&d, ""));
            if let (Some(Import::Module(f)), false) = (self.m.imports.get(first), rest.contains('.')) {
                return Ok(self.exports.get(*f).and_then(|x| x.get(rest)).cloned());
            }
            if let Some(v) = self.path(e).and_then(|p| path_value(&p, self)) {
                return Ok(Some(v));
            }
        }
        Ok(match (self.eval(&a.value)?, a.attr.as_str()) {
            (Some(Known::Version(v)), "major") => v.first().copied().map(Known::Int),
            (Some(Known::Version(v)), "minor") => Some(Known::Int(v.get(1).copied().unwrap_or(0))),
            (Some(Known::Version(v)), "micro") => Some(Known::Int(v.get(2).copied().unwrap_or(0))),
            (Some(Known::Version(v)), "release") => Some(Known::Tuple(v.into_iter().map(Known::Int).collect())),
            _ => None,
        })
    }

    fn call_value(&mut self, c: &ast::ExprCall) -> Ev {
        if c.arguments.args.iter().any(|a| matches!(a, Expr::Starred(_))) {
            return Ok(None);
        }
        let path = self.path(&c.func);
        if let Some(v) = self.known_call(path.as_deref().unwrap_or_default(), c)? {
            return Ok(Some(v));
        }
        if let Expr::Name(n) = &*c.func {
            if let Some(&f) = self.m.funcs.get(n.id.as_str()).filter(|_| !self.m.jit.iter().any(|j| j == n.id.as_str())) {
                return self.helper(f, c);
            }
        }
        let Expr::Attribute(a) = &*c.func else { return Ok(None) };
        let recv = self.eval(&a.value)?;
        let args = self.all(&c.arguments.args)?;
        Ok(match (recv, args) {
            (Some(Known::Str(s)), Some(args)) => str_method(&s, a.attr.as_str(), &args),
            _ => None,
        })
    }

    /// Calls of the standard library, torch, packaging and builtins that the facts decide.
    fn known_call(&mut self, path: &str, c: &ast::ExprCall) -> Ev {
        let last = path.rsplit('.').next().unwrap_or_default();
        let version_ctor =
            matches!(last, "Version" | "parse_version" | "LooseVersion" | "StrictVersion") || (last == "parse" && path.contains("version"));
        let facts = self.facts;
        let arg = |s: &mut Self, i: usize| -> Ev { c.arguments.args.get(i).map_or(Ok(None), |e| s.eval(e)) };
        Ok(match path {
            "os.environ.get" | "os.getenv" => match arg(self, 0)? {
                Some(Known::Str(k)) => match facts.env(&k) {
                    Some(v) => Some(Known::Str(v.to_string())),
                    None if c.arguments.args.len() > 1 => arg(self, 1)?,
                    None => Some(Known::None),
                },
                _ => None,
            },
            "torch.cuda.get_device_capability" => {
                let (a, b) = facts.capability;
                Some(Known::Tuple(vec![Known::Int(a as i64), Known::Int(b as i64)]))
            }
            "torch.cuda.is_available" => Some(Known::Bool(true)),
            p if p.ends_with("metadata.version") => match arg(self, 0)? {
                Some(Known::Str(pkg)) if pkg == "triton" => Some(Known::Str(facts.triton_version.clone())),
                _ => None,
            },
            _ if version_ctor => match arg(self, 0)? {
                Some(Known::Str(s)) => parse_version(&s).map(Known::Version),
                Some(Known::Version(v)) => Some(Known::Version(v)),
                _ => None,
            },
            _ if last == "compare_version" => {
                let (pkg, op, target) = (arg(self, 0)?, arg(self, 1)?, arg(self, 2)?);
                match (pkg, op, target) {
                    (Some(Known::Str(p)), Some(Known::Op(op)), Some(Known::Str(t))) if p == "triton" => {
                        let v = parse_version(&facts.triton_version).map(Known::Version);
                        v.and_then(|v| v.compare(op, &Known::Str(t))).map(Known::Bool)
                    }
                    _ => None,
                }
            }
            "int" | "str" | "bool" | "float" | "tuple" | "len" => builtin(path, arg(self, 0)?),
            "map" => match (c.arguments.args.first().and_then(dotted), arg(self, 1)?) {
                (Some(f), Some(Known::Tuple(items))) => {
                    items.into_iter().map(|x| builtin(&f, Some(x))).collect::<Option<Vec<_>>>().map(Known::Tuple)
                }
                _ => None,
            },
            _ => None,
        })
    }

    /// A call of a module-level function whose body is assignments and a `return`.
    fn helper(&mut self, f: &ast::StmtFunctionDef, c: &ast::ExprCall) -> Ev {
        if self.locals.len() >= MAX_CALLS || !c.arguments.keywords.is_empty() {
            return Ok(None);
        }
        let Some(args) = self.all(&c.arguments.args)? else { return Ok(None) };
        let params: Vec<&ast::ParameterWithDefault> = f.parameters.posonlyargs.iter().chain(&f.parameters.args).collect();
        if args.len() > params.len() || f.parameters.vararg.is_some() {
            return Ok(None);
        }
        let mut scope = std::collections::HashMap::new();
        for (i, p) in params.iter().enumerate() {
            let v = match (args.get(i), p.default.as_deref()) {
                (Some(v), _) => v.clone(),
                (None, Some(d)) => match self.eval(d)? {
                    Some(v) => v,
                    None => return Ok(None),
                },
                (None, None) => return Ok(None),
            };
            scope.insert(p.parameter.name.id.to_string(), v);
        }
        self.locals.push(scope);
        let r = self.helper_body(&f.body);
        self.locals.pop();
        r
    }

    fn helper_body(&mut self, body: &[Stmt]) -> Ev {
        for s in body {
            match s {
                Stmt::Expr(e) if matches!(*e.value, Expr::StringLiteral(_)) => {}
                Stmt::Assign(a) if a.targets.len() == 1 => {
                    let Expr::Name(n) = &a.targets[0] else { return Ok(None) };
                    let Some(v) = self.eval(&a.value)? else { return Ok(None) };
                    if let Some(l) = self.locals.last_mut() {
                        l.insert(n.id.to_string(), v);
                    }
                }
                Stmt::Return(r) => return r.value.as_deref().map_or(Ok(Some(Known::None)), |v| self.eval(v)),
                _ => return Ok(None),
            }
        }
        Ok(Some(Known::None))
    }

    fn compare(&mut self, c: &ast::ExprCompare) -> Ev {
        let mut left = self.eval(&c.left)?;
        let mut result = Some(true);
        for (op, right_e) in c.ops.iter().zip(c.comparators.iter()) {
            let right = self.eval(right_e)?;
            let r = match op {
                ast::CmpOp::In | ast::CmpOp::NotIn => {
                    let env = self.path(right_e).is_some_and(|p| p == "os.environ");
                    let found = match (&left, &right) {
                        (Some(Known::Str(k)), _) if env => Some(self.facts.env(k).is_some()),
                        (Some(l), Some(Known::Tuple(items))) => {
                            items.iter().map(|x| l.compare("==", x)).collect::<Option<Vec<_>>>().map(|v| v.contains(&true))
                        }
                        (Some(Known::Str(l)), Some(Known::Str(r))) => Some(r.contains(l.as_str())),
                        _ => None,
                    };
                    found.map(|f| f == (*op == ast::CmpOp::In))
                }
                ast::CmpOp::Is | ast::CmpOp::IsNot => match (&left, &right) {
                    (Some(l), Some(Known::None)) | (Some(Known::None), Some(l)) if !matches!(l, Known::Truth(_)) => {
                        Some(matches!(l, Known::None) == (*op == ast::CmpOp::Is))
                    }
                    _ => None,
                },
                op => match (&left, &right) {
                    (Some(l), Some(r)) => l.compare(op.as_str(), r),
                    _ => None,
                },
            };
            result = match (result, r) {
                (Some(false), _) | (_, Some(false)) => Some(false),
                (Some(true), Some(true)) => Some(true),
                _ => None,
            };
            left = right;
        }
        Ok(result.map(Known::Bool))
    }

    /// `and`/`or` as Python evaluates them: the first operand that decides, else the last.
    fn bool_op(&mut self, b: &ast::ExprBoolOp) -> Ev {
        let is_and = b.op == ast::BoolOp::And;
        let mut unknown = false;
        let mut last = None;
        for v in &b.values {
            match self.eval(v)? {
                Some(k) if k.truthy() != is_and => return Ok(Some(if unknown { Known::Truth(!is_and) } else { k })),
                Some(k) => last = Some(k),
                None => unknown = true,
            }
        }
        Ok(if unknown { None } else { last })
    }

    fn subscript(&mut self, s: &ast::ExprSubscript) -> Ev {
        if self.path(&s.value).is_some_and(|p| p == "os.environ") {
            return match self.eval(&s.slice)? {
                Some(Known::Str(k)) => match self.facts.env(&k) {
                    Some(v) => Ok(Some(Known::Str(v.to_string()))),
                    None => Err(Raise(format!("KeyError ({k})"))),
                },
                _ => Ok(None),
            };
        }
        let Some(Known::Tuple(items)) = self.eval(&s.value)? else { return Ok(None) };
        let n = items.len() as i64;
        let at = |i: i64| if i < 0 { (i + n).max(0) } else { i.min(n) };
        if let Expr::Slice(sl) = &*s.slice {
            if sl.step.is_some() {
                return Ok(None);
            }
            let bound = |s: &mut Self, e: Option<&Expr>, d: i64| -> Result<Option<i64>, Raise> {
                match e {
                    None => Ok(Some(d)),
                    Some(e) => Ok(match s.eval(e)? {
                        Some(Known::Int(i)) => Some(at(i)),
                        _ => None,
                    }),
                }
            };
            let (Some(lo), Some(hi)) = (bound(self, sl.lower.as_deref(), 0)?, bound(self, sl.upper.as_deref(), n)?) else {
                return Ok(None);
            };
            return Ok(Some(Known::Tuple(items.get(lo as usize..hi.max(lo) as usize).map(|x| x.to_vec()).unwrap_or_default())));
        }
        Ok(match self.eval(&s.slice)? {
            Some(Known::Int(i)) if (-n..n).contains(&i) => items.get(at(i) as usize).cloned(),
            _ => None,
        })
    }
}

/// Module paths whose values the facts give.
fn path_value(p: &str, s: &Scanner) -> Option<Known> {
    Some(match p {
        "triton.__version__" | "triton.language.__version__" => Known::Str(s.facts.triton_version.clone()),
        "typing.TYPE_CHECKING" => Known::Bool(false),
        "torch.version.hip" => Known::None,
        p => match p.strip_prefix("operator.").and_then(operator_fn) {
            Some(op) => Known::Op(op),
            None => return None,
        },
    })
}

/// `int(x)`, `str(x)`, `bool(x)`, `float(x)`, `tuple(x)`, `len(x)`.
fn builtin(f: &str, x: Option<Known>) -> Option<Known> {
    let x = x?;
    Some(match (f, x) {
        ("int", Known::Str(s)) => Known::Int(s.trim().parse().ok()?),
        ("int", Known::Int(i)) => Known::Int(i),
        ("int", Known::Bool(b)) => Known::Int(b as i64),
        ("float", Known::Str(s)) => Known::Float(s.trim().parse().ok()?),
        ("str", Known::Str(s)) => Known::Str(s),
        ("str", Known::Int(i)) => Known::Str(i.to_string()),
        ("bool", x) if !matches!(x, Known::Truth(_)) => Known::Bool(x.truthy()),
        ("tuple", Known::Tuple(t)) => Known::Tuple(t),
        ("len", Known::Tuple(t)) => Known::Int(t.len() as i64),
        ("len", Known::Str(s)) => Known::Int(s.chars().count() as i64),
        _ => return None,
    })
}

/// Methods of strings.
fn str_method(s: &str, m: &str, args: &[Known]) -> Option<Known> {
    let arg = |i: usize| match args.get(i) {
        Some(Known::Str(a)) => Some(a.as_str()),
        _ => None,
    };
    Some(match (m, args.len()) {
        ("lower", 0) => Known::Str(s.to_lowercase()),
        ("upper", 0) => Known::Str(s.to_uppercase()),
        ("strip", 0) => Known::Str(s.trim().to_string()),
        ("split", 0) => Known::Tuple(s.split_whitespace().map(|p| Known::Str(p.to_string())).collect()),
        ("split", 1) if !arg(0)?.is_empty() => Known::Tuple(s.split(arg(0)?).map(|p| Known::Str(p.to_string())).collect()),
        ("startswith", 1) => Known::Bool(s.starts_with(arg(0)?)),
        ("endswith", 1) => Known::Bool(s.ends_with(arg(0)?)),
        _ => return None,
    })
}
