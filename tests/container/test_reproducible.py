"""Two builds from one input give one image: scripts/build-image.sh run again with OUTRIDER_IMAGE_REBUILD (the
project's wheel built anew, podman's layer cache unused) from the cached base and the locked wheels gives, under
the same tag, the same wheel and the same image ID (the digest of the image's configuration, which names every
layer's digest). What differs, if anything, is shown file by file."""

from __future__ import annotations

import hashlib
import io
import json
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


def test_a_second_build_from_the_same_input_gives_the_same_image(podman: Podman, built: dict[str, str]) -> None:
    first_wheel = _wheel_digest(built["WHEELHOUSE"])
    keep = "localhost/outrider-test-first-build:" + built["IMAGE"].rsplit(":", 1)[1]
    podman("tag", built["IMAGE_ID"], keep)  # the first build stays inspectable whatever the second one gives
    try:
        r = subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh")],
                           env={**podman_env(), "OUTRIDER_IMAGE_REBUILD": "1"}, capture_output=True, text=True,
                           timeout=1800, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, f"the second build failed:\n{r.stderr[-4000:]}"
        second = build_env_file(r.stdout)
        FIGURES.append(f"second build from the cached base and wheels: {second['BUILD_SECONDS']} s")
        assert second["IMAGE"] == built["IMAGE"]
        assert _wheel_digest(second["WHEELHOUSE"]) == first_wheel, "the project's wheel came out different"
        if second["IMAGE_ID"] != built["IMAGE_ID"]:
            layers = [json.loads(podman("image", "inspect", image))[0]["RootFS"]["Layers"]
                      for image in (keep, second["IMAGE"])]
            a, b = _files(podman, keep, "first"), _files(podman, second["IMAGE"], "second")
            changes = "\n".join(sorted(p for p in a.keys() | b.keys() if a.get(p) != b.get(p))[:40])
            raise AssertionError(f"two builds of one input gave two images: {built['IMAGE_ID'][:12]} and "
                                 f"{second['IMAGE_ID'][:12]}\nlayers: {layers[0]}\n    vs {layers[1]}\n"
                                 f"files that differ:\n{changes[:4000]}")
    finally:
        podman("rmi", keep, check=False)
