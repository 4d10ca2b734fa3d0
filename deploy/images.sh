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
# version), each labelled with its binary's SHA-256 (`sluice.binary.sha256`); the base:
# localhost/sluice-base:<this machine's Debian release>, whose glibc the binaries were
# linked against. Whatever is missing (podman, buildah, debootstrap, runc, catatonit for
# `podman run --init`, strip) is installed with apt-get; what is present is kept. As root.
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
# The workspace's version: the only `version = ` at the start of a line of Cargo.toml.
TAG=${2:-$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -n1)}
CACHE=${SLUICE_IMAGE_CACHE:-/var/cache/sluice-images}
RELEASE=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
BASE=localhost/sluice-base:$RELEASE
BINARIES=(sluice-center sluice-worker sluice-etl sluicectl)

log() { printf '[images] %s\n' "$*"; }
die() { printf '[images] ERROR: %s\n' "$*" >&2; exit 1; }

[[ $TAG =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]] || die "tag '$TAG' is not an image tag"
((EUID == 0)) || die "run as root (apt-get, debootstrap, $CACHE)"

need=()
for tool in podman buildah debootstrap runc strip; do
  command -v "$tool" >/dev/null 2>&1 || need+=("${tool/strip/binutils}")
done
[ -x /usr/libexec/podman/catatonit ] || need+=(catatonit)
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
  rootfs=$CACHE/rootfs-$RELEASE
  if [ ! -f "$rootfs.done" ] || [ ! -d "$rootfs" ]; then
    log "debootstrap --variant=minbase $RELEASE (Debian's packages, about 2 minutes)"
    rm -rf "$rootfs" "$rootfs.done"
    debootstrap --variant=minbase --include=ca-certificates,libssl3 "$RELEASE" "$rootfs" \
      "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" > "$CACHE/debootstrap.log" 2>&1 \
      || die "debootstrap failed; see $CACHE/debootstrap.log"
    # What a service never reads: documentation, manuals, translations, package lists;
    # and what debootstrap copied of this machine.
    rm -rf "$rootfs"/usr/share/{doc,man,info,locale} "$rootfs"/var/lib/apt/lists/* \
      "$rootfs"/var/cache/apt/*.bin
    : > "$rootfs/etc/resolv.conf"
    echo sluice > "$rootfs/etc/hostname"
    touch "$rootfs.done"
  fi
  log "importing the base as $BASE"
  tar -C "$rootfs" -c . | "${podman[@]}" import --quiet - "$BASE" >/dev/null
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
  bin=sluice-$target
  [ "$target" = sluicectl ] && bin=sluicectl
  image=localhost/$bin:$TAG
  "${podman[@]}" build --quiet --network host -f "$ROOT/Dockerfile" --target "$target" \
    --build-arg RUNTIME="$BASE" --build-arg BINARIES=prebuilt \
    --build-arg PREBUILT="target/images/$TAG/bin" \
    --label "sluice.binary.sha256=$(sha256sum "$BIN_DIR/$bin" | cut -d' ' -f1)" \
    -t "$image" "$ROOT" >/dev/null
  # It runs here: the base's libraries are the ones the binary needs.
  "${podman[@]}" run --rm --network host --entrypoint "/usr/local/bin/$bin" "$image" --help >/dev/null \
    || die "$image does not run its binary"
  log "$image: $("${podman[@]}" image inspect --format '{{.Size}}' "$image" | awk '{printf "%.1f MB", $1 / 1e6}') with the base"
done
# The images these replaced, now untagged.
"${podman[@]}" image prune --force >/dev/null
