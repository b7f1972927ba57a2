//! libFuzzer target: the text IR parser (and the printer: what parses prints and parses back the same).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tilegrad_fuzz::text_ir(data));
