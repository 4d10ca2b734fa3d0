//! Services run from their images (`deploy/images.sh`) as podman containers instead of
//! as child processes: the same config file, environment and log, the host's network.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::paths::target_dir;

/// The tag `make test` builds the images under, from the debug binaries.
pub const TEST_TAG: &str = "it";

/// The image of `bin` under `tag` (`localhost/sluice-etl:it`).
pub fn image_of(bin: &str, tag: &str) -> String {
    format!("localhost/{bin}:{tag}")
}

/// `podman` as it runs here: Debian's runc and cgroupfs (the sandbox has no systemd
/// cgroups and refuses crun's `setrlimit`), with `deploy/images.sh`'s containers.conf.
pub fn podman() -> Command {
    let mut cmd = Command::new("podman");
    if std::env::var_os("CONTAINERS_CONF").is_none() {
        let cache = std::env::var_os("SLUICE_IMAGE_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/cache/sluice-images"));
        cmd.env("CONTAINERS_CONF", cache.join("containers.conf"));
    }
    cmd.args(["--runtime", "runc", "--cgroup-manager=cgroupfs"]);
    cmd
}

/// Fails, saying how to build them, unless the images of `bins` under `tag` exist and
/// were built from the debug binaries as they are now (each staged copy in the
/// repository's `target/images/<tag>/bin`, the build context's, no older than its binary).
pub fn check_built(bins: &[&str], tag: &str) {
    let how = format!("build them with `deploy/images.sh target/debug {tag}` (make test does)");
    for bin in bins {
        let image = image_of(bin, tag);
        let exists = podman()
            .args(["image", "exists", &image])
            .status()
            .unwrap_or_else(|e| panic!("podman cannot run ({e}): {how}"));
        assert!(exists.success(), "image {image} is missing: {how}");
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let staged = repo.join("target/images").join(tag).join("bin").join(bin);
        let built = target_dir().join("debug").join(bin);
        assert!(
            modified(&staged) >= modified(&built),
            "image {image} is older than {}: {how}",
            built.display()
        );
    }
}

fn modified(path: &Path) -> std::time::SystemTime {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .unwrap_or(std::time::SystemTime::UNIX_EPOCH)
}

/// The containers running from `image` (their names).
pub fn running(image: &str) -> Vec<String> {
    let out = podman()
        .args([
            "ps",
            "--filter",
            &format!("ancestor={image}"),
            "--format",
            "{{.Names}}",
        ])
        .output()
        .expect("podman ps");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Removes container `name`, running or not (a killed `podman run` leaves it running).
pub fn remove(name: &str) {
    let _ = podman()
        .args(["rm", "--force", "--time", "0", name])
        .output();
}
