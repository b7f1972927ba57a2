//! The verifier: checks that a kernel is well-formed and well-typed, collecting every problem with
//! its op and source location. Backends run only verified kernels and trust these facts.

use crate::error::{Diagnostic, IrError};
use crate::kernel::{Block, Inst, Kernel, Loc, ParamKind, Value};
use crate::op::{Op, ReduceOp, UnaryOp};
use crate::types::{DType, Elem, Type, MAX_NUMEL, MAX_RANK};

/// Checks `k`; on failure every problem found is listed.
pub fn verify(k: &Kernel) -> Result<(), IrError> {
    let mut v = Verifier { k, diags: Vec::new(), defined: vec![false; k.values.len()] };
    v.run();
    if v.diags.is_empty() {
        Ok(())
    } else {
        Err(IrError::Invalid { kernel: k.name.clone(), diagnostics: v.diags })
    }
}

struct Verifier<'k> {
    k: &'k Kernel,
    diags: Vec<Diagnostic>,
    /// Values in scope at the current point.
    defined: Vec<bool>,
}

/// Where a block sits, which decides how it must end.
#[derive(Clone, Copy, PartialEq)]
enum BlockRole {
    Body,
    Region,
}

impl<'k> Verifier<'k> {
    fn err(&mut self, op: &str, loc: &Loc, msg: String) {
        self.diags.push(Diagnostic { kernel: self.k.name.clone(), op: op.to_string(), loc: loc.clone(), message: msg });
    }

    fn ty(&self, v: Value) -> Option<&'k Type> {
        self.k.values.get(v.index()).map(|d| &d.ty)
    }

    fn define(&mut self, v: Value, what: &str, loc: &Loc) {
        match self.defined.get(v.index()) {
            None => self.err(what, loc, format!("defines {v}, which is not in the value table")),
            Some(_) => {
                self.defined[v.index()] = true;
                let ty = &self.k.values[v.index()].ty;
                for msg in value_type_problems(v, ty) {
                    self.err(what, loc, msg);
                }
            }
        }
    }

    fn run(&mut self) {
        let k = self.k;
        if k.blocks.get(k.body.index()).is_none() {
            self.err("kernel", &k.loc, "the body block does not exist".into());
            return;
        }
        if !is_ident(&k.name) {
            self.err("kernel", &k.loc, format!("kernel name `{}` is not an identifier", k.name));
        }
        let mut seen_names = std::collections::HashSet::new();
        let mut def_count = vec![0u32; k.values.len()];
        for p in &k.params {
            let what = format!("param {}", p.name);
            if !is_ident(&p.name) {
                self.err(&what, &k.loc, format!("parameter name `{}` is not an identifier", p.name));
            }
            if !seen_names.insert(p.name.as_str()) {
                self.err(&what, &k.loc, format!("parameter `{}` is declared twice", p.name));
            }
            let Some(ty) = self.ty(p.value) else {
                self.err(&what, &k.loc, format!("{} is not in the value table", p.value));
                continue;
            };
            let expect = match &p.kind {
                ParamKind::Ptr(d) => Type::ptr(*d, &[]),
                ParamKind::Scalar(d) => Type::scalar(*d),
                ParamKind::Constexpr(d, lit) => {
                    if !lit.fits(*d) {
                        self.err(&what, &k.loc, format!("constexpr value {lit} does not fit {d}"));
                    }
                    Type::scalar(*d)
                }
            };
            if *ty != expect {
                self.err(&what, &k.loc, format!("value has type {ty}, expected {expect}"));
            }
            if let Some(c) = def_count.get_mut(p.value.index()) {
                *c += 1;
            }
            self.define(p.value, &what, &k.loc);
        }
        // Each value must be defined exactly once.
        k.walk(&mut |_, d| {
            for r in &d.results {
                if let Some(c) = def_count.get_mut(r.index()) {
                    *c += 1;
                }
            }
            for b in d.op.blocks() {
                if let Some(bd) = k.blocks.get(b.index()) {
                    for p in &bd.params {
                        if let Some(c) = def_count.get_mut(p.index()) {
                            *c += 1;
                        }
                    }
                }
            }
        });
        for (i, c) in def_count.iter().enumerate() {
            if *c > 1 {
                self.err("kernel", &k.loc, format!("value %{i} is defined {c} times"));
            }
        }
        // Types of defined values are checked where they are defined (`define`), so that the
        // error names the op; values nothing defines are checked here.
        for (i, v) in k.values.iter().enumerate() {
            if def_count[i] == 0 {
                for msg in value_type_problems(Value(i as u32), &v.ty) {
                    self.err("kernel", &k.loc, msg);
                }
            }
        }
        self.block(k.body, BlockRole::Body, &[]);
    }

    /// Checks a block; `yields` are the types its final `yield` must pass (for regions).
    fn block(&mut self, b: Block, role: BlockRole, yields: &[Type]) {
        let k = self.k;
        let Some(bd) = k.blocks.get(b.index()) else {
            self.err("kernel", &k.loc, format!("{b} does not exist"));
            return;
        };
        let mut scope: Vec<Value> = bd.params.clone();
        for (pos, &i) in bd.insts.iter().enumerate() {
            let Some(d) = k.insts.get(i.index()) else {
                self.err("kernel", &k.loc, format!("{i} does not exist"));
                continue;
            };
            let last = pos + 1 == bd.insts.len();
            if let Op::Yield = d.op {
                if role == BlockRole::Body || !last {
                    self.err("yield", &d.loc, "`yield` may only end a loop body or an if branch".into());
                } else {
                    let got: Vec<Option<&Type>> = d.args.iter().map(|&a| self.ty(a)).collect();
                    if got.len() != yields.len() || got.iter().zip(yields).any(|(g, e)| *g != Some(e)) {
                        let g: Vec<String> = got.iter().map(|t| t.map_or("?".into(), |t| t.to_string())).collect();
                        let e: Vec<String> = yields.iter().map(|t| t.to_string()).collect();
                        self.err("yield", &d.loc, format!("yields ({}) but the enclosing op expects ({})", g.join(", "), e.join(", ")));
                    }
                }
            } else if last && role == BlockRole::Region {
                self.err(d.op.mnemonic(), &d.loc, "a loop body or if branch must end with `yield`".into());
            }
            for &a in &d.args {
                if !self.defined.get(a.index()).copied().unwrap_or(false) {
                    self.err(d.op.mnemonic(), &d.loc, format!("operand {a} is not defined before this use"));
                }
            }
            if d.args.iter().all(|a| self.ty(*a).is_some()) && d.results.iter().all(|r| self.ty(*r).is_some()) {
                self.inst(i);
            } else if d.results.iter().any(|r| self.ty(*r).is_none()) {
                self.err(d.op.mnemonic(), &d.loc, "a result is not in the value table".into());
            }
            for &r in &d.results {
                self.define(r, d.op.mnemonic(), &d.loc);
                scope.push(r);
            }
        }
        if role == BlockRole::Region && bd.insts.is_empty() {
            self.err("yield", &k.loc, format!("{b} is empty: a loop body or if branch must end with `yield`"));
        }
        for v in scope {
            if let Some(d) = self.defined.get_mut(v.index()) {
                *d = false;
            }
        }
    }

    fn inst(&mut self, i: Inst) {
        let k = self.k;
        let d = k.inst(i);
        let name = d.op.mnemonic();
        let loc = &d.loc;
        let args: Vec<&Type> = d.args.iter().map(|&a| k.ty(a)).collect();
        let res: Vec<&Type> = d.results.iter().map(|&r| k.ty(r)).collect();
        let mut errs: Vec<String> = Vec::new();
        macro_rules! check {
            ($cond:expr, $($fmt:tt)*) => { if !$cond { errs.push(format!($($fmt)*)); } };
        }
        let arity = |n_args: usize, n_res: usize, errs: &mut Vec<String>| -> bool {
            if args.len() != n_args || res.len() != n_res {
                errs.push(format!("takes {n_args} operand(s) and defines {n_res} result(s), found {} and {}", args.len(), res.len()));
                false
            } else {
                true
            }
        };
        match &d.op {
            Op::ProgramId { axis } | Op::NumPrograms { axis } => {
                if arity(0, 1, &mut errs) {
                    check!(*axis < 3, "axis {axis} is not 0, 1 or 2");
                    check!(*res[0] == Type::scalar(DType::I32), "result must be i32, found {}", res[0]);
                }
            }
            Op::Const { value } => {
                if arity(0, 1, &mut errs) {
                    match res[0].dtype() {
                        Some(dt) if res[0].is_scalar() => check!(value.fits(dt), "constant {value} does not fit {dt}"),
                        _ => errs.push(format!("result must be a numeric scalar, found {}", res[0])),
                    }
                }
            }
            Op::Arange { start, end } => {
                if arity(0, 1, &mut errs) {
                    // In i128: the difference of two i64 may overflow i64.
                    let n = *end as i128 - *start as i128;
                    check!(n > 0, "empty range {start}..{end}");
                    check!(n <= 0 || (n as u64).is_power_of_two(), "range length {n} is not a power of two (Triton requires one)");
                    check!(i32::try_from(*start).is_ok() && i32::try_from(*end).is_ok(), "bounds do not fit i32");
                    if n > 0 {
                        check!(*res[0] == Type::tile(DType::I32, &[n as usize]), "result must be i32[{n}], found {}", res[0]);
                    }
                }
            }
            Op::Broadcast => {
                if arity(1, 1, &mut errs) {
                    let (a, r) = (args[0], res[0]);
                    check!(a.elem == r.elem, "element type changes from {} to {}", a.elem, r.elem);
                    let ok = a.is_scalar() || (a.rank() == r.rank() && a.shape.iter().zip(&r.shape).all(|(x, y)| x == y || *x == 1));
                    check!(ok, "cannot broadcast {a} to {r}");
                }
            }
            Op::ExpandDims { axis } => {
                if arity(1, 1, &mut errs) {
                    let (a, r) = (args[0], res[0]);
                    if (*axis as usize) > a.rank() {
                        errs.push(format!("axis {axis} is out of range for {a}"));
                    } else {
                        let mut s = a.shape.clone();
                        s.insert(*axis as usize, 1);
                        check!(*r == a.with_shape(&s), "result must be {}, found {r}", a.with_shape(&s));
                    }
                }
            }
            Op::Reshape => {
                if arity(1, 1, &mut errs) {
                    let (a, r) = (args[0], res[0]);
                    check!(a.elem == r.elem, "element type changes from {} to {}", a.elem, r.elem);
                    let (na, nr) = (checked_numel(a), checked_numel(r));
                    let count = |n: Option<usize>| n.map_or("too many elements".to_string(), |n| format!("{n} elements"));
                    check!(na.is_some() && na == nr, "cannot reshape {a} ({}) to {r} ({})", count(na), count(nr));
                }
            }
            Op::Permute { perm } => {
                if arity(1, 1, &mut errs) {
                    let (a, r) = (args[0], res[0]);
                    let mut seen = vec![false; a.rank()];
                    let valid = perm.len() == a.rank()
                        && perm.iter().all(|&p| (p as usize) < a.rank() && !std::mem::replace(&mut seen[p as usize], true));
                    if !valid {
                        errs.push(format!("{perm:?} is not a permutation of the {} dims of {a}", a.rank()));
                    } else {
                        let s: Vec<usize> = perm.iter().map(|&p| a.shape[p as usize]).collect();
                        check!(*r == a.with_shape(&s), "result must be {}, found {r}", a.with_shape(&s));
                    }
                }
            }
            Op::Unary(u) => {
                if arity(1, 1, &mut errs) {
                    let a = args[0];
                    match a.dtype() {
                        None => errs.push(format!("operand must be numeric, found {a}")),
                        Some(dt) => {
                            if u.float_only() {
                                check!(dt.is_float(), "`{}` needs a float operand, found {a}", u.name());
                            } else if *u == UnaryOp::Not {
                                check!(!dt.is_float(), "`not` needs an i1 or integer operand, found {a}");
                            } else {
                                check!(!dt.is_bool(), "`{}` needs a number, found {a}", u.name());
                            }
                        }
                    }
                    check!(res[0] == a, "result type {} differs from operand type {a}", res[0]);
                }
            }
            Op::Binary(bop) => {
                if arity(2, 1, &mut errs) {
                    let (a, b) = (args[0], args[1]);
                    check!(a == b, "operands have different types {a} and {b} (front ends must broadcast and cast)");
                    match a.dtype() {
                        None => errs.push(format!("operands must be numeric, found {a} (use addptr for pointers)")),
                        Some(dt) => {
                            if bop.float_only() {
                                check!(dt.is_float(), "`{}` needs float operands, found {a}", bop.name());
                            } else if bop.int_only() {
                                check!(dt.is_int(), "`{}` needs integer operands, found {a}", bop.name());
                            } else if bop.bits_only() {
                                check!(!dt.is_float(), "`{}` needs i1 or integer operands, found {a}", bop.name());
                            } else {
                                check!(!dt.is_bool(), "`{}` needs numbers, not i1, found {a}", bop.name());
                            }
                        }
                    }
                    check!(res[0] == a, "result type {} differs from operand type {a}", res[0]);
                }
            }
            Op::Cmp(_) => {
                if arity(2, 1, &mut errs) {
                    let (a, b) = (args[0], args[1]);
                    check!(a == b, "operands have different types {a} and {b}");
                    check!(a.dtype().is_some(), "operands must be numeric, found {a}");
                    check!(*res[0] == a.with_dtype(DType::I1), "result must be {}, found {}", a.with_dtype(DType::I1), res[0]);
                }
            }
            Op::Where => {
                if arity(3, 1, &mut errs) {
                    let (c, a, b) = (args[0], args[1], args[2]);
                    check!(*c == a.with_dtype(DType::I1), "condition must be {}, found {c}", a.with_dtype(DType::I1));
                    check!(a == b, "branches have different types {a} and {b}");
                    check!(res[0] == a, "result type {} differs from operand type {a}", res[0]);
                }
            }
            Op::Cast => {
                if arity(1, 1, &mut errs) {
                    let (a, r) = (args[0], res[0]);
                    check!(a.dtype().is_some() && r.dtype().is_some(), "casts convert numbers, found {a} to {r}");
                    check!(a.shape == r.shape, "shape changes from {a} to {r}");
                }
            }
            Op::Reduce { kind, axis, keep_dims } => {
                if arity(1, 1, &mut errs) {
                    let (a, r) = (args[0], res[0]);
                    if (*axis as usize) >= a.rank() {
                        errs.push(format!("axis {axis} is out of range for {a}"));
                    } else if let Some(dt) = a.dtype() {
                        check!(!dt.is_bool(), "cannot reduce i1 values, cast them first");
                        let mut s = a.shape.clone();
                        if *keep_dims {
                            s[*axis as usize] = 1;
                        } else {
                            s.remove(*axis as usize);
                        }
                        let rd = if matches!(kind, ReduceOp::Argmax | ReduceOp::Argmin) { DType::I32 } else { dt };
                        check!(*r == Type::tile(rd, &s), "result must be {}, found {r}", Type::tile(rd, &s));
                    } else {
                        errs.push(format!("operand must be numeric, found {a}"));
                    }
                }
            }
            Op::Cumsum { axis, .. } => {
                if arity(1, 1, &mut errs) {
                    let a = args[0];
                    check!((*axis as usize) < a.rank(), "axis {axis} is out of range for {a}");
                    check!(a.dtype().is_some_and(|d| !d.is_bool()), "operand must be a number tile, found {a}");
                    check!(res[0] == a, "result type {} differs from operand type {a}", res[0]);
                }
            }
            Op::Dot { .. } => {
                if arity(3, 1, &mut errs) {
                    let (a, b, c) = (args[0], args[1], args[2]);
                    let ok = a.rank() == 2
                        && b.rank() == 2
                        && c.rank() == 2
                        && a.shape[1] == b.shape[0]
                        && c.shape[0] == a.shape[0]
                        && c.shape[1] == b.shape[1];
                    check!(ok, "shapes {a} x {b} + {c} do not match [M, K] x [K, N] + [M, N]");
                    check!(a.dtype() == b.dtype(), "operands have different dtypes {a} and {b}");
                    check!(a.dtype().is_some_and(|d| d.is_float()), "operands must be float tiles, found {a}");
                    check!(c.dtype().is_some_and(|d| d.is_float()), "accumulator must be a float tile, found {c}");
                    check!(res[0] == c, "result type {} differs from accumulator type {c}", res[0]);
                }
            }
            Op::AddPtr => {
                if arity(2, 1, &mut errs) {
                    let (p, o) = (args[0], args[1]);
                    check!(p.is_ptr(), "first operand must be a pointer, found {p}");
                    check!(o.dtype().is_some_and(|d| d.is_int()), "offset must be i32 or i64, found {o}");
                    check!(p.shape == o.shape, "pointer {p} and offset {o} have different shapes");
                    check!(res[0] == p, "result type {} differs from pointer type {p}", res[0]);
                }
            }
            Op::Load { mask, other } => {
                let n = 1 + *mask as usize + *other as usize;
                check!(!*other || *mask, "`other` requires a mask");
                if arity(n, 1, &mut errs) {
                    let p = args[0];
                    if let Elem::Ptr(dt) = p.elem {
                        let vt = Type::tile(dt, &p.shape);
                        if *mask {
                            check!(*args[1] == p.with_dtype(DType::I1), "mask must be {}, found {}", p.with_dtype(DType::I1), args[1]);
                        }
                        if *other {
                            check!(*args[2] == vt, "`other` must be {vt}, found {}", args[2]);
                        }
                        check!(*res[0] == vt, "result must be {vt}, found {}", res[0]);
                    } else {
                        errs.push(format!("loads need a pointer, found {p}"));
                    }
                }
            }
            Op::Store { mask } => {
                if arity(2 + *mask as usize, 0, &mut errs) {
                    let (p, v) = (args[0], args[1]);
                    if let Elem::Ptr(dt) = p.elem {
                        let vt = Type::tile(dt, &p.shape);
                        check!(*v == vt, "value must be {vt}, found {v} (front ends cast to the pointee dtype)");
                        if *mask {
                            check!(*args[2] == p.with_dtype(DType::I1), "mask must be {}, found {}", p.with_dtype(DType::I1), args[2]);
                        }
                    } else {
                        errs.push(format!("stores need a pointer, found {p}"));
                    }
                }
            }
            Op::AtomicAdd { mask } | Op::AtomicRmw { mask, .. } => {
                let n = 2 + *mask as usize;
                if args.len() != n || res.len() > 1 {
                    errs.push(format!(
                        "takes {n} operand(s) and defines at most one result (the old value), found {} and {}",
                        args.len(),
                        res.len()
                    ));
                } else {
                    let (p, v) = (args[0], args[1]);
                    if let Elem::Ptr(dt) = p.elem {
                        let vt = Type::tile(dt, &p.shape);
                        check!(*v == vt, "value must be {vt}, found {v} (front ends cast to the pointee dtype)");
                        if *mask {
                            check!(*args[2] == p.with_dtype(DType::I1), "mask must be {}, found {}", p.with_dtype(DType::I1), args[2]);
                        }
                        if let Some(r) = res.first() {
                            check!(**r == vt, "result (the old value) must be {vt}, found {r}");
                        }
                        if let Some(why) = atomic_dtype_problem(&d.op, dt) {
                            errs.push(why);
                        }
                    } else {
                        errs.push(format!("atomics need a pointer, found {p}"));
                    }
                }
            }
            Op::AtomicCas => {
                if arity(3, 1, &mut errs) {
                    let p = args[0];
                    if let Elem::Ptr(dt) = p.elem {
                        let vt = Type::tile(dt, &p.shape);
                        check!(*args[1] == vt, "`cmp` must be {vt}, found {}", args[1]);
                        check!(*args[2] == vt, "value must be {vt}, found {}", args[2]);
                        check!(*res[0] == vt, "result (the old value) must be {vt}, found {}", res[0]);
                        if let Some(why) = atomic_dtype_problem(&d.op, dt) {
                            errs.push(why);
                        }
                    } else {
                        errs.push(format!("atomics need a pointer, found {p}"));
                    }
                }
            }
            Op::While { cond, body, max_iters } => {
                check!(max_iters.is_none_or(|m| m > 0), "max_iters must be positive");
                if args.len() != res.len() {
                    errs.push(format!("defines one result per init value, found {} operand(s) and {} result(s)", args.len(), res.len()));
                }
                for (j, (init, r)) in args.iter().zip(&res).enumerate() {
                    check!(init == r, "carried value {j}: init is {init} but result is {r}");
                }
                for (what, b) in [("condition", cond), ("body", body)] {
                    match k.blocks.get(b.index()) {
                        Some(bd) => {
                            let pt: Vec<&Type> = bd.params.iter().filter_map(|&p| self.ty(p)).collect();
                            let ok = pt.len() == args.len() && pt.iter().zip(&args).all(|(a, b)| a == b);
                            check!(ok, "the {what} block's parameters must be the carried values, matching the init values");
                        }
                        None => errs.push(format!("{b} does not exist")),
                    }
                }
                if errs.is_empty() {
                    for &p in &k.block(*cond).params {
                        self.define(p, name, loc);
                    }
                    self.block(*cond, BlockRole::Region, &[Type::scalar(DType::I1)]);
                    for &p in &k.block(*body).params {
                        self.define(p, name, loc);
                    }
                    let ys: Vec<Type> = res.iter().map(|t| (*t).clone()).collect();
                    self.block(*body, BlockRole::Region, &ys);
                }
            }
            Op::For { body, max_iters } => {
                let carried = args.len().saturating_sub(3);
                if args.len() < 3 || res.len() != carried {
                    errs.push(format!(
                        "takes (lo, hi, step, init...) and defines one result per init value, found {} operand(s) and {} result(s)",
                        args.len(),
                        res.len()
                    ));
                } else {
                    let (lo, hi, st) = (args[0], args[1], args[2]);
                    check!(
                        lo.is_scalar() && lo.dtype().is_some_and(|d| d.is_int()),
                        "lower bound must be an i32 or i64 scalar, found {lo}"
                    );
                    check!(hi == lo && st == lo, "bounds and step must have one type, found {lo}, {hi}, {st}");
                    check!(max_iters.is_none_or(|m| m > 0), "max_iters must be positive");
                    for (j, (init, r)) in args[3..].iter().zip(&res).enumerate() {
                        check!(init == r, "carried value {j}: init is {init} but result is {r}");
                    }
                    if let Some(bd) = k.blocks.get(body.index()) {
                        let pt: Vec<&Type> = bd.params.iter().filter_map(|&p| self.ty(p)).collect();
                        let ok = pt.len() == 1 + carried && pt[0] == lo && pt[1..].iter().zip(&args[3..]).all(|(a, b)| a == b);
                        check!(ok, "body parameters must be (induction variable: {lo}, carried values...) matching the init values");
                    } else {
                        errs.push(format!("{body} does not exist"));
                    }
                }
                if errs.is_empty() {
                    for &p in &k.block(*body).params {
                        self.define(p, name, loc);
                    }
                    let ys: Vec<Type> = res.iter().map(|t| (*t).clone()).collect();
                    self.block(*body, BlockRole::Region, &ys);
                }
            }
            Op::If { then_block, else_block } => {
                if args.len() != 1 {
                    errs.push(format!("takes one condition, found {} operand(s)", args.len()));
                } else {
                    check!(*args[0] == Type::scalar(DType::I1), "condition must be an i1 scalar, found {}", args[0]);
                }
                for b in [then_block, else_block] {
                    match k.blocks.get(b.index()) {
                        Some(bd) => check!(bd.params.is_empty(), "if branches take no parameters"),
                        None => errs.push(format!("{b} does not exist")),
                    }
                }
                if errs.is_empty() {
                    let ys: Vec<Type> = res.iter().map(|t| (*t).clone()).collect();
                    self.block(*then_block, BlockRole::Region, &ys);
                    self.block(*else_block, BlockRole::Region, &ys);
                }
            }
            Op::Yield => {
                check!(res.is_empty(), "`yield` defines no results");
            }
        }
        for e in errs {
            self.err(name, loc, e);
        }
    }
}

/// Why an atomic op cannot update elements of `dt`, following Triton's rules: no i1; add on
/// any other dtype; max/min/exchange on 32- and 64-bit types; and/or/xor on integers;
/// compare-and-swap on 16-, 32- and 64-bit types.
fn atomic_dtype_problem(op: &Op, dt: DType) -> Option<String> {
    use crate::AtomicOp;
    let ok = match op {
        Op::AtomicAdd { .. } => dt != DType::I1,
        Op::AtomicRmw { kind: AtomicOp::And | AtomicOp::Or | AtomicOp::Xor, .. } => dt.is_int() && dt != DType::I1,
        Op::AtomicRmw { kind: AtomicOp::Max | AtomicOp::Min | AtomicOp::Xchg, .. } => {
            matches!(dt, DType::I32 | DType::I64 | DType::F32 | DType::F64)
        }
        _ => dt != DType::I1,
    };
    (!ok).then(|| format!("`{}` does not support {dt} elements", op.mnemonic()))
}

/// The element count of `t`, or `None` when it overflows `usize`.
fn checked_numel(t: &Type) -> Option<usize> {
    t.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

/// What is wrong with the type of value `v` on its own (rank, empty or overflowing shape).
fn value_type_problems(v: Value, ty: &Type) -> Vec<String> {
    let mut out = Vec::new();
    if ty.rank() > MAX_RANK {
        out.push(format!("value {v} has rank {}, above the maximum {MAX_RANK}", ty.rank()));
    }
    if ty.shape.contains(&0) {
        out.push(format!("value {v} has an empty dimension: {ty}"));
    } else {
        match checked_numel(ty) {
            None => out.push(format!("value {v} has too many elements: {ty}")),
            Some(n) if n > MAX_NUMEL => {
                out.push(format!("value {v} has {n} elements ({ty}), above the maximum of {MAX_NUMEL} elements per tile (Triton's limit)"))
            }
            Some(_) => {}
        }
    }
    out
}

/// `[A-Za-z_][A-Za-z0-9_]*`: what the text format and Triton accept as a name.
fn is_ident(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_') && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}
