"""The architecture as the code has it: the contracts in pyproject.toml (`lint-imports` in CI) keep the code, and each
import the design rules out breaks one of them, the hook's "standard library only" among them."""

from __future__ import annotations

from copy import deepcopy
from functools import cache

import grimp
import pytest
from importlinter.domain.contract import Contract

from tests import import_contracts


@cache
def _graph() -> grimp.ImportGraph:
    return grimp.build_graph("outrider", include_external_packages=True)


@cache
def _contracts() -> tuple[Contract, ...]:
    return tuple(import_contracts._contracts(import_contracts.REPO / "pyproject.toml"))


def _broken(graph: grimp.ImportGraph) -> list[str]:
    return [c.name for c in _contracts() if not c.check(deepcopy(graph), verbose=False).kept]


def _broken_by(importer: str, imported: str) -> list[str]:
    graph = deepcopy(_graph())
    graph.add_import(importer=importer, imported=imported)
    return _broken(graph)


def test_the_code_keeps_every_contract() -> None:
    assert _broken(_graph()) == []


@pytest.mark.parametrize(("importer", "imported"), [
    ("outrider.hook.api", "yaml"),  # a third-party package in the workload's process
    ("outrider.hook.torch_integration", "torch"),  # torch is found in sys.modules, never imported
    ("outrider.shared.spool", "re2"),
    ("outrider.hook.api", "outrider.metrics.catalog"),  # the agent's code in the workload's process
    ("outrider.shared.spool", "outrider.ground.config"),
    ("outrider.dashboards.agents", "outrider.wiring.agent"),  # the review's examples of wrong-but-downward imports
    ("outrider.rules.engine", "outrider.collectors.gpu"),
    ("outrider.commands.standalone", "outrider.hook.election"),  # the agent knows the hook through the spool only
    ("outrider.exporters.otlp", "outrider.rules.engine"),  # collecting, alerting, exporting meet in wiring/agent.py
    ("outrider.notify.base", "outrider.wiring.sampler"),
    ("outrider.collectors.host", "outrider.exporters.prometheus"),
    ("outrider.commands.runner", "outrider.wiring.sampler"),  # commands start the agent whole
    ("outrider.commands.top", "outrider.collectors.host"),  # top reads /metrics, not the agent's code
    ("outrider.wiring.agent", "outrider.adapters.nvml"),  # NVML through the gpu collector only
    ("outrider.commands.cli", "outrider.adapters.otel_bridge"),  # the bridges are the public API's
    ("outrider.rules.engine", "outrider.adapters.outbound"),  # only collectors, exporters and notifiers call out
    ("outrider.diagnosis.signals", "outrider.ground.config"),  # libraries take values
    ("outrider.metrics.family", "outrider.ground.regex"),  # leaves import nothing of outrider
    ("outrider.ground.config", "outrider.collectors"),  # one way down
    ("outrider.kernel.procfs", "outrider.hook.threads"),  # the kernel's readers serve the hook and the agent alike
    ("outrider.kernel.cgroupfs", "outrider.collectors.base"),
    ("outrider.kernel.kmsg", "re2"),  # the hook imports them: the standard library only
    ("outrider.rules.engine", "outrider.kernel.procfs"),  # /proc is read by the hook, collectors and commands only
])
def test_an_import_the_design_rules_out_breaks_a_contract(importer: str, imported: str) -> None:
    assert _broken_by(importer, imported)


@pytest.mark.parametrize(("importer", "imported"), [
    ("outrider.hook.api", "json"),
    ("outrider.hook.series", "outrider.shared.spool"),
    ("outrider.shared.spool", "xml.etree"),
    ("outrider.hook.threads", "outrider.kernel.procfs"),  # one /proc reader for the hook and the agent
    ("outrider.kernel.cgroupfs", "outrider.kernel.procfs"),
])
def test_the_hook_may_import_the_stdlib_the_spool_and_the_kernel_readers(importer: str, imported: str) -> None:
    assert _broken_by(importer, imported) == []


def test_the_measure_counts_what_the_code_uses_and_what_one_more_import_could_add() -> None:
    graph = _graph()
    used = import_contracts.used_pairs(graph)
    assert ("outrider.hook", "outrider.shared.spool") in used and ("outrider.shared.spool", "outrider.hook") not in used
    allowed = import_contracts.allowed_pairs(graph)
    assert used <= allowed
    assert ("outrider.wiring.agent", "outrider.ground.logs") in allowed - used  # the ground floor is everyone's
    assert ("outrider.dashboards", "outrider.wiring.agent") not in allowed
    assert ("outrider.hook", "outrider.shared.version") not in allowed


def test_no_module_imports_another_that_imports_it_back() -> None:
    graph = grimp.build_graph("outrider")
    cycles = [(a, b) for a in graph.modules for b in graph.find_modules_directly_imported_by(a)
              if graph.chain_exists(importer=b, imported=a)]
    assert cycles == []
