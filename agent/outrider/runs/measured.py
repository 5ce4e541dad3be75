"""What the agent measured of a run through the hook, over the whole run: steps, step time, throughput, data wait,
requests, latency and errors, from the final sweep's histograms and counters (cumulative since each process
started). Every `outrider run` summary and every report shows it, rendered by `rows()`; a run whose command never
called `outrider.instrument()` says so instead of showing nothing, and one whose hooked processes never completed
a step or a request says that instead (with the ranks that waited for a first step, from the run's sweeps:
runs/recorder.py)."""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any

from outrider.diagnosis.profile import LoopProfile, loop_profile
from outrider.ground.peaks import usual_dtype
from outrider.metrics import units
from outrider.metrics.family import Family, HistogramValue, merged_histogram
from outrider.metrics.quantile import quantile

GOODPUT = "outrider_train_goodput_seconds_total"
BADPUT_NAMES = {"data_wait": "data wait", "checkpoint": "checkpoints", "other": "the rest of the loop",
                "stall": "stalls", "restart": "restarts", "startup": "start-up"}
STEP, WAIT, REQUEST = ("outrider_train_step_duration_seconds", "outrider_train_data_wait_seconds",
                       "outrider_request_duration_seconds")
CHECKPOINT = "outrider_train_checkpoint_duration_seconds"
LOOP = "outrider_train_loop_seconds_total"


@dataclass(frozen=True)
class Training:
    processes: int  # that took steps
    steps: float
    samples: float
    step_p50_s: float | None
    step_p99_s: float | None
    samples_per_s: float | None  # per second of the training loop's wall time (see measure), all ranks
    first_step_s: float | None  # after instrument()
    data_wait_p50_s: float | None
    data_wait_fraction: float | None  # the loop's wall time inside the DataLoader's next(), over that wall time
    checkpoints: float = 0.0  # recognised checkpoints (torch.save and the like on the loop's thread), all ranks
    checkpoint_p50_s: float | None = None
    checkpoint_s: float = 0.0  # their time, summed over ranks
    steps_per_s: float | None = None  # like samples_per_s
    tokens: float = 0.0
    tokens_per_s: float | None = None
    checkpoint_fraction: float | None = None  # the loop's wall time inside recognised checkpoints
    mfu: float | None = None  # model FLOPs utilisation over the steps whose FLOPs and peak are known, all ranks
    mfu_timed_s: float = 0.0  # the loop's wall time those steps took (the ranks' summed): what the MFU covers
    peak_flops: float | None = None  # the peak a rank's MFU is judged against (its devices', at its usual dtype)
    peak_dtype: str = ""
    device_tokens_per_s: float | None = None  # tokens_per_s over the devices the ranks use
    goodput: float | None = None  # the productive share of the ranks' wall time, across restarts
    badput_s: dict[str, float] = field(default_factory=dict)  # the rest of it by cause (collectors/goodput.py)
    restarts: float = 0.0

    def rows(self) -> list[tuple[str, str]]:
        parts = [f"{units.count(self.steps)} steps"]
        if self.steps_per_s:
            parts.append(units.rate(self.steps_per_s, "steps"))
        if self.step_p50_s is not None and self.step_p99_s is not None:
            parts.append(f"step time p50 {units.seconds(self.step_p50_s)}, p99 {units.seconds(self.step_p99_s)}")
        if self.samples_per_s:
            parts.append(units.rate(self.samples_per_s, "samples"))
        if self.tokens_per_s:
            parts.append(units.rate(self.tokens_per_s, "tokens"))
        if self.processes > 1:
            parts.append(f"{self.processes} processes")
        out = [("training", ", ".join(parts))]
        if self.data_wait_fraction is not None and self.data_wait_p50_s is not None:
            out.append(("", f"data-loader wait p50 {units.seconds(self.data_wait_p50_s)}, "
                            f"{units.percent(self.data_wait_fraction)} of the loop waiting for data"))
        if self.checkpoints and self.checkpoint_p50_s is not None:
            share = f" ({units.percent(self.checkpoint_fraction)} of the loop)" if self.checkpoint_fraction else ""
            out.append(("", f"{units.count(self.checkpoints)} checkpoints, p50 {units.seconds(self.checkpoint_p50_s)}"
                            f", {units.seconds(self.checkpoint_s)} in all{share}"))
        if self.first_step_s is not None:
            out.append(("", f"first step {units.seconds(self.first_step_s)} after instrument()"))
        if self.mfu is not None:
            peak = (f" ({units.flop_rate(self.peak_flops)} {self.peak_dtype} a rank)" if self.peak_flops else "")
            tokens = (f"; {units.rate(self.device_tokens_per_s, 'tokens')} a device" if self.device_tokens_per_s
                      else "")
            out.append(("", f"MFU {units.percent(self.mfu)}: the model's FLOPs at {units.percent(self.mfu)} of the "
                            f"devices' peak{peak}{tokens}"))
        elif self.device_tokens_per_s:
            out.append(("", f"{units.rate(self.device_tokens_per_s, 'tokens')} a device"))
        if self.goodput is not None:
            total = sum(self.badput_s.values()) / (1.0 - self.goodput) if self.goodput < 1.0 else 0.0
            causes = ", ".join(f"{BADPUT_NAMES.get(cause, cause)} {units.percent(s / total)}"
                               for cause, s in sorted(self.badput_s.items(), key=lambda kv: -kv[1]) if s > 0 and total)
            restarts = f" ({units.count(self.restarts, 'restarts' if self.restarts != 1 else 'restart')})" \
                if self.restarts else ""
            out.append(("", f"goodput {units.percent(self.goodput)} of the ranks' wall time"
                            f"{'; badput: ' + causes if causes else ''}{restarts}"))
        return out


@dataclass(frozen=True)
class Waiting:
    """Hooked training processes that never completed a step: the ranks that waited for a first step ("-": no
    rank), those of them the hook called stalled (no first step within first_step_timeout_s), the longest wait."""

    ranks: list[str]
    stalled: list[str]
    longest_s: float

    def rows(self) -> list[tuple[str, str]]:
        who = f"rank {', '.join(self.ranks)}" if self.ranks != ["-"] else "the training process"
        text = f"no step completed: {who} waited {units.seconds(self.longest_s)} for a first step after instrument()"
        if self.stalled:
            text += " and stalled (no first step within the first-step timeout: hung before its first step)"
        return [("training", text)]


@dataclass(frozen=True)
class Inference:
    requests: float
    routes: list[str]
    latency_p50_s: float
    latency_p90_s: float
    latency_p99_s: float
    client_errors: float  # 4xx
    server_errors: float  # 5xx

    def rows(self) -> list[tuple[str, str]]:
        where = f" on {', '.join(self.routes)}" if self.routes else ""
        errors = self.client_errors + self.server_errors
        detail = f" ({units.count(self.client_errors)} 4xx, {units.count(self.server_errors)} 5xx)" if errors else ""
        return [("inference", f"{units.count(self.requests)} requests{where}, latency p50 "
                              f"{units.seconds(self.latency_p50_s)}, p90 {units.seconds(self.latency_p90_s)}, p99 "
                              f"{units.seconds(self.latency_p99_s)}; {units.count(errors)} errors{detail}")]


@dataclass(frozen=True)
class Measured:
    training: Training | None = None
    inference: Inference | None = None
    waiting: Waiting | None = None  # set when no step completed and some rank waited for its first
    hooked: bool = False  # some process of the command called outrider.instrument()
    profile: LoopProfile | None = None  # the loop thread's stack samples (hook/profiler.py)

    def rows(self) -> list[tuple[str, str]]:
        """(topic, what was measured) lines, in human units; the same for the summary and the report."""
        out = (self.training.rows() if self.training else []) + (self.inference.rows() if self.inference else [])
        if not self.training and self.waiting:
            out = self.waiting.rows() + out
        if out:
            return out
        if self.hooked:
            return [("hook", "no step and no request: the command's processes called outrider.instrument() but "
                             "recorded neither")]
        return [("hook", "nothing: no process of the command called outrider.instrument() (the process "
                         "tree's CPU, memory and I/O above are measured without it)")]

    def profile_rows(self) -> list[tuple[str, str]]:
        """Where the training loop's thread was, and its hottest lines (the report shows the whole table)."""
        return self.profile.rows() if self.profile else []

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["profile"] = self.profile.to_json() if self.profile else None
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Measured:
        def part(kind: type[Training] | type[Inference] | type[Waiting], value: Any) -> Any:
            if not isinstance(value, dict):
                return None
            names = {f.name for f in fields(kind)}
            required = {f.name for f in fields(kind)  # records from before a field lack it
                        if f.default is MISSING and f.default_factory is MISSING}
            return kind(**{k: v for k, v in value.items() if k in names}) if required <= set(value) else None

        return cls(part(Training, data.get("training")), part(Inference, data.get("inference")),
                   part(Waiting, data.get("waiting")), bool(data.get("hooked", False)),
                   LoopProfile.from_json(data.get("profile")))


def _sum(families: list[Family], name: str, label: str = "", value: str = "") -> float:
    total = 0.0
    for f in families:
        if f.defn.name != name:
            continue
        at = f.defn.label_names.index(label) if label else -1
        for labels, v in f.samples:
            if isinstance(v, float) and (at < 0 or labels[at] == value):
                total += v
    return total


def _efficiency(families: list[Family], tokens_per_s: float | None) -> dict[str, Any]:
    """MFU (the efficiency collector's counters: time at the peak over the loop's time of the same steps), the peak
    it was judged against, tokens a second per device, and goodput by cause (the hook collector's)."""
    out: dict[str, Any] = {}
    timed = _sum(families, "outrider_train_flops_timed_seconds_total")
    if timed > 0:
        out["mfu"] = _sum(families, "outrider_train_flops_peak_seconds_total") / timed
        out["mfu_timed_s"] = timed
    ranks: dict[tuple[str, str], dict[str, float]] = {}
    devices: dict[tuple[str, str], int] = {}  # every rank that stepped: its CUDA devices, else 1 (the CPU)
    for f in families:
        names = f.defn.label_names
        for labels, v in f.samples:
            if not isinstance(v, float):
                continue
            by = dict(zip(names, labels))
            rank = (by.get("training_job", ""), by.get("rank", ""))
            if f.defn.name == "outrider_train_peak_flops":
                ranks.setdefault(rank, {})[by.get("dtype", "")] = v
            elif f.defn.name == LOOP:
                devices.setdefault(rank, 0)
            elif f.defn.name == "outrider_torch_cuda_memory_bytes" and by.get("kind") == "reserved" and v > 0:
                devices[rank] = devices.get(rank, 0) + 1
    usual: list[tuple[str, float]] = []  # each rank's usual dtype and its peak (peaks.usual)
    for by_dtype in ranks.values():
        dtype = usual_dtype(by_dtype)
        if dtype is not None:
            usual.append((dtype, by_dtype[dtype]))
    if usual:
        out["peak_dtype"], out["peak_flops"] = usual[0][0], sum(v for _, v in usual) / len(usual)
    if tokens_per_s:
        out["device_tokens_per_s"] = tokens_per_s / max(1, sum(max(n, 1) for n in devices.values()))
    seconds: dict[str, float] = {}
    for f in families:
        if f.defn.name == GOODPUT:
            at = f.defn.label_names.index("cause")
            for labels, v in f.samples:
                if isinstance(v, float):
                    seconds[labels[at]] = seconds.get(labels[at], 0.0) + v
    total = sum(seconds.values())
    if total > 0:
        out["goodput"] = seconds.pop("productive", 0.0) / total
        out["badput_s"] = seconds
        out["restarts"] = _sum(families, "outrider_train_restarts_total")
    return out


def _series(families: list[Family], name: str) -> list[tuple[tuple[str, ...], HistogramValue]]:
    return [(labels, v) for f in families if f.defn.name == name for labels, v in f.samples
            if isinstance(v, HistogramValue) and v.count]


def measure(families: list[Family], waiting: Waiting | None = None, hooked: bool = False) -> Measured:
    """What the final sweep's families say; `waiting` and `hooked` come from the run's sweeps (runs/recorder.py):
    a process that never stepped leaves nothing of that in the final sweep (its gauges go with it).

    Rates are per second of the training loop's wall time, from the loop's own account of it
    (`outrider_train_loop_seconds_total`, hook/loop.py: from each process's first step's end to its last's, which
    covers all its steps but the first); ranks run side by side, so the job's rate is their sum. Data wait is the
    loop's time inside the DataLoader's next() over that wall time: the one definition the verdict, `outrider top`
    and `outrider compare` use."""
    training = inference = None
    step, wait = merged_histogram(families, STEP), merged_histogram(families, WAIT)
    if step is not None and step.count:
        processes = len(_series(families, STEP))
        steps = _sum(families, "outrider_train_steps_total") or float(step.count)
        samples, tokens = _sum(families, "outrider_samples_total"), _sum(families, "outrider_tokens_total")
        loop_s = _sum(families, LOOP)
        timed = steps - processes  # the steps inside the loop's account: each process's first opens it
        per_s = processes / loop_s if loop_s > 0 and timed > 0 else 0.0  # ranks side by side
        waited = wait is not None and wait.count > 0 and loop_s > 0

        def rate(count: float) -> float | None:
            return count * timed / steps * per_s if count and per_s else None

        firsts = [v for f in families if f.defn.name == "outrider_train_time_to_first_step_seconds"
                  for _, v in f.samples if isinstance(v, float)]
        training = Training(
            processes=processes, steps=steps, samples=samples, step_p50_s=quantile(0.5, step),
            step_p99_s=quantile(0.99, step), samples_per_s=rate(samples),
            first_step_s=max(firsts) if firsts else None,
            data_wait_p50_s=quantile(0.5, wait) if wait is not None and waited else None,
            data_wait_fraction=_sum(families, LOOP, "part", "data_wait") / loop_s if waited else None,
            steps_per_s=timed * per_s or None, tokens=tokens, tokens_per_s=rate(tokens))
        training = replace(training, **_efficiency(families, training.tokens_per_s))
        saves = merged_histogram(families, CHECKPOINT)
        if saves is not None and saves.count:
            saved = _sum(families, LOOP, "part", "checkpoint")
            training = replace(training, checkpoints=float(saves.count),
                               checkpoint_p50_s=quantile(0.5, saves), checkpoint_s=saves.sum,
                               checkpoint_fraction=saved / loop_s if saved and loop_s > 0 else None)
    req = merged_histogram(families, REQUEST)
    if req is not None and req.count:
        route_at = next((f.defn.label_names.index("route") for f in families if f.defn.name == REQUEST), 0)
        inference = Inference(
            requests=float(req.count),
            routes=sorted({labels[route_at] for labels, _ in _series(families, REQUEST) if labels[route_at]}),
            latency_p50_s=quantile(0.5, req) or 0.0, latency_p90_s=quantile(0.9, req) or 0.0,
            latency_p99_s=quantile(0.99, req) or 0.0,
            client_errors=_sum(families, "outrider_requests_total", "status_class", "4xx"),
            server_errors=_sum(families, "outrider_requests_total", "status_class", "5xx"))
    return Measured(training, inference, waiting if training is None else None, hooked,
                    loop_profile(families) if training is not None else None)
