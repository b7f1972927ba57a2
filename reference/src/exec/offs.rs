//! Pointer offsets. A pointer tile's element offsets are kept as i32 when they come straight from
//! i32 index arithmetic (Triton's usual `ptr + offs`), else as i64; the passes over them (bounds
//! scan, run-length encoding, order check) are generic over both. They use sign-bit and XOR
//! arithmetic instead of 64-bit compares so that they vectorise on baseline x86-64.

use super::program::Runs;

/// An offset element type: i32 or i64.
pub(crate) trait Off: Copy + Send + Sync + 'static {
    fn i(self) -> i64;
}
impl Off for i32 {
    #[inline(always)]
    fn i(self) -> i64 {
        self as i64
    }
}
impl Off for i64 {
    #[inline(always)]
    fn i(self) -> i64 {
        self
    }
}

/// Evaluates `$body` with `$ov` bound to the offsets slice, whatever its storage.
macro_rules! with_offs {
    ($data:expr, |$ov:ident| $body:expr) => {
        match $data {
            crate::tensor::Data::I32($ov) => $body,
            crate::tensor::Data::I64($ov) => $body,
            _ => unreachable!("pointer offsets are i32 or i64"),
        }
    };
}
pub(crate) use with_offs;

/// (some active lane is out of `[0, numel)`, every lane is active).
pub(crate) fn scan<T: Off>(ov: &[T], mask: Option<&[bool]>, numel: i64) -> (bool, bool) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked above).
        return unsafe { scan_avx2(ov, mask, numel) };
    }
    scan_impl(ov, mask, numel)
}

/// [`scan`] compiled for AVX2 (widening i32 offsets and bool masks is cheap there).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn scan_avx2<T: Off>(ov: &[T], mask: Option<&[bool]>, numel: i64) -> (bool, bool) {
    scan_impl(ov, mask, numel)
}

#[inline(always)]
fn scan_impl<T: Off>(ov: &[T], mask: Option<&[bool]>, numel: i64) -> (bool, bool) {
    // Out of bounds: `o < 0` or `o - numel >= 0`, i.e. the sign bit of `o | !(o - numel)`.
    match mask {
        Some(mv) => {
            let (bad, all) = ov.iter().zip(mv).fold((0i64, 1u8), |(bad, all), (&o, &m)| {
                let o = o.i();
                (bad | ((o | !o.wrapping_sub(numel)) & -(m as i64)), all & m as u8)
            });
            (bad < 0, all == 1)
        }
        None => {
            let bad = ov.iter().fold(0i64, |bad, &o| {
                let o = o.i();
                bad | (o | !o.wrapping_sub(numel))
            });
            (bad < 0, true)
        }
    }
}

/// Run-length encodes a slice of offsets.
pub(crate) fn runs<T: Off>(offs: &[T]) -> Runs {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked above).
        return unsafe { runs_avx2(offs) };
    }
    runs_impl(offs)
}

/// [`runs`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn runs_avx2<T: Off>(offs: &[T]) -> Runs {
    runs_impl(offs)
}

#[inline(always)]
fn runs_impl<T: Off>(offs: &[T]) -> Runs {
    const CHUNK: usize = 64;
    let mut runs: Runs = Vec::new();
    let mut i = 0;
    while i < offs.len() {
        let start = offs[i].i();
        let mut j = i + 1;
        // Whole chunks that continue the run, tested with XOR/OR, then the tail one by one.
        while j + CHUNK <= offs.len() && (j - i) + CHUNK < u32::MAX as usize {
            let base = start + (j - i) as i64;
            let diff = offs[j..j + CHUNK].iter().zip(0i64..).fold(0i64, |acc, (&o, k)| acc | (o.i() ^ (base + k)));
            if diff != 0 {
                break;
            }
            j += CHUNK;
        }
        while j < offs.len() && offs[j].i() == start + (j - i) as i64 && j - i < u32::MAX as usize {
            j += 1;
        }
        runs.push((start, (j - i) as u32));
        i = j;
    }
    runs
}

/// True when the offsets strictly increase (so no element repeats).
pub(crate) fn increasing<T: Off>(ov: &[T]) -> bool {
    ov.windows(2).all(|w| w[0].i() < w[1].i())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_finds_out_of_bounds_active_lanes_only() {
        assert_eq!(scan(&[0i64, 5, 9], None, 10), (false, true));
        assert_eq!(scan(&[0i64, 10], None, 10), (true, true));
        assert_eq!(scan(&[-1i32, 3], None, 10), (true, true));
        assert_eq!(scan(&[-1i32, 3], Some(&[false, true]), 10), (false, false));
        assert_eq!(scan(&[i64::MIN, i64::MAX], Some(&[true, false]), 10), (true, false));
        assert_eq!(scan(&[i32::MAX], None, i64::MAX), (false, true));
    }

    #[test]
    fn runs_split_at_gaps_and_long_runs_stay_whole() {
        assert_eq!(runs(&[3i32, 4, 5, 9, 10, 2]), vec![(3, 3), (9, 2), (2, 1)]);
        let long: Vec<i64> = (100..400).chain(500..501).collect();
        assert_eq!(runs(&long), vec![(100, 300), (500, 1)]);
        let mut broken: Vec<i64> = (0..200).collect();
        broken[130] = 7;
        assert_eq!(runs(&broken), vec![(0, 130), (7, 1), (131, 69)]);
        assert!(runs::<i64>(&[]).is_empty());
    }
}
