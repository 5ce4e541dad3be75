"""The house's own import-linter contract type, and the measure of how much the contracts allow.

`stdlib_only` (pyproject.toml, `contract_types`; lint-imports puts the working directory on sys.path, so it finds
this module): the listed packages import, between them, one another and the standard library only
(`sys.stdlib_module_names`), directly or not. A list of forbidden third-party names would miss the next dependency
someone adds; this rule needs no list.

    python3 -m tests.import_contracts     # allowed vs used imports between outrider's top-level modules

"Allowed" counts the ordered pairs (a, b) of outrider's top-level modules for which one more import, outrider.a
importing outrider.b, would keep every contract in pyproject.toml; "used" counts the pairs the code imports today
(the direct imports of any module of a from any module of b, lazy ones included).
"""

from __future__ import annotations

import importlib
import sys
import tomllib
from collections.abc import Iterable
from copy import deepcopy
from pathlib import Path
from typing import Any

import grimp
from importlinter import configuration
from importlinter.application import output
from importlinter.application.use_cases import read_user_options
from importlinter.contracts import layers
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck

REPO = Path(__file__).resolve().parents[1]
ROOT = "outrider"


def _within(module: str, packages: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


class StdlibOnlyContract(Contract):
    """modules: packages that import, between them, only one another and the standard library."""

    type_name = "stdlib_only"

    modules = fields.ListField(subfield=fields.StringField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        packages: list[str] = list(self.modules)  # type: ignore[call-overload]
        missing = [p for p in packages if p not in graph.modules]
        if missing:
            raise ValueError(f"{self.name}: not in the graph: {', '.join(missing)}")
        roots = {p.split(".")[0] for p in packages}
        offending = []
        # Direct imports suffice: every internal module they may import is itself one of the checked.
        for importer in sorted(m for m in graph.modules if _within(m, packages)):
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                if imported.split(".")[0] in roots:
                    ok = _within(imported, packages)
                else:
                    ok = imported.split(".")[0] in sys.stdlib_module_names
                if not ok:
                    lines = sorted(d["line_number"] for d in graph.get_import_details(importer=importer,
                                                                                      imported=imported))
                    offending.append((importer, imported, lines))
        return ContractCheck(kept=not offending, warnings=[], metadata={"imports": offending})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for importer, imported, lines in check.metadata["imports"]:
            where = ", ".join(f"l.{n}" for n in lines)
            output.print_error(f"{importer} -> {imported} ({where})")
            output.new_line()


class LayersContract(layers.LayersContract):
    """import-linter's layers, whose `exhaustive` reaches into folders: a child of a container that the layers name
    only through its own children (`commands.cli`, not `commands`) is a folder, each of its modules needs a floor
    too, and the folder itself, having none, imports nothing (its __init__.py is a docstring: importing one of its
    modules costs no other)."""

    type_name = "layers"

    def _get_undeclared_modules(self, graph: grimp.ImportGraph, containers: set[str]) -> set[str]:
        if not self.exhaustive:
            return set()
        ignored: set[str] = set(self.exhaustive_ignores or ())  # type: ignore[call-overload]
        declared = {tail.name for tail in self.all_module_tails} | ignored
        undeclared = set()
        for container in containers:
            pending = [m[len(container) + 1:] for m in graph.find_children(container)]
            while pending:
                tail = pending.pop()
                if tail in declared:
                    continue
                if any(d.startswith(tail + ".") for d in declared):  # a folder
                    pending += [m[len(container) + 1:] for m in graph.find_children(f"{container}.{tail}")]
                    if not graph.find_modules_directly_imported_by(f"{container}.{tail}"):
                        continue
                undeclared.add(f"{container}.{tail}")
        return undeclared


_BUILT_IN = {"layers": "layers.LayersContract", "forbidden": "forbidden.ForbiddenContract",
             "independence": "independence.IndependenceContract",
             "acyclic_siblings": "acyclic_siblings.AcyclicSiblingsContract"}


def _contracts(config: Path) -> list[Contract]:
    """The contracts of a config file, made as lint-imports makes them."""
    configuration.configure()
    options = read_user_options(str(config))
    paths = {kind: f"importlinter.contracts.{path}" for kind, path in _BUILT_IN.items()}
    paths.update(line.split(": ", 1) for line in options.session_options.get("contract_types", []))
    made = []
    for contract_options in options.contracts_options:
        module, _, name = paths[contract_options["type"]].rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        made.append(cls(name=contract_options["name"], session_options=options.session_options,
                        contract_options=contract_options))
    return made


def top_level(graph: grimp.ImportGraph, config: Path = REPO / "pyproject.toml") -> list[str]:
    """outrider's parts, the units the floors are made of: each module or package the layers contract names (a
    folder's modules, not the folder)."""
    linter = tomllib.loads(config.read_text(encoding="utf-8"))["tool"]["importlinter"]
    named = {f"{ROOT}.{m.strip()}" for c in linter["contracts"] if c["type"] == "layers"
             for layer in c["layers"] for m in layer.split("|")}
    return sorted(named & set(graph.modules))


def used_pairs(graph: grimp.ImportGraph) -> set[tuple[str, str]]:
    tops = top_level(graph)

    def owner(module: str) -> str | None:
        return next((t for t in tops if _within(module, [t])), None)

    pairs = set()
    for importer in graph.modules:
        a = owner(importer)
        if a is None:
            continue
        for imported in graph.find_modules_directly_imported_by(importer):
            b = owner(imported)
            if b is not None and b != a:
                pairs.add((a, b))
    return pairs


def allowed_pairs(graph: grimp.ImportGraph, config: Path = REPO / "pyproject.toml") -> set[tuple[str, str]]:
    contracts = _contracts(config)
    used = used_pairs(graph)
    allowed = set()
    tops = top_level(graph, config)
    for a in tops:
        for b in tops:
            if a == b:
                continue
            if (a, b) in used:  # the code has it and lint-imports passes (or the caller sees that it fails)
                allowed.add((a, b))
                continue
            trial = deepcopy(graph)
            trial.add_import(importer=a, imported=b)
            if all(c.check(deepcopy(trial), verbose=False).kept for c in contracts):
                allowed.add((a, b))
    return allowed


def measure(config: Path = REPO / "pyproject.toml") -> dict[str, Any]:
    graph = grimp.build_graph(ROOT, include_external_packages=True)
    used, allowed = used_pairs(graph), allowed_pairs(graph, config)
    return {"modules": len(top_level(graph)), "used": used, "allowed": allowed}


def main() -> int:
    m = measure()
    short = len(ROOT) + 1
    print(f"{m['modules']} top-level modules; {len(m['allowed'])} imports between them allowed, "
          f"{len(m['used'])} used")
    for a, b in sorted(m["allowed"] - m["used"]):
        print(f"  allowed, unused: {a[short:]} -> {b[short:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
