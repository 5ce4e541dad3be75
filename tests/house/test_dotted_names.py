"""Names the text cites resolve: every `outrider.x.y` in a docstring, README.md or docs/*.md, and every backticked
`module.name` whose first part is one of outrider's modules, names a module, or a function, class, constant or
attribute that module defines. Resolved from the source (ast), so nothing of the agent is imported but the metric
table, whose OpenTelemetry names (`outrider.train.steps`, `process.pid`) are telemetry, not Python."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "agent" / "outrider"
FILE_SUFFIXES = {"yaml", "yml", "json", "md", "py", "txt", "toml", "so", "h", "c", "sh", "tpl", "lock",
                 "svg", "html", "proto"}
FULL = re.compile(r"(?<![\w/.-])outrider(?:\.\w+)+")
BACKTICKED = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\([^`]*\))?`")
# Names of other things that read like ours: keys of the chart's values (`outrider.sidecar`), the annotations'
# domain, the WSGI environ key the middleware reads, OpenTelemetry's own API.
FOREIGN_PREFIXES = ("outrider.dev", "outrider.sidecar", "outrider.workload", "outrider.route",
                    "metrics.get_meter_provider")


@cache
def telemetry_names() -> frozenset[str]:
    """The OTLP metric and attribute names of the metric table, and a histogram's parts (`NAME.bucket`)."""
    from outrider.metrics.catalog import CATALOG

    names = set()
    for d in CATALOG.values():
        names |= {d.otel_name, *(f"{d.otel_name}.{part}" for part in ("bucket", "count", "sum"))}
        names |= {label.otel for label in (*d.labels, *d.enrichment)} | {label.otel_other for label in d.labels}
        names |= {key for key, _ in d.otel_attributes}
    return frozenset(names - {""})


@cache
def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


@cache
def _tree(module: str) -> ast.Module:
    return ast.parse(modules()[module].read_text(encoding="utf-8"))


def _defined(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Names a module or class body defines, to the node that defines them (an import: the alias)."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        names[n.id] = node
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                names.update({e.value: node for e in ast.walk(node.value) if isinstance(e, ast.Constant)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, ast.If | ast.Try):  # TYPE_CHECKING blocks, optional imports
            names.update(_defined(node.body))
            for handler in getattr(node, "handlers", []):
                names.update(_defined(handler.body))
    return names


def _instance_attributes(cls: ast.ClassDef) -> set[str]:
    return {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
            and isinstance(n.value, ast.Name) and n.value.id == "self"}


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if module in modules():
            return _attributes_resolve(module, parts[cut:])
    return False


def _attributes_resolve(module: str, attrs: list[str]) -> bool:
    if not attrs:
        return True
    node = _defined(_tree(module).body).get(attrs[0])
    if node is None:
        return f"{module}.{attrs[0]}" in modules()
    rest = attrs[1:]
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        alias = next(a for a in node.names if (a.asname or a.name) == attrs[0])
        return resolves(".".join([node.module, alias.name, *rest]))
    if not rest:
        return True
    if isinstance(node, ast.ClassDef):
        return rest[0] in _defined(node.body) or rest[0] in _instance_attributes(node)
    return False


def _candidates(first: str) -> list[str]:
    """Modules a backticked name's first part may mean: those with that last name (`spool`, `procfs`, `api`)."""
    return [m for m in modules() if m.rsplit(".", 1)[-1] == first and m != "outrider"]


def cited(text: str) -> Iterator[str]:
    for m in FULL.finditer(text):
        yield m.group(0)
    for m in BACKTICKED.finditer(text):
        name = m.group(1)
        if not name.startswith("outrider.") and _candidates(name.split(".")[0]):
            yield name


def _docstrings(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield doc


def _texts() -> Iterator[tuple[str, str]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        for doc in _docstrings(path):
            yield str(path.relative_to(REPO)), doc
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        yield str(path.relative_to(REPO)), path.read_text(encoding="utf-8")


def unresolved(name: str) -> bool:
    if name.rsplit(".", 1)[-1] in FILE_SUFFIXES:  # a file's name (alerts/outrider.rules.yaml), not a module
        return False
    if name in telemetry_names() or name.startswith(FOREIGN_PREFIXES):
        return False
    if name.startswith("outrider."):
        return not resolves(name)
    first, _, rest = name.partition(".")
    return not any(resolves(f"{m}.{rest}") for m in _candidates(first))


def test_every_dotted_name_in_the_docstrings_and_docs_resolves() -> None:
    bad = sorted({(where, name) for where, text in _texts() for name in cited(text) if unresolved(name)})
    assert bad == []


@pytest.mark.parametrize(("name", "ok"), [
    ("outrider.shared.spool", True),
    ("outrider.shared.spool.try_lock", True),
    ("outrider.instrument", True),  # re-exported by outrider/__init__.py from hook/api.py
    ("outrider.hook.shard", False),  # a module that does not exist
    ("outrider.shared.spool.read_shard", False),  # a function that does not exist
    ("spool.EXIT_ANOTHER_AGENT", True),
    ("procfs.no_such_parser", False),
    ("outrider.OutriderMiddleware", True),  # in outrider.__all__, loaded lazily
    ("outrider.train.steps", True),  # an OTLP name from the metric table
    ("outrider.hook.dropped", True),
    ("outrider.hook.dropped_series", False),
    ("agent.lock", True),  # a file of the spool
])
def test_the_resolver_tells_a_real_name_from_a_stale_one(name: str, ok: bool) -> None:
    names = list(cited(f"`{name}`"))
    assert names and all(unresolved(n) is not ok for n in names)
