//! Facts about the kernel, rather than about the elements, that order the lines of a slice
//! where the evidence across elements ties: a branch folded away at conversion that would undo
//! the factor the wrong elements share ([`super::folded`]), the line that calls a helper whose
//! line ranks high ([`super::helpers`]), and the loads of an input that the forward transforms
//! and the backward uses as loaded ([`super::transforms`]). Values computed twice that disagree
//! are found in [`super::recompute`].

use super::slice::{fmt_factor, Files, Ranked, Target};
use super::steps::TracedLaunch;
use std::collections::HashMap;
use tilegrad_ir::Kernel;
use tilegrad_reference::Arg;

/// Lines of kernel `k` with no op of their own whose branch was folded away at conversion and
/// would scale by one number (`args` gives a scalar argument's) a name that a line of `lines`
/// (those of one launch of `k`) reads, after the branch: each names the first such line
/// ([`super::folded`]), for [`rank_as_named`] to rank.
pub(super) fn folded_branches(k: &Kernel, args: &[(String, Arg)], files: &mut Files, lines: &[Ranked]) -> Vec<Ranked> {
    let kfile = k.loc.file.clone();
    let mut with_ops: Vec<u32> = Vec::new();
    k.walk(&mut |_, d| {
        if d.loc.file == kfile {
            with_ops.push(d.loc.line);
        }
    });
    let Some(src) = files.text(&kfile).map(<[String]>::to_vec) else { return Vec::new() };
    let Some(span) = super::helpers::extent(&src, k.loc.line) else { return Vec::new() };
    let number = |x: &str| {
        let scalar = args.iter().find_map(|(n, a)| match a {
            Arg::Scalar(l) if n == x => Some(l.as_f64()),
            _ => None,
        });
        scalar.or_else(|| x.parse().ok())
    };
    let mut out: Vec<Ranked> = Vec::new();
    for f in super::folded::folded_branches(&src, span, |l| with_ops.contains(&l)) {
        for (name, at) in &f.names {
            let source = |l: u32| src.get((l as usize).wrapping_sub(1)).map_or("", String::as_str);
            let Some(scale) = super::folded::scale_of(source(*at), name, number) else { continue };
            let reader = |r: &&Ranked| *r.key.0 == *kfile && r.key.1 > f.end && super::folded::reads(source(r.key.1), name);
            let Some(user) = lines.iter().filter(reader).min_by_key(|r| (r.class, r.depth, r.order)) else { continue };
            let text = source(f.cond);
            let col = text.len() - text.trim_start().len() + 1;
            let mut line = user.line.clone();
            (line.loc, line.op, line.role, line.value) = (format!("{kfile}:{}:{col}", f.cond), "if".into(), "mask".into(), None);
            line.source = files.line(&kfile, f.cond);
            line.note = Some(format!(
                "its branch, decided at conversion, left no op: line {at} would scale `{name}` by {}, which line {} reads, and undo the factor every wrong element is off by",
                fmt_factor(scale),
                user.key.1
            ));
            let like = Some((user.key.clone(), scale));
            out.push(Ranked { line, key: (kfile.clone(), f.cond), store: false, scales: false, term: false, count: None, like, ..*user });
        }
    }
    out
}

/// Lines with no op of their own whose branch would undo the factor the wrong elements share
/// (`factor`) take the evidence of the line they name and come first; the others are dropped.
pub(super) fn rank_as_named(lines: &mut Vec<Ranked>, factor: Option<f64>) {
    let undoes = |s: f64| factor.is_some_and(|f| (s * f - 1.0).abs() <= 1e-3);
    lines.retain(|r| r.like.as_ref().is_none_or(|(_, s)| undoes(*s)));
    for i in 0..lines.len() {
        let Some((key, _)) = lines[i].like.clone() else { continue };
        let Some(j) = lines.iter().position(|r| r.key == key && r.launch == lines[i].launch && r.like.is_none()) else { continue };
        let (score, reason, depth) = (lines[j].line.score, lines[j].line.reason.clone(), lines[j].depth);
        let r = &mut lines[i];
        r.line.score = score;
        r.line.reason = reason.map(|x| format!("as line {}, which reads what its branch would scale: {x}", key.1));
        (r.class, r.depth) = (0, depth);
    }
}

/// Ranks the line of kernel `k` that calls a helper with the helper's best line among `lines`
/// (those of one launch of `k`): the helper's lines serve its every call, the arguments are
/// this call's own ([`super::helpers`]).
pub(super) fn calls_with_helpers(k: &Kernel, files: &mut Files, lines: &mut [Ranked]) {
    use super::helpers::{call_line, enclosing_def, extent};
    let kfile = k.loc.file.clone();
    let Some(span) = files.text(&kfile).and_then(|s| extent(s, k.loc.line)) else { return };
    let mut best: HashMap<u32, (u8, u32, String)> = HashMap::new();
    let mut order: Vec<usize> = (0..lines.len()).collect();
    order.sort_by_key(|&i| (lines[i].class, lines[i].depth));
    for i in order {
        let (file, line) = lines[i].key.clone();
        if *file == *kfile && (span.0..=span.1).contains(&line) {
            continue;
        }
        let Some((name, _)) = files.text(&file).and_then(|s| enclosing_def(s, line)) else { continue };
        let Some(call) = files.text(&kfile).and_then(|s| call_line(s, span, &name)) else { continue };
        let at = format!("{}:{line}", std::path::Path::new(&*file).file_name().map_or(String::new(), |f| f.to_string_lossy().into_owned()));
        best.entry(call).or_insert((lines[i].class, lines[i].depth, format!("calls `{name}`, whose line {at} is on the slice: a helper's lines serve its every call, its arguments here are this call's own")));
    }
    for r in lines.iter_mut() {
        let Some((class, depth, note)) = best.get(&r.key.1).filter(|_| *r.key.0 == *kfile) else { continue };
        r.class = r.class.min(*class);
        r.depth = r.depth.min(*depth);
        if r.line.note.is_none() {
            r.line.note = Some(note.clone());
        }
    }
}

/// The loads of a backward launch `tl` of an input that the forward transforms by a constant
/// op and this launch uses as loaded ([`super::transforms`]).
pub(super) fn untransformed(t: &Target, tl: &TracedLaunch) -> Vec<super::recompute::Disagreement> {
    let fwd = t.trace.forward_steps;
    if tl.step < fwd {
        return Vec::new();
    }
    let theirs: Vec<_> = t.trace.launches.iter().filter(|l| l.step < fwd).map(|l| (&*l.kernel, &l.args[..])).collect();
    let found = super::transforms::untransformed_loads(&theirs, (&tl.kernel, &tl.args), &t.env.mem);
    found.into_iter().map(|(op, note)| super::recompute::Disagreement { op, note }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::slice::tests::ranked;
    use tilegrad_ir::triton::{convert, ConvertOptions};
    use tilegrad_ir::DType;

    #[test]
    fn a_folded_branch_comes_first_only_where_it_undoes_the_shared_factor() {
        let named = |scale: f64| {
            let mut user = ranked(None);
            user.line.score = Some(0.8);
            user.line.reason = Some("feeds 4 of 4 wrong elements".into());
            let mut f = ranked(None);
            (f.key, f.like) = (("k.py".into(), 7), Some((user.key.clone(), scale)));
            vec![user, f]
        };
        let mut lines = named(0.025);
        rank_as_named(&mut lines, Some(40.0));
        assert_eq!((lines.len(), lines[1].class, lines[1].line.score), (2, 0, Some(0.8)));
        assert_eq!(
            lines[1].line.reason.as_deref(),
            Some("as line 1, which reads what its branch would scale: feeds 4 of 4 wrong elements")
        );
        for (scale, factor) in [(0.5, Some(40.0)), (0.025, None)] {
            let mut lines = named(scale);
            rank_as_named(&mut lines, factor);
            assert_eq!(lines.len(), 1, "a branch that would not undo the factor is not listed");
        }
    }

    #[test]
    fn the_line_calling_a_helper_ranks_with_the_helper_s_line() {
        let src = "@triton.jit\ndef turn(x, s):\n    return x * s\n\n\n@triton.jit\ndef k(X, Y):\n    x = tl.load(X)\n    y = turn(x, 2.0)\n    tl.store(Y, y)\n";
        let path = std::env::temp_dir().join(format!("tilegrad_helper_call_{}.py", std::process::id()));
        std::fs::write(&path, src).expect("a temporary file");
        let file = path.to_string_lossy().into_owned();
        let opts = ConvertOptions { pointer_dtypes: vec![("X".into(), DType::F32), ("Y".into(), DType::F32)], ..ConvertOptions::default() };
        let k = convert(src, &file, "k", &opts).expect("the test kernel converts");
        let at = |line: u32, class: u8, depth: u32| {
            let mut r = ranked(None);
            (r.key, r.class, r.depth) = ((file.as_str().into(), line), class, depth);
            r
        };
        // The helper's line (3) computes, the call (9) and the load (8) move values.
        let mut lines = vec![at(3, 2, 1), at(8, 4, 3), at(9, 4, 2)];
        calls_with_helpers(&k, &mut Files::default(), &mut lines);
        let _ = std::fs::remove_file(&path);
        let ranks: Vec<(u8, u32)> = lines.iter().map(|r| (r.class, r.depth)).collect();
        assert_eq!(ranks, vec![(2, 1), (4, 3), (2, 1)]);
        assert!(lines[2].line.note.as_deref().is_some_and(|n| n.starts_with("calls `turn`, whose line")), "{:?}", lines[2].line.note);
    }
}
