"""Where a training loop's wall time goes, one iteration at a time: data wait, step work, other; and how much of
the step was spent blocked in collectives.

An **iteration** runs from one step's end to the next step's end (E[k-1] to E[k]); its wall time W is split,
exactly, into three parts:

- **data_wait** (D): time inside a DataLoader iterator's `__next__` (or the `outrider.dataloader()` wrapper) that
  started within the iteration;
- **step** (S): the step's own work. With explicit timing (`outrider.step()`, `step_begin()`), from the step's
  begin B[k] to its end, less any data wait inside it. Without it, from the iteration's first request for data to
  the step's end, less the data wait (the forward, backward and optimizer after the batch arrives); an iteration
  with no data request at all (data already in memory) is all step;
- **checkpoint** (C): time inside a recognised save on the loop's thread (torch.save, torch.distributed.checkpoint,
  safetensors: hook/torch_checkpoint.py), taken out of `other` (where a save between steps falls), and out of the
  step for a save inside it;
- **other** (O = W - D - S - C): the rest of the loop: from the previous step's end to the first data request (or
  the explicit begin): logging, evaluation, undeclared checkpoints through other libraries, the LR scheduler.

Collectives (torch.distributed) are part of the step. Their **wait** in an iteration is the time the step could
not go on because of them, within the step's span (its begin, or first data request, to its end): the whole of
every blocking call (`dist.all_reduce(t)`), plus, for collectives that
overlap the backward pass (DDP's gradient buckets), the time from the last bucket's launch to the last bucket's
completion (the backward had ended; nothing else could run). Compute per step = S - collective wait: under
synchronous data parallelism every rank's step time is the same, and the slow rank is the one that waits least.

Runs on the hook's publisher thread, from intervals the hot path stores in rings (perf_counter seconds); nothing
here is on the hot path. The first step after start (or after durations were lost to a ring overrun) opens the
accounting: it has no previous end. Intervals that cannot yet be placed (their step has not ended) wait here,
at most MAX_PENDING of them.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_PENDING = 4096


@dataclass(frozen=True)
class Iteration:
    wall: float
    data_wait: float
    step: float
    other: float
    collective_wait: float
    checkpoint: float = 0.0


class LoopAccount:
    def __init__(self) -> None:
        self.last_end = 0.0  # end of the last accounted step; 0: none (the next step opens the accounting)
        self.waits: list[tuple[float, float]] = []  # data waits not yet placed
        self.blocking: list[tuple[float, float]] = []  # blocking collectives not yet placed
        self.overlapped: list[tuple[float, float]] = []  # overlapped collectives (DDP buckets) not yet placed
        self.saves: list[tuple[float, float]] = []  # recognised checkpoints not yet placed
        self.lost = 0  # intervals dropped because too many waited to be placed

    def add_wait(self, begin: float, end: float) -> None:
        self._keep(self.waits, begin, end)

    def add_collective(self, begin: float, end: float, blocking: bool) -> None:
        self._keep(self.blocking if blocking else self.overlapped, begin, end)

    def add_checkpoint(self, begin: float, end: float) -> None:
        self._keep(self.saves, begin, end)

    def _keep(self, into: list[tuple[float, float]], begin: float, end: float) -> None:
        if len(into) >= MAX_PENDING:
            del into[: MAX_PENDING // 2]  # no step for a long while (a loader iterated outside training)
            self.lost += MAX_PENDING // 2
        into.append((begin, end))

    def restart(self) -> None:
        """Durations were lost (the step ring lapped): the next step opens the accounting again."""
        self.last_end = 0.0

    def step(self, begin: float, end: float) -> Iteration | None:
        """Account the step that ended at `end` (begun at `begin`, 0 when not timed explicitly); None for the
        step that opens the accounting."""
        prev, self.last_end = self.last_end, end
        waits = _take(self.waits, end)
        blocking = _take(self.blocking, end)
        overlapped = _take(self.overlapped, end)
        saves = _take(self.saves, end)
        if not prev or end <= prev:
            return None
        wall = end - prev
        clipped = [(max(b, prev), min(e, end)) for b, e in waits if e > prev]
        clipped = [(b, e) for b, e in clipped if e > b]
        data_wait = sum(e - b for b, e in clipped)
        if begin > prev:
            start = begin
            inside = sum(min(e, end) - max(b, begin) for b, e in clipped if e > begin)
            step = end - begin - inside
        elif clipped:
            start = min(b for b, _ in clipped)
            step = end - start - data_wait
        else:
            start = prev
            step = wall - data_wait
        step = min(max(step, 0.0), wall - data_wait)
        other = max(wall - data_wait - step, 0.0)
        saved = sum(min(e, end) - max(b, prev) for b, e in saves if e > prev)
        checkpoint = min(max(saved, 0.0), other + step)
        from_other = min(checkpoint, other)  # a save between steps; what is left was inside the step
        other -= from_other
        step -= checkpoint - from_other
        # collectives count as a wait only inside the step's span: one in `other` (a metrics all_reduce after the
        # step) is not the step's
        wait = sum(min(e, end) - max(b, start) for b, e in blocking if e > start and b < end)
        late = [(b, e) for b, e in overlapped if e > start]
        if late:
            wait += max(0.0, max(e for _, e in late) - max(max(b for b, _ in late), start))
        return Iteration(wall, data_wait, step, other, min(max(wait, 0.0), step), checkpoint)


def _take(items: list[tuple[float, float]], until: float) -> list[tuple[float, float]]:
    """Remove and return the intervals that began before `until` (the rest belong to later iterations)."""
    if not items:
        return []
    taken = [iv for iv in items if iv[0] < until]
    if len(taken) == len(items):
        items.clear()
    else:
        items[:] = [iv for iv in items if iv[0] >= until]
    return taken
