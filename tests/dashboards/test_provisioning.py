"""`outrider dashboards export` and `push`. No Grafana server can be installed here: push is tested against a local
HTTP server implementing the Grafana API endpoints it uses (GET /api/frontend/settings, /api/health,
/api/datasources, /api/folders/UID; POST /api/folders, /api/dashboards/db), with Grafana's status codes and bodies,
standing in for Grafana."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrider.dashboards import render_all
from outrider.dashboards.provision import PushError, export, push
from tests.helpers import free_port, outrider_cmd


class GrafanaStandIn:
    def __init__(self, token: str = "glsa_good", datasources: list[dict[str, Any]] | None = None) -> None:
        self.token = token
        self.datasources = datasources if datasources is not None else [
            {"uid": "prom-main", "type": "prometheus", "name": "Prometheus"}]
        self.folders: dict[str, dict[str, Any]] = {}
        self.dashboards: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorised(self) -> bool:
                stand_in.requests.append((self.command, self.path))
                if self.headers.get("Authorization") != f"Bearer {stand_in.token}":
                    self._reply(401, {"message": "invalid API key"})
                    return False
                return True

            def do_GET(self) -> None:
                if self.path == "/api/health":
                    stand_in.requests.append((self.command, self.path))
                    return self._reply(200, {"database": "ok", "version": "11.6.0"})
                if self.path == "/api/frontend/settings":  # grafana-client reads the version here first
                    stand_in.requests.append((self.command, self.path))
                    return self._reply(200, {"buildInfo": {"version": "11.6.0", "edition": "Open Source"}})
                if not self._authorised():
                    return None
                if self.path == "/api/datasources":
                    return self._reply(200, stand_in.datasources)
                if self.path.startswith("/api/folders/"):
                    uid = self.path.rsplit("/", 1)[1]
                    if uid in stand_in.folders:
                        return self._reply(200, stand_in.folders[uid])
                    return self._reply(404, {"message": "folder not found", "status": "not-found"})
                return self._reply(404, {"message": "not found"})

            def do_POST(self) -> None:
                if not self._authorised():
                    return None
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if self.path == "/api/folders":
                    if body["uid"] in stand_in.folders:
                        return self._reply(409, {"message": "a folder with the same uid already exists"})
                    stand_in.folders[body["uid"]] = {"uid": body["uid"], "title": body["title"], "id": 1}
                    return self._reply(200, stand_in.folders[body["uid"]])
                if self.path == "/api/dashboards/db":
                    dash = body["dashboard"]
                    if body.get("folderUid") not in stand_in.folders:
                        return self._reply(400, {"message": "folder not found"})
                    if dash["uid"] in stand_in.dashboards and not body.get("overwrite"):
                        return self._reply(412, {"message": "version-mismatch", "status": "version-mismatch"})
                    version = stand_in.dashboards.get(dash["uid"], {}).get("version", 0) + 1
                    stand_in.dashboards[dash["uid"]] = {"dashboard": dash, "folderUid": body["folderUid"],
                                                        "version": version}
                    return self._reply(200, {"status": "success", "uid": dash["uid"], "version": version,
                                             "url": f"/d/{dash['uid']}/x"})
                return self._reply(404, {"message": "not found"})

            def log_message(self, *args: object) -> None:
                pass

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def grafana() -> Any:
    g = GrafanaStandIn()
    yield g
    g.stop()


def test_export_writes_dashboards_and_a_provider(tmp_path: Path) -> None:
    written = export(tmp_path / "out", provider_path="/var/lib/grafana/dashboards/outrider")
    names = {p.name for p in written}
    assert names == set(render_all()) | {"outrider-dashboards-provider.yaml"}
    provider = yaml.safe_load((tmp_path / "out" / "outrider-dashboards-provider.yaml").read_text())
    assert provider["apiVersion"] == 1
    p = provider["providers"][0]
    assert (p["type"], p["folder"]) == ("file", "Outrider")
    assert p["options"]["path"] == "/var/lib/grafana/dashboards/outrider"
    for name, text in render_all().items():
        assert (tmp_path / "out" / name).read_text() == text


def test_push_creates_the_folder_and_upserts_idempotently(grafana: GrafanaStandIn) -> None:
    urls = push(grafana.url, "glsa_good", datasource_uid="prom-main")
    assert len(urls) == len(render_all()) == 6 and set(grafana.folders) == {"outrider"}
    assert {d["folderUid"] for d in grafana.dashboards.values()} == {"outrider"}
    training = grafana.dashboards["outrider-training"]["dashboard"]
    current = next(v for v in training["templating"]["list"] if v["type"] == "datasource")["current"]
    assert current["value"] == "prom-main"
    push(grafana.url, "glsa_good")
    assert len(grafana.folders) == 1, "the folder is reused, not created twice"
    assert {d["version"] for d in grafana.dashboards.values()} == {2}, "overwritten in place"


def test_push_bad_token(grafana: GrafanaStandIn) -> None:
    with pytest.raises(PushError, match="rejected the token"):
        push(grafana.url, "glsa_wrong")
    assert grafana.dashboards == {}


def test_push_missing_datasource() -> None:
    g = GrafanaStandIn(datasources=[{"uid": "loki", "type": "loki"}])
    try:
        with pytest.raises(PushError, match="no Prometheus datasource"):
            push(g.url, "glsa_good")
        g.datasources.append({"uid": "prom-a", "type": "prometheus"})
        with pytest.raises(PushError, match="no Prometheus datasource with uid 'prom-b'; it has: prom-a"):
            push(g.url, "glsa_good", datasource_uid="prom-b")
    finally:
        g.stop()


def test_push_unreachable() -> None:
    with pytest.raises(PushError, match="cannot reach Grafana"):
        push(f"http://127.0.0.1:{free_port()}", "glsa_good", timeout_s=2)


def test_cli_push_reads_the_token_from_the_environment(grafana: GrafanaStandIn, tmp_path: Path) -> None:
    env_ok = subprocess.run(outrider_cmd("dashboards", "push", "--url", grafana.url), capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "GRAFANA_TOKEN": "glsa_good", "HOME": str(tmp_path),
                                 "PYTHONPATH": os.environ.get("PYTHONPATH", "")})  # this checkout's outrider
    assert env_ok.returncode == 0, env_ok.stderr
    assert len(env_ok.stdout.split()) == len(render_all())
    missing = subprocess.run(outrider_cmd("dashboards", "push", "--url", grafana.url), capture_output=True,
                             text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert missing.returncode == 1 and "no Grafana token" in missing.stderr
    token_file = tmp_path / "token"
    token_file.write_text("glsa_wrong\n")
    bad = subprocess.run(outrider_cmd("dashboards", "push", "--url", grafana.url, "--token-file", str(token_file)),
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "rejected the token" in bad.stderr and "glsa_wrong" not in bad.stderr


def test_cli_export_takes_the_documentation_url_of_the_runbook_links(tmp_path: Path) -> None:
    r = subprocess.run([*outrider_cmd("dashboards", "export", str(tmp_path), "--docs-url",
                                      "https://wiki.example.com/outrider")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "outrider-gpu-node.json").read_text()
    assert "https://wiki.example.com/outrider/alerts/runbooks/hardware.md#gpulost" in text
    assert "github.com/outrider-dev" not in text
    bad = subprocess.run([*outrider_cmd("dashboards", "export", str(tmp_path / "x"), "--docs-url", "wiki")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "expected an http(s) URL" in bad.stderr
