"""The sweep loop: a failing collector is reported and skipped; the rest of the sweep survives."""

from __future__ import annotations

from pathlib import Path

from outrider.collectors.base import Collector
from outrider.collectors.host import HostCollector
from outrider.ground.config import Config
from outrider.metrics.family import Family
from outrider.wiring.sampler import Sampler
from tests.helpers import samples, value


class Broken(Collector):
    name = "broken"

    def collect(self) -> list[Family]:
        raise RuntimeError("NVML exploded")


def sampler_with_broken(proc_fixture: Path) -> Sampler:
    from outrider.collectors.self import SelfCollector

    s = Sampler(Config(proc_root=str(proc_fixture), filesystems=()), collectors=[])
    s.collectors = [Broken(s.ctx), HostCollector(s.ctx), SelfCollector(s.ctx)]
    return s


def test_a_failing_collector_reports_zero_and_the_sweep_goes_on(proc_fixture: Path) -> None:
    s = sampler_with_broken(proc_fixture)
    s.sweep()
    s.sweep()  # self reports the status of the previous sweep's collectors
    parsed = samples(s.exposition("text").decode())
    assert value(parsed, "outrider_collector_success", collector="broken") == 0
    assert value(parsed, "outrider_collector_success", collector="host") == 1
    assert value(parsed, "outrider_collector_errors_total", collector="broken") == 2
    assert value(parsed, "outrider_host_load1") == 1.25
    assert value(parsed, "outrider_agent_sweeps_total") == 1


def test_exposition_is_rendered_once_per_sweep(proc_fixture: Path) -> None:
    s = sampler_with_broken(proc_fixture)
    s.sweep()
    first = s.exposition("text")
    assert s.exposition("text") is first, "a second scrape of the same sweep reuses the bytes"
    s.sweep()
    assert s.exposition("text") is not first


def test_rendered_gives_a_body_only_once_it_is_rendered_and_a_scraper_every_sweep_gets_it_ahead(
        proc_fixture: Path) -> None:
    """rendered() (what the HTTP loop thread answers itself) never renders: None until a scrape or the render-ahead
    made this sweep's body. A scraper asking every sweep, through rendered() alone, gets the body rendered ahead."""
    s = sampler_with_broken(proc_fixture)
    s.sweep()
    assert s.rendered("text", compressed=True) is None, "nothing rendered yet: a worker renders it"
    body = s.exposition("text", compressed=True)
    assert s.rendered("text", compressed=True) is body
    s.sweep()
    assert s.rendered("text", compressed=True) is None, "a new sweep"
    s.exposition("text", compressed=True)
    s.sweep()
    s._render_ahead()  # as the sweep loop does: the last two sweeps were asked for
    ahead = s.rendered("text", compressed=True)
    assert ahead is not None and ahead is not body
    for _ in range(3):  # asked through rendered() alone: still noted as served, so rendered ahead each sweep
        s.sweep()
        s._render_ahead()
        assert s.rendered("text", compressed=True) is not None


def test_gzip_variant_decompresses_to_the_same_text(proc_fixture: Path) -> None:
    import gzip

    s = sampler_with_broken(proc_fixture)
    s.sweep()
    assert gzip.decompress(s.exposition("text", compressed=True)) == s.exposition("text")


def test_k8s_identity_from_the_downward_api_behind_an_allow_list(monkeypatch: object) -> None:
    from outrider.collectors.base import CollectorContext
    from outrider.collectors.self import SelfCollector
    from outrider.metrics.exposition import render
    from outrider.wiring.sampler import SweepStats

    env = {"POD_NAME": "train-0", "POD_NAMESPACE": "ml", "NODE_NAME": "gpu-node-7", "CONTAINER_NAME": "trainer"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)  # type: ignore[attr-defined]
    c = SelfCollector(CollectorContext(Config(k8s_labels=("pod", "namespace")), SweepStats()))
    parsed = samples(render(c.collect()).decode())
    assert value(parsed, "outrider_k8s_info", pod="train-0", namespace="ml", node="", container="") == 1
