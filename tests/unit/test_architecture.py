"""The architecture as the code has it: the layers and the hook's independence are checked by import-linter in
CI (pyproject.toml, `lint-imports`); this test adds what a contract cannot say: the hook and the spool import
only the standard library."""

from __future__ import annotations

import sys

import grimp


def test_the_hook_and_the_spool_import_only_the_standard_library() -> None:
    graph = grimp.build_graph("outrider", include_external_packages=True)
    hook_side = {m for m in graph.modules if m.startswith(("outrider.hook", "outrider.spool"))}
    assert "outrider.spool" in hook_side and "outrider.hook.api" in hook_side
    external = {imported.split(".")[0] for m in hook_side for imported in graph.find_modules_directly_imported_by(m)
                if not imported.startswith("outrider")}
    assert external and external <= set(sys.stdlib_module_names), external - set(sys.stdlib_module_names)
    internal = {imported for m in hook_side for imported in graph.find_modules_directly_imported_by(m)
                if imported.startswith("outrider")}
    assert all(m.startswith(("outrider.hook", "outrider.spool")) for m in internal), internal


def test_no_module_imports_another_that_imports_it_back() -> None:
    graph = grimp.build_graph("outrider")
    cycles = [(a, b) for a in graph.modules for b in graph.find_modules_directly_imported_by(a)
              if graph.chain_exists(importer=b, imported=a)]
    assert cycles == []
