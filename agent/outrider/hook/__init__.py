"""The in-process side, standard library only: the hot path (series, registry), the publisher that writes this
process's shard (through outrider.shared.spool, which owns the format), the accounting of the loop, its threads and its
data wait, the loop's profiler, the election of an agent (starting `outrider standalone` when none serves the
spool), framework integrations (torch_*, asgi, wsgi), and the public API (api, re-exported by `outrider`)."""
