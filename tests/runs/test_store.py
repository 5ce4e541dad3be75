"""The run store's ids: one per run, whatever the clock's second and the PID say."""

from __future__ import annotations

from pathlib import Path

from outrider.ground.clock import ManualClock
from outrider.runs.store import RunStore


def test_runs_started_in_the_same_second_by_one_process_get_ids_of_their_own(tmp_path: Path) -> None:
    clock = ManualClock(now=0.25, epoch=1_796_126_400.0)  # three runs within the same second
    store = RunStore(tmp_path, clock=clock.clock())
    try:
        ids = []
        for i in range(3):
            ids.append(store.start_run([f"train-{i}.py"]))
            clock.now += 0.25
        base = ids[0]
        assert ids == [base, f"{base}-2", f"{base}-3"]
        assert {run_id: command for run_id, _, _, _, command in store.list_runs()} == {
            ids[0]: ["train-0.py"], ids[1]: ["train-1.py"], ids[2]: ["train-2.py"]}
        assert [store.resolve(run_id) for run_id in ids] == ids, "an exact id, though the next run's extends it"
        assert store.resolve("last") == ids[2]
    finally:
        store.close()
