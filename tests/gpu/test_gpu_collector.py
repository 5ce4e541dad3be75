"""The GPU collector through the real nvidia-ml-py bindings into a fake libnvidia-ml.so.1 (no GPU here)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from outrider.collectors.gpu import xid_class
from tests.gpu.conftest import Scenario, make_collector, nvml_call_bound, sweep
from tests.helpers import value, wait_until

H100 = "NVIDIA H100 80GB HBM3"
G0 = {"gpu": "0", "uuid": "GPU-0", "model": H100}
G1 = {"gpu": "1", "uuid": "GPU-1", "model": H100}

FULL = f"""
device_count 2
gpu 0 name {H100}
gpu 0 uuid GPU-0
gpu 0 memory_total 85899345920
gpu 0 memory_used 42949672960
gpu 0 memory_free 42413129728
gpu 0 memory_reserved 536543232
gpu 0 util_gpu 87
gpu 0 util_mem 41
gpu 0 enc_util 3
gpu 0 dec_util 4
gpu 0 temp 71
gpu 0 field 82 78
gpu 0 field 138 1000
gpu 0 field 139 2000
gpu 0 power_mw 612345
gpu 0 power_limit_mw 700000
gpu 0 energy_mj 987654321
gpu 0 clock_sm 1755
gpu 0 clock_mem 2619
gpu 0 max_clock_sm 1980
gpu 0 max_clock_mem 2619
gpu 0 pstate 0
gpu 0 fan 55
gpu 0 clock_reasons 0x84
gpu 0 violation_power_ns 1500000000
gpu 0 violation_thermal_ns 250000000
gpu 0 violation_sync_boost_ns 0
gpu 0 violation_board_limit_ns 0
gpu 0 violation_low_util_ns 7000000000
gpu 0 violation_reliability_ns 0
gpu 0 pcie_tx_kbps 1000
gpu 0 pcie_rx_kbps 2000
gpu 0 pcie_replay 17
gpu 0 ecc_corr_volatile 5
gpu 0 ecc_unc_volatile 1
gpu 0 ecc_corr_aggregate 50
gpu 0 ecc_unc_aggregate 2
gpu 0 remap_corr 3
gpu 0 remap_unc 1
gpu 0 remap_pending 1
gpu 0 remap_failure 0
gpu 0 mig_mode 0
gpu 0 gpm_supported 1
gpu 0 gpm 2 62.5
gpu 0 gpm 3 31.0
gpu 0 gpm 5 44.0
gpu 0 gpm 10 20.0
gpu 1 name {H100}
gpu 1 uuid GPU-1
gpu 1 memory_total 85899345920
gpu 1 memory_used 0
gpu 1 memory_free 85899345920
gpu 1 util_gpu 0
gpu 1 util_mem 0
"""


@pytest.mark.parametrize(("metric", "labels", "expected"), [
    ("outrider_gpu_utilization_ratio", {**G0, "task": "general"}, 0.87),
    ("outrider_gpu_utilization_ratio", {**G0, "task": "encoder"}, 0.03),
    ("outrider_gpu_utilization_ratio", {**G0, "task": "decoder"}, 0.04),
    ("outrider_gpu_memory_bandwidth_utilization_ratio", G0, 0.41),
    ("outrider_gpu_memory_total_bytes", G0, 85899345920),
    ("outrider_gpu_memory_used_bytes", G0, 42949672960),
    ("outrider_gpu_memory_free_bytes", G0, 42413129728),
    ("outrider_gpu_memory_reserved_bytes", G0, 536543232),
    ("outrider_gpu_temperature_celsius", {**G0, "sensor": "gpu"}, 71),
    ("outrider_gpu_temperature_celsius", {**G0, "sensor": "memory"}, 78),
    ("outrider_gpu_power_watts", G0, 612.345),
    ("outrider_gpu_power_limit_watts", G0, 700),
    ("outrider_gpu_energy_joules_total", G0, 987654.321),
    ("outrider_gpu_clock_hertz", {**G0, "clock": "sm"}, 1755e6),
    ("outrider_gpu_clock_hertz", {**G0, "clock": "memory"}, 2619e6),
    ("outrider_gpu_clock_max_hertz", {**G0, "clock": "sm"}, 1980e6),
    ("outrider_gpu_performance_state", G0, 0),
    ("outrider_gpu_fan_speed_ratio", G0, 0.55),
    ("outrider_gpu_clock_event_active", {**G0, "reason": "sw_power_cap"}, 1),
    ("outrider_gpu_clock_event_active", {**G0, "reason": "hw_power_brake_slowdown"}, 1),
    ("outrider_gpu_clock_event_active", {**G0, "reason": "hw_thermal_slowdown"}, 0),
    ("outrider_gpu_violation_seconds_total", {**G0, "reason": "power"}, 1.5),
    ("outrider_gpu_violation_seconds_total", {**G0, "reason": "thermal"}, 0.25),
    ("outrider_gpu_violation_seconds_total", {**G0, "reason": "low_utilization"}, 7.0),
    ("outrider_gpu_pcie_throughput_bytes_per_second", {**G0, "direction": "transmit"}, 1000 * 1024),
    ("outrider_gpu_pcie_throughput_bytes_per_second", {**G0, "direction": "receive"}, 2000 * 1024),
    ("outrider_gpu_pcie_replays_total", G0, 17),
    ("outrider_gpu_nvlink_bytes_total", {**G0, "direction": "transmit"}, 1000 * 1024),
    ("outrider_gpu_nvlink_bytes_total", {**G0, "direction": "receive"}, 2000 * 1024),
    ("outrider_gpu_ecc_errors_total", {**G0, "type": "corrected", "counter": "volatile"}, 5),
    ("outrider_gpu_ecc_errors_total", {**G0, "type": "uncorrected", "counter": "aggregate"}, 2),
    ("outrider_gpu_remapped_rows", {**G0, "kind": "correctable"}, 3),
    ("outrider_gpu_remapped_rows", {**G0, "kind": "uncorrectable"}, 1),
    ("outrider_gpu_row_remap_pending", G0, 1),
    ("outrider_gpu_row_remap_failure", G0, 0),
    ("outrider_gpu_mig_mode", G0, 0),
    ("outrider_gpu_up", G0, 1),
    ("outrider_gpu_count", {}, 2),
    ("outrider_gpu_nvml_up", {}, 1),
])
def test_each_reading_in_base_units(fake_nvml: dict[str, str], scenario: Scenario, metric: str,
                                    labels: dict[str, str], expected: float) -> None:
    scenario.write(FULL)
    c = make_collector(fake_nvml["full"])
    assert value(sweep(c), metric, **labels) == pytest.approx(expected)


UNSUPPORTED_FNS = [
    "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetEncoderUtilization", "nvmlDeviceGetDecoderUtilization",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetTemperature", "nvmlDeviceGetFieldValues", "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetClockInfo", "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetFanSpeed", "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetViolationStatus",
    "nvmlDeviceGetPcieThroughput", "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRemappedRows", "nvmlDeviceGetMigMode", "nvmlGpmQueryDeviceSupport",
    "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2",
]


def test_unsupported_readings_are_absent_not_zero(fake_nvml: dict[str, str], scenario: Scenario) -> None:
    scenario.write(FULL + "\n".join(f"gpu 0 unsupported {fn}" for fn in UNSUPPORTED_FNS))
    c = make_collector(fake_nvml["full"])
    parsed = sweep(c)
    present = {name for (name, labels) in parsed if ("gpu", "0") in labels}
    assert present == {"outrider_gpu_up", "outrider_gpu_lost_total", "outrider_gpu_power_limit_watts",
                       "outrider_gpu_clock_max_hertz"}, "only static facts remain; nothing is invented"
    assert value(parsed, "outrider_gpu_utilization_ratio", **G1, task="general") == 0, "GPU 1 is unaffected"
    calls_before = c.nvml.calls
    sweep(c)
    assert c.nvml.calls - calls_before < 25, "unsupported readings are not asked for again every sweep"
    assert c.nvml.errors == 0


# What a driver writes where it has no value (NVML_VALUE_NOT_AVAILABLE): seen as 4.29e9 % utilisation and 4.29e9 °C.
NOT_AVAILABLE_32 = 0xFFFFFFFF
SENTINEL_READINGS = [  # (scenario key, metric, labels)
    ("util_gpu", "outrider_gpu_utilization_ratio", {**G0, "task": "general"}),
    ("util_mem", "outrider_gpu_memory_bandwidth_utilization_ratio", G0),
    ("enc_util", "outrider_gpu_utilization_ratio", {**G0, "task": "encoder"}),
    ("temp", "outrider_gpu_temperature_celsius", {**G0, "sensor": "gpu"}),
    ("power_mw", "outrider_gpu_power_watts", G0),
    ("clock_sm", "outrider_gpu_clock_hertz", {**G0, "clock": "sm"}),
    ("fan", "outrider_gpu_fan_speed_ratio", G0),
    ("pcie_replay", "outrider_gpu_pcie_replays_total", G0),
]


@pytest.mark.parametrize(("key", "metric", "labels"), SENTINEL_READINGS)
def test_not_available_sentinels_are_absent_not_a_reading(fake_nvml: dict[str, str], scenario: Scenario, key: str,
                                                           metric: str, labels: dict[str, str]) -> None:
    """The C fake hands back 0xFFFFFFFF through the real bindings, as a driver does for "not available"."""
    scenario.write(FULL + f"\ngpu 0 {key} {NOT_AVAILABLE_32}\n")
    c = make_collector(fake_nvml["full"])
    parsed = sweep(c)
    assert value(parsed, metric, **labels) is None
    assert value(parsed, "outrider_gpu_temperature_celsius", **G0, sensor="memory") == 78, "the rest is read"
    assert c.nvml.errors == 0, "an answer, not a failure"


@pytest.mark.parametrize(("key", "raw", "metric", "labels"), [
    ("util_gpu", 101, "outrider_gpu_utilization_ratio", {**G0, "task": "general"}),
    ("fan", 250, "outrider_gpu_fan_speed_ratio", G0),
    ("pstate", 32, "outrider_gpu_performance_state", G0),  # NVML_PSTATE_UNKNOWN
])
def test_impossible_readings_are_absent(fake_nvml: dict[str, str], scenario: Scenario, key: str, raw: int,
                                        metric: str, labels: dict[str, str]) -> None:
    scenario.write(FULL + f"\ngpu 0 {key} {raw}\n")
    assert value(sweep(make_collector(fake_nvml["full"])), metric, **labels) is None


def test_a_percentage_of_100_is_a_reading(fake_nvml: dict[str, str], scenario: Scenario) -> None:
    scenario.write(FULL + "\ngpu 0 util_gpu 100\ngpu 0 fan 0\n")
    parsed = sweep(make_collector(fake_nvml["full"]))
    assert value(parsed, "outrider_gpu_utilization_ratio", **G0, task="general") == 1.0
    assert value(parsed, "outrider_gpu_fan_speed_ratio", **G0) == 0.0


def test_gpm_needs_two_samples(fake_nvml: dict[str, str], scenario: Scenario) -> None:
    scenario.write(FULL)
    c = make_collector(fake_nvml["full"])
    assert value(sweep(c), "outrider_gpu_sm_activity_ratio", **G0) is None, "one sample: no rate yet"
    parsed = sweep(c)
    assert value(parsed, "outrider_gpu_sm_activity_ratio", **G0) == pytest.approx(0.625)
    assert value(parsed, "outrider_gpu_sm_occupancy_ratio", **G0) == pytest.approx(0.31)
    assert value(parsed, "outrider_gpu_tensor_activity_ratio", **G0) == pytest.approx(0.44)
    assert value(parsed, "outrider_gpu_dram_activity_ratio", **G0) == pytest.approx(0.20)
    assert value(parsed, "outrider_gpu_sm_activity_ratio", **G1) is None, "GPU 1 has no GPM"


def test_old_driver_without_newer_symbols(fake_nvml: dict[str, str], scenario: Scenario,
                                          caplog: pytest.LogCaptureFixture) -> None:
    scenario.write(FULL + "gpu 0 proc 4242 1073741824 10\n")
    c = make_collector(fake_nvml["old"])
    sweep(c)
    parsed = sweep(c)
    assert value(parsed, "outrider_gpu_memory_used_bytes", **G0) == 42949672960, "v1 memory info"
    assert value(parsed, "outrider_gpu_memory_reserved_bytes", **G0) is None
    assert value(parsed, "outrider_gpu_process_memory_bytes", **G0, pid="4242", name="") == 1073741824, "v2"
    assert value(parsed, "outrider_gpu_remapped_rows", **G0, kind="correctable") is None
    assert value(parsed, "outrider_gpu_sm_activity_ratio", **G0) is None
    missing_logs = [r for r in caplog.records if "lacks" in r.getMessage() or "not available" in r.getMessage()]
    assert missing_logs and len(missing_logs) == len({r.getMessage() for r in missing_logs}), "each logged once"
    sweep(c)
    assert len([r for r in caplog.records if "lacks" in r.getMessage()]) == len(
        [r for r in missing_logs if "lacks" in r.getMessage()]), "not again on later sweeps"


def test_init_failure_reports_nvml_down_says_why_once_and_recovers(fake_nvml: dict[str, str], scenario: Scenario,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    scenario.write("init_error 9\n")  # NVML_ERROR_DRIVER_NOT_LOADED
    c = make_collector(fake_nvml["full"])
    assert sweep(c) == {("outrider_gpu_nvml_up", ()): 0}
    sweep(c)
    reasons = [r.getMessage() for r in caplog.records if "GPU metrics unavailable" in r.getMessage()]
    assert len(reasons) == 1 and "driver is not loaded" in reasons[0]
    scenario.write(FULL)
    c.nvml._retry_at = 0  # skip the backoff wait
    assert value(sweep(c), "outrider_gpu_nvml_up") == 1


def test_no_library_at_all(tmp_path: Path, scenario: Scenario) -> None:
    missing = tmp_path / "no-such" / "libnvidia-ml.so.1"
    c = make_collector(str(missing))
    assert sweep(c) == {("outrider_gpu_nvml_up", ()): 0}
    assert c.nvml.unavailable_reason == f"{missing}: cannot open shared object file: No such file or directory"


def test_gpu_lost_mid_run(fake_nvml: dict[str, str], scenario: Scenario) -> None:
    scenario.write(FULL)
    c = make_collector(fake_nvml["full"])
    assert value(sweep(c), "outrider_gpu_up", **G0) == 1
    scenario.write(FULL + "gpu 0 lost 1\n")
    parsed = sweep(c)
    assert value(parsed, "outrider_gpu_up", **G0) == 0
    assert value(parsed, "outrider_gpu_lost_total", **G0) == 1
    assert value(parsed, "outrider_gpu_memory_used_bytes", **G0) is None, "no stale readings of a lost GPU"
    assert value(parsed, "outrider_gpu_up", **G1) == 1
    assert value(sweep(c), "outrider_gpu_lost_total", **G0) == 1, "one event, not one per sweep"


def test_gpu_lost_before_its_facts_were_read_reports_it_down(fake_nvml: dict[str, str], scenario: Scenario) -> None:
    """Lost from the first sweep on (no name or UUID ever read): that GPU reports down, the others stay."""
    scenario.write(FULL + "gpu 0 lost 1\n")
    c = make_collector(fake_nvml["full"])
    parsed = sweep(c)
    lost = {"gpu": "0", "uuid": "index-0", "model": "unknown"}
    assert value(parsed, "outrider_gpu_up", **lost) == 0
    assert value(parsed, "outrider_gpu_lost_total", **lost) == 1
    assert value(parsed, "outrider_gpu_up", **G1) == 1
    assert value(parsed, "outrider_gpu_memory_total_bytes", **G1) == 85899345920, "GPU 1's readings are there"
    assert [k for k in parsed if k[0].startswith("outrider_gpu_") and ("gpu", "0") in k[1]
            and k[0] not in ("outrider_gpu_up", "outrider_gpu_lost_total")] == [], "nothing read from a lost GPU"
    scenario.write(FULL)  # reset: the GPU answers again, under its real name
    assert value(sweep(c), "outrider_gpu_up", **G0) == 1


NVLINK = """
gpu 0 nvlinks 4
gpu 0 nvlink_error 0 2 5
gpu 0 nvlink_error 1 2 7
gpu 0 nvlink_error 0 3 1
gpu 0 nvlink_error 2 0 10
gpu 0 nvlink_error 3 0 0
"""


def test_nvlink_errors_summed_over_links_absent_where_unsupported(fake_nvml: dict[str, str],
                                                                 scenario: Scenario) -> None:
    scenario.write(FULL + NVLINK)
    c = make_collector(fake_nvml["full"])
    parsed = sweep(c)
    errors = {dict(labels)["type"]: v for (name, labels), v in parsed.items()
              if name == "outrider_gpu_nvlink_errors_total" and ("gpu", "0") in labels}
    assert errors == {"crc_flit": 12, "crc_data": 1, "replay": 10}, "recovery: no link offers it, so absent"
    assert not [k for k in parsed if k[0] == "outrider_gpu_nvlink_errors_total" and ("gpu", "1") in k[1]], \
        "GPU 1 has no NVLink: absent, not 0"
    assert c.nvml.errors == 0, "links past the GPU's count are not errors"
    calls = c.nvml.calls
    sweep(c)
    per_sweep = c.nvml.calls - calls
    scenario.write(FULL)
    c2 = make_collector(fake_nvml["full"])
    sweep(c2)
    calls = c2.nvml.calls
    sweep(c2)
    assert per_sweep - (c2.nvml.calls - calls) == 5 + 4, (
        "after the first sweep only the 5 (link, counter) pairs the scenario offers and the 4 links' states are "
        "asked: no link probing, no unsupported counter again")


def test_each_nvlinks_state_is_read_every_sweep(fake_nvml: dict[str, str], scenario: Scenario) -> None:
    """Links found once, their states read each sweep: link 2 of GPU 0 goes down between two sweeps, and the next
    sweep says so (the GPUNVLinkDown alert's input); a GPU without NVLink has no link series."""
    scenario.write(FULL + NVLINK)
    c = make_collector(fake_nvml["full"])

    def states(parsed: dict) -> dict[str, float]:  # type: ignore[type-arg]
        return {dict(labels)["link"]: v for (name, labels), v in parsed.items()
                if name == "outrider_gpu_nvlink_link_active" and ("gpu", "0") in labels}

    assert states(sweep(c)) == {"0": 1, "1": 1, "2": 1, "3": 1}
    scenario.write(FULL + NVLINK + "gpu 0 nvlinks_down 4\n")  # bit 2
    parsed = sweep(c)
    assert states(parsed) == {"0": 1, "1": 1, "2": 0, "3": 1}, "a link down is still a link, now inactive"
    assert not [k for k in parsed if k[0] == "outrider_gpu_nvlink_link_active" and ("gpu", "1") in k[1]]
    labels = next(dict(lb) for (name, lb) in parsed if name == "outrider_gpu_nvlink_link_active")
    assert {"gpu", "uuid", "model", "link"} <= set(labels)


def test_a_sweep_asks_each_reading_of_each_gpu_once(fake_nvml: dict[str, str], scenario: Scenario) -> None:
    """Three GPUs offering every reading, one with four NVLinks offering every counter: a sweep asks exactly the
    bound that tests/gpu/test_real_gpu.py holds a real driver to (which offers less, so asks less)."""
    gpu0 = [line for line in FULL.splitlines() if line.startswith("gpu 0")]
    gpus = "\n".join(line.replace("gpu 0", f"gpu {i}", 1).replace("GPU-0", f"GPU-{i}")
                     for i in range(3) for line in gpu0)
    links = "\n".join(f"gpu 0 nvlink_error {link} {counter} 1" for link in range(4) for counter in range(4))
    scenario.write(f"device_count 3\n{gpus}\ngpu 0 nvlinks 4\n{links}")
    c = make_collector(fake_nvml["full"])
    sweep(c)  # the first sweep finds the links and what each GPU offers
    per_sweep = []
    for _ in range(3):
        before = c.nvml.calls
        sweep(c)
        per_sweep.append(c.nvml.calls - before)
    assert per_sweep == [nvml_call_bound(3, nvlinks=4)] * 3 and c.nvml.errors == 0


def test_xid_events_by_code_and_class(fake_nvml: dict[str, str], scenario: Scenario) -> None:
    scenario.write(FULL)
    c = make_collector(fake_nvml["full"])
    try:
        sweep(c)
        before = time.time()
        scenario.write(FULL + "gpu 0 xid 1 79\ngpu 0 xid 2 48\ngpu 0 xid 3 48\ngpu 1 xid 1 13\n")

        def counted() -> dict | None:  # type: ignore[type-arg]
            parsed = sweep(c)
            done = (value(parsed, "outrider_gpu_xid_errors_total", **G0, xid="48", **{"class": "memory"}) == 2
                    and value(parsed, "outrider_gpu_xid_errors_total", **G1, xid="13", **{"class": "application"}))
            return parsed if done else None
        parsed = wait_until(counted, timeout_s=10, what="XID events")
        assert value(parsed, "outrider_gpu_xid_errors_total", **G0, xid="79", **{"class": "gpu_lost"}) == 1
        assert value(parsed, "outrider_gpu_xid_errors_total", **G0, xid="48", **{"class": "memory"}) == 2
        assert value(parsed, "outrider_gpu_last_xid_timestamp_seconds", **G0) >= before
    finally:
        c.close()


def test_xid_classes() -> None:
    assert [xid_class(x) for x in (79, 48, 74, 13, 119, 999)] == [
        "gpu_lost", "memory", "nvlink", "application", "hardware", "other"]


def test_processes_translated_into_the_agents_pid_namespace(fake_nvml: dict[str, str], scenario: Scenario,
                                                             tmp_path: Path) -> None:
    """The agent reads a host-level procfs: NVML's (host) PID 5100 is PID 40 in the agent's (pod) namespace."""
    proc = tmp_path / "proc"
    for pid, nspid, comm in (("self", "5000 12", "outrider"), ("5100", "5100 40", "python"),
                             ("5200", "5200", "other-pod")):
        (proc / pid).mkdir(parents=True)
        (proc / pid / "status").write_text(f"Name:\t{comm}\nNSpid:\t{nspid}\n")
        (proc / pid / "stat").write_text(f"1 ({comm}) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1 1 1\n")
    scenario.write(FULL + "gpu 0 proc 5100 2147483648 60\ngpu 0 proc 5200 1048576 -1\ngpu 0 proc 7777 4096 -1\n")
    c = make_collector(fake_nvml["full"], proc_root=str(proc))
    parsed = sweep(c)
    assert value(parsed, "outrider_gpu_process_memory_bytes", **G0, pid="40", name="python") == 2147483648
    assert value(parsed, "outrider_gpu_process_sm_utilization_ratio", **G0, pid="40", name="python") == 0.6
    assert value(parsed, "outrider_gpu_process_memory_bytes", **G0, pid="5200", name="other-pod") == 1048576
    assert value(parsed, "outrider_gpu_process_sm_utilization_ratio", **G0, pid="5200", name="other-pod") is None, \
        "no utilisation invented where NVML gives no sample"
    assert value(parsed, "outrider_gpu_process_memory_bytes", **G0, pid="7777", name="") == 4096, "not visible here"


def test_mig_devices_report_memory_per_gpu_instance(fake_nvml: dict[str, str], scenario: Scenario) -> None:
    scenario.write(FULL.replace("gpu 0 mig_mode 0", "gpu 0 mig_mode 1") + """
gpu 0 max_mig 7
gpu 0 mig 0 8
gpu 0 mig 2 9
gpu 8 uuid MIG-aaaa
gpu 8 gpu_instance 1
gpu 8 memory_total 42949672960
gpu 8 memory_used 1073741824
gpu 8 memory_free 41875931136
gpu 9 uuid MIG-bbbb
gpu 9 gpu_instance 5
gpu 9 memory_total 21474836480
gpu 9 memory_used 0
gpu 9 memory_free 21474836480
""")
    c = make_collector(fake_nvml["full"])
    parsed = sweep(c)
    assert value(parsed, "outrider_gpu_mig_mode", **G0) == 1
    assert value(parsed, "outrider_gpu_mig_memory_used_bytes", **G0, mig_uuid="MIG-aaaa", gpu_instance="1") == 1 << 30
    assert value(parsed, "outrider_gpu_mig_memory_total_bytes", **G0, mig_uuid="MIG-bbbb", gpu_instance="5") == 20 << 30
    migs = {dict(labels)["mig_uuid"] for (name, labels) in parsed if name == "outrider_gpu_mig_memory_used_bytes"}
    assert migs == {"MIG-aaaa", "MIG-bbbb"}, "empty slots are skipped"
    assert value(parsed, "outrider_gpu_mig_memory_used_bytes", **G1, mig_uuid="MIG-aaaa", gpu_instance="1") is None


def test_a_hung_nvml_call_does_not_stop_the_sweep(fake_nvml: dict[str, str], scenario: Scenario,
                                                  tmp_path: Path) -> None:
    from outrider.collectors.host import HostCollector
    from outrider.collectors.self import SelfCollector
    from outrider.ground.config import Config
    from outrider.metrics.exposition import render
    from outrider.wiring.sampler import Sampler
    from tests.helpers import samples

    scenario.write(FULL + "hang nvmlDeviceGetPowerUsage 4000\n")
    config = Config(nvml_library=fake_nvml["full"], collector_timeout_s=0.3, filesystems=())
    s = Sampler(config, collectors=[])
    gpu = make_collector(fake_nvml["full"])
    s.collectors = [gpu, HostCollector(s.ctx), SelfCollector(s.ctx)]
    gpu.ctx = s.ctx
    s.sweep()  # the GPU collector hangs in nvmlDeviceGetPowerUsage; the sweep goes on
    parsed = samples(render(s.sweep()).decode())  # still hung: not even started again
    assert value(parsed, "outrider_collector_hung", collector="gpu") == 1
    assert value(parsed, "outrider_collector_success", collector="gpu") == 0
    assert value(parsed, "outrider_collector_success", collector="host") == 1
    assert ("outrider_host_load1", ()) in parsed, "the rest of the sweep is there"
    scenario.write(FULL)
    wait_until(lambda: value(samples(render(s.sweep()).decode()), "outrider_collector_hung", collector="gpu") == 0
               and value(samples(render(s.sweep()).decode()), "outrider_gpu_power_watts", **G0) == 612.345,
               timeout_s=30, what="the GPU collector back after the hang")
