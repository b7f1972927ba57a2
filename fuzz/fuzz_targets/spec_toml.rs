//! libFuzzer target: the spec loader: TOML, expressions, kernel references (the example kernels are beside the spec).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tilegrad_fuzz::spec_toml(data));
