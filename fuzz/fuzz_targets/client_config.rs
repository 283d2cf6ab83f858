#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| crescent_fuzz::client_config(data));
