//! Size expressions: how launch grids, scalar arguments and shapes are computed from the tensors
//! of a check, the way a Python launcher writes them (`cdiv(ROWS, 16)`, `x.stride(0)`,
//! `x.shape[1] * 2`).
//!
//! Grammar: integers and floats, names of constants, `+ - * / // %` (Python semantics: `//` and
//! `%` floor, `/` is true division), unary minus, parentheses, `cdiv(a, b)`, `min(a, b, ...)`,
//! `max(a, b, ...)`, `next_power_of_2(n)`, `sqrt(x)`, `exp(x)`, `log(x)` (floats), and on a tensor name `t.stride(i)`, `t.size(i)`, `t.shape[i]`, `t.numel()`
//! (negative `i` counts from the end). Errors carry the 1-based column in the expression.

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

#[derive(Clone, Debug, PartialEq)]
enum Node {
    Num(Scalar),
    Name(String, usize),
    Neg(Box<Node>),
    Bin(BinOp, Box<Node>, Box<Node>, usize),
    Call(Func, Vec<Node>, usize),
    Tensor(String, Prop, i64, usize),
}

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
        let mut p = Parser { s: text.as_bytes(), i: 0 };
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
                Node::Neg(a) => go(a, out),
                Node::Bin(_, a, b, _) => {
                    go(a, out);
                    go(b, out);
                }
                Node::Call(_, args, _) => args.iter().for_each(|a| go(a, out)),
                Node::Tensor(t, ..) => out.push(t.clone()),
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
        Node::Neg(a) => match eval(a, scope)? {
            Int(i) => Int(i.wrapping_neg()),
            Float(x) => Float(-x),
        },
        Node::Bin(op, a, b, col) => {
            let (a, b) = (eval(a, scope)?, eval(b, scope)?);
            let err = |m: &str| ExprError { column: *col, message: m.to_string() };
            match (op, a, b) {
                (BinOp::Div, a, b) => {
                    if b.as_f64() == 0.0 {
                        return Err(err("division by zero"));
                    }
                    Float(a.as_f64() / b.as_f64())
                }
                (_, Int(x), Int(y)) => match op {
                    BinOp::Add => Int(x.checked_add(y).ok_or_else(|| err("integer overflow"))?),
                    BinOp::Sub => Int(x.checked_sub(y).ok_or_else(|| err("integer overflow"))?),
                    BinOp::Mul => Int(x.checked_mul(y).ok_or_else(|| err("integer overflow"))?),
                    BinOp::FloorDiv | BinOp::Mod if y == 0 => return Err(err("division by zero")),
                    BinOp::FloorDiv => Int(x.div_euclid(y) - i64::from(y < 0 && x.rem_euclid(y) != 0)),
                    BinOp::Mod => Int(x - y * (x.div_euclid(y) - i64::from(y < 0 && x.rem_euclid(y) != 0))),
                    BinOp::Div => unreachable!("handled above"),
                },
                (_, a, b) => {
                    let (x, y) = (a.as_f64(), b.as_f64());
                    match op {
                        BinOp::Add => Float(x + y),
                        BinOp::Sub => Float(x - y),
                        BinOp::Mul => Float(x * y),
                        BinOp::FloorDiv | BinOp::Mod if y == 0.0 => return Err(err("division by zero")),
                        BinOp::FloorDiv => Float((x / y).floor()),
                        BinOp::Mod => Float(x - y * (x / y).floor()),
                        BinOp::Div => unreachable!("handled above"),
                    }
                }
            }
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
        Node::Tensor(t, prop, axis, col) => {
            let shape = scope.shape(t).ok_or_else(|| ExprError { column: *col, message: format!("unknown tensor `{t}`") })?;
            if *prop == Prop::Numel {
                return Ok(Int(shape.iter().product::<usize>() as i64));
            }
            let rank = shape.len() as i64;
            let a = if *axis < 0 { axis + rank } else { *axis };
            if a < 0 || a >= rank {
                return Err(ExprError { column: *col, message: format!("axis {axis} of `{t}`, which has rank {rank}") });
            }
            let a = a as usize;
            match prop {
                Prop::Size => Int(shape[a] as i64),
                Prop::Stride => Int(shape[a + 1..].iter().product::<usize>() as i64),
                Prop::Numel => unreachable!("handled above"),
            }
        }
    })
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn err(&self, message: String) -> ExprError {
        ExprError { column: self.i + 1, message }
    }

    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn eat(&mut self, tok: &str) -> bool {
        self.ws();
        if self.s[self.i..].starts_with(tok.as_bytes()) {
            self.i += tok.len();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, tok: &str) -> Result<(), ExprError> {
        if self.eat(tok) {
            Ok(())
        } else {
            Err(self.err(format!("expected `{tok}`")))
        }
    }

    fn expr(&mut self) -> Result<Node, ExprError> {
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
            a = Node::Bin(op, Box::new(a), Box::new(b), col);
        }
    }

    fn term(&mut self) -> Result<Node, ExprError> {
        let mut a = self.unary()?;
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
                return Ok(a);
            };
            let b = self.unary()?;
            a = Node::Bin(op, Box::new(a), Box::new(b), col);
        }
    }

    fn unary(&mut self) -> Result<Node, ExprError> {
        if self.eat("-") {
            return Ok(Node::Neg(Box::new(self.unary()?)));
        }
        self.atom()
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
            Some(Scalar::Int(i)) => Ok(if neg { -i } else { i }),
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
}
