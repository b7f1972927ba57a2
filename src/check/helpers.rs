//! Helpers and the lines that call them. The front end inlines a `@triton.jit` helper: its ops
//! stand at the helper's own lines, which every call of it shares (a rotation helper the forward
//! calls with `sin` and the backward with `-sin`). Where the bug is an argument of one call (the
//! backward passing `sin`), the helper's line feeds every wrong element, as does every line of
//! the slice, and nothing in the data flow names the call: the source does. The line of the
//! kernel that calls the helper is found in the kernel's source text, and ranked with the
//! helper's best line.

/// The indentation of a source line (`None` for a blank or comment line).
fn indent(l: &str) -> Option<usize> {
    let t = l.trim_start();
    (!t.is_empty() && !t.starts_with('#')).then(|| l.len() - t.len())
}

/// The lines (1-based) of the function whose `def` is at line `def`: from it to the last line
/// before the next statement indented no deeper than the `def` (a decorator, another `def`).
pub(crate) fn extent(src: &[String], def: u32) -> Option<(u32, u32)> {
    let d = def as usize;
    let own = indent(src.get(d.checked_sub(1)?)?)?;
    let mut end = d;
    let mut open = paren_depth(&src[d - 1]);
    for (j, l) in src.iter().enumerate().skip(d) {
        // Parameters spread over several lines stay inside the `def`'s parentheses.
        if open <= 0 && indent(l).is_some_and(|i| i <= own) {
            break;
        }
        open += paren_depth(l);
        if indent(l).is_some() {
            end = j + 1;
        }
    }
    Some((def, end as u32))
}

/// Opening minus closing parentheses and brackets of a line (outside comments; strings are
/// not told apart, as they rarely hold unbalanced brackets).
fn paren_depth(l: &str) -> i32 {
    let code = l.split('#').next().unwrap_or("");
    code.chars()
        .map(|c| match c {
            '(' | '[' => 1,
            ')' | ']' => -1,
            _ => 0,
        })
        .sum()
}

/// The name of the function whose body holds line `line` (1-based): the nearest `def` above it
/// indented less than it.
pub(crate) fn enclosing_def(src: &[String], line: u32) -> Option<(String, u32)> {
    let at = indent(src.get((line as usize).checked_sub(1)?)?)?;
    (0..line as usize - 1).rev().find_map(|j| {
        let l = &src[j];
        let t = l.trim_start();
        let name = t.strip_prefix("def ")?.split('(').next()?.trim();
        (indent(l)? < at).then(|| (name.to_string(), j as u32 + 1))
    })
}

/// The one line of `span` (1-based, inclusive) that calls `name`, where exactly one does.
pub(crate) fn call_line(src: &[String], (from, to): (u32, u32), name: &str) -> Option<u32> {
    let calls = |l: &str| {
        let code = l.split('#').next().unwrap_or("");
        code.match_indices(name).any(|(i, _)| {
            let before = code[..i].chars().next_back();
            let after = code[i + name.len()..].trim_start();
            after.starts_with('(') && !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.')
        })
    };
    let mut found = (from + 1..=to).filter(|&l| src.get(l as usize - 1).is_some_and(|s| calls(s) && !s.trim_start().starts_with("def ")));
    let first = found.next()?;
    found.next().is_none().then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = "@triton.jit
def rotate(x1, x2, c, s):
    return x1 * c - x2 * s, x2 * c + x1 * s


@triton.jit
def kernel(X, Y,
           N: tl.constexpr):
    # rotate(x) is called once
    x = tl.load(X)
    a, b = rotate(x, x, 1.0,
                  -1.0)
    tl.store(Y, a + b)


def other():
    return rotate(1, 2, 3, 4)
";

    fn src() -> Vec<String> {
        SRC.lines().map(String::from).collect()
    }

    #[test]
    fn a_helper_line_its_function_and_the_kernel_s_one_call_of_it() {
        let s = src();
        assert_eq!(extent(&s, 7), Some((7, 13)), "multi-line parameters, blank lines after the body");
        assert_eq!(enclosing_def(&s, 3), Some(("rotate".to_string(), 2)));
        assert_eq!(enclosing_def(&s, 11), Some(("kernel".to_string(), 7)));
        assert_eq!(call_line(&s, (7, 13), "rotate"), Some(11), "the comment does not call it");
        assert_eq!(call_line(&s, (7, 13), "rot"), None);
        assert_eq!(call_line(&s, (1, 18), "rotate"), None, "two calls: neither is the one");
    }
}
