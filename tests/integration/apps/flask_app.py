"""A Flask service instrumented with Outrider's WSGI middleware, as a user writes it, served by a real WSGI server
(werkzeug's, threaded) on the port given as the first argument until SIGTERM."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator

from flask import Flask, Response
from werkzeug.serving import make_server

from outrider import OutriderWSGIMiddleware

app = Flask(__name__)
app.wsgi_app = OutriderWSGIMiddleware(app.wsgi_app)  # type: ignore[method-assign]


@app.get("/predict/<model>")
def predict(model: str) -> dict[str, str]:
    return {"model": model}


@app.post("/generate")
def generate() -> Response:
    def tokens() -> Iterator[bytes]:
        for token in (b"a", b"b", b"c"):
            time.sleep(0.01)
            yield token
    return Response(tokens(), mimetype="text/plain")


if __name__ == "__main__":
    server = make_server("127.0.0.1", int(sys.argv[1]), app, threaded=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # exits serve_forever; the hook flushes at exit
    server.serve_forever()
