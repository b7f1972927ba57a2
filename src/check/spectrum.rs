//! Ranking blame by evidence across elements (spectrum-based fault localization).
//!
//! One element's data-flow slice lists every line its value passed through; which of them holds
//! the bug, the other elements tell. The slices of a sample of the failing tensor's wrong
//! elements and of its right ones are recorded, and each line is scored by how many wrong and how
//! many right elements it feeds: the Ochiai score `failed / sqrt(total_failed * (failed +
//! passed))`, 1 for a line that feeds every wrong element and no right one. A condition (a mask,
//! the comparison of a `where`) is also scored by its outcome, so that one true for every wrong
//! element and false for every right one scores 1 although both kinds pass through its line.

use super::chunked;
use super::report::Tolerance;
use super::slice::{element_flow, LineKey, Outcome, Reruns, Seen, Target};
use super::steps::{Env, Trace};
use std::collections::HashMap;
use tilegrad_reference::Writers;

/// Each compared gradient's sample of wrong and right elements, by name (blame's evidence).
pub(crate) type Samples = Vec<(String, Sample)>;

/// Elements of each kind sampled, at most.
pub(crate) const SAMPLE: usize = 32;
/// Programs run again to record the slices of each kind of the sample (wrong, right), at most:
/// the cost of the evidence. Each kind has its own, so that the wrong elements (whose programs,
/// in a pass of several launches, each read from another launch's) leave some to the right ones.
const RERUNS: usize = 4;
/// A program run again and recorded costs about as much as running this many programs: the
/// evidence re-runs at most one program of each kind per this many the pass runs, so that it
/// stays a small part of a check however few programs the launches have.
const RECORD_COST: usize = 4;
/// Right elements through a condition's line that must hold another outcome than the wrong
/// ones for the outcome to count as evidence.
const SEPARATED: usize = 4;
/// Runs of neighbouring elements the sample of each kind is made of.
pub(crate) const CLUSTERS: usize = 4;

/// Flat elements of a compared tensor: wrong ones and right ones, sampled.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Sample {
    pub wrong: Vec<usize>,
    pub right: Vec<usize>,
    /// The one ratio of checked to expected value that the wrong elements share, where they
    /// share one (a factor missing or wrong on a line that scales the whole result).
    pub factor: Option<f64>,
    /// Whether the wrong elements mostly look masked wrongly (zero expected and a value written,
    /// or the reverse), where known ([`mostly_masked`]): the worst element may look so alone, at
    /// a boundary where the true value happens to be zero.
    pub masked: Option<bool>,
    /// Per right element (as `right`), where the wrong ones share a factor: whether it is nearer
    /// that factor times its expected value than its expected value (scaled as the wrong ones
    /// are, though within the tolerance). `None` where its expected value is zero or not finite.
    pub scaled: Vec<Option<bool>>,
}

impl Sample {
    /// Up to [`SAMPLE`] wrong and right elements of a tensor of `n`: [`CLUSTERS`] runs of
    /// neighbouring elements of each kind, spread evenly over the tensor (neighbours are mostly
    /// written by one program, which is then run again once for all of them); deterministic, the
    /// element `worst` first among the wrong ones.
    #[cfg(test)]
    pub fn of(n: usize, worst: usize, wrong: impl Fn(usize) -> bool) -> Sample {
        Sample::of_flags(&(0..n).map(wrong).collect::<Vec<bool>>(), worst)
    }

    /// [`Sample::of`] the elements whose flag is set.
    fn of_flags(flags: &[bool], worst: usize) -> Sample {
        let n = flags.len();
        let bad = flags.iter().filter(|&&b| b).count();
        let mut w = clusters(flags, true, bad);
        w.retain(|&i| i != worst);
        w.insert(0, worst);
        w.truncate(SAMPLE);
        Sample { wrong: w, right: clusters(flags, false, n - bad), factor: None, masked: None, scaled: Vec::new() }
    }

    /// A sample of a tensor found right: up to [`SAMPLE`] elements spread evenly over it (the
    /// [`clusters`] of elements all right, without a pass over them: every passing gradient of
    /// every check gets one).
    pub fn all_right(n: usize) -> Sample {
        let run = SAMPLE / CLUSTERS;
        let right = if n <= SAMPLE {
            (0..n).collect()
        } else {
            let mut v: Vec<usize> = (0..CLUSTERS).map(|c| c * (n - run) / (CLUSTERS - 1)).flat_map(|s| s..s + run).collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        Sample { wrong: Vec::new(), right, factor: None, masked: None, scaled: Vec::new() }
    }

    /// The sample of a compared tensor, judged as the report judges it (`terms`: the scale of
    /// what was summed, see [`super::report::compare_by`]); `worst` is the worst element and its
    /// error over the tolerance. Where no element exceeds the tolerance (a formula that fails
    /// within it), the elements off by more than half the worst error are the wrong ones.
    pub fn compared(expected: &[f64], got: impl Fn(usize) -> f64 + Sync, tol: Tolerance, terms: f64, worst: (usize, f64)) -> Sample {
        use rayon::prelude::*;
        let n = expected.len();
        let scale = chunked::max(n, |i| if expected[i].is_finite() { expected[i].abs() } else { 0.0 }).max(terms);
        let scale = if scale > 0.0 { scale } else { 1.0 };
        let ratio = |i: usize| {
            let (e, g) = (expected[i], got(i));
            if e.is_finite() != g.is_finite() || !(e.is_finite() || g == e || g.is_nan() && e.is_nan()) {
                f64::INFINITY
            } else if !e.is_finite() || g == e {
                0.0
            } else {
                (g - e).abs() / (tol.atol * scale + tol.rtol * e.abs())
            }
        };
        let threshold = if worst.1 > 1.0 { 1.0 } else { worst.1 / 2.0 };
        // Both passes over every element on rayon's threads (tens of millions at training sizes).
        let flags: Vec<bool> = (0..n).into_par_iter().map(|i| ratio(i) > threshold).collect();
        let mut s = Sample::of_flags(&flags, worst.0);
        s.masked = mostly_masked(&flags, |i| (expected[i], got(i)));
        s.factor = common_factor(s.wrong.iter().map(|&i| (expected[i], got(i))));
        if let Some(f) = s.factor {
            s.scaled = s.right.iter().map(|&i| nearer_scaled(expected[i], got(i), f)).collect();
        }
        s
    }
}

/// Wrong elements read to judge whether they look masked wrongly, at most.
const MASKED_READS: usize = 4096;

/// Whether at least half of the wrong elements (those flagged; `pair`: an element's expected
/// and checked value) look masked wrongly: one of the two is zero and the other is not. `None`
/// for none. Judged over every wrong element, or [`MASKED_READS`] of them evenly spaced, not
/// over the sample: its runs of neighbours may all fall where the tensor's structure repeats
/// (the first row of each head, where a causal mask leaves one key).
fn mostly_masked(flags: &[bool], pair: impl Fn(usize) -> (f64, f64)) -> Option<bool> {
    let wrong = flags.iter().filter(|&&f| f).count();
    let stride = wrong.div_ceil(MASKED_READS).max(1);
    let (mut read, mut masked) = (0usize, 0usize);
    for (i, _) in flags.iter().enumerate().filter(|(_, &f)| f).step_by(stride) {
        let (e, g) = pair(i);
        read += 1;
        masked += usize::from((e == 0.0) != (g == 0.0));
    }
    (read > 0).then_some(masked * 2 >= read)
}

/// The ratio `got / expected` that at least nine in ten of the pairs `(expected, got)` (of the
/// sampled wrong elements) share
/// to within 1e-3 (pairs expecting zero left out), when there are at least four and it is
/// neither 1 nor 0 (elements left at zero are masked wrongly, not scaled).
fn common_factor(pairs: impl Iterator<Item = (f64, f64)>) -> Option<f64> {
    let mut r: Vec<f64> = pairs.filter(|(e, g)| *e != 0.0 && e.is_finite() && g.is_finite()).map(|(e, g)| g / e).collect();
    if r.len() < 4 {
        return None;
    }
    r.sort_by(f64::total_cmp);
    let median = r[r.len() / 2];
    let close = r.iter().filter(|x| (*x - median).abs() <= 1e-3 * median.abs()).count();
    (close * 10 >= r.len() * 9 && (median - 1.0).abs() > 1e-3 && median.abs() > 1e-3).then_some(median)
}

/// Whether `got` is nearer `factor * expected` than `expected`; `None` where `expected` is zero
/// or either is not finite.
fn nearer_scaled(expected: f64, got: f64, factor: f64) -> Option<bool> {
    (expected != 0.0 && expected.is_finite() && got.is_finite()).then(|| (got - factor * expected).abs() < (got - expected).abs())
}

/// Whether the factor the wrong elements share scales all that their programs store, judged by
/// the right elements of the same programs (`right`: whether each is scaled as the wrong ones
/// are, see [`Sample::scaled`]): `false` where at least [`SEPARATED`] of them, and half of
/// those known, are not (under a factor on the whole, only those whose error rounding hides
/// could be). A factor on the stored value or on one float of the program scales
/// every element it writes; one on a term scales the elements that term dominates.
fn scales_whole(right: impl Iterator<Item = bool>) -> bool {
    let (mut n, mut not) = (0usize, 0usize);
    for scaled in right {
        n += 1;
        not += usize::from(!scaled);
    }
    !(not >= SEPARATED && not * 2 >= n)
}

/// [`CLUSTERS`] runs of [`SAMPLE`] / [`CLUSTERS`] consecutive items of the `count` elements
/// whose flag is `kind`, spread evenly over them (all of them when they are few).
fn clusters(flags: &[bool], kind: bool, count: usize) -> Vec<usize> {
    let run = SAMPLE / CLUSTERS;
    let of_kind = flags.iter().enumerate().filter(|(_, &f)| f == kind).map(|(i, _)| i);
    if count <= SAMPLE {
        return of_kind.collect();
    }
    let starts: Vec<usize> = (0..CLUSTERS).map(|c| c * (count - run) / (CLUSTERS - 1)).collect();
    of_kind.enumerate().filter(|(rank, _)| starts.iter().any(|&s| (s..s + run).contains(rank))).map(|(_, i)| i).collect()
}

/// How many sampled wrong and right elements each line, and each outcome of a condition, feeds.
#[derive(Debug, Default)]
pub(crate) struct Evidence {
    /// The ratio the wrong elements share ([`Sample::factor`]).
    pub factor: Option<f64>,
    /// Whether the wrong elements mostly look masked wrongly ([`Sample::masked`]).
    pub masked: Option<bool>,
    /// Whether the factor, if any, scales a term of what the wrong elements' programs store, not
    /// all of it ([`scales_whole`]); `false` where the right elements tell nothing.
    pub term: bool,
    wrong: usize,
    right: usize,
    lines: HashMap<LineKey, [usize; 2]>,
    conditions: HashMap<(LineKey, Outcome), [usize; 2]>,
}

impl Evidence {
    /// Records the slices of the sampled elements of a traced pass: the wrong and right elements
    /// of tensor `name`, and the elements of every other tensor compared and found right
    /// (`samples`, by tensor: a line that also feeds a gradient found right is less suspect).
    /// `None` when no wrong element's slice could be recorded. The programs run again are
    /// returned, for the slice of the worst element to use.
    pub fn gather(trace: &Trace, env: &Env, name: &str, samples: &[(String, Sample)]) -> (Option<Evidence>, Reruns) {
        let mine = samples.iter().find(|(t, _)| t == name).map(|(_, s)| s);
        let mut ev = Evidence {
            factor: mine.and_then(|s| s.factor),
            masked: mine.and_then(|s| s.masked),
            term: mine.is_some_and(|s| !whole_of(trace, env, name, s)),
            ..Evidence::default()
        };
        let mut reruns = Reruns::with_budget(0);
        let own = samples.iter().filter(|(t, _)| t == name).map(|(t, s)| (t, &s.wrong));
        let right = samples.iter().filter(|(t, s)| t == name || s.wrong.is_empty()).map(|(t, s)| (t, &s.right));
        let programs: usize = trace.launches.iter().map(|l| l.grid.programs() as usize).sum();
        let per_kind = RERUNS.min(programs / RECORD_COST).max(1);
        for (wrong, kind) in [(true, own.collect::<Vec<_>>()), (false, right.collect())] {
            let targets: Vec<Target> = kind.into_iter().flat_map(|(tensor, elems)| targets(trace, env, tensor, elems)).collect();
            reruns.allow(per_kind);
            reruns.prefetch(&targets);
            for t in &targets {
                let mut seen = Seen::default();
                if element_flow(t, &mut reruns, 0, &mut seen).is_some() {
                    ev.count(&seen, wrong);
                }
            }
        }
        ((ev.wrong > 0).then_some(ev), reruns)
    }

    /// Counts one element's slice.
    fn count(&mut self, seen: &Seen, wrong: bool) {
        let k = usize::from(!wrong);
        if wrong {
            self.wrong += 1;
        } else {
            self.right += 1;
        }
        for l in &seen.lines {
            self.lines.entry(l.clone()).or_default()[k] += 1;
        }
        for c in &seen.conditions {
            self.conditions.entry(c.clone()).or_default()[k] += 1;
        }
    }

    /// The Ochiai score of a line that feeds `f` wrong and `p` right elements.
    fn ochiai(&self, [f, p]: [usize; 2]) -> f64 {
        if f == 0 {
            0.0
        } else {
            f as f64 / ((self.wrong * (f + p)) as f64).sqrt()
        }
    }

    /// The score of line `key` (that of its line or of a condition on it, whichever is higher)
    /// and why; `None` when no sampled slice holds it. A condition's outcome counts only where it
    /// separates the wrong elements from the right ones ([`separates`]).
    pub fn judge(&self, key: &LineKey) -> Option<(f64, String)> {
        let &[f, p] = self.lines.get(key)?;
        let (nw, nr) = (self.wrong, self.right);
        let feeds = match nr {
            0 => format!("feeds {f} of {nw} wrong elements (no element sampled is right)"),
            _ => format!("feeds {f} of {nw} wrong elements and {p} of {nr} right ones"),
        };
        let mut best = (self.ochiai([f, p]), feeds);
        for o in [Outcome::True, Outcome::False] {
            let Some(&c) = self.conditions.get(&(key.clone(), o)) else { continue };
            let s = self.ochiai(c);
            if s > best.0 && separates(c[1], p) {
                best = (s, condition_reason(o, c, nw, nr));
            }
        }
        Some(best)
    }
}

/// Whether an outcome that `right` of the `through` right elements through its line hold (and
/// the wrong ones too) tells the wrong ones apart: none holds it, or at most half do
/// while at least [`SEPARATED`] hold another. (With a few right elements, which lanes of a row a
/// slice follows decides the outcome of a mask over it as much as the bug does; where half the
/// right ones share it, the condition is what every element passes, not what the wrong share.)
fn separates(right: usize, through: usize) -> bool {
    right == 0 || through - right >= SEPARATED && right * 2 <= through
}

/// [`scales_whole`] over the right elements of `sample` (of tensor `name`) that a program
/// writing a sampled wrong element wrote.
fn whole_of(trace: &Trace, env: &Env, name: &str, sample: &Sample) -> bool {
    if sample.scaled.is_empty() {
        return true;
    }
    let programs: Vec<(usize, u32)> = targets(trace, env, name, &sample.wrong).iter().map(|t| (t.step, t.program)).collect();
    let known: Vec<usize> = sample.right.iter().zip(&sample.scaled).filter(|(_, s)| s.is_some()).map(|(&e, _)| e).collect();
    let scaled = |e: usize| sample.right.iter().position(|&r| r == e).and_then(|i| sample.scaled[i]).unwrap_or(true);
    let beside = targets(trace, env, name, &known).into_iter().filter(|t| programs.contains(&(t.step, t.program))).map(|t| t.element);
    let v: Vec<bool> = beside.map(scaled).collect();
    scales_whole(v.into_iter())
}

/// What blame re-runs for elements `elems` of `tensor`: the store of the launch that wrote each
/// last (an element several programs added to has no one program to re-run).
fn targets<'a>(trace: &'a Trace, env: &'a Env, tensor: &'a str, elems: &[usize]) -> Vec<Target<'a>> {
    let Some((_, _, layers)) = trace.get(tensor) else { return Vec::new() };
    let writer = |e: usize| layers.iter().rev().find_map(|(step, _, _, w)| w.of(e).map(|(p, inst)| (*step, p, inst)));
    elems
        .iter()
        .filter_map(|&e| {
            let (step, program, inst) = writer(e).filter(|w| w.1 != Writers::MANY)?;
            Some(Target { trace, env, step, tensor, element: e, program, inst, expected: None, got: None })
        })
        .collect()
}

/// Why a condition whose outcome `o` holds for `f` wrong and `p` right elements is suspect.
fn condition_reason(o: Outcome, [f, p]: [usize; 2], nw: usize, nr: usize) -> String {
    let (is, not) = match o {
        Outcome::True => ("true", "false"),
        Outcome::False => ("false", "true"),
    };
    if f == nw && p == 0 {
        format!("this condition is {is} for every wrong element ({nw}) and {not} for every right one ({nr})")
    } else {
        format!("this condition is {is} for {f} of {nw} wrong elements and {p} of {nr} right ones")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sample of a tensor all right is the clusters a pass over its elements picks.
    #[test]
    fn a_sample_all_right_is_the_clusters_of_every_element() {
        for n in [0, 1, 7, 32, 33, 40, 100, 1001, 65_537] {
            assert_eq!(Sample::all_right(n).right, clusters(&vec![false; n], false, n), "{n}");
        }
    }

    #[test]
    fn the_sample_is_runs_of_neighbours_spread_evenly_and_starts_with_the_worst() {
        let s = Sample::of(1000, 500, |i| i % 10 == 0);
        assert_eq!(s.wrong.len(), SAMPLE);
        assert_eq!(s.wrong[0], 500);
        assert!(s.wrong.iter().all(|i| i % 10 == 0));
        assert_eq!(&s.wrong[1..4], &[0, 10, 20]);
        assert_eq!(*s.wrong.last().unwrap(), 980, "{s:?}: the worst took the last place");
        assert_eq!(s.right.len(), SAMPLE);
        assert!(s.right.iter().all(|i| i % 10 != 0));
        assert_eq!(*s.right.last().unwrap(), 999, "{s:?}");
        assert_eq!(Sample::of(1000, 500, |i| i % 10 == 0), s, "deterministic");
        assert_eq!(Sample::all_right(5).right, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_sample_of_the_report_s_wrong_elements() {
        let tol = Tolerance { rtol: 1e-3, atol: 0.0 };
        let e = [1.0, 2.0, 3.0, 4.0];
        let s = Sample::compared(&e, |i| if i == 2 { 3.5 } else { e[i] }, tol, 0.0, (2, 100.0));
        assert_eq!((s.wrong, s.right), (vec![2], vec![0, 1, 3]));
        // A formula failing within the tolerance: the elements off by more than half the worst.
        let s = Sample::compared(&e, |i| e[i] * (1.0 + 1e-4 * i as f64), tol, 0.0, (3, 0.3));
        assert_eq!((s.wrong, s.right), (vec![3, 2], vec![0, 1]));
    }

    #[test]
    fn a_factor_the_wrong_elements_share() {
        let pairs = |r: &[f64]| r.iter().enumerate().map(|(i, &x)| (i as f64 + 1.0, (i as f64 + 1.0) * x)).collect::<Vec<_>>();
        assert_eq!(common_factor(pairs(&[8.0; 6]).into_iter()), Some(8.0));
        // One in ten may differ; more may not; 1 (right) and 0 (left at zero) are no factor.
        let mut r = vec![0.5; 10];
        r[3] = 0.7;
        assert_eq!(common_factor(pairs(&r).into_iter()), Some(0.5));
        r[4] = 0.7;
        assert_eq!(common_factor(pairs(&r).into_iter()), None);
        assert_eq!(common_factor(pairs(&[1.0; 6]).into_iter()), None);
        assert_eq!(common_factor(pairs(&[0.0; 6]).into_iter()), None);
        assert_eq!(common_factor(pairs(&[8.0; 3]).into_iter()), None, "too few");
    }

    #[test]
    fn whether_the_wrong_elements_look_masked_counts_every_one_of_them() {
        let tol = Tolerance { rtol: 1e-3, atol: 0.0 };
        // Every element is wrong; where the sample's four runs fall (as on the first row of each
        // of four heads), the elements expect 0 and get 1, the other 208 are off by a half.
        let at_runs = |i: usize| [0, 77, 154, 232].iter().any(|&s| (s..s + 8).contains(&i));
        let e: Vec<f64> = (0..240).map(|i| if at_runs(i) { 0.0 } else { 1.0 + i as f64 }).collect();
        let got = |i: usize| if at_runs(i) { 1.0 } else { e[i] * 1.5 };
        let s = Sample::compared(&e, got, tol, 0.0, (0, f64::INFINITY));
        assert!(s.wrong.iter().all(|&i| at_runs(i)), "{s:?}: the sample alone looks masked");
        assert_eq!(s.masked, Some(false));
        let pairs = [(0.0, 1.0), (2.0, 0.0), (1.0, 2.0), (0.0, 0.0)];
        assert_eq!(mostly_masked(&[true, true, true, false], |i| pairs[i]), Some(true));
        assert_eq!(mostly_masked(&[false, false, true, true], |i| pairs[i]), Some(false));
        assert_eq!(mostly_masked(&[false; 4], |i| pairs[i]), None);
        // Evenly spaced reads of many wrong elements, a quarter of them masked.
        let many = vec![true; 4 * MASKED_READS + 8];
        let quarter = |i: usize| if i % 4 == 0 { (0.0, 1.0) } else { (1.0, 2.0) };
        assert_eq!(mostly_masked(&many, quarter), Some(false));
    }

    #[test]
    fn right_elements_not_off_by_the_shared_factor_put_it_on_a_term() {
        assert_eq!(nearer_scaled(1.0, 0.51, 0.5), Some(true));
        assert_eq!(nearer_scaled(1.0, 1.01, 0.5), Some(false));
        assert_eq!(nearer_scaled(0.0, 0.0, 0.5), None);
        let sides = |scaled: usize, not: usize| std::iter::repeat_n(true, scaled).chain(std::iter::repeat_n(false, not));
        assert!(scales_whole(sides(8, 0)), "every right element is scaled too");
        assert!(scales_whole(sides(0, 0)), "no right element tells");
        assert!(scales_whole(sides(0, 3)), "too few are not scaled");
        assert!(!scales_whole(sides(6, 10)), "most are not scaled: a term");
        assert!(scales_whole(sides(12, 4)), "most are scaled: the whole, some hidden by rounding");
    }

    #[test]
    fn a_condition_counts_only_where_its_outcome_separates() {
        // False for every wrong element, and for 3 of the 6 right ones: the line's score stands.
        let mut ev = Evidence::default();
        for i in 0..10 {
            let wrong = i < 4;
            let o = if wrong || i % 2 == 0 { Outcome::False } else { Outcome::True };
            ev.count(&Seen { lines: vec![key(1)], conditions: vec![(key(1), o)] }, wrong);
        }
        let (_, r) = ev.judge(&key(1)).unwrap();
        assert_eq!(r, "feeds 4 of 4 wrong elements and 6 of 6 right ones");
    }

    #[test]
    fn an_outcome_separates_when_few_right_elements_share_it() {
        assert!(separates(0, 0) && separates(0, 32), "no right element holds it");
        assert!(separates(16, 32), "half hold it, half another");
        assert!(!separates(22, 32), "most right elements hold it: every element passes it");
        assert!(!separates(1, 4), "too few hold another");
    }

    fn key(l: u32) -> LineKey {
        ("k.py".into(), l)
    }

    #[test]
    fn ochiai_ranks_the_line_that_feeds_only_wrong_elements_and_names_a_separating_condition() {
        let mut ev = Evidence::default();
        for i in 0..8 {
            let wrong = i < 4;
            let mut seen =
                Seen { lines: vec![key(1), key(2)], conditions: vec![(key(2), if wrong { Outcome::True } else { Outcome::False })] };
            if wrong || i == 4 {
                seen.lines.push(key(3));
            }
            ev.count(&seen, wrong);
        }
        let (s1, r1) = ev.judge(&key(1)).unwrap();
        assert!((s1 - 0.5f64.sqrt()).abs() < 1e-12, "{s1}");
        assert_eq!(r1, "feeds 4 of 4 wrong elements and 4 of 4 right ones");
        let (s2, r2) = ev.judge(&key(2)).unwrap();
        assert_eq!(s2, 1.0);
        assert_eq!(r2, "this condition is true for every wrong element (4) and false for every right one (4)");
        let (s3, r3) = ev.judge(&key(3)).unwrap();
        assert!(s3 < 1.0 && s3 > s1, "{s3}");
        assert_eq!(r3, "feeds 4 of 4 wrong elements and 1 of 4 right ones");
        assert_eq!(ev.judge(&key(9)), None);
    }
}
