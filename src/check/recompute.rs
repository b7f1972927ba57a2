//! Values a kernel computes twice must agree. A kernel that makes two passes over the same
//! tiles (flash attention's backward: one loop for the softmax's row statistics, one for the
//! gradients) computes the same expressions in each, and masks them the same way. Where one
//! pass masks a tile another way than the other (`<` for `<=`, a tile-local index for a global
//! one), or stops its loop before the other, every element is wrong and every line of the slice
//! feeds every one of them alike: the evidence across elements ties. The program's recorded
//! values tell the two passes apart: the same value masked by conditions that differ at a lane,
//! or two loops that load the same tiles from the same start but stop at different bounds.

use std::collections::HashMap;
use tilegrad_ir::{Block, Inst, InstData, Kernel, Op, Value};
use tilegrad_reference::{Arg, ProgramRecord, Recorded};

/// An op on which two computations of the same value disagree, and how.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Disagreement {
    /// The op: the condition of a `where`, or the upper bound of a loop.
    pub op: Inst,
    /// Why it is suspect.
    pub note: String,
}

/// The ops on which the program recorded in `rec` computed the same value twice and the two
/// disagree: conditions of `where`s over the same values that differ at a lane, and upper
/// bounds of loops that load the same tiles from the same start but stop apart. `args`: the
/// launch's arguments (the scalar parameters' values, which the record does not hold).
pub(crate) fn disagreements(k: &Kernel, rec: &ProgramRecord, args: &[(String, Arg)]) -> Vec<Disagreement> {
    let c = Classes::of(k);
    let mut out = conditions_apart(k, rec, &c);
    out.extend(bounds_apart(k, rec, &c, args));
    out
}

/// Structural classes of a kernel's values: two values share a class where the same ops compute
/// them from the same parameters and constants (a loop's induction variable stands for any
/// loop's at its depth, so that two loops over the same range compute the same classes).
struct Classes {
    class: Vec<u32>,
    /// Per class: whether it depends on a loop's induction variable.
    per_trip: Vec<bool>,
    /// Per instruction: the loop whose body holds it directly.
    parent: Vec<Option<Inst>>,
}

impl Classes {
    fn of(k: &Kernel) -> Classes {
        let mut c = Classes { class: vec![u32::MAX; k.values.len()], per_trip: Vec::new(), parent: vec![None; k.insts.len()] };
        let mut keys: HashMap<(String, Vec<u32>), u32> = HashMap::new();
        for (j, p) in k.params.iter().enumerate() {
            let id = c.intern(&mut keys, format!("param {j}"), Vec::new(), false);
            c.class[p.value.index()] = id;
        }
        let mut depth: Vec<u32> = vec![0; k.insts.len()];
        k.walk(&mut |i, d| {
            let at = c.parent[i.index()].map_or(0, |p| depth[p.index()] + 1);
            depth[i.index()] = at;
            for b in d.op.blocks() {
                for &j in &k.block(b).insts {
                    c.parent[j.index()] = Some(i);
                }
                c.block_params(k, b, matches!(d.op, Op::For { .. }), at, &mut keys);
            }
            c.inst(k, d, &mut keys);
        });
        c
    }

    /// The class of `key` over `args`, made new where none has it yet.
    fn intern(&mut self, keys: &mut HashMap<(String, Vec<u32>), u32>, key: String, args: Vec<u32>, per_trip: bool) -> u32 {
        let per_trip = per_trip || args.iter().any(|&a| self.per_trip.get(a as usize).copied().unwrap_or(false));
        let n = self.per_trip.len() as u32;
        let id = *keys.entry((key, args)).or_insert(n);
        if id == n {
            self.per_trip.push(per_trip);
        }
        id
    }

    /// A class no other value shares.
    fn unique(&mut self, v: Value, per_trip: bool) {
        self.class[v.index()] = self.per_trip.len() as u32;
        self.per_trip.push(per_trip);
    }

    fn block_params(&mut self, k: &Kernel, b: Block, for_loop: bool, depth: u32, keys: &mut HashMap<(String, Vec<u32>), u32>) {
        for (j, &p) in k.block(b).params.iter().enumerate() {
            if for_loop && j == 0 {
                self.class[p.index()] = self.intern(keys, format!("induction variable at depth {depth}"), Vec::new(), true);
            } else {
                self.unique(p, true);
            }
        }
    }

    fn inst(&mut self, k: &Kernel, d: &InstData, keys: &mut HashMap<(String, Vec<u32>), u32>) {
        let effects = matches!(d.op, Op::Store { .. } | Op::AtomicAdd { .. } | Op::AtomicRmw { .. } | Op::AtomicCas);
        if effects || !d.op.blocks().is_empty() || d.args.iter().any(|a| self.class[a.index()] == u32::MAX) {
            for &r in &d.results {
                self.unique(r, true);
            }
            return;
        }
        let args: Vec<u32> = d.args.iter().map(|a| self.class[a.index()]).collect();
        for (j, &r) in d.results.iter().enumerate() {
            let key = format!("{:?} {j} {:?}", d.op, k.ty(r));
            self.class[r.index()] = self.intern(keys, key, args.clone(), false);
        }
    }
}

/// Whether two recorded values hold the same numbers (pointers: the same tensor and offsets).
fn same_record(a: Option<&Recorded>, b: Option<&Recorded>) -> bool {
    match (a, b) {
        (Some(Recorded::Num { shape: s, data: x }), Some(Recorded::Num { shape: t, data: y })) => {
            s == t && x.iter().zip(y.iter()).all(|(p, q)| p.to_bits() == q.to_bits() || p.is_nan() && q.is_nan())
        }
        (Some(a @ Recorded::Ptr { .. }), Some(b @ Recorded::Ptr { .. })) => a == b,
        _ => false,
    }
}

fn recorded(rec: &ProgramRecord, v: Value) -> Option<&Recorded> {
    rec.values.get(v.index())?.as_ref()
}

/// `where`s choosing between the same two values under conditions that differ at a lane, both
/// as this program last computed them (the same tile: their chosen values hold the same
/// numbers): the conditions' ops, each with a note naming the other.
fn conditions_apart(k: &Kernel, rec: &ProgramRecord, c: &Classes) -> Vec<Disagreement> {
    let mut wheres: Vec<&InstData> = Vec::new();
    k.walk(&mut |i, d| {
        if matches!(d.op, Op::Where) {
            wheres.push(k.inst(i));
        }
    });
    let mut out: Vec<Disagreement> = Vec::new();
    for (n, &a) in wheres.iter().enumerate() {
        for &b in &wheres[n + 1..] {
            let same = |j: usize| c.class[a.args[j].index()] == c.class[b.args[j].index()];
            if !(1..3).all(|j| same(j) && same_record(recorded(rec, a.args[j]), recorded(rec, b.args[j]))) {
                continue;
            }
            let Some(lane) = lane_apart(k, rec, a, b) else { continue };
            let (Some(da), Some(db)) = (condition_def(k, a.args[0]), condition_def(k, b.args[0])) else { continue };
            let at = |d: &InstData| cond_at(k, rec, d, lane).map_or("?", |t| if t { "true" } else { "false" });
            let shape = k.ty(a.results[0]).shape.to_vec();
            let idx = super::report::unravel(lane, &shape);
            for (mine, me, other, od) in [(a, da, b, db), (b, db, a, da)] {
                let note = format!(
                    "this condition is {} at lane {idx:?} where the one at line {}, over the same values, is {}: one of them is wrong",
                    at(mine),
                    k.inst(od).loc.line,
                    at(other)
                );
                if !out.iter().any(|x| x.op == me) {
                    out.push(Disagreement { op: me, note });
                }
            }
        }
    }
    out
}

/// The op defining `v`, if an op does.
fn def(k: &Kernel, v: Value) -> Option<Inst> {
    let mut found = None;
    k.walk(&mut |i, d| {
        if found.is_none() && d.results.contains(&v) {
            found = Some(i);
        }
    });
    found
}

/// The op that computes condition `v`, past the broadcasts that shape it for its `where`.
fn condition_def(k: &Kernel, mut v: Value) -> Option<Inst> {
    loop {
        let i = def(k, v)?;
        match k.inst(i).op {
            Op::Broadcast | Op::ExpandDims { .. } | Op::Reshape => v = k.inst(i).args[0],
            _ => return Some(i),
        }
    }
}

/// The condition of `where` `d` at lane `lane` of its result.
fn cond_at(k: &Kernel, rec: &ProgramRecord, d: &InstData, lane: usize) -> Option<bool> {
    let (cs, rs) = (k.ty(d.args[0]).shape.to_vec(), k.ty(d.results[0]).shape.to_vec());
    Some(recorded(rec, d.args[0])?.at(broadcast_lane(lane, &cs, &rs)) != 0.0)
}

/// The lane of an operand of shape `arg` that lane `lane` of an elementwise result of shape `res`
/// reads (a scalar: 0; a broadcast operand: its 1-sized dimensions at 0).
fn broadcast_lane(lane: usize, arg: &[usize], res: &[usize]) -> usize {
    if arg.iter().product::<usize>() == 1 {
        return 0;
    }
    if arg == res || arg.len() != res.len() {
        return lane;
    }
    let idx = super::report::unravel(lane, res);
    idx.iter().zip(arg).fold(0, |acc, (&i, &n)| acc * n + if n == 1 { 0 } else { i })
}

/// The first lane of two `where`s' results at which their conditions differ.
fn lane_apart(k: &Kernel, rec: &ProgramRecord, a: &InstData, b: &InstData) -> Option<usize> {
    let (ra, rb) = (&k.ty(a.results[0]).shape, &k.ty(b.results[0]).shape);
    if ra != rb {
        return None;
    }
    let n: usize = ra.iter().product();
    (0..n).find(|&l| match (cond_at(k, rec, a, l), cond_at(k, rec, b, l)) {
        (Some(x), Some(y)) => x != y,
        _ => false,
    })
}

/// Loops that load the same tiles trip by trip (a load of the same class, depending on the
/// induction variable, directly in each body), from the same start by the same step, but stop
/// at different upper bounds: the ops computing each bound, with a note naming the other loop.
fn bounds_apart(k: &Kernel, rec: &ProgramRecord, c: &Classes, args: &[(String, Arg)]) -> Vec<Disagreement> {
    let mut loops: Vec<(Inst, Vec<u32>)> = Vec::new();
    k.walk(&mut |i, d| {
        if matches!(d.op, Op::For { .. }) {
            loops.push((i, Vec::new()));
        }
        let Some(p) = c.parent[i.index()] else { return };
        if let (Op::Load { .. }, Some(&r)) = (&d.op, d.results.first()) {
            let cl = c.class[r.index()];
            if c.per_trip[cl as usize] {
                if let Some(l) = loops.iter_mut().find(|(l, _)| *l == p) {
                    l.1.push(cl);
                }
            }
        }
    });
    let num = |v: Value| match recorded(rec, v) {
        Some(r @ Recorded::Num { .. }) => Some(r.at(0)),
        _ => scalar_arg(k, v, args),
    };
    let bounds = |i: Inst| {
        let a = &k.inst(i).args;
        Some((num(a[0])?, num(a[1])?, num(a[2])?))
    };
    let mut out: Vec<Disagreement> = Vec::new();
    for (n, (la, ca)) in loops.iter().enumerate() {
        for (lb, cb) in &loops[n + 1..] {
            if !ca.iter().any(|x| cb.contains(x)) {
                continue;
            }
            let (Some(x), Some(y)) = (bounds(*la), bounds(*lb)) else { continue };
            if x.0 != y.0 || x.2 != y.2 || x.1 == y.1 || x.2 <= 0.0 {
                continue;
            }
            for (me, mb, other, ob) in [(*la, x, *lb, y), (*lb, y, *la, x)] {
                let Some(d) = def(k, k.inst(me).args[1]) else { continue };
                let note = format!(
                    "this loop stops at {} ({} trips) where the loop at line {}, which loads the same tiles from the same start, stops at {} ({} trips)",
                    mb.1,
                    trips(mb),
                    k.inst(other).loc.line,
                    ob.1,
                    trips(ob)
                );
                if !out.iter().any(|o| o.op == d) {
                    out.push(Disagreement { op: d, note });
                }
            }
        }
    }
    out
}

/// The value of scalar parameter `v` in `args`, where `v` is one.
fn scalar_arg(k: &Kernel, v: Value, args: &[(String, Arg)]) -> Option<f64> {
    let p = k.params.iter().find(|p| p.value == v)?;
    args.iter().find_map(|(n, a)| match a {
        Arg::Scalar(l) if *n == p.name => Some(l.as_f64()),
        _ => None,
    })
}

/// Trips the `for` loop `i` made in the program `rec` recorded, where its bounds are known (as
/// recorded, or scalar arguments of the launch) and its step is positive.
pub(super) fn loop_trips(k: &Kernel, rec: &ProgramRecord, args: &[(String, Arg)], i: Inst) -> Option<f64> {
    let d = k.inst(i);
    if !matches!(d.op, Op::For { .. }) || d.args.len() < 3 {
        return None;
    }
    let num = |v: Value| match recorded(rec, v) {
        Some(r @ Recorded::Num { .. }) => Some(r.at(0)),
        _ => scalar_arg(k, v, args),
    };
    let b = (num(d.args[0])?, num(d.args[1])?, num(d.args[2])?);
    (b.2 > 0.0).then(|| trips(b))
}

/// Trips of a loop from `lo` to `hi` by `step` (> 0).
fn trips((lo, hi, step): (f64, f64, f64)) -> f64 {
    ((hi - lo) / step).ceil().max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tilegrad_ir::triton::{convert, ConstValue, ConvertOptions};
    use tilegrad_ir::DType;
    use tilegrad_ir::Lit;
    use tilegrad_reference::{Grid, HostTensor, Launch, Memory, TensorId};

    /// Two passes over the tiles of `X`: the first masks with `<=`, the second with `<` (line
    /// 12), or stops a tile early (line 10, with `STOP = 1`).
    const SRC: &str = "
@triton.jit
def passes(X, Y, n, STOP: tl.constexpr, STRICT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n, BLOCK):
        x = tl.load(X + start + offs, mask=start + offs < n, other=0.0)
        m = tl.maximum(m, tl.where(start + offs <= n - 2, x, 0.0))
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n - STOP * BLOCK, BLOCK):
        x = tl.load(X + start + offs, mask=start + offs < n, other=0.0)
        keep = start + offs < n - 2 + (1 - STRICT)
        acc += tl.where(keep, x, 0.0) - m
    tl.store(Y + offs, acc)
";

    fn found(stop: i64, strict: i64) -> Vec<(u32, String)> {
        let opts = ConvertOptions {
            constexprs: vec![
                ("STOP".into(), ConstValue::Int(stop)),
                ("STRICT".into(), ConstValue::Int(strict)),
                ("BLOCK".into(), ConstValue::Int(4)),
            ],
            pointer_dtypes: vec![("X".into(), DType::F32), ("Y".into(), DType::F32)],
            ..ConvertOptions::default()
        };
        let k = convert(SRC, "p.py", "passes", &opts).expect("the test kernel converts");
        let mut mem = Memory::new();
        mem.add("x", HostTensor::from_f32(&[12], (0..12).map(|i| i as f32).collect()));
        mem.add("y", HostTensor::zeros(DType::F32, &[4]));
        let l = Launch::new(&k, Grid([1, 1, 1])).arg("X", TensorId(0)).arg("Y", TensorId(1)).arg("n", 12);
        let rec = l.record_program(&mem, [0, 0, 0], None).expect("the program runs");
        let args = [("n".to_string(), Arg::Scalar(Lit::Int(12)))];
        disagreements(&k, &rec, &args).into_iter().map(|d| (k.inst(d.op).loc.line, d.note)).collect()
    }

    #[test]
    fn passes_that_agree_raise_nothing() {
        assert_eq!(found(0, 0), vec![]);
    }

    #[test]
    fn the_same_values_masked_apart_name_both_conditions() {
        let f = found(0, 1);
        let lines: Vec<u32> = f.iter().map(|x| x.0).collect();
        assert_eq!(lines, vec![8, 12], "{f:?}");
        assert_eq!(
            f[1].1,
            "this condition is false at lane [2] where the one at line 8, over the same values, is true: one of them is wrong"
        );
    }

    #[test]
    fn loops_over_the_same_tiles_that_stop_apart_name_both_bounds() {
        let f = found(1, 0);
        let lines: Vec<u32> = f.iter().map(|x| x.0).collect();
        assert_eq!(lines, vec![10], "{f:?}: the first loop's bound is a parameter, no op");
        assert!(f[0].1.starts_with("this loop stops at 8 (2 trips) where the loop at line 6"), "{f:?}");
    }
}
