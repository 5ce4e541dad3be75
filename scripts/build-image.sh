#!/usr/bin/env bash
# Build the agent image from the repository's Dockerfile on a machine with no registry (CI), as root:
#   1. the base: a Debian bookworm root filesystem with python3, made by mmdebstrap from Debian's packages and
#      imported with `podman import` (the tarball is cached, keyed by this script's hash);
#   2. a wheelhouse built on the host: the project's wheel and its runtime dependencies for CPython 3.11 on
#      manylinux (pip; no torch);
#   3. `podman build --network none --build-arg BASE=...`: nothing is fetched inside the build.
# The image is tagged by a hash of what goes into it, so an unchanged tree is not built again: running this script
# twice costs the second time a few hundred milliseconds. Prints KEY=VALUE lines on stdout (IMAGE, BASE_IMAGE,
# WHEELHOUSE, BUILD_SECONDS, SIZE_BYTES) for the container tests; progress goes to stderr.
#
#   scripts/build-image.sh                 build if missing
#   OUTRIDER_IMAGE_REBUILD=1 scripts/...   build again even if present (the cached base is kept)
# Podman's settings and storage: scripts/podman/ (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
export CONTAINERS_CONF=$REPO/scripts/podman/containers.conf
export CONTAINERS_STORAGE_CONF=$REPO/scripts/podman/storage.conf
CACHE=${OUTRIDER_IMAGE_CACHE:-/var/tmp/outrider-image-cache}
KEEP_IMAGES=3
PYTHON_VERSION=3.11  # bookworm's python3; the wheelhouse is resolved for it whatever the host runs

log() { echo "build-image: $*" >&2; }
mkdir -p "$CACHE"
exec 9>"$CACHE/lock"
flock 9  # one build at a time on this machine (CI and several test runs share the storage)

t0=$(date +%s.%N)

# --- 1. the base --------------------------------------------------------------------------------------------
base_key=$(sha256sum "$REPO/scripts/build-image.sh" | cut -c1-16)
BASE_IMAGE=localhost/outrider-base:$base_key
if ! podman image exists "$BASE_IMAGE"; then
  tarball=$CACHE/base-$base_key.tar
  if [ ! -s "$tarball" ]; then
    log "making the base root filesystem (mmdebstrap bookworm + python3)"
    # essential + python3 (with venv, for the image's own environment) + CA certificates (OTLP over https) +
    # libstdc++ (grpcio's C++ core: the PodResources client and OTLP over gRPC fail to import without it);
    # merged /usr without the usrmerge package (which would pull in perl); no docs, man pages or locales.
    for try in 1 2 3; do  # a mirror's hiccup is not worth a failed CI run
      if mmdebstrap --mode=root --format=tar --variant=essential \
           --include=python3,python3-venv,ca-certificates,libstdc++6 \
           --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
           --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
           --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
           bookworm "$tarball.tmp" >"$CACHE/mmdebstrap.log" 2>&1; then
        break
      fi
      rm -rf "$tarball.tmp"
      tail -20 "$CACHE/mmdebstrap.log" >&2
      if [ "$try" = 3 ]; then exit 1; fi
      log "mmdebstrap failed (try $try); retrying"
      sleep 10
    done
    mv "$tarball.tmp" "$tarball"
    find "$CACHE" -maxdepth 1 -name 'base-*.tar' ! -name "base-$base_key.tar" -delete
  fi
  log "importing $tarball as $BASE_IMAGE"
  podman import --quiet "$tarball" "$BASE_IMAGE" >/dev/null
  podman images --noheading --format '{{.Repository}}:{{.Tag}}' localhost/outrider-base | grep -v ":$base_key\$" \
    | xargs -r podman rmi >/dev/null 2>&1 || true  # older bases (kept while an image still uses one)
fi

# --- what goes into the image: the files the Dockerfile copies ----------------------------------------------
# Its COPY sources (the optional wheelhouse aside), so the context holds exactly what the Dockerfile uses.
mapfile -t sources < <(sed -n 's/^COPY \([^-].*\) [^ ]*$/\1/p' "$REPO/Dockerfile" | tr ' ' '\n' | grep -v '\*' | sort -u)
src_key=$( (cd "$REPO" && sha256sum Dockerfile && find "${sources[@]}" -type f ! -name '*.pyc' \
             ! -path '*/__pycache__/*' ! -path '*.egg-info/*' -print0 | sort -z | xargs -0 sha256sum;
             echo "$base_key") | sha256sum | cut -c1-16)
IMAGE=localhost/outrider:src-$src_key
WHEELHOUSE=$CACHE/wheelhouse-$src_key

build_image=
if [ -n "${OUTRIDER_IMAGE_REBUILD:-}" ] || ! podman image exists "$IMAGE"; then build_image=1; fi
if [ -n "$build_image" ] || [ ! -d "$WHEELHOUSE" ]; then
  ctx=$(mktemp -d "$CACHE/context.XXXXXX")
  trap 'rm -rf "$ctx"' EXIT
  (cd "$REPO" && cp -a --parents "${sources[@]}" Dockerfile .dockerignore "$ctx/")

  # --- 2. the wheelhouse (the container tests install the hook from it too) ------------------------------
  if [ ! -d "$WHEELHOUSE" ]; then
    log "building the wheelhouse"
    tmp=$(mktemp -d "$CACHE/wheelhouse.XXXXXX")
    # The project's wheel, from the copied sources (an in-tree build would leave build/ in the repository).
    python3 -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$tmp" "$ctx" >&2
    # Its dependencies as binary wheels for the image's Python, whatever Python the host runs; with the k8s extra
    # (grpcio), which the node agent needs to ask the kubelet which pod owns each GPU, and the grpc extra (OTLP over
    # gRPC on the same grpcio).
    wheel=$(ls "$tmp"/outrider-*.whl)
    python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: -d "$tmp" \
      --python-version "$PYTHON_VERSION" --implementation cp --abi "cp${PYTHON_VERSION/./}" --abi abi3 --abi none \
      --platform "manylinux_2_28_$(uname -m)" --platform "manylinux2014_$(uname -m)" --platform any \
      "outrider[k8s,grpc] @ file://$wheel" >&2
    mv "$tmp" "$WHEELHOUSE"
  fi
  rm -rf "$ctx/build"
  find "$ctx" \( -name __pycache__ -o -name '*.egg-info' \) -prune -exec rm -rf {} +
  cp -a "$WHEELHOUSE" "$ctx/wheelhouse"
fi

if [ -n "$build_image" ]; then
  # --- 3. the image -----------------------------------------------------------------------------------------
  log "podman build $IMAGE (base $BASE_IMAGE, no network)"
  podman build --quiet --network none --pull=never --build-arg "BASE=$BASE_IMAGE" -t "$IMAGE" "$ctx" >/dev/null
  podman image prune --force >/dev/null  # the build stage's layers

  # Keep the latest few images and wheelhouses (other checkouts' tests may be using them).
  podman images --noheading --sort created --format '{{.Repository}}:{{.Tag}}' localhost/outrider \
    | grep ':src-' | tail -n +$((KEEP_IMAGES + 1)) | xargs -r podman rmi >/dev/null 2>&1 || true  # one in use stays
  # shellcheck disable=SC2012
  ls -dt "$CACHE"/wheelhouse-* 2>/dev/null | tail -n +$((KEEP_IMAGES + 1)) | xargs -r rm -rf
fi

t1=$(date +%s.%N)
echo "IMAGE=$IMAGE"
echo "BASE_IMAGE=$BASE_IMAGE"
echo "WHEELHOUSE=$WHEELHOUSE"
echo "BUILD_SECONDS=$(awk "BEGIN {printf \"%.1f\", $t1 - $t0}")"
echo "SIZE_BYTES=$(podman image inspect --format '{{.Size}}' "$IMAGE")"
