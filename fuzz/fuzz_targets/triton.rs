//! libFuzzer target: the Triton front end: kernel discovery and conversion of every kernel found.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tilegrad_fuzz::triton(data));
