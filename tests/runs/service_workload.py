"""A service and the client that drives it, each timing itself, for the rate tests of a real run
(tests/runs/test_run_service_rates.py).

`service_workload.py serve PORT DIR`: a Flask service instrumented with Outrider's WSGI middleware, as a user
writes it, served by werkzeug (threaded, keep-alive) on PORT; it starts the client and, once the client has ended,
rests (serving nothing) until DIR/release exists, then exits.

`service_workload.py client PORT DIR RATE`: a client that imports nothing of Outrider, paced at RATE requests a
second on its own monotonic clock over one keep-alive connection, until DIR/stop exists; it writes DIR/client.json:
how many requests it completed, between which moments (its monotonic clock and the wall clock), when each one
completed (the wall clock, which the hook's heartbeats read too), and how late it ever fell behind its pace (it
catches up: a window after a lag holds more than its pace).
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import subprocess
import sys
import threading
import time


def client(port: int, directory: str, rate: float) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    stop = os.path.join(directory, "stop")
    count, latest, done = 0, 0.0, []
    started_wall, started = time.time(), time.monotonic()
    while not os.path.exists(stop):
        due = started + count / rate
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        latest = max(latest, time.monotonic() - due)
        conn.request("GET", "/predict/m")
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise SystemExit(f"the service answered {resp.status}")
        done.append(time.time())
        count += 1
    ended, ended_wall = time.monotonic(), time.time()
    conn.close()
    with open(os.path.join(directory, "client.json.tmp"), "w", encoding="utf-8") as fh:
        json.dump({"count": count, "seconds": ended - started, "started": started_wall, "ended": ended_wall,
                   "latest_s": latest, "completed": done}, fh)
    os.rename(os.path.join(directory, "client.json.tmp"), os.path.join(directory, "client.json"))


def serve(port: int, directory: str, rate: float) -> None:
    from flask import Flask
    from werkzeug.serving import WSGIRequestHandler, make_server

    from outrider import OutriderWSGIMiddleware

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request is not what is measured
    app = Flask(__name__)
    app.wsgi_app = OutriderWSGIMiddleware(app.wsgi_app)  # type: ignore[method-assign]

    @app.get("/predict/<model>")
    def predict(model: str) -> dict[str, str]:
        return {"model": model}

    class KeepAlive(WSGIRequestHandler):
        protocol_version = "HTTP/1.1"

    server = make_server("127.0.0.1", port, app, threaded=True, request_handler=KeepAlive)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    driver = subprocess.run([sys.executable, __file__, "client", str(port), directory, str(rate)], env=env,
                            check=False)
    if driver.returncode:
        raise SystemExit(f"the client failed ({driver.returncode})")
    while not os.path.exists(os.path.join(directory, "release")):
        time.sleep(0.2)
    server.shutdown()


if __name__ == "__main__":
    mode, port_arg, where = sys.argv[1:4]
    pace = float(sys.argv[4]) if len(sys.argv) > 4 else 100.0
    (client if mode == "client" else serve)(int(port_arg), where, pace)
