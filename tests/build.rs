//! Builds the fake CUDA driver (`fake-cuda/fake_cuda.rs`, no dependencies) into a shared
//! library with this build's `rustc`, and tells the tests where it is (`FAKE_CUDA_DRIVER`).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let source = "fake-cuda/fake_cuda.rs";
    println!("cargo:rerun-if-changed={source}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let library = out.join("libfake_cuda.so");
    let status = Command::new(rustc)
        .args(["--edition", "2021", "--crate-type", "cdylib", "--crate-name", "fake_cuda", "-O", "-o"])
        .arg(&library)
        .arg(source)
        .status()
        .expect("run rustc for the fake CUDA driver");
    assert!(status.success(), "building the fake CUDA driver failed");
    println!("cargo:rustc-env=FAKE_CUDA_DRIVER={}", library.display());
}
