//! Elementwise tensor expressions of the `compute` host step (`grad_x * grad_loss`,
//! `where(labels == -100, 0.0, x)`): what a launcher computes with torch between launches.
//!
//! Grammar: numbers (`2` is an integer, `2.0` and `1e-3` floats), names (a tensor, else a
//! constant), `+ - * /` (`/` is true division), `**` (`x ** 2`, `x ** 0.5`, `a ** b`: tighter
//! than a unary minus on its left, grouping to the right, as in Python), unary minus,
//! parentheses, one comparison `< <= > >= == !=` (a bool), and the functions `exp log sqrt abs tanh sigmoid` (one argument),
//! `min max` (two: torch's `minimum`/`maximum`) and `where(cond, a, b)` (`cond` a bool). Errors
//! carry the 1-based column.
//!
//! Shapes broadcast as in NumPy and torch (right-aligned, a dimension of 1 stretches; 0-d
//! tensors and numbers stretch everywhere). Dtypes promote as in torch: bool < int < float; a
//! dimensioned tensor's dtype wins within its category, then a 0-d tensor's, then a number's (an
//! integer number is i64, a float number f32), so `x_f16 * grad_loss_f32_0d` is f16 and
//! `labels_i64 * 0.5` is f32; `/` and `exp log sqrt tanh sigmoid` of integers give f32. A power
//! promotes as `*` does (`torch.pow`); one whose result is an integer needs a non-negative
//! integer number (or constant) as its exponent (torch refuses integers to negative powers).
//!
//! The VJP of `a ** b` is `b a^(b-1)` for `a` (0 where `b` is 0) and `a^b ln(a)` for `b` (0
//! where `a` is 0 and `b >= 0`), as torch's `pow` backward gives them.
//!
//! Values are computed in f64 and rounded once to the result's dtype (torch rounds after every
//! operation: a chain of f16 operations can differ from it in the last bit). The expression is
//! compiled to a flat program (operands before their operation), so that evaluating it per
//! element and differentiating it in reverse are loops, not recursion.

use super::expr::{ExprError, Scalar, Scan, MAX_DEPTH};
use std::fmt;
use tilegrad_ir::DType;

/// A parsed elementwise expression with its text.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorExpr {
    text: String,
    /// Operands before the operations that use them; the last instruction is the result.
    prog: Vec<(Ins, usize)>,
}

/// One instruction of a compiled expression (operands are indices of earlier instructions).
#[derive(Clone, Debug, PartialEq)]
enum Ins {
    Int(i64),
    Float(f64),
    /// A tensor or a constant.
    Name(String),
    Un(UnOp, usize),
    Bin(BinOp, usize, usize),
    Where(usize, usize, usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum UnOp {
    Neg,
    Exp,
    Log,
    Sqrt,
    Abs,
    Tanh,
    Sigmoid,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
    Min,
    Max,
    Pow,
}

impl BinOp {
    fn is_comparison(self) -> bool {
        matches!(self, BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge | BinOp::Eq | BinOp::Ne)
    }
}

/// What a name of an expression refers to.
#[derive(Clone, Debug, PartialEq)]
pub enum Operand {
    /// A tensor: its dtype and shape.
    Tensor(DType, Vec<usize>),
    /// A constant.
    Scalar(Scalar),
}

/// How a value takes part in dtype promotion (torch's three classes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    Number,
    ZeroDim,
    Dim,
}

/// The dtype, shape and promotion class of an instruction's value.
#[derive(Clone, Debug, PartialEq)]
struct Ty {
    dtype: DType,
    shape: Vec<usize>,
    class: Class,
}

/// The result of type-checking an expression.
#[derive(Clone, Debug, PartialEq)]
pub struct Typed {
    /// The result's dtype (before any explicit `dtype`).
    pub dtype: DType,
    /// The result's (broadcast) shape.
    pub shape: Vec<usize>,
    /// The tensors the expression reads, in order of first use.
    pub tensors: Vec<String>,
}

fn err(column: usize, message: impl Into<String>) -> ExprError {
    ExprError { column, message: message.into() }
}

/// The shape both `a` and `b` stretch to, if they broadcast.
pub fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for (i, o) in out.iter_mut().enumerate() {
        let x = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let y = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        *o = match (x, y) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// For each element (flat, row-major) of a tensor of shape `out`, the element of a tensor of
/// shape `src` (which broadcasts to `out`) it reads.
pub(crate) fn broadcast_map(src: &[usize], out: &[usize]) -> Vec<usize> {
    let n: usize = out.iter().product();
    let off = out.len() - src.len();
    // Strides of `src` per axis of `out` (0 where it stretches).
    let mut strides = vec![0usize; out.len()];
    let mut s = 1;
    for a in (0..src.len()).rev() {
        strides[a + off] = if src[a] == 1 { 0 } else { s };
        s *= src[a];
    }
    let mut map = Vec::with_capacity(n);
    let mut idx = vec![0usize; out.len()];
    let mut at = 0usize;
    for _ in 0..n {
        map.push(at);
        for a in (0..out.len()).rev() {
            idx[a] += 1;
            at += strides[a];
            if idx[a] < out[a] {
                break;
            }
            at -= strides[a] * idx[a];
            idx[a] = 0;
        }
    }
    map
}

/// torch's `combine_categories`: the dtype of a higher promotion class with a lower one.
fn combine(higher: Option<DType>, lower: Option<DType>) -> Option<DType> {
    match (higher, lower) {
        (None, l) => l,
        (h, None) => h,
        (Some(h), Some(_)) if h.is_float() => Some(h),
        (Some(h), Some(l)) if h.is_bool() || l.is_float() => Some(DType::promote(h, l)),
        (h, _) => h,
    }
}

/// torch's `result_type` of some operands.
fn result_type(ops: &[&Ty]) -> DType {
    let mut by = [None; 3];
    for t in ops {
        let slot = &mut by[t.class as usize];
        *slot = Some(slot.map_or(t.dtype, |d| DType::promote(d, t.dtype)));
    }
    combine(by[2], combine(by[1], by[0])).expect("at least one operand")
}

impl TensorExpr {
    /// Parses an expression.
    pub fn parse(text: &str) -> Result<TensorExpr, ExprError> {
        let mut p = Parser { s: text.as_bytes(), i: 0, depth: 0, prog: Vec::new() };
        p.expr()?;
        p.ws();
        if p.i < p.s.len() {
            return Err(p.err(format!("unexpected `{}`", &text[p.i..])));
        }
        Ok(TensorExpr { text: text.to_string(), prog: p.prog })
    }

    /// Parses the expression `whole[start..end]` of a larger text (an item's `sum(EXPR)`): its
    /// columns count in `whole`, and it shows as `whole`.
    pub(crate) fn parse_within(whole: &str, start: usize, end: usize) -> Result<TensorExpr, ExprError> {
        let e = TensorExpr::parse(&format!("{}{}", " ".repeat(start), &whole[start..end]))?;
        Ok(TensorExpr { text: whole.to_string(), ..e })
    }

    /// The expression as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Every name in the expression, in order of first use.
    pub fn names(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for (ins, _) in &self.prog {
            if let Ins::Name(n) = ins {
                if !out.contains(&n.as_str()) {
                    out.push(n);
                }
            }
        }
        out
    }

    /// Whether the expression is affine in its tensors (only `+`, `-` and unary minus): its VJP
    /// then needs no operand values.
    pub(crate) fn is_affine(&self) -> bool {
        self.prog.iter().all(|(ins, _)| match ins {
            Ins::Int(_) | Ins::Float(_) | Ins::Name(_) => true,
            Ins::Un(op, _) => *op == UnOp::Neg,
            Ins::Bin(op, ..) => matches!(op, BinOp::Add | BinOp::Sub),
            Ins::Where(..) => false,
        })
    }

    /// The dtype and shape of the result, names resolved by `lookup`; errors carry the column.
    pub fn check(&self, lookup: &dyn Fn(&str) -> Option<Operand>) -> Result<Typed, ExprError> {
        let tys = self.types(lookup)?;
        let last = tys.last().expect("an expression has an instruction");
        // Evaluated in f64: the result's values must fit in memory (a spec can broadcast two
        // large tensors into a huge one).
        tilegrad_reference::check_alloc(DType::F64, &last.shape).map_err(|e| err(1, e.to_string()))?;
        let mut tensors = Vec::new();
        for ((ins, _), t) in self.prog.iter().zip(&tys) {
            if let Ins::Name(n) = ins {
                if t.class != Class::Number && !tensors.contains(n) {
                    tensors.push(n.clone());
                }
            }
        }
        Ok(Typed { dtype: last.dtype, shape: last.shape.clone(), tensors })
    }

    fn types(&self, lookup: &dyn Fn(&str) -> Option<Operand>) -> Result<Vec<Ty>, ExprError> {
        let mut tys: Vec<Ty> = Vec::with_capacity(self.prog.len());
        for (ins, col) in &self.prog {
            let col = *col;
            let number = |dtype| Ty { dtype, shape: Vec::new(), class: Class::Number };
            let ty = match ins {
                Ins::Int(_) => number(DType::I64),
                Ins::Float(_) => number(DType::F32),
                Ins::Name(n) => match lookup(n) {
                    Some(Operand::Tensor(d, s)) => {
                        let class = if s.is_empty() { Class::ZeroDim } else { Class::Dim };
                        Ty { dtype: d, shape: s, class }
                    }
                    Some(Operand::Scalar(Scalar::Int(_))) => number(DType::I64),
                    Some(Operand::Scalar(Scalar::Float(_))) => number(DType::F32),
                    None => return Err(err(col, format!("no tensor or constant named `{n}`"))),
                },
                Ins::Un(op, a) => {
                    let a = &tys[*a];
                    let dtype = match op {
                        UnOp::Neg | UnOp::Abs if a.dtype.is_bool() => {
                            return Err(err(col, format!("{} of a bool", if *op == UnOp::Neg { "unary minus" } else { "abs" })))
                        }
                        UnOp::Neg | UnOp::Abs => a.dtype,
                        _ if a.dtype.is_float() => a.dtype,
                        _ => DType::F32,
                    };
                    Ty { dtype, ..a.clone() }
                }
                Ins::Bin(op, ia, ib) => {
                    let (a, b) = (&tys[*ia], &tys[*ib]);
                    let shape = broadcast(&a.shape, &b.shape)
                        .ok_or_else(|| err(col, format!("shapes {:?} and {:?} do not broadcast", a.shape, b.shape)))?;
                    let class = a.class.max(b.class);
                    let promoted = result_type(&[a, b]);
                    let dtype = match op {
                        _ if op.is_comparison() => DType::I1,
                        BinOp::Sub if a.dtype.is_bool() && b.dtype.is_bool() => {
                            return Err(err(col, "subtraction of two bools"));
                        }
                        BinOp::Div if !promoted.is_float() => DType::F32,
                        BinOp::Pow if !promoted.is_float() && !self.non_negative_int(*ib, lookup) => {
                            return Err(err(
                                col,
                                format!(
                                    "a power of {promoted}: the exponent must be a non-negative integer number (torch refuses \
                                     integers to negative powers; cast to a float first)"
                                ),
                            ));
                        }
                        _ => promoted,
                    };
                    Ty { dtype, shape, class }
                }
                Ins::Where(c, a, b) => {
                    let (c, a, b) = (&tys[*c], &tys[*a], &tys[*b]);
                    if !c.dtype.is_bool() {
                        return Err(err(col, format!("the condition of `where` is {}, not a bool (a comparison)", c.dtype)));
                    }
                    let shape = broadcast(&c.shape, &a.shape)
                        .and_then(|s| broadcast(&s, &b.shape))
                        .ok_or_else(|| err(col, format!("shapes {:?}, {:?} and {:?} do not broadcast", c.shape, a.shape, b.shape)))?;
                    Ty { dtype: result_type(&[a, b]), shape, class: c.class.max(a.class).max(b.class) }
                }
            };
            tys.push(ty);
        }
        Ok(tys)
    }
}

impl TensorExpr {
    /// Whether instruction `i` is a non-negative integer number or integer constant.
    fn non_negative_int(&self, i: usize, lookup: &dyn Fn(&str) -> Option<Operand>) -> bool {
        match &self.prog[i].0 {
            Ins::Int(v) => *v >= 0,
            Ins::Name(n) => matches!(lookup(n), Some(Operand::Scalar(Scalar::Int(v))) if v >= 0),
            _ => false,
        }
    }
}

impl fmt::Display for TensorExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

// ------------------------------------------------------------------ evaluation

/// An operand's values for evaluation: a tensor's elements (f64) and, per result element, which
/// of them it reads; or a constant.
pub(crate) enum Values {
    Tensor { values: Vec<f64>, map: Vec<usize>, float: bool },
    Scalar(f64),
}

/// An expression bound to its operands' values, ready to evaluate per element.
pub(crate) struct Bound<'a> {
    expr: &'a TensorExpr,
    /// Per instruction: the operand it reads (names only).
    leaves: Vec<Option<usize>>,
    operands: Vec<(String, Values)>,
    /// Result elements.
    pub numel: usize,
}

impl<'a> Bound<'a> {
    /// Binds the expression's names to `operands` (each name, in [`TensorExpr::names`] order),
    /// the result having shape `out`.
    pub(crate) fn new(expr: &'a TensorExpr, operands: Vec<(String, Values)>, out: &[usize]) -> Bound<'a> {
        let leaves = expr
            .prog
            .iter()
            .map(|(ins, _)| match ins {
                Ins::Name(n) => Some(operands.iter().position(|(o, _)| o == n).expect("every name is bound")),
                _ => None,
            })
            .collect();
        Bound { expr, leaves, operands, numel: out.iter().product() }
    }

    /// Fills `v` with every instruction's value at result element `e`.
    fn eval_into(&self, e: usize, v: &mut Vec<f64>) {
        v.clear();
        for ((ins, _), leaf) in self.expr.prog.iter().zip(&self.leaves) {
            let x = match ins {
                Ins::Int(i) => *i as f64,
                Ins::Float(x) => *x,
                Ins::Name(_) => match &self.operands[leaf.expect("a name is bound")].1 {
                    Values::Tensor { values, map, .. } => values[map[e]],
                    Values::Scalar(x) => *x,
                },
                Ins::Un(op, a) => {
                    let a = v[*a];
                    match op {
                        UnOp::Neg => -a,
                        UnOp::Exp => a.exp(),
                        UnOp::Log => a.ln(),
                        UnOp::Sqrt => a.sqrt(),
                        UnOp::Abs => a.abs(),
                        UnOp::Tanh => a.tanh(),
                        UnOp::Sigmoid => 1.0 / (1.0 + (-a).exp()),
                    }
                }
                Ins::Bin(op, a, b) => {
                    let (a, b) = (v[*a], v[*b]);
                    let bool = |c: bool| if c { 1.0 } else { 0.0 };
                    match op {
                        BinOp::Add => a + b,
                        BinOp::Sub => a - b,
                        BinOp::Mul => a * b,
                        BinOp::Div => a / b,
                        BinOp::Lt => bool(a < b),
                        BinOp::Le => bool(a <= b),
                        BinOp::Gt => bool(a > b),
                        BinOp::Ge => bool(a >= b),
                        BinOp::Eq => bool(a == b),
                        BinOp::Ne => bool(a != b),
                        // torch.minimum/maximum propagate NaN.
                        BinOp::Min if a.is_nan() || b.is_nan() => f64::NAN,
                        BinOp::Max if a.is_nan() || b.is_nan() => f64::NAN,
                        BinOp::Pow => a.powf(b),
                        BinOp::Min => a.min(b),
                        BinOp::Max => a.max(b),
                    }
                }
                Ins::Where(c, a, b) => {
                    if v[*c] != 0.0 {
                        v[*a]
                    } else {
                        v[*b]
                    }
                }
            };
            v.push(x);
        }
    }

    /// The result's values (f64, before rounding to its dtype).
    pub(crate) fn eval(&self) -> Vec<f64> {
        let mut v = Vec::with_capacity(self.expr.prog.len());
        (0..self.numel)
            .map(|e| {
                self.eval_into(e, &mut v);
                *v.last().expect("an expression has an instruction")
            })
            .collect()
    }

    /// The VJP: for each float tensor operand, the cotangent of its elements from `cot`, the
    /// cotangent of the result (summed over the elements it was stretched to).
    pub(crate) fn vjp(&self, cot: &[f64]) -> Vec<(String, Vec<f64>)> {
        let mut out: Vec<Option<Vec<f64>>> = self
            .operands
            .iter()
            .map(|(_, o)| match o {
                Values::Tensor { values, float: true, .. } => Some(vec![0.0; values.len()]),
                _ => None,
            })
            .collect();
        let n = self.expr.prog.len();
        let mut v = Vec::with_capacity(n);
        let mut adj = vec![0.0; n];
        for (e, &g) in cot.iter().enumerate().take(self.numel) {
            self.eval_into(e, &mut v);
            adj.iter_mut().for_each(|a| *a = 0.0);
            adj[n - 1] = g;
            for i in (0..n).rev() {
                let g = adj[i];
                match &self.expr.prog[i].0 {
                    Ins::Int(_) | Ins::Float(_) => {}
                    Ins::Name(_) => {
                        let k = self.leaves[i].expect("a name is bound");
                        if let (Some(acc), Values::Tensor { map, .. }) = (&mut out[k], &self.operands[k].1) {
                            acc[map[e]] += g;
                        }
                    }
                    Ins::Un(op, a) => {
                        let (x, y) = (v[*a], v[i]);
                        adj[*a] += match op {
                            UnOp::Neg => -g,
                            UnOp::Exp => g * y,
                            UnOp::Log => g / x,
                            UnOp::Sqrt => g * 0.5 / y,
                            UnOp::Abs => {
                                g * if x > 0.0 {
                                    1.0
                                } else if x < 0.0 {
                                    -1.0
                                } else {
                                    0.0
                                }
                            }
                            UnOp::Tanh => g * (1.0 - y * y),
                            UnOp::Sigmoid => g * y * (1.0 - y),
                        };
                    }
                    Ins::Bin(op, a, b) => {
                        let (x, y) = (v[*a], v[*b]);
                        let (ga, gb) = match op {
                            _ if op.is_comparison() => (0.0, 0.0),
                            BinOp::Add => (g, g),
                            BinOp::Sub => (g, -g),
                            BinOp::Mul => (g * y, g * x),
                            BinOp::Div => (g / y, -g * x / (y * y)),
                            BinOp::Pow => pow_vjp(g, x, y, v[i]),
                            // As torch: ties split the cotangent evenly.
                            BinOp::Min | BinOp::Max if x == y => (g / 2.0, g / 2.0),
                            BinOp::Min if x < y => (g, 0.0),
                            BinOp::Max if x > y => (g, 0.0),
                            _ => (0.0, g),
                        };
                        adj[*a] += ga;
                        adj[*b] += gb;
                    }
                    Ins::Where(c, a, b) => {
                        if v[*c] != 0.0 {
                            adj[*a] += g;
                        } else {
                            adj[*b] += g;
                        }
                    }
                }
            }
        }
        self.operands.iter().zip(out).filter_map(|((n, _), c)| c.map(|c| (n.clone(), c))).collect()
    }
}

/// The cotangents of `x` and `y` from `g`, that of `p = x ** y` (torch's `pow` backward).
fn pow_vjp(g: f64, x: f64, y: f64, p: f64) -> (f64, f64) {
    let gx = if y == 0.0 { 0.0 } else { g * y * x.powf(y - 1.0) };
    let gy = if x == 0.0 && y >= 0.0 { 0.0 } else { g * p * x.ln() };
    (gx, gy)
}

// ------------------------------------------------------------------ parsing

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    depth: usize,
    prog: Vec<(Ins, usize)>,
}

impl Scan for Parser<'_> {
    fn cursor(&mut self) -> (&[u8], &mut usize) {
        (self.s, &mut self.i)
    }
}

impl Parser<'_> {
    fn push(&mut self, ins: Ins, col: usize) -> usize {
        self.prog.push((ins, col));
        self.prog.len() - 1
    }

    /// `sum (cmp sum)?`, one level deeper than the caller.
    fn expr(&mut self) -> Result<usize, ExprError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.err(format!("expression nested deeper than {MAX_DEPTH} levels")));
        }
        let a = self.sum()?;
        self.ws();
        let col = self.i + 1;
        let ops = [("<=", BinOp::Le), (">=", BinOp::Ge), ("==", BinOp::Eq), ("!=", BinOp::Ne), ("<", BinOp::Lt), (">", BinOp::Gt)];
        let r = match ops.iter().find(|(t, _)| self.eat(t)) {
            Some(&(_, op)) => {
                let b = self.sum()?;
                self.ws();
                if ops.iter().any(|(t, _)| self.s[self.i..].starts_with(t.as_bytes())) {
                    return Err(self.err("chained comparisons: use parentheses".into()));
                }
                self.push(Ins::Bin(op, a, b), col)
            }
            None => a,
        };
        self.depth -= 1;
        Ok(r)
    }

    fn sum(&mut self) -> Result<usize, ExprError> {
        let mut a = self.term()?;
        loop {
            self.ws();
            let col = self.i + 1;
            let op = if self.eat("+") {
                BinOp::Add
            } else if self.eat("-") {
                BinOp::Sub
            } else {
                return Ok(a);
            };
            let b = self.term()?;
            a = self.push(Ins::Bin(op, a, b), col);
        }
    }

    fn term(&mut self) -> Result<usize, ExprError> {
        let mut a = self.unary()?;
        loop {
            self.ws();
            let col = self.i + 1;
            if self.s[self.i..].starts_with(b"//") {
                return Err(self.err("`//` is not supported".into()));
            }
            let op = if self.eat("*") {
                BinOp::Mul
            } else if self.eat("/") {
                BinOp::Div
            } else {
                return Ok(a);
            };
            let b = self.unary()?;
            a = self.push(Ins::Bin(op, a, b), col);
        }
    }

    fn unary(&mut self) -> Result<usize, ExprError> {
        let mut cols = Vec::new();
        loop {
            self.ws();
            let col = self.i + 1;
            if !self.eat("-") {
                break;
            }
            cols.push(col);
        }
        let mut a = self.power()?;
        for col in cols.into_iter().rev() {
            a = self.push(Ins::Un(UnOp::Neg, a), col);
        }
        Ok(a)
    }

    /// `atom ['**' unary]`: right-associative, one level deeper per `**`.
    fn power(&mut self) -> Result<usize, ExprError> {
        let base = self.atom()?;
        self.ws();
        let col = self.i + 1;
        if !self.eat("**") {
            return Ok(base);
        }
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.err(format!("expression nested deeper than {MAX_DEPTH} levels")));
        }
        let exponent = self.unary()?;
        self.depth -= 1;
        Ok(self.push(Ins::Bin(BinOp::Pow, base, exponent), col))
    }

    fn atom(&mut self) -> Result<usize, ExprError> {
        self.ws();
        let col = self.i + 1;
        let Some(&c) = self.s.get(self.i) else { return Err(self.err("expected an operand".into())) };
        if c == b'(' {
            self.i += 1;
            let e = self.expr()?;
            self.expect(")")?;
            return Ok(e);
        }
        if c.is_ascii_digit() || c == b'.' {
            return self.number();
        }
        if !(c.is_ascii_alphabetic() || c == b'_') {
            return Err(self.err(format!("unexpected `{}`", c as char)));
        }
        let start = self.i;
        while self.i < self.s.len() && (self.s[self.i].is_ascii_alphanumeric() || self.s[self.i] == b'_') {
            self.i += 1;
        }
        let name = std::str::from_utf8(&self.s[start..self.i]).expect("ASCII").to_string();
        if !self.eat("(") {
            return Ok(self.push(Ins::Name(name), col));
        }
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.err(format!("expression nested deeper than {MAX_DEPTH} levels")));
        }
        let mut args = vec![self.expr()?];
        while self.eat(",") {
            args.push(self.expr()?);
        }
        self.expect(")")?;
        self.depth -= 1;
        let un = |op| (op, 1);
        let (ins, arity) = match name.as_str() {
            "exp" => un(Ins::Un(UnOp::Exp, args[0])),
            "log" => un(Ins::Un(UnOp::Log, args[0])),
            "sqrt" => un(Ins::Un(UnOp::Sqrt, args[0])),
            "abs" => un(Ins::Un(UnOp::Abs, args[0])),
            "tanh" => un(Ins::Un(UnOp::Tanh, args[0])),
            "sigmoid" => un(Ins::Un(UnOp::Sigmoid, args[0])),
            "min" | "max" if args.len() == 2 => (Ins::Bin(if name == "min" { BinOp::Min } else { BinOp::Max }, args[0], args[1]), 2),
            "min" | "max" => (Ins::Int(0), 2),
            "where" if args.len() == 3 => (Ins::Where(args[0], args[1], args[2]), 3),
            "where" => (Ins::Int(0), 3),
            _ => {
                return Err(err(col, format!("unknown function `{name}` (exp, log, sqrt, abs, tanh, sigmoid, min, max, where)")));
            }
        };
        if args.len() != arity {
            return Err(err(col, format!("`{name}` takes {arity} argument{}, got {}", if arity == 1 { "" } else { "s" }, args.len())));
        }
        Ok(self.push(ins, col))
    }

    fn number(&mut self) -> Result<usize, ExprError> {
        let col = self.i + 1;
        let start = self.i;
        let digits = |p: &mut Self| {
            while p.i < p.s.len() && (p.s[p.i].is_ascii_digit() || p.s[p.i] == b'_') {
                p.i += 1;
            }
        };
        digits(self);
        let mut float = false;
        if self.s.get(self.i) == Some(&b'.') {
            float = true;
            self.i += 1;
            digits(self);
        }
        if matches!(self.s.get(self.i), Some(b'e' | b'E')) {
            float = true;
            self.i += 1;
            if matches!(self.s.get(self.i), Some(b'+' | b'-')) {
                self.i += 1;
            }
            digits(self);
        }
        let text: String = std::str::from_utf8(&self.s[start..self.i]).expect("ASCII").replace('_', "");
        let ins = if float {
            Ins::Float(text.parse().map_err(|_| err(col, format!("bad number `{text}`")))?)
        } else {
            Ins::Int(text.parse().map_err(|_| err(col, format!("integer `{text}` does not fit 64 bits")))?)
        };
        Ok(self.push(ins, col))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn t(d: DType, s: &[usize]) -> Operand {
        Operand::Tensor(d, s.to_vec())
    }

    /// The type of `text` with tensors `a`, `b`, `c` as given and a constant `K = 3`.
    fn ty(text: &str, ops: &[(&str, Operand)]) -> Result<(DType, Vec<usize>), ExprError> {
        let e = TensorExpr::parse(text)?;
        let lookup =
            |n: &str| ops.iter().find(|(o, _)| *o == n).map(|(_, v)| v.clone()).or((n == "K").then_some(Operand::Scalar(Scalar::Int(3))));
        e.check(&lookup).map(|t| (t.dtype, t.shape))
    }

    #[test]
    fn promotion_follows_torch() {
        use DType::*;
        type Case<'a> = (&'a str, &'a [(&'a str, Operand)], DType);
        let cases: &[Case] = &[
            // A 0-d tensor does not widen a dimensioned float tensor; a wider dimensioned one wins.
            ("a * b", &[("a", t(F16, &[3])), ("b", t(F32, &[]))], F16),
            ("a * b", &[("a", t(F16, &[3])), ("b", t(F32, &[3]))], F32),
            ("a + b", &[("a", t(F16, &[3])), ("b", t(BF16, &[3]))], F32),
            ("a + b", &[("a", t(F16, &[])), ("b", t(F32, &[]))], F32),
            // Float beats int, whatever the class: an int tensor with a float 0-d tensor takes its dtype.
            ("a + b", &[("a", t(I32, &[3])), ("b", t(F64, &[]))], F64),
            ("a * 0.5", &[("a", t(I64, &[3]))], F32),
            ("a * 2.5", &[("a", t(F16, &[3]))], F16),
            ("a * 2.5", &[("a", t(F64, &[]))], F64),
            // Within ints, the dimensioned tensor wins; numbers are i64 only on their own.
            ("a + b", &[("a", t(I32, &[3])), ("b", t(I64, &[]))], I32),
            ("a + K", &[("a", t(I32, &[3]))], I32),
            ("1 + K", &[], I64),
            ("1.0 + 2", &[], F32),
            ("a + 1", &[("a", t(I1, &[3]))], I64),
            ("a * b", &[("a", t(I1, &[3])), ("b", t(F16, &[3]))], F16),
            // True division and transcendental functions of ints give the default float.
            ("a / b", &[("a", t(I32, &[3])), ("b", t(I32, &[3]))], F32),
            ("exp(a)", &[("a", t(I64, &[3]))], F32),
            ("abs(a)", &[("a", t(I32, &[3]))], I32),
            ("sqrt(a)", &[("a", t(BF16, &[3]))], BF16),
            // Comparisons give bools; `where` promotes its branches only.
            ("a < b", &[("a", t(F32, &[3])), ("b", t(I32, &[3]))], I1),
            ("where(a == -100, 0.0, b)", &[("a", t(I64, &[3])), ("b", t(F16, &[3]))], F16),
            ("where(a == -100, 0, b)", &[("a", t(I64, &[3])), ("b", t(I32, &[3]))], I32),
            ("where(a != 0, 1.0, 0.5)", &[("a", t(I64, &[3]))], F32),
            ("min(a, b)", &[("a", t(F16, &[3])), ("b", t(F64, &[]))], F16),
        ];
        for (text, ops, want) in cases {
            assert_eq!(ty(text, ops).unwrap().0, *want, "{text} with {ops:?}");
        }
    }

    #[test]
    fn shapes_broadcast_and_errors_have_columns() {
        use DType::*;
        let ops = [("a", t(F32, &[4, 1, 3])), ("b", t(F32, &[5, 1])), ("c", t(F32, &[7])), ("s", t(F32, &[])), ("i", t(I64, &[5, 3]))];
        assert_eq!(ty("a + b", &ops).unwrap().1, vec![4, 5, 3]);
        assert_eq!(ty("s * 2", &ops).unwrap().1, Vec::<usize>::new());
        assert_eq!(ty("where(i > 0, a, s)", &ops).unwrap().1, vec![4, 5, 3]);
        let e = |text: &str| ty(text, &ops).unwrap_err();
        let bad = e("a + b * c");
        assert_eq!(bad.column, 3, "{bad}");
        assert!(bad.message.contains("[4, 1, 3] and [5, 7] do not broadcast"), "{bad}");
        let bad = e("b + a * c");
        assert_eq!(bad.column, 7, "{bad}");
        assert!(bad.message.contains("[4, 1, 3] and [7] do not broadcast"), "{bad}");
        assert_eq!(e("a + nope").column, 5);
        assert!(e("a + nope").message.contains("no tensor or constant named `nope`"));
        assert!(e("where(a, a, a)").message.contains("not a bool"));
        assert_eq!(e("s + -(i > 0)").column, 5);
        assert!(e("(i > 0) - (i < 0)").message.contains("two bools"));
        // Parse errors.
        let p = |text: &str| TensorExpr::parse(text).unwrap_err();
        assert_eq!(p("a + ").column, 5);
        assert_eq!(p("a + foo(a)").column, 5);
        assert!(p("a + foo(a)").message.contains("unknown function `foo`"));
        assert!(p("min(a)").message.contains("takes 2 arguments, got 1"));
        assert!(p("exp(a, b)").message.contains("takes 1 argument, got 2"));
        assert!(p("a < b < c").message.contains("chained comparisons"));
        assert!(p("a // b").message.contains("`//` is not supported"));
        assert!(p("a $ b").message.contains("unexpected `$ b`"));
        assert!(p("99999999999999999999").message.contains("does not fit"));
        let deep = format!("{}a{}", "(".repeat(MAX_DEPTH + 1), ")".repeat(MAX_DEPTH + 1));
        assert!(p(&deep).message.contains("nested deeper"));
        let deep_call = format!("{}a{}", "exp(".repeat(MAX_DEPTH), ")".repeat(MAX_DEPTH));
        assert!(p(&deep_call).message.contains("nested deeper"));
        // Long flat chains and runs of minus are loops, not recursion.
        let long = vec!["a"; 5000].join(" + ");
        assert_eq!(ty(&long, &ops).unwrap().1, vec![4, 1, 3]);
        assert!(TensorExpr::parse(&format!("{}a", "-".repeat(5000))).is_ok());
        // Sizes are checked: broadcasting huge dimensions is an error, not an overflow.
        let huge = [("x", t(F32, &[1 << 40, 1])), ("y", t(F32, &[1 << 40]))];
        assert!(ty("x + y", &huge).is_err());
        let big = [("x", t(F32, &[1 << 24, 1])), ("y", t(F32, &[1 << 24]))];
        assert!(ty("x + y", &big).unwrap_err().message.contains("needs"), "2^48 elements do not fit in memory");
    }

    /// Random token soup parses to a value or an error, and what parses type-checks and evaluates
    /// (values and VJP) without panicking.
    #[test]
    fn random_expressions_never_panic() {
        let toks = [
            "a", "b", "c", "i", "K", "1", "2.5", "1e3", "_", ".", "+", "-", "*", "/", "(", ")", ",", "<", "<=", "==", "!=", ">", "exp(",
            "where(", "min(", "max(", "sigmoid(", "é", " ", "//", "0x1", "**",
        ];
        let ops = [("a", t(DType::F32, &[3, 1])), ("b", t(DType::F16, &[4])), ("c", t(DType::F32, &[])), ("i", t(DType::I64, &[3, 4]))];
        let lookup =
            |n: &str| ops.iter().find(|(o, _)| *o == n).map(|(_, v)| v.clone()).or((n == "K").then_some(Operand::Scalar(Scalar::Int(3))));
        let mut rng = StdRng::seed_from_u64(1);
        let mut evaluated = 0;
        for _ in 0..20000 {
            let n = rng.gen_range(1..12);
            let text: String = (0..n).map(|_| toks[rng.gen_range(0..toks.len())]).collect();
            let Ok(e) = TensorExpr::parse(&text) else { continue };
            let Ok(typed) = e.check(&lookup) else { continue };
            let operands = e
                .names()
                .into_iter()
                .map(|n| match lookup(n) {
                    Some(Operand::Tensor(d, s)) => {
                        let k = s.iter().product();
                        (
                            n.to_string(),
                            Values::Tensor {
                                values: (0..k).map(|j| j as f64 - 1.5).collect(),
                                map: broadcast_map(&s, &typed.shape),
                                float: d.is_float(),
                            },
                        )
                    }
                    _ => (n.to_string(), Values::Scalar(3.0)),
                })
                .collect();
            let b = Bound::new(&e, operands, &typed.shape);
            let v = b.eval();
            let _ = b.vjp(&vec![1.0; v.len()]);
            evaluated += 1;
        }
        assert!(evaluated > 500, "only {evaluated} expressions evaluated");
    }

    #[test]
    fn broadcast_map_reads_the_stretched_element() {
        let out = [3, 4, 5];
        for src in [&[3, 4, 5][..], &[4, 5], &[5], &[], &[4, 1], &[3, 1, 5], &[1, 1, 1]] {
            let map = broadcast_map(src, &out);
            for (e, &m) in map.iter().enumerate() {
                let idx = [e / 20, e / 5 % 4, e % 5];
                let off = out.len() - src.len();
                let mut want = 0;
                for (a, &d) in src.iter().enumerate() {
                    want = want * d + if d == 1 { 0 } else { idx[a + off] };
                }
                assert_eq!(m, want, "src {src:?} element {e}");
            }
        }
    }

    /// Binds `expr` to tensors of the given shapes filled with values from `data`.
    fn bound<'a>(expr: &'a TensorExpr, ops: &[(&str, DType, Vec<usize>, Vec<f64>)], consts: &[(&str, f64)]) -> (Bound<'a>, Vec<usize>) {
        let lookup = |n: &str| match ops.iter().find(|(o, ..)| *o == n) {
            Some((_, d, s, _)) => Some(Operand::Tensor(*d, s.clone())),
            None => consts.iter().find(|(c, _)| *c == n).map(|(_, v)| Operand::Scalar(Scalar::Float(*v))),
        };
        let typed = expr.check(&lookup).unwrap();
        let operands = expr
            .names()
            .into_iter()
            .map(|n| match ops.iter().find(|(o, ..)| *o == n) {
                Some((_, d, s, v)) => {
                    (n.to_string(), Values::Tensor { values: v.clone(), map: broadcast_map(s, &typed.shape), float: d.is_float() })
                }
                None => (n.to_string(), Values::Scalar(consts.iter().find(|(c, _)| *c == n).unwrap().1)),
            })
            .collect();
        (Bound::new(expr, operands, &typed.shape), typed.shape)
    }

    const R: usize = 7;
    const C: usize = 13;

    /// Operands of a non-round shape: `x` [R, C], `row` [C], `col` [R, 1], `s` 0-d, `lab` [R, 1] i64.
    fn operands(rng: &mut StdRng) -> Vec<(&'static str, DType, Vec<usize>, Vec<f64>)> {
        let mut v = |n: usize| (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect::<Vec<f64>>();
        let (x, row, col, s) = (v(R * C), v(C), v(R), v(1));
        let lab: Vec<f64> = (0..R).map(|r| if r % 3 == 1 { -100.0 } else { (r % 4) as f64 }).collect();
        vec![
            ("x", DType::F32, vec![R, C], x),
            ("row", DType::F32, vec![C], row),
            ("col", DType::F32, vec![R, 1], col),
            ("s", DType::F32, vec![], s),
            ("lab", DType::I64, vec![R, 1], lab),
        ]
    }

    const EXPR: &str = "where(lab == -100, 0.0, x * s - row / (1.5 + abs(col)) + max(x, row) * min(col, s) + exp(-x * x) \
                        + log(2 + tanh(x + col)) - sqrt(1 + row * row) * sigmoid(x - K))";

    /// The same by plain loops.
    fn by_hand(o: &[(&str, DType, Vec<usize>, Vec<f64>)], k: f64) -> Vec<f64> {
        let (x, row, col, s, lab) = (&o[0].3, &o[1].3, &o[2].3, o[3].3[0], &o[4].3);
        let mut out = Vec::new();
        for r in 0..R {
            for c in 0..C {
                let (xv, rv, cv) = (x[r * C + c], row[c], col[r]);
                let sig = 1.0 / (1.0 + (-(xv - k)).exp());
                let v = xv * s - rv / (1.5 + cv.abs()) + xv.max(rv) * cv.min(s) + (-xv * xv).exp() + (2.0 + (xv + cv).tanh()).ln()
                    - (1.0 + rv * rv).sqrt() * sig;
                out.push(if lab[r] == -100.0 { 0.0 } else { v });
            }
        }
        out
    }

    #[test]
    fn values_match_plain_loops_with_broadcasting() {
        let mut rng = StdRng::seed_from_u64(7);
        let ops = operands(&mut rng);
        let e = TensorExpr::parse(EXPR).unwrap();
        let (b, shape) = bound(&e, &ops, &[("K", 0.25)]);
        assert_eq!(shape, vec![R, C]);
        let got = b.eval();
        let want = by_hand(&ops, 0.25);
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-12 * w.abs().max(1.0), "element {i}: {g} vs {w}");
        }
        assert!(want.contains(&0.0) && want.iter().any(|&w| w != 0.0));
    }

    #[test]
    fn vjp_matches_central_differences() {
        let mut rng = StdRng::seed_from_u64(11);
        let ops = operands(&mut rng);
        let e = TensorExpr::parse(EXPR).unwrap();
        let cot: Vec<f64> = (0..R * C).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let (b, _) = bound(&e, &ops, &[("K", 0.25)]);
        let grads = b.vjp(&cot);
        // Every float tensor gets a cotangent of its own shape; the int labels get none.
        let names: Vec<&str> = grads.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["x", "s", "row", "col"]);
        let loss = |o: &[(&str, DType, Vec<usize>, Vec<f64>)]| -> f64 { by_hand(o, 0.25).iter().zip(&cot).map(|(a, b)| a * b).sum() };
        for (n, g) in &grads {
            let k = ops.iter().position(|(o, ..)| o == n).unwrap();
            assert_eq!(g.len(), ops[k].3.len(), "{n}");
            for (j, &gj) in g.iter().enumerate() {
                let h = 1e-6;
                let mut p = ops.clone();
                p[k].3[j] += h;
                let mut m = ops.clone();
                m[k].3[j] -= h;
                let fd = (loss(&p) - loss(&m)) / (2.0 * h);
                assert!((fd - gj).abs() <= 1e-6 * fd.abs().max(1.0), "d/d{n}[{j}]: AD {gj} vs FD {fd}");
            }
        }
    }

    #[test]
    fn powers_parse_as_python_and_their_vjp_matches_central_differences() {
        let mut rng = StdRng::seed_from_u64(13);
        let ops = operands(&mut rng);
        // -x ** 2 is -(x ** 2); 2 ** 3 ** 2 is 2 ** 9; the exponent may be negative or a tensor.
        let text = "-x ** 2 + abs(col) ** 0.5 + (1.5 + sigmoid(x)) ** row - s ** 3 / (2 + x ** 2) + 2.0 ** 3 ** 2 * 1e-3 \
                    + (2 + x * x) ** -1 + x ** K";
        let e = TensorExpr::parse(text).unwrap();
        let hand = |o: &[(&str, DType, Vec<usize>, Vec<f64>)]| -> Vec<f64> {
            let (x, row, col, s) = (&o[0].3, &o[1].3, &o[2].3, o[3].3[0]);
            let mut out = Vec::new();
            for r in 0..R {
                for c in 0..C {
                    let (xv, rv, cv) = (x[r * C + c], row[c], col[r]);
                    let sig = 1.0 / (1.0 + (-xv).exp());
                    out.push(
                        -(xv * xv) + cv.abs().sqrt() + (1.5 + sig).powf(rv) - s * s * s / (2.0 + xv * xv)
                            + 512.0 * 1e-3
                            + 1.0 / (2.0 + xv * xv)
                            + xv * xv * xv,
                    );
                }
            }
            out
        };
        let (b, _) = bound(&e, &ops, &[("K", 3.0)]);
        for (g, w) in b.eval().iter().zip(hand(&ops)) {
            assert!((g - w).abs() <= 1e-12 * w.abs().max(1.0), "{g} vs {w}");
        }
        let cot: Vec<f64> = (0..R * C).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let grads = b.vjp(&cot);
        assert_eq!(grads.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["x", "col", "row", "s"]);
        let loss = |o: &[(&str, DType, Vec<usize>, Vec<f64>)]| -> f64 { hand(o).iter().zip(&cot).map(|(a, b)| a * b).sum() };
        for (n, g) in &grads {
            let k = ops.iter().position(|(o, ..)| o == n).unwrap();
            for (j, &gj) in g.iter().enumerate() {
                let h = 1e-6;
                let (mut p, mut m) = (ops.clone(), ops.clone());
                p[k].3[j] += h;
                m[k].3[j] -= h;
                let fd = (loss(&p) - loss(&m)) / (2.0 * h);
                assert!((fd - gj).abs() <= 1e-6 * fd.abs().max(1.0), "d/d{n}[{j}]: AD {gj} vs FD {fd}");
            }
        }
        // At 0: `0 ** 0` has no cotangent for its base, `0 ** y` none for its exponent.
        let e = TensorExpr::parse("a ** b").unwrap();
        let ops = vec![("a", DType::F32, vec![3], vec![0.0, 0.0, 2.0]), ("b", DType::F32, vec![3], vec![0.0, 2.5, 3.0])];
        let (b, _) = bound(&e, &ops, &[]);
        assert_eq!(b.eval(), vec![1.0, 0.0, 8.0]);
        let g = b.vjp(&[1.0, 1.0, 1.0]);
        assert_eq!(g[0].1, vec![0.0, 0.0, 12.0]);
        assert_eq!(g[1].1, vec![0.0, 0.0, 8.0 * 2f64.ln()]);
    }

    #[test]
    fn powers_promote_as_torch_and_refuse_integers_to_negative_powers() {
        use DType::*;
        let ops = [("a", t(I64, &[3])), ("h", t(F16, &[3])), ("s", t(F32, &[]))];
        assert_eq!(ty("a ** 2", &ops).unwrap().0, I64);
        assert_eq!(ty("a ** K", &ops).unwrap().0, I64);
        assert_eq!(ty("a ** 0.5", &ops).unwrap().0, F32);
        assert_eq!(ty("h ** 2", &ops).unwrap().0, F16);
        assert_eq!(ty("h ** s", &ops).unwrap().0, F16);
        assert_eq!(ty("2 ** h", &ops).unwrap().0, F16);
        for text in ["a ** -1", "a ** a", "2 ** a"] {
            let e = ty(text, &ops).unwrap_err();
            assert!(e.message.contains("non-negative integer number"), "{text}: {e}");
            assert_eq!(e.column, text.find("**").unwrap() + 1, "{text}: {e}");
        }
        assert!(TensorExpr::parse("a ** ").unwrap_err().message.contains("expected an operand"));
        let tower = vec!["a"; 200].join(" ** ");
        assert!(TensorExpr::parse(&tower).unwrap_err().message.contains("nested deeper"));
    }

    #[test]
    fn ties_of_min_and_max_share_the_cotangent_and_masks_carry_none() {
        let e = TensorExpr::parse("max(a, b) + min(a, b) * (a > 0)").unwrap();
        let ops = vec![("a", DType::F32, vec![2], vec![1.0, 2.0]), ("b", DType::F32, vec![2], vec![1.0, 3.0])];
        let (b, _) = bound(&e, &ops, &[]);
        let g = b.vjp(&[1.0, 1.0]);
        assert_eq!(g, vec![("a".to_string(), vec![1.0, 1.0]), ("b".to_string(), vec![1.0, 1.0])]);
        assert_eq!(b.eval(), vec![2.0, 5.0]);
    }
}
