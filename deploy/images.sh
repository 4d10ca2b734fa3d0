#!/usr/bin/env bash
# Builds Sluice's four images (center, worker, etl, sluicectl) with podman, from the
# repository's Dockerfile, without an image registry: the runtime base is made from
# Debian's packages by debootstrap and imported once; the binaries are built beforehand.
#
#   deploy/images.sh [BIN_DIR [TAG]]
#
# BIN_DIR holds sluice-center, sluice-worker, sluice-etl and sluicectl (default
# target/ship, which `make images` builds); they are staged stripped in
# target/images/TAG/bin of the repository (the build context), their sizes printed. Images: localhost/sluice-<target>:TAG (default: the workspace's
# version); the base: localhost/sluice-base:bookworm. Whatever is missing (podman, buildah,
# debootstrap, runc) is installed with apt-get; what is present is kept.
#
# These machines' sandbox refuses setrlimit and runs no systemd cgroups: podman runs with
# Debian's runc, cgroupfs and the containers.conf written here ($CONTAINERS_CONF, unless
# set), which asks for no default ulimits. Run one the same way:
#   CONTAINERS_CONF=/var/cache/sluice-images/containers.conf \
#     podman --runtime runc --cgroup-manager=cgroupfs run --rm --network host \
#     -v ./center.toml:/etc/sluice/config.toml:ro localhost/sluice-center:TAG
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN_DIR=${1:-$TARGET_DIR/ship}
TAG=${2:-$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -n1)}
CACHE=${SLUICE_IMAGE_CACHE:-/var/cache/sluice-images}
BASE=localhost/sluice-base:bookworm
BINARIES=(sluice-center sluice-worker sluice-etl sluicectl)

log() { printf '[images] %s\n' "$*"; }
die() { printf '[images] ERROR: %s\n' "$*" >&2; exit 1; }

need=()
for tool in podman buildah debootstrap runc; do
  command -v "$tool" >/dev/null 2>&1 || need+=("$tool")
done
if ((${#need[@]} > 0)); then
  log "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

mkdir -p "$CACHE"
if [ -z "${CONTAINERS_CONF:-}" ]; then
  export CONTAINERS_CONF=$CACHE/containers.conf
  printf '[containers]\ndefault_ulimits = []\n' > "$CONTAINERS_CONF"
fi
podman=(podman --runtime runc --cgroup-manager=cgroupfs)

if ! "${podman[@]}" image exists "$BASE"; then
  rootfs=$CACHE/rootfs
  if [ ! -f "$CACHE/rootfs.done" ]; then
    log "debootstrap --variant=minbase bookworm (Debian's packages, about 2 minutes)"
    rm -rf "$rootfs"
    debootstrap --variant=minbase --include=ca-certificates bookworm "$rootfs" \
      "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" > "$CACHE/debootstrap.log" 2>&1 \
      || die "debootstrap failed; see $CACHE/debootstrap.log"
    # What a service never reads: documentation, manuals, translations, package lists.
    rm -rf "$rootfs"/usr/share/{doc,man,info,locale} "$rootfs"/var/lib/apt/lists/* \
      "$rootfs"/var/cache/apt/*.bin
    touch "$CACHE/rootfs.done"
  fi
  log "importing the base as $BASE"
  tar -C "$rootfs" -c . | "${podman[@]}" import - "$BASE" >/dev/null
fi

stage=$ROOT/target/images/$TAG/bin
rm -rf "$stage"
mkdir -p "$stage"
for b in "${BINARIES[@]}"; do
  [ -x "$BIN_DIR/$b" ] || die "$BIN_DIR/$b is missing: build it first (make images builds target/ship)"
  strip -o "$stage/$b" "$BIN_DIR/$b"
  log "$b: $(du -h "$BIN_DIR/$b" | cut -f1) built, $(du -h "$stage/$b" | cut -f1) stripped"
done

for target in center worker etl sluicectl; do
  image=localhost/sluice-$target:$TAG
  [ "$target" = sluicectl ] && image=localhost/sluicectl:$TAG
  "${podman[@]}" build --quiet --network host -f "$ROOT/Dockerfile" --target "$target" \
    --build-arg RUNTIME="$BASE" --build-arg BINARIES=prebuilt \
    --build-arg PREBUILT="target/images/$TAG/bin" -t "$image" "$ROOT" >/dev/null
  log "$image: $("${podman[@]}" image inspect --format '{{.Size}}' "$image" | awk '{printf "%.1f MB", $1 / 1e6}')"
done
