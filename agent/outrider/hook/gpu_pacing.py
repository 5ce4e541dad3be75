"""GPU busy per step, from the CUDA event the hook records at each step's end: did the GPU or the host pace it?

The hook records one event at every step end, at host time h[k] (perf_counter), and never waits for it; the
publisher polls which have completed. For two completed consecutive events, elapsed_time gives the GPU-side time
between them, g[k] - g[k-1]. The GPU's **lag** at marker k, lag[k] = g[k] - h[k] (how long after the host ended
step k the GPU finished the work queued until then), is then known up to one constant c per chain of events:

    lag[k] = rel[k] + c,   rel[k] = sum over j <= k of (elapsed[j] - (h[j] - h[j-1]))

and c is bounded below by what is certain: no lag is negative (c >= -rel[k]), and an event still pending when the
publisher polled at host time T had a lag of at least T - h[k] (c >= T - h[k] - rel[k]). The estimate is the
largest such bound: exact as soon as one marker found the GPU idle, or one poll caught the GPU behind.

**GPU busy in step k** = min(W[k], lag[k-1]), W[k] = h[k] - h[k-1]: the part of the step during which the GPU was
certainly still working off what the host had queued before it. A GPU that paces the loop (compute-bound: the host
runs ahead, or waits in a sync for the GPU) is busy for the whole step; a GPU the host cannot keep fed
(host-bound: launches, Python, tiny kernels) finishes each step's work as it arrives, and its busy share is near
zero. What this cannot see: GPU work launched and finished within a step while the host kept up (it is not what
paced the step), and a step whose sync for the GPU happens before its end marker (the lag it leaves is small).

Chains restart after CHAIN_S (the two clocks drift apart by parts per million) and when a marker was lost.
"""

from __future__ import annotations

CHAIN_S = 300.0


class GpuPacing:
    def __init__(self, chain_s: float = CHAIN_S) -> None:
        self.chain_s = chain_s
        self.restart()

    def restart(self) -> None:
        self.chain_start = 0.0
        self.last_h: float | None = None
        self.last_rel = 0.0
        self.c = 0.0

    def marker(self, host_t: float, gpu_interval_s: float | None, pending_age_s: float = 0.0) -> tuple[float, float] \
            | None:
        """A completed step-end marker recorded at host time host_t; gpu_interval_s: the GPU time since the
        previous marker (None: the previous one is unknown, lost); pending_age_s: the longest a poll saw it pending.
        Returns (GPU busy seconds, wall seconds) of the step the marker ends, or None when it opens a chain."""
        if self.last_h is None or gpu_interval_s is None or host_t - self.chain_start > self.chain_s:
            self.chain_start, self.last_h, self.last_rel = host_t, host_t, 0.0
            self.c = max(0.0, pending_age_s)
            return None
        wall = host_t - self.last_h
        rel = self.last_rel + gpu_interval_s - wall
        self.c = max(self.c, -rel, pending_age_s - rel)
        busy = min(wall, max(0.0, self.last_rel + self.c))
        self.last_h, self.last_rel = host_t, rel
        return busy, wall
