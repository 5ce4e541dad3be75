#!/usr/bin/env bash
# Build the agent image from the repository's Dockerfile on a machine with no registry (CI), as root, reproducibly:
# the same tree, lock and Debian packages give the same image, byte for byte (tests/container/test_reproducible.py).
#   1. the base: a Debian bookworm root filesystem with python3, made by mmdebstrap from Debian's packages (the
#      build stage and the tests' workload image run on it), and the runtime root cut from it
#      (scripts/image/runtime-root.py: only the files of the packages the agent runs on, no shell, no package
#      manager); both made images by `podman build --timestamp EPOCH` of the tarball alone (not `podman import`,
#      which stamps the image with the tarball file's time, new with every mmdebstrap run: the agent image's
#      manifest names its base's digest, and so changed with it), the tarballs cached, keyed by this script's hash;
#   2. a wheelhouse built on the host: the project's wheel (its build backend pinned by
#      scripts/image/build-constraints.txt) and the locked dependencies (scripts/image/requirements.txt, checked by
#      sha256) for CPython 3.11 on manylinux; no torch;
#   3. `podman build --network none --timestamp EPOCH --omit-history`: nothing is fetched inside the build, every
#      file's mtime and the image's creation time are SOURCE_DATE_EPOCH, byte code is hash-checked.
# The image is tagged by a hash of what goes into it, so an unchanged tree is not built again: running this script
# twice costs the second time a few hundred milliseconds. Prints KEY=VALUE lines on stdout (IMAGE, IMAGE_ID,
# IMAGE_DIGEST: the manifest's, what `image@sha256:` pins; BASE_IMAGE, RUNTIME_IMAGE, WHEELHOUSE, BUILD_SECONDS,
# SIZE_BYTES) for the container tests; progress goes to stderr.
#
#   scripts/build-image.sh                 build if missing
#   OUTRIDER_IMAGE_REBUILD=1 scripts/...   build the base images from the cached tarballs, the wheel and the image
#                                          again from the locked wheels, without podman's layer cache (the
#                                          reproducibility test)
#   OUTRIDER_IMAGE_CACHE=DIR               the cache of tarballs and wheels (default /var/tmp/outrider-image-cache)
#   OUTRIDER_DEBIAN_MIRROR=URL             Debian's archive (default http://deb.debian.org/debian; a
#                                          snapshot.debian.org/archive/debian/<date> URL pins the packages' date)
#   SOURCE_DATE_EPOCH=N                    the timestamp of every file and of the image (default below)
# Podman's settings and storage: scripts/podman/ (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF; OUTRIDER_PODMAN_STORAGE_CONF
# names another storage, apart from the one CI builds into).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
export CONTAINERS_CONF=$REPO/scripts/podman/containers.conf
export CONTAINERS_STORAGE_CONF=${OUTRIDER_PODMAN_STORAGE_CONF:-$REPO/scripts/podman/storage.conf}
CACHE=${OUTRIDER_IMAGE_CACHE:-/var/tmp/outrider-image-cache}
MIRROR=${OUTRIDER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# 2024-01-01T00:00:00Z: a constant, not the last commit's date, so that the tag (a hash of the inputs) names one image.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1704067200}
KEEP_IMAGES=3
PYTHON_VERSION=3.11  # bookworm's python3; the wheelhouse is resolved for it whatever the host runs
ARCH=$(uname -m)

log() { echo "build-image: $*" >&2; }
mkdir -p "$CACHE"
exec 9>"$CACHE/lock"
flock 9  # one build at a time on this machine (CI and several test runs share the storage)

t0=$(date +%s.%N)

# --- 1. the base and the runtime root ----------------------------------------------------------------------------
base_key=$( (cat "$REPO/scripts/build-image.sh" "$REPO/scripts/image/runtime-root.py";
             echo "$MIRROR $SOURCE_DATE_EPOCH $ARCH") | sha256sum | cut -c1-16)
BASE_IMAGE=localhost/outrider-base:$base_key
RUNTIME_IMAGE=localhost/outrider-runtime:$base_key
rebuild=${OUTRIDER_IMAGE_REBUILD:-}
if [ -n "$rebuild" ] || ! podman image exists "$BASE_IMAGE" || ! podman image exists "$RUNTIME_IMAGE"; then
  tarball=$CACHE/base-$base_key.tar
  runtime=$CACHE/runtime-$base_key.tar
  if [ ! -s "$tarball" ] || [ ! -s "$runtime" ]; then
    log "making the base root filesystem (mmdebstrap bookworm + python3, from $MIRROR)"
    # essential + python3 (with venv, for the build stage's environment) + CA certificates (OTLP over https) +
    # libstdc++ (the C++ cores of protobuf and google-re2: the agent fails to import them without it);
    # merged /usr without the usrmerge package (which would pull in perl); no docs (but the licences), man pages or
    # locales; with the security updates. SOURCE_DATE_EPOCH makes the tarball reproducible for the same packages
    # (the regular mirrors serve only the latest versions: OUTRIDER_DEBIAN_MIRROR can name a snapshot); the host's
    # resolv.conf and hostname stay out of it.
    security=${MIRROR%/debian}/debian-security
    for try in 1 2 3; do  # a mirror's hiccup is not worth a failed CI run
      if mmdebstrap --mode=root --format=tar --variant=essential \
           --include=python3,python3-venv,ca-certificates,libstdc++6 \
           --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
           --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
           --dpkgopt='path-include=/usr/share/doc/*/copyright' \
           --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
           --customize-hook='rm -f "$1"/etc/resolv.conf "$1"/etc/hostname' \
           bookworm "$tarball.tmp" "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" \
           "deb $security bookworm-security main" >"$CACHE/mmdebstrap.log" 2>&1; then
        break
      fi
      rm -rf "$tarball.tmp"
      tail -20 "$CACHE/mmdebstrap.log" >&2
      if [ "$try" = 3 ]; then exit 1; fi
      log "mmdebstrap failed (try $try); retrying"
      sleep 10
    done
    python3 "$REPO/scripts/image/runtime-root.py" "$tarball.tmp" "$runtime"
    mv "$tarball.tmp" "$tarball"
    tar -xOf "$tarball" ./var/lib/dpkg/status | awk '/^Package:/ {p = $2} /^Version:/ {print p, $2}' \
      >"$CACHE/packages-$base_key.txt"
    find "$CACHE" -maxdepth 1 \( -name 'base-*.tar' -o -name 'runtime-*.tar' -o -name 'packages-*.txt' \) \
      ! -name "*-$base_key.*" -delete
  fi
  # An image of one tarball, reproducibly: its time SOURCE_DATE_EPOCH (so are its files' and its one history
  # entry's, which an image built FROM it without --omit-history needs: one per layer).
  from_tarball() {
    local dir
    dir=$(mktemp -d "$CACHE/root.XXXXXX")
    ln "$1" "$dir/root.tar" 2>/dev/null || cp "$1" "$dir/root.tar"
    printf 'FROM scratch\nADD root.tar /\n' >"$dir/Containerfile"
    podman build --quiet --network none --pull=never --no-cache --layers=false --timestamp "$SOURCE_DATE_EPOCH" \
      --identity-label=false -t "$2" "$dir" >/dev/null
    rm -rf "$dir"
  }
  log "making the base images from $tarball and $runtime"
  from_tarball "$tarball" "$BASE_IMAGE"
  from_tarball "$runtime" "$RUNTIME_IMAGE"
  for repository in localhost/outrider-base localhost/outrider-runtime; do
    podman images --noheading --format '{{.Repository}}:{{.Tag}}' "$repository" | grep -v ":$base_key\$" \
      | xargs -r podman rmi >/dev/null 2>&1 || true  # older bases (kept while an image still uses one)
  done
fi

# --- what goes into the image: the files the Dockerfile copies ----------------------------------------------
# Its COPY sources (the optional wheelhouse aside), so the context holds exactly what the Dockerfile uses.
mapfile -t sources < <(sed -n 's/^COPY \([^-].*\) [^ ]*$/\1/p' "$REPO/Dockerfile" | tr ' ' '\n' | grep -v '\*' | sort -u)
lock_key=$(cat "$REPO/scripts/image/requirements.txt" "$REPO/scripts/image/build-constraints.txt" \
           | sha256sum | cut -c1-16)
src_key=$( (cd "$REPO" && sha256sum Dockerfile && find "${sources[@]}" -type f ! -name '*.pyc' \
             ! -path '*/__pycache__/*' ! -path '*.egg-info/*' -print0 | sort -z | xargs -0 sha256sum;
             echo "$base_key $lock_key") | sha256sum | cut -c1-16)
IMAGE=localhost/outrider:src-$src_key
WHEELHOUSE=$CACHE/wheelhouse-$src_key
DEPS=$CACHE/deps-$lock_key-$ARCH

build_image=
if [ -n "$rebuild" ] || ! podman image exists "$IMAGE"; then build_image=1; fi
if [ -n "$build_image" ] || [ ! -d "$WHEELHOUSE" ]; then
  ctx=$(mktemp -d "$CACHE/context.XXXXXX")
  trap 'rm -rf "$ctx"' EXIT
  (cd "$REPO" && cp -a --parents "${sources[@]}" Dockerfile .dockerignore "$ctx/")
  rm -rf "$ctx/build"
  find "$ctx" \( -name __pycache__ -o -name '*.egg-info' \) -prune -exec rm -rf {} +

  # --- 2. the wheelhouse (the container tests install the hook from it too) ------------------------------
  if [ ! -d "$DEPS" ]; then
    log "downloading the locked dependencies (scripts/image/requirements.txt)"
    tmp=$(mktemp -d "$CACHE/deps.XXXXXX")
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes --only-binary=:all: \
      -d "$tmp" --python-version "$PYTHON_VERSION" --implementation cp --abi "cp${PYTHON_VERSION/./}" --abi abi3 \
      --abi none --platform "manylinux_2_28_$ARCH" --platform "manylinux2014_$ARCH" --platform any \
      -r "$REPO/scripts/image/requirements.txt" >&2
    mv "$tmp" "$DEPS"
  fi
  if [ -n "$rebuild" ] || [ ! -d "$WHEELHOUSE" ]; then
    log "building the project's wheel"
    tmp=$(mktemp -d "$CACHE/wheelhouse.XXXXXX")
    # From the copied sources (an in-tree build would leave build/ in the repository), with the locked backend.
    PIP_CONSTRAINT=$REPO/scripts/image/build-constraints.txt \
      python3 -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$tmp" "$ctx" >&2
    cp -a "$DEPS"/*.whl "$tmp/"
    rm -rf "$WHEELHOUSE"
    mv "$tmp" "$WHEELHOUSE"
  fi
  cp -a "$WHEELHOUSE" "$ctx/wheelhouse"
fi

if [ -n "$build_image" ]; then
  # --- 3. the image -----------------------------------------------------------------------------------------
  log "podman build $IMAGE (base $BASE_IMAGE, runtime $RUNTIME_IMAGE, no network)"
  if ! podman build --quiet --network none --pull=never --no-cache --layers=false \
         --timestamp "$SOURCE_DATE_EPOCH" --omit-history --identity-label=false \
         --build-arg "BASE=$BASE_IMAGE" --build-arg "RUNTIME=$RUNTIME_IMAGE" \
         --build-arg "SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH" -t "$IMAGE" "$ctx" >"$CACHE/build.log" 2>&1; then
    tail -30 "$CACHE/build.log" >&2
    log "podman build failed (a requirement the lock does not satisfy? re-run scripts/image/lock.py)"
    exit 1
  fi
  podman image prune --force >/dev/null  # the build stage's layers, and an image this tag named before

  # Keep the latest few wheelhouses and, by them, images (other checkouts' tests may be using them): every image
  # was created at SOURCE_DATE_EPOCH, so its wheelhouse's age is its build's.
  # shellcheck disable=SC2012
  ls -dt "$CACHE"/wheelhouse-* 2>/dev/null | tail -n +$((KEEP_IMAGES + 1)) | xargs -r rm -rf
  # shellcheck disable=SC2012
  ls -dt "$CACHE"/deps-* 2>/dev/null | tail -n +$((KEEP_IMAGES + 1)) | xargs -r rm -rf
  podman images --noheading --format '{{.Repository}}:{{.Tag}}' localhost/outrider | grep ':src-' \
    | while read -r tag; do
        [ -d "$CACHE/wheelhouse-${tag##*:src-}" ] || podman rmi "$tag" >/dev/null 2>&1 || true  # one in use stays
      done
fi

t1=$(date +%s.%N)
echo "IMAGE=$IMAGE"
echo "IMAGE_ID=$(podman image inspect --format '{{.Id}}' "$IMAGE")"
echo "IMAGE_DIGEST=$(podman image inspect --format '{{.Digest}}' "$IMAGE")"
echo "BASE_IMAGE=$BASE_IMAGE"
echo "RUNTIME_IMAGE=$RUNTIME_IMAGE"
echo "WHEELHOUSE=$WHEELHOUSE"
echo "BUILD_SECONDS=$(awk "BEGIN {printf \"%.1f\", $t1 - $t0}")"
echo "SIZE_BYTES=$(podman image inspect --format '{{.Size}}' "$IMAGE")"
