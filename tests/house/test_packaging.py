"""What a pip-installed agent needs is in the wheel: the rule catalog its evaluator loads by default, the tunables,
the demo's rules, and the evaluator's parser as a runtime dependency (a wheel without them starts an agent that
cannot evaluate its rules; found by installing the wheel in a fresh virtual environment)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from tests.helpers import REPO


def test_the_wheel_carries_the_rules_and_the_parser_dependency(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path), str(REPO)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("outrider-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        packaged_rules = z.read("outrider/alerts/outrider.rules.yaml")
    for path in ("outrider/alerts/outrider.rules.yaml", "outrider/alerts/tunables.yaml",
                 "outrider/commands/demo/rules.yaml"):
        assert path in names, path
    assert packaged_rules == (REPO / "alerts" / "outrider.rules.yaml").read_bytes()  # the one source, copied
    requires = [line.split(":", 1)[1].strip().lower() for line in metadata.splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert any(r.startswith("promql-parser") for r in requires), requires
    assert any(r.startswith("pyyaml") for r in requires), requires


def test_one_python_floor_for_the_install_the_linter_the_type_checker_and_the_docs() -> None:
    # requires-python is what pip refuses below; ruff's target and mypy's python_version judge the code for the
    # same Python, and the install line in the docs says it: a floor raised or lowered in one place alone means code
    # checked for a Python pip never installs on, or the reverse (3.10's was: the grafana and dev extras could not
    # install there at all)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    floor = re.fullmatch(r">=3\.(\d+)", project["project"]["requires-python"])
    assert floor, project["project"]["requires-python"]
    minor = floor.group(1)
    assert project["tool"]["ruff"]["target-version"] == f"py3{minor}"
    assert project["tool"]["mypy"]["python_version"] == f"3.{minor}"
    assert f"Python >= 3.{minor};" in (REPO / "docs" / "running.md").read_text()
