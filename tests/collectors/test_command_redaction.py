"""Secrets on watched command lines never reach outrider_process_info{command} unless full lines are opted in."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from outrider.collectors.base import CollectorContext
from outrider.collectors.cmdline import REDACTED, command_label, redact, secret_name
from outrider.collectors.process import ProcessCollector
from outrider.collectors.process_identity import MAX_COMMAND
from outrider.config import Config
from outrider.sampler import SweepStats
from tests.helpers import reap


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
    (["python", "gen.py", "--max-new-tokens", "64", "--monkey=1", "--keyboard=us", "LR=0.1"],
     ["python", "gen.py", "--max-new-tokens", "64", "--monkey=1", "--keyboard=us", "LR=0.1"]),
])
def test_secret_values_are_redacted_and_everything_else_kept(argv: list[str], expected: list[str]) -> None:
    assert redact(argv) == expected


@pytest.mark.parametrize("name", ["--password", "--db-passwd", "API_KEY", "--secret", "--auth", "--credentials",
                                  "--client-secret", "GITHUB_TOKEN", "--dbpassword", "--session-cookie"])
def test_secret_names(name: str) -> None:
    assert secret_name(name)


@pytest.mark.parametrize("name", ["--lr", "--tokenizer", "--max-tokens", "--keyboard", "--monkey", "--author"])
def test_names_that_are_not_secrets(name: str) -> None:
    assert not secret_name(name)


def test_the_executable_and_script_are_kept_and_the_label_bounded() -> None:
    argv = ["/usr/bin/python3", "/opt/job/train.py", "--password=x", "--data", "/d" * 200]
    label = command_label(argv, MAX_COMMAND)
    assert label.startswith("/usr/bin/python3 /opt/job/train.py --password=<redacted> --data ")
    assert len(label) == MAX_COMMAND
    assert command_label(argv, MAX_COMMAND, full=True).startswith("/usr/bin/python3 /opt/job/train.py --password=x")


@pytest.fixture
def secret_child() -> Iterator[subprocess.Popen[bytes]]:
    """A real process whose command line carries secrets in all three forms, as `ps` shows them."""
    code = "import time; time.sleep(60)"  # argv[0] short, so every secret falls within the label's 128 characters
    child = subprocess.Popen(["py", "-c", code, "--db-password=hunter2", "--api-key", "sk-live-abc",
                              "DB_TOKEN=t0k3n", "postgres://u:pw1@h/db"], executable=sys.executable)
    try:
        yield child
    finally:
        child.kill()
        reap([child])


def _command_of(child: subprocess.Popen[bytes], full: bool) -> str:
    config = Config(proc_root="/proc", process_full_command=full)
    collector = ProcessCollector(CollectorContext(config, SweepStats(), (child.pid,), frozenset()))
    for fam in collector.collect():
        if fam.defn.name == "outrider_process_info":
            (labels, _), = [s for s in fam.samples if s[0][0] == str(child.pid)]
            return labels[3]
    raise AssertionError("no outrider_process_info family")


def test_a_real_process_command_line_is_exported_redacted_by_default(secret_child: subprocess.Popen[bytes]) -> None:
    command = _command_of(secret_child, full=False)
    for secret in ("hunter2", "sk-live-abc", "t0k3n", "pw1"):
        assert secret not in command
    assert command.startswith("py -c import time")
    assert f"--db-password={REDACTED} --api-key {REDACTED} DB_TOKEN={REDACTED} postgres://u:{REDACTED}@h/db" in command


def test_full_command_lines_are_an_explicit_opt_in(secret_child: subprocess.Popen[bytes]) -> None:
    command = _command_of(secret_child, full=True)
    assert "--db-password=hunter2 --api-key sk-live-abc" in command
