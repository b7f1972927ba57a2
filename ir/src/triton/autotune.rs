//! `@triton.autotune` configurations: the constexpr values each `triton.Config({...})` of a
//! kernel's autotune decorator binds, so that a check can pick one (autotuning itself runs
//! timings on a GPU; a checker checks each configuration it is given instead).

use super::errors::{fail, R};
use super::value::Val;
use super::{dotted, module_const, Module};
use ruff_python_ast::Expr;
use ruff_text_size::Ranged;

/// The constexpr bindings of each config of the `@triton.autotune(configs=[...])` among a
/// function's decorators (or the calls wrapping it), in order; empty when it has none.
pub(crate) fn configs(m: &Module, decorators: &[&Expr]) -> R<Vec<Vec<(String, i64)>>> {
    let Some(call) = decorators.iter().find_map(|d| match d {
        Expr::Call(c) if dotted(&c.func).is_some_and(|n| n == "autotune" || n.ends_with(".autotune")) => Some(c),
        _ => None,
    }) else {
        return Ok(Vec::new());
    };
    let at = call.range().start().to_u32();
    let list = match call.arguments.find_keyword("configs").map(|k| &k.value).or(call.arguments.args.first()) {
        Some(Expr::List(l)) => &l.elts,
        Some(Expr::Name(n)) => match m.lists.get(n.id.as_str()) {
            Some(Expr::List(l)) => &l.elts,
            _ => return fail(n.range.start().to_u32(), format!("`{}` is not a module-level list of triton.Config", n.id)),
        },
        Some(e) => {
            return fail(
                e.range().start().to_u32(),
                "autotune configs must be a list of `triton.Config({...})` literals (a generated list cannot be read without running Python; give the constexprs in the spec instead)",
            )
        }
        None => return fail(at, "`@triton.autotune` without `configs=`"),
    };
    let mut out = Vec::new();
    for c in list {
        let Expr::Call(cc) = c else { return fail(c.range().start().to_u32(), "expected `triton.Config({...})`") };
        if !dotted(&cc.func).is_some_and(|n| n == "Config" || n.ends_with(".Config")) {
            return fail(c.range().start().to_u32(), "expected `triton.Config({...})`");
        }
        let kwargs = match cc.arguments.find_keyword("kwargs").map(|k| &k.value).or(cc.arguments.args.first()) {
            Some(Expr::Dict(d)) => d,
            _ => return fail(c.range().start().to_u32(), "`triton.Config` needs a dict of constexpr values as its first argument"),
        };
        let mut binds = Vec::new();
        for item in &kwargs.items {
            let key = match &item.key {
                Some(Expr::StringLiteral(s)) => s.value.to_str().to_string(),
                _ => return fail(item.value.range().start().to_u32(), "config keys must be string literals"),
            };
            let v = match module_const(&item.value).or_else(|| match &item.value {
                Expr::Name(n) => m.consts.get(n.id.as_str()).cloned(),
                _ => None,
            }) {
                Some(Val::Int(i)) => i,
                Some(Val::Bool(b)) => b as i64,
                _ => return fail(item.value.range().start().to_u32(), format!("config value of `{key}` must be an integer literal")),
            };
            binds.push((key, v));
        }
        out.push(binds);
    }
    Ok(out)
}
