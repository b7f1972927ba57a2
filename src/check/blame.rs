//! Blame: which program instance and which store wrote a compared element, following it back
//! through host steps (a gradient summed on the host from a partial buffer is blamed on the
//! stores that wrote the partial buffer's elements it was summed from; one computed on the host
//! from several tensors, on each float tensor's elements it read; one with a tensor added in
//! place, on that tensor's elements too).

use super::report::{unravel, Blame, BlameSite};
use super::slice::{explain, Reruns, Target};
use super::spectrum::{Evidence, Sample};
use super::steps::{split_axis, Env, Init, Origin, Step, Trace};
use super::tensor_expr::broadcast_map;
use tilegrad_ir::{Kernel, Loc, Value};
use tilegrad_reference::Writers;

/// Where the instruction defining `v` is, if an instruction defines it (not a parameter); for a
/// loop's result, where the body computes the value it carries out (not the loop header).
fn def_loc(k: &Kernel, v: Value) -> Option<Loc> {
    let mut found = None;
    k.walk(&mut |_, d| {
        if found.is_none() && d.results.contains(&v) {
            found = Some(match d.op {
                tilegrad_ir::Op::For { body, .. } => {
                    let j = d.results.iter().position(|&r| r == v).unwrap_or(0);
                    let y = k.block(body).insts.last().map(|&l| k.inst(l)).filter(|y| matches!(y.op, tilegrad_ir::Op::Yield));
                    match y.and_then(|y| y.args.get(j).copied()).filter(|&yv| yv != v) {
                        Some(yv) => def_loc(k, yv).unwrap_or_else(|| d.loc.clone()),
                        None => d.loc.clone(),
                    }
                }
                _ => d.loc.clone(),
            });
        }
    });
    found.filter(|l| !l.is_unknown())
}

/// Blames element `e` (flat) of tensor `name` of a pass that ran `steps` with `trace`;
/// `values` (expected, got) and the slices of `samples` of wrong and right elements of the
/// tensors compared (this one's among them) rank the lines of its data-flow slice.
pub(crate) fn blame(
    trace: &Trace,
    env: &Env,
    steps: &[Step],
    name: &str,
    e: usize,
    values: Option<(f64, f64)>,
    samples: &[(String, Sample)],
) -> Blame {
    let mut b = Blame { via: Vec::new(), sites: Vec::new(), slice: None };
    go(trace, env, steps, name, &[e], &mut b, 0, values, samples);
    b
}

/// Blames elements `elems` (flat) of tensor `name`, reached from the compared element through the
/// host steps `via` (outermost first; none when `name` is the compared tensor itself).
pub(crate) fn blame_elements(
    trace: &Trace,
    env: &Env,
    steps: &[Step],
    name: &str,
    elems: &[usize],
    via: Vec<String>,
    values: Option<(f64, f64)>,
) -> Blame {
    let mut b = Blame { via, sites: Vec::new(), slice: None };
    go(trace, env, steps, name, elems, &mut b, 0, values, &[]);
    b
}

#[allow(clippy::too_many_arguments)]
fn go(
    trace: &Trace,
    env: &Env,
    steps: &[Step],
    name: &str,
    elems: &[usize],
    b: &mut Blame,
    depth: usize,
    values: Option<(f64, f64)>,
    samples: &[(String, Sample)],
) {
    let Some((_, origin, layers)) = trace.get(name) else {
        b.sites.push(BlameSite::Given { tensor: name.to_string() });
        return;
    };
    let shape = env.tensor(name).map(|t| t.shape().to_vec()).unwrap_or_default();
    let mut unwritten = Vec::new();
    for &e in elems {
        let hit = layers.iter().rev().find_map(|(step, k, grid, w)| w.of(e).map(|(p, inst)| (*step, k, grid, p, inst)));
        let Some((step, k, grid, p, inst)) = hit else {
            unwritten.push(e);
            continue;
        };
        let d = k.inst(inst);
        let loc = d.loc.to_string();
        let (traced_step, step) = (step, trace.pass_step(step));
        if p == Writers::MANY {
            if !b.sites.iter().any(|s| matches!(s, BlameSite::ManyPrograms { loc: l, step: st, .. } if *l == loc && *st == step)) {
                b.sites.push(BlameSite::ManyPrograms { step, kernel: k.name.clone(), loc });
            }
            continue;
        }
        let pid = grid.pid(p as u64);
        if b.slice.is_none() {
            // The data flow of the first element blamed on a store (through host steps, its
            // value is the compared one only when no sum intervened).
            let direct = b.via.is_empty();
            // Evidence across elements, for the compared tensor's own elements.
            let (evidence, reruns) = match Some(samples).filter(|_| direct && depth == 0) {
                Some(s) => Evidence::gather(trace, env, name, s),
                None => (None, Reruns::with_budget(usize::MAX)),
            };
            b.slice = explain(
                &Target {
                    trace,
                    env,
                    step: traced_step,
                    tensor: name,
                    element: e,
                    program: p,
                    inst,
                    expected: values.filter(|_| direct).map(|v| v.0),
                    got: values.map(|v| v.1),
                },
                evidence.as_ref(),
                reruns,
            );
        }
        match b.sites.iter_mut().find(|s| matches!(s, BlameSite::Store { loc: l, step: st, .. } if *l == loc && *st == step)) {
            Some(BlameSite::Store { programs, elements, .. }) => {
                *elements += 1;
                if programs.len() < 4 && !programs.contains(&pid) {
                    programs.push(pid);
                }
            }
            _ => {
                let other_line = |v: Option<&Value>| {
                    v.and_then(|&v| def_loc(k, v)).filter(|l| l.line != d.loc.line || l.file != d.loc.file).map(|l| l.to_string())
                };
                b.sites.push(BlameSite::Store {
                    step,
                    kernel: k.name.clone(),
                    op: d.op.mnemonic().to_string(),
                    loc,
                    value_loc: other_line(d.args.get(1)),
                    address_loc: other_line(d.args.first()),
                    programs: vec![pid],
                    elements: 1,
                })
            }
        }
    }
    // `name += src` steps added `src` into every element: its elements are blamed too.
    if depth <= 16 {
        for (k, step) in steps.iter().enumerate() {
            let Step::Accumulate { src, dst } = step else { continue };
            if dst != name {
                continue;
            }
            let src_shape = env.tensor(src).map(|t| t.shape().to_vec()).unwrap_or_default();
            if super::tensor_expr::broadcast(&src_shape, &shape).as_deref() != Some(&shape[..]) {
                continue;
            }
            let map = broadcast_map(&src_shape, &shape);
            let mut from: Vec<usize> = Vec::new();
            for &e in elems.iter().filter(|&&e| e < map.len()) {
                if !from.contains(&map[e]) {
                    from.push(map[e]);
                }
            }
            if let Some(&f) = from.first() {
                b.via.push(format!("`{}` (step {k}): also from `{src}`{:?}", step.describe(), unravel(f, &src_shape)));
                go(trace, env, steps, src, &from, b, depth + 1, values, &[]);
            }
        }
    }
    if unwritten.is_empty() {
        return;
    }
    match origin {
        Origin::Given => b.sites.push(BlameSite::Given { tensor: name.to_string() }),
        Origin::Alloc { init, .. } => b.sites.push(BlameSite::NeverWritten {
            tensor: name.to_string(),
            index: unravel(unwritten[0], &shape),
            elements: unwritten.len(),
            init: if *init == Init::Zeros { "zero".into() } else { "NaN".into() },
        }),
        Origin::Host { step, srcs } => {
            if depth > 16 {
                return;
            }
            // The float sources (an integer operand, such as labels in a mask, holds no blame).
            let float = |s: &&String| env.tensor(s).is_some_and(|t| t.dtype().is_float());
            let followed: Vec<&String> =
                if srcs.iter().any(|s| float(&s)) { srcs.iter().filter(float).collect() } else { srcs.iter().collect() };
            for src in followed {
                let src_shape = env.tensor(src).map(|t| t.shape().to_vec()).unwrap_or_default();
                let mut from = Vec::new();
                let what = match &steps[*step] {
                    Step::Sum { axis, .. } | Step::Reduce { axis, .. } => {
                        let (a, _, n, inner) = split_axis(&src_shape, *axis).expect("the pass ran this reduction");
                        for &e in &unwritten {
                            let (o, j) = (e / inner.max(1), e % inner.max(1));
                            from.extend((0..n).map(|k| (o * n + k) * inner + j));
                        }
                        if from.is_empty() {
                            continue;
                        }
                        let mut idx: Vec<String> = unravel(from[0], &src_shape).iter().map(|i| i.to_string()).collect();
                        idx[a] = ":".into();
                        match &steps[*step] {
                            Step::Sum { .. } => format!("`{name}` = `{src}`.sum({axis}) (step {step}): from `{src}`[{}]", idx.join(", ")),
                            s => format!("`{}` (step {step}): from `{src}`[{}]", s.describe(), idx.join(", ")),
                        }
                    }
                    s @ (Step::Chunk { .. } | Step::Slice { .. } | Step::Cat { .. }) => {
                        let Some(map) = super::steps::pieces::source_map(s, env, name, src) else { continue };
                        from.extend(unwritten.iter().filter_map(|&e| map.get(e).copied().flatten()));
                        let Some(&first) = from.first() else { continue };
                        format!("`{}` (step {step}): from `{src}`{:?}", s.describe(), unravel(first, &src_shape))
                    }
                    Step::Compute { .. } => {
                        let map = broadcast_map(&src_shape, &shape);
                        for &e in &unwritten {
                            if !from.contains(&map[e]) {
                                from.push(map[e]);
                            }
                        }
                        format!("`{}` (step {step}): from `{src}`{:?}", steps[*step].describe(), unravel(from[0], &src_shape))
                    }
                    s => {
                        from.extend(unwritten.iter().copied());
                        format!("`{}` (step {step}): from `{src}`{:?}", s.describe(), unravel(from[0], &src_shape))
                    }
                };
                b.via.push(what);
                go(trace, env, steps, src, &from, b, depth + 1, values, &[]);
            }
        }
    }
}

/// For a tensor allocated empty by step `s`: `(s, e)` with `e` its first element no launch wrote.
pub(crate) fn first_unwritten(trace: &Trace, name: &str) -> Option<(usize, usize)> {
    let (_, origin, layers) = trace.get(name)?;
    let Origin::Alloc { init: Init::Empty, step } = origin else { return None };
    let Some((_, _, _, first)) = layers.first() else { return Some((*step, 0)) };
    let mut each: Vec<_> = layers.iter().map(|(_, _, _, w)| w.iter()).collect();
    (0..first.len())
        .find(|_| {
            // Every layer's iterator advances once per element (no short-circuit).
            let mut none = true;
            for w in each.iter_mut() {
                none &= w.next().flatten().is_none();
            }
            none
        })
        .map(|e| (*step, e))
}
