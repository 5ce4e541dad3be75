"""The one module that talks to NVML (through nvidia-ml-py's ctypes bindings).

- Lazy: nothing loads until the first init(); a missing library or driver is a state, not an exception.
- query(fn, *args) returns NA where a reading is not available: a function this driver lacks (logged once per
  function), a reading the device does not support (remembered per device, so it is not asked again), any other
  NVML error (counted). A lost GPU raises GpuLost, which the collector turns into its up gauge.
- Versioned functions are probed newest first (`_v3`, then `_v2`).
- Static facts (name, UUID, total memory, power limit, maximum clocks) are read once per device and cached.
- After a driver failure (uninitialised, driver not loaded, unknown error), re-init is tried with exponential
  backoff; the collector reports NVML down meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from outrider.logs import LogOnce

LOG = logging.getLogger("outrider.nvml")


class _NA:
    def __repr__(self) -> str:
        return "NA"

    def __bool__(self) -> bool:
        return False


NA: Any = _NA()


class GpuLost(Exception):
    """NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus (or needs a reset)."""


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
        self._once = LogOnce(LOG)
        self._lock = threading.Lock()

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
                    import pynvml

                    if self.library_path:  # load a specific library (a test fake, an unusual install path)
                        import ctypes

                        pynvml.nvmlLib = ctypes.CDLL(self.library_path)
                        pynvml._nvmlGetFunctionPointer_cache.clear()  # pointers into any library loaded before
                    self.lib = pynvml
                self.lib.nvmlInit()
                self.initialized = True
                self._backoff = self.MIN_RETRY_S
                if self.unavailable_reason:
                    LOG.info("NVML available again")
                self.unavailable_reason = ""
                self._handles.clear()
                return True
            except ImportError as e:
                reason = f"nvidia-ml-py is not installed ({e})"
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

    def shutdown(self) -> None:
        if self.initialized and self.lib is not None:
            with contextlib.suppress(Exception):
                self.lib.nvmlShutdown()
            self.initialized = False

    # --- calls -----------------------------------------------------------------------------------------------
    def has(self, fn: str) -> bool:
        return fn not in self._missing and self.lib is not None and hasattr(self.lib, fn)

    def query(self, fn: str, *args: Any, device: int = -1, key: str | None = None) -> Any:
        """Call pynvml.FN(*args). NA where unavailable; GpuLost for a lost GPU. Never raises anything else.

        `key` names the capability for the missing/unsupported memory when one binding covers several driver
        symbols (nvmlDeviceGetMemoryInfo with a version calls nvmlDeviceGetMemoryInfo_v2)."""
        cap = key or fn
        if (cap, device) in self._unsupported or cap in self._missing:
            return NA
        lib = self.lib
        func: Callable[..., Any] | None = getattr(lib, fn, None)
        if func is None:
            self._missing.add(cap)
            self._once.warning(fn, "NVML binding %s is not available; its metrics are left out", fn)
            return NA
        self.calls += 1
        try:
            return func(*args)
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
            self.errors += 1
            self._once.warning(f"{fn}:{type(e).__name__}", "NVML %s failed: %s (counted)", fn, e)
            return NA
        except Exception as e:  # a binding mismatch or a ctypes error must not take the sweep down
            self.errors += 1
            self._once.warning(f"{fn}:{type(e).__name__}", "NVML %s raised %s: %s (counted)", fn, type(e).__name__, e)
            return NA

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
        return "libnvidia-ml.so.1 was not found (no NVIDIA driver, or it is not mounted into this container)"
    if "NoPermission" in name:
        return "no permission to access the GPU devices"
    return text
