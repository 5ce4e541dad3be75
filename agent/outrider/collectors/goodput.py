"""Goodput: where a training job's wall time went, across its processes' restarts, by cause (the hook collector's).

Each rank of each training job (`training_job`, `rank`: the hook's labels) is accounted on its own, from what the
hook collector sees of its processes sweep by sweep:

- **startup**: a process's start to the end of its first step (the hook's time to first step), for a process that
  did not replace one that died;
- **productive**, **data_wait**, **checkpoint**, **other**: the training loop's own split of its wall time, from one
  step's end to the next (`outrider_train_loop_seconds_total`, hook/loop.py): the step's work is the productive
  part, the rest is the loop's badput;
- **stall**: a process that was stalled (no step within its threshold: hook/progress.py) when it died, from its last
  step's end to its death: a hang. A stall that ends in a step is where the loop's split puts it (a 5-minute data
  wait is data wait);
- **restart**: from the death of a process that stepped (its last step's end, or its death when it died stalled) to
  the end of the first step of the next process of the same rank: the interrupted iteration, the dead time, the
  new process's start-up and its first step.

A death is what the hook collector calls one: a closed shard, or a process gone (pid and start) whose heartbeat
stopped; its time is the shard's last heartbeat (the hook writes one every flush interval, and one at a clean
exit). A rank whose stepping process dies while another of its processes steps (several processes of one rank:
rank "" of separate scripts) is not restarting: only a stall is accounted then. The time from a rank's last step to
the end of a job that is not restarted is nobody's: the job had ended.

The counters (`outrider_train_goodput_seconds_total{cause}`) only ever hold what is settled; the ratio
(`outrider_train_goodput_ratio`) also counts what is running now: a rank stalled now (its time since its last
step), a rank restarting now (since the death), a rank starting (since its process started).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from outrider.metrics.family import Family

CAUSES = ("productive", "data_wait", "checkpoint", "other", "stall", "restart", "startup")
LOOP_PARTS = {"step": "productive", "data_wait": "data_wait", "checkpoint": "checkpoint", "other": "other"}
MAX_RANKS = 10_000
Rank = tuple[str, str]  # (training_job, rank)
ProcessKey = tuple[int, int]  # (pid, start_ns)


@dataclass(frozen=True)
class Seen:
    """One process of a rank as a sweep saw it (the hook collector makes these from the shards)."""

    key: ProcessKey
    job: str
    rank: str
    exited: bool  # this sweep found it finished (closed, or gone)
    stalled: bool  # stalled or unresponsive now (or, when exited, at its end)
    steps: int
    start_s: float  # when it started (the hook's instrument(); its first step then says better)
    heartbeat_s: float  # its last shard update (for an exited one: its death)
    last_step_s: float  # unix time of its last step's end (0: none)
    first_step_s: float | None  # unix time its first step ended (None: not yet, or not said)
    to_first_step_s: float | None  # process start to that end (the hook's time to first step)
    helper: bool = False  # a helper of the rank (a spawned worker): never the rank's steps


@dataclass
class _Stepping:
    last_step_s: float
    stalled: bool


@dataclass
class _RankAccount:
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    loop: dict[str, float] = field(default_factory=dict)  # part -> the loop total last seen
    stepping: dict[ProcessKey, _Stepping] = field(default_factory=dict)
    counted_first: set[ProcessKey] = field(default_factory=set)  # whose first step is accounted
    down_since: float | None = None  # a restart's start (a stepping process died, none steps): unix time
    starting_since: float | None = None  # a live process that has not stepped yet, none before it: unix time
    restarts: int = 0
    live: bool = False  # a process of the rank lives


class GoodputAccount:
    def __init__(self) -> None:
        self.ranks: dict[Rank, _RankAccount] = {}

    def observe(self, seen: list[Seen], loop: dict[Rank, dict[str, float]]) -> None:
        """One sweep: every process of every rank it saw (live, and those it found finished), and the loop's
        totals per rank and part (merged: the finished processes' included)."""
        by_rank: dict[Rank, list[Seen]] = {}
        for s in seen:
            if not s.helper:
                by_rank.setdefault((s.job, s.rank), []).append(s)
        for rank in set(by_rank) | set(loop):
            account = self.ranks.get(rank)
            if account is None:
                if len(self.ranks) >= MAX_RANKS:
                    continue
                account = self.ranks[rank] = _RankAccount()
            procs = sorted(by_rank.get(rank, []), key=lambda p: p.start_s)
            for p in procs:  # in the order they started: a death before the first step of its replacement
                if p.steps:
                    self._stepped(account, p)
                if p.exited:
                    self._died(account, p)
            self._loop(account, loop.get(rank, {}))
            account.live = any(not p.exited for p in procs)
            if not account.stepping and account.down_since is None and account.live:
                starts = [p.start_s for p in procs if not p.exited and not p.steps]
                account.starting_since = min(starts) if starts else None
            else:
                account.starting_since = None

    @staticmethod
    def _stepped(account: _RankAccount, p: Seen) -> None:
        """A process that stepped; its first step, the first time a sweep sees it, ends a start-up or a restart."""
        if p.key not in account.counted_first:
            if len(account.counted_first) >= 64:  # only the live ones matter: the others never come back
                account.counted_first = {k for k in account.counted_first if k in account.stepping}
            account.counted_first.add(p.key)
            if account.down_since is not None:
                if p.first_step_s is not None:
                    account.seconds["restart"] += max(0.0, p.first_step_s - account.down_since)
                    account.restarts += 1
            elif p.to_first_step_s is not None:
                account.seconds["startup"] += max(0.0, p.to_first_step_s)
            account.down_since = None
        if not p.exited:
            account.stepping[p.key] = _Stepping(p.last_step_s, p.stalled)

    @staticmethod
    def _died(account: _RankAccount, p: Seen) -> None:
        was = account.stepping.pop(p.key, None)
        if not p.steps:
            return  # it never stepped: a start-up or restart goes on
        last = p.last_step_s or (was.last_step_s if was is not None else 0.0)
        stalled = p.stalled or (was is not None and was.stalled)
        death = max(p.heartbeat_s, last)
        if stalled and last:
            account.seconds["stall"] += death - last
        if account.stepping:
            return  # another process of the rank steps on: the rank is not down
        account.down_since = death if stalled or not last else last

    @staticmethod
    def _loop(account: _RankAccount, totals: dict[str, float]) -> None:
        for part, total in totals.items():
            cause = LOOP_PARTS.get(part)
            if cause is None:
                continue
            before = account.loop.get(part)
            account.loop[part] = total
            if before is not None and total > before:
                account.seconds[cause] += total - before
            elif before is None:
                account.seconds[cause] += total  # counts from each process's first step: all of it is the rank's

    def running(self, account: _RankAccount, now_s: float) -> dict[str, float]:
        """What is not settled yet, by cause: a stall, restart or start-up going on now."""
        out: dict[str, float] = {}
        stalled = [s.last_step_s for s in account.stepping.values() if s.stalled and s.last_step_s]
        if stalled:
            out["stall"] = max(0.0, now_s - min(stalled))
        if account.down_since is not None and account.live:
            out["restart"] = max(0.0, now_s - account.down_since)
        if account.starting_since is not None:
            out["startup"] = max(0.0, now_s - account.starting_since)
        return out

    def families(self, now_s: float) -> list[Family]:
        seconds = Family("outrider_train_goodput_seconds_total")
        ratio = Family("outrider_train_goodput_ratio")
        restarts = Family("outrider_train_restarts_total")
        for (job, rank), account in sorted(self.ranks.items()):
            for cause in CAUSES:
                seconds.add(account.seconds[cause], rank, job, cause)
            total = sum(account.seconds.values()) + sum(self.running(account, now_s).values())
            if total > 0:
                ratio.add(account.seconds["productive"] / total, rank, job)
            restarts.add(account.restarts, rank, job)
        return [seconds, ratio, restarts]
