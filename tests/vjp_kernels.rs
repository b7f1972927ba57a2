//! VJP kernels against the evaluator: the ground truth of every example spec computed both ways
//! (`Ground::Kernels`, each launch's VJP kernel run by the reference interpreter, against the
//! default CPU evaluator) agrees within 1e-12 (normwise, relative) on every gradient; a spec
//! whose kernels VJP kernels do not take yet fails with an error naming the op and its line.

use std::path::{Path, PathBuf};
use tilegrad::check::{ground_truth, CheckOptions, Ground};
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
/// evaluator's, every gradient within `tol` (normwise, relative). A spec VJP kernels do not take
/// must be refused clearly, and at least 9 in 10 must be taken. Returns how many were.
fn against_the_evaluator(tol: f64, opts: impl Fn(CheckOptions) -> CheckOptions + Sync) -> usize {
    let specs = example_specs();
    let opts = &opts;
    let results: Vec<(String, Result<usize, String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = specs
            .iter()
            .map(|p| {
                s.spawn(move || {
                    let sp = spec::load(p).unwrap();
                    let name = p.file_name().unwrap().to_string_lossy().into_owned();
                    let want = ground_truth(&sp.forward, &sp.inputs, &sp.options).unwrap();
                    let o = opts(CheckOptions { ground: Ground::Kernels, ..sp.options.clone() });
                    let got = match ground_truth(&sp.forward, &sp.inputs, &o) {
                        Ok(g) => g,
                        Err(e) => return (name, Err(e.to_string())),
                    };
                    let mut compared = 0;
                    for ((n, w), (m, g)) in want.gradients.iter().zip(&got.gradients) {
                        assert_eq!(n, m);
                        let (w, g) = (w.to_f64_vec(), g.to_f64_vec());
                        let norm = w.iter().map(|x| x * x).sum::<f64>().sqrt();
                        let diff = w.iter().zip(&g).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
                        assert!(diff <= tol * norm + 1e-300, "{name}: gradient of `{n}` differs by {diff:e} (norm {norm:e})");
                        compared += 1;
                    }
                    (name, Ok(compared))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut agreed = 0;
    for (name, r) in &results {
        match r {
            Ok(n) => {
                assert!(*n > 0, "{name}: no gradient compared");
                agreed += 1;
            }
            Err(e) => {
                eprintln!("{name}: {e}");
                assert!(e.contains("--ground kernels") && e.contains("not"), "{name}: an unclear refusal: {e}");
                assert!(REFUSED.contains(&name.as_str()), "{name}: refused, and not listed as refused: {e}");
            }
        }
    }
    eprintln!("{agreed} of {} example specs: VJP kernels agree with the evaluator", results.len());
    assert!(agreed * 10 >= results.len() * 9, "VJP kernels took only {agreed} of {} example specs", results.len());
    agreed
}

/// Example specs VJP kernels refuse, with the reason: a loop that loads what the kernel wrote in
/// an earlier trip (the chunked cumsum reads its previous chunk's output back), which VJP kernels
/// recompute from memory as the forward left it.
const REFUSED: &[&str] = &["chunk_cumsum.toml"];

#[test]
fn vjp_kernels_give_the_evaluators_ground_truth_on_every_example() {
    // Every one but those refused, `while` loops (the KL divergence's) included.
    assert_eq!(against_the_evaluator(1e-12, |o| o), example_specs().len() - REFUSED.len());
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
