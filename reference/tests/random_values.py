"""Triton's Philox random numbers in plain Python (standard library only), for the constants of
`random.rs`: run `python3 random_values.py` to print them again.

Follows `triton/language/random.py`: `randint4x(seed, offset)` runs Philox-4x32 (10 rounds) on the
counter (offset_lo, offset_hi, 0, 0) with the key (seed_lo, seed_hi) of the seed as 64 bits
(sign-extended); `rand` maps the first word to [0, 1) in f32; `randn` is Box-Muller on the first
two words, each f32 op rounded once (log and cos evaluated in f64 and rounded, as tilegrad does).
"""
import math
import struct

M32 = 0xFFFFFFFF
ROUND_A, ROUND_B = 0xD2511F53, 0xCD9E8D57
KEY_A, KEY_B = 0x9E3779B9, 0xBB67AE85


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def philox(seed, c, rounds=10):
    s = seed & (2**64 - 1)
    k0, k1 = s & M32, s >> 32
    c0, c1, c2, c3 = c
    for _ in range(rounds):
        c0, c1, c2, c3 = (
            ((ROUND_B * c2) >> 32) ^ c1 ^ k0,
            (ROUND_B * c2) & M32,
            ((ROUND_A * c0) >> 32) ^ c3 ^ k1,
            (ROUND_A * c0) & M32,
        )
        k0, k1 = (k0 + KEY_A) & M32, (k1 + KEY_B) & M32
    return c0, c1, c2, c3


def randint4x(seed, offset, offset_bits=32, rounds=10):
    hi = (offset >> 32) & M32 if offset_bits == 64 else 0
    return philox(seed, (offset & M32, hi, 0, 0), rounds)


def uniform(x):
    x = x - 2**32 if x >= 2**31 else x
    x = -x - 1 if x < 0 else x
    return f32(f32(float(x)) * f32(4.6566127342e-10))


def randn(seed, offset, offset_bits=32):
    w = randint4x(seed, offset, offset_bits)
    u1, u2 = uniform(w[0]), uniform(w[1])
    u1 = max(f32(1.0e-7), u1)
    th = f32(f32(6.283185307179586) * u2)
    r = f32(math.sqrt(f32(-2.0 * f32(math.log(u1)))))
    return f32(r * f32(math.cos(th)))


def signed(x):
    return x - 2**32 if x >= 2**31 else x


if __name__ == "__main__":
    for seed, offs, bits in [(42, [0, 1, 2, 1000, -1, -(2**31)], 32), (-7, [0, 5], 32), (2**31 + 5, [3, 77], 32),
                             (0x123456789ABCDEF, [0, 2**32 + 3, -5, 2**40], 64)]:
        print(f"seed {seed}, i{bits} offsets {offs}")
        print("  randint4x", [[signed(x) for x in randint4x(seed, o, bits)] for o in offs])
        print("  rand bits", [hex(struct.unpack("<I", struct.pack("<f", uniform(randint4x(seed, o, bits)[0])))[0]) for o in offs])
        print("  randn bits", [hex(struct.unpack("<I", struct.pack("<f", randn(seed, o, bits)))[0]) for o in offs])
    print("seed 42, offset 9, 7 rounds", [signed(x) for x in randint4x(42, 9, rounds=7)])
