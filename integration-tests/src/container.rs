//! Services run from their images (`deploy/images.sh`) as podman containers instead of
//! as child processes: the same config file, environment and log, the host's network.

use std::path::PathBuf;
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

/// The label every container of the tests carries: what is left of a killed run is
/// found by it (`make test` removes them before it runs).
pub const LABEL: &str = "sluice-it";

/// Fails, saying how to build them, unless the images of `bins` under `tag` exist and
/// hold the debug binaries as they are now: each image's `sluice.binary.sha256` label
/// (`deploy/images.sh` sets it) is its binary's.
pub fn check_built(bins: &[&str], tag: &str) {
    let how = format!("build them with `deploy/images.sh target/debug {tag}` (make test does)");
    for bin in bins {
        let image = image_of(bin, tag);
        let labelled = podman()
            .args(["image", "inspect", "--format"])
            .arg("{{index .Labels \"sluice.binary.sha256\"}}")
            .arg(&image)
            .output()
            .unwrap_or_else(|e| panic!("podman cannot run ({e}): {how}"));
        assert!(labelled.status.success(), "image {image} is missing: {how}");
        let built = target_dir().join("debug").join(bin);
        let sum = Command::new("sha256sum")
            .arg(&built)
            .output()
            .expect("sha256sum");
        let sum = String::from_utf8_lossy(&sum.stdout);
        let sum = sum.split_whitespace().next().unwrap_or_default();
        assert_eq!(
            String::from_utf8_lossy(&labelled.stdout).trim(),
            sum,
            "image {image} does not hold {} as it is now: {how}",
            built.display()
        );
    }
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
