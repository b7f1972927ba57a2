//! Data-flow slices: the source lines through which one wrong element's value was computed.
//!
//! Blame names the store that wrote a wrong element; the bug is usually some lines above it. The
//! program instance that wrote the element is run again alone on the reference interpreter with
//! its launch's memory as it was ([`tilegrad_reference::Launch::record_program`]), recording
//! every op's value, and the kernel's def-use chains are walked back from the store's operands,
//! lane by lane: through elementwise ops, broadcasts and reshapes, reductions (every lane of the
//! reduced row), `dot` (a row of one operand, a column of the other), `where` (the branch taken at
//! that lane, and its condition), casts, loads (their offsets and masks) and loop-carried values
//! (to the op in the body that updates the accumulator, and its initial value). A load of a
//! tensor that an earlier launch of the pass wrote is followed into that launch's program.
//!
//! Lines are ranked so that the likeliest culprit comes first: where the first non-finite value
//! appeared (for a NaN/inf element); masks and conditions when the element looks masked wrongly
//! (expected zero but written, or the reverse); lines computing floats used only on the path to
//! this store before lines shared with the kernel's other outputs; plain loads, index arithmetic
//! and addresses last.

use super::spectrum::Evidence;
use super::steps::{Env, Trace, TracedLaunch};
use serde::Serialize;
use std::collections::HashMap;
use std::fmt;
use std::rc::Rc;
use std::sync::Arc;
use tilegrad_ir::{Block, Inst, Kernel, Op, Value};
use tilegrad_reference::{Arg, Grid, Launch, Memory, Options, ProgramRecord, Recorded, TensorId, Writers};

/// Lines shown at most (the rest are counted in [`Slice::omitted`]).
const SHOWN: usize = 10;
/// Lines the text report quotes in full (the rest it names).
const TEXT_LINES: usize = 3;
/// Lines of each earlier launch followed that are always shown.
const PER_LAUNCH: usize = 3;
/// Earlier launches followed, at most, from one slice.
const MAX_DEPTH: usize = 2;
/// Lanes followed per value, at most: which lines a value depends on rarely needs more, and a
/// `dot` inside a loop would otherwise spread to whole tiles.
const MAX_LANES: usize = 256;
/// Lanes followed per value when a slice is recorded only for its lines, as evidence: the lines
/// a value depends on rarely need more lanes than this to be found.
const EVIDENCE_LANES: usize = 8;

/// The source lines through which a blamed element's value was computed, most likely culprit
/// first, with the value each computed at that element.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Slice {
    /// Lines, ranked (at most ten).
    pub lines: Vec<SliceLine>,
    /// Lines of the slice not shown.
    pub omitted: usize,
    /// For a non-finite element: the first op, in program order, whose result became non-finite
    /// from finite operands (or the load that read a non-finite value), with its operands.
    pub nonfinite: Option<String>,
    /// Masks and conditions that decided whether, and from what, the element was written.
    pub decided_by: Vec<String>,
    /// The launch of the blamed store (its step, whether a forward one, its kernel): lines of
    /// other launches say where they ran.
    #[serde(skip)]
    pub home: (usize, bool, String),
}

/// One line of a [`Slice`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SliceLine {
    /// Location of the line's main op (file:line:col).
    pub loc: String,
    /// The kernel.
    pub kernel: String,
    /// Step of the pass that launched it (of the forward, where `forward` says so).
    pub step: usize,
    /// The launch is one of the forward's (which left a value the backward read).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub forward: bool,
    /// The program instance.
    pub program: [u32; 3],
    /// The line's main op (the one nearest the store along the data flow).
    pub op: String,
    /// How the line's value reaches the element: `value`, `index`, `mask` or `address`.
    pub role: String,
    /// The main op's value at the lane that led to the element.
    pub value: Option<f64>,
    /// The source line, trimmed (empty when the file cannot be read).
    pub source: String,
    /// Why it is ranked where it is, or what else is known about it.
    pub note: Option<String>,
    /// Evidence across elements, 0 to 1: the Ochiai score of the line (or of a condition on
    /// it) over the slices of a sample of wrong and right elements (`check::spectrum`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// What the score counts, e.g. "feeds 32 of 32 wrong elements and 3 of 32 right ones".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl fmt::Display for Slice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(n) = &self.nonfinite {
            writeln!(f, "      first non-finite value: {n}")?;
        }
        for d in &self.decided_by {
            writeln!(f, "      decided by {d}")?;
        }
        if self.lines.is_empty() {
            return Ok(());
        }
        writeln!(f, "      data flow of the element, most likely culprit first:")?;
        let locs: Vec<String> = self.lines.iter().take(TEXT_LINES).map(|l| short_loc(&relative(&l.loc)).to_string()).collect();
        let width = locs.iter().map(String::len).max().unwrap_or(0);
        for (l, loc) in self.lines.iter().take(TEXT_LINES).zip(&locs) {
            let first = (l.step, l.forward, &l.kernel) == (self.home.0, self.home.1, &self.home.2);
            let value = l.value.map_or(String::new(), |v| format!("= {}", fmt_val(v)));
            let role = if l.role == "value" { String::new() } else { format!("[{}] ", l.role) };
            let whr = if first {
                String::new()
            } else {
                let step = if l.forward { format!("forward step {}", l.step) } else { format!("step {}", l.step) };
                format!("  (kernel `{}`, {step}, program ({}, {}, {}))", l.kernel, l.program[0], l.program[1], l.program[2])
            };
            let line = format!("        {loc:<width$}  {:<10} {value:<12} | {role}{}", l.op, l.source);
            let line = line + &l.note.as_ref().map_or(String::new(), |n| format!("  <- {n}"));
            // Where the line ran, on a line of its own where it would make the line too long.
            match line.chars().count() + whr.chars().count() > LINE_WIDTH && !whr.is_empty() {
                true => writeln!(f, "{line}\n        {:<width$}  in{whr}", "")?,
                false => writeln!(f, "{line}{whr}")?,
            }
            if let (Some(s), Some(r)) = (l.score, &l.reason) {
                writeln!(f, "        {:<width$}  score {s:.2}: {r}", "")?;
            }
        }
        let more = self.omitted + self.lines.len().saturating_sub(TEXT_LINES);
        if more > 0 {
            // Lines of the first line's file by number, others by file and number.
            let file = self.lines.first().map_or("", |l| l.loc.split(':').next().unwrap_or(""));
            let next: Vec<&str> = self
                .lines
                .iter()
                .skip(TEXT_LINES)
                .map(|l| short_loc(&l.loc))
                .map(|s| s.strip_prefix(file).and_then(|r| r.strip_prefix(':')).unwrap_or(s))
                .collect();
            let next = if next.is_empty() { String::new() } else { format!(": line {}", next.join(", ")) };
            writeln!(f, "        ({more} more line{} of the slice{next})", if more == 1 { "" } else { "s" })?;
        }
        Ok(())
    }
}

/// `file:line` of a `file:line:col` location.
/// The width past which a data-flow line's "where it ran" goes on a line of its own.
const LINE_WIDTH: usize = 100;

/// `loc` relative to the current directory where it is a path below it (as a user typed it).
fn relative(loc: &str) -> std::borrow::Cow<'_, str> {
    let Ok(cwd) = std::env::current_dir() else { return loc.into() };
    let prefix = format!("{}{}", cwd.display(), std::path::MAIN_SEPARATOR);
    loc.strip_prefix(prefix.as_str()).map_or(loc.into(), Into::into)
}

fn short_loc(loc: &str) -> &str {
    match loc.rfind(':') {
        Some(i) if loc[i + 1..].chars().all(|c| c.is_ascii_digit()) => &loc[..i],
        _ => loc,
    }
}

/// What blame knows about the element to explain.
#[derive(Clone)]
pub(crate) struct Target<'a> {
    /// The pass's steps traced.
    pub trace: &'a Trace,
    /// The pass's environment after it ran.
    pub env: &'a Env,
    /// Step of the launch that wrote the element.
    pub step: usize,
    /// The written tensor (name in `env`) and the flat element.
    pub tensor: &'a str,
    pub element: usize,
    /// Linear id of the program that wrote it, and the store.
    pub program: u32,
    pub inst: Inst,
    /// Ground truth and the value checked, when known.
    pub expected: Option<f64>,
    pub got: Option<f64>,
}

/// The slice of the element `t` describes, or `None` when its program cannot be re-run.
/// With `evidence`, lines are ranked by it first. `reruns`: programs already run again (those
/// the evidence recorded), reused.
pub(crate) fn explain(t: &Target, evidence: Option<&Evidence>, mut reruns: Reruns) -> Option<Slice> {
    let mut files = Files::default();
    let mut lines = Vec::new();
    let kernel = t.trace.launches.iter().find(|l| l.step == t.step)?.kernel.name.clone();
    let home = (t.trace.pass_step(t.step), t.step < t.trace.forward_steps, kernel);
    let mut out = Slice { lines: Vec::new(), omitted: 0, nonfinite: None, decided_by: Vec::new(), home };
    reruns.budget = usize::MAX;
    // The worst element alone may look masked wrongly (a true value of zero at a boundary);
    // masks come first only where the tensor's wrong elements mostly look so too.
    let masks_suspect = evidence.and_then(|e| e.masked).unwrap_or(true);
    walk_launch(t, 0, masks_suspect, &mut reruns, &mut files, &mut lines, &mut out)?;
    for r in &mut lines {
        if let Some((score, reason)) = evidence.and_then(|e| e.judge(&r.key)) {
            (r.line.score, r.line.reason) = (Some(score), Some(reason));
        }
    }
    odd_counts(&mut lines);
    if let Some(e) = evidence {
        if let Some(f) = e.factor {
            scaling_first(&mut lines, f, !e.term);
        }
    }
    super::kernel_facts::rank_as_named(&mut lines, evidence.and_then(|e| e.factor));
    // Rank: evidence, then class, then earlier launches after the blamed one, then distance
    // from the store.
    let key = |a: &Ranked| (a.class, a.launch, a.depth, a.order);
    lines.sort_by(|a, b| b.line.score.unwrap_or(-1.0).total_cmp(&a.line.score.unwrap_or(-1.0)).then(key(a).cmp(&key(b))));
    let mut shown: Vec<usize> = (0..lines.len().min(SHOWN)).collect();
    if let Some(st) = lines.iter().position(|l| l.store).filter(|st| !shown.contains(st)) {
        shown.pop();
        shown.push(st);
    }
    // Every launch followed keeps its best lines.
    for launch in 1..=MAX_DEPTH {
        let theirs: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].launch == launch).take(PER_LAUNCH).collect();
        for i in theirs {
            if !shown.contains(&i) {
                if shown.len() >= SHOWN {
                    if let Some(pos) = shown.iter().rposition(|&j| lines[j].launch == 0 && !lines[j].store) {
                        shown.remove(pos);
                    }
                }
                shown.push(i);
            }
        }
    }
    shown.sort_unstable();
    out.omitted = lines.len() - shown.len();
    out.lines = shown.into_iter().map(|i| lines[i].line.clone()).collect();
    Some(out)
}

/// Where every wrong element is `factor` times its expected value, a factor is missing or
/// wrong on a line that scales the whole result: the store, the lines computing one float for
/// the whole program (a scale, a loaded scalar) and those multiplying or dividing by one (or by
/// a constant) come first among lines of equal evidence. Where the right elements of the same
/// programs are not off by it (`whole` false), the factor scales a term that dominates the wrong
/// elements only: the lines scaling a term of the stored value come first, not the store and the
/// floats it is proportional to.
fn scaling_first(lines: &mut [Ranked], factor: f64, whole: bool) {
    let f = fmt_factor(factor);
    for r in lines.iter_mut().filter(|r| r.launch == 0) {
        let note = match whole {
            true if r.store || r.scales => format!("every wrong element is {f} times its expected value"),
            false if r.term => {
                format!("every wrong element is {f} times its expected value, but the right ones of their programs are not: a factor on a term?")
            }
            _ => continue,
        };
        r.class = r.class.min(1);
        if r.line.note.is_none() {
            r.line.note = Some(note);
        }
    }
}

/// A ratio to four decimals, without trailing zeros (`8`, `0.6667`).
pub(super) fn fmt_factor(x: f64) -> String {
    let s = format!("{x:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// A line with its ranking keys.
pub(super) struct Ranked {
    pub(super) line: SliceLine,
    pub(super) key: LineKey,
    pub(super) class: u8,
    pub(super) launch: usize,
    pub(super) depth: u32,
    pub(super) order: usize,
    /// The line of the blamed store: always shown.
    pub(super) store: bool,
    /// The line computes one float for the whole program, or multiplies or divides by one.
    pub(super) scales: bool,
    /// The line scales a term of the stored value, not all of it: it multiplies or divides by
    /// one float, or computes one, where the stored value is not proportional to the result.
    pub(super) term: bool,
    /// The line divides by one whole number for the whole program (a mean's count), this one.
    pub(super) count: Option<f64>,
    /// A line with no op of its own (a branch folded away), ranked as the line it names where
    /// its branch would scale what that line reads by this factor, the inverse of the one the
    /// wrong elements share; otherwise not listed.
    pub(super) like: Option<(LineKey, f64)>,
}

/// Where the lines of a slice that divide by a count (a mean's) mostly divide by one, the
/// others come first among lines of equal evidence: a mean over the wrong count (a block's size
/// for a row's, `N - 1` for `N`) leaves every element wrong, and nothing but the count tells its
/// line from the other means'.
fn odd_counts(lines: &mut [Ranked]) {
    let counts: Vec<f64> = lines.iter().filter_map(|r| r.count).collect();
    let times = |c: f64| counts.iter().filter(|&&x| x == c).count();
    let Some(common) = counts.iter().copied().max_by_key(|&c| times(c)) else { return };
    if times(common) < 2 || times(common) * 2 <= counts.len() {
        return;
    }
    for r in lines.iter_mut().filter(|r| r.count.is_some_and(|c| c != common)) {
        r.class = r.class.min(1);
        let c = r.count.map_or(String::new(), fmt_val);
        r.line.note = Some(format!("divides by {c} where the other means of the slice divide by {}: a wrong count?", fmt_val(common)));
    }
}

/// Source files, read once.
#[derive(Default)]
pub(super) struct Files(HashMap<String, Option<Vec<String>>>);

impl Files {
    /// The lines of `file`, where it can be read.
    pub(super) fn text(&mut self, file: &str) -> Option<&[String]> {
        self.0
            .entry(file.to_string())
            .or_insert_with(|| std::fs::read_to_string(file).ok().map(|s| s.lines().map(String::from).collect()))
            .as_deref()
    }

    pub(super) fn line(&mut self, file: &str, line: u32) -> String {
        let Some(l) = self.text(file).and_then(|t| t.get((line as usize).wrapping_sub(1))) else { return String::new() };
        let l = l.trim();
        if l.chars().count() > 100 {
            format!("{}...", l.chars().take(97).collect::<String>())
        } else {
            l.to_string()
        }
    }
}

/// A launch's memory as it was, its arguments re-bound to it, and the pass's tensor of each.
type Before = (Memory, Vec<(String, Arg)>, Vec<TensorId>);

/// The memory of launch `tl` as it was before it ran, as a fresh [`Memory`]; its arguments
/// re-bound to it; and the pass's tensor of each of its tensors (`None` when a snapshot cannot
/// be allocated again).
fn memory_before(trace: &Trace, env: &Env, tl: &TracedLaunch) -> Option<Before> {
    let mut mem = Memory::new();
    let mut back: Vec<TensorId> = Vec::new();
    let mut args = Vec::new();
    for (n, a) in &tl.args {
        let a = match a {
            Arg::Tensor(t) => Arg::Tensor(match back.iter().position(|b| b == t) {
                Some(p) => TensorId(p as u32),
                None => {
                    // As it was then: its snapshot before this launch or the first later one that
                    // wrote it, else as it is now.
                    let then = trace
                        .launches
                        .iter()
                        .filter(|l| l.step >= tl.step)
                        .find_map(|l| l.before.iter().find(|(b, _)| b == t).map(|(_, h)| h.tensor()))
                        .unwrap_or_else(|| Some(env.mem.get(*t).clone()))?;
                    back.push(*t);
                    mem.add(env.mem.name(*t), then)
                }
            }),
            s => *s,
        };
        args.push((n.clone(), a));
    }
    Some((mem, args, back))
}

/// How a value reaches the element (weakest last).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Role {
    Value,
    Mask,
    Address,
}

/// Where a value is defined.
#[derive(Clone, Copy)]
enum Def {
    Param,
    Inst(Inst, usize),
    BlockParam(Block, usize),
}

/// The kernel's def-use structure.
struct Graph<'k> {
    k: &'k Kernel,
    def: Vec<Def>,
    owner: Vec<Option<Inst>>,
    /// Per instruction: the loop or branch whose block holds it (none at the top level).
    parent: Vec<Option<Inst>>,
    order: Vec<usize>,
}

impl<'k> Graph<'k> {
    fn new(k: &'k Kernel) -> Graph<'k> {
        let mut def = vec![Def::Param; k.values.len()];
        let mut owner = vec![None; k.blocks.len()];
        let mut order = vec![0; k.insts.len()];
        let mut parent = vec![None; k.insts.len()];
        let mut n = 0;
        k.walk(&mut |i, d| {
            order[i.index()] = n;
            n += 1;
            for (j, &r) in d.results.iter().enumerate() {
                def[r.index()] = Def::Inst(i, j);
            }
            for b in d.op.blocks() {
                owner[b.index()] = Some(i);
                for &j in &k.block(b).insts {
                    parent[j.index()] = Some(i);
                }
                for (j, &p) in k.block(b).params.iter().enumerate() {
                    def[p.index()] = Def::BlockParam(b, j);
                }
            }
        });
        Graph { k, def, owner, parent, order }
    }

    /// The operands of a block's final `yield`.
    fn yielded(&self, b: Block) -> &[Value] {
        match self.k.block(b).insts.last().map(|&l| self.k.inst(l)) {
            Some(d) if matches!(d.op, Op::Yield) => &d.args,
            _ => &[],
        }
    }

    fn shape(&self, v: Value) -> Vec<usize> {
        self.k.ty(v).shape.to_vec()
    }
}

fn unravel(mut l: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = l % shape[d].max(1);
        l /= shape[d].max(1);
    }
    idx
}

fn ravel(idx: &[usize], shape: &[usize]) -> u32 {
    idx.iter().zip(shape).fold(0usize, |acc, (&i, &n)| acc * n + i) as u32
}

/// Lanes of an operand of shape `arg` read by lanes `lanes` of an elementwise result of shape
/// `res` (a scalar operand: lane 0; a broadcast operand: its 1-sized dimensions at 0).
fn same(lanes: &[u32], arg: &[usize], res: &[usize]) -> Vec<u32> {
    if arg.iter().product::<usize>() == 1 {
        return vec![0];
    }
    if arg == res || arg.len() != res.len() {
        return lanes.to_vec();
    }
    lanes
        .iter()
        .map(|&l| {
            let mut idx = unravel(l as usize, res);
            for (d, i) in idx.iter_mut().enumerate() {
                if arg[d] == 1 {
                    *i = 0;
                }
            }
            ravel(&idx, arg)
        })
        .collect()
}

/// The walk over one program's record.
struct Walk<'g, 'k> {
    g: &'g Graph<'k>,
    rec: &'g ProgramRecord,
    lanes: Vec<Option<Vec<u32>>>,
    role: Vec<Role>,
    depth: Vec<u32>,
    queue: Vec<Value>,
    /// Lanes followed per value, at most.
    max_lanes: usize,
}

impl<'g, 'k> Walk<'g, 'k> {
    /// Walks the slice of what `store` wrote at `lane`: from its value, address and mask.
    fn from_store(g: &'g Graph<'k>, rec: &'g ProgramRecord, store: Inst, lane: u32, max_lanes: usize) -> Walk<'g, 'k> {
        let n = g.k.values.len();
        let mut w = Walk { g, rec, lanes: vec![None; n], role: vec![Role::Value; n], depth: vec![0; n], queue: Vec::new(), max_lanes };
        let sd = g.k.inst(store);
        let pshape = g.shape(sd.args[0]);
        w.reach(sd.args[1], same(&[lane], &g.shape(sd.args[1]), &pshape), Role::Value, 1);
        w.reach(sd.args[0], vec![lane], Role::Address, 1);
        if let Some(&m) = sd.args.get(2) {
            w.reach(m, same(&[lane], &g.shape(m), &pshape), Role::Mask, 1);
        }
        w.control(store);
        w.run();
        w
    }

    /// Reaches what decided that `inst` ran at all: the conditions of the `if`s around it (an
    /// early return guards the rest of a kernel so) and the bounds of the loops around it.
    fn control(&mut self, inst: Inst) {
        let g = self.g;
        let mut at = g.parent[inst.index()];
        while let Some(o) = at {
            let d = g.k.inst(o);
            match d.op {
                Op::If { .. } => self.reach(d.args[0], vec![0], Role::Mask, 1),
                Op::For { .. } => d.args[..3].iter().for_each(|&x| self.reach(x, vec![0], Role::Mask, 1)),
                Op::While { cond, .. } => g.yielded(cond).iter().take(1).for_each(|&c| self.reach(c, vec![0], Role::Mask, 1)),
                _ => {}
            }
            at = g.parent[o.index()];
        }
    }
}

impl Walk<'_, '_> {
    fn reach(&mut self, v: Value, mut lanes: Vec<u32>, role: Role, depth: u32) {
        lanes.sort_unstable();
        lanes.dedup();
        lanes.truncate(self.max_lanes);
        let i = v.index();
        let grew = match &mut self.lanes[i] {
            None => {
                self.lanes[i] = Some(lanes);
                self.role[i] = role;
                self.depth[i] = depth;
                true
            }
            Some(old) => {
                let n = old.len();
                old.extend(lanes);
                old.sort_unstable();
                old.dedup();
                old.truncate(self.max_lanes);
                let stronger = role < self.role[i];
                self.role[i] = self.role[i].min(role);
                self.depth[i] = self.depth[i].min(depth);
                old.len() > n || stronger
            }
        };
        if grew {
            self.queue.push(v);
        }
    }

    fn cond_at(&self, c: Value, lane: u32) -> Option<bool> {
        self.rec.values.get(c.index())?.as_ref().map(|r| r.at(lane as usize) != 0.0)
    }

    fn run(&mut self) {
        let mut budget = 200_000usize;
        while let Some(v) = self.queue.pop() {
            budget = budget.saturating_sub(1);
            if budget == 0 {
                break;
            }
            let lanes = self.lanes[v.index()].clone().unwrap_or_default();
            let (role, depth) = (self.role[v.index()], self.depth[v.index()] + 1);
            let g = self.g;
            let k = g.k;
            match g.def[v.index()] {
                Def::Param => {}
                Def::BlockParam(b, j) => {
                    let Some(o) = g.owner[b.index()] else { continue };
                    let d = k.inst(o);
                    match d.op {
                        Op::For { .. } if j == 0 => {
                            for &a in &d.args[..3] {
                                self.reach(a, vec![0], role, depth);
                            }
                        }
                        Op::For { .. } => {
                            self.reach(d.args[3 + j - 1], lanes.clone(), role, depth);
                            if let Some(&y) = g.yielded(b).get(j - 1) {
                                self.reach(y, lanes.clone(), role, depth);
                            }
                        }
                        // A `while` loop's condition and body both take the carried values:
                        // from the loop's operands, then from the body's last trip.
                        Op::While { body, .. } => {
                            self.reach(d.args[j], lanes.clone(), role, depth);
                            if let Some(&y) = g.yielded(body).get(j) {
                                self.reach(y, lanes.clone(), role, depth);
                            }
                        }
                        _ => {}
                    }
                }
                Def::Inst(i, r) => self.step(i, r, v, &lanes, role, depth),
            }
        }
    }

    fn step(&mut self, i: Inst, r: usize, v: Value, lanes: &[u32], role: Role, depth: u32) {
        let g = self.g;
        let d = g.k.inst(i);
        let a = &d.args;
        let res = g.shape(v);
        let sub = |edge: Role| role.max(edge);
        match &d.op {
            Op::ProgramId { .. } | Op::NumPrograms { .. } | Op::Const { .. } | Op::Arange { .. } => {}
            Op::Broadcast | Op::Unary(_) | Op::Binary(_) | Op::Cmp(_) | Op::Cast => {
                for &x in a {
                    let l = same(lanes, &g.shape(x), &res);
                    self.reach(x, l, role, depth);
                }
            }
            Op::ExpandDims { .. } | Op::Reshape => self.reach(a[0], lanes.to_vec(), role, depth),
            Op::Permute { perm } => {
                let src = g.shape(a[0]);
                let l = lanes
                    .iter()
                    .map(|&l| {
                        let ri = unravel(l as usize, &res);
                        let mut ai = vec![0; src.len()];
                        for (dd, &p) in perm.iter().enumerate() {
                            if let (Some(x), Some(&y)) = (ai.get_mut(p as usize), ri.get(dd)) {
                                *x = y;
                            }
                        }
                        ravel(&ai, &src)
                    })
                    .collect();
                self.reach(a[0], l, role, depth);
            }
            Op::Where => {
                let c = a[0];
                self.reach(c, same(lanes, &g.shape(c), &res), sub(Role::Mask), depth);
                let (mut t, mut f) = (Vec::new(), Vec::new());
                for &l in lanes {
                    let cl = same(&[l], &g.shape(c), &res)[0];
                    match self.cond_at(c, cl) {
                        Some(true) => t.push(l),
                        Some(false) => f.push(l),
                        None => {
                            t.push(l);
                            f.push(l);
                        }
                    }
                }
                if !t.is_empty() {
                    self.reach(a[1], same(&t, &g.shape(a[1]), &res), role, depth);
                }
                if !f.is_empty() {
                    self.reach(a[2], same(&f, &g.shape(a[2]), &res), role, depth);
                }
            }
            Op::Reduce { axis, keep_dims, .. } => {
                let src = g.shape(a[0]);
                let ax = *axis as usize;
                let n = src.get(ax).copied().unwrap_or(1);
                let mut l = Vec::new();
                for &x in lanes {
                    let mut idx = unravel(x as usize, &res);
                    if *keep_dims {
                        idx[ax] = 0;
                    } else {
                        idx.insert(ax.min(idx.len()), 0);
                    }
                    for kk in 0..n {
                        idx[ax] = kk;
                        l.push(ravel(&idx, &src));
                    }
                }
                self.reach(a[0], l, role, depth);
            }
            Op::Cumsum { axis, reverse } => {
                let ax = *axis as usize;
                let n = res[ax];
                let mut l = Vec::new();
                for &x in lanes {
                    let mut idx = unravel(x as usize, &res);
                    let at = idx[ax];
                    let range = if *reverse { at..n } else { 0..at + 1 };
                    for kk in range {
                        idx[ax] = kk;
                        l.push(ravel(&idx, &res));
                    }
                }
                self.reach(a[0], l, role, depth);
            }
            Op::Dot { .. } => {
                let (sa, sb) = (g.shape(a[0]), g.shape(a[1]));
                let kk = sa.get(1).copied().unwrap_or(1);
                let (mut la, mut lb) = (Vec::new(), Vec::new());
                for &x in lanes {
                    let idx = unravel(x as usize, &res);
                    for j in 0..kk {
                        la.push(ravel(&[idx[0], j], &sa));
                        lb.push(ravel(&[j, idx[1]], &sb));
                    }
                }
                self.reach(a[0], la, role, depth);
                self.reach(a[1], lb, role, depth);
                self.reach(a[2], lanes.to_vec(), role, depth);
            }
            Op::AddPtr => {
                self.reach(a[0], lanes.to_vec(), sub(Role::Address), depth);
                self.reach(a[1], same(lanes, &g.shape(a[1]), &res), sub(Role::Address), depth);
            }
            Op::Load { mask, other } => {
                self.reach(a[0], lanes.to_vec(), sub(Role::Address), depth);
                if *mask {
                    self.reach(a[1], same(lanes, &g.shape(a[1]), &res), sub(Role::Mask), depth);
                    if *other {
                        let off: Vec<u32> = lanes.iter().copied().filter(|&l| self.cond_at(a[1], l) == Some(false)).collect();
                        if !off.is_empty() {
                            self.reach(a[2], same(&off, &g.shape(a[2]), &res), role, depth);
                        }
                    }
                }
            }
            Op::For { body, .. } => {
                if let Some(&y) = g.yielded(*body).get(r) {
                    self.reach(y, lanes.to_vec(), role, depth);
                }
                self.reach(a[3 + r], lanes.to_vec(), role, depth);
                // The bounds decide how many trips made the value, as a condition decides a branch.
                for &x in &a[..3] {
                    self.reach(x, vec![0], sub(Role::Mask), depth);
                }
            }
            Op::If { then_block, else_block } => {
                self.reach(a[0], vec![0], sub(Role::Mask), depth);
                let blocks = match self.cond_at(a[0], 0) {
                    Some(true) => vec![*then_block],
                    Some(false) => vec![*else_block],
                    None => vec![*then_block, *else_block],
                };
                for b in blocks {
                    if let Some(&y) = g.yielded(b).get(r) {
                        self.reach(y, lanes.to_vec(), role, depth);
                    }
                }
            }
            Op::While { cond, body, .. } => {
                if let Some(&y) = g.yielded(*body).get(r) {
                    self.reach(y, lanes.to_vec(), role, depth);
                }
                if let Some(&init) = a.get(r) {
                    self.reach(init, lanes.to_vec(), role, depth);
                }
                // The condition decides how many trips made the value.
                if let Some(&c) = g.yielded(*cond).first() {
                    self.reach(c, vec![0], sub(Role::Mask), depth);
                }
            }
            // The old values of atomics come from memory as the programs before left it: the
            // slice follows their address, as for a load.
            Op::AtomicRmw { .. } | Op::AtomicCas => self.reach(a[0], lanes.to_vec(), sub(Role::Address), depth),
            Op::Store { .. } | Op::AtomicAdd { .. } | Op::Yield => {}
        }
    }
}

/// Instructions whose values some store other than `store` (to another tensor) uses.
fn used_elsewhere(g: &Graph, store: Inst) -> Vec<bool> {
    let k = g.k;
    let src = tilegrad_ir::analysis::pointer_sources(k);
    let mine = &src[k.inst(store).args[0].index()];
    let mut seen = vec![false; k.values.len()];
    let mut stack: Vec<Value> = Vec::new();
    k.walk(&mut |i, d| {
        if i != store && matches!(d.op, Op::Store { .. } | Op::AtomicAdd { .. }) && src[d.args[0].index()] != *mine {
            stack.push(d.args[1]);
        }
    });
    let mut used = vec![false; k.insts.len()];
    while let Some(v) = stack.pop() {
        if std::mem::replace(&mut seen[v.index()], true) {
            continue;
        }
        match g.def[v.index()] {
            Def::Param => {}
            Def::BlockParam(b, j) => {
                if let Some(o) = g.owner[b.index()] {
                    let d = k.inst(o);
                    if matches!(d.op, Op::For { .. }) && j > 0 {
                        stack.push(d.args[3 + j - 1]);
                        stack.extend(g.yielded(b).get(j - 1));
                    }
                }
            }
            Def::Inst(i, r) => {
                used[i.index()] = true;
                let d = k.inst(i);
                match &d.op {
                    Op::For { body, .. } => {
                        stack.extend(g.yielded(*body).get(r));
                        stack.push(d.args[3 + r]);
                    }
                    Op::If { then_block, else_block } => {
                        stack.extend(g.yielded(*then_block).get(r));
                        stack.extend(g.yielded(*else_block).get(r));
                    }
                    // Only the data: offsets and masks of loads are not what the other store uses
                    // the value for.
                    Op::Load { .. } => {}
                    _ => stack.extend(d.args.iter().copied()),
                }
            }
        }
    }
    used
}

/// The ops computing what a loop on `w`'s slice carries out, where the value each trip carries
/// on does not depend on what the trip before carried: an accumulator overwritten instead of
/// added to (`acc = x` for `acc += x`, a `dot` not given its accumulator).
fn overwritten_carries(g: &Graph, w: &Walk) -> Vec<Inst> {
    let k = g.k;
    let mut out = Vec::new();
    k.walk(&mut |_, d| {
        let Op::For { body, .. } = d.op else { return };
        for (r, &res) in d.results.iter().enumerate() {
            let Some(&y) = g.yielded(body).get(r) else { continue };
            if w.lanes[res.index()].is_none() || depends_on(g, y, body, r + 1) {
                continue;
            }
            if let Def::Inst(i, _) = g.def[y.index()] {
                out.push(i);
            }
        }
    });
    out
}

/// Per value: whether a loop takes it as the initial value of what it carries (a constant
/// there is an accumulator's start, on the loop's line, not the value of an expression).
fn loop_inits(k: &Kernel) -> Vec<bool> {
    let mut out = vec![false; k.values.len()];
    k.walk(&mut |_, d| {
        let carried = match d.op {
            Op::For { .. } => d.args.get(3..).unwrap_or(&[]),
            Op::While { .. } => &d.args[..],
            _ => &[],
        };
        for v in carried {
            out[v.index()] = true;
        }
    });
    out
}

/// Whether `v` depends on parameter `param` of block `b` (over-approximated through nested
/// loops and branches: on everything they take and yield).
fn depends_on(g: &Graph, v: Value, b: Block, param: usize) -> bool {
    let k = g.k;
    let mut seen = vec![false; k.values.len()];
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        if std::mem::replace(&mut seen[v.index()], true) {
            continue;
        }
        match g.def[v.index()] {
            Def::Param => {}
            Def::BlockParam(pb, j) if pb == b => {
                if j == param {
                    return true;
                }
            }
            Def::BlockParam(pb, _) => {
                if let Some(o) = g.owner[pb.index()] {
                    let d = k.inst(o);
                    stack.extend(d.args.iter().copied());
                    for nb in d.op.blocks() {
                        stack.extend(g.yielded(nb).iter().copied());
                    }
                }
            }
            Def::Inst(i, _) => {
                let d = k.inst(i);
                stack.extend(d.args.iter().copied());
                for nb in d.op.blocks() {
                    stack.extend(g.yielded(nb).iter().copied());
                }
            }
        }
    }
    false
}

/// Whether `v` is one float for the whole program: a scalar, or one broadcast to a tile.
fn one_float(g: &Graph, v: Value) -> bool {
    let k = g.k;
    if !k.ty(v).dtype().is_some_and(|t| t.is_float()) {
        return false;
    }
    if k.ty(v).shape.iter().product::<usize>() == 1 {
        return true;
    }
    match g.def[v.index()] {
        Def::Inst(i, _) => {
            let d = k.inst(i);
            match d.op {
                Op::Const { .. } => true,
                Op::Broadcast | Op::ExpandDims { .. } | Op::Reshape | Op::Cast => one_float(g, d.args[0]),
                _ => false,
            }
        }
        _ => false,
    }
}

/// Per value: whether what `store` stores is proportional to it (a factor on it is a factor on
/// the stored value): the stored value, and through products, quotients, negations, casts and
/// reshapes, their operands.
fn proportional(g: &Graph, store: Inst) -> Vec<bool> {
    use tilegrad_ir::{BinaryOp, UnaryOp};
    let k = g.k;
    let mut out = vec![false; k.values.len()];
    let mut stack: Vec<Value> = k.inst(store).args.get(1).copied().into_iter().collect();
    while let Some(v) = stack.pop() {
        if std::mem::replace(&mut out[v.index()], true) {
            continue;
        }
        let Def::Inst(i, _) = g.def[v.index()] else { continue };
        let d = k.inst(i);
        match d.op {
            Op::Binary(BinaryOp::Mul | BinaryOp::Div) => stack.extend(d.args.iter().copied()),
            Op::Unary(UnaryOp::Neg) | Op::Cast | Op::Broadcast | Op::ExpandDims { .. } | Op::Reshape | Op::Permute { .. } => {
                stack.push(d.args[0])
            }
            _ => {}
        }
    }
    out
}

/// Whether `d` multiplies or divides by one float for the whole program (a constant, a scale).
fn scales_by_one(g: &Graph, d: &tilegrad_ir::InstData) -> bool {
    use tilegrad_ir::BinaryOp;
    matches!(d.op, Op::Binary(BinaryOp::Mul | BinaryOp::Div)) && d.args.iter().any(|&x| one_float(g, x))
}

/// The whole number of at least 2 that `d` divides by, where it divides by one float for the
/// whole program (a mean's count), as `rec` recorded it.
fn divisor_count(g: &Graph, rec: &ProgramRecord, d: &tilegrad_ir::InstData) -> Option<f64> {
    use tilegrad_ir::BinaryOp;
    if !matches!(d.op, Op::Binary(BinaryOp::Div)) || !one_float(g, d.args[1]) {
        return None;
    }
    let v = rec.values.get(d.args[1].index())?.as_ref().filter(|v| matches!(v, Recorded::Num { .. }))?.at(0);
    (v >= 2.0 && v == v.trunc()).then_some(v)
}

/// Whether an op computes floats (rather than moving them, or computing indices).
fn computes(g: &Graph, d: &tilegrad_ir::InstData) -> bool {
    let k = g.k;
    let float = d.results.first().is_some_and(|&r| k.ty(r).dtype().is_some_and(|t| t.is_float()));
    match d.op {
        // A cast of what a load read (`tl.load(...).to(tl.float32)`) moves it, as the load does.
        Op::Cast => float && !matches!(g.def[d.args[0].index()], Def::Inst(i, _) if matches!(k.inst(i).op, Op::Load { .. })),
        Op::Unary(_) | Op::Binary(_) | Op::Reduce { .. } | Op::Cumsum { .. } | Op::Dot { .. } | Op::Where => float,
        _ => false,
    }
}

/// A value as reports show it: integers plainly, others with five significant digits.
pub(crate) fn fmt_val(x: f64) -> String {
    if x == x.trunc() && x.abs() < 1e9 {
        format!("{x}")
    } else if (1e-3..1e5).contains(&x.abs()) {
        let digits = (4 - x.abs().log10().floor() as i32).max(0) as usize;
        format!("{x:.digits$}")
    } else {
        format!("{x:.4e}")
    }
}

/// Re-runs the program of `t`, walks its slice and appends its lines (and those of the earlier
/// launches it reads from) to `lines`; `launch` counts launches followed.
/// `masks_suspect`: whether masks may come first where the element looks masked wrongly.
fn walk_launch(
    t: &Target,
    launch: usize,
    masks_suspect: bool,
    reruns: &mut Reruns,
    files: &mut Files,
    lines: &mut Vec<Ranked>,
    out: &mut Slice,
) -> Option<()> {
    let tl = t.trace.launches.iter().find(|l| l.step == t.step)?;
    let k: &Kernel = &tl.kernel;
    let (rec, lane) = reruns.record(t, tl)?;
    let (mem, _, back) = reruns.before.get(&t.step)?;
    let pid = tl.grid.pid(t.program as u64);
    let g = Graph::new(k);
    let w = Walk::from_store(&g, &rec, t.inst, lane, MAX_LANES);
    let sd = k.inst(t.inst);
    let vshape = g.shape(sd.args[1]);
    let pshape = g.shape(sd.args[0]);

    let masky = matches!((t.expected, t.got), (Some(e), Some(gv)) if (e == 0.0) != (gv == 0.0));
    let nonfinite_elem = t.got.is_some_and(|x| !x.is_finite());
    let shared = used_elsewhere(&g, t.inst);
    let mut others = false;
    k.walk(&mut |i, d| others |= i != t.inst && matches!(d.op, Op::Store { .. } | Op::AtomicAdd { .. }));

    // The first non-finite value on the slice, in program order.
    let mut origin: Option<Inst> = None;
    if nonfinite_elem && out.nonfinite.is_none() {
        let on = |nf: &&tilegrad_reference::NonFinite| {
            k.inst(nf.inst)
                .results
                .first()
                .is_some_and(|r| w.lanes[r.index()].as_ref().is_some_and(|ls| nf.lanes.iter().any(|x| ls.binary_search(x).is_ok())))
        };
        let loads = |nf: &&tilegrad_reference::NonFinite| matches!(k.inst(nf.inst).op, Op::Load { .. });
        let pick = rec
            .nonfinite
            .iter()
            .filter(|nf| on(nf) && !loads(nf))
            .min_by_key(|nf| nf.seq)
            .or_else(|| rec.nonfinite.iter().filter(|nf| on(nf)).min_by_key(|nf| nf.seq));
        if let Some(nf) = pick {
            let d = k.inst(nf.inst);
            let src = files.line(&d.loc.file, d.loc.line);
            let what = if nf.result.is_nan() { "NaN" } else { "inf" };
            let msg = match d.op {
                Op::Load { mask, .. } => {
                    let lane0 = nf.lanes[0] as usize;
                    let masked_off = mask && rec.values[d.args[1].index()].as_ref().is_some_and(|m| m.at(lane0) == 0.0);
                    let whence = if masked_off {
                        let ml = def_line(&g, d.args[1]).map_or(String::new(), |l| format!(", mask computed at line {l}"));
                        format!("a masked-off lane without `other`, which Triton leaves undefined{ml}")
                    } else {
                        match rec.values[d.args[0].index()].as_ref() {
                            Some(Recorded::Ptr { tensor, offsets, .. }) => {
                                format!("element {} of `{}`", offsets.get(lane0).copied().unwrap_or(-1), mem.name(*tensor))
                            }
                            _ => "memory".into(),
                        }
                    };
                    format!("`load` at {} (kernel `{}`) read {what} from {whence}: `{src}`", d.loc, k.name)
                }
                _ => {
                    let ops: Vec<String> = nf.operands.iter().map(|&x| fmt_val(x)).collect();
                    format!(
                        "`{}` at {} (kernel `{}`) made {what} from finite operands: {}({}) = {}: `{src}`",
                        d.op.mnemonic(),
                        d.loc,
                        k.name,
                        d.op.mnemonic(),
                        ops.join(", "),
                        fmt_val(nf.result)
                    )
                }
            };
            out.nonfinite = Some(msg);
            origin = Some(nf.inst);
        }
    }

    // What masks and conditions decided.
    if launch == 0 && (masky || origin.is_some_and(|o| matches!(k.inst(o).op, Op::Load { .. }))) {
        if let Some(&m) = sd.args.get(2) {
            let ml = def_line(&g, m).map_or(String::new(), |l| format!(" computed at line {l}"));
            out.decided_by.push(format!("the store's mask{ml}, true for this element: `{}`", def_src(&g, m, files)));
        }
        let mut wheres: Vec<Inst> = Vec::new();
        k.walk(&mut |i, d| {
            if matches!(d.op, Op::Where) && w.lanes[d.results[0].index()].is_some() && w.role[d.results[0].index()] == Role::Value {
                wheres.push(i);
            }
        });
        for i in wheres.into_iter().take(3) {
            let d = k.inst(i);
            let r = d.results[0];
            let l0 = w.lanes[r.index()].as_ref().and_then(|v| v.first().copied()).unwrap_or(0);
            let cl = same(&[l0], &g.shape(d.args[0]), &g.shape(r))[0];
            let taken = match w.cond_at(d.args[0], cl) {
                Some(true) => "its first operand (condition true)",
                Some(false) => "its second operand (condition false)",
                None => "an operand",
            };
            let cline = def_line(&g, d.args[0]).map_or(String::new(), |l| format!(", condition from line {l}"));
            out.decided_by.push(format!("`where` at {} selecting {taken}{cline}: `{}`", d.loc, files.line(&d.loc.file, d.loc.line)));
        }
    }

    // Group by line.
    struct Acc {
        loc: tilegrad_ir::Loc,
        role: Role,
        depth: u32,
        main: Option<(u32, Inst)>,
        compute: bool,
        compute_shared: bool,
        float: bool,
        origin: bool,
        /// A loop carries the value out but each trip overwrites it.
        overwrite: bool,
        /// An op on the line multiplies or divides by one float for the whole program.
        scales: bool,
        /// ... and the stored value is not proportional to its result.
        term: bool,
        /// The count an op on the line divides by, where it divides by one whole number.
        count: Option<f64>,
        /// A `where` on the line selects both ways among the lanes used: a mask that shaped
        /// the value (a reduction over a masked row).
        mixed: bool,
        /// Every op of the line on the slice is the float constant 0 or ±1, the identity of a sum
        /// or a product: what an expression whose term was dropped leaves (a named constant of
        /// the formula, such as sqrt(2 / pi), is not suspect).
        constant: bool,
        order: usize,
    }
    let mut by_line: Vec<Acc> = Vec::new();
    let overwritten = overwritten_carries(&g, &w);
    let inits = loop_inits(k);
    let whole = proportional(&g, t.inst);
    let add = |i: Inst, role: Role, depth: u32, by_line: &mut Vec<Acc>| {
        let d = k.inst(i);
        if !listed(k, d) {
            return;
        }
        let comp = role == Role::Value && computes(&g, d);
        let float = d.results.first().is_none_or(|&r| k.ty(r).dtype().is_some_and(|t| t.is_float()));
        let pos = by_line.iter().position(|a| a.loc.file == d.loc.file && a.loc.line == d.loc.line);
        let a = match pos {
            Some(p) => &mut by_line[p],
            None => {
                by_line.push(Acc {
                    loc: d.loc.clone(),
                    role,
                    depth,
                    main: None,
                    compute: false,
                    compute_shared: true,
                    float: false,
                    origin: false,
                    overwrite: false,
                    scales: false,
                    term: false,
                    count: None,
                    mixed: false,
                    constant: true,
                    order: g.order[i.index()],
                });
                by_line.last_mut().expect("pushed")
            }
        };
        a.role = a.role.min(role);
        a.depth = a.depth.min(depth);
        if a.main.is_none_or(|(dd, _)| depth < dd) {
            a.main = Some((depth, i));
            a.loc = d.loc.clone();
        }
        if comp {
            a.compute = true;
            a.compute_shared &= shared[i.index()];
        }
        a.float |= role == Role::Value && float;
        a.origin |= origin == Some(i);
        a.overwrite |= overwritten.contains(&i);
        let scaling = role == Role::Value && scales_by_one(&g, d);
        a.scales |= scaling;
        a.term |= scaling && d.results.first().is_some_and(|r| !whole[r.index()]);
        if role == Role::Value {
            a.count = a.count.or_else(|| divisor_count(&g, &rec, d));
        }
        if let (Op::Where, Role::Value, Some(ls)) = (&d.op, role, d.results.first().and_then(|r| w.lanes[r.index()].as_ref())) {
            let (rs, cs) = (g.shape(d.results[0]), g.shape(d.args[0]));
            let vals: Vec<Option<bool>> = ls.iter().take(4096).map(|&l| w.cond_at(d.args[0], same(&[l], &cs, &rs)[0])).collect();
            a.mixed |= vals.contains(&Some(true)) && vals.contains(&Some(false));
        }
        a.constant &=
            matches!(d.op, Op::Const { value: tilegrad_ir::Lit::Float(v) } if v == 0.0 || v.abs() == 1.0) && !inits[d.results[0].index()];
    };
    add(t.inst, Role::Value, 0, &mut by_line);
    let mut reached: Vec<(Inst, Role, u32)> = Vec::new();
    k.walk(&mut |i, d| {
        if let Some(&r) = d.results.iter().find(|r| w.lanes[r.index()].is_some()) {
            reached.push((i, w.role[r.index()], w.depth[r.index()]));
        }
    });
    for (i, role, depth) in reached {
        add(i, role, depth, &mut by_line);
    }

    // Loads of tensors an earlier launch wrote: which launch and line produced what was read.
    let mut notes: HashMap<Inst, String> = HashMap::new();
    let mut sub_targets = Vec::new();
    for u in upstream(t, &w, back) {
        let shape = t.env.tensor(&u.tensor).map(|h| h.shape().to_vec()).unwrap_or_default();
        let idx = super::report::unravel(u.element, &shape);
        let (name, s) = (&u.tensor, u.step);
        let sl = u.kernel.inst(u.inst).loc.clone();
        if u.program == Writers::MANY {
            notes.insert(u.load, format!("reads `{name}`{idx:?}, added to by several programs at {sl} ({})", t.trace.step_name(s)));
            continue;
        }
        let p = u.grid.pid(u.program as u64);
        let at = short_loc(&sl.to_string()).to_string();
        notes.insert(
            u.load,
            format!(
                "reads `{name}`{idx:?}, written at {at} by kernel `{}` ({}), program ({}, {}, {})",
                u.kernel.name,
                t.trace.step_name(s),
                p[0],
                p[1],
                p[2]
            ),
        );
        if launch < MAX_DEPTH && sub_targets.len() < 2 {
            sub_targets.push((s, u.tensor, u.element, u.program, u.inst));
        }
    }

    let pidv = pid;
    let start = lines.len();
    let padded = super::padding::padding_into_sums(k, &rec, |r| w.lanes[r.index()].is_some());
    let mut apart = super::recompute::disagreements(k, &rec, &tl.args);
    apart.extend(super::kernel_facts::untransformed(t, tl));
    for a in by_line {
        let Some((_, main)) = a.main else { continue };
        let d = k.inst(main);
        let constant = a.constant && a.role == Role::Value;
        let pad = padded.iter().find(|p| k.inst(p.op).loc.line == a.loc.line && k.inst(p.op).loc.file == a.loc.file);
        let dis = apart.iter().find(|x| k.inst(x.op).loc.line == a.loc.line && k.inst(x.op).loc.file == a.loc.file);
        let class = if a.origin || a.overwrite || pad.is_some() || dis.is_some() {
            0
        } else if a.role == Role::Mask && masky && masks_suspect || constant {
            1
        } else if a.role == Role::Value && a.compute {
            if a.compute_shared && !a.mixed {
                3
            } else {
                2
            }
        } else if a.role == Role::Value && a.float {
            4
        } else if a.role == Role::Mask {
            5
        } else if a.role == Role::Value {
            6
        } else {
            7
        };
        let role = match a.role {
            Role::Value if a.float => "value",
            Role::Value => "index",
            Role::Mask => "mask",
            Role::Address => "address",
        };
        let value = match d.op {
            Op::Store { .. } | Op::AtomicAdd { .. } => {
                rec.values[d.args[1].index()].as_ref().map(|v| v.at(same(&[lane], &vshape, &pshape)[0] as usize))
            }
            _ => d.results.first().and_then(|r| {
                let l0 = w.lanes[r.index()].as_ref()?.first().copied()?;
                rec.values[r.index()].as_ref().filter(|v| matches!(v, Recorded::Num { .. })).map(|v| v.at(l0 as usize))
            }),
        };
        let mut note = notes.get(&main).cloned();
        if note.is_none() {
            // A load on this line may carry the note.
            note = notes
                .iter()
                .find(|(i, _)| k.inst(**i).loc.line == a.loc.line && k.inst(**i).loc.file == a.loc.file)
                .map(|(_, n)| n.clone());
        }
        if let Some(p) = pad {
            let (load, sum) = (k.inst(p.load).loc.line, k.inst(p.sum).loc.line);
            let lane = unravel(p.lane, &g.shape(k.inst(p.sum).args[0]));
            note = Some(format!(
                "lane {lane:?} is masked off at the load on line {load}, yet here it is {}, not 0, and the sum on line {sum} adds it",
                fmt_val(p.value)
            ));
        } else if let Some(x) = dis {
            note = Some(x.note.clone());
        } else if a.origin && note.is_none() {
            note = Some("first non-finite value".into());
        } else if constant && note.is_none() {
            note = Some("the line's value is a constant: is a term of its expression missing?".into());
        } else if a.overwrite && note.is_none() {
            note = Some("the loop carries this value out, but each trip overwrites it: only the last trip counts".into());
        } else if class == 2 && !a.compute_shared && note.is_none() && launch == 0 && others {
            note = Some("used only on the way to this element".into());
        }
        let op = if a.origin { k.inst(origin.expect("origin")).op.mnemonic() } else { d.op.mnemonic() };
        lines.push(Ranked {
            line: SliceLine {
                loc: a.loc.to_string(),
                kernel: k.name.clone(),
                step: t.trace.pass_step(t.step),
                forward: t.step < t.trace.forward_steps,
                program: pidv,
                op: op.to_string(),
                role: role.to_string(),
                value,
                source: files.line(&a.loc.file, a.loc.line),
                note,
                score: None,
                reason: None,
            },
            key: (a.loc.file.clone(), a.loc.line),
            class,
            launch,
            depth: if a.mixed { a.depth.min(2) } else { a.depth },
            order: a.order,
            store: main == t.inst && launch == 0,
            scales: a.scales || a.role == Role::Value && a.float && d.results.first().is_some_and(|&r| one_float(&g, r)),
            term: a.term || a.role == Role::Value && a.float && d.results.first().is_some_and(|&r| one_float(&g, r) && !whole[r.index()]),
            count: a.count,
            like: None,
        });
    }

    super::kernel_facts::calls_with_helpers(k, files, &mut lines[start..]);
    let folded = super::kernel_facts::folded_branches(k, &tl.args, files, &lines[start..]);
    lines.extend(folded);
    for (s, name, e, p, inst) in sub_targets {
        let sub = Target { trace: t.trace, env: t.env, step: s, tensor: &name, element: e, program: p, inst, expected: None, got: t.got };
        walk_launch(&sub, launch + 1, masks_suspect, reruns, files, lines, out);
    }
    Some(())
}

/// A program run again: the step of its launch, its linear id, and the store whose element it
/// was run again for.
type RecordKey = (usize, u32, Inst);

/// Programs run again for the elements explained, and the memory of their launches as it was:
/// elements one program wrote are explained from one run of it.
pub(crate) struct Reruns {
    before: HashMap<usize, Before>,
    records: HashMap<RecordKey, Rc<ProgramRecord>>,
    /// Programs that may be run again, at most: what a slice recorded as evidence costs.
    budget: usize,
}

impl Reruns {
    /// Reruns of at most `budget` programs.
    pub fn with_budget(budget: usize) -> Reruns {
        Reruns { before: HashMap::new(), records: HashMap::new(), budget }
    }

    /// Allows `more` programs to be run again beyond those run so far.
    pub fn allow(&mut self, more: usize) {
        self.budget = self.records.len().saturating_add(more);
    }

    /// Runs again, in parallel, the programs that wrote the elements of `targets` (in order, up
    /// to the budget), for [`Reruns::record`] to find. Where a target's launch reads what an
    /// earlier launch wrote, only half the budget left goes to them: the rest goes, in order, to
    /// the programs of the earlier launches each element read from.
    pub fn prefetch(&mut self, targets: &[Target]) {
        use rayon::prelude::*;
        let mut todo: Vec<(RecordKey, &TracedLaunch, TensorId, usize)> = Vec::new();
        let left = self.budget.saturating_sub(self.records.len());
        let reads = targets.iter().any(|t| reads_earlier(t.trace, t.env, t.step));
        let budget = self.records.len() + if reads { left / 2 } else { left };
        for t in targets {
            let Some(tl) = t.trace.launches.iter().find(|l| l.step == t.step) else { continue };
            if let std::collections::hash_map::Entry::Vacant(v) = self.before.entry(t.step) {
                let Some(b) = memory_before(t.trace, t.env, tl) else { continue };
                v.insert(b);
            }
            let key = (t.step, t.program, t.inst);
            if self.records.contains_key(&key) || todo.iter().any(|(k, ..)| *k == key) {
                continue;
            }
            if self.records.len() + todo.len() >= budget {
                break;
            }
            let back = &self.before[&t.step].2;
            let Some(id) = t.env.id(t.tensor).and_then(|x| back.iter().position(|&b| b == x)) else { continue };
            todo.push((key, tl, TensorId(id as u32), t.element));
        }
        let before = &self.before;
        let done: Vec<_> = todo
            .par_iter()
            .map(|&(key, tl, id, e)| {
                let (mem, args, _) = &before[&key.0];
                let mut l = Launch::new(&tl.kernel, tl.grid).options(Options { record_writers: false, ..tl.options.clone() });
                for (n, a) in args {
                    l = l.arg(n, *a);
                }
                (key, l.record_program(mem, tl.grid.pid(key.1 as u64), Some((key.2, id, e))).ok())
            })
            .collect();
        for (key, rec) in done {
            if let Some(rec) = rec.filter(|r| r.target_lane.is_some()) {
                self.records.insert(key, Rc::new(rec));
            }
        }
    }

    /// The record of the program that wrote `t`'s element, and the lane of its store that did.
    fn record(&mut self, t: &Target, tl: &TracedLaunch) -> Option<(Rc<ProgramRecord>, u32)> {
        if let std::collections::hash_map::Entry::Vacant(v) = self.before.entry(t.step) {
            v.insert(memory_before(t.trace, t.env, tl)?);
        }
        let (mem, args, back) = self.before.get(&t.step)?;
        let tensor = t.env.id(t.tensor)?;
        let id = TensorId(back.iter().position(|&b| b == tensor)? as u32);
        let key = (t.step, t.program, t.inst);
        // Any run of the program whose record shows the store writing the element will do (one
        // run of a program that stores several tensors serves them all).
        let mine =
            self.records.get(&key).into_iter().chain(self.records.iter().filter(|(k, _)| k.0 == key.0 && k.1 == key.1).map(|(_, r)| r));
        for rec in mine {
            if let Some(lane) = lane_of(&tl.kernel, rec, t.inst, id, t.element) {
                return Some((rec.clone(), lane));
            }
        }
        if self.records.len() >= self.budget {
            return None;
        }
        let opts = Options { record_writers: false, ..tl.options.clone() };
        let mut l = Launch::new(&tl.kernel, tl.grid).options(opts);
        for (n, a) in args {
            l = l.arg(n, *a);
        }
        let rec = Rc::new(l.record_program(mem, tl.grid.pid(t.program as u64), Some((t.inst, id, t.element))).ok()?);
        let lane = rec.target_lane? as u32;
        self.records.insert(key, rec.clone());
        Some((rec, lane))
    }
}

/// Whether the launch of step `step` reads a tensor that an earlier launch of `trace` wrote.
fn reads_earlier(trace: &Trace, env: &Env, step: usize) -> bool {
    let Some(tl) = trace.launches.iter().find(|l| l.step == step) else { return false };
    let written_before =
        |id: TensorId| trace.tensors.iter().any(|(n, _, layers)| env.id(n) == Some(id) && layers.iter().any(|l| l.0 < step));
    tl.args.iter().any(|(_, a)| matches!(a, Arg::Tensor(id) if written_before(*id)))
}

/// The lane of `store`, as `rec` recorded it, that wrote element `e` of `tensor` (none when that
/// execution of the store did not write it).
fn lane_of(k: &Kernel, rec: &ProgramRecord, store: Inst, tensor: TensorId, e: usize) -> Option<u32> {
    let d = k.inst(store);
    let Some(Recorded::Ptr { tensor: t, offsets, shape }) = rec.values.get(d.args[0].index())?.as_ref() else { return None };
    let mask = match d.args.get(2) {
        Some(m) => Some((rec.values.get(m.index())?.as_ref()?, k.ty(*m).shape.to_vec())),
        None => None,
    };
    let on = |l: u32| mask.as_ref().is_none_or(|(m, ms)| m.at(same(&[l], ms, shape)[0] as usize) != 0.0);
    (*t == tensor).then_some(())?;
    (0..offsets.len() as u32).rev().find(|&l| offsets[l as usize] == e as i64 && on(l))
}

/// A load on an element's slice that read what an earlier launch of the pass wrote.
struct Upstream {
    load: Inst,
    tensor: String,
    element: usize,
    step: usize,
    kernel: Arc<Kernel>,
    grid: Grid,
    program: u32,
    inst: Inst,
}

/// The loads of values on `w`'s slice (nearest the store first) whose element a launch before
/// `t`'s wrote, with that writer; `back` maps the re-run's tensors to the pass's.
fn upstream(t: &Target, w: &Walk, back: &[TensorId]) -> Vec<Upstream> {
    let k = w.g.k;
    let mut follow: Vec<(u32, Inst)> = Vec::new();
    k.walk(&mut |i, d| {
        if let (Op::Load { .. }, Some(&r)) = (&d.op, d.results.first()) {
            if w.lanes[r.index()].is_some() && w.role[r.index()] == Role::Value {
                follow.push((w.depth[r.index()], i));
            }
        }
    });
    follow.sort();
    let mut out = Vec::new();
    for (_, i) in follow {
        let d = k.inst(i);
        let r = d.results[0];
        let Some(Recorded::Ptr { tensor, offsets, .. }) = w.rec.values[d.args[0].index()].as_ref() else { continue };
        let active = |l: &u32| d.args.get(1).is_none_or(|&m| w.cond_at(m, *l) != Some(false));
        let Some(&l0) = w.lanes[r.index()].as_ref().and_then(|ls| ls.iter().find(|l| active(l))) else { continue };
        let Some(&off) = offsets.get(l0 as usize) else { continue };
        let Some(&id) = back.get(tensor.0 as usize) else { continue };
        let name = t.env.mem.name(id).to_string();
        let Some((_, _, layers)) = t.trace.get(&name) else { continue };
        let hit = layers
            .iter()
            .rev()
            .filter(|(s, ..)| *s < t.step)
            .find_map(|(s, lk, grid, wr)| wr.of(off as usize).map(|(p, inst)| (*s, lk.clone(), *grid, p, inst)));
        let Some((step, kernel, grid, program, inst)) = hit else { continue };
        out.push(Upstream { load: i, tensor: name, element: off as usize, step, kernel, grid, program, inst });
    }
    out
}

/// A source line: file and line number.
pub(crate) type LineKey = (Arc<str>, u32);

/// What a condition (a boolean value) was at the lanes of an element's slice: true where it was
/// true at some lane (it let something into the element's value), false where at none. Which
/// lanes of a masked row a slice follows would otherwise decide the outcome as much as the bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Outcome {
    True,
    False,
}

/// The lines of one element's slice and the outcome of each condition on it: what ranking by
/// evidence across elements counts ([`super::spectrum`]).
#[derive(Debug, Default)]
pub(crate) struct Seen {
    pub lines: Vec<LineKey>,
    pub conditions: Vec<(LineKey, Outcome)>,
}

/// The slice of `t`'s element, into the launches before it as [`explain`] follows them, as lines
/// and outcomes of conditions; `None` when its program cannot be re-run.
pub(crate) fn element_flow(t: &Target, reruns: &mut Reruns, launch: usize, seen: &mut Seen) -> Option<()> {
    let tl = t.trace.launches.iter().find(|l| l.step == t.step)?;
    let k: &Kernel = &tl.kernel;
    let (rec, lane) = reruns.record(t, tl)?;
    let g = Graph::new(k);
    let w = Walk::from_store(&g, &rec, t.inst, lane, EVIDENCE_LANES);
    let repeated = repeated(&g, &rec, &tl.args, t.inst);
    k.walk(&mut |i, d| {
        let Some(&r) = d.results.iter().find(|r| w.lanes[r.index()].is_some()) else { return };
        if !listed(k, d) {
            return;
        }
        let key = (d.loc.file.clone(), d.loc.line);
        if !seen.lines.contains(&key) {
            seen.lines.push(key.clone());
        }
        if k.ty(r).dtype() == Some(tilegrad_ir::DType::I1) {
            let at: Vec<Option<bool>> = w.lanes[r.index()].iter().flatten().map(|&l| w.cond_at(r, l)).collect();
            let o = match (at.contains(&Some(true)), at.contains(&Some(false))) {
                (true, _) => Outcome::True,
                // The record holds a loop body's last trip: false there says nothing of the
                // trips before, which may have let something in.
                (false, true) if !repeated[i.index()] => Outcome::False,
                _ => return,
            };
            if !seen.conditions.contains(&(key.clone(), o)) {
                seen.conditions.push((key, o));
            }
        }
    });
    let ups = match reruns.before.get(&t.step) {
        Some((_, _, back)) if launch < MAX_DEPTH => upstream(t, &w, back),
        _ => Vec::new(),
    };
    for u in ups.into_iter().filter(|u| u.program != Writers::MANY).take(2) {
        let sub = Target {
            step: u.step,
            tensor: &u.tensor,
            element: u.element,
            program: u.program,
            inst: u.inst,
            expected: None,
            got: None,
            ..*t
        };
        element_flow(&sub, reruns, launch + 1, seen);
    }
    Some(())
}

/// Per instruction: whether a loop around it, but not around `store`, made more than one trip in
/// the program `rec` recorded (or an unknown number: a `while`, bounds not recorded). What the
/// record holds of it is then the last trip's value only, where what reached the store came
/// from every trip. (A loop around the store too is recorded at the trip that stored.)
fn repeated(g: &Graph, rec: &ProgramRecord, args: &[(String, Arg)], store: Inst) -> Vec<bool> {
    let k = g.k;
    let mut loops: HashMap<Inst, bool> = HashMap::new();
    let mut at = g.parent[store.index()];
    while let Some(o) = at {
        loops.insert(o, false);
        at = g.parent[o.index()];
    }
    let mut several = |o: Inst| {
        *loops.entry(o).or_insert_with(|| match k.inst(o).op {
            Op::For { .. } => super::recompute::loop_trips(k, rec, args, o).is_none_or(|n| n > 1.0),
            Op::While { .. } => true,
            _ => false,
        })
    };
    (0..k.insts.len())
        .map(|i| {
            let mut at = g.parent[i];
            while let Some(o) = at {
                if several(o) {
                    return true;
                }
                at = g.parent[o.index()];
            }
            false
        })
        .collect()
}

/// Whether an op stands for its line in a slice: loops and branches do not (their bodies' ops
/// do), nor do integer constants (bounds and block sizes, shown by the line using them); a float
/// constant does, where it is all that is left of an expression.
fn listed(k: &Kernel, d: &tilegrad_ir::InstData) -> bool {
    let float = || d.results.first().is_some_and(|&r| k.ty(r).dtype().is_some_and(|t| t.is_float()));
    !d.loc.is_unknown()
        && match d.op {
            Op::For { .. } | Op::If { .. } | Op::Yield => false,
            Op::Const { .. } => float(),
            _ => true,
        }
}

/// The line defining `v`, if an op defines it.
fn def_line(g: &Graph, v: Value) -> Option<u32> {
    match g.def[v.index()] {
        Def::Inst(i, _) => Some(g.k.inst(i).loc.line).filter(|&l| l > 0),
        _ => None,
    }
}

/// The source of the line defining `v`.
fn def_src(g: &Graph, v: Value, files: &mut Files) -> String {
    match g.def[v.index()] {
        Def::Inst(i, _) => {
            let l = &g.k.inst(i).loc;
            files.line(&l.file, l.line)
        }
        _ => String::new(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tilegrad_ir::triton::{convert, ConstValue, ConvertOptions};
    use tilegrad_ir::DType;

    const SRC: &str = "
@triton.jit
def sums(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    last = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n, BLOCK):
        x = tl.load(X + start + offs, mask=start + offs < n).to(tl.float32)
        acc += x
        last = x * 2.0
    tl.store(Y + offs, acc + last)
";

    fn kernel() -> Kernel {
        let opts = ConvertOptions {
            constexprs: vec![("BLOCK".into(), ConstValue::Int(4))],
            pointer_dtypes: vec![("X".into(), DType::F16), ("Y".into(), DType::F32)],
            ..ConvertOptions::default()
        };
        convert(SRC, "k.py", "sums", &opts).expect("the test kernel converts")
    }

    #[test]
    fn a_cast_of_a_loaded_value_moves_it_and_computes_nothing() {
        let k = kernel();
        let g = Graph::new(&k);
        let mut seen = Vec::new();
        k.walk(&mut |_, d| {
            if matches!(d.op, Op::Cast | Op::Binary(_)) && d.results.first().is_some_and(|&r| k.ty(r).dtype().is_some_and(|t| t.is_float()))
            {
                seen.push((d.op.mnemonic(), computes(&g, d)));
            }
        });
        assert!(seen.contains(&("cast", false)), "{seen:?}");
        assert!(seen.contains(&("mul", true)), "{seen:?}");
    }

    /// A ranked line of a division at `k.py:1` with `count` (tests of the ranking rules).
    pub(crate) fn ranked(count: Option<f64>) -> Ranked {
        let line = SliceLine {
            loc: "k.py:1:1".into(),
            kernel: "k".into(),
            step: 0,
            forward: false,
            program: [0; 3],
            op: "div".into(),
            role: "value".into(),
            value: None,
            source: String::new(),
            note: None,
            score: None,
            reason: None,
        };
        Ranked {
            line,
            key: ("k.py".into(), 1),
            class: 3,
            launch: 0,
            depth: 1,
            order: 0,
            store: false,
            scales: false,
            term: false,
            count,
            like: None,
        }
    }

    #[test]
    fn a_mean_over_another_count_than_the_others_comes_first() {
        let mut lines: Vec<Ranked> = [Some(300.0), Some(256.0), Some(300.0), None, Some(300.0)].into_iter().map(ranked).collect();
        odd_counts(&mut lines);
        let classes: Vec<u8> = lines.iter().map(|r| r.class).collect();
        assert_eq!(classes, vec![3, 1, 3, 3, 3]);
        assert_eq!(lines[1].line.note.as_deref(), Some("divides by 256 where the other means of the slice divide by 300: a wrong count?"));
        // Without a majority, no count is odd.
        let mut lines: Vec<Ranked> = [Some(300.0), Some(256.0)].into_iter().map(ranked).collect();
        odd_counts(&mut lines);
        assert!(lines.iter().all(|r| r.class == 3 && r.line.note.is_none()));
    }

    /// The program of [`kernel`] over `n` elements of `X` (one trip per 4), recorded.
    fn recorded(k: &Kernel, n: i64) -> (ProgramRecord, Vec<(String, Arg)>) {
        use tilegrad_reference::{HostTensor, Memory};
        let mut mem = Memory::new();
        mem.add("x", HostTensor::zeros(DType::F16, &[8]));
        mem.add("y", HostTensor::zeros(DType::F32, &[4]));
        let l = Launch::new(k, Grid([1, 1, 1])).arg("X", TensorId(0)).arg("Y", TensorId(1)).arg("n", n);
        let rec = l.record_program(&mem, [0, 0, 0], None).expect("the program runs");
        (rec, vec![("n".to_string(), Arg::Scalar(tilegrad_ir::Lit::Int(n)))])
    }

    /// Whether [`repeated`] marks the load's mask (in the loop) and the store (after it).
    fn marked(k: &Kernel, rec: &ProgramRecord, args: &[(String, Arg)]) -> (bool, bool) {
        let g = Graph::new(k);
        let mut store = None;
        k.walk(&mut |i, d| {
            if matches!(d.op, Op::Store { .. }) {
                store = Some(i);
            }
        });
        let store = store.expect("the kernel stores");
        let r = repeated(&g, rec, args, store);
        let mut mask = None;
        k.walk(&mut |i, d| {
            if matches!(d.op, Op::Cmp(_)) {
                mask = Some(i);
            }
        });
        (r[mask.expect("the load's mask").index()], r[store.index()])
    }

    #[test]
    fn a_condition_in_a_loop_of_several_trips_holds_only_its_last_trip() {
        let k = kernel();
        let (rec, args) = recorded(&k, 8);
        assert_eq!(marked(&k, &rec, &args), (true, false), "two trips: the mask's record is the last trip's");
        let (rec, args) = recorded(&k, 4);
        assert_eq!(marked(&k, &rec, &args), (false, false), "one trip: the record is the whole story");
    }

    #[test]
    fn what_the_store_is_proportional_to() {
        let src = "
@triton.jit
def terms(X, Y, s):
    x = tl.load(X)
    t = x * s
    tl.store(Y, (t + x) * s)
";
        let opts = ConvertOptions { pointer_dtypes: vec![("X".into(), DType::F32), ("Y".into(), DType::F32)], ..ConvertOptions::default() };
        let k = convert(src, "t.py", "terms", &opts).expect("the test kernel converts");
        let g = Graph::new(&k);
        let mut store = None;
        let mut muls = Vec::new();
        k.walk(&mut |i, d| match d.op {
            Op::Store { .. } => store = Some(i),
            Op::Binary(tilegrad_ir::BinaryOp::Mul) => muls.push((d.loc.line, d.results[0])),
            _ => {}
        });
        let whole = proportional(&g, store.expect("the kernel stores"));
        let by_line: Vec<(u32, bool)> = muls.iter().map(|&(l, r)| (l, whole[r.index()])).collect();
        assert_eq!(by_line, vec![(5, false), (6, true)], "`x * s` is a term of what is stored, `(t + x) * s` all of it");
    }

    #[test]
    fn a_factor_on_a_term_puts_the_lines_scaling_a_term_first_not_the_store() {
        // The store, a line scaling the stored value, and a line scaling a term.
        let three = || {
            let mut lines: Vec<Ranked> = (0..3).map(|_| ranked(None)).collect();
            lines[0].store = true;
            (lines[1].scales, lines[1].term) = (true, false);
            (lines[2].scales, lines[2].term) = (true, true);
            lines
        };
        let mut lines = three();
        scaling_first(&mut lines, 0.5, true);
        assert_eq!(lines.iter().map(|r| r.class).collect::<Vec<_>>(), vec![1, 1, 1]);
        let mut lines = three();
        scaling_first(&mut lines, 0.5, false);
        assert_eq!(lines.iter().map(|r| r.class).collect::<Vec<_>>(), vec![3, 3, 1]);
        assert_eq!(
            lines[2].line.note.as_deref(),
            Some("every wrong element is 0.5 times its expected value, but the right ones of their programs are not: a factor on a term?")
        );
    }

    #[test]
    fn a_factor_reads_as_a_ratio() {
        assert_eq!(fmt_factor(7.99999), "8");
        assert_eq!(fmt_factor(2.0 / 3.0), "0.6667");
        assert_eq!(fmt_factor(-1.0), "-1");
    }

    #[test]
    fn an_accumulator_depends_on_what_it_carried_and_an_overwritten_value_does_not() {
        let k = kernel();
        let g = Graph::new(&k);
        let mut carried: Vec<(bool, &str, bool)> = Vec::new();
        k.walk(&mut |_, d| {
            let Op::For { body, .. } = d.op else { return };
            for r in 0..d.results.len() {
                let y = g.yielded(body)[r];
                let Def::Inst(i, _) = g.def[y.index()] else { continue };
                let yd = k.inst(i);
                carried.push((depends_on(&g, y, body, r + 1), yd.op.mnemonic(), scales_by_one(&g, yd)));
            }
        });
        assert!(carried.contains(&(true, "add", false)), "{carried:?}");
        assert!(carried.contains(&(false, "mul", true)), "`last = x * 2.0` scales by a constant: {carried:?}");
    }
}
