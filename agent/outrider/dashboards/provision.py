"""`outrider dashboards export DIR` (JSON and a Grafana file-provisioning provider) and `outrider dashboards push`
(the folder and the dashboards through Grafana's HTTP API with grafana-client, idempotently)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from outrider.dashboards import render_all

FOLDER_UID = "outrider"
FOLDER_TITLE = "Outrider"


class PushError(RuntimeError):
    """A push that cannot proceed; the message says what to fix."""


def export(directory: Path, provider_path: str | None = None, docs_url: str | None = None) -> list[Path]:
    """Write every dashboard and a provider file pointing Grafana's file provisioning at them. `docs_url`: the
    documentation base URL of their runbook links (default: outrider.ground.links.docs_url())."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_all(docs_url).items():
        (directory / name).write_text(text)
        written.append(directory / name)
    provider = {"apiVersion": 1, "providers": [{
        "name": "outrider", "orgId": 1, "folder": FOLDER_TITLE, "folderUid": FOLDER_UID, "type": "file",
        "disableDeletion": False, "allowUiUpdates": False, "updateIntervalSeconds": 60,
        "options": {"path": provider_path or str(directory.resolve()), "foldersFromFilesStructure": False}}]}
    (directory / "outrider-dashboards-provider.yaml").write_text(yaml.safe_dump(provider, sort_keys=False))
    written.append(directory / "outrider-dashboards-provider.yaml")
    return written


def read_token(token_file: str | None) -> str:
    if token_file:
        try:
            return Path(token_file).read_text().strip()
        except OSError as e:
            raise PushError(f"cannot read the token file {token_file}: {e.strerror}") from None
    token = os.environ.get("GRAFANA_TOKEN", "").strip()
    if not token:
        raise PushError("no Grafana token: set GRAFANA_TOKEN or pass --token-file (a service account token)")
    return token


def push(url: str, token: str, datasource_uid: str | None = None, timeout_s: float = 10.0,
         docs_url: str | None = None) -> list[str]:
    """Create the folder if needed and upsert every dashboard into it. Returns the dashboards' URLs."""
    from grafana_client.api import GrafanaApi
    from grafana_client.client import GrafanaClientError, GrafanaException, GrafanaUnauthorizedError

    api = GrafanaApi.from_url(url, credential=token, timeout=timeout_s)
    try:
        api.health.check()
        datasources = api.datasource.list_datasources()
        prometheus = [d for d in datasources if d.get("type") == "prometheus"]
        if datasource_uid and not any(d.get("uid") == datasource_uid for d in prometheus):
            raise PushError(f"Grafana at {url} has no Prometheus datasource with uid {datasource_uid!r}; "
                            f"it has: {', '.join(d.get('uid', '?') for d in prometheus) or 'none'}")
        if not prometheus:
            raise PushError(f"Grafana at {url} has no Prometheus datasource: add one (the dashboards query "
                            "Prometheus through their datasource variable)")
        try:
            api.folder.get_folder(FOLDER_UID)
        except GrafanaClientError as e:
            if e.status_code != 404:
                raise
            api.folder.create_folder(FOLDER_TITLE, uid=FOLDER_UID)
        urls = []
        for name, text in render_all(docs_url).items():
            dashboard: dict[str, Any] = json.loads(text)
            dashboard.pop("id", None)
            if datasource_uid:
                _select_datasource(dashboard, datasource_uid)
            result = api.dashboard.update_dashboard({"dashboard": dashboard, "folderUid": FOLDER_UID,
                                                     "overwrite": True, "message": f"outrider: {name}"})
            urls.append(str(result.get("url") or dashboard["uid"]))
        return urls
    except GrafanaUnauthorizedError:
        raise PushError(f"Grafana at {url} rejected the token (401): check GRAFANA_TOKEN or --token-file; the "
                        "service account needs the Editor role") from None
    except GrafanaException as e:
        raise PushError(f"Grafana at {url} answered {e.status_code}: {e.message}") from None
    except PushError:
        raise
    except Exception as e:  # connection refused, DNS, TLS, timeout
        raise PushError(f"cannot reach Grafana at {url}: {type(e).__name__}: {e}") from None


def _select_datasource(dashboard: dict[str, Any], uid: str) -> None:
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") == "datasource":
            v["current"] = {"selected": True, "text": uid, "value": uid}
