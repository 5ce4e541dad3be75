"""The one module that talks to NVML (through nvidia-ml-py's ctypes bindings).

- Lazy: nothing loads until the first init(); a missing library or driver is a state, not an exception.
- query(fn, *args) returns NA where a reading is not available: a function this driver lacks (logged once per
  function), a reading the device does not support (remembered per device, so it is not asked again), any other
  NVML error (counted). A lost GPU raises GpuLost, which the collector turns into its up gauge.
- Versioned functions are probed newest first (`_v3`, then `_v2`).
- Static facts (name, UUID, total memory, power limit, maximum clocks) are read once per device and cached.
- After a driver failure (uninitialised, driver not loaded, unknown error), re-init is tried with exponential
  backoff; the collector reports NVML down meanwhile.
- Field values are decoded by the value type NVML gives with each (double, unsigned or signed integers).
- XID events: an XidWatcher thread owns one event set for its whole life. It creates the set, registers the GPUs,
  waits on it, and frees it after its last wait has returned, so a set is never freed under a waiter.

Teardown order (shutdown()): the watchers are told to stop; then no new call is admitted, and nvmlShutdown runs
once every call in flight has returned: the sweep's, and each watcher's, whose thread holds its admission from
creating its set to freeing it. So the order is always: last wait returns -> set freed -> nvmlShutdown, and no
call reaches NVML after it. If a call does not return in time (a wedged driver), shutdown() does not wait for it:
the last call to return runs nvmlShutdown.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from outrider.ground.logs import LogOnce

SONAME = "libnvidia-ml.so.1"  # what pynvml loads on Linux; found through LD_LIBRARY_PATH and the loader's cache
LIBRARY_NOT_FOUND = f"{SONAME} was not found (no NVIDIA driver, or it is not mounted into this container)"

LOG = logging.getLogger("outrider.nvml")


class _NA:
    def __repr__(self) -> str:
        return "NA"

    def __bool__(self) -> bool:
        return False


NA: Any = _NA()
# What a driver writes where it has no value (NVML_VALUE_NOT_AVAILABLE as unsigned int, and as unsigned long long).
NOT_AVAILABLE = frozenset((0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF))


def percent(value: Any) -> Any:
    """A 0-100 reading as given, or NA where the driver wrote "not available" or something no percentage can be."""
    if value is NA or value in NOT_AVAILABLE or not 0 <= value <= 100:
        return NA
    return value


class GpuLost(Exception):
    """NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus (or needs a reset)."""


XID_EVENT = 0x0000000000000008  # nvmlEventTypeXidCriticalError
# nvmlValueType_t -> the member of nvmlValue_t that holds a field value of that type
FIELD_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
# nvmlNvLinkErrorCounter_t values, by the name the metric's type label gives them
NVLINK_ERROR_COUNTERS = (("replay", 0), ("recovery", 1), ("crc_flit", 2), ("crc_data", 3))


class _CallGate:
    """Admits NVML calls until closed; once closed and the last admitted call has returned, runs the close action.

    Every call into the library holds an admission while it runs (an XID watcher holds one for its whole life),
    so the close action (nvmlShutdown) can never overlap a call, and no call is admitted after it.

    The per-call path takes no lock (a lock pair cost 0.55 us per call here, a third of a call): an admission is
    an item on a list (append and pop are atomic), taken before `closed` is read, while close() sets `closed`
    before it counts the list. So a call either is counted by close(), or sees `closed` and backs out. The lock
    only orders the rare moments after close(): who runs the close action, once."""

    def __init__(self) -> None:
        self._flight: list[None] = []
        self._closed = False
        self._lock = threading.Lock()
        self._idle = threading.Event()  # set once closed with nothing in flight
        self._on_idle: Callable[[], None] | None = None

    def enter(self) -> bool:
        self._flight.append(None)
        if self._closed:
            self.exit()
            return False
        return True

    def exit(self) -> None:
        self._flight.pop()
        if self._closed:
            self._last_out()

    def _last_out(self) -> None:
        with self._lock:
            if self._flight:
                return
            self._idle.set()
            run, self._on_idle = self._on_idle, None
        if run is not None:
            run()

    def close(self, timeout_s: float, then: Callable[[], None]) -> bool:
        """Admit nothing more; run `then` once nothing is in flight: now (True), or by the last call out (False)."""
        self._closed = True
        if not self._flight:
            self._idle.set()
        if not self._idle.wait(timeout_s):
            with self._lock:
                if self._flight:
                    self._on_idle = then
                    return False
        then()
        return True

    def reopen(self) -> None:
        with self._lock:
            self._closed = False
            self._idle.clear()

    @property
    def in_flight(self) -> int:
        return len(self._flight)


class XidWatcher:
    """A thread that owns one NVML event set: creates it, registers the GPUs for XID events, waits on it, and frees
    it after its last wait. Counts XIDs per (GPU index, code) with the time of each GPU's last one."""

    WAIT_MS = 1000  # how long one wait blocks: also about how long stopping may take

    def __init__(self, nvml: Nvml, handles: dict[int, Any], generation: int) -> None:
        self.generation = generation
        self._nvml = nvml
        self._handles = dict(handles)
        self._counts: dict[tuple[int, int], int] = {}
        self._last: dict[int, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="outrider-xid", daemon=True)

    def start(self) -> bool:
        """False when NVML is closing: nothing was started."""
        if not self._nvml._gate.enter():
            return False
        self.thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()

    def snapshot(self) -> tuple[dict[tuple[int, int], int], dict[int, float]]:
        """(counts by (GPU index, XID code), Unix time of each GPU's last XID), copied under the lock."""
        with self._lock:
            return dict(self._counts), dict(self._last)

    def _run(self) -> None:
        lib, once = self._nvml.lib, self._nvml._once
        try:
            try:
                event_set = lib.nvmlEventSetCreate()
            except Exception as e:
                once.warning("xid", "XID events unavailable: %s", e)
                return
            try:
                registered = 0
                for index, handle in self._handles.items():
                    try:
                        lib.nvmlDeviceRegisterEvents(handle, XID_EVENT, event_set)
                        registered += 1
                    except Exception as e:
                        once.warning(f"xid{index}", "GPU %d: XID events unavailable: %s", index, e)
                if registered:
                    self._wait_loop(lib, event_set)
            finally:
                try:
                    lib.nvmlEventSetFree(event_set)
                except Exception as e:
                    once.warning("xid-free", "freeing the XID event set failed: %s", e)
        finally:
            self._nvml._gate.exit()

    def _wait_loop(self, lib: Any, event_set: Any) -> None:
        addresses = {ctypes.cast(h, ctypes.c_void_p).value: index for index, h in self._handles.items()}
        while not self._stop.is_set():
            try:
                data = lib.nvmlEventSetWait(event_set, self.WAIT_MS)
            except lib.NVMLError_Timeout:
                continue
            except Exception:  # a lost GPU or a driver failure: the sweep reports it; keep listening, slowly
                self._stop.wait(5.0)
                continue
            if not data.eventType & XID_EVENT:
                continue
            index = addresses.get(ctypes.cast(data.device, ctypes.c_void_p).value, -1)
            code = int(data.eventData)
            with self._lock:
                self._counts[(index, code)] = self._counts.get((index, code), 0) + 1
                self._last[index] = time.time()


@dataclass(frozen=True)
class StaticFacts:
    index: int
    name: str
    uuid: str
    memory_total: Any
    power_limit_w: Any
    max_sm_clock_hz: Any
    max_mem_clock_hz: Any


class Nvml:
    MIN_RETRY_S = 5.0
    MAX_RETRY_S = 300.0

    def __init__(self, library_path: str | None = None) -> None:
        self.library_path = library_path
        self.lib: Any = None  # the pynvml module once loaded
        self.initialized = False
        self.unavailable_reason = ""
        self.errors = 0
        self.calls = 0
        self._retry_at = 0.0
        self._backoff = self.MIN_RETRY_S
        self._missing: set[str] = set()
        self._unsupported: set[tuple[str, int]] = set()
        self._handles: dict[int, Any] = {}
        self._facts: dict[int, StaticFacts] = {}
        self._driver_version: str | None = None
        self._nvlinks: dict[int, tuple[int, ...]] = {}
        self._once = LogOnce(LOG)
        self._lock = threading.Lock()
        self._gate = _CallGate()
        self._generation = 0  # counts successful inits: an XID watcher belongs to one
        self._watcher: XidWatcher | None = None

    # --- lifecycle -------------------------------------------------------------------------------------------
    def init(self) -> bool:
        """True when NVML is usable now; otherwise sets unavailable_reason and backs off before trying again."""
        if self.initialized:
            return True
        now = time.monotonic()
        if now < self._retry_at:
            return False
        with self._lock:
            try:
                if self.lib is None:
                    if not self.library_path:
                        # the driver's library first: pynvml (nvidia-ml-py, one 5,000-line module: 1 MiB of RSS)
                        # is imported only where there is one to call, so a node without GPUs never pays for it
                        ctypes.CDLL(SONAME)
                    import pynvml

                    if self.library_path:  # load a specific library (a test fake, an unusual install path)
                        pynvml.nvmlLib = ctypes.CDLL(self.library_path)
                        pynvml._nvmlGetFunctionPointer_cache.clear()  # pointers into any library loaded before
                    self.lib = pynvml
                self.lib.nvmlInit()
                self._gate.reopen()
                self._generation += 1
                self.initialized = True
                self._backoff = self.MIN_RETRY_S
                if self.unavailable_reason:
                    LOG.info("NVML available again")
                self.unavailable_reason = ""
                self._handles.clear()
                self._nvlinks.clear()
                return True
            except ImportError as e:
                reason = f"nvidia-ml-py is not installed ({e})"
            except OSError as e:  # an explicit path says why; the soname not found is pynvml's LibraryNotFound
                reason = _describe(e) if self.library_path else LIBRARY_NOT_FOUND
            except Exception as e:  # NVMLError (no driver, no library) or OSError
                reason = _describe(e)
            self._retry_at = now + self._backoff
            self._backoff = min(self.MAX_RETRY_S, self._backoff * 2)
            if reason != self.unavailable_reason:
                LOG.warning("GPU metrics unavailable: %s (the agent runs on; retrying with backoff)", reason)
            self.unavailable_reason = reason
            return False

    def _driver_failed(self, error: Exception) -> None:
        self.initialized = False
        self._retry_at = time.monotonic() + self._backoff
        self.unavailable_reason = _describe(error)
        LOG.warning("NVML failed (%s); re-initialising with backoff", self.unavailable_reason)

    def shutdown(self, timeout_s: float | None = None) -> bool:
        """Stop the XID watcher, then nvmlShutdown once every call in flight has returned (the watcher's last wait
        and its freeing of the event set included). Waits at most timeout_s (one event wait and a second by
        default); True when NVML was shut down within it, False when the last call to return will do it."""
        with self._lock:
            watcher, self._watcher = self._watcher, None
            was_initialized, self.initialized = self.initialized, False
        if watcher is not None:
            watcher.stop()
        if not was_initialized or self.lib is None:
            return True
        bound = timeout_s if timeout_s is not None else XidWatcher.WAIT_MS / 1000.0 + 1.0
        deadline = time.monotonic() + bound
        done = self._gate.close(bound, self._shutdown_library)
        if watcher is not None and watcher.thread.is_alive():
            watcher.thread.join(max(0.0, deadline - time.monotonic()))
        if not done:
            LOG.warning("an NVML call has not returned within %.1f s; NVML is shut down when it does", bound)
        return done

    @property
    def calls_in_flight(self) -> int:
        """NVML calls running now (an XID watcher counts as one for its whole life)."""
        return self._gate.in_flight

    def _shutdown_library(self) -> None:
        with contextlib.suppress(Exception):
            self.lib.nvmlShutdown()

    # --- XID events ------------------------------------------------------------------------------------------
    def watch_xid(self, handles: dict[int, Any]) -> XidWatcher | None:
        """The XID watcher of this NVML session, started on first use; None where there is none. A watcher from
        before a re-initialisation is stopped (it frees its own set on its way out) and a new one started."""
        if not self.initialized:
            return None
        with self._lock:
            current = self._watcher
            if current is not None and current.generation == self._generation:
                return current
            if current is not None:
                current.stop()
                self._watcher = None
            if not handles or not self.has("nvmlEventSetCreate"):
                return None
            watcher = XidWatcher(self, handles, self._generation)
            self._watcher = watcher if watcher.start() else None
            return self._watcher

    # --- calls -----------------------------------------------------------------------------------------------
    def has(self, fn: str) -> bool:
        return fn not in self._missing and self.lib is not None and hasattr(self.lib, fn)

    def query(self, fn: str, *args: Any, device: int = -1, key: str | None = None,
              expected: tuple[str, ...] = ()) -> Any:
        """Call pynvml.FN(*args). NA where unavailable; GpuLost for a lost GPU. Never raises anything else.

        `key` names the capability for the missing/unsupported memory when one binding covers several driver
        symbols (nvmlDeviceGetMemoryInfo with a version calls nvmlDeviceGetMemoryInfo_v2). `expected` names NVML
        errors (as pynvml's NVMLError_NAME) that are an answer here, not a failure: NA, not counted."""
        cap = key or fn
        if (cap, device) in self._unsupported or cap in self._missing:
            return NA
        lib = self.lib
        func: Callable[..., Any] | None = getattr(lib, fn, None)
        if func is None:
            self._missing.add(cap)
            self._once.warning(fn, "NVML binding %s is not available; its metrics are left out", fn)
            return NA
        if not self._gate.enter():  # shut down (or shutting down): no call may reach the library now
            return NA
        self.calls += 1
        try:
            value = func(*args)
            # NVML's "not available" (NVML_VALUE_NOT_AVAILABLE, all ones): an absent reading, never 4.29e9 of it.
            return NA if type(value) is int and value in NOT_AVAILABLE else value
        except lib.NVMLError_NotSupported:
            self._unsupported.add((cap, device))
            return NA
        except lib.NVMLError_FunctionNotFound:
            self._missing.add(cap)
            self._once.warning(cap, "this NVIDIA driver lacks %s; its metrics are left out", cap)
            return NA
        except lib.NVMLError_GpuIsLost:
            raise GpuLost(f"GPU {device} is lost") from None
        except lib.NVMLError_NotFound:  # e.g. no utilisation sample newer than asked for: nothing to report
            return NA
        except (lib.NVMLError_Uninitialized, lib.NVMLError_DriverNotLoaded, lib.NVMLError_LibRmVersionMismatch) as e:
            self._driver_failed(e)
            return NA
        except lib.NVMLError as e:
            if any(isinstance(e, getattr(lib, f"NVMLError_{name}", ())) for name in expected):
                return NA
            self.errors += 1
            self._once.warning(f"{fn}:{type(e).__name__}", "NVML %s failed: %s (counted)", fn, e)
            return NA
        except Exception as e:  # a binding mismatch or a ctypes error must not take the sweep down
            self.errors += 1
            self._once.warning(f"{fn}:{type(e).__name__}", "NVML %s raised %s: %s (counted)", fn, type(e).__name__, e)
            return NA
        finally:
            self._gate.exit()

    def probe(self, names: tuple[str, ...], *args: Any, device: int = -1) -> Any:
        """The first of `names` (newest version first) this driver has."""
        for name in names:
            if name in self._missing or not hasattr(self.lib, name):
                continue
            value = self.query(name, *args, device=device)
            if name not in self._missing:
                return value
        return NA

    # --- devices ---------------------------------------------------------------------------------------------
    def device_count(self) -> int:
        n = self.query("nvmlDeviceGetCount")
        return int(n) if n is not NA else 0

    def handle(self, index: int) -> Any:
        h = self._handles.get(index)
        if h is None:
            h = self.query("nvmlDeviceGetHandleByIndex", index, device=index)
            if h is not NA:
                self._handles[index] = h
        return h

    def driver_version(self) -> str:
        """The driver's version ("" where NVML does not say); read once, as it changes only with a reload."""
        if self._driver_version is None:
            v = self.query("nvmlSystemGetDriverVersion")
            if v is NA:
                return ""
            self._driver_version = _text(v)
        return self._driver_version

    def facts(self, index: int) -> StaticFacts:
        cached = self._facts.get(index)
        if cached is not None:
            return cached
        h = self.handle(index)
        lib = self.lib
        name = self.query("nvmlDeviceGetName", h, device=index)
        uuid = self.query("nvmlDeviceGetUUID", h, device=index)
        mem = self.query("nvmlDeviceGetMemoryInfo", h, device=index)
        limit = self.query("nvmlDeviceGetEnforcedPowerLimit", h, device=index)
        sm = self.query("nvmlDeviceGetMaxClockInfo", h, lib.NVML_CLOCK_SM, device=index)
        memclk = self.query("nvmlDeviceGetMaxClockInfo", h, lib.NVML_CLOCK_MEM, device=index)
        facts = StaticFacts(index, _text(name) or "unknown", _text(uuid) or f"index-{index}",
                            mem.total if mem is not NA else NA, limit / 1000.0 if limit is not NA else NA,
                            sm * 1e6 if sm is not NA else NA, memclk * 1e6 if memclk is not NA else NA)
        if name is not NA and uuid is not NA:
            self._facts[index] = facts
        return facts


    # --- readings that need decoding ---------------------------------------------------------------------------
    def field_values(self, handle: Any, field_ids: list[int], device: int) -> dict[int, float]:
        """{field id: value} for the fields the GPU answered, each decoded by the value type NVML gives with it."""
        values = self.query("nvmlDeviceGetFieldValues", handle, field_ids, device=device)
        out: dict[int, float] = {}
        if values is NA:
            return out
        for v in values:
            if v.nvmlReturn != 0:
                continue
            member = FIELD_VALUE_MEMBERS.get(int(v.valueType))
            if member is None:
                self.errors += 1
                self._once.warning(f"field-type-{v.valueType}", "NVML field %d has value type %d, unknown here: "
                                   "dropped (counted)", v.fieldId, v.valueType)
                continue
            raw = getattr(v.value, member)
            if isinstance(raw, int) and raw in NOT_AVAILABLE:
                continue
            out[int(v.fieldId)] = float(raw)
        return out

    def nvlink_links(self, index: int, handle: Any) -> tuple[int, ...]:
        """The GPU's NVLink links, found once per NVML session: every link NVML answers for, active or not (a link
        beyond the GPU's count answers 'invalid argument'; a GPU without NVLink answers 'not supported')."""
        cached = self._nvlinks.get(index)
        if cached is not None:
            return cached
        max_links = int(getattr(self.lib, "NVML_NVLINK_MAX_LINKS", 18))
        links = []
        for link in range(max_links):
            state = self.query("nvmlDeviceGetNvLinkState", handle, link, device=index,
                               key=f"nvmlDeviceGetNvLinkState:{link}", expected=("InvalidArgument",))
            if "nvmlDeviceGetNvLinkState" in self._missing:
                break
            if state is not NA:
                links.append(link)
        self._nvlinks[index] = tuple(links)
        return self._nvlinks[index]

    def nvlink_states(self, index: int, handle: Any) -> dict[int, bool]:
        """Whether each of the GPU's links is active now (NVML_FEATURE_ENABLED), read every sweep: a link that was
        active and is not any more is a fault (alerts GPUNVLinkDown). A link that does not answer is absent."""
        out: dict[int, bool] = {}
        for link in self.nvlink_links(index, handle):
            state = self.query("nvmlDeviceGetNvLinkState", handle, link, device=index,
                               key=f"nvmlDeviceGetNvLinkState:{link}", expected=("InvalidArgument",))
            if state is not NA:
                out[link] = int(state) == 1
        return out

    def nvlink_errors(self, index: int, handle: Any) -> dict[str, int]:
        """NVLink error counters summed over the GPU's links, by type; a type no link answers is absent."""
        out: dict[str, int] = {}
        for link in self.nvlink_links(index, handle):
            for name, counter in NVLINK_ERROR_COUNTERS:
                v = self.query("nvmlDeviceGetNvLinkErrorCounter", handle, link, counter, device=index,
                               key=f"nvmlDeviceGetNvLinkErrorCounter:{name}:{link}")
                if v is not NA:
                    out[name] = out.get(name, 0) + int(v)
        return out


def _text(value: Any) -> str:
    if value is NA or value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


def _describe(error: Exception) -> str:
    text = str(error) or type(error).__name__
    name = type(error).__name__
    if "DriverNotLoaded" in name or "Driver Not Loaded" in text:
        return "the NVIDIA driver is not loaded (no GPU on this node, or the container lacks the NVIDIA runtime)"
    if "LibraryNotFound" in name or "Library Not Found" in text:
        return LIBRARY_NOT_FOUND
    if "NoPermission" in name:
        return "no permission to access the GPU devices"
    return text
