fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/master.proto");
    tonic_build::configure().compile_protos(&["proto/master.proto"], &["proto"])?;
    Ok(())
}
