"""NVML behind its one module: the XID event set's lifecycle and NVML's shutdown order, and field values decoded by
their value type. The fake libnvidia-ml.so.1 stands in for the driver and keeps the books (fake_nvml_stat): event
sets live, waits in flight, a set freed or NVML shut down under a waiter, calls after shutdown."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from outrider.adapters.nvml import Nvml, XidWatcher
from tests.gpu.conftest import Scenario, make_collector, sweep
from tests.gpu.test_gpu_collector import FULL, G0
from tests.helpers import value, wait_until


def fake_stats(lib_path: str) -> Callable[[str], int]:
    """The fake's books, read from the same loaded library the bindings call (dlopen of one path is one copy)."""
    stat = ctypes.CDLL(lib_path).fake_nvml_stat
    stat.restype, stat.argtypes = ctypes.c_longlong, [ctypes.c_char_p]

    def read(name: str) -> int:
        v = int(stat(name.encode()))
        assert v >= 0, f"the fake keeps no book named {name}"
        return v
    return read


BOOKS = ("live_event_sets", "freed_while_waiting", "shutdown_while_waiting", "waits_on_freed_set",
         "sets_live_at_shutdown", "calls_uninitialized")


def test_close_stops_the_waiter_then_frees_its_set_then_shuts_nvml_down(
        fake_nvml: dict[str, str], scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(XidWatcher, "WAIT_MS", 400)  # long waits: close() surely lands while one is in flight
    stat = fake_stats(fake_nvml["full"])
    scenario.write(FULL)
    before = {name: stat(name) for name in BOOKS}
    c = make_collector(fake_nvml["full"])
    sweep(c)  # starts the XID watcher
    wait_until(lambda: stat("waits_in_flight") > 0, timeout_s=10, what="the watcher waiting on its event set")
    assert stat("live_event_sets") == before["live_event_sets"] + 1
    c.close()
    after = {name: stat(name) - before[name] for name in BOOKS}
    assert after["shutdown_while_waiting"] == 0, "NVML shut down while the watcher still waited"
    assert after["freed_while_waiting"] == 0 and after["waits_on_freed_set"] == 0, "set freed under its waiter"
    assert after["live_event_sets"] == 0, "the event set was never freed"
    assert after["sets_live_at_shutdown"] == 0, "NVML shut down before the event set was freed"
    assert stat("init_refcount") == 0, "nvmlShutdown balanced nvmlInit"
    assert not c.nvml.initialized
    sweep(c)  # a sweep after close asks NVML nothing
    assert stat("calls_uninitialized") == before["calls_uninitialized"], "a call reached NVML after shutdown"


def test_a_wait_that_does_not_return_defers_shutdown_until_it_does(
        fake_nvml: dict[str, str], scenario: Scenario) -> None:
    """A wedged driver: close() returns within its bound without freeing the set under the waiter or shutting
    NVML down; the waiter, once its wait returns, frees the set, and NVML shuts down after that."""
    stat = fake_stats(fake_nvml["full"])
    scenario.write(FULL + "hang nvmlEventSetWait_v2 2500\n")
    before = {name: stat(name) for name in BOOKS}
    c = make_collector(fake_nvml["full"])
    sweep(c)
    wait_until(lambda: stat("waits_in_flight") > 0, timeout_s=10, what="the watcher inside a wedged wait")
    done = c.nvml.shutdown(timeout_s=0.2)
    assert done is False, "shutdown() said it shut NVML down while a wait was still in flight"
    assert stat("init_refcount") == 1 and stat("live_event_sets") == before["live_event_sets"] + 1
    wait_until(lambda: stat("init_refcount") == 0, timeout_s=20, what="the deferred nvmlShutdown")
    after = {name: stat(name) - before[name] for name in BOOKS}
    assert after == dict.fromkeys(BOOKS, 0), f"teardown out of order: {after}"


def test_no_call_reaches_nvml_after_shutdown_from_a_sweep_still_running(
        fake_nvml: dict[str, str], scenario: Scenario) -> None:
    """The agent stops while the GPU collector is inside a slow NVML call: NVML shuts down when that call returns,
    and the rest of that sweep asks NVML nothing."""
    stat = fake_stats(fake_nvml["full"])
    scenario.write(FULL + "hang nvmlDeviceGetPowerUsage 1500\n")
    before = stat("calls_uninitialized")
    c = make_collector(fake_nvml["full"])
    result: list[object] = []
    t = threading.Thread(target=lambda: result.append(c.collect()))
    t.start()
    wait_until(lambda: c.nvml.calls_in_flight > 0, timeout_s=10, what="the sweep inside nvmlDeviceGetPowerUsage")
    c.nvml.shutdown(timeout_s=0.1)
    t.join(30)
    assert result and not isinstance(result[0], BaseException), "the sweep ended normally"
    wait_until(lambda: stat("init_refcount") == 0, timeout_s=20, what="the deferred nvmlShutdown")
    assert stat("calls_uninitialized") == before, "a call reached NVML after nvmlShutdown"


TYPED_FIELDS = """
device_count 1
gpu 0 name Fake
gpu 0 uuid GPU-0
gpu 0 field 1 -2.5 d
gpu 0 field 2 4000000000 ui
gpu 0 field 3 123456789012 ul
gpu 0 field 4 18446744073709551614 ull
gpu 0 field 9 18446744073709551615 ull
gpu 0 field 10 4294967295 ui
gpu 0 field 5 -42 sll
gpu 0 field 6 -7 si
gpu 0 field 7 65535 us
"""


def test_field_values_are_decoded_by_their_value_type(fake_nvml: dict[str, str], scenario: Scenario) -> None:
    scenario.write(TYPED_FIELDS)
    nv = Nvml(fake_nvml["full"])
    assert nv.init()
    try:
        got = nv.field_values(nv.handle(0), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], device=0)
        assert got == {1: -2.5, 2: 4000000000, 3: 123456789012, 4: float(2**64 - 2), 5: -42, 6: -7, 7: 65535}, \
            "field 8 is not offered, 9 and 10 are NVML's all-ones 'not available': absent"
        assert nv.errors == 0
    finally:
        nv.shutdown()


def test_a_double_memory_temperature_is_read_as_a_double(fake_nvml: dict[str, str], scenario: Scenario) -> None:
    """The regression: a field whose value type is double was read as an unsigned integer (its bit pattern)."""
    scenario.write(FULL.replace("gpu 0 field 82 78", "gpu 0 field 82 78.5 d"))
    c = make_collector(fake_nvml["full"])
    assert value(sweep(c), "outrider_gpu_temperature_celsius", **G0, sensor="memory") == 78.5


def test_without_the_drivers_library_nvidia_ml_py_is_not_imported(fake_nvml: dict[str, str], tmp_path: Path) -> None:
    """A node without GPUs: NVML unavailable for the reason pynvml would give, and pynvml (1 MiB of RSS) never
    imported; with the fake driver's library found by its soname, it is."""
    script = "\n".join([
        "import sys",
        "from outrider.adapters.nvml import LIBRARY_NOT_FOUND, Nvml",
        "n = Nvml()",
        "print(n.init(), n.unavailable_reason == LIBRARY_NOT_FOUND, 'pynvml' in sys.modules)",
    ])
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True", "False"], r.stdout
    assert "libnvidia-ml.so.1 was not found" in r.stderr
    scenario = tmp_path / "scenario.txt"
    scenario.write_text("device_count 1\n")
    env.update(LD_LIBRARY_PATH=os.path.dirname(fake_nvml["full"]), FAKE_NVML_SCENARIO=str(scenario))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "False", "True"], (r.stdout, r.stderr)
