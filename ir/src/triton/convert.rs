//! The converter proper: walks the Python AST of one kernel (and the helpers it calls, inlined),
//! keeping a Python-level environment of [`Val`]s, and emits IR through the [`KernelBuilder`]
//! with the location of each expression set on the builder.

use super::errors::{fail, Lines, R};
use super::value::{carriable, flatten, flatten_like, fold_binary, fold_eq, literal_like, rebuild, tensor, truthy, Val};
use super::{dotted, imports::Import, ConvertOptions, Module};
use crate::{DType, Elem, IrError, Kernel, KernelBuilder, Lit, Loc, Value};
use ruff_python_ast::{self as ast, ElifElseClause, Expr, Stmt, StmtFunctionDef};
use ruff_text_size::Ranged;
use std::cell::RefCell;
use std::collections::HashMap;

mod host_descriptor;
mod ternary;
mod while_loop;

/// The deepest helper-call nesting accepted (recursion is an error, not a stack overflow).
const MAX_DEPTH: usize = 32;
/// The most `tl.static_range` iterations unrolled in one kernel.
const MAX_UNROLL: usize = 65_536;
/// The deepest nesting of expressions and statement blocks accepted, counted across inlined
/// helpers: Python itself refuses more than 200 nested parentheses and 100 levels of indentation,
/// and the conversion recurses once per level, so a bound keeps it from exhausting the stack.
/// Chains of one binary operator (`a + b + c + ...`) are walked iteratively and do not count.
pub(crate) const MAX_NESTING: usize = 200;

/// Conversion state of one kernel.
pub(crate) struct Cx<'a> {
    /// Every source file of the conversion (the kernel's is 0).
    mods: &'a [Module<'a>],
    /// The file of the function being converted, and its module and lines.
    cur: usize,
    pub m: &'a Module<'a>,
    pub lines: &'a Lines,
    /// Whether helpers without a recognised jit form may be called.
    assume_jit: bool,
    /// See [`ConvertOptions::promoted`].
    pub(crate) promoted: bool,
    /// The first error raised inside a helper of another file, located in that file.
    foreign_err: Option<IrError>,
    pub b: KernelBuilder,
    pub env: HashMap<String, Val>,
    /// Names of `env` an assignment bound to a Python float, and where: the float becomes a
    /// constant only where it is used, and that constant keeps the binding's line.
    float_names: HashMap<String, Loc>,
    /// The floats the statement being converted read from such names.
    floats_used: Vec<(f64, Loc)>,
    /// Loops and tensor `if`s around the current statement, in the current function.
    nest: usize,
    /// Loops around the current statement, in the current function.
    loops: usize,
    /// Helper calls around the current statement.
    depth: usize,
    /// Whether the current function is the kernel (not a helper).
    in_kernel: bool,
    unrolled: usize,
    /// Expressions and blocks being converted around the current node (see [`MAX_NESTING`]).
    nesting: usize,
    /// What the conversion assumed (guessed module-level bindings the kernel uses), in order.
    notes: RefCell<Vec<super::Note>>,
}

/// Start offset of a node.
pub(crate) fn off(n: &impl Ranged) -> u32 {
    n.range().start().to_u32()
}

/// Converts kernel `f` of the first of `mods`, naming the IR kernel `name`; with the notes of
/// what it assumed.
pub(crate) fn convert_kernel(
    mods: &[Module],
    f: &StmtFunctionDef,
    name: &str,
    opts: &ConvertOptions,
) -> Result<(Kernel, Vec<super::Note>), IrError> {
    let m = &mods[0];
    let lines = m.lines;
    let mut cx = Cx {
        mods,
        cur: 0,
        m,
        lines,
        assume_jit: opts.assume_jit,
        promoted: opts.promoted,
        foreign_err: None,
        b: KernelBuilder::new(name),
        env: HashMap::new(),
        float_names: HashMap::new(),
        floats_used: Vec::new(),
        nest: 0,
        loops: 0,
        depth: 0,
        in_kernel: true,
        unrolled: 0,
        nesting: 0,
        notes: RefCell::new(Vec::new()),
    };
    cx.b.set_loc(Some(lines.loc(off(&f.name))));
    let r = cx.params(f, opts).and_then(|()| cx.block(&f.body));
    if let Err(e) = r {
        return Err(cx.foreign_err.take().unwrap_or_else(|| lines.error(e)));
    }
    let mut k = cx.b.finish()?;
    k.loc = lines.loc(off(&f.name));
    Ok((k, cx.notes.into_inner()))
}

impl<'a> Cx<'a> {
    /// Sets the location of the ops emitted next.
    pub(crate) fn at(&mut self, off: u32) {
        self.b.set_loc(Some(self.lines.loc(off)));
    }

    fn params(&mut self, f: &StmtFunctionDef, opts: &ConvertOptions) -> R<()> {
        let p = &f.parameters;
        if let Some(v) = p.vararg.as_ref().or(p.kwarg.as_ref()) {
            return fail(off(&**v), "`*args` and `**kwargs` parameters are not supported in a kernel: name every parameter");
        }
        for pw in p.posonlyargs.iter().chain(&p.args).chain(&p.kwonlyargs) {
            let name = pw.parameter.name.id.to_string();
            let o = off(&pw.parameter);
            if let Some((_, hd)) = opts.descriptors.iter().find(|(n, _)| *n == name) {
                self.host_descriptor(&name, hd, o)?;
                continue;
            }
            let is_constexpr =
                pw.parameter.annotation.as_deref().and_then(dotted).is_some_and(|d| d == "constexpr" || d.ends_with(".constexpr"));
            if is_constexpr {
                let v = match opts.constexprs.iter().find(|(n, _)| *n == name) {
                    Some((_, v)) => v.val(),
                    None => match pw.default.as_deref() {
                        Some(d) => self.expr(d)?,
                        None => {
                            return fail(
                                o,
                                format!(
                                    "constexpr parameter `{name}` has no value: bind it (e.g. `{name}=64`, `{name}=1e-6`,                                      `{name}=True`, `{name}='mean'`, `{name}=None` or `{name}=tl.float32`)"
                                ),
                            )
                        }
                    },
                };
                // Numbers stay parameters of the IR kernel (a launch passes them and is checked
                // against them); strings, `None` and dtypes exist only at conversion.
                match &v {
                    Val::Int(i) => {
                        self.b.constexpr(&name, *i);
                    }
                    Val::Bool(x) => {
                        self.b.constexpr(&name, *x as i64);
                    }
                    Val::Float(x) => {
                        self.b.constexpr_of(&name, DType::F32, Lit::Float(*x));
                    }
                    Val::Str(_) | Val::None | Val::DType(_) | Val::OtherDType(_) => {}
                    other => return fail(o, format!("constexpr parameter `{name}` cannot be {}", other.kind())),
                }
                self.env.insert(name, v);
            } else if opts.constexprs.iter().any(|(n, v)| *n == name && *v == super::ConstValue::None) {
                // Triton specializes an argument passed as `None` (an optional bias pointer) as
                // a constexpr `None`: `if B is not None:` folds, and the kernel has no such parameter.
                self.env.insert(name, Val::None);
            } else if let Some(&(_, d)) = opts.pointer_dtypes.iter().find(|(n, _)| *n == name) {
                let v = self.b.ptr_param(&name, d);
                self.env.insert(name, Val::Tensor(v));
            } else if name.ends_with("ptr") {
                let v = self.b.ptr_param(&name, opts.default_pointer_dtype);
                self.env.insert(name, Val::Tensor(v));
            } else {
                let d = opts.scalar_dtypes.iter().find(|(n, _)| *n == name).map_or(opts.default_scalar_dtype, |&(_, d)| d);
                let v = self.b.scalar_param(&name, d);
                self.env.insert(name, Val::Tensor(v));
            }
        }
        Ok(())
    }

    // ---- statements ---------------------------------------------------------------------------

    /// Runs statements; `Some` when a `return` ended them.
    pub(crate) fn block(&mut self, stmts: &[Stmt]) -> R<Option<Val>> {
        self.enter(off_of_body(stmts))?;
        let r = self.block_inner(stmts);
        self.nesting -= 1;
        r
    }

    fn block_inner(&mut self, stmts: &[Stmt]) -> R<Option<Val>> {
        for (i, s) in stmts.iter().enumerate() {
            if let Stmt::If(ifs) = s {
                if self.loops == 0 && (has_return(&ifs.body) || ifs.elif_else_clauses.iter().any(|c| has_return(&c.body))) {
                    return self.if_returning(ifs, &stmts[i + 1..]);
                }
            }
            if let Some(v) = self.stmt(s)? {
                return Ok(Some(v));
            }
        }
        Ok(None)
    }

    /// One level deeper (an expression or a block at `o`), or an error past [`MAX_NESTING`].
    fn enter(&mut self, o: u32) -> R<()> {
        if self.nesting >= MAX_NESTING {
            return fail(o, format!("expression or block nested deeper than {MAX_NESTING} levels (split it, with intermediate variables)"));
        }
        self.nesting += 1;
        Ok(())
    }

    fn stmt(&mut self, s: &Stmt) -> R<Option<Val>> {
        let simple = matches!(s, Stmt::Expr(_) | Stmt::Assign(_) | Stmt::AnnAssign(_) | Stmt::AugAssign(_) | Stmt::Return(_));
        if !simple {
            return self.stmt_at(s);
        }
        // The constants a simple statement made of floats bound to names on other lines.
        let (mark, outer) = (self.b.mark(), std::mem::take(&mut self.floats_used));
        let r = self.stmt_at(s);
        for (v, loc) in std::mem::replace(&mut self.floats_used, outer) {
            self.b.relocate_floats(mark, v, &loc);
        }
        r
    }

    fn stmt_at(&mut self, s: &Stmt) -> R<Option<Val>> {
        let o = off(s);
        self.at(o);
        match s {
            Stmt::Expr(e) => {
                if !matches!(*e.value, Expr::StringLiteral(_)) {
                    self.expr(&e.value)?;
                }
            }
            Stmt::Pass(_) => {}
            Stmt::Assign(a) => {
                let v = self.expr(&a.value)?;
                for t in &a.targets {
                    self.assign(t, v.clone())?;
                }
            }
            Stmt::AnnAssign(a) => {
                if let Some(v) = &a.value {
                    let v = self.expr(v)?;
                    self.assign(&a.target, v)?;
                }
            }
            Stmt::AugAssign(a) => {
                let Expr::Name(n) = &*a.target else {
                    return fail(off(&*a.target), "augmented assignment needs a plain name on the left (tensors are immutable)");
                };
                let cur = self.name(&n.id, off(n))?;
                let rhs = self.expr(&a.value)?;
                let v = self.binop(a.op.as_str(), cur, rhs, o)?;
                self.env.insert(n.id.to_string(), v);
            }
            Stmt::For(f) => self.for_stmt(f)?,
            Stmt::If(i) => return self.if_chain(&i.test, &i.body, &i.elif_else_clauses),
            Stmt::Return(r) => {
                if self.loops > 0 {
                    return fail(o, "`return` inside a loop is not supported: guard the rest of the loop body with an `if`");
                }
                let v = match &r.value {
                    Some(e) => self.expr(e)?,
                    None => Val::None,
                };
                if self.in_kernel && !matches!(v, Val::None) {
                    return fail(o, "a kernel cannot return a value: write results with `tl.store`");
                }
                return Ok(Some(v));
            }
            Stmt::Assert(a) => {
                let v = self.expr(&a.test)?;
                if truthy(&v) == Some(false) {
                    return fail(o, "assertion failed");
                }
            }
            Stmt::While(w) => self.while_stmt(w)?,
            Stmt::Break(_) => return fail(o, "`break` is not supported in Triton kernels: bound the loop with `range(...)` instead"),
            Stmt::Continue(_) => return fail(o, "`continue` is not supported in Triton kernels: guard the loop body with an `if`"),
            other => {
                let what = match other {
                    Stmt::FunctionDef(_) => "a nested function definition",
                    Stmt::ClassDef(_) => "a class definition",
                    Stmt::With(_) => "`with`",
                    Stmt::Try(_) => "`try`",
                    Stmt::Raise(_) => "`raise`",
                    Stmt::Import(_) | Stmt::ImportFrom(_) => "`import`",
                    Stmt::Delete(_) => "`del`",
                    Stmt::Global(_) | Stmt::Nonlocal(_) => "`global`/`nonlocal`",
                    Stmt::Match(_) => "`match`",
                    _ => "this statement",
                };
                return fail(
                    o,
                    format!(
                        "{what} is not supported in a Triton kernel (supported: assignments, `for` over `range`, `if`, `return`, calls)"
                    ),
                );
            }
        }
        Ok(None)
    }

    fn assign(&mut self, target: &Expr, v: Val) -> R<()> {
        match target {
            Expr::Name(n) => {
                match v {
                    Val::Float(_) => self.float_names.insert(n.id.to_string(), self.lines.loc(off(n))),
                    _ => self.float_names.remove(n.id.as_str()),
                };
                self.env.insert(n.id.to_string(), v);
                Ok(())
            }
            Expr::Tuple(ast::ExprTuple { elts, .. }) | Expr::List(ast::ExprList { elts, .. }) => match v {
                Val::Tuple(vs) if vs.len() == elts.len() => {
                    for (t, v) in elts.iter().zip(vs) {
                        self.assign(t, v)?;
                    }
                    Ok(())
                }
                other => fail(off(target), format!("cannot unpack {} into {} names", other.kind(), elts.len())),
            },
            _ => fail(off(target), "assignment to an element or attribute is not supported (tensors are immutable): assign a name"),
        }
    }

    /// The else-part of an `if` as statements: the `else` body, or the `elif` tail rebuilt as a
    /// nested `if` statement.
    fn orelse_of(rest: &[ElifElseClause]) -> Vec<Stmt> {
        match rest.first() {
            None => Vec::new(),
            Some(ElifElseClause { test: None, body, .. }) => body.to_vec(),
            Some(ElifElseClause { test: Some(t), body: eb, range, node_index }) => vec![Stmt::If(ast::StmtIf {
                node_index: node_index.clone(),
                range: *range,
                test: Box::new(t.clone()),
                body: eb.clone(),
                elif_else_clauses: rest[1..].to_vec(),
            })],
        }
    }

    /// `if` / `elif` / `else`.
    fn if_chain(&mut self, test: &Expr, body: &[Stmt], rest: &[ElifElseClause]) -> R<Option<Val>> {
        let c = self.expr(test)?;
        let orelse = Self::orelse_of(rest);
        if let Some(t) = truthy(&c) {
            return self.block(if t { body } else { &orelse });
        }
        let o = off(test);
        let cv = self.condition(c, o)?;
        // The variables the `if` defines.
        let (mut in_then, mut in_else) = (Vec::new(), Vec::new());
        assigned(body, &mut in_then);
        assigned(&orelse, &mut in_else);
        let mut names: Vec<String> = Vec::new();
        for n in in_then.iter().chain(&in_else) {
            let before = self.env.get(n).is_some_and(carriable);
            if !names.contains(n) && (before || (in_then.contains(n) && in_else.contains(n))) {
                names.push(n.clone());
            }
        }
        self.tensor_if(cv, body, &orelse, &names, o)?;
        Ok(None)
    }

    /// An `if` with a `return` in a branch, followed by `rest` (the statements after it in its
    /// block): each branch that does not end in `return` continues with `rest`, so that the `if`
    /// ends the function on every path (`if label == ignore_index: ...; return`). A returned
    /// value (in a helper) is the `if`'s result.
    fn if_returning(&mut self, i: &ast::StmtIf, rest: &[Stmt]) -> R<Option<Val>> {
        let c = self.expr(&i.test)?;
        let with_rest = |b: &[Stmt]| -> Vec<Stmt> {
            let mut v = b.to_vec();
            if !ends_in_return(b) {
                v.extend_from_slice(rest);
            }
            v
        };
        let then_body = with_rest(&i.body);
        let else_body = with_rest(&Self::orelse_of(&i.elif_else_clauses));
        if let Some(t) = truthy(&c) {
            return self.block(if t { &then_body } else { &else_body });
        }
        let o = off(&*i.test);
        let cv = self.condition(c, o)?;
        let mut all = vec![Stmt::If(i.clone())];
        all.extend_from_slice(rest);
        let names: Vec<String> = if returns_value(&all) { vec![RETURN.to_string()] } else { Vec::new() };
        self.tensor_if(cv, &then_body, &else_body, &names, o)?;
        Ok(Some(self.env.remove(RETURN).unwrap_or(Val::None)))
    }

    /// The IR value of an `if` condition: a scalar.
    fn condition(&mut self, c: Val, o: u32) -> R<Value> {
        let Val::Tensor(cv) = c else {
            return fail(o, format!("an `if` condition must be a scalar or a constant, found {}", c.kind()));
        };
        let ty = self.b.ty(cv);
        if !ty.is_scalar() {
            return fail(o, format!("an `if` condition must be a scalar, found a tile {ty}: use `tl.where` to select lanes"));
        }
        Ok(cv)
    }

    /// An IR `if` on `cv` whose results are the values of `names` after each branch; they are
    /// defined in the environment afterwards.
    fn tensor_if(&mut self, cv: Value, body: &[Stmt], orelse: &[Stmt], names: &[String], o: u32) -> R<()> {
        let saved = self.env.clone();
        self.at(o);
        let mut b = std::mem::replace(&mut self.b, KernelBuilder::new("if"));
        let err: RefCell<Option<super::errors::Fail>> = RefCell::new(None);
        let then_vals: RefCell<Vec<Val>> = RefCell::new(Vec::new());
        let me = RefCell::new(&mut *self);
        let results = b.if_else(
            cv,
            |bb| {
                let mut cx = me.borrow_mut();
                std::mem::swap(&mut cx.b, bb);
                let r = cx.branch(body, names, None);
                std::mem::swap(&mut cx.b, bb);
                bb.set_loc(Some(cx.lines.loc(o)));
                cx.env = saved.clone();
                match r {
                    Ok((vals, flat)) => {
                        *then_vals.borrow_mut() = vals;
                        flat
                    }
                    Err(e) => {
                        err.borrow_mut().get_or_insert(e);
                        Vec::new()
                    }
                }
            },
            |bb| {
                let mut cx = me.borrow_mut();
                std::mem::swap(&mut cx.b, bb);
                let tv = then_vals.borrow().clone();
                let r = if err.borrow().is_some() { Ok((Vec::new(), Vec::new())) } else { cx.branch(orelse, names, Some(&tv)) };
                std::mem::swap(&mut cx.b, bb);
                bb.set_loc(Some(cx.lines.loc(o)));
                cx.env = saved.clone();
                r.map(|x| x.1).unwrap_or_else(|e| {
                    err.borrow_mut().get_or_insert(e);
                    Vec::new()
                })
            },
        );
        self.b = b;
        if let Some(e) = err.into_inner() {
            return Err(e);
        }
        let tv = then_vals.into_inner();
        let mut it = results.into_iter();
        for (n, t) in names.iter().zip(&tv) {
            let v = rebuild(t, &mut it);
            self.env.insert(n.clone(), v);
        }
        Ok(())
    }

    /// One branch of a tensor `if`: runs it and flattens the values of `names` (shaped like
    /// `template`'s, the then-branch values, in the else branch).
    fn branch(&mut self, body: &[Stmt], names: &[String], template: Option<&[Val]>) -> R<(Vec<Val>, Vec<Value>)> {
        self.nest += 1;
        let r = self.block(body);
        self.nest -= 1;
        if let Some(v) = r? {
            if !matches!(v, Val::None) {
                self.env.insert(RETURN.to_string(), v);
            }
        }
        let mut vals = Vec::new();
        let mut flat = Vec::new();
        for (i, n) in names.iter().enumerate() {
            let Some(v) = self.env.get(n).cloned() else {
                if n == RETURN {
                    return fail(
                        off_of_body(body),
                        "this function returns a value on some paths only: return a value at the end of every path",
                    );
                }
                return fail(off_of_body(body), format!("`{n}` is defined in only one branch of this `if`: define it before the `if`"));
            };
            match template.and_then(|t| t.get(i)) {
                Some(t) => flatten_like(&mut self.b, t, &v, off_of_body(body), n, &mut flat)?,
                None => flatten(&mut self.b, &v, off_of_body(body), n, &mut flat)?,
            }
            vals.push(v);
        }
        Ok((vals, flat))
    }

    fn for_stmt(&mut self, f: &ast::StmtFor) -> R<()> {
        let o = off(f);
        if !f.orelse.is_empty() {
            return fail(off(&f.orelse[0]), "`for ... else` is not supported");
        }
        let Expr::Name(target) = &*f.target else {
            return fail(off(&*f.target), "the loop variable must be a plain name");
        };
        let Expr::Call(call) = &*f.iter else {
            return fail(off(&*f.iter), "loops must iterate over `range(...)`, `tl.range(...)` or `tl.static_range(...)`");
        };
        let kind = match self.expr(&call.func)? {
            Val::Module(p) => super::builtins::canonical(&p),
            _ => String::new(),
        };
        if !matches!(kind.as_str(), "range" | "tl.range" | "tl.static_range") {
            return fail(off(&*f.iter), "loops must iterate over `range(...)`, `tl.range(...)` or `tl.static_range(...)`");
        }
        let args = self.args(call)?;
        let bound = args.bind(
            &kind,
            &[
                "arg1",
                "arg2",
                "step",
                "max_iters",
                "num_stages",
                "loop_unroll_factor",
                "disallow_acc_multi_buffer",
                "flatten",
                "warp_specialize",
            ],
        )?;
        let (lo, hi, step) = match (&bound[0], &bound[1], &bound[2]) {
            (Some(a), None, None) => (Val::Int(0), a.clone(), Val::Int(1)),
            (Some(a), Some(b), s) => (a.clone(), b.clone(), s.clone().unwrap_or(Val::Int(1))),
            _ => return fail(off(&*f.iter), format!("`{kind}` needs one to three bounds")),
        };
        let max_iters = match &bound[3] {
            None => None,
            Some(Val::Int(i)) if *i >= 0 && *i <= u32::MAX as i64 => Some(*i as u32),
            Some(v) => return fail(off(&*f.iter), format!("`max_iters` must be a non-negative int, found {}", v.kind())),
        };
        let tname = target.id.to_string();
        if kind == "tl.static_range" {
            let (Val::Int(lo), Val::Int(hi), Val::Int(step)) = (&lo, &hi, &step) else {
                return fail(off(&*f.iter), "`tl.static_range` bounds must be constants");
            };
            if *step == 0 {
                return fail(off(&*f.iter), "`tl.static_range` step must not be zero");
            }
            let mut i = *lo;
            while (*step > 0 && i < *hi) || (*step < 0 && i > *hi) {
                self.unrolled += 1;
                if self.unrolled > MAX_UNROLL {
                    return fail(o, format!("more than {MAX_UNROLL} iterations of `tl.static_range` unrolled"));
                }
                self.env.insert(tname.clone(), Val::Int(i));
                self.nest += 1;
                self.loops += 1;
                let r = self.block(&f.body);
                self.nest -= 1;
                self.loops -= 1;
                r?;
                i = match i.checked_add(*step) {
                    Some(i) => i,
                    None => break,
                };
            }
            return Ok(());
        }
        self.at(o);
        let lo_v = tensor(&mut self.b, &lo, o, "the loop start")?;
        let hi_v = tensor(&mut self.b, &hi, o, "the loop end")?;
        let step_v = tensor(&mut self.b, &step, o, "the loop step")?;
        // Carried: defined before the loop and assigned in its body.
        let mut names_in = Vec::new();
        assigned(&f.body, &mut names_in);
        let names: Vec<String> = names_in.into_iter().filter(|n| *n != tname && self.env.get(n).is_some_and(carriable)).collect();
        let templates: Vec<Val> = names.iter().map(|n| self.env[n].clone()).collect();
        let mut init = Vec::new();
        for (n, t) in names.iter().zip(&templates) {
            flatten(&mut self.b, t, o, n, &mut init)?;
        }
        // Carried constants become tensors: rebuild the templates from the materialised values.
        let templates: Vec<Val> = {
            let mut it = init.iter().copied();
            templates.iter().map(|t| rebuild(t, &mut it)).collect()
        };
        let saved = self.env.clone();
        let mut b = std::mem::replace(&mut self.b, KernelBuilder::new("for"));
        let mut err = None;
        let results = b.for_range(lo_v, hi_v, step_v, max_iters, &init, |bb, iv, carried| {
            std::mem::swap(&mut self.b, bb);
            self.env.insert(tname.clone(), Val::Tensor(iv));
            let mut it = carried.iter().copied();
            for (n, t) in names.iter().zip(&templates) {
                let v = rebuild(t, &mut it);
                self.env.insert(n.clone(), v);
            }
            self.nest += 1;
            self.loops += 1;
            let r = self.block(&f.body);
            self.nest -= 1;
            self.loops -= 1;
            let mut next = Vec::new();
            let r = r.and_then(|_| {
                for (n, t) in names.iter().zip(&templates) {
                    let v = self.env.get(n).cloned().unwrap_or_else(|| t.clone());
                    flatten_like(&mut self.b, t, &v, o, n, &mut next)?;
                }
                Ok(())
            });
            std::mem::swap(&mut self.b, bb);
            bb.set_loc(Some(self.lines.loc(o)));
            match r {
                Ok(()) => next,
                Err(e) => {
                    err = Some(e);
                    carried.to_vec()
                }
            }
        });
        self.b = b;
        if let Some(e) = err {
            return Err(e);
        }
        self.env = saved;
        let mut it = results.into_iter();
        for (n, t) in names.iter().zip(&templates) {
            let v = rebuild(t, &mut it);
            self.env.insert(n.clone(), v);
        }
        Ok(())
    }

    // ---- expressions --------------------------------------------------------------------------

    /// Looks up a name: locals, module constants and functions, imports, then builtins.
    pub(crate) fn name(&self, id: &str, o: u32) -> R<Val> {
        if let Some(v) = self.env.get(id) {
            return Ok(v.clone());
        }
        self.note_guess(self.cur, id);
        if let Some(v) = self.m.consts.get(id) {
            return Ok(v.clone());
        }
        if self.m.funcs.contains_key(id) {
            return Ok(Val::Func(self.cur, id.to_string()));
        }
        if let Some(imp) = self.m.imports.get(id) {
            return self.imported(imp, o);
        }
        if let Some(p) = self.m.aliases.get(id) {
            return Ok(Val::Module(p.clone()));
        }
        match id {
            "tl" => Ok(Val::Module("triton.language".into())),
            "triton" => Ok(Val::Module("triton".into())),
            "range" | "min" | "max" | "len" | "int" | "float" | "abs" | "print" => Ok(Val::Module(format!("builtins.{id}"))),
            "True" => Ok(Val::Bool(true)),
            "False" => Ok(Val::Bool(false)),
            _ => fail(o, format!("undefined name `{id}`")),
        }
    }

    /// What a name imported from a file beside the kernel is: a function of it, a constant, a
    /// name it imports in turn, or the module itself.
    fn imported(&self, imp: &Import, o: u32) -> R<Val> {
        let (mut file, mut name) = match imp {
            Import::Module(f) => return Ok(Val::SourceModule(*f)),
            Import::Name(f, n) => (*f, n.clone()),
        };
        for _ in 0..16 {
            let m = &self.mods[file];
            self.note_guess(file, &name);
            if m.funcs.contains_key(&name) {
                return Ok(Val::Func(file, name));
            }
            if let Some(v) = m.consts.get(&name) {
                return Ok(v.clone());
            }
            match m.imports.get(&name) {
                Some(Import::Module(f)) => return Ok(Val::SourceModule(*f)),
                Some(Import::Name(f, n)) => (file, name) = (*f, n.clone()),
                None => {
                    return match m.aliases.get(&name) {
                        Some(p) => Ok(Val::Module(p.clone())),
                        None => fail(o, format!("`{name}` is not defined in `{}`", m.lines.loc(0).file)),
                    }
                }
            }
        }
        fail(o, format!("the import of `{name}` goes round in a circle"))
    }

    /// Notes the use of module-level `name` of `file` where its binding was guessed.
    fn note_guess(&self, file: usize, name: &str) {
        if let Some(n) = self.mods[file].guessed.get(name) {
            let mut notes = self.notes.borrow_mut();
            if !notes.contains(n) {
                notes.push(n.clone());
            }
        }
    }

    /// The jit helpers a kernel of the current file can call: its own, and those its imports of
    /// other source files bring (`helper`, `utils.helper`), sorted.
    pub(crate) fn helpers_in_scope(&self) -> Vec<String> {
        let mut out: Vec<String> = self.m.jit.clone();
        for (local, imp) in &self.m.imports {
            match imp {
                Import::Name(..) => {
                    if let Ok(Val::Func(f, n)) = self.imported(imp, 0) {
                        if self.mods[f].jit.contains(&n) {
                            out.push(local.clone());
                        }
                    }
                }
                Import::Module(f) => out.extend(self.mods[*f].jit.iter().map(|n| format!("{local}.{n}"))),
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// `module.name` for a module read from a file beside the kernel.
    fn module_attr(&self, file: usize, attr: &str, o: u32) -> R<Val> {
        self.imported(&Import::Name(file, attr.to_string()), o)
    }

    pub(crate) fn expr(&mut self, e: &Expr) -> R<Val> {
        self.enter(off(e))?;
        let r = match e {
            Expr::BinOp(_) => self.binop_chain(e),
            e => self.expr_inner(e),
        };
        self.nesting -= 1;
        r
    }

    /// A binary operation whose left operand may itself be a long chain of binary operations
    /// (`1.0 + x + x + ...`, as Python parses it: left-nested): the chain is walked iteratively,
    /// from its innermost operation out, so its length costs no stack.
    fn binop_chain(&mut self, e: &Expr) -> R<Val> {
        let mut chain = Vec::new();
        let mut cur = e;
        while let Expr::BinOp(b) = cur {
            chain.push(b);
            cur = &b.left;
        }
        let mut acc = self.expr(cur)?;
        for b in chain.into_iter().rev() {
            let r = self.expr(&b.right)?;
            acc = self.binop(b.op.as_str(), acc, r, off(b))?;
        }
        Ok(acc)
    }

    fn expr_inner(&mut self, e: &Expr) -> R<Val> {
        let o = off(e);
        match e {
            Expr::NumberLiteral(n) => match &n.value {
                ast::Number::Int(i) => match i.as_i64() {
                    Some(i) => Ok(Val::Int(i)),
                    None => fail(o, "integer literal does not fit 64 bits"),
                },
                ast::Number::Float(f) => Ok(Val::Float(*f)),
                ast::Number::Complex { .. } => fail(o, "complex numbers are not supported"),
            },
            Expr::BooleanLiteral(b) => Ok(Val::Bool(b.value)),
            Expr::NoneLiteral(_) => Ok(Val::None),
            Expr::StringLiteral(s) => Ok(Val::Str(s.value.to_str().to_string())),
            Expr::Name(n) => {
                let v = self.name(&n.id, o)?;
                if let (Val::Float(f), Some(loc)) = (&v, self.float_names.get(n.id.as_str())) {
                    self.floats_used.push((*f, loc.clone()));
                }
                Ok(v)
            }
            Expr::Tuple(t) => Ok(Val::Tuple(t.elts.iter().map(|x| self.expr(x)).collect::<R<_>>()?)),
            Expr::List(t) => Ok(Val::Tuple(t.elts.iter().map(|x| self.expr(x)).collect::<R<_>>()?)),
            Expr::Attribute(a) => {
                let v = self.expr(&a.value)?;
                self.at(o);
                self.attribute(v, &a.attr.id, o)
            }
            Expr::Call(c) => self.call(c),
            Expr::BinOp(_) => self.binop_chain(e),
            Expr::UnaryOp(u) => {
                let v = self.expr(&u.operand)?;
                self.at(o);
                self.unary(u.op, v, o)
            }
            Expr::Compare(c) => {
                if c.ops.len() != 1 {
                    return fail(o, "chained comparisons are not supported: combine comparisons with `&`");
                }
                let l = self.expr(&c.left)?;
                let r = self.expr(&c.comparators[0])?;
                match c.ops[0] {
                    ast::CmpOp::Is | ast::CmpOp::IsNot => {
                        let same = match (&l, &r) {
                            (Val::None, Val::None) => true,
                            (Val::None, _) | (_, Val::None) => false,
                            _ => return fail(o, "`is` is only supported to compare with `None`"),
                        };
                        Ok(Val::Bool(same == (c.ops[0] == ast::CmpOp::Is)))
                    }
                    ast::CmpOp::In | ast::CmpOp::NotIn => fail(o, "`in` is not supported in Triton kernels"),
                    op => self.binop(op.as_str(), l, r, o),
                }
            }
            Expr::BoolOp(bo) => {
                let vals: Vec<Val> = bo.values.iter().map(|x| self.expr(x)).collect::<R<_>>()?;
                let is_and = bo.op == ast::BoolOp::And;
                if let Some(ts) = vals.iter().map(truthy).collect::<Option<Vec<bool>>>() {
                    return Ok(Val::Bool(if is_and { ts.iter().all(|&t| t) } else { ts.iter().any(|&t| t) }));
                }
                let mut acc = vals[0].clone();
                for v in &vals[1..] {
                    acc = self.binop(if is_and { "&" } else { "|" }, acc, v.clone(), o)?;
                }
                Ok(acc)
            }
            Expr::If(i) => {
                let c = self.expr(&i.test)?;
                match truthy(&c) {
                    Some(true) => self.expr(&i.body),
                    Some(false) => self.expr(&i.orelse),
                    None => self.ternary(c, i, o),
                }
            }
            Expr::Subscript(s) => {
                let v = self.expr(&s.value)?;
                self.at(o);
                self.subscript(v, &s.slice, o)
            }
            _ => fail(o, "this expression is not supported in a Triton kernel"),
        }
    }

    fn attribute(&mut self, v: Val, attr: &str, o: u32) -> R<Val> {
        match v {
            Val::Module(p) => {
                let path = format!("{p}.{attr}");
                let c = super::builtins::canonical(&path);
                if let Some(d) = c.strip_prefix("tl.").and_then(super::builtins::dtype_name) {
                    return Ok(Val::DType(d));
                }
                if let Some(d) = c.strip_prefix("tl.").filter(|d| !d.contains('.')).and_then(super::imports::triton_dtype_name) {
                    return Ok(Val::OtherDType(d));
                }
                Ok(Val::Module(path))
            }
            Val::Tensor(t) => match attr {
                "T" => Ok(Val::Tensor(self.b.trans(t))),
                "dtype" | "type" => match self.b.ty(t).elem {
                    Elem::Num(d) => Ok(Val::DType(d)),
                    Elem::Ptr(d) => Ok(Val::PtrType(d)),
                },
                "shape" => Ok(Val::Tuple(self.b.shape(t).iter().map(|&d| Val::Int(d as i64)).collect())),
                _ => fail(o, format!("unknown tensor attribute `.{attr}` (supported: `.T`, `.dtype`, `.shape`, and methods)")),
            },
            Val::TensorDesc(d) => match attr {
                "block_shape" => Ok(Val::Tuple(d.block_shape.iter().map(|&n| Val::Int(n as i64)).collect())),
                "shape" => Ok(Val::Tuple(d.shape.iter().map(|&v| Val::Tensor(v)).collect())),
                "strides" => Ok(Val::Tuple(d.strides.iter().map(|&v| Val::Tensor(v)).collect())),
                _ => fail(
                    o,
                    format!("unknown tensor descriptor attribute `.{attr}` (supported: `.shape`, `.strides`, `.block_shape`, `.load`, `.store`)"),
                ),
            },
            Val::PtrType(d) if attr == "element_ty" => Ok(Val::DType(d)),
            Val::SourceModule(f) => self.module_attr(f, attr, o),
            Val::DType(d) if attr == "element_ty" => fail(
                o,
                format!(
                    "`.element_ty` of the scalar type {d}: this is not a pointer (a parameter not named `*ptr` is a pointer when a \
                     spec passes it a tensor, or `--ptr NAME=DTYPE` / `ConvertOptions::pointer_dtypes` names it)"
                ),
            ),
            Val::DType(d) if attr == "primitive_bitwidth" => Ok(Val::Int(d.size_bytes() as i64 * 8)),
            other => fail(o, format!("{} has no attribute `{attr}`", other.kind())),
        }
    }

    fn unary(&mut self, op: ast::UnaryOp, v: Val, o: u32) -> R<Val> {
        match (op, &v) {
            (ast::UnaryOp::UAdd, _) => Ok(v),
            (ast::UnaryOp::USub, Val::Int(i)) => i.checked_neg().map(Val::Int).map_or_else(|| fail(o, "integer overflow"), Ok),
            (ast::UnaryOp::USub, Val::Float(f)) => Ok(Val::Float(-f)),
            (ast::UnaryOp::USub, Val::Bool(b)) => Ok(Val::Int(-(*b as i64))),
            (ast::UnaryOp::USub, Val::Tensor(t)) => Ok(Val::Tensor(self.b.neg(*t))),
            (ast::UnaryOp::Not, _) if truthy(&v).is_some() => Ok(Val::Bool(!truthy(&v).unwrap_or(false))),
            (ast::UnaryOp::Invert, Val::Int(i)) => Ok(Val::Int(!i)),
            (ast::UnaryOp::Invert, Val::Bool(b)) => Ok(Val::Int(!(*b as i64))),
            (ast::UnaryOp::Not | ast::UnaryOp::Invert, Val::Tensor(t)) => Ok(Val::Tensor(self.b.not(*t))),
            _ => fail(o, format!("`{}` is not supported on {}", op.as_str(), v.kind())),
        }
    }

    /// A binary or comparison operator with Triton's literal rules.
    pub(crate) fn binop(&mut self, op: &str, a: Val, c: Val, o: u32) -> R<Val> {
        if let Some(v) = fold_eq(op, &a, &c) {
            return Ok(v);
        }
        if a.is_const() && c.is_const() {
            return match fold_binary(op, &a, &c, o)? {
                Some(v) => Ok(v),
                None => fail(o, format!("`{op}` is not supported on {} and {}", a.kind(), c.kind())),
            };
        }
        self.at(o);
        let (x, y) = match (&a, &c) {
            (Val::Tensor(x), Val::Tensor(y)) => (*x, *y),
            (Val::Tensor(x), v) if v.is_const() => (*x, literal_like(&mut self.b, v, *x, o, "an operand")?),
            (v, Val::Tensor(y)) if v.is_const() => (literal_like(&mut self.b, v, *y, o, "an operand")?, *y),
            _ => return fail(o, format!("`{op}` is not supported on {} and {}", a.kind(), c.kind())),
        };
        let b = &mut self.b;
        let r = match op {
            "+" => b.add(x, y),
            "-" => b.sub(x, y),
            "*" => b.mul(x, y),
            "/" => b.div(x, y),
            "//" => b.floordiv(x, y),
            "%" => b.rem(x, y),
            "**" => b.pow(x, y),
            "&" => b.and(x, y),
            "|" => b.or(x, y),
            "^" => b.xor(x, y),
            "<" => b.lt(x, y),
            "<=" => b.le(x, y),
            ">" => b.gt(x, y),
            ">=" => b.ge(x, y),
            "==" => b.eq(x, y),
            "!=" => b.ne(x, y),
            _ => {
                return fail(
                    o,
                    format!("the operator `{op}` is not supported on tensors (supported: + - * / // % ** & | ^ and comparisons)"),
                )
            }
        };
        Ok(Val::Tensor(r))
    }

    fn subscript(&mut self, v: Val, index: &Expr, o: u32) -> R<Val> {
        if let Val::Tuple(items) = &v {
            return match self.expr(index)? {
                Val::Int(i) => {
                    let n = items.len() as i64;
                    let j = if i < 0 { i + n } else { i };
                    if (0..n).contains(&j) {
                        Ok(items[j as usize].clone())
                    } else {
                        fail(o, format!("index {i} is out of range for a tuple of {n}"))
                    }
                }
                other => fail(o, format!("tuples are indexed with constant ints, found {}", other.kind())),
            };
        }
        let Val::Tensor(mut t) = v else {
            return fail(o, format!("cannot index {}", v.kind()));
        };
        let items: Vec<&Expr> = match index {
            Expr::Tuple(tu) => tu.elts.iter().collect(),
            e => vec![e],
        };
        let rank = self.b.ty(t).rank();
        let mut pos = 0usize;
        let mut kept = 0usize;
        for it in items {
            match it {
                Expr::NoneLiteral(_) => {
                    if self.b.ty(t).rank() >= crate::MAX_RANK {
                        return fail(off(it), format!("a tile cannot have more than {} dims", crate::MAX_RANK));
                    }
                    t = self.b.expand_dims(t, pos as isize);
                    pos += 1;
                }
                Expr::Slice(s) if s.lower.is_none() && s.upper.is_none() && s.step.is_none() => {
                    kept += 1;
                    if kept > rank {
                        return fail(off(it), format!("too many `:` for a tensor of rank {rank}"));
                    }
                    pos += 1;
                }
                _ => return fail(off(it), "tensors can only be indexed with `None` and `:` (e.g. `x[:, None]`)"),
            }
        }
        Ok(Val::Tensor(t))
    }

    /// Inlines a call of helper `name`.
    pub(crate) fn call_helper(&mut self, file: usize, name: &str, args: super::builtins::Args, o: u32) -> R<Val> {
        let m = &self.mods[file];
        let Some(&f) = m.funcs.get(name) else { return fail(o, format!("undefined function `{name}`")) };
        if !self.assume_jit && !m.jit.iter().any(|n| n == name) {
            return fail(o, format!("`{name}` is not a `@triton.jit` function: only jit functions can be called from a kernel"));
        }
        if self.depth >= MAX_DEPTH {
            return fail(o, format!("helper calls nest more than {MAX_DEPTH} deep (recursion is not supported)"));
        }
        let p = &f.parameters;
        if p.vararg.is_some() || p.kwarg.is_some() {
            return fail(off(&**p), "`*args`/`**kwargs` parameters are not supported");
        }
        let params: Vec<&ast::ParameterWithDefault> = p.posonlyargs.iter().chain(&p.args).chain(&p.kwonlyargs).collect();
        let pnames: Vec<String> = params.iter().map(|pw| pw.parameter.name.id.to_string()).collect();
        let pn: Vec<&str> = pnames.iter().map(|s| s.as_str()).collect();
        let bound = args.bind(name, &pn)?;
        let mut env = HashMap::new();
        for ((pw, n), v) in params.iter().zip(&pnames).zip(bound) {
            let v = match (v, pw.default.as_deref()) {
                (Some(v), _) => v,
                (None, Some(d)) => self.expr(d)?,
                (None, None) => return fail(o, format!("missing argument `{n}` of `{name}`")),
            };
            env.insert(n.clone(), v);
        }
        let saved_env = std::mem::replace(&mut self.env, env);
        let saved_floats = std::mem::take(&mut self.float_names);
        let saved = (self.nest, self.loops, self.in_kernel);
        self.nest = 0;
        self.loops = 0;
        self.in_kernel = false;
        self.depth += 1;
        let outer = (self.cur, self.m, self.lines);
        let mods = self.mods;
        (self.cur, self.m, self.lines) = (file, &mods[file], mods[file].lines);
        let r = self.block(&f.body);
        if let (Err(e), true) = (&r, file != outer.0) {
            // Located in the helper's file; the caller's error points at the call.
            if self.foreign_err.is_none() {
                self.foreign_err = Some(self.lines.error(super::errors::Fail { off: e.off, message: e.message.clone() }));
            }
        }
        (self.cur, self.m, self.lines) = outer;
        self.depth -= 1;
        (self.nest, self.loops, self.in_kernel) = saved;
        self.env = saved_env;
        self.float_names = saved_floats;
        self.at(o);
        Ok(r?.unwrap_or(Val::None))
    }
}

/// Start offset of a body (its first statement), for errors about a branch.
fn off_of_body(body: &[Stmt]) -> u32 {
    body.first().map_or(0, off)
}

/// The names a body assigns (in nested bodies too, in first-assignment order). Iterative, like
/// [`target_names`]: bodies and targets can nest as deep as the parser allows.
fn assigned(body: &[Stmt], out: &mut Vec<String>) {
    let mut stack: Vec<std::slice::Iter<Stmt>> = vec![body.iter()];
    while let Some(top) = stack.last_mut() {
        let Some(s) = top.next() else {
            stack.pop();
            continue;
        };
        match s {
            Stmt::Assign(a) => a.targets.iter().for_each(|t| target_names(t, out)),
            Stmt::AugAssign(a) => target_names(&a.target, out),
            Stmt::AnnAssign(a) => target_names(&a.target, out),
            Stmt::For(f) => {
                target_names(&f.target, out);
                stack.push(f.body.iter());
            }
            Stmt::If(i) => {
                // The top of the stack runs first: push the last body first.
                for c in i.elif_else_clauses.iter().rev() {
                    stack.push(c.body.iter());
                }
                stack.push(i.body.iter());
            }
            Stmt::While(_) => while_loop::assigned_in(s, out),
            _ => {}
        }
    }
}

/// The names an assignment target binds, in order (`a`, `(a, (b, c))`).
fn target_names(e: &Expr, out: &mut Vec<String>) {
    let mut stack = vec![e];
    while let Some(e) = stack.pop() {
        match e {
            Expr::Name(n) if !out.iter().any(|x| x == n.id.as_str()) => out.push(n.id.to_string()),
            Expr::Tuple(ast::ExprTuple { elts, .. }) | Expr::List(ast::ExprList { elts, .. }) => stack.extend(elts.iter().rev()),
            _ => {}
        }
    }
}

/// The name under which a branch of an `if` that returns keeps the returned value.
const RETURN: &str = "<return>";

/// Whether a body has a `return` outside loops (in nested `if`s too).
fn has_return(body: &[Stmt]) -> bool {
    body.iter().any(|s| match s {
        Stmt::Return(_) => true,
        Stmt::If(i) => has_return(&i.body) || i.elif_else_clauses.iter().any(|c| has_return(&c.body)),
        _ => false,
    })
}

/// Whether a body has a `return` with a value outside loops.
fn returns_value(body: &[Stmt]) -> bool {
    body.iter().any(|s| match s {
        Stmt::Return(r) => r.value.as_deref().is_some_and(|v| !matches!(v, Expr::NoneLiteral(_))),
        Stmt::If(i) => returns_value(&i.body) || i.elif_else_clauses.iter().any(|c| returns_value(&c.body)),
        _ => false,
    })
}

/// Whether every path through a body ends in `return`.
fn ends_in_return(body: &[Stmt]) -> bool {
    match body.last() {
        Some(Stmt::Return(_)) => true,
        Some(Stmt::If(i)) => {
            ends_in_return(&i.body)
                && i.elif_else_clauses.last().is_some_and(|c| c.test.is_none())
                && i.elif_else_clauses.iter().all(|c| ends_in_return(&c.body))
        }
        _ => false,
    }
}
