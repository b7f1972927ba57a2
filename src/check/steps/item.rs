//! Host scalars computed from data, as launchers get them with `.item()`:
//! `n_non_ignore = (target != ignore_index).sum().item()` is the step
//! `{ item = "sum(target != IGNORE)", into = "n_non_ignore" }`, and `n_non_ignore` a constant of
//! the later steps (launch arguments, grids, factors, expressions) of this pass and, from the
//! forward, of the backward.
//!
//! The value is computed in each pass from that pass's tensors (it depends on data). It is an
//! integer when the expression is (a count: `sum`, `max` or `min` of integers or bools), else a
//! float, rounded natively to the expression's dtype. No gradient flows through it: a count is
//! piecewise constant, and a spec refuses a float one computed from a differentiable input in
//! the forward (its gradient would be missing from the ground truth).

use super::{bind, Env};
use crate::check::expr::{ExprError, Scalar, Scope};
use crate::check::tensor_expr::TensorExpr;
use tilegrad_ir::DType;

/// How an `item` step reduces the elements of its expression (over all of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemReduce {
    /// `.sum()`.
    Sum,
    /// `.mean()` (of floats).
    Mean,
    /// `.max()` (NaN if any is NaN).
    Max,
    /// `.min()` (NaN if any is NaN).
    Min,
}

impl ItemReduce {
    /// The name written in a spec.
    pub fn name(self) -> &'static str {
        match self {
            ItemReduce::Sum => "sum",
            ItemReduce::Mean => "mean",
            ItemReduce::Max => "max",
            ItemReduce::Min => "min",
        }
    }

    fn apply(self, v: &[f64]) -> Result<f64, String> {
        let nan = v.iter().any(|x| x.is_nan());
        Ok(match self {
            ItemReduce::Sum => v.iter().sum(),
            ItemReduce::Mean => v.iter().sum::<f64>() / v.len() as f64,
            _ if v.is_empty() => return Err(format!("{} of no elements (torch refuses it)", self.name())),
            _ if nan => f64::NAN,
            ItemReduce::Max => v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            ItemReduce::Min => v.iter().copied().fold(f64::INFINITY, f64::min),
        })
    }
}

/// Parses the text of an `item` step: `sum(EXPR)`, `mean(EXPR)`, `max(EXPR)` or `min(EXPR)`
/// (a reduction over every element; `max(a, b)` with two arguments is the elementwise maximum),
/// or an expression of one element. Errors carry the column in the whole text.
pub fn parse(text: &str) -> Result<(Option<ItemReduce>, TensorExpr), ExprError> {
    let trimmed = text.trim_start();
    let mut trailing = false;
    for r in [ItemReduce::Sum, ItemReduce::Mean, ItemReduce::Max, ItemReduce::Min] {
        let Some(rest) = trimmed.strip_prefix(r.name()) else { continue };
        let Some(inner) = rest.trim_start().strip_prefix('(') else { continue };
        let open = text.len() - inner.len();
        let Some(close) = closing(inner) else { continue };
        let two_args = matches!(r, ItemReduce::Max | ItemReduce::Min) && top_level_comma(&inner[..close]);
        if !inner[close + 1..].trim().is_empty() || two_args {
            trailing = !two_args;
            break;
        }
        return Ok((Some(r), TensorExpr::parse_within(text, open, open + close)?));
    }
    let hint = " (an item is one reduction of an expression, as `sum(t != IGNORE)`, with nothing after it)";
    let e =
        TensorExpr::parse(text).map_err(|e| ExprError { message: format!("{}{}", e.message, if trailing { hint } else { "" }), ..e })?;
    Ok((None, e))
}

impl super::Step {
    /// `dst = REDUCE(EXPR).item()` from its text (see `parse`).
    pub fn item(dst: &str, text: &str) -> Result<super::Step, crate::check::CheckError> {
        let (reduce, expr) = parse(text).map_err(|e| crate::check::CheckError::Spec(format!("item `{text}`: {e}")))?;
        Ok(super::Step::Item { reduce, expr, dst: dst.into() })
    }
}

/// The index in `s` of the `)` that closes a parenthesis opened just before it.
fn closing(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => return Some(i),
            ')' => depth -= 1,
            _ => {}
        }
    }
    None
}

fn top_level_comma(s: &str) -> bool {
    let mut depth = 0i64;
    s.chars().any(|c| {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ => {}
        }
        c == ',' && depth == 0
    })
}

/// Whether the value of an item of an expression of dtype `d` is a float; an error for `mean`
/// of integers (torch refuses it).
pub(crate) fn is_float(reduce: Option<ItemReduce>, d: DType) -> Result<bool, String> {
    if reduce == Some(ItemReduce::Mean) && !d.is_float() {
        return Err(format!("mean of a {d} expression: cast it to a float first (torch refuses it)"));
    }
    Ok(d.is_float())
}

/// Evaluates the item in `env` and defines it as the constant `dst`.
pub(crate) fn run(env: &mut Env, reduce: Option<ItemReduce>, expr: &TensorExpr, dst: &str) -> Result<(), String> {
    if env.constant(dst).is_some() || env.id(dst).is_some() {
        return Err(format!("`{dst}` is already defined"));
    }
    let (bound, typed) = bind(expr, env, &|n| env.tensor(n))?;
    let float = is_float(reduce, typed.dtype).map_err(|m| format!("`{expr}`: {m}"))?;
    let v = bound.eval();
    let x = match reduce {
        Some(r) => r.apply(&v).map_err(|m| format!("`{expr}`: {m}"))?,
        None if v.len() == 1 => v[0],
        None => return Err(format!("`({expr}).item()` of {} elements: reduce it (sum, mean, max, min) to one", v.len())),
    };
    let value = if float {
        Scalar::Float(tilegrad_reference::round_to(typed.dtype, x))
    } else if x.is_finite() && x.abs() < 9.2e18 {
        Scalar::Int(x as i64)
    } else {
        return Err(format!("`{expr}`: the integer {x} does not fit 64 bits"));
    };
    env.constants.push((dst.to_string(), value));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tilegrad_reference::HostTensor;

    fn env() -> Env {
        let mut env = Env::default();
        env.add("t", HostTensor::from_i64(&[6], vec![3, -100, 7, -100, 0, 1])).unwrap();
        env.add("x", HostTensor::from_f64_as(DType::F16, &[2, 3], &[0.1, 0.2, 0.3, -1.5, 2.0, 0.7])).unwrap();
        env.constants.push(("IGNORE".into(), Scalar::Int(-100)));
        env
    }

    fn item(env: &mut Env, text: &str, dst: &str) -> Result<Scalar, String> {
        let (r, e) = parse(text).map_err(|e| e.to_string())?;
        run(env, r, &e, dst)?;
        Ok(env.constant(dst).unwrap())
    }

    #[test]
    fn counts_are_integers_and_floats_round_to_the_dtype() {
        let mut env = env();
        assert_eq!(item(&mut env, "sum(t != IGNORE)", "n").unwrap(), Scalar::Int(4));
        assert_eq!(item(&mut env, "max(t)", "hi").unwrap(), Scalar::Int(7));
        assert_eq!(item(&mut env, " min ( where(t == IGNORE, 1000, t) ) ", "lo").unwrap(), Scalar::Int(0));
        let h = |v: f64| tilegrad_reference::round_to(DType::F16, v);
        let want: f64 = [0.1, 0.2, 0.3, -1.5, 2.0, 0.7].iter().map(|&v| h(v)).sum::<f64>() / 6.0;
        assert_eq!(item(&mut env, "mean(x)", "m").unwrap(), Scalar::Float(h(want)));
        // A later item uses an earlier one; max with two arguments is elementwise.
        assert_eq!(item(&mut env, "sum(max(x, 0.0) * n)", "s").unwrap(), Scalar::Float(h((h(0.1) + h(0.2) + h(0.3) + 2.0 + h(0.7)) * 4.0)));
        let e = item(&mut env, "sum(t > 0) * 2", "c").unwrap_err();
        assert!(e.contains("column 1: unknown function `sum`") && e.contains("with nothing after it"), "{e}");
    }

    #[test]
    fn errors_name_what_is_wrong_with_columns() {
        let mut env = env();
        let e = item(&mut env, "sum(t != NOPE)", "n").unwrap_err();
        assert!(e.contains("column 10: no tensor or constant named `NOPE`"), "{e}");
        let e = item(&mut env, "x * 2", "n").unwrap_err();
        assert!(e.contains("of 6 elements: reduce it"), "{e}");
        let e = item(&mut env, "mean(t)", "n").unwrap_err();
        assert!(e.contains("mean of a i64 expression: cast it to a float first"), "{e}");
        let e = item(&mut env, "sum(t)", "IGNORE").unwrap_err();
        assert!(e.contains("`IGNORE` is already defined"), "{e}");
        let e = item(&mut env, "sum(t)", "x").unwrap_err();
        assert!(e.contains("`x` is already defined"), "{e}");
        let e = parse("max(x, 0.0").unwrap_err();
        assert_eq!(e.column, 11, "{e}");
    }
}
