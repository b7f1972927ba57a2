//! The mutator: one or two random edits of a file, aimed at the corners of each parser (tokens
//! of Triton, the text IR, specs and `.npy` headers; interesting numbers; deep or long runs).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Tokens a mutation inserts: syntax, names and numbers that reach the corners of each parser.
const TOKENS: &[&str] = &[
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    "=",
    "\"",
    "'",
    "\n",
    "\n    ",
    "#",
    "-",
    "+",
    "*",
    "//",
    "%",
    "/",
    "**",
    "<<",
    "@",
    ".",
    "::",
    "\\",
    "\u{e9}",
    "\u{1F600}",
    "\u{0}",
    "tl.",
    "tl.arange(0, ",
    "tl.zeros((",
    "tl.load(",
    "tl.store(",
    "tl.sum(",
    "range(",
    "tl.static_range(",
    "if ",
    "else:",
    "for ",
    "return ",
    "None",
    "True",
    "%x",
    "f32",
    "i64",
    "ptr<",
    "[1048576]",
    "constexpr",
    "shape",
    "dtype",
    "init",
    "like",
    "launch",
    "grid",
    "args",
    "alloc",
    "sum",
    "axis",
    "into",
    "stride(0)",
    "numel()",
    "cdiv(",
    "uniform(",
    "randint(",
    "const(",
    "normal(",
    "file",
    "'descr'",
    "'shape'",
    "<f8",
    "|b1",
    "True",
    "fortran_order",
];

/// Numbers a mutation writes over a number: limits of every integer type, float extremes.
const NUMBERS: &[&str] = &[
    "0",
    "-1",
    "1",
    "2",
    "3",
    "7",
    "0.5",
    "-0.0",
    "1e-320",
    "1e308",
    "-1e308",
    "1e309",
    "inf",
    "-inf",
    "nan",
    "127",
    "255",
    "65535",
    "65536",
    "1048576",
    "1048577",
    "16777216",
    "2147483647",
    "2147483648",
    "-2147483649",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "18446744073709551616",
    "6148914691236517206",
    "1000000000000",
    "1_000",
];

/// Runs that nest or chain deeply when repeated.
const RUNS: &[&str] = &["(", "-", "[", "x + (", "tl.abs(", "1.0 + ", "max(", "{ a = ", "a.", "    "];

pub struct Mutator(pub StdRng);

/// Chains long enough to overflow a recursive parser's stack (a recursive descent of 140,000
/// terms overflows 8 MiB), inserted by one edit in 64.
const CHAINS: &[&str] = &["1 + ", "x * ", "-", "not ", "(", "a."];

impl Mutator {
    /// The mutator of mutant `index` of target `target` under campaign seed `seed`: each mutant has
    /// its own stream, so any one can be made again alone, and mutants can be run in any order.
    pub fn for_case(seed: u64, target: &str, index: usize) -> Mutator {
        let name = target.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
        Mutator(StdRng::seed_from_u64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ name ^ (index as u64).rotate_left(32)))
    }

    /// A number in `0..n` (`n` > 0).
    pub fn pick(&mut self, n: usize) -> usize {
        self.0.gen_range(0..n)
    }

    fn pos(&mut self, v: &[u8]) -> usize {
        self.0.gen_range(0..=v.len())
    }

    /// One or two random edits of `input`.
    pub fn mutate(&mut self, input: &[u8]) -> Vec<u8> {
        let mut v = input.to_vec();
        for _ in 0..self.0.gen_range(1..=2) {
            if self.0.gen_range(0..64) == 0 {
                let r = CHAINS[self.0.gen_range(0..CHAINS.len())].repeat(self.0.gen_range(100_000..200_000));
                let at = self.pos(&v);
                v.splice(at..at, r.into_bytes());
                continue;
            }
            match self.0.gen_range(0..12) {
                0 => {
                    let a = self.pos(&v);
                    let b = (a + self.0.gen_range(1..24)).min(v.len());
                    v.drain(a..b);
                }
                1 => {
                    let a = self.pos(&v);
                    let b = (a + self.0.gen_range(1..80)).min(v.len());
                    let piece = v[a..b].to_vec();
                    let at = self.pos(&v);
                    v.splice(at..at, piece);
                }
                2 | 3 => {
                    let t = TOKENS[self.0.gen_range(0..TOKENS.len())].as_bytes().to_vec();
                    let at = self.pos(&v);
                    v.splice(at..at, t);
                }
                4..=7 => {
                    // Overwrite a number (a run of digits) with an interesting one.
                    let starts: Vec<usize> =
                        (0..v.len()).filter(|&i| v[i].is_ascii_digit() && (i == 0 || !v[i - 1].is_ascii_alphanumeric())).collect();
                    if let Some(&a) = starts.get(self.0.gen_range(0..starts.len().max(1))) {
                        let b = (a..v.len()).find(|&i| !(v[i].is_ascii_digit() || v[i] == b'.' || v[i] == b'_')).unwrap_or(v.len());
                        let n = NUMBERS[self.0.gen_range(0..NUMBERS.len())].as_bytes().to_vec();
                        v.splice(a..b, n);
                    }
                }
                8 => {
                    if !v.is_empty() {
                        let i = self.0.gen_range(0..v.len());
                        v[i] = self.0.gen();
                    }
                }
                9 | 10 => {
                    let r = RUNS[self.0.gen_range(0..RUNS.len())].repeat(self.0.gen_range(10..6000));
                    let at = self.pos(&v);
                    v.splice(at..at, r.into_bytes());
                }
                _ => {
                    let at = self.pos(&v);
                    v.truncate(at);
                }
            }
        }
        v
    }
}
