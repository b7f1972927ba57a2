//! Size expressions: how launch grids, scalar arguments and shapes are computed from the tensors
//! of a check, the way a Python launcher writes them (`cdiv(ROWS, 16)`, `x.stride(0)`,
//! `x.shape[1] * 2`).
//!
//! Grammar: integers and floats, names of constants, `+ - * / // %` (Python semantics: `//` and
//! `%` floor, `/` is true division), `**`, unary minus, parentheses, `cdiv(a, b)`,
//! `min(a, b, ...)`, `max(a, b, ...)`, `next_power_of_2(n)`, `sqrt(x)`, `exp(x)`, `log(x)`
//! (floats), and on a tensor name `t.stride(i)`, `t.size(i)`, `t.shape[i]`, `t.numel()`
//! (negative `i` counts from the end); comparisons `< <= > >= == !=` (chained as in Python:
//! `0 < x < 8`), `and`, `or`, `not`, `True`, `False` and conditional expressions
//! (`1024 if N > 4096 else 512`), as heuristics and launchers write them. Errors carry the
//! 1-based column in the expression.
//!
//! Python's rules throughout: `**` binds tighter than a unary minus on its left (`-2 ** 2` is
//! -4) and groups to the right (`2 ** 3 ** 2` is 512); an integer to a non-negative integer
//! power is an integer, any other power a float (`2 ** -1` is 0.5; a negative number to a
//! fractional power, which Python makes complex, is an error). A comparison, `not` and the
//! booleans are the integers 1 and 0; `a and b` and `a or b` give one of their operands (`0 or
//! 5` is 5), and only the branch a condition chooses is evaluated. Precedence, loosest first:
//! `if else`, `or`, `and`, `not`, comparisons, `+ -`, `* / // %`, unary minus, `**`.

use std::fmt;

/// A value of an expression.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
}

impl Scalar {
    /// As a float.
    pub fn as_f64(self) -> f64 {
        match self {
            Scalar::Int(i) => i as f64,
            Scalar::Float(f) => f,
        }
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Int(i) => write!(f, "{i}"),
            Scalar::Float(x) => write!(f, "{x:?}"),
        }
    }
}

/// What an expression's names refer to.
pub trait Scope {
    /// A named constant.
    fn constant(&self, name: &str) -> Option<Scalar>;
    /// The shape of a named tensor.
    fn shape(&self, name: &str) -> Option<Vec<usize>>;
}

/// An error in an expression: what, and the column (1-based) where.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("column {column}: {message}")]
pub struct ExprError {
    /// 1-based column in the expression text.
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

/// A parsed expression with its text.
#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    text: String,
    node: Node,
}

/// The deepest nesting of parentheses, calls and operator levels accepted: far beyond what a
/// launcher writes, and shallow enough that parsing and evaluating never exhaust the stack.
pub const MAX_DEPTH: usize = 64;

/// A parsed expression. Chains of operators of one precedence (`a + b - c`, `a * b // c`) are
/// flat lists and runs of unary minus are a count, so that a long expression is not a deep tree:
/// only parentheses and calls nest, and they are bounded by [`MAX_DEPTH`].
#[derive(Clone, Debug, PartialEq)]
enum Node {
    Num(Scalar),
    Name(String, usize),
    /// `-` applied this many times (at this column).
    Neg(usize, Box<Node>, usize),
    /// The first operand, then each operator (at its column) with its right operand, applied
    /// left to right.
    Chain(Box<Node>, Vec<(BinOp, Node, usize)>),
    Call(Func, Vec<Node>, usize),
    Tensor(String, Prop, i64, usize),
    /// `base ** exponent` (the column of `**`).
    Pow(Box<Node>, Box<Node>, usize),
    /// A chain of comparisons, `a < b <= c` (each comparison's operator and column).
    Compare(Box<Node>, Vec<(CmpOp, Node, usize)>),
    /// `a and b and ...` (`true`) or `a or b or ...` (`false`).
    Logic(bool, Vec<Node>),
    /// `not` applied this many times.
    Not(usize, Box<Node>),
    /// `then if cond else otherwise`.
    If(Box<Node>, Box<Node>, Box<Node>),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum CmpOp {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

/// The words that are not names.
const KEYWORDS: [&str; 5] = ["if", "else", "and", "or", "not"];

#[derive(Clone, Copy, Debug, PartialEq)]
enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    FloorDiv,
    Mod,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Func {
    Cdiv,
    Min,
    Max,
    NextPow2,
    Sqrt,
    Exp,
    Log,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Prop {
    Stride,
    Size,
    Numel,
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl From<i64> for Expr {
    fn from(i: i64) -> Expr {
        Expr { text: i.to_string(), node: Node::Num(Scalar::Int(i)) }
    }
}

impl From<f64> for Expr {
    fn from(x: f64) -> Expr {
        Expr { text: format!("{x:?}"), node: Node::Num(Scalar::Float(x)) }
    }
}

impl Expr {
    /// Parses an expression.
    pub fn parse(text: &str) -> Result<Expr, ExprError> {
        let mut p = Parser { s: text.as_bytes(), i: 0, depth: 0 };
        let node = p.expr()?;
        p.ws();
        if p.i < p.s.len() {
            return Err(p.err(format!("unexpected `{}`", &text[p.i..])));
        }
        Ok(Expr { text: text.to_string(), node })
    }

    /// The expression as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The name this expression consists of, if it is a bare name (a tensor, in an argument).
    pub fn as_name(&self) -> Option<&str> {
        match &self.node {
            Node::Name(n, _) => Some(n),
            _ => None,
        }
    }

    /// The tensors the expression refers to.
    pub fn tensors(&self) -> Vec<String> {
        fn go(n: &Node, out: &mut Vec<String>) {
            match n {
                Node::Num(_) | Node::Name(..) => {}
                Node::Neg(_, a, _) => go(a, out),
                Node::Chain(a, rest) => {
                    go(a, out);
                    rest.iter().for_each(|(_, b, _)| go(b, out));
                }
                Node::Call(_, args, _) | Node::Logic(_, args) => args.iter().for_each(|a| go(a, out)),
                Node::Tensor(t, ..) => out.push(t.clone()),
                Node::Pow(a, b, _) => {
                    go(a, out);
                    go(b, out);
                }
                Node::Compare(a, rest) => {
                    go(a, out);
                    rest.iter().for_each(|(_, b, _)| go(b, out));
                }
                Node::Not(_, a) => go(a, out),
                Node::If(a, c, b) => [a, c, b].into_iter().for_each(|n| go(n, out)),
            }
        }
        let mut out = Vec::new();
        go(&self.node, &mut out);
        out
    }

    /// The names of constants the expression refers to (not tensors' names), in order.
    pub fn names(&self) -> Vec<String> {
        fn go(n: &Node, out: &mut Vec<String>) {
            match n {
                Node::Num(_) | Node::Tensor(..) => {}
                Node::Name(name, _) => out.push(name.clone()),
                Node::Neg(_, a, _) | Node::Not(_, a) => go(a, out),
                Node::Chain(a, rest) => {
                    go(a, out);
                    rest.iter().for_each(|(_, b, _)| go(b, out));
                }
                Node::Compare(a, rest) => {
                    go(a, out);
                    rest.iter().for_each(|(_, b, _)| go(b, out));
                }
                Node::Call(_, args, _) | Node::Logic(_, args) => args.iter().for_each(|a| go(a, out)),
                Node::Pow(a, b, _) => {
                    go(a, out);
                    go(b, out);
                }
                Node::If(a, c, b) => [a, c, b].into_iter().for_each(|n| go(n, out)),
            }
        }
        let mut out = Vec::new();
        go(&self.node, &mut out);
        out
    }

    /// Evaluates the expression.
    pub fn eval(&self, scope: &dyn Scope) -> Result<Scalar, ExprError> {
        eval(&self.node, scope)
    }

    /// Evaluates to an integer (an error names a float result).
    pub fn eval_int(&self, scope: &dyn Scope) -> Result<i64, ExprError> {
        match self.eval(scope)? {
            Scalar::Int(i) => Ok(i),
            Scalar::Float(x) => Err(ExprError { column: 1, message: format!("expected an integer, `{}` is {x:?}", self.text) }),
        }
    }

    /// Evaluates to a size (a non-negative integer).
    pub fn eval_size(&self, scope: &dyn Scope) -> Result<usize, ExprError> {
        let i = self.eval_int(scope)?;
        usize::try_from(i).map_err(|_| ExprError { column: 1, message: format!("expected a size, `{}` is {i}", self.text) })
    }
}

fn eval(n: &Node, scope: &dyn Scope) -> Result<Scalar, ExprError> {
    use Scalar::{Float, Int};
    Ok(match n {
        Node::Num(s) => *s,
        Node::Name(name, col) => scope.constant(name).ok_or_else(|| {
            let msg = if scope.shape(name).is_some() {
                format!("`{name}` is a tensor; use `{name}.size(i)`, `{name}.stride(i)` or `{name}.numel()` for a number")
            } else {
                format!("unknown name `{name}`")
            };
            ExprError { column: *col, message: msg }
        })?,
        Node::Neg(times, a, col) => match eval(a, scope)? {
            // An even number of minuses is the value itself (Python's integers do not overflow).
            v if times % 2 == 0 => v,
            Int(i) => Int(i.checked_neg().ok_or_else(|| ExprError { column: *col, message: format!("integer overflow: -({i})") })?),
            Float(x) => Float(-x),
        },
        Node::Chain(first, rest) => {
            let mut acc = eval(first, scope)?;
            for (op, b, col) in rest {
                acc = binary(*op, acc, eval(b, scope)?, *col)?;
            }
            acc
        }
        Node::Call(f, args, col) => {
            let vals = args.iter().map(|a| eval(a, scope)).collect::<Result<Vec<_>, _>>()?;
            let err = |m: String| ExprError { column: *col, message: m };
            match f {
                Func::Cdiv => match vals[..] {
                    [Int(a), Int(b)] if b > 0 => Int(a.div_euclid(b) + i64::from(a.rem_euclid(b) != 0)),
                    [Int(_), Int(b)] => return Err(err(format!("cdiv by {b}: the divisor must be positive"))),
                    _ => return Err(err("cdiv takes two integers".into())),
                },
                Func::NextPow2 => match vals[..] {
                    [Int(a)] if (0..=1 << 62).contains(&a) => Int((a.max(1) as u64).next_power_of_two() as i64),
                    _ => return Err(err("next_power_of_2 takes an integer in 0..=2^62".into())),
                },
                Func::Sqrt | Func::Exp | Func::Log => {
                    let x = vals[0].as_f64();
                    let y = match f {
                        Func::Sqrt if x >= 0.0 => x.sqrt(),
                        Func::Log if x > 0.0 => x.ln(),
                        Func::Exp => x.exp(),
                        _ => return Err(err(format!("{} of {x} is not a real number", if *f == Func::Sqrt { "sqrt" } else { "log" }))),
                    };
                    Float(y)
                }
                Func::Min | Func::Max => {
                    let pick = |a: Scalar, b: Scalar| {
                        let less = a.as_f64() < b.as_f64();
                        if less == (*f == Func::Min) {
                            a
                        } else {
                            b
                        }
                    };
                    vals.into_iter().reduce(pick).ok_or_else(|| err("min/max need at least one argument".into()))?
                }
            }
        }
        Node::Pow(a, b, col) => pow(eval(a, scope)?, eval(b, scope)?, *col)?,
        Node::Compare(first, rest) => {
            // Python's chain: each operand evaluated once, stopping at the first false link.
            let mut left = eval(first, scope)?;
            for (op, b, _) in rest {
                let right = eval(b, scope)?;
                if !compare(*op, left, right) {
                    return Ok(Int(0));
                }
                left = right;
            }
            Int(1)
        }
        Node::Logic(and, operands) => {
            let mut v = Int(i64::from(*and));
            for o in operands {
                v = eval(o, scope)?;
                if truthy(v) != *and {
                    break;
                }
            }
            v
        }
        Node::Not(times, a) => {
            let t = truthy(eval(a, scope)?);
            Int(i64::from(if times % 2 == 1 { !t } else { t }))
        }
        Node::If(then, cond, otherwise) => {
            if truthy(eval(cond, scope)?) {
                eval(then, scope)?
            } else {
                eval(otherwise, scope)?
            }
        }
        Node::Tensor(t, prop, axis, col) => {
            let shape = scope.shape(t).ok_or_else(|| ExprError { column: *col, message: format!("unknown tensor `{t}`") })?;
            let count = |dims: &[usize]| {
                dims.iter().try_fold(1i64, |n, &d| i64::try_from(d).ok().and_then(|d| n.checked_mul(d))).ok_or_else(|| ExprError {
                    column: *col,
                    message: format!("the element count of `{t}` (shape {shape:?}) does not fit 64 bits"),
                })
            };
            if *prop == Prop::Numel {
                return Ok(Int(count(&shape)?));
            }
            let rank = shape.len() as i64;
            let a = if *axis < 0 { axis + rank } else { *axis };
            if a < 0 || a >= rank {
                return Err(ExprError { column: *col, message: format!("axis {axis} of `{t}`, which has rank {rank}") });
            }
            let a = a as usize;
            match prop {
                Prop::Size => Int(count(&shape[a..=a])?),
                Prop::Stride => Int(count(&shape[a + 1..])?),
                Prop::Numel => unreachable!("handled above"),
            }
        }
    })
}

/// Python's truth of a number: anything but zero (NaN is true).
fn truthy(v: Scalar) -> bool {
    match v {
        Scalar::Int(i) => i != 0,
        Scalar::Float(x) => x != 0.0,
    }
}

/// `a op b` of a comparison (integers compared exactly).
fn compare(op: CmpOp, a: Scalar, b: Scalar) -> bool {
    let ord = match (a, b) {
        (Scalar::Int(x), Scalar::Int(y)) => Some(x.cmp(&y)),
        (a, b) => a.as_f64().partial_cmp(&b.as_f64()),
    };
    use std::cmp::Ordering::*;
    match (op, ord) {
        (CmpOp::Ne, o) => o != Some(Equal),
        (_, None) => false,
        (CmpOp::Lt, Some(o)) => o == Less,
        (CmpOp::Le, Some(o)) => o != Greater,
        (CmpOp::Gt, Some(o)) => o == Greater,
        (CmpOp::Ge, Some(o)) => o != Less,
        (CmpOp::Eq, Some(o)) => o == Equal,
    }
}

/// `a ** b` as Python computes it: an integer to a non-negative integer power is an exact
/// integer (an error past 64 bits), any other power a float; zero to a negative power and a
/// negative number to a fractional one (complex in Python) are errors.
fn pow(a: Scalar, b: Scalar, col: usize) -> Result<Scalar, ExprError> {
    let err = |m: String| ExprError { column: col, message: m };
    if let (Scalar::Int(x), Scalar::Int(y)) = (a, b) {
        if y >= 0 {
            let v = match x {
                0 | 1 => Some(if y == 0 { 1 } else { x }),
                -1 => Some(if y % 2 == 0 { 1 } else { -1 }),
                _ => u32::try_from(y).ok().and_then(|y| x.checked_pow(y)),
            };
            return v.map(Scalar::Int).ok_or_else(|| err(format!("integer overflow: {x} ** {y} does not fit 64 bits")));
        }
    }
    let (x, y) = (a.as_f64(), b.as_f64());
    if x == 0.0 && y < 0.0 {
        return Err(err(format!("0 cannot be raised to a negative power ({a} ** {b})")));
    }
    if x < 0.0 && y.fract() != 0.0 && y.is_finite() {
        return Err(err(format!("{a} ** {b} is not a real number")));
    }
    let v = x.powf(y);
    if v.is_infinite() && x.is_finite() && y.is_finite() {
        return Err(err(format!("{a} ** {b} overflows a float")));
    }
    Ok(Scalar::Float(v))
}

/// `a op b`, as Python computes it; an integer result that does not fit 64 bits is an error.
fn binary(op: BinOp, a: Scalar, b: Scalar, col: usize) -> Result<Scalar, ExprError> {
    use Scalar::{Float, Int};
    let err = |m: String| ExprError { column: col, message: m };
    let overflow = |sym: &str, x: i64, y: i64| err(format!("integer overflow: {x} {sym} {y} does not fit 64 bits"));
    Ok(match (op, a, b) {
        (BinOp::Div, a, b) => {
            if b.as_f64() == 0.0 {
                return Err(err("division by zero".into()));
            }
            Float(a.as_f64() / b.as_f64())
        }
        (_, Int(x), Int(y)) => match op {
            BinOp::Add => Int(x.checked_add(y).ok_or_else(|| overflow("+", x, y))?),
            BinOp::Sub => Int(x.checked_sub(y).ok_or_else(|| overflow("-", x, y))?),
            BinOp::Mul => Int(x.checked_mul(y).ok_or_else(|| overflow("*", x, y))?),
            BinOp::FloorDiv | BinOp::Mod if y == 0 => return Err(err("division by zero".into())),
            BinOp::FloorDiv => {
                // Floor division; only MIN // -1 overflows.
                let q = x.checked_div(y).ok_or_else(|| overflow("//", x, y))?;
                Int(q - i64::from((x % y != 0) && ((x < 0) != (y < 0))))
            }
            BinOp::Mod => {
                // Python's modulo takes the divisor's sign; MIN % -1 is 0.
                let r = x.checked_rem(y).unwrap_or(0);
                Int(if r != 0 && ((r < 0) != (y < 0)) { r + y } else { r })
            }
            BinOp::Div => unreachable!("handled above"),
        },
        (_, a, b) => {
            let (x, y) = (a.as_f64(), b.as_f64());
            match op {
                BinOp::Add => Float(x + y),
                BinOp::Sub => Float(x - y),
                BinOp::Mul => Float(x * y),
                BinOp::FloorDiv | BinOp::Mod if y == 0.0 => return Err(err("division by zero".into())),
                BinOp::FloorDiv => Float((x / y).floor()),
                BinOp::Mod => Float(x - y * (x / y).floor()),
                BinOp::Div => unreachable!("handled above"),
            }
        }
    })
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    /// Parentheses and calls open around the current position.
    depth: usize,
}

/// The cursor of a hand-written expression parser (this module's and the tensor expressions'):
/// the text as bytes and a position in it, with whitespace skipping, tokens and errors at the
/// position's column.
pub(crate) trait Scan {
    /// The text and the position in it.
    fn cursor(&mut self) -> (&[u8], &mut usize);

    /// An error at the current column (1-based).
    fn err(&mut self, message: String) -> ExprError {
        let (_, i) = self.cursor();
        ExprError { column: *i + 1, message }
    }

    /// Skips whitespace.
    fn ws(&mut self) {
        let (s, i) = self.cursor();
        while *i < s.len() && s[*i].is_ascii_whitespace() {
            *i += 1;
        }
    }

    /// Consumes `tok` (after whitespace) if it comes next.
    fn eat(&mut self, tok: &str) -> bool {
        self.ws();
        let (s, i) = self.cursor();
        if s[*i..].starts_with(tok.as_bytes()) {
            *i += tok.len();
            true
        } else {
            false
        }
    }

    /// Consumes `tok`, or fails naming it.
    fn expect(&mut self, tok: &str) -> Result<(), ExprError> {
        if self.eat(tok) {
            Ok(())
        } else {
            Err(self.err(format!("expected `{tok}`")))
        }
    }
}

impl Scan for Parser<'_> {
    fn cursor(&mut self) -> (&[u8], &mut usize) {
        (self.s, &mut self.i)
    }
}

impl Parser<'_> {
    /// `or_test ['if' or_test 'else' expr]`, one level deeper than the caller.
    fn expr(&mut self) -> Result<Node, ExprError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.err(format!("expression nested deeper than {MAX_DEPTH} levels")));
        }
        let then = self.logic(false)?;
        let node = if self.eat_word("if") {
            let cond = self.logic(false)?;
            if !self.eat_word("else") {
                return Err(self.err("expected `else` (a conditional is `A if CONDITION else B`)".into()));
            }
            Node::If(Box::new(then), Box::new(cond), Box::new(self.expr()?))
        } else {
            then
        };
        self.depth -= 1;
        Ok(node)
    }

    /// `a or b or ...` (`and`: false) or `a and b and ...` (`and`: true), a flat list.
    fn logic(&mut self, and: bool) -> Result<Node, ExprError> {
        let word = if and { "and" } else { "or" };
        let operand = |p: &mut Self| if and { p.not_test() } else { p.logic(true) };
        let first = operand(self)?;
        let mut all = vec![first];
        while self.eat_word(word) {
            all.push(operand(self)?);
        }
        Ok(if all.len() == 1 { all.pop().expect("one operand") } else { Node::Logic(and, all) })
    }

    /// `not`* comparison.
    fn not_test(&mut self) -> Result<Node, ExprError> {
        let mut times = 0;
        while self.eat_word("not") {
            times += 1;
        }
        let a = self.comparison()?;
        Ok(if times == 0 { a } else { Node::Not(times, Box::new(a)) })
    }

    /// `sum (cmp sum)*`, chained as in Python.
    fn comparison(&mut self) -> Result<Node, ExprError> {
        let first = self.sum()?;
        let ops = [("<=", CmpOp::Le), (">=", CmpOp::Ge), ("==", CmpOp::Eq), ("!=", CmpOp::Ne), ("<", CmpOp::Lt), (">", CmpOp::Gt)];
        let mut rest = Vec::new();
        loop {
            self.ws();
            let col = self.i + 1;
            let Some(&(_, op)) = ops.iter().find(|(t, _)| self.eat(t)) else { break };
            rest.push((op, self.sum()?, col));
        }
        Ok(if rest.is_empty() { first } else { Node::Compare(Box::new(first), rest) })
    }

    /// Consumes the keyword `w` if it comes next as a whole word.
    fn eat_word(&mut self, w: &str) -> bool {
        self.ws();
        let rest = &self.s[self.i..];
        let whole = rest.starts_with(w.as_bytes()) && !rest.get(w.len()).is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_');
        if whole {
            self.i += w.len();
        }
        whole
    }

    /// `term (('+' | '-') term)*`.
    fn sum(&mut self) -> Result<Node, ExprError> {
        let first = self.term()?;
        let mut rest = Vec::new();
        loop {
            self.ws();
            let col = self.i + 1;
            let op = if self.eat("+") {
                BinOp::Add
            } else if self.eat("-") {
                BinOp::Sub
            } else {
                break;
            };
            rest.push((op, self.term()?, col));
        }
        Ok(if rest.is_empty() { first } else { Node::Chain(Box::new(first), rest) })
    }

    fn term(&mut self) -> Result<Node, ExprError> {
        let first = self.unary()?;
        let mut rest = Vec::new();
        loop {
            self.ws();
            let col = self.i + 1;
            let op = if self.eat("*") {
                BinOp::Mul
            } else if self.eat("//") {
                BinOp::FloorDiv
            } else if self.eat("/") {
                BinOp::Div
            } else if self.eat("%") {
                BinOp::Mod
            } else {
                break;
            };
            rest.push((op, self.unary()?, col));
        }
        Ok(if rest.is_empty() { first } else { Node::Chain(Box::new(first), rest) })
    }

    fn unary(&mut self) -> Result<Node, ExprError> {
        let mut times = 0;
        let mut col = 0;
        while self.eat("-") {
            if times == 0 {
                col = self.i;
            }
            times += 1;
        }
        let a = self.power()?;
        Ok(if times == 0 { a } else { Node::Neg(times, Box::new(a), col) })
    }

    /// `atom ['**' unary]`: tighter than a unary minus on its left, right-associative, and
    /// one level deeper per `**`.
    fn power(&mut self) -> Result<Node, ExprError> {
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
        Ok(Node::Pow(Box::new(base), Box::new(exponent), col))
    }

    fn ident(&mut self) -> Option<String> {
        self.ws();
        let st = self.i;
        while self.i < self.s.len() && (self.s[self.i].is_ascii_alphanumeric() || self.s[self.i] == b'_') {
            if self.i == st && self.s[self.i].is_ascii_digit() {
                return None;
            }
            self.i += 1;
        }
        (self.i > st).then(|| String::from_utf8_lossy(&self.s[st..self.i]).into_owned())
    }

    fn int_arg(&mut self) -> Result<i64, ExprError> {
        self.ws();
        let neg = self.eat("-");
        self.ws();
        match self.number()? {
            Some(Scalar::Int(i)) => Ok(if neg { -i } else { i }), // a parsed i64 is never MIN
            _ => Err(self.err("expected an integer axis".into())),
        }
    }

    fn number(&mut self) -> Result<Option<Scalar>, ExprError> {
        self.ws();
        let st = self.i;
        // A number starts with a digit or a point (`_N` is a name, `1_000` a number).
        if !self.s.get(st).is_some_and(|c| c.is_ascii_digit() || *c == b'.') {
            return Ok(None);
        }
        let mut float = false;
        while self.i < self.s.len() {
            let c = self.s[self.i];
            let exp_sign = (c == b'-' || c == b'+') && self.i > st && matches!(self.s[self.i - 1], b'e' | b'E');
            if c.is_ascii_digit() || c == b'_' || exp_sign {
                self.i += 1;
            } else if c == b'.' || ((c == b'e' || c == b'E') && self.i > st) {
                float = true;
                self.i += 1;
            } else {
                break;
            }
        }
        if self.i == st {
            return Ok(None);
        }
        let text: String = String::from_utf8_lossy(&self.s[st..self.i]).replace('_', "");
        let bad = || ExprError { column: st + 1, message: format!("bad number `{text}`") };
        Ok(Some(if float { Scalar::Float(text.parse().map_err(|_| bad())?) } else { Scalar::Int(text.parse().map_err(|_| bad())?) }))
    }

    fn atom(&mut self) -> Result<Node, ExprError> {
        self.ws();
        if self.i >= self.s.len() {
            return Err(self.err("expected a value, found the end".into()));
        }
        if self.eat("(") {
            let e = self.expr()?;
            self.expect(")")?;
            return Ok(e);
        }
        if let Some(n) = self.number()? {
            return Ok(Node::Num(n));
        }

        let col = self.i + 1;
        let Some(name) = self.ident() else {
            return Err(self.err(format!("unexpected `{}`", String::from_utf8_lossy(&self.s[self.i..]))));
        };
        let func = match name.as_str() {
            "cdiv" => Some(Func::Cdiv),
            "min" => Some(Func::Min),
            "max" => Some(Func::Max),
            "next_power_of_2" => Some(Func::NextPow2),
            "sqrt" => Some(Func::Sqrt),
            "exp" => Some(Func::Exp),
            "log" => Some(Func::Log),
            _ => None,
        };
        if KEYWORDS.contains(&name.as_str()) {
            return Err(ExprError { column: col, message: format!("unexpected `{name}`: expected a value") });
        }
        if let Some(b) = [("True", 1), ("False", 0)].iter().find(|(w, _)| *w == name) {
            return Ok(Node::Num(Scalar::Int(b.1)));
        }
        if let Some(f) = func {
            self.expect("(")?;
            let mut args = vec![self.expr()?];
            while self.eat(",") {
                args.push(self.expr()?);
            }
            self.expect(")")?;
            if f == Func::Cdiv && args.len() != 2 {
                return Err(ExprError { column: col, message: format!("cdiv takes 2 arguments, got {}", args.len()) });
            }
            if matches!(f, Func::NextPow2 | Func::Sqrt | Func::Exp | Func::Log) && args.len() != 1 {
                return Err(ExprError { column: col, message: format!("{name} takes 1 argument, got {}", args.len()) });
            }
            return Ok(Node::Call(f, args, col));
        }
        if self.eat(".") {
            let pcol = self.i + 1;
            let prop = self.ident().unwrap_or_default();
            return match prop.as_str() {
                "stride" | "size" => {
                    self.expect("(")?;
                    let a = self.int_arg()?;
                    self.expect(")")?;
                    Ok(Node::Tensor(name, if prop == "stride" { Prop::Stride } else { Prop::Size }, a, col))
                }
                "shape" => {
                    self.expect("[")?;
                    let a = self.int_arg()?;
                    self.expect("]")?;
                    Ok(Node::Tensor(name, Prop::Size, a, col))
                }
                "numel" => {
                    self.expect("(")?;
                    self.expect(")")?;
                    Ok(Node::Tensor(name, Prop::Numel, 0, col))
                }
                _ => Err(ExprError {
                    column: pcol,
                    message: format!("unknown tensor property `{prop}` (use stride(i), size(i), shape[i], numel())"),
                }),
            };
        }
        Ok(Node::Name(name, col))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct S(HashMap<&'static str, Scalar>, HashMap<&'static str, Vec<usize>>);
    impl Scope for S {
        fn constant(&self, n: &str) -> Option<Scalar> {
            self.0.get(n).copied()
        }
        fn shape(&self, n: &str) -> Option<Vec<usize>> {
            self.1.get(n).cloned()
        }
    }

    fn scope() -> S {
        S([("ROWS", Scalar::Int(1000)), ("eps", Scalar::Float(1e-5)), ("_private", Scalar::Int(7))].into(), [("x", vec![7, 5, 3])].into())
    }

    fn ev(t: &str) -> Result<Scalar, ExprError> {
        Expr::parse(t)?.eval(&scope())
    }

    #[test]
    fn evaluates_like_python() {
        use Scalar::*;
        for (t, v) in [
            ("cdiv(ROWS, 16)", Int(63)),
            ("cdiv(ROWS, 8)", Int(125)),
            ("x.stride(0)", Int(15)),
            ("x.stride(-1)", Int(1)),
            ("x.shape[1] * 2 + 1", Int(11)),
            ("x.size(2)", Int(3)),
            ("x.numel()", Int(105)),
            ("-7 // 2", Int(-4)),
            ("-7 % 2", Int(1)),
            ("7 % -2", Int(-1)),
            ("ROWS / 8", Float(125.0)),
            ("1 / (2 * eps)", Float(1.0 / (2.0 * 1e-5))),
            ("min(3, ROWS, 9)", Int(3)),
            ("next_power_of_2(ROWS)", Int(1024)),
            ("next_power_of_2(64)", Int(64)),
            ("max(3, 2.5)", Int(3)),
            ("1_000", Int(1000)),
            ("1e-3", Float(1e-3)),
            ("2 - 3 - 4", Int(-5)),
            ("sqrt(16)", Float(4.0)),
            ("1 / sqrt(64)", Float(0.125)),
            ("exp(0)", Float(1.0)),
            ("log(exp(2.5))", Float(2.5)),
            ("max(sqrt(4), 1)", Float(2.0)),
            ("_private + 1", Int(8)),
            ("2 * _private", Int(14)),
            ("max(_private, sqrt(4))", Int(7)),
        ] {
            assert_eq!(ev(t).unwrap(), v, "{t}");
        }
    }

    #[test]
    fn errors_have_columns() {
        for (t, col, frag) in [
            ("cdiv(ROWS 16)", 11, "expected `)`"),
            ("ROWS + NOPE", 8, "unknown name `NOPE`"),
            ("x.stride(3)", 1, "rank 3"),
            ("x + 1", 1, "is a tensor"),
            ("y.stride(0)", 1, "unknown tensor `y`"),
            ("ROWS // 0", 6, "division by zero"),
            ("x.foo(0)", 3, "unknown tensor property"),
            ("3 $", 3, "unexpected `$`"),
            ("", 1, "expected a value"),
            ("cdiv(1)", 1, "2 arguments"),
            ("1 + sqrt(0 - 1)", 5, "sqrt of -1 is not a real number"),
            ("log(0)", 1, "log of 0 is not a real number"),
            ("exp(1, 2)", 1, "exp takes 1 argument"),
        ] {
            let e = ev(t).unwrap_err();
            assert_eq!(e.column, col, "{t}: {e}");
            assert!(e.message.contains(frag), "{t}: {e}");
        }
    }

    #[test]
    fn powers_follow_python() {
        use Scalar::*;
        for (t, v) in [
            ("2 ** 10", Int(1024)),
            ("-2 ** 2", Int(-4)),
            ("(-2) ** 2", Int(4)),
            ("2 ** 3 ** 2", Int(512)),
            ("2 ** -1", Float(0.5)),
            ("2 ** -1 ** 2", Float(0.5)),
            ("4 ** 0.5", Float(2.0)),
            ("2.0 ** 3", Float(8.0)),
            ("0 ** 0", Int(1)),
            ("(-1) ** 9999999999", Int(-1)),
            ("1 ** 9999999999", Int(1)),
            ("(-8) ** 2.0", Float(64.0)),
            ("3 * 2 ** 2 * 2", Int(24)),
            ("ROWS ** 2 // 7", Int(142857)),
            ("-x.size(0) ** 2", Int(-49)),
            ("2**62", Int(1 << 62)),
        ] {
            assert_eq!(ev(t).unwrap(), v, "{t}");
        }
        for (t, col, frag) in [
            ("2 ** 63", 3, "integer overflow: 2 ** 63"),
            ("1 + 0 ** -1", 7, "0 cannot be raised to a negative power"),
            ("(-8) ** (1 / 3)", 6, "is not a real number"),
            ("10.0 ** 400", 6, "overflows"),
            ("2 ** ", 6, "expected a value"),
        ] {
            let e = ev(t).unwrap_err();
            assert_eq!(e.column, col, "{t}: {e}");
            assert!(e.message.contains(frag), "{t}: {e}");
        }
        // Long towers of powers are bounded like parentheses.
        let tower = vec!["1"; 5000].join(" ** ");
        assert!(ev(&tower).unwrap_err().message.contains("nested deeper"));
        assert_eq!(ev(&vec!["1"; 40].join(" ** ")).unwrap(), Int(1));
    }

    #[test]
    fn conditionals_comparisons_and_logic_follow_python() {
        use Scalar::*;
        for (t, v) in [
            ("1024 if ROWS > 4096 else 512", Int(512)),
            ("1024 if ROWS <= 4096 else 512", Int(1024)),
            ("8 if ROWS > 10000 else 4 if ROWS > 100 else 2", Int(4)),
            ("(16 if ROWS >= 1000 else 8) * 2", Int(32)),
            ("1 if 0 < ROWS < 1001 else 0", Int(1)),
            ("1 if 0 < ROWS < 999 else 0", Int(0)),
            ("ROWS == 1000", Int(1)),
            ("ROWS != 1000.0", Int(0)),
            ("ROWS > 1 and ROWS < 10", Int(0)),
            ("ROWS > 1 or 1 // 0", Int(1)),
            ("0 or 5", Int(5)),
            ("3 and 0.0", Float(0.0)),
            ("not ROWS", Int(0)),
            ("not not 7", Int(1)),
            ("not ROWS > 5 and True", Int(0)),
            ("True + True", Int(2)),
            ("1 if False else 2", Int(2)),
            ("eps if eps < 1 else 1", Float(1e-5)),
            ("4 if x.size(-1) == 3 else 8", Int(4)),
            // Only the branch the condition chooses is evaluated.
            ("1 if ROWS else 1 // 0", Int(1)),
        ] {
            assert_eq!(ev(t).unwrap(), v, "{t}");
        }
        for (t, col, frag) in [
            ("1 if ROWS", 10, "expected `else`"),
            ("1 if else 2", 6, "unexpected `else`"),
            ("ROWS and", 9, "expected a value"),
            ("1 if ROWS > NOPE else 2", 13, "unknown name `NOPE`"),
            ("not", 4, "expected a value"),
        ] {
            let e = ev(t).unwrap_err();
            assert_eq!(e.column, col, "{t}: {e}");
            assert!(e.message.contains(frag), "{t}: {e}");
        }
        // Names that start with a keyword are names.
        let s = S([("iffy", Scalar::Int(2)), ("order", Scalar::Int(3)), ("note", Scalar::Int(4))].into(), HashMap::new());
        assert_eq!(Expr::parse("iffy + order * note").unwrap().eval(&s).unwrap(), Int(14));
        assert_eq!(Expr::parse("iffy if order else note").unwrap().eval(&s).unwrap(), Int(2));
        let e = Expr::parse("BLOCK if N > 4096 and x.size(0) else 2 ** K").unwrap();
        assert_eq!(e.names(), ["BLOCK", "N", "K"]);
        assert_eq!(e.tensors(), ["x"]);
    }

    #[test]
    fn long_chains_evaluate_and_deep_nesting_is_a_located_error() {
        // 33,000 terms: a flat chain, no recursion per term.
        let long = vec!["1"; 33_000].join(" + ");
        assert_eq!(ev(&long).unwrap(), Scalar::Int(33_000));
        let prod = format!("ROWS{}", " * 1 // 1".repeat(10_000));
        assert_eq!(ev(&prod).unwrap(), Scalar::Int(1000));
        // Runs of unary minus are counted: Python gives -5 and 5.
        assert_eq!(ev(&format!("{}5", "-".repeat(7_401))).unwrap(), Scalar::Int(-5));
        assert_eq!(ev(&format!("{}5", "- ".repeat(7_400))).unwrap(), Scalar::Int(5));
        // 8,900 nested parentheses: an error at the column where the limit is crossed.
        let deep = format!("{}1{}", "(".repeat(8_900), ")".repeat(8_900));
        let e = ev(&deep).unwrap_err();
        assert!(e.message.contains(&format!("nested deeper than {MAX_DEPTH} levels")), "{e}");
        assert_eq!(e.column, MAX_DEPTH + 1, "{e}");
        let calls = format!("{}1{}", "max(".repeat(3_000), ")".repeat(3_000));
        assert!(ev(&calls).unwrap_err().message.contains("nested deeper"));
        // Within the limit, nesting works.
        let ok = format!("{}7{}", "(".repeat(MAX_DEPTH - 1), ")".repeat(MAX_DEPTH - 1));
        assert_eq!(ev(&ok).unwrap(), Scalar::Int(7));
    }

    #[test]
    fn integer_arithmetic_is_python_exact_or_an_overflow_error() {
        let min = "(-9223372036854775807 - 1)";
        for (t, frag, col) in [
            (format!("{min} // -1"), "integer overflow", min.len() + 2),
            ("9223372036854775807 + 1".to_string(), "integer overflow", 21),
            (format!("{min} - 1"), "integer overflow", min.len() + 2),
            (format!("{min} * -1"), "integer overflow", min.len() + 2),
            (format!("-{min}"), "integer overflow", 1),
            ("x.numel() * 9223372036854775807".to_string(), "integer overflow", 11),
        ] {
            let e = ev(&t).unwrap_err();
            assert!(e.message.contains(frag), "{t}: {e}");
            assert_eq!(e.column, col, "{t}: {e}");
        }
        assert_eq!(ev(&format!("{min} % -1")).unwrap(), Scalar::Int(0));
        assert_eq!(ev(&format!("--{min}")).unwrap(), Scalar::Int(i64::MIN));
        assert_eq!(ev(&format!("{min} // 1")).unwrap(), Scalar::Int(i64::MIN));
        // Floor division and modulo against an i128 reference, over signs and magnitudes.
        let vals = [i64::MIN, i64::MIN + 1, -1_000_000_007, -7, -2, -1, 0, 1, 2, 3, 7, 1_000_000_007, i64::MAX - 1, i64::MAX];
        for &x in &vals {
            for &y in vals.iter().filter(|&&y| y != 0) {
                let (a, b) = (x as i128, y as i128);
                let q = a.div_euclid(b) - i128::from(b < 0 && a.rem_euclid(b) != 0);
                let r = a - b * q;
                let got = binary(BinOp::FloorDiv, Scalar::Int(x), Scalar::Int(y), 1);
                match i64::try_from(q) {
                    Ok(q) => assert_eq!(got, Ok(Scalar::Int(q)), "{x} // {y}"),
                    Err(_) => assert!(got.unwrap_err().message.contains("overflow"), "{x} // {y}"),
                }
                assert_eq!(binary(BinOp::Mod, Scalar::Int(x), Scalar::Int(y), 1), Ok(Scalar::Int(r as i64)), "{x} % {y}");
            }
        }
    }

    #[test]
    fn sizes_that_overflow_are_errors() {
        struct Big;
        impl Scope for Big {
            fn constant(&self, _: &str) -> Option<Scalar> {
                None
            }
            fn shape(&self, _: &str) -> Option<Vec<usize>> {
                Some(vec![3, 1 << 62, 4])
            }
        }
        for t in ["t.numel()", "t.stride(0)"] {
            let e = Expr::parse(t).unwrap().eval(&Big).unwrap_err();
            assert!(e.message.contains("does not fit 64 bits"), "{t}: {e}");
        }
        assert_eq!(Expr::parse("t.size(1)").unwrap().eval(&Big).unwrap(), Scalar::Int(1 << 62));
        assert_eq!(Expr::parse("t.stride(1)").unwrap().eval(&Big).unwrap(), Scalar::Int(4));
    }
}
