//! Passes over a tensor's elements in fixed chunks on rayon's threads, their partial results
//! combined in chunk order: comparing tensors of tens of millions of elements takes a fraction
//! of a single thread's time, and every figure is the same bit for bit whatever the number of
//! threads (the chunks do not depend on it).

use rayon::prelude::*;
use std::ops::Range;

/// Elements per chunk.
pub const CHUNK: usize = 1 << 16;

/// `each` over the chunks of `0..n`, combined in order by `combine`; `None` for `n == 0`.
pub fn fold<P: Send>(n: usize, each: impl Fn(Range<usize>) -> P + Sync, combine: impl FnMut(P, P) -> P) -> Option<P> {
    let chunks = n.div_ceil(CHUNK);
    let parts: Vec<P> = (0..chunks).into_par_iter().map(|c| each(c * CHUNK..((c + 1) * CHUNK).min(n))).collect();
    parts.into_iter().reduce(combine)
}

/// The sum of `f(i)` over `0..n`, summed in order within each chunk, then the chunks' sums in
/// order.
pub fn sum(n: usize, f: impl Fn(usize) -> f64 + Sync) -> f64 {
    fold(n, |r| r.map(&f).sum::<f64>(), |a, b| a + b).unwrap_or(0.0)
}

/// The largest `f(i)` over `0..n` (NaNs ignored, as `f64::max` ignores them), `0` where `n == 0`
/// or every value is below it.
pub fn max(n: usize, f: impl Fn(usize) -> f64 + Sync) -> f64 {
    fold(n, |r| r.map(&f).fold(0.0, f64::max), f64::max).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_sums_and_maxima_are_those_of_the_elements_and_do_not_depend_on_the_threads() {
        let n = 3 * CHUNK + 1234;
        let v: Vec<f64> = (0..n).map(|i| ((i as f64) * 0.7).sin() * 1e3 + (i % 7) as f64).collect();
        let s = sum(n, |i| v[i]);
        let plain: f64 = v.iter().sum();
        approx::assert_relative_eq!(s, plain, max_relative = 1e-12);
        assert_eq!(max(n, |i| v[i]), v.iter().copied().fold(0.0, f64::max));
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let three = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        let a = one.install(|| sum(n, |i| v[i]));
        let b = three.install(|| sum(n, |i| v[i]));
        assert_eq!(a.to_bits(), b.to_bits());
        assert_eq!(sum(0, |i| v[i]), 0.0);
        // The first of equal maxima, as a sequential pass keeps it.
        let first = fold(
            n,
            |r| r.map(|i| (i, (v[i] / 100.0).round())).fold((0, f64::MIN), |a, b| if b.1 > a.1 { b } else { a }),
            |a, b| if b.1 > a.1 { b } else { a },
        );
        let seq = (0..n).map(|i| (i, (v[i] / 100.0).round())).fold((0, f64::MIN), |a, b| if b.1 > a.1 { b } else { a });
        assert_eq!(first, Some(seq));
    }
}
