//! Generates `crescent.h` from the crate's `extern "C"` items with cbindgen, into OUT_DIR and
//! into `<target dir>/<profile>/include/` next to the built libraries, where C programs find it.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    let crate_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("reading cbindgen.toml");
    let header =
        cbindgen::Builder::new().with_crate(&crate_dir).with_config(config).generate().expect("generating crescent.h");
    header.write_to_file(out_dir.join("crescent.h"));
    // OUT_DIR is <target>/<profile>/build/<crate>-<hash>/out: the profile directory is three up.
    if let Some(profile_dir) = out_dir.ancestors().nth(3) {
        let include = profile_dir.join("include");
        std::fs::create_dir_all(&include).expect("creating the include directory");
        header.write_to_file(include.join("crescent.h"));
    }
}
