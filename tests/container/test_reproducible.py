"""Two builds from one input give one image: scripts/build-image.sh run twice more with OUTRIDER_IMAGE_REBUILD, each
into an image storage of its own (the base images made again from the cached root tarballs, the project's wheel
built anew, nothing of another build's there) from the locked wheels, gives under the same tag the same wheel, the
same image ID as the suite's image (the digest of the image's configuration, which names every layer's digest) and
the same manifest digest, locally and pushed as to a registry (what `image@sha256:` pins; it names the base image's
digest too, and a base imported with `podman import` took its time from the root tarball's file, new with every
mmdebstrap run). What differs, if anything, is shown file by file."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.container.conftest import FIGURES
from tests.container.podman import Podman, build_env_file, podman_env
from tests.helpers import REPO

pytestmark = pytest.mark.container


def _wheel_digest(wheelhouse: str) -> str:
    wheel = next(Path(wheelhouse).glob("outrider-*.whl"))
    return hashlib.sha256(wheel.read_bytes()).hexdigest()


def _files(podman: Podman, image: str, name: str) -> dict[str, str]:
    """Each path of the image's filesystem -> the sha256 of its content (or its link target, or its type)."""
    cid = podman.create(name, ["--network", "none", image])
    r = subprocess.run([podman.exe, "export", cid], env=podman.env, capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    out = {}
    with tarfile.open(fileobj=io.BytesIO(r.stdout)) as tar:
        for m in tar:
            f = tar.extractfile(m) if m.isfile() else None
            out[m.name] = hashlib.sha256(f.read()).hexdigest() if f else f"{m.type!r} {m.linkname} {m.mode:o}"
    return out


def _pushed_digest(podman: Podman, image: str, directory: Path) -> str:
    """The manifest digest of the image pushed to an OCI layout directory, as to a registry (gzip-compressed)."""
    podman("push", "--quiet", image, f"oci:{directory}:pinned", timeout_s=600)
    (manifest,) = json.loads((directory / "index.json").read_text())["manifests"]
    return str(manifest["digest"])


def _build_apart(tmp_path: Path, name: str, base_image: str) -> tuple[dict[str, str], Podman]:
    """scripts/build-image.sh again (OUTRIDER_IMAGE_REBUILD), into an image storage of its own, as another machine's
    would be: its base images made again from the cached root tarballs, nothing of an earlier build's there (an
    image whose ID a storage holds already keeps the manifest it had: a build into it could not show its own). The
    tarballs get the time of now first, as a new mmdebstrap run leaves the same bytes (`podman import` took the
    image's time from the file's)."""
    key = base_image.rsplit(":", 1)[1]
    cache = Path(os.environ.get("OUTRIDER_IMAGE_CACHE", "/var/tmp/outrider-image-cache"))
    for tarball in (cache / f"base-{key}.tar", cache / f"runtime-{key}.tar"):
        os.utime(tarball)
    conf = tmp_path / f"{name}.conf"
    conf.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{tmp_path / name}"\n'
                    f'runroot = "{tmp_path / (name + "-run")}"\n')
    apart = Podman()
    apart.env = {**apart.env, "CONTAINERS_STORAGE_CONF": str(conf)}
    env = {**podman_env(), "OUTRIDER_IMAGE_REBUILD": "1", "OUTRIDER_PODMAN_STORAGE_CONF": str(conf)}
    r = subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh")], env=env, capture_output=True, text=True,
                       timeout=1800, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"the {name} build failed:\n{r.stderr[-4000:]}"
    return build_env_file(r.stdout), apart


def _remove(apart: Podman, tmp_path: Path, name: str) -> None:
    apart.cleanup()
    subprocess.run([apart.exe, "rmi", "--all", "--force"], env=apart.env, capture_output=True, timeout=300)
    shutil.rmtree(tmp_path / name, ignore_errors=True)


def test_a_second_build_from_the_same_input_gives_the_same_image(podman: Podman, built: dict[str, str],
                                                                  tmp_path: Path) -> None:
    first_wheel = _wheel_digest(built["WHEELHOUSE"])
    made: list[tuple[Podman, str]] = []
    try:
        builds = []
        for name in ("first", "second"):
            info, apart = _build_apart(tmp_path, name, built["BASE_IMAGE"])
            made.append((apart, name))
            builds.append((info, apart))
        (first, a), (second, b) = builds
        FIGURES.append(f"a build in a storage of its own, from the cached root tarballs and wheels: "
                       f"{second['BUILD_SECONDS']} s")
        assert first["IMAGE"] == second["IMAGE"] == built["IMAGE"]
        assert _wheel_digest(second["WHEELHOUSE"]) == first_wheel, "the project's wheel came out different"
        for info, apart in ((built, podman), (second, b)):
            if info["IMAGE_ID"] == first["IMAGE_ID"]:
                continue
            layers = [json.loads(p("image", "inspect", first["IMAGE"]))[0]["RootFS"]["Layers"] for p in (a, apart)]
            x, y = _files(a, first["IMAGE"], "first"), _files(apart, info["IMAGE"], "other")
            changes = "\n".join(sorted(p for p in x.keys() | y.keys() if x.get(p) != y.get(p))[:40])
            raise AssertionError(f"two builds of one input gave two images: {first['IMAGE_ID'][:12]} and "
                                 f"{info['IMAGE_ID'][:12]}\nlayers: {layers[0]}\n    vs {layers[1]}\n"
                                 f"files that differ:\n{changes[:4000]}")
        annotations = [json.loads(p("image", "inspect", first["IMAGE"]))[0].get("Annotations") or {} for p in (a, b)]
        assert first["IMAGE_DIGEST"] == second["IMAGE_DIGEST"], \
            f"one image, two manifests: {first['IMAGE_DIGEST']} and {second['IMAGE_DIGEST']}; their annotations: " \
            f"{annotations[0]} vs {annotations[1]}"
        # As a registry gets it (its layers compressed): the digest an `image@sha256:` pin names
        assert _pushed_digest(a, first["IMAGE"], tmp_path / "first.oci") == \
            _pushed_digest(b, second["IMAGE"], tmp_path / "second.oci")
    finally:
        for apart, name in made:
            _remove(apart, tmp_path, name)
