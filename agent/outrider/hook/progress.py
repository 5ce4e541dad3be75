"""A training process's progress: steps done, declared long phases, and whether it is stalled.

Stalled means: no step for max(stall_factor x the median of the last 32 steps, stall_floor_s); or, for a training
process, no first step within first_step_timeout_s of instrument(); or a declared phase (`outrider.phase(
"checkpoint")`) open for longer than phase_timeout_s. Time inside a declared phase never counts towards a step
stall: a synchronous checkpoint or evaluation is expected to be long.

Checkpoints the torch integration recognises (torch.save and the like on the loop's thread: hook/
torch_checkpoint.py) are not declared: while one runs, the stall waits for the checkpoint instead of the step.
The first checkpoint of a kind (torch.save, DCP, an fsspec or boto3 upload: hook/torch_checkpoint.py names them) may
take up to phase_timeout_s, as a declared phase; once one of its kind has finished, a checkpoint is stalled past
max(CHECKPOINT_FACTOR x the longest earlier one of its kind, stall_floor_s, the step threshold): it overran its own
learned duration by far (kinds apart: a torch.save into a buffer takes milliseconds, the upload after it minutes).
Either way, a checkpoint during which the process wrote nothing to storage (/proc/self/io write_bytes grew by less
than WRITING_BYTES_PER_S) for longer than the step threshold is stalled: a save hung on a collective or a dead
filesystem does not wait for the long limit. That rule is for saves to local storage only: a save to the network (a
file-like object, object storage through fsspec or boto3, a DCP storage writer other than the file system's) writes
nothing the kernel counts as storage, and is judged by its limit alone. Steps that pause while the process writes
heavily (a checkpoint through a library that is not recognised: pickle, numpy, orbax) are held the same way: the step
threshold then runs from the last heavy write, up to phase_timeout_s.

A process is a training process when its role says so (OUTRIDER_ROLE), when it stepped, used the data-loader
wrapper or declared a phase, or when the torch integration saw it build what only training builds (an optimizer, a
DDP or FSDP wrapper: strong evidence). Weaker evidence (launched by torchrun, a process group initialised) makes it
one only while it serves no request: tensor-parallel inference servers initialise process groups too. A DataLoader
alone is no evidence: batch inference iterates them, and would be paged for never stepping.

Written by the publisher thread (steps, drained from the hot path's ring; write rates) and by the user's threads
(a phase opened or closed, a recognised checkpoint begun or ended, training evidence); read by the publisher thread.
Single stores and dict operations under the GIL: no lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter

from outrider.hook.settings import KEYS
from outrider.kernel import procfs

RECENT = 32
CHECKPOINT_FACTOR = 3.0  # a checkpoint is stalled past this many times the longest earlier one
WRITING_BYTES_PER_S = 1 << 20  # write rate to storage (between two looks) that counts as writing: a checkpoint's,
# not a logger's (a hung job whose logger writes on must still stall)
WRITE_LOOK_S = 0.5  # the shortest interval a write rate is taken over
MAX_PHASES = 100  # phase names are user input: more distinct ones are timed only while open


@dataclass(frozen=True)
class Stall:
    newly: bool  # this check found it (dump the stacks now)
    message: str


class Progress:
    def __init__(self, stall_factor: float = KEYS["stall_factor"], stall_floor_s: float = KEYS["stall_floor_s"],
                 first_step_timeout_s: float = KEYS["first_step_timeout_s"],
                 phase_timeout_s: float = KEYS["phase_timeout_s"], role: str = "", training_hint: bool = False,
                 written: Callable[[], int | None] | None = None) -> None:
        """written: bytes this process has written to storage so far (None: unknown); /proc/self/io by default."""
        self.stall_factor = stall_factor
        self.stall_floor_s = stall_floor_s
        self.first_step_timeout_s = first_step_timeout_s
        self.phase_timeout_s = phase_timeout_s
        self.role = role
        self.training_hint = training_hint  # e.g. started by torchrun
        self.written = written or written_bytes
        self.reset()

    def reset(self) -> None:
        """At start, and in a forked child (its parent's progress is the parent's)."""
        self.started_perf = perf_counter()
        self.steps = 0
        self.last_step_perf = 0.0
        self.recent = [0.0] * RECENT
        self._recent_at = 0
        self.open_phases: dict[str, float] = {}  # name -> perf_counter when opened
        self.phase_totals: dict[str, float] = {}  # name -> seconds in closed phases
        self.last_phase_end_perf = 0.0
        self.stalled_since_ns = 0
        self.stalls = 0
        self.training_seen = False  # a training API was used (step, data loader, phase)
        self.serving_seen = False  # a request was recorded
        self.pending_published = False  # the first-step-pending gauge was published (it stays, at 0 if need be)
        self.weak_evidence = False  # a process group was initialised: training unless it serves requests
        self.evidence = ""  # what made the torch integration call this process training (the first thing seen)
        self.checkpoint_since = 0.0  # perf_counter when the recognised checkpoint running now began; 0: none
        self.checkpoint_local = True  # whether it writes to local storage (else the network: its writes unseen)
        self.checkpoint_kind = ""  # what saves it (torch.save, an fsspec upload, ...)
        self.checkpoint_kinds: dict[str, tuple[int, float]] = {}  # kind -> (finished, the longest of them)
        self.checkpoint_longest = 0.0  # the longest finished one
        self.checkpoints = 0
        self.io_seen: tuple[float, int] | None = None  # (perf_counter, bytes written) at the last look
        self.last_write_perf = 0.0  # the last look that found the process writing heavily

    def mark_training(self, evidence: str, strong: bool) -> None:
        """The torch integration saw training being set up (`evidence`: what, for the stall message). Called
        from the user's thread when it builds an optimizer, a wrapper or a process group: single stores."""
        if not self.evidence:
            self.evidence = evidence
        if strong:
            self.training_seen = True
        else:
            self.weak_evidence = True

    # --- writers ---------------------------------------------------------------------------------------------
    def record_steps(self, count: int, last_end_perf: float, durations: list[float]) -> None:
        """Steps drained from the hot path's ring: the count is exact, durations may be the most recent only."""
        if count <= 0:
            return
        for d in durations[-RECENT:]:
            self.recent[self._recent_at % RECENT] = d
            self._recent_at += 1
        self.steps += count
        self.last_step_perf = last_end_perf

    def open_phase(self, name: str) -> None:
        self.training_seen = True
        self.open_phases.setdefault(name, perf_counter())

    def close_phase(self, name: str) -> None:
        since = self.open_phases.pop(name, None)
        if since is not None:
            now = perf_counter()
            if name in self.phase_totals or len(self.phase_totals) < MAX_PHASES:
                self.phase_totals[name] = self.phase_totals.get(name, 0.0) + (now - since)
            self.last_phase_end_perf = now

    def checkpoint_begin(self, local_storage: bool = True, kind: str = "") -> None:
        """The loop's thread entered a recognised save (hook/torch_checkpoint.py); local_storage: it writes to this
        machine's storage, where /proc/self/io sees its writes (not a buffer, a socket, object storage); kind: what
        saves (torch.save, an fsspec upload, ...), whose durations are learned apart."""
        self.checkpoint_local = local_storage
        self.checkpoint_kind = kind
        self.checkpoint_since = perf_counter()

    def checkpoint_end(self) -> None:
        now = perf_counter()
        since, self.checkpoint_since = self.checkpoint_since, 0.0
        if since:
            self.checkpoint_longest = max(self.checkpoint_longest, now - since)
            self.checkpoints += 1
            count, longest = self.checkpoint_kinds.get(self.checkpoint_kind, (0, 0.0))
            if self.checkpoint_kind in self.checkpoint_kinds or len(self.checkpoint_kinds) < MAX_PHASES:
                self.checkpoint_kinds[self.checkpoint_kind] = (count + 1, max(longest, now - since))
            self.last_phase_end_perf = now  # the wait for the next step starts again here

    def note_writes(self, now: float) -> None:
        """Publisher thread, each check of a process that stepped: whether it wrote heavily since the last look
        (one small read of /proc)."""
        seen = self.io_seen
        if seen is not None and now - seen[0] < WRITE_LOOK_S:
            return  # a rate over a few microseconds (back-to-back checks) is one page cache flush, not a rate
        total = self.written()
        if total is None:
            return
        self.io_seen = (now, total)
        if seen is not None and total - seen[1] >= WRITING_BYTES_PER_S * (now - seen[0]):
            self.last_write_perf = now

    # --- readers (the publisher) -----------------------------------------------------------------------------
    @property
    def training(self) -> bool:
        if self.role:
            return self.role == "training"
        return self.steps > 0 or self.training_seen or (
            (self.training_hint or self.weak_evidence) and not self.serving_seen)

    @property
    def first_step_pending(self) -> bool:
        return self.training and self.steps == 0

    def phase_seconds(self) -> dict[str, tuple[float, bool]]:
        """Seconds spent in each declared phase so far (open ones included), and whether it is open now."""
        now = perf_counter()
        out = {name: (total, False) for name, total in self.phase_totals.items()}
        for name, since in list(self.open_phases.items()):
            out[name] = (out.get(name, (0.0, False))[0] + now - since, True)
        return out

    def last_step_wall_ns(self) -> int:
        """Wall time of the last step, derived here so the hot path reads one clock only."""
        if not self.steps:
            return 0
        return time.time_ns() - int((perf_counter() - self.last_step_perf) * 1e9)

    def check(self) -> Stall | None:
        """None while progressing; a Stall while stalled (newly set on the check that finds it)."""
        now = perf_counter()
        if self.steps or self.checkpoint_since:
            self.note_writes(now)
        waited, threshold, what = self._wait(now)
        if waited <= threshold:
            self.stalled_since_ns = 0  # progress again
            return None
        newly = not self.stalled_since_ns
        if newly:
            self.stalled_since_ns = time.time_ns()
            self.stalls += 1
        return Stall(newly, f"{what} for {waited:.1f} s (threshold {threshold:.1f} s)")

    def _wait(self, now: float) -> tuple[float, float, str]:
        """How long this process has waited for progress, the threshold, and what it waits for."""
        phases = list(self.open_phases.items())
        if phases:
            name, since = min(phases, key=lambda p: p[1])
            return now - since, self.phase_timeout_s, f"declared phase {name!r} still open"
        if not self.steps:
            if not self.training:
                return 0.0, 1.0, ""
            since = max(self.started_perf, self.last_phase_end_perf)
            why = f" (a training process: it {self.evidence})" if self.evidence else ""
            return now - since, self.first_step_timeout_s, f"no first step{why}"
        threshold = self._step_threshold()
        since = max(self.last_step_perf, self.last_phase_end_perf)
        if self.checkpoint_since:
            return self._checkpoint_wait(now, threshold)
        if self.last_write_perf > since and now - since <= self.phase_timeout_s:
            # steps pause while the process writes heavily: an unrecognised checkpoint, given up to
            # phase_timeout_s; the wait counts from its last heavy write
            return now - self.last_write_perf, threshold, (f"no step completed after {self.steps} steps, nor a "
                                                           f"heavy write to storage")
        return now - since, threshold, f"no step completed after {self.steps} steps"

    def _step_threshold(self) -> float:
        return max(self.stall_factor * self.typical_step_s(), self.stall_floor_s)

    def typical_step_s(self) -> float:
        """The median of the recent steps' durations (the upper one of an even count), 0 before any: what a stall
        (here) and an idle loop (hook/profiler.py) are judged against."""
        recent = sorted(d for d in self.recent if d > 0)
        return recent[len(recent) // 2] if recent else 0.0

    def _checkpoint_wait(self, now: float, step_threshold: float) -> tuple[float, float, str]:
        """A recognised checkpoint runs: stalled past its learned limit, or when it writes nothing for long."""
        waited = now - self.checkpoint_since
        count, longest = self.checkpoint_kinds.get(self.checkpoint_kind, (0, 0.0))
        if count:
            limit = max(CHECKPOINT_FACTOR * longest, self.stall_floor_s, step_threshold)
            what = (f"checkpoint still running ({CHECKPOINT_FACTOR:g} x the longest of {count} earlier, "
                    f"{longest:.1f} s, is the limit)")
        else:
            limit, what = self.phase_timeout_s, "first checkpoint still running"
        if not self.checkpoint_local:
            # to the network or memory: the kernel's storage counters never see its writes, so "writing nothing"
            # says nothing; its own limit alone judges it
            return waited, limit, what.replace("checkpoint", "checkpoint to the network", 1)
        quiet = now - max(self.last_write_perf, self.checkpoint_since)
        if waited <= limit and quiet > step_threshold:
            return quiet, step_threshold, "checkpoint running but writing nothing to storage"
        return waited, limit, what


def written_bytes() -> int | None:
    """Bytes this process caused to be written to storage (page cache included), or None where the kernel does
    not say (no task I/O accounting: no /proc/self/io)."""
    try:
        return procfs.read_proc_io("/proc", "self")[1]
    except (OSError, ValueError):
        return None
