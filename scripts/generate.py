"""Writes every generated file of the repository from its one source; `--check` writes nothing and lists the
files that drifted (exit 1), which a test runs.

    python scripts/generate.py            # after editing a source below
    python scripts/generate.py --check

    docs/metrics.md                      <- agent/outrider/metrics/catalog.py (the metric table)
    dashboards/*.json                    <- agent/outrider/dashboards/ (dashboards as code; needs the [grafana] extra)
    helm/outrider/files/dashboards/*     <- the dashboards above, for the chart's ConfigMaps
    helm/outrider/files/outrider.rules.yaml <- alerts/outrider.rules.yaml, for the chart's PrometheusRule
    docs/configuration.md, the table     <- agent/outrider/ground/config.py (keys, defaults, bounds, help)
    docs/alerts.md, every alert          <- alerts/outrider.rules.yaml (severity, for, description, runbook)
    docs/architecture.md, the layers     <- pyproject.toml (the import-linter contracts)
    docs/architecture.md, the layout     <- agent/outrider/ (its modules and packages, their docstrings)
    docs/efficiency.md, the peak table   <- agent/outrider/ground/peaks.py (the GPUs' dense peaks per dtype)
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import os
import re
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "agent"))

from outrider.dashboards import render_all  # noqa: E402
from outrider.ground import config, peaks  # noqa: E402
from outrider.ground.links import DEFAULT_DOCS_URL  # noqa: E402
from outrider.metrics.reference import render_reference  # noqa: E402
from outrider.rules import promql  # noqa: E402
from outrider.rules.files import load_rules  # noqa: E402


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


_TEMPLATE = re.compile(r"\{\{\s*(\$labels\.(\w+)|\$value[^}]*)\s*\}\}")


def _words(annotation: str) -> str:
    """An annotation with its templates as words: `{{ $labels.route }}` is *route*, `{{ $value | ... }}` *value*."""
    text = _TEMPLATE.sub(lambda m: f"*{m.group(2) or 'value'}*", annotation)
    return " ".join(text.split()).replace("|", "\\|")


def _reads(expr: str) -> str:
    names = dict.fromkeys(n for vs, _ in promql.selectors(promql.parse(expr)) if (n := promql.selector_name(vs)))
    return ", ".join(f"`{n}`" for n in names) or "no series"


def _runbook(url: str) -> str:
    """The runbook as a link relative to docs/ (so that the docs link check sees its file and heading)."""
    if not url.startswith(DEFAULT_DOCS_URL):
        return f"<{url}>"
    path = url[len(DEFAULT_DOCS_URL):]
    return f"[{path.rsplit('/', 1)[-1].replace('.md', '')}](../{path})"


def alerts_reference(rules: dict[str, Any] | None = None) -> str:
    """Every alert of the rule file, group by group, then the recording rules."""
    rules = load_rules(REPO / "alerts" / "outrider.rules.yaml") if rules is None else rules
    out: list[str] = []
    recorded = ["| series | group | reads |", "|---|---|---|"]
    for group in rules["groups"]:
        alerts = [r for r in group["rules"] if "alert" in r]
        recorded += [f"| `{r['record']}` | {group['name']} | {_reads(r['expr'])} |"
                     for r in group["rules"] if "record" in r]
        if not alerts:
            continue
        every = f", evaluated every {group['interval']}" if "interval" in group else ""
        out += [f"### {group['name']}", "", f"{len(alerts)} alerts{every}.", "",
                "| alert | severity | for | what it says | reads | runbook |", "|---|---|---|---|---|---|"]
        for r in alerts:
            notes = r.get("annotations", {})
            wait = r.get("for", "0s") + (f" (keeps firing {r['keep_firing_for']})" if "keep_firing_for" in r else "")
            says = _words(notes.get("description") or notes.get("summary", ""))
            out.append(f"| `{r['alert']}` | {r.get('labels', {}).get('severity', '')} | {wait} | {says} | "
                       f"{_reads(r['expr'])} | {_runbook(notes.get('runbook_url', ''))} |")
        out.append("")
    return "\n".join([*out, "### Recording rules", "", *recorded]) + "\n"


def layers(pyproject: Path = REPO / "pyproject.toml") -> str:
    """The import-linter contracts: the floors of the layers contract drawn top down, then every contract's name."""
    linter = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["importlinter"]
    out: list[str] = []
    for contract in linter["contracts"]:
        if contract["type"] == "layers":
            floors = [" · ".join(m.strip() for m in layer.split("|")) for layer in contract["layers"]]
            out += ["```", *(f"{'   ' * i}{'└─ ' if i else ''}{floor}" for i, floor in enumerate(floors)), "```", ""]
    out += ["| contract | type |", "|---|---|"]
    out += [f"| {c['name'].replace('|', chr(92) + '|')} | {c['type']} |" for c in linter["contracts"]]
    return "\n".join(out) + "\n"


def _first_sentence(source: Path) -> str:
    """The first sentence of a module's docstring (its first line is often cut mid-phrase by the wrap at 120)."""
    doc = ast.get_docstring(ast.parse(source.read_text(encoding="utf-8")))
    if not doc:
        raise SystemExit(f"{source.relative_to(REPO)} has no docstring: a module starts with one saying what it owns")
    paragraph = " ".join(doc.split("\n\n", 1)[0].split())
    return re.split(r"(?<=\.)\s+(?=[A-Z`(])", paragraph, maxsplit=1)[0]


def folders(pyproject: Path = REPO / "pyproject.toml") -> set[str]:
    """The package's folders: packages that group modules of one kind, each module with its own floor (the layers
    contract names `commands.cli`, not `commands`)."""
    linter = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["importlinter"]
    return {m.strip().split(".")[0] for c in linter["contracts"] if c["type"] == "layers"
            for layer in c["layers"] for m in layer.split("|") if "." in m}


def layout(package: Path = REPO / "agent" / "outrider", grouped: set[str] | None = None) -> str:
    """The package's map: each top-level module and package with the first sentence of its docstring, a package
    with its modules (a sub-package ends in /), a folder (`folders()`) with each of its modules and packages as an
    entry of its own, read from the files without importing them."""
    grouped = folders() if grouped is None else grouped
    name_column, width = 25, 120
    out = ["```", f"{package.relative_to(REPO).as_posix() + '/':<{name_column}}the package (import outrider)"]

    def entry(name: str, text: str, depth: int = 1) -> None:
        lines = textwrap.wrap(text, width - name_column, break_on_hyphens=False) or [""]
        out.append(f"{'  ' * depth + name:<{name_column - 1}} {lines[0]}")
        out.extend(" " * name_column + line for line in lines[1:])

    def entries(folder: Path, depth: int) -> None:
        for path in sorted(folder.iterdir(), key=lambda p: p.name):
            if path.suffix == ".py" and not (depth > 1 and path.name == "__init__.py"):  # a folder's: said above
                entry(path.name, _first_sentence(path), depth)
            elif path.is_dir() and (path / "__init__.py").exists():
                entry(path.name + "/", _first_sentence(path / "__init__.py"), depth)
                if depth == 1 and path.name in grouped:
                    entries(path, depth + 1)
                    continue
                parts = sorted((p.stem if p.suffix == ".py" else p.name + "/") for p in path.iterdir()
                               if (p.suffix == ".py" and p.name != "__init__.py")
                               or (p.is_dir() and (p / "__init__.py").exists()))
                entry("", "[" + " · ".join(parts) + "]", depth)
            elif path.is_symlink() and path.is_dir():  # package data kept once elsewhere in the repository (alerts/)
                entry(path.name + "/", f"-> {os.readlink(path)} (package data, not code)", depth)

    entries(package, 1)
    return "\n".join([*out, "```"]) + "\n"


def between(current: str, marker: str, body: str, where: str) -> str:
    """`current` with the text between the markers of `marker` replaced by `body`."""
    begin, end = f"<!-- BEGIN GENERATED: {marker} (python scripts/generate.py) -->", f"<!-- END GENERATED: {marker} -->"
    if begin not in current or end not in current:
        raise SystemExit(f"{where} lacks the markers {begin!r} ... {end!r}")
    head, rest = current.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}{end}{tail}"


def peak_table() -> str:
    """The GPU peak table (outrider/ground/peaks.py): dense TFLOP/s per dtype, the clock they assume, the source."""
    rows = ["| model | NVML names (regular expression) | " + " | ".join(peaks.DTYPES) + " | SM clock | source |",
            "|---|---|" + "---:|" * len(peaks.DTYPES) + "---:|---|"]
    for row in peaks.GPU_PEAKS:
        figures = " | ".join(_number(row.flops[d] / 1e12) if d in row.flops else "-" for d in peaks.DTYPES)
        clock = f"{_number(row.boost_mhz)} MHz" if row.boost_mhz else "-"
        pattern = row.pattern.replace("|", "\\|")
        rows.append(f"| {row.model} | `{pattern}` | {figures} | {clock} | {row.source} |")
    return "\n".join(rows) + "\n"


# Generated parts of hand-written pages: the page, the markers' name, what makes the part.
PARTS = (("docs/efficiency.md", "peak table", peak_table),
         ("docs/configuration.md", "configuration table", config_table),
         ("docs/alerts.md", "alerts reference", alerts_reference),
         ("docs/architecture.md", "layers", layers),
         ("docs/architecture.md", "layout", layout))


def outputs() -> dict[Path, str]:
    out: dict[Path, str] = {REPO / "docs" / "metrics.md": render_reference()}
    for name, text in render_all(DEFAULT_DOCS_URL).items():  # never a mirror set in this shell
        out[REPO / "dashboards" / name] = text
        out[REPO / "helm" / "outrider" / "files" / "dashboards" / name] = text
    out[REPO / "helm" / "outrider" / "files" / "outrider.rules.yaml"] = \
        (REPO / "alerts" / "outrider.rules.yaml").read_text(encoding="utf-8")
    for page, marker, make in PARTS:  # a page with two generated parts gets both
        current = out.get(REPO / page) or (REPO / page).read_text(encoding="utf-8")
        out[REPO / page] = between(current, marker, make(), page)
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
