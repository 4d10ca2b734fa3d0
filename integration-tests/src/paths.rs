//! Where the test machinery keeps its files.

use std::path::PathBuf;

/// The Cargo target directory: the binaries under test, and the tests' logs, figures
/// and port claims below it.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("target")
        })
}
