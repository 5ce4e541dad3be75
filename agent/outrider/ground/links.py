"""Where Outrider's documentation lives: the one setting that runbook links and the dashboards' links are built from.

The rule file's `runbook_url` annotations, the dashboards' panel links to runbooks and their link to the metrics
reference all start with `docs_url()`: Outrider's repository by default, or a mirror (an internal wiki, a fork) set
with the `docs_url` configuration key (OUTRIDER_DOCS_URL) or the commands' --docs-url. The lowest floor: it imports
nothing of Outrider, so that config, the dashboards and the rule export can all read it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

DEFAULT_DOCS_URL = "https://github.com/outrider-dev/outrider/blob/main/"
DOCS_URL_ENV = "OUTRIDER_DOCS_URL"
RUNBOOKS = "alerts/runbooks/"


def docs_url(override: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The documentation base URL, ending in "/": the override, else $OUTRIDER_DOCS_URL, else the repository."""
    env = os.environ if env is None else env
    base = (override or env.get(DOCS_URL_ENV, "") or DEFAULT_DOCS_URL).strip()
    if not base.startswith(("https://", "http://")):
        raise ValueError(f"documentation URL {base!r}: expected an http(s) URL")
    return base if base.endswith("/") else base + "/"


def runbook_url(file: str, anchor: str, base: str | None = None) -> str:
    """The runbook of an alert: alerts/runbooks/FILE#ANCHOR under the documentation base."""
    return f"{docs_url(base)}{RUNBOOKS}{file}#{anchor}"


def rebase(url: str, base: str | None = None) -> str:
    """A URL written against the default base (the rule file's runbook_url annotations), under the chosen one."""
    return docs_url(base) + url[len(DEFAULT_DOCS_URL):] if url.startswith(DEFAULT_DOCS_URL) else url
