"""A watched process's command line as a label value: by default the program and its script only; the arguments
when asked, secrets redacted; the whole line when asked for that.

`outrider_process_info{command}` reaches /metrics and OTLP, and a node agent may serve them to every pod on the node.
Secrets come in more forms than any list of rules foresees, so by default (`program_label`) the label says what
runs and nothing of what it was given: the executable, for an interpreter its script or `-m module` (`-c` without
its code), and the first argument that names a script (`torchrun ... train.py`). With
`process_command_arguments` the arguments follow (`redact`), with the values that look like credentials replaced:

- an option or variable whose name looks secret: `--db-password=x`, `--api-key x`, `--db-pass x`, `--pwd x`,
  `-token=x`, `AWS_SECRET_ACCESS_KEY=x` (a name split on `-`, `_`, `.` and camelCase: `AccountKey`, `authToken`);
- a password glued to `-p` (`mysql -pX`);
- the userinfo of a URL: `user:PASSWORD@` (the user kept) and `TOKEN@` (all of it), as git and pip take tokens;
- an HTTP header given as an argument (`-H "Authorization: Bearer X"`, `X-Api-Key: X`), and any `Bearer X`;
- a secret-named key inside an argument: in JSON (`{"AWS_SECRET_ACCESS_KEY": "X"}`), in a query string (a signed
  URL's `sig=X`, `X-Amz-Signature=X`, `access_token=X`), in a connection string (`AccountKey=X;`, `password=X`).

`process_full_command` exports the whole line unredacted (an explicit opt-in).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence

REDACTED = "<redacted>"
# Words in an option, variable or key name that mark its value as a secret. Matched as a whole part of the name split
# on -, _, . and camelCase ("--api-key", "DB_PASSWORD", "AccountKey"), and the longer ones also as a suffix
# ("dbpassword"); a short word only as a whole part, so "keyboard", "monkey_patch", "max_new_tokens" or "bypass" do
# not count.
SECRET_WORDS = ("password", "passwd", "pass", "pwd", "pw", "token", "secret", "key", "auth", "authorization",
                "credential", "credentials", "apikey", "passphrase", "cookie", "bearer", "sig", "signature", "jwt")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_PARTS = re.compile(r"[-_.\s]+")
_OPTION = re.compile(r"^(-{1,2}[A-Za-z0-9][A-Za-z0-9_.-]*)(=)(.*)$", re.DOTALL)
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*)(=)(.*)$", re.DOTALL)
_BARE_OPTION = re.compile(r"^-{1,2}[A-Za-z0-9][A-Za-z0-9_.-]*$")
_GLUED_PASSWORD = re.compile(r"^-p(?=.)", re.DOTALL)  # mysql -pSECRET (a value glued to -p)
_HEADER = re.compile(r"^([A-Za-z][A-Za-z0-9-]*)[ \t]*:[ \t]*(?=\S)", re.DOTALL)
_SCHEME_TOKEN = re.compile(r"\b(Bearer|bearer|BEARER|Basic|Token|Digest)([ \t]+)[^\s\"',;&}]+")
_KEY_RUN = re.compile(r"[A-Za-z0-9_.-]+")  # a key's characters: every run is found once (finditer), so linear
_VALUE_ENDS = frozenset(" \t\n\r\"',;&{}")  # where a bare value inside an argument ends
# Script files: a program's first argument with one of these suffixes says what it runs (torchrun ... train.py)
SCRIPT_SUFFIXES = (".py", ".pyz", ".sh", ".bash", ".js", ".mjs", ".cjs", ".ts", ".rb", ".pl", ".php", ".lua",
                   ".jl", ".r", ".jar", ".ipynb")
_PYTHON = re.compile(r"^(python|pypy)[0-9.]*[a-z]?$")


@functools.lru_cache(maxsize=4096)  # an argument may hold the same key many times (a query string, JSON)
def secret_name(name: str) -> bool:
    """Whether an option, variable or key name says its value is a secret ("--db-password", "API_KEY", "authToken",
    "AccountKey", "sig")."""
    parts = [p for p in _PARTS.split(_CAMEL.sub("_", name.lstrip("-")).lower()) if p]
    if any(p in SECRET_WORDS for p in parts):
        return True
    # run-together names: a secret word at the end of a part ("dbpassword", "xauthtoken", "apikey").
    return any(p.endswith(w) for p in parts for w in SECRET_WORDS if len(w) >= 5)


def _redact_url(arg: str) -> str:
    """Each URL's userinfo: `user:PASSWORD@` keeps the user, `TOKEN@` goes whole. Scanned by hand, in one pass
    (an argument can be long, and a backtracking pattern over it is not linear)."""
    out: list[str] = []
    pos = search = 0
    while (i := arg.find("://", search)) >= 0:
        start = end = i + 3
        while end < len(arg) and arg[end] not in "/?#" and not arg[end].isspace():
            end += 1
        at = arg.rfind("@", start, end)  # the last @: a password written with a raw @ goes whole
        if at > start:
            colon = arg.find(":", start, at)
            out += [arg[pos:start], f"{arg[start:colon]}:{REDACTED}" if colon >= 0 else REDACTED]
            pos = at
        search = max(end, start)
    out.append(arg[pos:])
    return "".join(out)


def _redact_embedded(arg: str) -> str:
    """Secret-named keys' values inside an argument (JSON, a query string, a connection string), bearer tokens and
    URL userinfo."""
    arg = _redact_url(arg)
    arg = _SCHEME_TOKEN.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", arg)
    if "=" not in arg and ":" not in arg:
        return arg
    out: list[str] = []
    pos = 0
    for m in _KEY_RUN.finditer(arg):
        if m.start() < pos:
            continue  # inside a value already redacted
        j = m.end()
        if j < len(arg) and arg[j] in "\"'":
            j += 1  # "KEY" or 'KEY' (or KEY" cut from its opening quote: a secret name either way)
        while j < len(arg) and arg[j] in " \t":
            j += 1
        if j >= len(arg) or arg[j] not in "=:" or not secret_name(m.group()):
            continue
        j += 1
        while j < len(arg) and arg[j] in " \t":
            j += 1
        if j < len(arg) and arg[j] in "\"'":  # a quoted value: to its closing quote (or the end)
            end = arg.find(arg[j], j + 1)
            out += [arg[pos:j + 1], REDACTED]
            pos = len(arg) if end < 0 else end
            continue
        end = j
        while end < len(arg) and arg[end] not in _VALUE_ENDS:
            end += 1
        if end > j:
            out += [arg[pos:j], REDACTED]
            pos = end
    out.append(arg[pos:])
    return "".join(out)


def _redact_word(arg: str) -> tuple[str, bool]:
    """One argument redacted, and whether the next one is a secret (it follows a secret-named flag)."""
    option = _OPTION.match(arg)
    if option and secret_name(option.group(1)):
        return f"{option.group(1)}={REDACTED}", False
    assignment = _ASSIGNMENT.match(arg)
    if assignment and not option and secret_name(assignment.group(1)):
        return f"{assignment.group(1)}={REDACTED}", False
    if _GLUED_PASSWORD.match(arg) and not option:
        return f"-p{REDACTED}", False
    header = _HEADER.match(arg)
    if header and not option and secret_name(header.group(1)):
        return f"{header.group(0)}{REDACTED}", False
    if _BARE_OPTION.match(arg):
        return arg, secret_name(arg)
    return _redact_embedded(arg), False


def redact(argv: Sequence[str]) -> list[str]:
    """argv with every value that looks like a credential replaced by REDACTED (the module's docstring lists the
    forms); the executable is kept but for a URL's userinfo."""
    out: list[str] = []
    redact_next = False
    for i, arg in enumerate(argv):
        if redact_next:
            redact_next = False
            if not arg.startswith("-"):  # `--token VALUE`; a following option means the flag took no value
                out.append(REDACTED)
                continue
        if i == 0:  # the executable itself: kept, even if its path looks odd
            out.append(_redact_embedded(arg))
            continue
        word, redact_next = _redact_word(arg)
        out.append(word)
    return out


def _is_script(arg: str) -> bool:
    return not arg.startswith("-") and "=" not in arg and arg.lower().endswith(SCRIPT_SUFFIXES)


def _python_target(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """What a Python interpreter's arguments run: (`-m MODULE`, `-c` without its code, or the script; the arguments
    after it). Its own options are skipped, with the values that -W, -X and --check-hash-based-pycs take."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-" or not arg.startswith("-"):
            return ([_redact_url(arg)] if arg != "-" else []), list(args[i + 1:])
        if arg.startswith("--"):
            i += 2 if arg == "--check-hash-based-pycs" else 1
            continue
        cluster = arg[1:]  # -uBc CODE, -mmodule, -Wignore
        for k, flag in enumerate(cluster):
            if flag not in "cmWX":
                continue
            glued = cluster[k + 1:]
            if flag == "c":
                return ["-c"], []
            value = glued or (args[i + 1] if i + 1 < len(args) else "")
            after = i + 1 if glued else i + 2
            if flag == "m":
                return ["-m", _redact_url(value)], list(args[after:])
            i = after - 1  # -W, -X: their value skipped
            break
        i += 1
    return [], []


def program(argv: Sequence[str]) -> list[str]:
    """What runs, without what it was given: the executable; for a Python interpreter `-m MODULE`, `-c` (never its
    code) or its script; then the first argument that names a script file, if not shown already."""
    if not argv:
        return []
    # a process that set its title writes it all into argv[0] (`postgres: user db host`): its words are redacted
    out = [" ".join(redact(argv[0].split()))] if any(c.isspace() for c in argv[0]) else [_redact_url(argv[0])]
    rest = list(argv[1:])
    if _PYTHON.match(os.path.basename(argv[0])):
        shown, rest = _python_target(rest)
        out += shown
        if shown[:1] != ["-m"]:
            return out  # the script says what runs (or -c, or an interactive interpreter)
    script = next((a for a in rest if _is_script(a)), None)
    if script is not None:
        out.append(_redact_url(script))
    return out


def command_label(argv: Sequence[str], max_chars: int, *, arguments: bool = False, full: bool = False) -> str:
    """The command line as one label value of at most max_chars characters: the whole of it with `full`; with
    `arguments` redacted; else the program and its script only."""
    words = list(argv) if full else redact(argv) if arguments else program(argv)
    return " ".join(words)[:max_chars]
