"""The in-process side: the stdlib-only hot path (series), the shard format and writer, the publisher,
framework integrations (torch_integration, asgi, wsgi), and the public API (api, re-exported by `outrider`)."""
