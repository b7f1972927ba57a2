//! Branches folded away. An `if` on a constexpr (`if reduction == "mean":`) is decided at
//! conversion: the branch not taken leaves no op in the kernel, so no value passes through its
//! lines, and where it should have been taken (a test of the wrong constant) the element's slice
//! holds nothing of it. The source does: a branch of the kernel whose lines hold no op, but
//! which assigns a name that a line of the slice reads, decided that value as much as the line
//! that reads it.

/// A branch of a kernel whose lines hold no op: the line of the condition that decided it, and
/// the names its body assigns, each with the line assigning it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Folded {
    pub cond: u32,
    pub names: Vec<(String, u32)>,
    /// The last line of the branch's body.
    pub end: u32,
}

/// The indentation of a source line (`None` for a blank or comment line).
fn indent(l: &str) -> Option<usize> {
    let t = l.trim_start();
    (!t.is_empty() && !t.starts_with('#')).then(|| l.len() - t.len())
}

/// The branches (`if`, `elif` and `else` bodies) of the lines `span` of `src` (1-based,
/// inclusive) whose body assigns names but holds no line with an op (`has_op`).
pub(crate) fn folded_branches(src: &[String], (from, to): (u32, u32), has_op: impl Fn(u32) -> bool) -> Vec<Folded> {
    let line = |l: u32| src.get(l as usize - 1).map_or("", String::as_str);
    let mut out = Vec::new();
    let mut last_if: Vec<(usize, u32)> = Vec::new();
    for h in from..=to {
        let Some(at) = indent(line(h)) else { continue };
        let head = line(h).trim_start();
        last_if.retain(|&(i, _)| i < at || i == at && (head.starts_with("elif ") || head.starts_with("else")));
        let cond = if head.starts_with("if ") || head.starts_with("elif ") {
            last_if.retain(|&(i, _)| i != at);
            last_if.push((at, h));
            h
        } else if head.starts_with("else") && head.trim_end().ends_with(':') {
            match last_if.iter().rev().find(|&&(i, _)| i == at) {
                Some(&(_, c)) => c,
                None => continue,
            }
        } else {
            continue;
        };
        let body: Vec<u32> =
            (h + 1..=to).take_while(|&b| indent(line(b)).is_none_or(|i| i > at)).filter(|&b| indent(line(b)).is_some()).collect();
        let Some(&end) = body.last() else { continue };
        if body.iter().any(|&b| has_op(b)) {
            continue;
        }
        let names: Vec<(String, u32)> = body.iter().filter_map(|&b| Some((assigned(line(b))?, b))).collect();
        if !names.is_empty() {
            out.push(Folded { cond, names, end });
        }
    }
    out
}

/// The name a statement assigns (`g = ...`, `g /= ...`), if it is a plain assignment to one.
fn assigned(l: &str) -> Option<String> {
    let t = l.trim_start();
    let name: String = t.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    let rest = t[name.len()..].trim_start();
    let op = rest.find('=')?;
    let assigns = !name.is_empty()
        && !name.chars().next().is_some_and(|c| c.is_ascii_digit())
        && rest[..op].chars().all(|c| "+-*/%&|^<>@".contains(c))
        && !rest[op + 1..].starts_with('=')
        && !matches!(&rest[..op], "<" | ">" | "!");
    assigns.then_some(name)
}

/// The factor by which statement `l` scales `name`, where it multiplies or divides it by one
/// number (`g = g / n`, `g *= 0.5`); `number` gives the value of a name (a scalar argument) or
/// of a literal.
pub(crate) fn scale_of(l: &str, name: &str, number: impl Fn(&str) -> Option<f64>) -> Option<f64> {
    let code = l.split('#').next().unwrap_or("").trim();
    let rest = code.strip_prefix(name)?.trim_start();
    let by = |op: char, x: &str| number(x.trim()).filter(|&v| v != 0.0).map(|v| if op == '/' { 1.0 / v } else { v });
    if let Some(x) = rest.strip_prefix("/=") {
        return by('/', x);
    }
    if let Some(x) = rest.strip_prefix("*=") {
        return by('*', x);
    }
    let rhs = rest.strip_prefix('=').filter(|r| !r.starts_with('='))?.trim();
    let op = rhs.find(['/', '*'])?;
    let (a, b) = (rhs[..op].trim(), rhs[op + 1..].trim());
    let op = rhs[op..].chars().next()?;
    if b.contains(['/', '*', '+', '-', '(']) || a.contains(['/', '*', '+', '-', '(']) {
        return None;
    }
    match (a == name, b == name) {
        (true, false) => by(op, b),
        (false, true) if op == '*' => by(op, a),
        _ => None,
    }
}

/// Whether source line `l` reads `name` (as a whole word, outside a comment).
pub(crate) fn reads(l: &str, name: &str) -> bool {
    let code = l.split('#').next().unwrap_or("");
    code.match_indices(name).any(|(i, _)| {
        let word = |c: char| c.is_alphanumeric() || c == '_';
        !code[..i].chars().next_back().is_some_and(|c| word(c) || c == '.') && !code[i + name.len()..].chars().next().is_some_and(word)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = "def k(X, reduction: tl.constexpr):
    g = tl.load(X)
    if reduction == \"sum\":  # folded: not taken
        g = g / n
    elif reduction == \"none\":
        pass
    else:
        h = g * 2.0
    if g > 0:
        g = g + 1.0
    tl.store(X, g)
";

    #[test]
    fn a_branch_without_ops_that_assigns_a_name() {
        let src: Vec<String> = SRC.lines().map(String::from).collect();
        // Ops at lines 2, 8 (the else taken), 9, 10 and 11.
        let ops = [2, 8, 9, 10, 11];
        let f = folded_branches(&src, (1, 11), |l| ops.contains(&l));
        assert_eq!(f, vec![Folded { cond: 3, names: vec![("g".into(), 4)], end: 4 }], "the `pass` branch assigns nothing");
        let f = folded_branches(&src, (1, 11), |l| [2, 4, 9, 10, 11].contains(&l));
        assert_eq!(f, vec![Folded { cond: 5, names: vec![("h".into(), 8)], end: 8 }], "an `else` is decided at the condition before it");
        assert!(reads("    tl.store(X, g)", "g") && !reads("    tl.store(X, gg)  # g", "g"));
        assert_eq!(assigned("    g /= n"), Some("g".into()));
        assert_eq!(assigned("    if g == 1:"), None);
        assert_eq!(assigned("    x <= 1"), None);
        let n = |x: &str| if x == "n" { Some(8.0) } else { x.parse().ok() };
        assert_eq!(scale_of("    g = g / n  # mean", "g", n), Some(0.125));
        assert_eq!(scale_of("g *= 0.5", "g", n), Some(0.5));
        assert_eq!(scale_of("g = 2.0 * g", "g", n), Some(2.0));
        assert_eq!(scale_of("g = 2.0 / g", "g", n), None, "not a scale");
        assert_eq!(scale_of("g = g / (n + 1)", "g", n), None);
        assert_eq!(scale_of("g = g / m", "g", n), None, "an unknown name");
    }
}
