//! libFuzzer target: the `.npy` reader (and the writer: what reads writes back the same).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tilegrad_fuzz::npy(data));
