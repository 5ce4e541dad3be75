"""Secrets on watched command lines never reach outrider_process_info{command}, on /metrics or OTLP: by default the
label is the program and its script only; with process_command_arguments the arguments follow, every form of
secret people write redacted; only process_full_command shows them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from outrider.collectors.base import CollectorContext
from outrider.collectors.cmdline import REDACTED, command_label, program, redact, secret_name
from outrider.collectors.process import ProcessCollector
from outrider.collectors.process_identity import MAX_COMMAND
from outrider.ground.config import Config
from outrider.wiring.sampler import SweepStats
from tests.helpers import AgentProcess, reap, samples, wait_until
from tests.servers import OtlpHttpReceiver, attributes, otlp_points


@pytest.mark.parametrize(("argv", "expected"), [
    # --x=VALUE
    (["python", "train.py", "--db-password=hunter2"], ["python", "train.py", f"--db-password={REDACTED}"]),
    (["python", "serve.py", "--authToken=abc"], ["python", "serve.py", f"--authToken={REDACTED}"]),
    (["app", "-token=abc"], ["app", f"-token={REDACTED}"]),
    # --x VALUE
    (["python", "serve.py", "--api-key", "sk-live-123", "--port", "80"],
     ["python", "serve.py", "--api-key", REDACTED, "--port", "80"]),
    # a secret-named flag followed by another option took no value: nothing to hide, the option is kept
    (["app", "--token", "--verbose"], ["app", "--token", "--verbose"]),
    # X=VALUE
    (["env", "AWS_SECRET_ACCESS_KEY=abc", "python", "x.py"], ["env", f"AWS_SECRET_ACCESS_KEY={REDACTED}", "python",
                                                              "x.py"]),
    (["env", "DB_PASSWD=abc"], ["env", f"DB_PASSWD={REDACTED}"]),
    # URLs with user:pass@
    (["python", "etl.py", "--db", "postgres://svc:s3cret@db:5432/x"],
     ["python", "etl.py", "--db", f"postgres://svc:{REDACTED}@db:5432/x"]),
    (["python", "etl.py", "--dsn=redis://:pw@cache/0"], ["python", "etl.py", f"--dsn=redis://:{REDACTED}@cache/0"]),
    # names that merely contain a short secret word are kept
    (["python", "gen.py", "--max-new-tokens", "64", "--monkey=1", "--keyboard=us", "LR=0.1", "--passes", "3",
      "--bypass", "x", "-p", "8", "time: 5", "http://h:80/x"],
     ["python", "gen.py", "--max-new-tokens", "64", "--monkey=1", "--keyboard=us", "LR=0.1", "--passes", "3",
      "--bypass", "x", "-p", "8", "time: 5", "http://h:80/x"]),
    # the forms of issue #39, as people write them
    (["git", "clone", "https://ghp_t0ken@github.com/org/repo.git"],
     ["git", "clone", f"https://{REDACTED}@github.com/org/repo.git"]),
    (["app", "--db-pass", "X1", "--pwd", "X2", "--pw", "X3"],
     ["app", "--db-pass", REDACTED, "--pwd", REDACTED, "--pw", REDACTED]),
    (["mysql", "-u", "root", "-pX4"], ["mysql", "-u", "root", f"-p{REDACTED}"]),
    (["curl", "-H", "Authorization: Bearer X5", "-H", "X-Api-Key: X6", "--header=Authorization: Bearer X7"],
     ["curl", "-H", f"Authorization: {REDACTED}", "-H", f"X-Api-Key: {REDACTED}",
      f"--header=Authorization: {REDACTED} {REDACTED}"]),
    (["app", "--config", '{"AWS_SECRET_ACCESS_KEY": "X8", "region": "eu"}', "{'password': 'X9'}"],
     ["app", "--config", f'{{"AWS_SECRET_ACCESS_KEY": "{REDACTED}", "region": "eu"}}',
      f"{{'password': '{REDACTED}'}}"]),
    (["wget", "https://a.blob.core.windows.net/c/f?sv=2022&sig=X10%3D&se=2030"],
     ["wget", f"https://a.blob.core.windows.net/c/f?sv=2022&sig={REDACTED}&se=2030"]),
    (["aws", "https://b.s3.amazonaws.com/k?X-Amz-Credential=X11&X-Amz-Signature=X12&access_token=X13"],
     ["aws", f"https://b.s3.amazonaws.com/k?X-Amz-Credential={REDACTED}&X-Amz-Signature={REDACTED}"
             f"&access_token={REDACTED}"]),
    (["app", "--conn", "Protocol=https;AccountName=a;AccountKey=X14==;Suffix=core", "host=db password=X15 port=5"],
     ["app", "--conn", f"Protocol=https;AccountName=a;AccountKey={REDACTED};Suffix=core",
      f"host=db password={REDACTED} port=5"]),
    # a password with a raw @ goes whole; a user alone (ssh://git@) is userinfo too
    (["app", "postgres://u:p@ss@h/db", "ssh://git@github.com/x"],
     ["app", f"postgres://u:{REDACTED}@h/db", f"ssh://{REDACTED}@github.com/x"]),
])
def test_secret_values_are_redacted_and_everything_else_kept(argv: list[str], expected: list[str]) -> None:
    assert redact(argv) == expected


@pytest.mark.parametrize("name", ["--password", "--db-passwd", "API_KEY", "--secret", "--auth", "--credentials",
                                  "--client-secret", "GITHUB_TOKEN", "--dbpassword", "--session-cookie", "--db-pass",
                                  "--pwd", "AccountKey", "authToken", "sig", "X-Amz-Signature", "Authorization"])
def test_secret_names(name: str) -> None:
    assert secret_name(name)


@pytest.mark.parametrize("name", ["--lr", "--tokenizer", "--max-tokens", "--keyboard", "--monkey", "--author",
                                  "--passes", "--bypass", "maxNewTokens", "--port"])
def test_names_that_are_not_secrets(name: str) -> None:
    assert not secret_name(name)


@pytest.mark.parametrize(("argv", "expected"), [
    (["/usr/bin/python3", "-u", "/opt/job/train.py", "--password", "x"], ["/usr/bin/python3", "/opt/job/train.py"]),
    (["python", "-m", "torch.distributed.run", "--nproc-per-node", "8", "train.py", "--token", "x"],
     ["python", "-m", "torch.distributed.run", "train.py"]),
    (["python3.11", "-uBm", "http.server", "8000"], ["python3.11", "-m", "http.server"]),
    (["python", "-Wignore", "-X", "dev", "serve.py", "-pX"], ["python", "serve.py"]),
    (["python", "-c", "connect(password='x')"], ["python", "-c"]),  # the code is an argument like any other
    (["torchrun", "--nproc-per-node", "8", "train.py", "--api-key", "k"], ["torchrun", "train.py"]),
    (["gunicorn", "-w", "4", "--keyfile", "k.pem", "app:app"], ["gunicorn"]),
    (["git", "clone", "https://ghp_t0ken@github.com/o/r.git"], ["git"]),
    (["python"], ["python"]),
    # a process title set over argv[0] is redacted word by word
    (["worker: --api-key sk-1 db.py"], [f"worker: --api-key {REDACTED} db.py"]),
])
def test_by_default_only_the_program_and_its_script_are_shown(argv: list[str], expected: list[str]) -> None:
    assert program(argv) == expected


def test_the_label_is_bounded_and_each_mode_shows_what_it_says() -> None:
    argv = ["/usr/bin/python3", "/opt/job/train.py", "--password=x", "--data", "/d" * 200]
    assert command_label(argv, MAX_COMMAND) == "/usr/bin/python3 /opt/job/train.py"
    label = command_label(argv, MAX_COMMAND, arguments=True)
    assert label.startswith("/usr/bin/python3 /opt/job/train.py --password=<redacted> --data ")
    assert len(label) == MAX_COMMAND
    assert command_label(argv, MAX_COMMAND, full=True).startswith("/usr/bin/python3 /opt/job/train.py --password=x")


# Each form of secret in a process of its own (argv[0] short, so all of it falls within the label's 128 characters):
# (arguments, the secret, the redacted arguments as the label shows them with process_command_arguments)
FORMS = [
    (["--db-password=hunter2"], "hunter2", f"--db-password={REDACTED}"),
    (["--api-key", "sk-live-abc"], "sk-live-abc", f"--api-key {REDACTED}"),
    (["DB_TOKEN=t0k3n"], "t0k3n", f"DB_TOKEN={REDACTED}"),
    (["postgres://u:pw1@h/db"], "pw1", f"postgres://u:{REDACTED}@h/db"),
    (["https://ghp_Tok3nOnly@github.com/o/r.git"], "ghp_Tok3nOnly", f"https://{REDACTED}@github.com/o/r.git"),
    (["--db-pass", "Pa55db"], "Pa55db", f"--db-pass {REDACTED}"),
    (["--pwd", "Pwd5ecret"], "Pwd5ecret", f"--pwd {REDACTED}"),
    (["-pMy5qlPass"], "My5qlPass", f"-p{REDACTED}"),
    (["-H", "Authorization: Bearer eyJhbGci0iJ"], "eyJhbGci0iJ", f"-H Authorization: {REDACTED}"),
    (['{"AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI"}'], "wJalrXUtnFEMI", f'{{"AWS_SECRET_ACCESS_KEY": "{REDACTED}"}}'),
    (["https://a.blob.core.windows.net/c/f?sv=2022&sig=S1gnatur3%3D&se=1"], "S1gnatur3",
     f"https://a.blob.core.windows.net/c/f?sv=2022&sig={REDACTED}&se=1"),
]
PARENT = """
import subprocess, sys, time
forms = {forms!r}
children = [subprocess.Popen(["py", "-c", "import time; time.sleep(120)", *args], executable=sys.executable)
            for args in forms]
print(" ".join(str(c.pid) for c in children), flush=True)
time.sleep(120)
"""


@pytest.fixture
def secret_children() -> Iterator[tuple[int, list[int]]]:
    """Real processes whose command lines carry each form of secret, as `ps` shows them: (their parent, theirs)."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(forms=[f[0] for f in FORMS])],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == len(FORMS)
        yield parent.pid, pids
    finally:
        children = pids if "pids" in locals() else []
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # SIGKILL is delivered, not done: wait until each is dead (a zombie of the parent, or gone) before the
        # parent goes, so that none is still running when the test's leftovers are looked for.
        wait_until(lambda: all(_dead(pid) for pid in children), timeout_s=30)
        parent.kill()
        reap([parent])


def _dead(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(b")") + 2:][:1] in (b"Z", b"X")


def _commands(pids: list[int], **config: bool) -> dict[int, str]:
    collector = ProcessCollector(CollectorContext(Config(proc_root="/proc", process_top_n=len(pids), **config),
                                                  SweepStats(), tuple(pids), frozenset()))
    for fam in collector.collect():
        if fam.defn.name == "outrider_process_info":
            return {int(labels[0]): labels[3] for labels, _ in fam.samples if labels[0].isdigit()}
    raise AssertionError("no outrider_process_info family")


def test_real_command_lines_show_the_program_by_default_and_redacted_arguments_when_asked(
        secret_children: tuple[int, list[int]]) -> None:
    _, pids = secret_children
    default = _commands(pids)
    with_arguments = _commands(pids, process_command_arguments=True)
    for pid, (_, secret, shown) in zip(pids, FORMS, strict=True):
        assert default[pid] == "py", "the program only: py -c is an interpreter by another name"
        assert with_arguments[pid] == f"py -c import time; time.sleep(120) {shown}"
        assert secret not in with_arguments[pid]
    full = _commands(pids, process_full_command=True)
    assert all(secret in full[pid] for pid, (_, secret, _) in zip(pids, FORMS, strict=True)), "an explicit opt-in"


@pytest.mark.integration
@pytest.mark.parametrize("arguments", [False, True])
def test_no_form_of_secret_reaches_metrics_or_an_otlp_export(secret_children: tuple[int, list[int]],
                                                            arguments: bool) -> None:
    parent, pids = secret_children
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "", "OUTRIDER_OTLP_INTERVAL_S": "0.5", "OUTRIDER_COLLECTORS": "process",
           "OUTRIDER_RULE_FILES": "", "OUTRIDER_PROCESS_TOP_N": str(len(pids) + 1),
           "OUTRIDER_PROCESS_COMMAND_ARGUMENTS": str(arguments).lower()}
    with OtlpHttpReceiver() as receiver:
        env["OUTRIDER_OTLP_ENDPOINT"] = receiver.endpoint
        with AgentProcess("--pid", str(parent), env=env) as agent:
            page = wait_until(lambda: (lambda t: t if all(f'pid="{p}"' in t for p in pids) else None)(agent.metrics()),
                              timeout_s=30, what="every secret-carrying process on /metrics")
            wait_until(lambda: {p for _, point in otlp_points(receiver.requests).get("outrider.process.info", [])
                                for p in [attributes(point.attributes).get("process.pid")]} >= set(pids),
                       timeout_s=30, what="every secret-carrying process in an OTLP export")
        exported = b"".join(r.SerializeToString() for r in receiver.requests)
    for pid, (_, secret, shown) in zip(pids, FORMS, strict=True):
        assert secret not in page and secret.encode() not in exported, secret
        command = value_label(page, pid)
        assert command == (f"py -c import time; time.sleep(120) {shown}" if arguments else "py"), command
    commands = {attributes(p.attributes).get("process.command_line")
                for _, p in otlp_points(receiver.requests)["outrider.process.info"]}
    assert ("py" in commands) != arguments, "OTLP carries the same command as /metrics"


def value_label(page: str, pid: int) -> str:
    """The command label of pid's outrider_process_info sample on a /metrics page."""
    for (name, labels), _ in samples(page).items():
        if name == "outrider_process_info" and dict(labels).get("pid") == str(pid):
            return dict(labels)["command"]
    raise AssertionError(f"no outrider_process_info for pid {pid}")
