"""Writes every generated file of the repository from its one source; `--check` writes nothing and lists the
files that drifted (exit 1), which a test runs.

    python scripts/generate.py            # after editing a source below
    python scripts/generate.py --check

    docs/metrics.md                      <- agent/outrider/metrics/catalog.py (the metric table)
    dashboards/*.json                    <- agent/outrider/dashboards/ (dashboards as code; needs the [grafana] extra)
    helm/outrider/files/dashboards/*     <- the dashboards above, for the chart's ConfigMaps
    helm/outrider/files/outrider.rules.yaml <- alerts/outrider.rules.yaml, for the chart's PrometheusRule
    README.md, the configuration table   <- agent/outrider/config.py (keys, defaults, bounds, help)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "agent"))

from outrider import config  # noqa: E402
from outrider.dashboards import render_all  # noqa: E402
from outrider.links import DEFAULT_DOCS_URL  # noqa: E402
from outrider.metrics.reference import render_reference  # noqa: E402

BEGIN = "<!-- BEGIN GENERATED: configuration table (python scripts/generate.py) -->"
END = "<!-- END GENERATED: configuration table -->"


def _default(f: dataclasses.Field[object]) -> str:
    value = f.default
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple):
        return "`[" + ", ".join(str(v) for v in value) + "]`" if value else "empty"
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    return "`" + str(value).replace("|", "\\|") + "`" if value != "" else "empty"


def _number(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def _bounds(name: str) -> str:
    b = config.BOUNDS.get(name)
    if b is None:
        return ""
    return f" ({_number(b.low)} to {_number(b.high)})"


def config_table() -> str:
    rows = ["| key | default | environment | what |", "|---|---|---|---|"]
    for name, f in config.FIELDS.items():
        text = str(f.metadata.get("help", "")).replace("|", "\\|") + _bounds(name)
        rows.append(f"| `{name}` | {_default(f)} | `{config.ENV_PREFIX}{name.upper()}` | {text} |")
    return "\n".join(rows) + "\n"


def readme(current: str) -> str:
    if BEGIN not in current or END not in current:
        raise SystemExit(f"README.md lacks the markers {BEGIN!r} ... {END!r}")
    head, rest = current.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{config_table()}{END}{tail}"


def outputs() -> dict[Path, str]:
    out: dict[Path, str] = {REPO / "docs" / "metrics.md": render_reference()}
    for name, text in render_all(DEFAULT_DOCS_URL).items():  # never a mirror set in this shell
        out[REPO / "dashboards" / name] = text
        out[REPO / "helm" / "outrider" / "files" / "dashboards" / name] = text
    out[REPO / "helm" / "outrider" / "files" / "outrider.rules.yaml"] = \
        (REPO / "alerts" / "outrider.rules.yaml").read_text(encoding="utf-8")
    out[REPO / "README.md"] = readme((REPO / "README.md").read_text(encoding="utf-8"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="write nothing; list drifted files and exit 1 if any")
    args = ap.parse_args()
    drifted = []
    wanted = outputs()
    for folder in (REPO / "dashboards", REPO / "helm" / "outrider" / "files" / "dashboards"):
        for stale in sorted(set(folder.glob("*.json")) - set(wanted)):
            drifted.append(stale.relative_to(REPO))
            if not args.check:
                stale.unlink()
    for path, text in wanted.items():
        have = path.read_text(encoding="utf-8") if path.exists() else None
        if have == text:
            continue
        drifted.append(path.relative_to(REPO))
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    for path in drifted:
        print(f"{'drifted' if args.check else 'wrote'}: {path}")
    if args.check and drifted:
        print("run: python scripts/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
