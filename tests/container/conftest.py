"""Fixtures of the container tests: the agent's image (built by scripts/build-image.sh, which .ci/run runs first;
run alone, the tests build it themselves, or find it already built for this tree), the workload image, podman
with cleanup by id, and the figures the tests measure, printed at the end of the run."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import need_binary
from tests.container.podman import Podman, build_env_file, build_workload_image, podman_env
from tests.helpers import REPO

FIGURES: list[str] = []


@pytest.fixture(scope="session")
def built() -> dict[str, str]:
    for tool in ("podman", "mmdebstrap", "runc"):
        need_binary(tool)
    r = subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh")], env=podman_env(), capture_output=True,
                       text=True, timeout=1800, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"scripts/build-image.sh failed:\n{r.stderr[-4000:]}"
    info = build_env_file(r.stdout)
    FIGURES.append(f"image {info['IMAGE']}: {int(info['SIZE_BYTES']) / 1e6:.0f} MB")
    return info


@pytest.fixture(scope="session")
def workload_image(built: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> str:
    podman = Podman()
    workload = (Path(__file__).parent / "workload.py").read_text()
    import hashlib

    key = hashlib.sha256((built["IMAGE"] + workload).encode()).hexdigest()[:16]
    return build_workload_image(podman, built["BASE_IMAGE"], Path(built["WHEELHOUSE"]),
                                f"localhost/outrider-test-workload:{key}", tmp_path_factory.mktemp("workload"))


@pytest.fixture
def podman() -> Iterator[Podman]:
    p = Podman()
    try:
        yield p
    finally:
        p.cleanup()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FIGURES:
        terminalreporter.write_sep("-", "container figures")
        for line in FIGURES:
            terminalreporter.write_line(line)
