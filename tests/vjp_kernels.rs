//! VJP kernels against the evaluator: the ground truth of every example spec computed both ways
//! (`Ground::Kernels`, each launch's VJP kernel run by the reference interpreter, against the
//! default CPU evaluator) agrees within 1e-12 (normwise, relative) on every gradient; a launch
//! whose kernel VJP kernels do not take yet is differentiated by the evaluator instead, with a
//! note naming the op and its line, and the check goes on.

use std::path::{Path, PathBuf};
use tilegrad::check::{check_backward, ground_truth, CheckOptions, FindingKind, Ground};
use tilegrad::spec;

fn example_specs() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "toml")).collect();
    files.sort();
    files
}

/// On every example spec, in its own thread: the ground truth by VJP kernels under `opts` (the
/// spec's options with `ground = Kernels` and the changes `opts` makes) against the default f64
/// evaluator's, every gradient within `tol` (normwise, relative). A spec whose launches VJP
/// kernels do not take has those launches differentiated by the evaluator, each with a note
/// naming the refused op. Returns how many specs were taken by VJP kernels alone.
fn against_the_evaluator(tol: f64, opts: impl Fn(CheckOptions) -> CheckOptions + Sync) -> usize {
    let specs = example_specs();
    let opts = &opts;
    let results: Vec<(String, usize)> = std::thread::scope(|s| {
        let handles: Vec<_> = specs
            .iter()
            .map(|p| {
                s.spawn(move || {
                    let sp = spec::load(p).unwrap();
                    let name = p.file_name().unwrap().to_string_lossy().into_owned();
                    let want = ground_truth(&sp.forward, &sp.inputs, &sp.options).unwrap();
                    assert!(want.notes.is_empty(), "{name}: the evaluator's ground truth has notes: {:?}", want.notes);
                    let o = opts(CheckOptions { ground: Ground::Kernels, ..sp.options.clone() });
                    let got = ground_truth(&sp.forward, &sp.inputs, &o).unwrap_or_else(|e| panic!("{name}: {e}"));
                    let mut compared = 0;
                    for ((n, w), (m, g)) in want.gradients.iter().zip(&got.gradients) {
                        assert_eq!(n, m);
                        let (w, g) = (w.to_f64_vec(), g.to_f64_vec());
                        let norm = w.iter().map(|x| x * x).sum::<f64>().sqrt();
                        let diff = w.iter().zip(&g).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
                        assert!(diff <= tol * norm + 1e-300, "{name}: gradient of `{n}` differs by {diff:e} (norm {norm:e})");
                        compared += 1;
                    }
                    assert!(compared > 0, "{name}: no gradient compared");
                    for n in &got.notes {
                        assert_eq!(n.kind, FindingKind::GroundByEvaluator, "{name}: {n:?}");
                        assert!(n.message.contains("refused") && !n.locations.is_empty(), "{name}: an unclear note: {}", n.message);
                    }
                    (name, got.notes.len())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut alone = 0;
    for (name, notes) in &results {
        assert_eq!(*notes > 0, BY_EVALUATOR.contains(&name.as_str()), "{name}: {notes} launches by the evaluator");
        alone += usize::from(*notes == 0);
    }
    eprintln!("{alone} of {} example specs: VJP kernels alone agree with the evaluator", results.len());
    assert!(alone * 10 >= results.len() * 9, "VJP kernels took only {alone} of {} example specs", results.len());
    alone
}

/// Example specs with a launch VJP kernels refuse, with the reason: a `while` loop that reads
/// back what it stored (Newton's iteration in place; VJP kernels recompute a `while` loop's
/// loads from memory as the forward left it). The evaluator differentiates that launch.
const BY_EVALUATOR: &[&str] = &["cube_root.toml"];

#[test]
fn vjp_kernels_give_the_evaluators_ground_truth_on_every_example() {
    // Every one but those with a refused launch, `while` loops (the KL divergence's) included.
    assert_eq!(against_the_evaluator(1e-12, |o| o), example_specs().len() - BY_EVALUATOR.len());
}

/// At native precision VJP kernels compute in f32: on every example spec they take, their ground
/// truth agrees with the f64 evaluator's within f32's rounding (and the native forward's, for
/// kernels in f16 or bf16; measured: at most 7.3e-7, flash attention).
#[test]
fn f32_vjp_kernels_agree_with_the_f64_ground_truth_within_rounding() {
    against_the_evaluator(1e-5, |o| CheckOptions { precision: tilegrad_ad::Precision::Native, ..o });
}

/// With no memory to spare for tapes, a VJP kernel's launch runs its programs one per launch
/// (each with its own tapes' slots), its loops keeping checkpoints and running each segment
/// again: on the reference, which adds into the shadows in program order either way, the
/// ground truth is the same bit for bit. The specs with loops whose
/// carried values the reverse reads: flash attention, layer norm's row blocks, KL divergence's
/// `while` loop.
#[test]
fn batched_vjp_launches_give_the_same_ground_truth_bit_for_bit() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    for name in ["flash_attention.toml", "layer_norm.toml", "kl_div.toml"] {
        let sp = spec::load(&dir.join(name)).unwrap();
        let opts = CheckOptions { ground: Ground::Kernels, ..sp.options.clone() };
        let evaluator = ground_truth(&sp.forward, &sp.inputs, &sp.options).unwrap();
        let whole = ground_truth(&sp.forward, &sp.inputs, &opts).unwrap();
        let one = ground_truth(&sp.forward, &sp.inputs, &CheckOptions { vjp_memory: Some(0), ..opts }).unwrap();
        for (((n, e), (_, w)), (_, g)) in evaluator.gradients.iter().zip(&whole.gradients).zip(&one.gradients) {
            let (e, w, g) = (e.to_f64_vec(), w.to_f64_vec(), g.to_f64_vec());
            assert!(w.iter().any(|&x| x != 0.0), "{name}: the gradient of `{n}` is zero");
            let same = w.iter().zip(&g).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{name}: the gradient of `{n}` differs when programs run one per launch");
            // And it is the evaluator's (an independent computation of the same ground truth).
            let norm = e.iter().map(|x| x * x).sum::<f64>().sqrt();
            let diff = e.iter().zip(&g).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
            assert!(diff <= 1e-12 * norm, "{name}: the gradient of `{n}` differs from the evaluator's by {diff:e}");
        }
    }
}

/// A check with `--ground kernels` whose forward has a launch VJP kernels refuse (a `while` loop
/// that reads back what it stored): that launch's ground truth comes from the evaluator, with a
/// note naming the refused load; the verdicts are those of `--ground
/// evaluator`: the correct backward passes, its broken variants fail alike.
#[test]
fn a_refused_launch_is_differentiated_by_the_evaluator_with_a_note() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/cube_root.toml");
    for variant in [None, Some("cube_root_bwd_broken_factor"), Some("cube_root_bwd_broken_mask")] {
        let o: Vec<spec::KernelOverride> =
            variant.iter().map(|v| spec::KernelOverride { key: "bwd".into(), reference: format!("::{v}") }).collect();
        let sp = spec::load_with(&path, &o).unwrap();
        let bwd = sp.backward.as_ref().unwrap();
        let evaluator = check_backward(&sp.forward, bwd, &sp.inputs, &sp.options).unwrap();
        let kernels =
            check_backward(&sp.forward, bwd, &sp.inputs, &CheckOptions { ground: Ground::Kernels, ..sp.options.clone() }).unwrap();
        assert_eq!(kernels.passed, variant.is_none(), "{variant:?}:\n{kernels}");
        assert_eq!(evaluator.passed, kernels.passed, "{variant:?}");
        let kinds = |r: &tilegrad::check::Report| r.findings.iter().map(|f| (f.kind, f.locations.clone())).collect::<Vec<_>>();
        assert_eq!(kinds(&evaluator), kinds(&kernels), "{variant:?}");
        assert!(evaluator.notes.iter().all(|n| n.kind != FindingKind::GroundByEvaluator), "{evaluator}");
        let [n] = &kernels.notes[..] else { panic!("{variant:?}: one note expected:\n{kernels}") };
        assert_eq!((n.kind, n.pass, n.step), (FindingKind::GroundByEvaluator, "forward", Some(1)), "{n:?}");
        assert_eq!((n.locations[0].op.as_str(), n.locations[0].line), ("load", 21), "{n:?}");
        let text = kernels.to_string();
        assert!(text.contains("notes on the ground truth (not failures)") && text.contains("ground truth by the evaluator"), "{text}");
        // Strict checks fail on what kernels rely on, not on how the truth was computed.
        let strict =
            check_backward(&sp.forward, bwd, &sp.inputs, &CheckOptions { ground: Ground::Kernels, strict: true, ..sp.options.clone() });
        assert_eq!(strict.unwrap().passed, kernels.passed, "{variant:?}");
    }
}
