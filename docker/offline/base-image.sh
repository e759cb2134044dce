#!/usr/bin/env bash
# A Debian base image made without any image registry: debootstrap a minimal Debian (bookworm: Python 3.11)
# from a Debian mirror into a folder, and import that folder as an image. For docker/compose.offline.yaml.
#
#   sudo docker/offline/base-image.sh [TAG]        # default TAG: studyrunner-base:bookworm
#
# Needs root, debootstrap (apt-get install debootstrap) and a Docker engine. DEBIAN_MIRROR (default
# http://deb.debian.org/debian) and DEBIAN_SECURITY_MIRROR (http://deb.debian.org/debian-security) name the
# mirrors; the image's apt uses them too (the suite, its updates and its security updates).
set -euo pipefail

tag=${1:-studyrunner-base:bookworm}
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}

die() {
  echo "base-image: $*" >&2
  exit 1
}
[[ $(id -u) == 0 ]] || die "run as root (debootstrap makes device files and sets owners)"
command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"
docker info >/dev/null 2>&1 || die "no Docker engine answers (is dockerd running?)"

rootfs=$(mktemp -d "${TMPDIR:-/tmp}/studyrunner-base.XXXXXX")
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase "$suite" "$rootfs" "$mirror"
cat >"$rootfs/etc/apt/sources.list" <<SOURCES
deb $mirror $suite main
deb $mirror $suite-updates main
deb $security $suite-security main
SOURCES
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | docker import -c 'CMD ["/bin/bash"]' - "$tag"
echo "base-image: $tag"
