"""OpenTelemetry semantic conventions kept, judged by the published conventions themselves.

The oracle is PyPI `opentelemetry-semantic-conventions`, not a copy in this test: its metric name constants, the
instrument each `create_*` function makes on a real SDK meter (Counter, UpDownCounter, Histogram, Gauge) and its
unit; its attribute name constants; and its `*Values` enums. The requirement levels of attributes are not in that
package, so REQUIRED below names them (by the package's constants) as the conventions' tables state them for the
metrics Outrider exports.

Two views are checked: the catalog (every metric under a semantic-convention name, whether or not this run emits
it), and what a real agent sent over OTLP (the world in conftest.py: fake-NVML GPUs owned by pods of a fake kubelet,
MIG devices, the watched processes with "other", FastAPI and Flask services). The list of metrics checked is printed.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from enum import Enum
from typing import Any

import opentelemetry.semconv._incubating.attributes as incubating_attributes
import opentelemetry.semconv._incubating.metrics as incubating_metrics
import opentelemetry.semconv.attributes as stable_attributes
import opentelemetry.semconv.metrics as stable_metrics
import pytest
from opentelemetry.metrics import Counter, Histogram, ObservableGauge, ObservableUpDownCounter, UpDownCounter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.semconv._incubating.attributes import (
    cpu_attributes,
    gen_ai_attributes,
    hw_attributes,
    k8s_attributes,
    network_attributes,
    process_attributes,
)
from opentelemetry.semconv.attributes import error_attributes, http_attributes, url_attributes

from outrider.metrics.catalog import CATALOG
from tests.integration.conftest import ServiceWorld
from tests.servers import attributes

pytestmark = pytest.mark.integration


def _modules(package: Any) -> list[Any]:
    return [importlib.import_module(f"{package.__name__}.{m.name}") for m in pkgutil.iter_modules(package.__path__)]


def _instrument_kind(instrument: object) -> str:
    for cls, kind in ((Counter, "counter"), (UpDownCounter, "updowncounter"), (ObservableUpDownCounter,
                      "updowncounter"), (Histogram, "histogram"), (ObservableGauge, "gauge")):
        if isinstance(instrument, cls):
            return kind
    if type(instrument).__name__.lstrip("_") in ("Gauge", "SynchronousGauge"):
        return "gauge"
    raise AssertionError(f"unknown instrument {type(instrument)}")


def _metric_oracle() -> dict[str, tuple[str, str]]:
    """{semantic-convention metric name: (instrument kind, unit)}, from the package's create_* functions run on a
    real SDK meter (the stable module wins over the incubating one for a name both define)."""
    meter = MeterProvider().get_meter("conformance-oracle")
    out: dict[str, tuple[str, str]] = {}
    for module in [*_modules(incubating_metrics), *_modules(stable_metrics)]:
        for const, name in vars(module).items():
            create = getattr(module, f"create_{const.lower()}", None)
            if not (const.isupper() and isinstance(name, str) and create):
                continue
            inst = create(meter, None) if "callbacks" in inspect.signature(create).parameters else create(meter)
            out[name] = (_instrument_kind(inst), inst.unit)
    return out


def _attribute_oracle() -> tuple[set[str], dict[str, set[str]]]:
    """(every attribute name the conventions define, {attribute: its enum values})."""
    names: set[str] = set()
    enums: dict[str, set[str]] = {}
    for module in [*_modules(incubating_attributes), *_modules(stable_attributes)]:
        for const, name in vars(module).items():
            if const.isupper() and isinstance(name, str) and "." in name:
                names.add(name)
                values = getattr(module, "".join(w.capitalize() for w in const.split("_")) + "Values", None)
                if isinstance(values, type) and issubclass(values, Enum):
                    enums[name] = {str(v.value) for v in values}
    return names, enums


METRICS = _metric_oracle()
ATTRIBUTES, ENUMS = _attribute_oracle()
HW = hw_attributes
GPU_HW = (HW.HW_ID, HW.HW_TYPE, HW.HW_VENDOR, HW.HW_DRIVER_VERSION)  # every hw.* series of a GPU
REQUIRED: dict[str, tuple[str, ...]] = {
    "hw.gpu.utilization": (*GPU_HW, HW.HW_GPU_TASK),
    "hw.gpu.memory.usage": GPU_HW, "hw.gpu.memory.limit": GPU_HW, "hw.gpu.memory.utilization": GPU_HW,
    "hw.gpu.io": (*GPU_HW, network_attributes.NETWORK_IO_DIRECTION),
    "hw.errors": (*GPU_HW, error_attributes.ERROR_TYPE),
    "hw.status": (*GPU_HW, HW.HW_STATE),
    "hw.temperature": GPU_HW, "hw.power": GPU_HW, "hw.energy": GPU_HW, "hw.fan.speed_ratio": GPU_HW,
    "system.cpu.time": (cpu_attributes.CPU_MODE,),
    "process.cpu.time": (cpu_attributes.CPU_MODE,),
    "http.server.request.duration": (http_attributes.HTTP_REQUEST_METHOD, url_attributes.URL_SCHEME,
                                     http_attributes.HTTP_RESPONSE_STATUS_CODE, http_attributes.HTTP_ROUTE),
    "http.server.active_requests": (http_attributes.HTTP_REQUEST_METHOD, url_attributes.URL_SCHEME),
    "gen_ai.server.time_to_first_token": (gen_ai_attributes.GEN_AI_OPERATION_NAME,
                                          gen_ai_attributes.GEN_AI_PROVIDER_NAME),
    "gen_ai.server.time_per_output_token": (gen_ai_attributes.GEN_AI_OPERATION_NAME,
                                            gen_ai_attributes.GEN_AI_PROVIDER_NAME),
}
# Enums the conventions leave open to other values: error.type ("a low-cardinality identifier" of the error: here
# corrected/uncorrected ECC), gen_ai.provider.name (a self-hosted server names itself), hw.gpu.task's encoder/decoder
# are in the enum (checked). Every other enum attribute must take one of the enum's values.
OPEN_ENUMS = {error_attributes.ERROR_TYPE, gen_ai_attributes.GEN_AI_PROVIDER_NAME}
EXPECTED: dict[str, Any] = {HW.HW_TYPE: HW.HwTypeValues.GPU.value, HW.HW_STATE: HW.HwStateValues.OK.value,
                            HW.HW_VENDOR: "nvidia"}
K8S_FROM_THE_CHART = {k8s_attributes.K8S_POD_NAME, k8s_attributes.K8S_NAMESPACE_NAME, k8s_attributes.K8S_NODE_NAME}


def _kind(metric: Any) -> str:
    data = metric.WhichOneof("data")
    if data == "sum":
        return "counter" if metric.sum.is_monotonic else "updowncounter"
    return {"gauge": "gauge", "histogram": "histogram", "exponential_histogram": "histogram"}[data]


def test_every_catalog_metric_under_a_convention_name_has_its_instrument_and_unit() -> None:
    checked, wrong = [], []
    for d in CATALOG.values():
        if d.otel_name in METRICS:
            checked.append(d.otel_name)
            kind, unit = METRICS[d.otel_name]
            if (d.instrument, d.unit) != (kind, unit) or not d.semconv:
                wrong.append(f"{d.name} -> {d.otel_name}: {d.instrument} {d.unit!r}, the conventions say "
                             f"{kind} {unit!r}" + ("" if d.semconv else " (and it is not marked semconv)"))
        elif not d.otel_name.startswith("outrider.") or d.semconv:
            wrong.append(f"{d.otel_name}: not a semantic-convention metric, so it belongs under outrider.*")
        for label in d.labels:
            if label.otel and not label.otel.startswith("outrider.") and label.otel not in ATTRIBUTES:
                wrong.append(f"{d.otel_name}: attribute {label.otel} is neither the conventions' nor outrider.*")
            for _, v in label.otel_values:
                if label.otel in ENUMS and v not in ENUMS[label.otel]:
                    wrong.append(f"{d.otel_name}: {label.otel}={v} is not in the conventions' enum")
        for key, v in d.otel_attributes:
            if not key.startswith("outrider.") and key not in ATTRIBUTES:
                wrong.append(f"{d.otel_name}: constant attribute {key} is not the conventions'")
            if key in ENUMS and key not in OPEN_ENUMS and v not in ENUMS[key]:
                wrong.append(f"{d.otel_name}: {key}={v} is not in the conventions' enum")
    print("semantic-convention metrics checked in the catalog:", ", ".join(sorted(set(checked))))
    assert wrong == []
    assert set(REQUIRED) <= set(checked), "a metric with required attributes is no longer under its convention name"


def test_what_the_agent_sends_over_otlp_keeps_the_conventions(services: ServiceWorld) -> None:
    request = services.receiver.requests[-1]
    checked, wrong = [], []
    for rm in request.resource_metrics:
        resource = attributes(rm.resource.attributes)
        k8s = {k for k in resource if k.startswith("k8s.")}
        assert k8s == K8S_FROM_THE_CHART, f"Kubernetes resource attributes only from the Downward API: {k8s}"
        assert all(v != "" for v in resource.values())
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                name = metric.name
                points = getattr(metric, metric.WhichOneof("data")).data_points
                if name in METRICS:
                    checked.append(name)
                    kind, unit = METRICS[name]
                    if (_kind(metric), metric.unit) != (kind, unit):
                        wrong.append(f"{name}: sent as {_kind(metric)} {metric.unit!r}, the conventions say {kind} "
                                     f"{unit!r}")
                elif not name.startswith("outrider."):
                    wrong.append(f"{name}: a custom metric outside outrider.*")
                for p in points:
                    wrong.extend(_point_problems(name, attributes(p.attributes)))
    print("metrics checked on the wire:", ", ".join(sorted(checked)))
    assert wrong == [], "\n".join(sorted(set(wrong)))
    sent = {m for m in checked}
    assert set(REQUIRED) <= sent, f"not exported in this run: {sorted(set(REQUIRED) - sent)}"


def _point_problems(name: str, attrs: dict[str, Any]) -> list[str]:
    problems = []
    for key, v in attrs.items():
        if v == "":
            problems.append(f"{name}: empty attribute {key}")
        if not key.startswith("outrider.") and key not in ATTRIBUTES:
            problems.append(f"{name}: attribute {key} is neither the conventions' nor outrider.*")
        if key in ENUMS and key not in OPEN_ENUMS and str(v) not in ENUMS[key]:
            problems.append(f"{name}: {key}={v!r} is not in the conventions' enum {sorted(ENUMS[key])}")
        if key in EXPECTED and v != EXPECTED[key]:
            problems.append(f"{name}: {key}={v!r}, expected {EXPECTED[key]!r}")
    for key in REQUIRED.get(name, ()):
        if key not in attrs:
            problems.append(f"{name}: required attribute {key} missing")
    if process_attributes.PROCESS_PID in attrs and not isinstance(attrs[process_attributes.PROCESS_PID], int):
        problems.append(f"{name}: process.pid {attrs[process_attributes.PROCESS_PID]!r} is not an integer")
    if http_attributes.HTTP_RESPONSE_STATUS_CODE in attrs and not isinstance(
            attrs[http_attributes.HTTP_RESPONSE_STATUS_CODE], int):
        problems.append(f"{name}: http.response.status_code is not an integer")
    return problems


def test_the_process_model_never_mixes_a_string_pid_with_integer_pids(services: ServiceWorld) -> None:
    points = services.latest_export()
    for name in ("process.cpu.time", "process.memory.usage", "process.thread.count"):
        attrs = [attributes(p.attributes) for _, p in points[name]]
        assert all(isinstance(a[process_attributes.PROCESS_PID], int) for a in attrs if "process.pid" in a)
        rest = [a for a in attrs if process_attributes.PROCESS_PID not in a]
        assert rest and all(a["outrider.process.group"] == "other" for a in rest), \
            f"{name}: the processes not shown one by one are one group, without a pid"


def test_system_cpu_time_sums_the_kernels_interrupt_modes_into_the_enums(services: ServiceWorld) -> None:
    points = services.latest_export()["system.cpu.time"]
    modes = [attributes(p.attributes)[cpu_attributes.CPU_MODE] for _, p in points]
    assert len(modes) == len(set(modes)), "one point per mode: irq and softirq are summed into interrupt"
    assert set(modes) <= ENUMS[cpu_attributes.CPU_MODE] and "interrupt" in modes
    exposition = services.agent.metrics()
    assert re.search(r'outrider_host_cpu_seconds_total\{mode="softirq"\}', exposition), \
        "Prometheus keeps the kernel's modes"
