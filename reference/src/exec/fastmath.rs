//! A vectorisable f32 `exp`. libm's `expf` is a call per element and dominated row-softmax
//! launches; this computes e^x in f64 (range reduction to 2^k * 2^f with |f| <= 1/2, then a
//! degree-9 polynomial interpolating 2^f at Chebyshev nodes, relative error below 2e-14, its
//! coefficients computed in 60-digit arithmetic) and rounds once to f32, so it agrees
//! with the correctly rounded result except when e^x lies within ~1e-14 of a rounding boundary
//! (far more accurate than a GPU's `ex2.approx`-based `tl.exp`). The polynomial is evaluated with
//! fused multiply-adds: in hardware where the CPU has FMA (AVX2+FMA path, chosen at run time),
//! else by the correctly rounded software `mul_add`, so the result is identical on every CPU.

const LOG2E: f64 = std::f64::consts::LOG2_E;
/// 1.5 * 2^52: adding and subtracting it rounds an f64 of magnitude < 2^51 to an integer.
const SHIFT: f64 = 6755399441055744.0;

/// Coefficients of 2^f on [-1/2, 1/2], used by every backend's f32 `exp` (Chebyshev interpolation, degree 9, monomial form).
pub const C: [f64; 10] = [
    1.0000000000000135,
    0.6931471805599462,
    0.2402265069564034,
    0.05550410866465167,
    0.009618129193934313,
    0.0013333558200794592,
    0.0001540343375125101,
    1.5252672924850737e-05,
    1.325964524488711e-06,
    1.0205905413765595e-07,
];

#[inline(always)]
fn exp_core(x: f32) -> f32 {
    let t = (x as f64 * LOG2E).clamp(-200.0, 200.0);
    let s = t + SHIFT;
    let k = s - SHIFT;
    let f = t - k;
    let mut p = C[9];
    let mut i = 9;
    while i > 0 {
        i -= 1;
        p = p.mul_add(f, C[i]);
    }
    // k as an integer, read off the shifted value's mantissa (no float-to-int conversion).
    let ki = (s.to_bits() as i64).wrapping_sub(SHIFT.to_bits() as i64);
    let scale = f64::from_bits(((ki + 1023) as u64) << 52);
    let r = (p * scale) as f32;
    if x.is_nan() {
        x
    } else {
        r
    }
}

fn exp_generic(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| exp_core(v)).collect()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn exp_avx2(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| exp_core(v)).collect()
}

/// e^x for every element.
pub(crate) fn exp_f32(x: &[f32]) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports AVX2 and FMA (checked above).
        return unsafe { exp_avx2(x) };
    }
    exp_generic(x)
}

/// e^x of one value (same result as [`exp_f32`]; software `mul_add` where the compile target has
/// no FMA, so it is slower than the slice version).
pub(crate) fn exp1(x: f32) -> f32 {
    exp_core(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_correctly_rounded_exp() {
        // Against f64 exp rounded to f32 (correctly rounded except in astronomically rare ties).
        let mut worst_ulps = 0i64;
        let mut differ = 0;
        let n = 200_000;
        for i in 0..n {
            let x = -104.0 + 193.0 * (i as f32 / n as f32);
            let want = (x as f64).exp() as f32;
            let got = exp1(x);
            let ulps = (got.to_bits() as i64 - want.to_bits() as i64).abs();
            worst_ulps = worst_ulps.max(ulps);
            differ += (ulps != 0) as usize;
        }
        assert!(worst_ulps <= 1, "worst {worst_ulps} ulps");
        assert!(differ <= 2, "{differ} of {n} differ");
        let specials = [0.0f32, -0.0, 1.0, -1.0, 88.7, 88.8, -87.0, -103.0, -104.5, f32::INFINITY, f32::NEG_INFINITY];
        let got = exp_f32(&specials);
        // The vector (hardware FMA) and scalar (software FMA) paths agree bit for bit.
        let xs: Vec<f32> = (0..10_000).map(|i| -100.0 + 0.0187 * i as f32).collect();
        let v = exp_f32(&xs);
        assert!(xs.iter().zip(&v).all(|(x, e)| exp1(*x).to_bits() == e.to_bits()));
        for (x, g) in specials.iter().zip(&got) {
            assert_eq!(g.to_bits(), ((*x as f64).exp() as f32).to_bits(), "exp({x})");
            assert_eq!(g.to_bits(), exp1(*x).to_bits());
        }
        assert!(exp_f32(&[f32::NAN])[0].is_nan());
        assert_eq!(exp1(1e30), f32::INFINITY);
        assert_eq!(exp1(-1e30), 0.0);
    }
}
