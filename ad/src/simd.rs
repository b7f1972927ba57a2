//! Hot loops compiled for AVX2 where the CPU has it, chosen at run time.
//!
//! The crate is built for the baseline x86-64 (SSE2: two f64 lanes per instruction), so that
//! it runs on any x86-64 CPU. [`wide`] runs a closure inside a function compiled with AVX2
//! enabled: the closure and the loops it inlines are compiled for four lanes. Results are the
//! same bits either way: only the vector width changes (no fused multiply-adds are introduced,
//! and reductions keep their order).

/// `f()`, compiled for AVX2 where the CPU has it. Use it around a tight loop (an elementwise
/// map, a slice sum); the closure must be small enough to be inlined.
#[inline(always)]
pub(crate) fn wide<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked above).
            return unsafe { avx2(f) };
        }
    }
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(test)]
mod tests {
    #[test]
    fn wide_loops_give_the_bits_of_narrow_ones() {
        let x: Vec<f64> = (0..1001).map(|i| (i as f64 * 0.37).sin() * 1e3).collect();
        let narrow: Vec<f64> = x.iter().map(|&a| a * 1.1 + a / 3.0).collect();
        let wide = super::wide(|| x.iter().map(|&a| a * 1.1 + a / 3.0).collect::<Vec<f64>>());
        assert_eq!(narrow.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), wide.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    }
}
