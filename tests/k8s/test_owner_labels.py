"""The owner labels in the one metric table: which metrics carry them, under which names, and how the exposition
and OTLP show an owner that is known and one that is not."""

from __future__ import annotations

import pytest

from outrider.metrics.catalog import CATALOG, GPU, K8S_OWNER, definitions, with_enrichment
from outrider.metrics.exposition import render
from outrider.metrics.family import Family
from tests.helpers import samples

NAMES = {"exported_namespace": "ns", "exported_pod": "workload", "exported_container": "ctr"}


def test_every_series_of_a_gpu_can_name_its_owner_and_nothing_else_does() -> None:
    enriched = {d.name for d in definitions() if d.enrichment}
    per_gpu = {d.name for d in definitions("gpu") if d.labels[:len(GPU)] == GPU}
    assert enriched == per_gpu | {"outrider_oom_victim_kills_total"}, "a GPU's series, and an OOM kill's victim"
    assert {"outrider_gpu_utilization_ratio", "outrider_gpu_mig_memory_used_bytes",
            "outrider_gpu_process_memory_bytes", "outrider_gpu_xid_errors_total",
            "outrider_gpu_nvlink_errors_total"} <= enriched
    assert "outrider_gpu_count" not in enriched and "outrider_host_load1" not in enriched
    assert all(d.enrichment == K8S_OWNER for d in definitions() if d.enrichment)
    assert [lb.otel for lb in K8S_OWNER] == ["k8s.namespace.name", "k8s.pod.name", "k8s.container.name"]


def test_with_enrichment_appends_the_owner_labels_under_the_configured_names() -> None:
    d = with_enrichment(CATALOG["outrider_gpu_utilization_ratio"], NAMES)
    assert d.label_names == ("gpu", "uuid", "model", "task", "ns", "workload", "ctr")
    assert [lb.otel for lb in d.labels[-3:]] == ["k8s.namespace.name", "k8s.pod.name", "k8s.container.name"]
    assert with_enrichment(CATALOG["outrider_gpu_count"], NAMES) is CATALOG["outrider_gpu_count"]
    with pytest.raises(ValueError, match="clash"):
        with_enrichment(CATALOG["outrider_gpu_utilization_ratio"], {"exported_pod": "task"})


def test_an_unknown_owner_is_left_out_of_the_exposition() -> None:
    d = with_enrichment(CATALOG["outrider_gpu_up"])
    f = Family(d).add(1, "0", "GPU-0", "H100", "research", "train-0", "trainer").add(1, "1", "GPU-1", "H100", "",
                                                                                      "", "")
    text = render([f]).decode()
    assert 'outrider_gpu_up{gpu="1",uuid="GPU-1",model="H100"} 1' in text
    parsed = samples(text)
    assert parsed[("outrider_gpu_up", (("exported_container", "trainer"), ("exported_namespace", "research"),
                                       ("exported_pod", "train-0"), ("gpu", "0"), ("model", "H100"),
                                       ("uuid", "GPU-0")))] == 1


def test_one_metric_under_two_label_namings_renders_each_with_its_own_names() -> None:
    """Rendered prefixes are cached: the cache must tell label names apart, not only label values."""
    values = ("0", "GPU-0", "H100", "a", "b", "c")
    first = render([Family(with_enrichment(CATALOG["outrider_gpu_up"])).add(1, *values)]).decode()
    second = render([Family(with_enrichment(CATALOG["outrider_gpu_up"], NAMES)).add(1, *values)]).decode()
    assert 'exported_pod="b"' in first
    assert 'workload="b"' in second and "exported_pod" not in second


def test_otlp_attributes_are_the_semantic_convention_names_and_never_empty() -> None:
    from opentelemetry.sdk.resources import Resource

    from outrider.exporters.otlp import to_metrics_data

    d = with_enrichment(CATALOG["outrider_gpu_up"], NAMES)
    f = Family(d).add(1, "0", "GPU-0", "H100", "research", "train-0", "trainer").add(1, "1", "GPU-1", "H100", "",
                                                                                      "", "")
    data = to_metrics_data([f], Resource({}), 0, 1)
    points = data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points
    by_gpu = {p.attributes["hw.id"]: dict(p.attributes) for p in points}
    assert by_gpu["GPU-0"]["k8s.pod.name"] == "train-0"
    assert by_gpu["GPU-0"]["k8s.namespace.name"] == "research"
    assert by_gpu["GPU-0"]["k8s.container.name"] == "trainer"
    assert not [k for k in by_gpu["GPU-1"] if k.startswith("k8s.")]
