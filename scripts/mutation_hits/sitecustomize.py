"""Copied by scripts/mutation.py into a module's work directory (`mutants/`, on the PYTHONPATH of every process a
test starts): in a process started during mutmut's coverage pass, the mutated functions it calls are written to a
file, one name a line, for the pass to merge (mutation_hits_plugin.py).

mutmut learns which test reaches which function from its trampolines' hits in the test process only; a test that
runs the module in a subprocess (a workload with the hook, an agent) reached nothing, so mutmut ran no test for
those mutants. Its own recorder would also fail there: it loads mutmut's settings from the working directory, which
a subprocess does not share (the test then failed, and with it the pass). Nothing happens outside that pass."""

from __future__ import annotations

import contextlib
import os

HITS = os.environ.get("MUTMUT_SUBPROCESS_HITS", "")


def _install() -> None:
    import mutmut.mutation.trampoline as trampoline

    path = os.path.join(HITS, f"{os.getpid()}.hits")
    seen: set[str] = set()

    def record(name: str, caller: str | None = None) -> None:
        if name in seen:
            return
        seen.add(name)
        # at once, not at exit: a test may kill it; UTF-8 whatever the process's locale (mutants' names are not
        # ASCII, and a test may start a process in the C locale)
        with contextlib.suppress(OSError, ValueError), open(path, "a", encoding="utf-8") as fh:
            fh.write(name + "\n")

    trampoline.record_trampoline_hit = record  # type: ignore[assignment]


if HITS and os.environ.get("MUTANT_UNDER_TEST") == "stats":
    with contextlib.suppress(Exception):  # never in the way of the process itself
        _install()
