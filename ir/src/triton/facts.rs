//! What a module's top level can know at conversion about the program that imports it: the Triton
//! version, the environment and the device ([`Facts`], from [`ConvertOptions`]), and the values
//! module-level expressions take from them ([`Known`]), compared as Python compares them. The
//! module scan ([`super::scan`]) uses them to take the branch of a module-level `if` or `try`
//! that Python takes, so that a name bound in several branches resolves as the program binds it.

use super::ConvertOptions;
use std::cmp::Ordering;

/// The facts a conversion decides module-level conditions with.
#[derive(Clone, Debug)]
pub(crate) struct Facts {
    /// `triton.__version__`.
    pub triton_version: String,
    /// The environment the program runs in (unset names are absent).
    pub env: Vec<(String, String)>,
    /// `torch.cuda.get_device_capability()`.
    pub capability: (u32, u32),
}

impl Facts {
    pub(crate) fn of(o: &ConvertOptions) -> Facts {
        Facts { triton_version: o.triton_version.clone(), env: o.env.clone(), capability: o.device_capability }
    }

    /// `os.environ.get(name)`.
    pub(crate) fn env(&self, name: &str) -> Option<&str> {
        self.env.iter().rev().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

impl Default for Facts {
    fn default() -> Facts {
        Facts::of(&ConvertOptions::default())
    }
}

/// A module-level value known at conversion.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Known {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    None,
    /// A parsed version (`packaging.version.Version`): its release numbers.
    Version(Vec<i64>),
    Tuple(Vec<Known>),
    /// A comparison function of the `operator` module (`operator.ge`), by its operator.
    Op(&'static str),
    /// A value whose truth is known but not the value itself (`x or True`).
    Truth(bool),
}

impl Known {
    /// Python's truth value.
    pub(crate) fn truthy(&self) -> bool {
        match self {
            Known::Bool(b) | Known::Truth(b) => *b,
            Known::Int(i) => *i != 0,
            Known::Float(x) => *x != 0.0,
            Known::Str(s) => !s.is_empty(),
            Known::None => false,
            Known::Tuple(t) => !t.is_empty(),
            Known::Version(_) | Known::Op(_) => true,
        }
    }

    /// `self OP other` for a comparison operator (`==`, `<`, ...), `None` where Python would
    /// raise or the answer is not known.
    pub(crate) fn compare(&self, op: &str, other: &Known) -> Option<bool> {
        if matches!(op, "==" | "!=") {
            let eq = self.equals(other)?;
            return Some(eq == (op == "=="));
        }
        let ord = self.order(other)?;
        Some(match op {
            "<" => ord == Ordering::Less,
            "<=" => ord != Ordering::Greater,
            ">" => ord == Ordering::Greater,
            ">=" => ord != Ordering::Less,
            _ => return None,
        })
    }

    fn equals(&self, other: &Known) -> Option<bool> {
        match (self, other) {
            (Known::Truth(_), _) | (_, Known::Truth(_)) => None,
            (Known::Str(a), Known::Str(b)) => Some(a == b),
            (Known::None, Known::None) => Some(true),
            (Known::None, _) | (_, Known::None) => Some(false),
            (Known::Str(_), _) | (_, Known::Str(_)) if !self.is_version() && !other.is_version() => Some(false),
            _ => self.order(other).map(|o| o == Ordering::Equal),
        }
    }

    fn is_version(&self) -> bool {
        matches!(self, Known::Version(_))
    }

    /// Python's ordering: numbers among themselves, strings lexicographically, tuples item by
    /// item, versions by release numbers (a string against a version is parsed as one).
    fn order(&self, other: &Known) -> Option<Ordering> {
        match (self, other) {
            (Known::Version(a), b) | (b, Known::Version(a)) => {
                let b = match b {
                    Known::Version(v) => v.clone(),
                    Known::Str(s) => parse_version(s)?,
                    _ => return None,
                };
                let o = cmp_release(a, &b);
                // `(b, Version(a))` matched with the roles swapped.
                Some(if matches!(self, Known::Version(_)) { o } else { o.reverse() })
            }
            (Known::Str(a), Known::Str(b)) => Some(a.cmp(b)),
            (Known::Tuple(a), Known::Tuple(b)) => {
                for (x, y) in a.iter().zip(b) {
                    match x.order(y)? {
                        Ordering::Equal => continue,
                        o => return Some(o),
                    }
                }
                Some(a.len().cmp(&b.len()))
            }
            _ => self.number()?.partial_cmp(&other.number()?),
        }
    }

    fn number(&self) -> Option<f64> {
        match self {
            Known::Bool(b) => Some(*b as i64 as f64),
            Known::Int(i) => Some(*i as f64),
            Known::Float(x) => Some(*x),
            _ => None,
        }
    }
}

/// Orders release numbers as `packaging` does: missing trailing components are zeros.
fn cmp_release(a: &[i64], b: &[i64]) -> Ordering {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| a.get(i).copied().unwrap_or(0).cmp(&b.get(i).copied().unwrap_or(0)))
        .find(|o| *o != Ordering::Equal)
        .unwrap_or(Ordering::Equal)
}

/// The release numbers of a version string (`3.1.0`, `3.0.0+git45`, `2.3.0.dev2024`, `v3.2`):
/// the leading dot-separated numbers; pre-release and local parts are ignored. `None` when it
/// starts with no number.
pub(crate) fn parse_version(s: &str) -> Option<Vec<i64>> {
    let s = s.trim().trim_start_matches(['v', 'V']);
    let mut out = Vec::new();
    for part in s.split('.') {
        let digits: String = part.chars().take_while(|c| c.is_ascii_digit()).collect();
        let Ok(n) = digits.parse::<i64>() else { break };
        out.push(n);
        if digits.len() != part.len() {
            break;
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Whether `text` reads as a version (`3.6.0`, `3.1.0+git45`): it starts with a number.
pub fn is_version(text: &str) -> bool {
    parse_version(text).is_some()
}

/// The (major, minor) of a device named as `sm_90`, `sm_100a`, `9.0` or `90`.
pub fn parse_device(text: &str) -> Option<(u32, u32)> {
    let t = text.trim();
    if let Some((a, b)) = t.split_once('.') {
        return Some((a.parse().ok()?, b.parse().ok()?));
    }
    let t = t.strip_prefix("sm_").or_else(|| t.strip_prefix("sm")).unwrap_or(t);
    let digits = t.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    if digits.len() < 2 || !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let (major, minor) = digits.split_at(digits.len() - 1);
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The comparison an `operator` module function performs.
pub(crate) fn operator_fn(name: &str) -> Option<&'static str> {
    Some(match name {
        "ge" => ">=",
        "gt" => ">",
        "le" => "<=",
        "lt" => "<",
        "eq" => "==",
        "ne" => "!=",
        _ => return None,
    })
}

/// Modules a Triton release does not have: `(module, first version that has it)`. An import of
/// one of them under an older Triton raises `ImportError` (a `try` takes its `except`).
const TRITON_MODULES_SINCE: &[(&str, &[i64])] = &[("triton.language.extra.libdevice", &[3, 0])];

/// Whether importing `module` fails under this Triton version.
pub(crate) fn module_absent(module: &str, facts: &Facts) -> bool {
    let Some(v) = parse_version(&facts.triton_version) else { return false };
    TRITON_MODULES_SINCE
        .iter()
        .any(|(m, since)| (module == *m || module.starts_with(&format!("{m}."))) && cmp_release(&v, since) == Ordering::Less)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_as_packaging_and_strings_as_python() {
        let v = |s: &str| Known::Version(parse_version(s).unwrap());
        assert_eq!(v("3.6.0").compare(">=", &v("3.0.0")), Some(true));
        assert_eq!(v("3.10.0").compare(">", &v("3.9")), Some(true));
        assert_eq!(v("3.0").compare("==", &v("3.0.0")), Some(true));
        assert_eq!(v("2.3.0+git1").compare("<", &Known::Str("3.0.0".into())), Some(true));
        assert_eq!(Known::Str("3.0.0".into()).compare(">", &v("2.3.0")), Some(true));
        // Strings compare character by character, as Python does: "3.10" < "3.9".
        assert_eq!(Known::Str("3.10.0".into()).compare(">=", &Known::Str("3.9.0".into())), Some(false));
        assert_eq!(
            Known::Tuple(vec![Known::Int(3), Known::Int(1)]).compare(">=", &Known::Tuple(vec![Known::Int(3), Known::Int(0)])),
            Some(true)
        );
        assert_eq!(Known::Str("1".into()).compare("==", &Known::Int(1)), Some(false));
        assert_eq!(parse_version("2.3.0.dev2024"), Some(vec![2, 3, 0]));
        assert_eq!(parse_version("main"), None);
    }

    #[test]
    fn devices_and_absent_modules() {
        assert_eq!(parse_device("sm_90"), Some((9, 0)));
        assert_eq!(parse_device("sm_100a"), Some((10, 0)));
        assert_eq!(parse_device("8.9"), Some((8, 9)));
        assert_eq!(parse_device("hopper"), None);
        let old = Facts { triton_version: "2.3.1".into(), ..Facts::default() };
        assert!(module_absent("triton.language.extra.libdevice", &old));
        assert!(!module_absent("triton.language.extra.libdevice", &Facts::default()));
        assert!(!module_absent("triton.language.extra.cuda.libdevice", &old));
    }
}
