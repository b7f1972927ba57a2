//! The one-line summary of where a tensor's errors are, when the pattern is a simple one.
//!
//! The pass over the elements records which slices (of the folded leading axes), rows and
//! columns hold an element over tolerance. When the number over tolerance equals the product of
//! those three counts, the errors are *exactly* every element of those slices, rows and columns
//! (they lie within that product, and there are as many): such a pattern is named by its rows
//! and columns ("columns 256..299 of every row", "one 16x64 tile at [32:48, 128:192]"). Any
//! other pattern is "scattered", with the rows and columns it lies within.

/// Runs of consecutive indices listed at most; more are counted.
const MAX_RUNS: usize = 8;
/// Indices missing from a set named by them at most ("every row but 5, 9").
const MAX_MISSING: usize = 3;

/// Which slices, rows and columns hold an element over tolerance.
pub(super) struct Hits<'a> {
    pub slices: &'a [bool],
    pub rows: &'a [bool],
    pub cols: &'a [bool],
    /// The tensor's rank.
    pub rank: usize,
}

/// The indices of an axis holding an error, out of `n`.
struct Set {
    idx: Vec<usize>,
    n: usize,
}

impl Set {
    fn of(hit: &[bool]) -> Set {
        Set { idx: hit.iter().enumerate().filter(|(_, h)| **h).map(|(i, _)| i).collect(), n: hit.len() }
    }

    fn all(&self) -> bool {
        self.idx.len() == self.n
    }

    fn first(&self) -> usize {
        self.idx.first().copied().unwrap_or(0)
    }

    fn last(&self) -> usize {
        self.idx.last().copied().unwrap_or(0)
    }

    fn contiguous(&self) -> bool {
        !self.idx.is_empty() && self.last() - self.first() + 1 == self.idx.len()
    }

    /// The common step of an evenly spaced set of at least three, if it is one.
    fn step(&self) -> Option<usize> {
        let k = self.idx.get(1)? - self.idx[0];
        (self.idx.len() >= 3 && self.idx.windows(2).all(|w| w[1] - w[0] == k)).then_some(k)
    }

    /// The indices not in the set.
    fn missing(&self) -> Vec<usize> {
        let mut hit = vec![false; self.n];
        self.idx.iter().for_each(|&i| hit[i] = true);
        (0..self.n).filter(|&i| !hit[i]).collect()
    }

    /// Whether [`Set::describe`] names the set exactly in a few words (not only its count).
    fn simple(&self) -> bool {
        self.contiguous() || self.step().is_some() || self.runs().len() <= MAX_RUNS || self.few_missing()
    }

    /// At most [`MAX_MISSING`] indices are missing, fewer than there are in the set.
    fn few_missing(&self) -> bool {
        let missing = self.n - self.idx.len();
        missing <= MAX_MISSING && missing < self.idx.len()
    }

    /// Maximal runs of consecutive indices, `[first, last]`.
    fn runs(&self) -> Vec<[usize; 2]> {
        let mut runs: Vec<[usize; 2]> = Vec::new();
        for &i in &self.idx {
            match runs.last_mut() {
                Some(r) if r[1] + 1 == i => r[1] = i,
                _ => runs.push([i, i]),
            }
        }
        runs
    }

    /// "row 17", "rows 256..299", "every row but 5, 9", "rows 0, 4, 8, ..., 60 (every 4th)",
    /// "rows 0..3, 8..11, 17" (up to [`MAX_RUNS`] runs), "37 rows in 2..95" (ranges inclusive).
    fn describe(&self, one: &str, many: &str) -> String {
        let list = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(", ");
        if self.idx.len() == 1 {
            return format!("{one} {}", self.first());
        }
        if self.contiguous() {
            return format!("{many} {}..{}", self.first(), self.last());
        }
        if self.few_missing() {
            return format!("every {one} but {}", list(&self.missing()));
        }
        if let Some(k) = self.step() {
            let shown = if self.idx.len() <= 4 { list(&self.idx) } else { format!("{}, ..., {}", list(&self.idx[..3]), self.last()) };
            return format!("{many} {shown} (every {})", ordinal(k));
        }
        let runs = self.runs();
        if runs.len() <= MAX_RUNS {
            let r: Vec<String> = runs.iter().map(|[a, b]| if a == b { a.to_string() } else { format!("{a}..{b}") }).collect();
            return format!("{many} {}", r.join(", "));
        }
        format!("{} {many} in {}..{}", self.idx.len(), self.first(), self.last())
    }
}

/// `2nd`, `3rd`, `4th`, `11th`, `21st`.
fn ordinal(k: usize) -> String {
    let suffix = match (k % 10, k % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{k}{suffix}")
}

/// The summary of a map whose hits are `h`, with `over` elements over tolerance.
pub(super) fn summary(h: &Hits<'_>, over: usize) -> String {
    let (s, r, c) = (Set::of(h.slices), Set::of(h.rows), Set::of(h.cols));
    let numel = s.n * r.n * c.n;
    if over == numel {
        return "everywhere".into();
    }
    match place(h.rank, &r, &c) {
        Some(p) if over == s.idx.len() * r.idx.len() * c.idx.len() => format!("{p}{}", in_slices(h.rank, &s)),
        _ => scattered(h.rank, (&s, &r, &c), over, numel),
    }
}

/// Where in the last two axes: exactly the elements of rows `r` and columns `c`; `None` for a
/// 1-D tensor whose elements over tolerance no few words name (every set of one row is such a
/// product, but a count of elements is no pattern).
fn place(rank: usize, r: &Set, c: &Set) -> Option<String> {
    if rank <= 1 {
        return match (c.all(), c.idx.len()) {
            (true, _) => Some("every element".into()),
            (false, 1) => Some(format!("element {} only", c.first())),
            _ => c.simple().then(|| c.describe("element", "elements")),
        };
    }
    Some(match (r.all(), c.all()) {
        (true, true) => "every element".into(),
        (true, false) => format!("{} of every row", c.describe("column", "columns")),
        (false, true) if r.idx.len() == 1 => format!("row {} only", r.first()),
        (false, true) => r.describe("row", "rows"),
        (false, false) if r.idx.len() == 1 && c.idx.len() == 1 => format!("element [{}, {}] only", r.first(), c.first()),
        (false, false) if r.contiguous() && c.contiguous() => {
            format!("one {}x{} tile at [{}:{}, {}:{}]", r.idx.len(), c.idx.len(), r.first(), r.last() + 1, c.first(), c.last() + 1)
        }
        (false, false) => format!("{} of {}", c.describe("column", "columns"), r.describe("row", "rows")),
    })
}

/// Which slices of the folded leading axes, when not every one.
fn in_slices(rank: usize, s: &Set) -> String {
    match (s.all(), rank) {
        (true, _) => String::new(),
        (false, 3) => format!(", in {} of axis 0", s.describe("index", "indices")),
        (false, _) => format!(", in {} of axes 0..{} (flattened)", s.describe("slice", "slices"), rank - 3),
    }
}

/// A pattern that is no product of rows and columns: how many, within which rows and columns.
fn scattered(rank: usize, (s, r, c): (&Set, &Set, &Set), over: usize, numel: usize) -> String {
    let span = |x: &Set, many: &str| (x.first() > 0 || x.last() + 1 < x.n).then(|| format!("{many}{}..{}", x.first(), x.last()));
    let within: Vec<String> =
        if rank <= 1 { span(c, "").into_iter().collect() } else { [span(r, "rows "), span(c, "columns ")].into_iter().flatten().collect() };
    let within = if within.is_empty() { String::new() } else { format!(" within {}", within.join(", ")) };
    let slices = if s.all() { String::new() } else { format!(", in {} of {} slices", s.idx.len(), s.n) };
    format!("scattered: {over} of {numel} elements{within}{slices}")
}
