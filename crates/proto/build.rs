fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let file = root.join("sluice/v1/admin.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("sluice_descriptor.bin"))
        // Maps in a stable order (the pipelines' field overrides print and compare alike).
        .btree_map(".")
        // The console speaks the same messages as JSON (absent fields: their defaults).
        .message_attribute(
            ".",
            "#[derive(serde::Serialize, serde::Deserialize)] #[serde(default)]",
        )
        .compile_protos(&[file], &[root])?;
    Ok(())
}
