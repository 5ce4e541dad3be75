"""Shared test helpers: free ports, polling, HTTP, starting the real agent as a subprocess, parsing exposition."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

T = TypeVar("T")
REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far, from /proc (clock ticks: a few percent of error per reading)."""
    with open(f"/proc/{pid}/stat") as fh:
        text = fh.read()
    f = text[text.rindex(")") + 2:].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def threads_cpu_ns(pid: int) -> int:
    """CPU of a process's live threads so far, in nanoseconds (their schedstat): finer than cpu_seconds' ticks, for
    windows too short for ticks; the CPU of threads that ended is not in it (compare with cpu_seconds)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """A process's resident memory now (VmRSS), or its peak so far (field="VmHWM")."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, written into `directory` (tls.crt, tls.key)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class SecretVolume:
    """A directory laid out as the kubelet lays out a Secret volume: each key a link into `..data`, itself a link
    to a timestamped directory that an update replaces whole, by one rename of the link."""

    def __init__(self, root: Path, keys: tuple[str, ...]) -> None:
        self.root = root
        self.generation = 0
        root.mkdir(parents=True, exist_ok=True)
        for key in keys:
            (root / key).symlink_to(f"..data/{key}")

    def write(self, files: dict[str, bytes]) -> None:
        self.generation += 1
        target = self.root / f"..{self.generation}"
        target.mkdir()
        for key, data in files.items():
            (target / key).write_bytes(data)
        (self.root / "..data_tmp").symlink_to(target.name)
        os.replace(self.root / "..data_tmp", self.root / "..data")

    def path(self, key: str) -> str:
        return str(self.root / key)


def wait_until(fn: Callable[[], T | None], timeout_s: float = 30.0, interval_s: float = 0.1,
               what: str = "condition") -> T:
    """Poll fn until it returns something truthy; fail with `what` after timeout_s (a bound, not a speed test)."""
    deadline = time.monotonic() + timeout_s
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = fn()
            if value:
                return value
        except Exception as e:
            last_exc = e
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}" +
                         (f" (last error: {last_exc!r})" if last_exc else ""))


def http_get(url: str, headers: dict[str, str] | None = None,
             timeout_s: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Parse Prometheus text exposition into {(sample name, sorted labels): value}. A label with an empty value
    is the same as no label (Prometheus's rule), so empty ones are left out of the keys."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if v)))] = s.value
    return out


def value(parsed: dict[tuple[str, tuple[tuple[str, str], ...]], float], metric: str, /,
          **labels: str) -> float | None:
    """The sample with exactly these labels (an empty value means the label is absent, as in Prometheus)."""
    key = (metric, tuple(sorted((k, v) for k, v in labels.items() if v)))
    return parsed.get(key)


def outrider_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "outrider", *args]


class AgentProcess:
    """The real `outrider agent` in a subprocess on a free 127.0.0.1 port, ready when /readyz says so."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, interval_s: float = 0.5,
                 fd_limit: int | None = None) -> None:
        """fd_limit: the agent's descriptor limit (soft and hard, as `ulimit -n` sets it), through util-linux's
        prlimit, which execs the agent (the same pid)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTRIDER_", "OTEL_"))}
        self._state = None
        if not (env or {}).get("OUTRIDER_STATE_DIR"):  # alert state and outbox private to this agent
            self._state = tempfile.TemporaryDirectory(prefix="outrider-state-")
            full_env["OUTRIDER_STATE_DIR"] = self._state.name
        full_env.update(env or {})
        # Output goes to a file, not a pipe: a chatty agent must never block on a full pipe.
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the agent
        limit = ["prlimit", f"--nofile={fd_limit}:{fd_limit}", "--"] if fd_limit else []
        self.proc = subprocess.Popen(
            [*limit, *outrider_cmd("agent", "--listen", f"127.0.0.1:{self.port}", "--interval", str(interval_s),
                                   *args)],
            env=full_env, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: self.proc.poll() is None and http_get(self.url + "/readyz", timeout_s=1)[0] == 200,
                       timeout_s=30, what="the agent's /readyz")
        except AssertionError:
            self.stop()
            raise AssertionError(f"agent did not become ready (exit {self.proc.returncode}); output:\n"
                                 f"{self.output}") from None

    @property
    def output(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def metrics(self, accept: str | None = None) -> str:
        status, _, body = http_get(self.url + "/metrics", headers={"Accept": accept} if accept else None)
        assert status == 200
        return body.decode()

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self._state is not None:
            self._state.cleanup()
            self._state = None
        return self.proc.returncode

    def __enter__(self) -> AgentProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def after_more(agent: AgentProcess, counter: str, n: int, timeout_s: float = 30.0) -> str:
    """The agent's /metrics once its own unlabelled counter (outrider_agent_sweeps_total,
    outrider_rule_evaluations_total) has gone up by n: n more sweeps or evaluations seen to happen, where a test
    would otherwise sleep and hope they did."""
    def read(text: str) -> float:
        return samples(text).get((counter, ()), 0.0)

    start = read(agent.metrics())

    def advanced() -> str | None:
        text = agent.metrics()
        return text if read(text) >= start + n else None
    return wait_until(advanced, timeout_s=timeout_s, what=f"{n} more of {counter}")


def served_by_agent(env: dict[str, str], series: str, what: str, collector: str) -> tuple[str, float]:
    """An agent process started with `env` scrapes a workload's endpoint: its /metrics text once it serves
    `series`, and the samples its collector counted left out (outrider_collector_errors_total). The collector's
    sweep must have succeeded."""
    with AgentProcess(env=env) as agent:
        def served() -> str | None:
            text = agent.metrics()
            return text if series in text else None

        text = wait_until(served, timeout_s=30, what=what)
    ours = samples(text)
    assert value(ours, "outrider_collector_success", collector=collector) == 1
    left_out = value(ours, "outrider_collector_errors_total", collector=collector)
    assert left_out is not None, f"{collector} counts what it leaves out"
    return text, left_out


def stop(proc: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    """Stop a process a test started, by pid, and wait for it; with it, its process group when it leads one
    (started with start_new_session=True, as workloads that fork are: their children die with them rather than
    poll a hold file for ever)."""
    with contextlib.suppress(OSError):
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGKILL)
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def release(proc: subprocess.Popen[bytes], hold: Path, *closing: Any) -> None:
    """The end of a test's hooked workload, whatever failed first: its hold file released, the process (and its
    group, when it leads one) stopped by pid if it is still running, and what the test opened beside it
    (collectors) closed."""
    hold.touch()
    stop(proc)
    for c in closing:
        c.close()


def reap(procs: Sequence[subprocess.Popen[bytes] | subprocess.Popen[str]], timeout_s: float = 60.0) -> None:
    """Wait for processes a test started to end (it told them to), then stop by pid any still running (with
    their process groups, when they lead one): a test never leaves one behind, whatever failed first."""
    deadline = time.monotonic() + timeout_s
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):  # the ones still running are stopped below
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        stop(p)


def sleeper(seconds: float = 60.0, extra: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """A watched workload: a Python process that sleeps."""
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})", *extra])


# --- the standalone agent a hooked workload starts (outrider/hook/election.py, outrider/commands/standalone.py) -------

STANDALONE_LINE = "started one (pid "


def standalone_agent(stderr: str) -> tuple[int, str] | None:
    """(pid, base URL) of the agent a workload started, from the line it prints on the workload's stderr."""
    import re

    m = re.search(r"started one \(pid (\d+)\) serving (\S+)/metrics", stderr)
    return (int(m.group(1)), m.group(2)) if m else None


def process_gone(pid: int) -> bool:
    """Exited (or a zombie): the agent is not our child, so its end is read from /proc, not waited for."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return True
    return text[text.rindex(")") + 2:].split()[0] in ("Z", "X")


def stop_standalone_agent(pid: int, timeout_s: float = 60.0) -> bool:
    """Waits for a workload's agent to exit by itself (it does, a grace period after the last publisher); past
    timeout_s it is stopped with SIGKILL, by pid, if that pid is still an `outrider standalone`. Returns whether
    it exited by itself."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process_gone(pid):
            return True
        time.sleep(0.1)
    with contextlib.suppress(OSError):
        if b"standalone" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)
    return False


def on_another_thread(fn: Callable[[], T]) -> T:
    """fn's result, computed on a thread of its own (a thread that is not the test's main one)."""
    out: list[T] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def record_drops(collector: Any) -> list[tuple[str, str]]:
    """The drops a collector counts from now on, as (key, reason) in order; each is still counted as before."""
    drops: list[tuple[str, str]] = []
    original = collector.drop

    def drop(key: str, why: BaseException | str) -> None:
        drops.append((key, str(why)))
        original(key, why)

    collector.drop = drop
    return drops
