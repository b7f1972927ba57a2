//! Triton's random numbers (`tl.randint`, `tl.randint4x`, `tl.rand`, `tl.randn`, `tl.philox`,
//! `tl.umulhi`) converted from Triton source and run by the reference interpreter, against a
//! plain-Rust Philox written from `triton/language/random.py` and against constants printed by
//! `random_values.py` (standard-library Python following the same file), bit for bit.

use tilegrad_ir::triton::{convert, ConvertOptions};
use tilegrad_ir::{DType, Kernel};
use tilegrad_reference::{HostTensor, Launch, Memory};

// ---- the generator, written from Triton's random.py -----------------------------------------------

const ROUND_A: u32 = 0xD251_1F53;
const ROUND_B: u32 = 0xCD9E_8D57;
const KEY_A: u32 = 0x9E37_79B9;
const KEY_B: u32 = 0xBB67_AE85;

fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = a as u64 * b as u64;
    ((p >> 32) as u32, p as u32)
}

/// Philox-4x32 with the key of `seed` (as 64 bits) and `rounds` rounds.
fn philox(seed: u64, mut c: [u32; 4], rounds: u32) -> [u32; 4] {
    let mut k = [seed as u32, (seed >> 32) as u32];
    for _ in 0..rounds {
        let (hi_b, lo_b) = mulhilo(ROUND_B, c[2]);
        let (hi_a, lo_a) = mulhilo(ROUND_A, c[0]);
        c = [hi_b ^ c[1] ^ k[0], lo_b, hi_a ^ c[3] ^ k[1], lo_a];
        k = [k[0].wrapping_add(KEY_A), k[1].wrapping_add(KEY_B)];
    }
    c
}

/// `randint4x(seed, offset)` for an i64 offset (high word used) or an i32 one (`wide` false).
fn randint4x(seed: i64, offset: i64, wide: bool) -> [u32; 4] {
    let hi = if wide { (offset >> 32) as u32 } else { 0 };
    philox(seed as u64, [offset as u32, hi, 0, 0], 10)
}

/// `uint_to_uniform_float` of a 32-bit word.
fn uniform(x: u32) -> f32 {
    let x = x as i32;
    let x = if x < 0 { x.wrapping_neg().wrapping_sub(1) } else { x };
    x as f32 * (4.6566127342e-10_f64 as f32)
}

/// `randn`: Box-Muller on the first two words (log and cos evaluated in f64 and rounded, as the
/// IR's f32 transcendentals are).
fn randn(seed: i64, offset: i64, wide: bool) -> f32 {
    let w = randint4x(seed, offset, wide);
    let (u1, u2) = (uniform(w[0]).max(1.0e-7_f32), uniform(w[1]));
    // Triton writes 2 pi as the literal 6.283185307179586, which is TAU.
    let th = (std::f64::consts::TAU as f32) * u2;
    let r = (-2.0_f32 * ((u1 as f64).ln() as f32)).sqrt();
    r * ((th as f64).cos() as f32)
}

// ---- kernels --------------------------------------------------------------------------------------

const SRC: &str = r#"
import triton
import triton.language as tl

@triton.jit
def draw(out_ptr, seed, offs_ptr, n, KIND: tl.constexpr):
    i = tl.arange(0, 8)
    m = i < n
    offs = tl.load(offs_ptr + i, mask=m)
    if KIND == 0:
        tl.store(out_ptr + i, tl.randint(seed, offs), mask=m)
    elif KIND == 1:
        tl.store(out_ptr + i, tl.rand(seed, offs), mask=m)
    elif KIND == 2:
        tl.store(out_ptr + i, tl.randn(seed, offs), mask=m)
    else:
        a, b, c, d = tl.randint4x(seed, offs)
        tl.store(out_ptr + 4 * i, a, mask=m)
        tl.store(out_ptr + 4 * i + 1, b, mask=m)
        tl.store(out_ptr + 4 * i + 2, c, mask=m)
        tl.store(out_ptr + 4 * i + 3, d, mask=m)

@triton.jit
def draw_const_seed(out_ptr, offs_ptr, SEED: tl.constexpr, ROUNDS: tl.constexpr):
    i = tl.arange(0, 4)
    m = i < 3
    offs = tl.load(offs_ptr + i, mask=m)
    if SEED == 0:
        # A Python int beyond i32 is an i64 seed.
        a, b, c, d = tl.random.randint4x(0x123456789ABCDEF, offs, n_rounds=ROUNDS)
    else:
        a, b, c, d = tl.random.randint4x(SEED, offs, n_rounds=ROUNDS)
    tl.store(out_ptr + 4 * i, a, mask=m)
    tl.store(out_ptr + 4 * i + 1, b, mask=m)
    tl.store(out_ptr + 4 * i + 2, c, mask=m)
    tl.store(out_ptr + 4 * i + 3, d, mask=m)

@triton.jit
def raw(out_ptr, c_ptr, k0, k1):
    i = tl.arange(0, 4)
    c = tl.load(c_ptr + i)
    c0 = tl.sum(tl.where(i == 0, c, 0))
    c1 = tl.sum(tl.where(i == 1, c, 0))
    c2 = tl.sum(tl.where(i == 2, c, 0))
    c3 = tl.sum(tl.where(i == 3, c, 0))
    a, b, x, y = tl.philox_impl(c0, c1, c2, c3, k0, k1)
    tl.store(out_ptr + i, tl.where(i == 0, a, tl.where(i == 1, b, tl.where(i == 2, x, y))))

@triton.jit
def mulhi(out_ptr, a_ptr, b_ptr):
    i = tl.arange(0, 4)
    tl.store(out_ptr + i, tl.umulhi(tl.load(a_ptr + i), tl.load(b_ptr + i)))
"#;

/// `draw` with offsets of `od` and a runtime seed of `sd`, for `kind` (0 randint, 1 rand,
/// 2 randn, 3 randint4x).
fn draw_kernel(kind: i64, sd: DType, od: DType, out: DType) -> Kernel {
    let opts = ConvertOptions::with_constexprs(&[("KIND", kind)]);
    let opts = ConvertOptions {
        scalar_dtypes: vec![("seed".into(), sd)],
        pointer_dtypes: vec![("offs_ptr".into(), od), ("out_ptr".into(), out)],
        ..opts
    };
    convert(SRC, "random.py", "draw", &opts).unwrap()
}

fn offsets_tensor(offs: &[i64], wide: bool) -> HostTensor {
    if wide {
        HostTensor::from_i64(&[offs.len()], offs.to_vec())
    } else {
        HostTensor::from_i32(&[offs.len()], offs.iter().map(|&o| o as i32).collect())
    }
}

/// Runs `draw` and returns its output tensor.
fn run_draw(kind: i64, seed: i64, offs: &[i64], wide: bool) -> HostTensor {
    let (sd, od) = (if i32::try_from(seed).is_ok() { DType::I32 } else { DType::I64 }, if wide { DType::I64 } else { DType::I32 });
    let out_dt = if matches!(kind, 1 | 2) { DType::F32 } else { DType::I32 };
    let n = offs.len();
    assert!(n <= 8);
    let k = draw_kernel(kind, sd, od, out_dt);
    let mut mem = Memory::new();
    let o = mem.add("offs", offsets_tensor(offs, wide));
    let y = mem.add("out", HostTensor::zeros(out_dt, &[if kind == 3 { 4 * n } else { n }]));
    let l = Launch::new(&k, 1).arg("out_ptr", y).arg("offs_ptr", o).arg("n", n as i32);
    let l = if sd == DType::I32 { l.arg("seed", seed as i32) } else { l.arg("seed", seed) };
    l.run(&mut mem).unwrap();
    mem[y].clone()
}

fn words(t: &HostTensor) -> Vec<u32> {
    t.as_i32().unwrap().iter().map(|&x| x as u32).collect()
}

fn bits(t: &HostTensor) -> Vec<u32> {
    t.as_f32().unwrap().iter().map(|x| x.to_bits()).collect()
}

/// Seeds and offsets: i32 and i64 seeds (one at and above 2^31, one negative), i32 offsets
/// (negative ones too) and i64 offsets beyond 2^32.
const CASES: &[(i64, &[i64], bool)] = &[
    (0, &[0, 1, 2, 3, 15], false),
    (42, &[0, 1, 2, 1000, -1, i32::MIN as i64], false),
    (-7, &[0, 5, 123_456_789], false),
    ((1 << 31) + 5, &[3, 77], false),
    (0x0123_4567_89AB_CDEF, &[0, (1 << 32) + 3, -5, 1 << 40], true),
    (-(1 << 40) - 3, &[9, -(1 << 33) - 1], true),
];

// ---- tests ----------------------------------------------------------------------------------------

#[test]
fn randint4x_and_randint_match_the_plain_philox() {
    for &(seed, offs, wide) in CASES {
        let all = words(&run_draw(3, seed, offs, wide));
        let first = words(&run_draw(0, seed, offs, wide));
        for (j, &o) in offs.iter().enumerate() {
            let want = randint4x(seed, o, wide);
            assert_eq!(all[4 * j..4 * j + 4], want, "randint4x(seed {seed}, offset {o})");
            assert_eq!(first[j], want[0], "randint(seed {seed}, offset {o})");
        }
    }
}

#[test]
fn rand_and_randn_match_the_plain_philox_bit_for_bit() {
    for &(seed, offs, wide) in CASES {
        let u = bits(&run_draw(1, seed, offs, wide));
        let n = bits(&run_draw(2, seed, offs, wide));
        for (j, &o) in offs.iter().enumerate() {
            let w = randint4x(seed, o, wide);
            assert_eq!(u[j], uniform(w[0]).to_bits(), "rand(seed {seed}, offset {o})");
            assert!((0.0..1.0).contains(&f32::from_bits(u[j])));
            assert_eq!(n[j], randn(seed, o, wide).to_bits(), "randn(seed {seed}, offset {o})");
        }
    }
}

/// The constants `python3 reference/tests/random_values.py` prints (its randint4x words as i32,
/// its rand and randn values as f32 bits).
#[test]
fn values_match_the_python_transcription() {
    let s42 = words(&run_draw(3, 42, &[0, 1, 2, 1000, -1, i32::MIN as i64], false));
    let want: [[i32; 4]; 6] = [
        [-1662324653, 2012563771, 314527917, 1463989207],
        [-52747993, 1404726525, -2087757202, 1951270651],
        [-747896283, -1467523637, -1706201703, -972446375],
        [-940337800, -1371226260, -1179606597, -198353332],
        [1847857886, 1104473237, 702365196, -1361744646],
        [737797595, 807393782, 1636068335, -368308876],
    ];
    let want: Vec<u32> = want.iter().flatten().map(|&x| x as u32).collect();
    assert_eq!(s42, want);
    let rand = bits(&run_draw(1, 42, &[0, 1, 2, 1000, -1, i32::MIN as i64], false));
    assert_eq!(rand, [0x3f462a1e, 0x3cc937b5, 0x3eb24ff6, 0x3ee031a9, 0x3f5c4825, 0x3eafe796]);
    let randn = bits(&run_draw(2, 42, &[0, 1, 2, 1000, -1, i32::MIN as i64], false));
    assert_eq!(randn, [0x3f291df5, 0xbfc577a3, 0xbf17289f, 0xbf540cbc, 0xbf0bc6ad, 0xbf851c14]);
    // A negative i32 seed is sign-extended to 64 bits.
    assert_eq!(words(&run_draw(0, -7, &[0, 5], false)), [459167936u32, 2132393555]);
    // A seed of 2^31 + 5 is an i64.
    assert_eq!(bits(&run_draw(1, (1 << 31) + 5, &[3, 77], false)), [0x3f7cc013, 0x3eb3b969]);
    assert_eq!(bits(&run_draw(2, (1 << 31) + 5, &[3, 77], false)), [0xbe04652d, 0xbc8637cd]);
    // i64 offsets: the high word is the counter's second word.
    let wide = [0, (1 << 32) + 3, -5, 1 << 40];
    let w: Vec<i32> = words(&run_draw(0, 0x0123_4567_89AB_CDEF, &wide, true)).iter().map(|&x| x as i32).collect();
    assert_eq!(w, [-1202707922, -2033270946, 638472700, 1024019184]);
    assert_eq!(bits(&run_draw(2, 0x0123_4567_89AB_CDEF, &wide, true)), [0xbf84be9f, 0x3dc85f8d, 0x3fb077ba, 0xbf921209]);
}

#[test]
fn constant_seeds_and_rounds_fold_to_the_same_words() {
    for (seed, rounds) in [(42i64, 10i64), (42, 7), (-1, 10), (0, 3), (5, 0)] {
        let opts = ConvertOptions::with_constexprs(&[("SEED", seed), ("ROUNDS", rounds)]);
        let opts = ConvertOptions { default_pointer_dtype: DType::I32, ..opts };
        let k = convert(SRC, "random.py", "draw_const_seed", &opts).unwrap();
        let mut mem = Memory::new();
        let o = mem.add("offs", HostTensor::from_i32(&[4], vec![9, -2, 0, 0]));
        let y = mem.add("out", HostTensor::zeros(DType::I32, &[12]));
        Launch::new(&k, 1).arg("out_ptr", y).arg("offs_ptr", o).run(&mut mem).unwrap();
        let got = words(&mem[y]);
        for (j, off) in [9i64, -2, 0].into_iter().enumerate() {
            let key = if seed == 0 { 0x0123_4567_89AB_CDEF } else { seed as u64 };
            let want = philox(key, [off as u32, 0, 0, 0], rounds as u32);
            assert_eq!(got[4 * j..4 * j + 4], want, "seed {seed}, {rounds} rounds, offset {off}");
        }
    }
    // From random_values.py: seed 42, offset 9, 7 rounds.
    let want = [-1372514662i32, 90167255, 1520259890, -317130454].map(|x| x as u32);
    assert_eq!(philox(42, [9, 0, 0, 0], 7), want);
}

/// Philox-4x32-10's published known answers (Random123's `kat_vectors`), through
/// `tl.philox_impl` on runtime counters and keys.
#[test]
fn philox_impl_gives_the_published_known_answers() {
    let kats: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
        ([0; 4], [0; 2], [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]),
        ([u32::MAX; 4], [u32::MAX; 2], [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]),
        ([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0], [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]),
    ];
    let opts = ConvertOptions { pointer_dtypes: vec![("c_ptr".into(), DType::I32), ("out_ptr".into(), DType::I32)], ..Default::default() };
    let k = convert(SRC, "random.py", "raw", &opts).unwrap();
    for (c, key, want) in kats {
        let mut mem = Memory::new();
        let ct = mem.add("c", HostTensor::from_i32(&[4], c.iter().map(|&x| x as i32).collect()));
        let y = mem.add("out", HostTensor::zeros(DType::I32, &[4]));
        let l = Launch::new(&k, 1).arg("out_ptr", y).arg("c_ptr", ct);
        l.arg("k0", key[0] as i32).arg("k1", key[1] as i32).run(&mut mem).unwrap();
        assert_eq!(words(&mem[y]), want);
        assert_eq!(philox(key[0] as u64 | (key[1] as u64) << 32, c, 10), want);
    }
}

#[test]
fn umulhi_is_the_high_half_of_the_unsigned_product() {
    let (a, b) = (vec![-1, 3, i32::MIN, 0x1234_5678], vec![-1, 5, 2, -0x1234_5678]);
    let opts = ConvertOptions { default_pointer_dtype: DType::I32, ..Default::default() };
    let k = convert(SRC, "random.py", "mulhi", &opts).unwrap();
    let mut mem = Memory::new();
    let (at, bt) = (mem.add("a", HostTensor::from_i32(&[4], a.clone())), mem.add("b", HostTensor::from_i32(&[4], b.clone())));
    let y = mem.add("out", HostTensor::zeros(DType::I32, &[4]));
    Launch::new(&k, 1).arg("out_ptr", y).arg("a_ptr", at).arg("b_ptr", bt).run(&mut mem).unwrap();
    let want: Vec<u32> = a.iter().zip(&b).map(|(&x, &y)| mulhilo(x as u32, y as u32).0).collect();
    assert_eq!(words(&mem[y]), want);
    assert_eq!(want[..3], [0xFFFF_FFFE, 0, 1]);
}
