"""Generated, not copied: every generated file (the metrics reference, the dashboards' JSON and the chart's copies,
the chart's rule file, the README's configuration table) equals what scripts/generate.py makes from its source."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

GENERATE = [sys.executable, str(REPO / "scripts" / "generate.py")]


def test_no_generated_file_has_drifted_from_its_source() -> None:
    r = subprocess.run([*GENERATE, "--check"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{r.stdout}{r.stderr}"


def test_the_check_names_a_file_that_drifted(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    for part in ("agent", "alerts", "dashboards", "docs", "helm", "scripts"):
        shutil.copytree(REPO / part, copy / part, symlinks=True)
    shutil.copy(REPO / "README.md", copy / "README.md")
    readme = copy / "README.md"
    readme.write_text(readme.read_text().replace("| `interval_s` |", "| `interval_seconds` |"))
    (copy / "helm" / "outrider" / "files" / "dashboards" / "outrider-host.json").write_text("{}\n")
    r = subprocess.run([sys.executable, str(copy / "scripts" / "generate.py"), "--check"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 1
    assert "drifted: README.md" in r.stdout and "drifted: helm/outrider/files/dashboards/outrider-host.json" in r.stdout
    subprocess.run([sys.executable, str(copy / "scripts" / "generate.py")], check=True, capture_output=True,
                   timeout=300)
    assert readme.read_text() == (REPO / "README.md").read_text(), "writing mends what drifted"
