"""Efficiency collector: model FLOPs utilisation (MFU) and tokens a second per device, per training job and rank.

It listens to every finished sweep (like the diagnosis collector) and reports in the next one, from what that sweep
holds: the FLOPs the hook published (`outrider_train_flops_total{dtype}`: hook/torch_flops.py, or declared), the
loop's wall time (`outrider_train_loop_seconds_total`: hook/loop.py), the tokens, and what a rank runs on:

- a rank whose process holds CUDA memory (`outrider_torch_cuda_memory_bytes{kind="reserved"}` on N devices) uses N
  GPUs of the node's model (the GPU collector's NVML name and maximum SM clock): its peak is the table's
  (outrider/ground/peaks.py) times N. A node whose GPUs are of several models, or whose GPUs the agent cannot see (a
  sidecar without them), has no GPU peak unless `peak_flops` gives one;
- any other rank runs on the CPU: its peak is the CPU's measured one (`cpu_peak_gflops`, measured by `outrider run`:
  outrider/ground/peaks.py), scaled to the threads the rank's torch uses (`outrider_torch_intra_op_threads`) over those
  the measurement used;
- `peak_flops` replaces both, per device.

MFU over a window is the time the window's FLOPs would take at the peak, dtype by dtype (peaks.seconds_at_peak),
over the loop's wall time in it. The window is a rank's: between the last two sweeps in which its loop time grew
(the hook's publications, never the sweeps' timing), and only where its FLOPs were already published at the
window's start (the first counted step comes after a few: a window holding steps before it would read low). Both
sides accumulate (`outrider_train_flops_peak_seconds_total`, `outrider_train_flops_timed_seconds_total`): their
ratio is the MFU of any span, which the run's summary, the dashboards and the alert take.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from outrider.collectors.base import Collector, CollectorContext
from outrider.ground import peaks
from outrider.ground.peaks import gpu_peaks, parse_peaks, seconds_at_peak
from outrider.kernel import procfs
from outrider.metrics.family import Family
from outrider.metrics.rate import family_samples

FLOPS, LOOP, TOKENS = "outrider_train_flops_total", "outrider_train_loop_seconds_total", "outrider_tokens_total"
CUDA_MEMORY, THREADS = "outrider_torch_cuda_memory_bytes", "outrider_torch_intra_op_threads"
GPU_CLOCK, GPU_UP = "outrider_gpu_clock_max_hertz", "outrider_gpu_up"
READ = (FLOPS, LOOP, TOKENS, CUDA_MEMORY, THREADS, GPU_CLOCK, GPU_UP)
MAX_RANKS = 10_000
Rank = tuple[str, str]  # (training_job, rank)


@dataclass
class _Reading:
    flops: dict[str, float] = field(default_factory=dict)  # dtype -> total
    loop_s: float = 0.0
    tokens: float = 0.0
    devices: int = 0  # CUDA devices with memory reserved
    threads: float = 0.0


@dataclass
class _RankState:
    last: _Reading  # at the last sweep its loop time grew
    peaks: dict[str, float] | None = None
    mfu: float | None = None
    tokens_per_s: float | None = None
    peak_s: float = 0.0
    timed_s: float = 0.0
    present: bool = True  # in the last sweep
    threads: float = 0.0  # its torch's intra-op threads, as last published
    devices: int = 0  # its CUDA devices, as last published


class EfficiencyCollector(Collector):
    name = "efficiency"
    description = "model FLOPs utilisation and tokens a second per device, per training job and rank"

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        config = ctx.config
        self.override = parse_peaks(config.peak_flops)
        self.cpu_peak = config.cpu_peak_gflops * 1e9
        self.cpu_threads = config.cpu_peak_threads
        if self.cpu_peak <= 0 and not self.override:
            measured = peaks.cached_cpu_peak(machine_key(config.proc_root))
            if measured is not None:
                self.cpu_peak, self.cpu_threads = measured.flops, measured.threads
        self.ranks: dict[Rank, _RankState] = {}
        ctx.listeners.append(self._on_sweep)

    def _on_sweep(self, families: list[Family]) -> None:
        readings: dict[Rank, _Reading] = {}
        gpus: dict[str, tuple[str, float | None]] = {}  # uuid -> (model, max SM clock)
        for name, labels, value in family_samples(families, READ):
            if name == GPU_UP:
                gpus.setdefault(labels.get("uuid", ""), (labels.get("model", ""), None))
                continue
            if name == GPU_CLOCK:
                if labels.get("clock") == "sm":
                    gpus[labels.get("uuid", "")] = (labels.get("model", ""), value)
                continue
            r = readings.setdefault((labels.get("training_job", ""), labels.get("rank", "")), _Reading())
            if name == FLOPS:
                r.flops[labels.get("dtype", "")] = r.flops.get(labels.get("dtype", ""), 0.0) + value
            elif name == LOOP:
                r.loop_s += value
            elif name == TOKENS:
                r.tokens += value
            elif name == CUDA_MEMORY:
                if labels.get("kind") == "reserved" and value > 0:
                    r.devices += 1
            elif name == THREADS:
                r.threads = max(r.threads, value)
        gpu = _node_gpu(gpus)
        for known in self.ranks.values():
            known.present = False
        for rank, reading in readings.items():
            if not reading.flops and not reading.tokens:
                continue
            state = self.ranks.get(rank)
            if state is None:
                if len(self.ranks) >= MAX_RANKS:
                    continue
                state = self.ranks[rank] = _RankState(reading)
            state.present = True
            # a process that exited has its gauges retired but its counters kept: its peak stays the one it had
            reading.threads = state.threads = reading.threads or state.threads
            reading.devices = state.devices = reading.devices or state.devices
            state.peaks = self._peaks(reading, gpu)
            self._window(state, reading)

    def _peaks(self, r: _Reading, gpu: dict[str, float] | None) -> dict[str, float] | None:
        devices = max(r.devices, 1)
        if self.override:
            return {dtype: value * devices for dtype, value in self.override.items()}
        if r.devices:
            return {dtype: value * devices for dtype, value in gpu.items()} if gpu else None
        if self.cpu_peak <= 0:
            return None
        share = min(1.0, r.threads / self.cpu_threads) if r.threads and self.cpu_threads else 1.0
        return {"fp32": self.cpu_peak * share}  # the one figure measured: every dtype is judged against it

    @staticmethod
    def _window(state: _RankState, now: _Reading) -> None:
        last = state.last
        if now.loop_s < last.loop_s:  # the rank's series started again (the agent's retired ones expired)
            state.last = now
            return
        if now.loop_s == last.loop_s:
            return  # no publication since: the window stays open
        timed = now.loop_s - last.loop_s
        state.tokens_per_s = (now.tokens - last.tokens) / timed / max(now.devices, 1) if now.tokens else None
        grown = {dtype: now.flops.get(dtype, 0.0) - last.flops.get(dtype, 0.0) for dtype in now.flops}
        if last.flops and state.peaks and all(v >= 0 for v in grown.values()):
            at_peak = seconds_at_peak(grown, state.peaks)
            if at_peak is not None:
                state.mfu = at_peak / timed
                state.peak_s += at_peak
                state.timed_s += timed
        state.last = now

    def collect(self) -> list[Family]:
        peak = Family("outrider_train_peak_flops")
        mfu = Family("outrider_train_mfu_ratio")
        peak_s = Family("outrider_train_flops_peak_seconds_total")
        timed_s = Family("outrider_train_flops_timed_seconds_total")
        tokens = Family("outrider_train_device_tokens_per_second")
        for (job, rank), state in sorted(self.ranks.items()):
            if state.timed_s:
                peak_s.add(state.peak_s, rank, job)
                timed_s.add(state.timed_s, rank, job)
            if not state.present:
                continue  # the counters stay (they never go back); the gauges go with the rank
            for dtype, value in sorted((state.peaks or {}).items()):
                peak.add(value, rank, job, dtype)
            if state.mfu is not None:
                mfu.add(state.mfu, rank, job)
            if state.tokens_per_s is not None:
                tokens.add(state.tokens_per_s, rank, job)
        return [peak, mfu, peak_s, timed_s, tokens]


def machine_key(proc_root: str) -> str:
    """This machine's key in the CPU peak's cache (outrider/ground/peaks.py), as `outrider run` writes it."""
    try:
        model = procfs.read_cpu_model(proc_root)
    except OSError:
        model = ""
    return peaks.machine_key(model)


def _node_gpu(gpus: dict[str, tuple[str, float | None]]) -> dict[str, float] | None:
    """The peaks of the node's GPUs, where they are all of one model the table knows (at the lowest maximum SM
    clock among them); None otherwise."""
    models = {model for model, _ in gpus.values()}
    if len(models) != 1:
        return None
    clocks = [clock for _, clock in gpus.values() if clock]
    return gpu_peaks(models.pop(), min(clocks) if clocks else None)
