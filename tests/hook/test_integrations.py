"""Framework integrations: ASGI and WSGI middleware driven through their protocols, and the PyTorch CUDA paths
against a stand-in for torch.cuda (no GPU here; the gpu-marked run on real hardware covers the device)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import types
import urllib.request
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest

import outrider
from outrider.collectors.base import CollectorContext
from outrider.collectors.hook import HookCollector
from outrider.ground.config import Config
from outrider.hook import api
from outrider.hook.asgi import OutriderMiddleware
from outrider.hook.runtime import Hook
from outrider.hook.settings import HookSettings
from outrider.hook.wsgi import OutriderWSGIMiddleware
from outrider.metrics.exposition import render
from tests.helpers import samples, value


@pytest.fixture
def live_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh hook publishing to tmp_path, installed as the process's hook for the test's duration."""
    monkeypatch.setattr(api, "S", api.HookState())
    monkeypatch.setenv("OUTRIDER_SPOOL_DIR", str(tmp_path))
    monkeypatch.setenv("OUTRIDER_STANDALONE", "false")
    assert outrider.instrument()
    yield api.S.hook
    api.S.hook.stop()


def read(tmp_path: Path, hook: Hook) -> dict:  # type: ignore[type-arg]
    hook.flush()
    c = HookCollector(CollectorContext(Config(spool_dir=str(tmp_path)), hold_spool_lock=False))
    return samples(render(c.collect()).decode())


class Route:
    def __init__(self, path: str) -> None:
        self.path = path


async def streaming_app(scope: dict, receive: Any, send: Any) -> None:  # type: ignore[type-arg]
    scope["route"] = Route("/v1/items/{item_id}")  # what Starlette's router does
    await send({"type": "http.response.start", "status": 200, "headers": []})
    for i in range(3):
        await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b"tok", "more_body": i < 2})


async def failing_app(scope: dict, receive: Any, send: Any) -> None:  # type: ignore[type-arg]
    await send({"type": "http.response.start", "status": 503, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def drive(app: Any, path: str) -> None:
    async def receive() -> dict:  # type: ignore[type-arg]
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:  # type: ignore[type-arg]
        pass

    asyncio.run(app({"type": "http", "path": path, "method": "GET"}, receive, send))


def test_asgi_route_template_status_class_and_streaming(tmp_path: Path, live_hook: Hook) -> None:
    app = OutriderMiddleware(streaming_app)
    for item in ("1", "2", "3"):
        drive(app, f"/v1/items/{item}")
    drive(OutriderMiddleware(failing_app), "/nope/123")
    parsed = read(tmp_path, live_hook)
    route = "/v1/items/{item_id}"
    ok = {"route": route, "method": "GET", "status_code": "200", "status_class": "2xx"}
    gen_ai = {"operation": "chat", "provider": "self_hosted"}
    assert value(parsed, "outrider_requests_total", **ok) == 3
    assert value(parsed, "outrider_requests_total", route="unmatched", method="GET", status_code="503",
                 status_class="5xx") == 1
    assert not any("/v1/items/1" in str(k) for k in parsed), "never the raw path"
    assert value(parsed, "outrider_inference_time_to_first_token_seconds_count", route=route, **gen_ai) == 3
    assert value(parsed, "outrider_inference_inter_token_latency_seconds_count", route=route, **gen_ai) == 6
    assert value(parsed, "outrider_requests_in_flight", route="all", method="GET") == 0
    assert value(parsed, "outrider_request_duration_seconds_sum", **ok) > 0.05


def test_wsgi_through_a_real_server(tmp_path: Path, live_hook: Hook) -> None:
    def app(environ: dict, start_response: Any) -> Any:  # type: ignore[type-arg]
        environ["outrider.route"] = "/predict/{model}"
        start_response("200 OK", [("Content-Type", "text/plain")])
        return iter([b"a", b"b", b"c"])

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = make_server("127.0.0.1", 0, OutriderWSGIMiddleware(app), handler_class=Quiet)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        for m in ("x", "y"):
            assert urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/predict/{m}").read() == b"abc"
    finally:
        server.shutdown()
    parsed = read(tmp_path, live_hook)
    assert value(parsed, "outrider_requests_total", route="/predict/{model}", method="GET", scheme="http",
                 status_code="200", status_class="2xx") == 2
    assert value(parsed, "outrider_inference_inter_token_latency_seconds_count", route="/predict/{model}",
                 operation="chat", provider="self_hosted") == 4


def test_latency_helpers(tmp_path: Path, live_hook: Hook) -> None:
    @outrider.timed("tokenize")
    def tokenize() -> int:
        return 1

    tokenize()
    with outrider.latency("decode"):
        pass
    outrider.record_batch_size(8)
    outrider.record_phase("queue", 0.01)
    parsed = read(tmp_path, live_hook)
    assert value(parsed, "outrider_latency_seconds_count", name="tokenize", rank="") == 1
    assert value(parsed, "outrider_latency_seconds_count", name="decode", rank="") == 1
    assert value(parsed, "outrider_inference_batch_size_count", rank="") == 1
    assert value(parsed, "outrider_request_phase_duration_seconds_count", phase="queue", rank="") == 1


def test_disabled_makes_every_call_a_noop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api, "S", api.HookState())
    monkeypatch.setenv("OUTRIDER_DISABLED", "1")
    assert outrider.instrument() is False
    with outrider.step(samples=3):
        pass
    outrider.step_end()
    outrider.count_tokens(5)
    outrider.histogram("x_seconds").observe(1.0)
    assert list(outrider.dataloader([1, 2])) == [1, 2]
    assert api.S.hook is None


class FakeEvent:
    """Stands in for torch.cuda.Event: completes when the test says so, 30 ms apart."""

    clock = 0.0

    def __init__(self, enable_timing: bool = False) -> None:
        self.t: float | None = None
        self.done = False

    def record(self) -> None:
        FakeEvent.clock += 30.0
        self.t = FakeEvent.clock

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.done and end.done, "elapsed_time needs both events complete: the hook must not wait"
        return float(end.t - self.t)  # type: ignore[operator]


def test_cuda_allocator_and_event_timing_without_synchronising(tmp_path: Path) -> None:
    from outrider.hook.torch_integration import TorchIntegration

    stats = {"allocated_bytes.all.current": 5 << 30, "reserved_bytes.all.current": 6 << 30,
             "active_bytes.all.current": 5 << 30, "inactive_split_bytes.all.current": 1 << 20,
             "allocated_bytes.all.peak": 7 << 30, "num_alloc_retries": 3, "num_ooms": 0}
    cuda = types.SimpleNamespace(
        is_initialized=lambda: True, is_current_stream_capturing=lambda: False, Event=FakeEvent,
        device_count=lambda: 1, memory_stats=lambda device: dict(stats),
        synchronize=lambda: pytest.fail("the hook must never synchronise the device"))
    torch = types.SimpleNamespace(cuda=cuda)
    import torch as real_torch

    torch.optim = real_torch.optim  # type: ignore[attr-defined]
    hook = Hook(HookSettings(spool_dir=str(tmp_path), standalone=False))
    state = api.HookState()
    state.hook = hook
    integ = TorchIntegration(hook, state, torch)
    try:
        for _ in range(4):
            integ.on_step()
        for e in list(integ.pending)[:3]:
            e.done = True  # the GPU finished three steps; the fourth is still running
        hook.progress.steps = 41
        stats["num_ooms"] = 1
        integ.sample()
        assert len(integ.pending) == 1, "the unfinished event is left for later, not waited on"
        parsed = read(tmp_path, hook)
        assert value(parsed, "outrider_train_gpu_step_duration_seconds_count", rank="") == 2
        assert value(parsed, "outrider_train_gpu_step_duration_seconds_sum", rank="") == pytest.approx(0.06)
        assert value(parsed, "outrider_torch_cuda_memory_bytes", rank="", device="0", kind="reserved") == 6 << 30
        assert value(parsed, "outrider_torch_cuda_memory_peak_bytes", rank="", device="0") == 7 << 30
        assert value(parsed, "outrider_torch_cuda_alloc_retries_total", rank="", device="0") == 3
        assert value(parsed, "outrider_torch_cuda_ooms_total", rank="", device="0") == 1
        assert value(parsed, "outrider_torch_cuda_oom_step", rank="", device="0") == 41
    finally:
        integ.detach()


def test_no_event_is_recorded_during_cuda_graph_capture(tmp_path: Path) -> None:
    from outrider.hook.torch_integration import TorchIntegration

    cuda = types.SimpleNamespace(is_initialized=lambda: True, is_current_stream_capturing=lambda: True,
                                 Event=lambda **kw: pytest.fail("recorded an event inside a graph capture"))
    import torch as real_torch

    integ = TorchIntegration(Hook(HookSettings(spool_dir=str(tmp_path), standalone=False)), api.HookState(),
                             types.SimpleNamespace(cuda=cuda, optim=real_torch.optim))
    try:
        integ.on_step()
        assert not integ.pending
    finally:
        integ.detach()


# --- what makes a process a training process, with zero configuration ----------------------------------------

@pytest.fixture
def torch_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """instrument() with torch imported (no torchrun, no OUTRIDER_ROLE); torch's own functions put back after."""
    torch = pytest.importorskip("torch")
    for name in ("TORCHELASTIC_RUN_ID", "OUTRIDER_ROLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(api, "S", api.HookState())
    monkeypatch.setenv("OUTRIDER_SPOOL_DIR", str(tmp_path))
    monkeypatch.setenv("OUTRIDER_STANDALONE", "false")
    monkeypatch.setenv("OUTRIDER_FIRST_STEP_TIMEOUT_S", "60")
    assert outrider.instrument()
    assert api.S.torch is not None
    yield torch, api.S.hook
    api.S.hook.stop()
    api.S.torch.detach()


def test_building_an_optimizer_makes_a_training_process_whose_missing_first_step_is_a_stall(
        tmp_path: Path, torch_hook: Any) -> None:
    torch, hook = torch_hook
    assert not hook.progress.training, "importing torch and instrumenting says nothing yet"
    assert value(read(tmp_path, hook), "outrider_train_first_step_pending") is None
    model = torch.nn.Linear(4, 4)
    torch.optim.AdamW(model.parameters(), lr=1e-3)  # a subclass: its __init__ calls Optimizer's
    parsed = read(tmp_path, hook)
    assert value(parsed, "outrider_train_first_step_pending") == 1
    assert value(parsed, "outrider_hook_stalled") == 0, "within the first-step timeout"
    hook.progress.started_perf -= hook.settings.first_step_timeout_s + 1  # as if it had hung that long
    parsed = read(tmp_path, hook)
    assert value(parsed, "outrider_hook_stalled") == 1
    dump = next(tmp_path.glob("*.stacks.txt")).read_text()
    assert "no first step (a training process: it built an optimizer)" in dump
    outrider.record_request(0.01, route="/x")
    read(tmp_path, hook)
    assert hook.progress.training, "an optimizer is strong evidence: serving a request does not undo it"


def test_a_process_group_makes_a_training_process_unless_it_serves(tmp_path: Path, torch_hook: Any) -> None:
    torch, hook = torch_hook
    dist = torch.distributed
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        parsed = read(tmp_path, hook)
        assert hook.progress.evidence == "initialised a torch.distributed process group"
        assert value(parsed, "outrider_train_first_step_pending") == 1
        outrider.record_request(0.01, route="/generate")  # tensor-parallel inference initialises one too
        parsed = read(tmp_path, hook)
        assert not hook.progress.training and value(parsed, "outrider_train_first_step_pending") == 0
        torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
        assert hook.progress.training, "a DDP wrapper is training, whatever else the process does"
    finally:
        dist.destroy_process_group()


def test_a_process_group_initialised_before_instrument_is_seen(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    dist = torch.distributed
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        monkeypatch.setattr(api, "S", api.HookState())
        monkeypatch.setenv("OUTRIDER_SPOOL_DIR", str(tmp_path))
        monkeypatch.setenv("OUTRIDER_STANDALONE", "false")
        assert outrider.instrument()
        try:
            assert value(read(tmp_path, api.S.hook), "outrider_train_first_step_pending") == 1
        finally:
            api.S.hook.stop()
            api.S.torch.detach()
    finally:
        dist.destroy_process_group()


def test_batch_inference_over_a_dataloader_is_not_training(tmp_path: Path, torch_hook: Any) -> None:
    """A DataLoader alone is no evidence: a batch inference job iterating one must never wait for a first step."""
    torch, hook = torch_hook
    model = torch.nn.Linear(4, 2)
    data = torch.utils.data.TensorDataset(torch.ones(16, 4))
    with torch.no_grad():
        for (x,) in torch.utils.data.DataLoader(data, batch_size=4):
            model(x)
    parsed = read(tmp_path, hook)
    assert not hook.progress.training
    assert value(parsed, "outrider_train_first_step_pending") is None
    assert value(parsed, "outrider_train_data_wait_seconds_count") == 4, "its batches are still timed"


def test_detach_puts_torch_back(torch_hook: Any) -> None:
    torch, _ = torch_hook
    before = (torch.optim.Optimizer.__dict__["__init__"], torch.distributed.init_process_group)
    api.S.torch.detach()
    after = (torch.optim.Optimizer.__dict__["__init__"], torch.distributed.init_process_group)
    assert after[0] is not before[0] and after[1] is not before[1]
    assert after[0].__code__.co_name == "__init__" and after[1].__code__.co_name != "marking"
    import torch.serialization as serialization
    assert not getattr(serialization._save, "__outrider_checkpoint__", False)


def test_instrument_before_import_torch_attaches_once_torch_is_imported(tmp_path: Path) -> None:
    """instrument() at the top of a script, `import torch` after it: steps, data waits and the training evidence
    are all measured (in a fresh interpreter: this one imported torch long ago)."""
    pytest.importorskip("torch")
    code = """if True:
        import sys
        import outrider
        from outrider.hook import api
        outrider.instrument()
        assert api.S.torch is None and "torch" not in sys.modules
        import torch
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.utils.data.TensorDataset(torch.ones(8, 4))
        for (x,) in torch.utils.data.DataLoader(data, batch_size=2):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
        finders = [f for f in sys.meta_path if type(f).__name__ == "_AfterTorchImport"]
        print(api.S.torch is not None, api.S.steps.ring.n, api.S.waits.ring.n, api.S.hook.progress.evidence,
              len(finders), sep="|")
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    env.update({"OUTRIDER_SPOOL_DIR": str(tmp_path), "OUTRIDER_STANDALONE": "false"})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True|4|4|built an optimizer|0", out.stderr
