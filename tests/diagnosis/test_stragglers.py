"""Stragglers from collective wait, with the gloo backend on CPU: four DDP ranks started by torchrun, rank 2 doing
extra matrix products every step, a CPU hog beside them. Under synchronous data parallelism every rank's step takes
as long as the slowest one's, so step time cannot find the slow rank; compute per step (step work less the time
blocked in collectives) does: the slow rank computes longest and waits least, the others wait on it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from outrider.collectors.base import CollectorContext
from outrider.collectors.hook import HookCollector
from outrider.diagnosis.bottleneck import classify
from outrider.diagnosis.signals import signals, snapshot
from outrider.ground.config import Config
from tests.helpers import free_port

pytestmark = pytest.mark.integration
SCRIPT = str(Path(__file__).with_name("zero_config.py"))


def test_the_slow_rank_is_found_and_the_others_wait_on_it(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    spool = tmp_path / "spool"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")},
           "OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_STANDALONE": "false", "OUTRIDER_FLUSH_INTERVAL_S": "0.5"}
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=4",
                            f"--master-port={free_port()}", SCRIPT, "straggler", "10"],
                           env=env, capture_output=True, text=True, timeout=300)
    finally:
        hog.kill()
        hog.wait()
    assert r.returncode == 0, r.stderr[-3000:]
    collector = HookCollector(CollectorContext(Config(spool_dir=str(spool)), hold_spool_lock=False))
    families = collector.collect()  # the ranks have exited: their final values, retired
    collector.close()
    s = signals(snapshot([]), snapshot(families), 10.0)
    ranks = {r.rank: r for r in s.ranks}
    assert set(ranks) == {"0", "1", "2", "3"}, "every rank measured its collective wait"
    assert len({r.steps for r in ranks.values()}) == 1, "synchronous: every rank took the same steps"
    slow = ranks.pop("2")
    assert all(slow.compute_s > 1.5 * other.compute_s for other in ranks.values()), (slow, ranks)
    for other in ranks.values():  # each waits, per step, for at least half of the slow rank's extra compute
        assert other.wait_s - slow.wait_s > 0.5 * (slow.compute_s - other.compute_s), (slow, other)
    verdict = classify(s)
    assert verdict.cls == "communication_bound", verdict.reason
    assert verdict.evidence["straggler_rank"] == 2 and "rank 2 is a straggler" in verdict.reason
