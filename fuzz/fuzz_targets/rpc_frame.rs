#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| crescent_fuzz::rpc_frame(data));
