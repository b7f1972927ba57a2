//! Counter-based random draws that give the same values on the host and on the device.
//!
//! Element `i` of a draw keyed by `key` is a function of `(key, i)` alone (Philox4x32-10, then a
//! transform to the distribution), so that a tensor can be drawn in any order, on any number of
//! threads, or on the device, and be the same bit for bit. The transforms use only operations
//! IEEE 754 rounds exactly (`+ - * /`, square root, conversions) in one fixed order: the
//! logarithm and the sine and cosine of Box-Muller are this module's own polynomials, not the
//! platform's (whose last bits differ between C libraries and CUDA), with the same coefficients
//! in both. The CUDA C below writes each operation as an `_rn` intrinsic, so that the compiler
//! neither fuses a multiply and an add nor reorders anything.
//!
//! [`cuda_source`] is the device form of [`uniform_at`] and [`normal_at`]; a test on the device
//! (`tests/gpu.rs`) compares the two bit for bit.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Philox4x32-10 of counter `ctr` under `key`: 128 random bits as two words.
pub fn philox(key: u64, ctr: u64) -> (u64, u64) {
    let (mut k0, mut k1) = (key as u32, (key >> 32) as u32);
    let mut c = [ctr as u32, (ctr >> 32) as u32, 0, 0];
    for _ in 0..10 {
        let p0 = u64::from(M0) * u64::from(c[0]);
        let p1 = u64::from(M1) * u64::from(c[2]);
        c = [(p1 >> 32) as u32 ^ c[1] ^ k0, p1 as u32, (p0 >> 32) as u32 ^ c[3] ^ k1, p0 as u32];
        k0 = k0.wrapping_add(W0);
        k1 = k1.wrapping_add(W1);
    }
    (u64::from(c[0]) | u64::from(c[1]) << 32, u64::from(c[2]) | u64::from(c[3]) << 32)
}

/// 2^-53.
const ULP53: f64 = 1.0 / 9_007_199_254_740_992.0;

/// Element `i` uniform on `[0, 1)`: a multiple of 2^-53.
pub fn uniform_at(key: u64, i: u64) -> f64 {
    (philox(key, i).0 >> 11) as f64 * ULP53
}

/// Element `i` of 64 random bits (integer draws: `(bits * range) >> 64`).
pub fn bits_at(key: u64, i: u64) -> u64 {
    philox(key, i).1
}

/// Element `i` standard normal: elements `2p` and `2p + 1` are the cosine and sine halves of one
/// Box-Muller pair ([`normal_pair`]).
pub fn normal_at(key: u64, i: u64) -> f64 {
    let (c, s) = normal_pair(key, i >> 1);
    if i & 1 == 0 {
        c
    } else {
        s
    }
}

/// Standard normal elements `2p` and `2p + 1`.
pub fn normal_pair(key: u64, p: u64) -> (f64, f64) {
    let (a, b) = philox(key, p);
    // (0, 1], exactly: 1 - j 2^-53.
    let u1 = 1.0 - (a >> 11) as f64 * ULP53;
    let rad = (-2.0 * ln(u1)).sqrt();
    let (s, c) = sincos_turns(b >> 11);
    (rad * c, rad * s)
}

/// `ln 2` in two parts: the high part's last 21 bits are zero, so that `e * LN2_HI` is exact.
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
const SQRT2: f64 = std::f64::consts::SQRT_2;

/// `2 / (2k + 1)`, `k = 0..12`: `ln m = s * sum(c_k s^2k)` with `s = (m - 1) / (m + 1)`.
fn ln_coefficients() -> [f64; 12] {
    std::array::from_fn(|k| 2.0 / (2 * k + 1) as f64)
}

/// `(-1)^n / (2n + 1)!` and `(-1)^n / (2n)!`, `n = 0..10`: the Taylor series of sine and cosine.
fn sin_cos_coefficients() -> ([f64; 10], [f64; 10]) {
    let fact = |n: u32| (1..=n).map(f64::from).product::<f64>();
    let sign = |n: usize| if n % 2 == 0 { 1.0 } else { -1.0 };
    (std::array::from_fn(|n| sign(n) / fact(2 * n as u32 + 1)), std::array::from_fn(|n| sign(n) / fact(2 * n as u32)))
}

/// `sum(c[k] z^k)` by Horner's rule, highest term first.
fn horner(c: &[f64], z: f64) -> f64 {
    c.iter().rev().fold(0.0, |p, &ck| p * z + ck)
}

/// The natural logarithm of a normal positive `x` (within a few units in the last place).
fn ln(x: f64) -> f64 {
    let bits = x.to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let mut m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
    if m > SQRT2 {
        m *= 0.5;
        e += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let p = horner(&ln_coefficients(), s * s);
    let e = e as f64;
    e * LN2_HI + (s * p + e * LN2_LO)
}

/// Sine and cosine of `2 pi j 2^-53` turns, `j < 2^53`: reduced exactly to a quarter turn.
fn sincos_turns(j: u64) -> (f64, f64) {
    // j / 2^53 turns = k quarters + r / 2^55 turns, |r| <= 2^52 (exact in integers).
    let j4 = j << 2;
    let k = (j4 + (1 << 52)) >> 53;
    let r = j4 as i64 - (k << 53) as i64;
    let x = r as f64 * (ULP53 * 0.25) * std::f64::consts::TAU;
    let z = x * x;
    let (sc, cc) = sin_cos_coefficients();
    let (s, c) = (x * horner(&sc, z), horner(&cc, z));
    match k & 3 {
        0 => (s, c),
        1 => (c, -s),
        2 => (-s, -c),
        _ => (-c, s),
    }
}

/// The exact bits of `x` as a CUDA C double expression.
fn bits(x: f64) -> String {
    format!("__longlong_as_double({:#018x}ULL)", x.to_bits())
}

/// Horner's rule over `c` in CUDA C, each step rounded alone.
fn cuda_horner(c: &[f64], z: &str) -> String {
    c.iter().rev().skip(1).fold(bits(*c.last().expect("coefficients")), |p, &ck| format!("__dadd_rn(__dmul_rn({p}, {z}), {})", bits(ck)))
}

/// The device form of the draws: `tg_philox`, `tg_uniform_at`, `tg_normal_at`, and the kernel
/// `tg_draw_normal(double* or float* out, n, key, mean, std, f32)`, which writes
/// `mean + std * normal_at(key, i)` for `i < n` as f64, or rounded to f32 where `f32` is set,
/// and `tg_draw_uniform(out, n, key, lo, hi, f32)`, the uniform values on `[lo, hi)` of the
/// host's inputs (`lo + (hi - lo) * uniform_at(key, i)`, kept in range).
pub fn cuda_source() -> String {
    let (sc, cc) = sin_cos_coefficients();
    format!(
        r#"
typedef unsigned long long u64;
typedef unsigned int u32;
__device__ void tg_philox(u64 key, u64 ctr, u64* a, u64* b) {{
    u32 k0 = (u32)key, k1 = (u32)(key >> 32);
    u32 c0 = (u32)ctr, c1 = (u32)(ctr >> 32), c2 = 0, c3 = 0;
    for (int r = 0; r < 10; ++r) {{
        u32 h0 = __umulhi({M0:#x}u, c0), l0 = {M0:#x}u * c0;
        u32 h1 = __umulhi({M1:#x}u, c2), l1 = {M1:#x}u * c2;
        u32 n0 = h1 ^ c1 ^ k0, n2 = h0 ^ c3 ^ k1;
        c0 = n0; c1 = l1; c2 = n2; c3 = l0;
        k0 += {W0:#x}u; k1 += {W1:#x}u;
    }}
    *a = (u64)c0 | ((u64)c1 << 32);
    *b = (u64)c2 | ((u64)c3 << 32);
}}
__device__ double tg_ln(double x) {{
    u64 bits = (u64)__double_as_longlong(x);
    long long e = (long long)((bits >> 52) & 0x7ff) - 1023;
    double m = __longlong_as_double((long long)((bits & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL));
    if (m > {sqrt2}) {{ m = __dmul_rn(m, 0.5); e += 1; }}
    double s = __ddiv_rn(__dsub_rn(m, 1.0), __dadd_rn(m, 1.0));
    double z = __dmul_rn(s, s);
    double p = {ln_poly};
    double ef = (double)e;
    return __dadd_rn(__dmul_rn(ef, {ln2_hi}), __dadd_rn(__dmul_rn(s, p), __dmul_rn(ef, {ln2_lo})));
}}
__device__ void tg_sincos_turns(u64 j, double* s, double* c) {{
    u64 j4 = j << 2;
    u64 k = (j4 + (1ULL << 52)) >> 53;
    long long r = (long long)j4 - (long long)(k << 53);
    double x = __dmul_rn(__dmul_rn((double)r, {quarter_ulp}), {tau});
    double z = __dmul_rn(x, x);
    double sn = __dmul_rn(x, {sin_poly});
    double cs = {cos_poly};
    switch (k & 3) {{
        case 0: *s = sn; *c = cs; break;
        case 1: *s = cs; *c = -sn; break;
        case 2: *s = -sn; *c = -cs; break;
        default: *s = -cs; *c = sn; break;
    }}
}}
__device__ double tg_uniform_at(u64 key, u64 i) {{
    u64 a, b;
    tg_philox(key, i, &a, &b);
    return __dmul_rn((double)(a >> 11), {ulp53});
}}
__device__ double tg_normal_at(u64 key, u64 i) {{
    u64 a, b;
    tg_philox(key, i >> 1, &a, &b);
    double u1 = __dsub_rn(1.0, __dmul_rn((double)(a >> 11), {ulp53}));
    double rad = __dsqrt_rn(__dmul_rn(-2.0, tg_ln(u1)));
    double s, c;
    tg_sincos_turns(b >> 11, &s, &c);
    return __dmul_rn(rad, (i & 1) ? s : c);
}}
extern "C" __global__ void tg_draw_normal(void* out, u64 n, u64 key, double mean, double sd, int f32) {{
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {{
        double v = __dadd_rn(mean, __dmul_rn(sd, tg_normal_at(key, i)));
        if (f32) ((float*)out)[i] = __double2float_rn(v); else ((double*)out)[i] = v;
    }}
}}
extern "C" __global__ void tg_draw_uniform(void* out, u64 n, u64 key, double lo, double hi, int f32) {{
    double w = __dsub_rn(hi, lo);
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {{
        double u = tg_uniform_at(key, i);
        double x = isfinite(w) ? __dadd_rn(lo, __dmul_rn(w, u)) : __dadd_rn(__dmul_rn(lo, __dsub_rn(1.0, u)), __dmul_rn(hi, u));
        x = x < hi ? fmax(x, lo) : lo;
        if (f32) ((float*)out)[i] = __double2float_rn(x); else ((double*)out)[i] = x;
    }}
}}
"#,
        sqrt2 = bits(SQRT2),
        ln_poly = cuda_horner(&ln_coefficients(), "z"),
        ln2_hi = bits(LN2_HI),
        ln2_lo = bits(LN2_LO),
        quarter_ulp = bits(ULP53 * 0.25),
        tau = bits(std::f64::consts::TAU),
        sin_poly = cuda_horner(&sc, "z"),
        cos_poly = cuda_horner(&cc, "z"),
        ulp53 = bits(ULP53),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The polynomials against the platform's functions, over the whole range the draws use.
    #[test]
    fn the_logarithm_sine_and_cosine_are_accurate_to_a_few_ulps() {
        let mut worst = (0.0f64, 0.0f64);
        for i in 0..200_000u64 {
            let (a, b) = philox(7, i);
            let u = 1.0 - (a >> 11) as f64 * ULP53;
            let want = u.ln();
            if want != 0.0 {
                worst.0 = worst.0.max(((ln(u) - want) / want).abs());
            }
            let j = b >> 11;
            let (s, c) = sincos_turns(j);
            let (ws, wc) = (std::f64::consts::TAU * (j as f64 * ULP53)).sin_cos();
            worst.1 = worst.1.max((s - ws).abs()).max((c - wc).abs());
        }
        assert!(worst.0 < 1e-15, "ln: relative error {:e}", worst.0);
        assert!(worst.1 < 4e-15, "sincos: absolute error {:e}", worst.1);
        // Edges: the smallest u1, and the quarter turns.
        assert!((ln(ULP53) - ULP53.ln()).abs() < 1e-14);
        assert_eq!(ln(1.0), 0.0);
        let q = |j: u64| sincos_turns(j);
        assert_eq!(q(0), (0.0, 1.0));
        assert!((q(1 << 51).0 - 1.0).abs() < 1e-16 && q(1 << 51).1.abs() < 1e-16);
    }

    /// Known answers of Philox4x32-10 (Random123's test vectors, counter and key all zero and
    /// all ones).
    #[test]
    fn philox_gives_the_published_known_answers() {
        let (a, b) = philox(0, 0);
        assert_eq!([a as u32, (a >> 32) as u32, b as u32, (b >> 32) as u32], [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]);
    }

    /// Standard normal moments, and uniform ones, over a million draws; neighbouring keys and
    /// the two halves of a pair are uncorrelated.
    #[test]
    fn the_draws_have_the_moments_of_their_distributions() {
        let n = 1_000_000u64;
        let xs: Vec<f64> = (0..n).map(|i| normal_at(42, i)).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        let kurt = xs.iter().map(|x| (x - mean).powi(4)).sum::<f64>() / n as f64 / var.powi(2);
        assert!(mean.abs() < 5e-3 && (var - 1.0).abs() < 5e-3 && (kurt - 3.0).abs() < 3e-2, "{mean} {var} {kurt}");
        let pair: f64 = (0..n / 2).map(|p| xs[2 * p as usize] * xs[2 * p as usize + 1]).sum::<f64>() / (n / 2) as f64;
        let keys: f64 = (0..n).map(|i| normal_at(42, i) * normal_at(43, i)).sum::<f64>() / n as f64;
        assert!(pair.abs() < 5e-3 && keys.abs() < 5e-3, "{pair} {keys}");
        let u: Vec<f64> = (0..n).map(|i| uniform_at(9, i)).collect();
        assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
        let um = u.iter().sum::<f64>() / n as f64;
        assert!((um - 0.5).abs() < 2e-3, "{um}");
    }
}
