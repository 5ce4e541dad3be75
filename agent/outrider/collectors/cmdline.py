"""A watched process's command line as a label value: secrets redacted, the program and script kept.

`outrider_process_info{command}` reaches /metrics and OTLP, and a node agent may serve them to every pod on the node,
so values that look like credentials never leave the agent: the value of an option whose name looks secret
(`--db-password=x`, `--api-key x`, `-token=x`), of an environment-style assignment (`AWS_SECRET_ACCESS_KEY=x`), and
the user:password part of a URL. The executable and the script (the first arguments) are kept: they say what runs.
The whole line, unredacted, is an explicit opt-in (`process_full_command`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

REDACTED = "<redacted>"
# Words in an option or variable name that mark its value as a secret. Matched as a whole part of the name split on
# -, _ and . ("--api-key", "DB_PASSWORD"), and the longer ones also as a suffix ("dbpassword", "authToken"); a short
# word only as a whole part, so "keyboard", "monkey_patch" or "max_new_tokens" do not count.
SECRET_WORDS = ("password", "passwd", "token", "secret", "key", "auth", "credential", "credentials", "apikey",
                "passphrase", "cookie")
_PARTS = re.compile(r"[-_.]+")
_OPTION = re.compile(r"^(-{1,2}[A-Za-z0-9][A-Za-z0-9_.-]*)(=)(.*)$", re.DOTALL)
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*)(=)(.*)$", re.DOTALL)
_URL_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^/@\s:]*):([^/@\s]*)@")
_BARE_OPTION = re.compile(r"^-{1,2}[A-Za-z0-9][A-Za-z0-9_.-]*$")


def secret_name(name: str) -> bool:
    """Whether an option or variable name says its value is a secret ("--db-password", "API_KEY", "authToken")."""
    lowered = name.lstrip("-").lower()
    parts = [p for p in _PARTS.split(lowered) if p]
    if any(p in SECRET_WORDS for p in parts):
        return True
    # camelCase and run-together names: a secret word at the end of a part ("dbpassword", "authtoken", "apikey").
    return any(p.endswith(w) for p in parts for w in SECRET_WORDS if len(w) >= 5)


def _redact_url(arg: str) -> str:
    return _URL_USERINFO.sub(lambda m: f"{m.group(1)}{m.group(2)}:{REDACTED}@", arg)


def redact(argv: Sequence[str]) -> list[str]:
    """argv with the values of secret-looking options, assignments and URL passwords replaced by REDACTED."""
    out: list[str] = []
    redact_next = False
    for i, arg in enumerate(argv):
        if redact_next:
            redact_next = False
            if not arg.startswith("-"):  # `--token VALUE`; a following option means the flag took no value
                out.append(REDACTED)
                continue
        if i == 0:  # the executable itself: kept, even if its path looks odd
            out.append(_redact_url(arg))
            continue
        option = _OPTION.match(arg)
        if option and secret_name(option.group(1)):
            out.append(f"{option.group(1)}={REDACTED}")
            continue
        assignment = _ASSIGNMENT.match(arg)
        if assignment and not option and secret_name(assignment.group(1)):
            out.append(f"{assignment.group(1)}={REDACTED}")
            continue
        if _BARE_OPTION.match(arg) and secret_name(arg):
            redact_next = True
        out.append(_redact_url(arg))
    return out


def command_label(argv: Sequence[str], max_chars: int, full: bool = False) -> str:
    """The command line as one label value of at most max_chars characters, redacted unless `full`."""
    words = list(argv) if full else redact(argv)
    return " ".join(words)[:max_chars]
