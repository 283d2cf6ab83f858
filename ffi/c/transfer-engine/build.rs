//! Puts `include/transfer_engine_c.h` into `<target dir>/<profile>/include/` next to the built
//! library, and checks that the header declares exactly the functions `src/lib.rs` exports:
//! the header is written by hand (it keeps Mooncake's macros and its anonymous union, which a
//! generator would not), so this keeps the two from drifting apart.

use std::collections::BTreeSet;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=include/transfer_engine_c.h");
    println!("cargo:rerun-if-changed=src/lib.rs");
    let crate_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let header_path = crate_dir.join("include/transfer_engine_c.h");
    let header = std::fs::read_to_string(&header_path).expect("reading transfer_engine_c.h");
    let source = std::fs::read_to_string(crate_dir.join("src/lib.rs")).expect("reading src/lib.rs");
    let declared = declared_functions(&header);
    let exported = exported_functions(&source);
    if declared != exported {
        let only_h: Vec<_> = declared.difference(&exported).collect();
        let only_rs: Vec<_> = exported.difference(&declared).collect();
        panic!("transfer_engine_c.h and src/lib.rs disagree: declared only in the header {only_h:?}, exported only by the library {only_rs:?}");
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    // OUT_DIR is <target>/<profile>/build/<crate>-<hash>/out: the profile directory is three up.
    if let Some(profile_dir) = out_dir.ancestors().nth(3) {
        let include = profile_dir.join("include");
        std::fs::create_dir_all(&include).expect("creating the include directory");
        std::fs::copy(&header_path, include.join("transfer_engine_c.h")).expect("copying transfer_engine_c.h");
    }
}

/// Names of the functions a C header declares: comments and preprocessor lines removed, each
/// `;`-terminated top-level declaration with a `(` gives the identifier before it.
fn declared_functions(header: &str) -> BTreeSet<String> {
    let mut text = String::new();
    let mut rest = header;
    while let Some(start) = rest.find("/*") {
        text.push_str(&rest[..start]);
        rest = rest[start..].split_once("*/").map_or("", |(_, after)| after);
    }
    text.push_str(rest);
    // Lines of `#ifdef __cplusplus` blocks (the `extern "C" {` guards) and other preprocessor
    // lines are not declarations.
    let mut in_cplusplus = false;
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .filter(|l| {
            let t = l.trim_start();
            if t.starts_with("#ifdef __cplusplus") {
                in_cplusplus = true;
            } else if in_cplusplus && t.starts_with("#endif") {
                in_cplusplus = false;
                return false;
            }
            !in_cplusplus && !t.starts_with('#')
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut names = BTreeSet::new();
    let mut depth = 0i32;
    let mut decl = String::new();
    for c in code.chars() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                decl.clear();
            }
            ';' if depth == 0 => {
                let d = std::mem::take(&mut decl);
                if let Some(open) = d.find('(') {
                    let name: String = d[..open]
                        .trim_end()
                        .chars()
                        .rev()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect();
                    names.insert(name);
                }
            }
            _ if depth == 0 => decl.push(c),
            _ => {}
        }
    }
    names
}

/// Names of the `#[no_mangle] extern "C"` functions of the library's source.
fn exported_functions(source: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut armed = false;
    for line in source.lines().map(str::trim) {
        if line == "#[no_mangle]" {
            armed = true;
        } else if armed && line.contains("extern \"C\" fn ") {
            let after = line.split("extern \"C\" fn ").nth(1).unwrap_or("");
            names.insert(after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
            armed = false;
        }
    }
    names
}
