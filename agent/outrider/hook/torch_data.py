"""Data wait with zero configuration: every DataLoader iterator's `__next__` is timed, for every loader of the
torch the user imported (single-process and multi-worker alike: both inherit `_BaseDataLoaderIter.__next__`).

The patched `__next__` stores when the wait began and ended in the hook's data-wait ring (hook/state.DataWaitState:
the same ring the explicit `outrider.dataloader()` wrapper writes) and adds the batch's size to a running total,
from which samples/s is published with zero configuration until the user counts samples (`outrider.step(samples=)`,
`count_samples()`); nothing else: no lock, no allocation.

The batch's size is `batch_size()`, the first dimension of its first tensor, measured on an iterator's first batch
and its last; its tokens, `batch_tokens()`, the elements of a tokenizer batch's `input_ids` (published as the
tokens until the user counts them), on every batch of an iterator whose batches carry them. Between them the size
is known without looking (`fixed_batches`): where the loader batches a map-style dataset with torch's own
`BatchSampler`, in order, and the first batch measured the sampler's batch size, every batch but the last holds
exactly that many samples. Any other loader (an iterable dataset, a batch sampler of its own, `in_order=False`, a
collate that changes the first dimension) has every batch measured. Looking costs 5 µs of the step's CPU inside a
training loop (benchmarks/step_cpu.py), knowing a few attribute reads. A call
that raises (StopIteration at the end of an epoch, an error in the dataset) records nothing and the exception
reaches the user unchanged. The wrapper sees the mark on the patched method and leaves the timing to it, so a
wrapped DataLoader is never counted twice.

While a multi-worker iterator starts its workers, the data-wait state says so (starting_workers): the forked workers
then go dormant (hook/api.py) instead of each publishing a shard for their parent's rank.

A torch whose DataLoader has not these classes (a future version) is said once and left alone: the wrapper still
works.
"""

from __future__ import annotations

import functools
import logging
from collections import UserDict
from collections.abc import Callable
from time import perf_counter
from typing import Any

from outrider.hook.state import DataWaitState, Ring

LOG = logging.getLogger("outrider.hook")
TIMED_MARK = "__outrider_timed__"
LOOKED_AT = 8  # items of a tuple, list or dict looked at for the first tensor
FIXED = "_outrider_fixed_batches"  # on an iterator: (batch size, batches) from fixed_batches(), or False
# ... or this, for an iterator whose batches carry tokens (measured every batch): never a fixed batch (no batch is
# below -1), so the fixed path's test stays as it was
CARRYING = (0, -1)
MAP_DATASET = 0  # torch.utils.data.dataloader._DatasetKind.Map


def batch_size(batch: Any) -> int:
    """The number of samples in a batch as a DataLoader yields it: the first dimension of its first tensor (the
    batch itself, or the first item of a tuple, list or dict of them that has a shape: default_collate's
    `[inputs, labels]`, a tokenizer's `{"input_ids": ...}`); 0 where there is none (a list of strings, a custom
    object, a 0-d tensor). Well under a microsecond beside the tens of microseconds a batch costs; never raises."""
    try:
        # containers first: a failed attribute lookup (a list's `shape`) costs more than the isinstance checks
        if isinstance(batch, (tuple, list, dict)):
            shape = None
            for n, item in enumerate(batch.values() if isinstance(batch, dict) else batch):
                shape = getattr(item, "shape", None)
                if shape is not None or n + 1 >= LOOKED_AT:
                    break
        else:
            shape = getattr(batch, "shape", None)
        return int(shape[0]) if shape is not None and len(shape) else 0
    except Exception:
        return 0


def batch_tokens(batch: Any) -> int:
    """The tokens a batch carries: the elements of its `input_ids` where it is a dict of tensors (a tokenizer's
    batch: a dict, or transformers' BatchEncoding, a UserDict) and that one has two dimensions or more (batch and
    sequence: padding included, as the model runs it); 0 otherwise. Never raises."""
    try:
        if not isinstance(batch, (dict, UserDict)):
            return 0
        shape = getattr(batch.get("input_ids"), "shape", None)
        return int(shape[0]) * int(shape[1]) if shape is not None and len(shape) >= 2 else 0
    except Exception:
        return 0


def fixed_batches(iterator: Any, measured: int, batch_sampler: Any) -> tuple[int, int] | bool:
    """(batch size, batches) of an iterator whose batches but the last hold exactly the batch size, given its first
    batch's measured size; False where that is not known (then every batch is measured). Never raises."""
    try:
        sampler = iterator._index_sampler
        if (type(sampler) is batch_sampler and iterator._dataset_kind == MAP_DATASET and iterator._auto_collation
                and getattr(iterator, "_in_order", True) is True and measured == sampler.batch_size
                and isinstance(iterator._num_yielded, int)):
            return measured, len(sampler)
    except Exception:
        pass
    return False


class DataLoaderTimer:
    def __init__(self, waits: DataWaitState, dataloader_module: Any,
                 clock: Callable[[], float] = perf_counter) -> None:
        """waits: the hook's data-wait state (its ring, the batches' samples, the workers' start);
        dataloader_module: torch.utils.data.dataloader."""
        self.waits = waits
        self.clock = clock
        self.base = dataloader_module._BaseDataLoaderIter
        self.multi = dataloader_module._MultiProcessingDataLoaderIter
        self.batch_sampler = dataloader_module.BatchSampler
        self.original_next = self.base.__dict__["__next__"]
        self.original_init = self.multi.__dict__["__init__"]
        if getattr(self.original_next, TIMED_MARK, False):
            raise RuntimeError("DataLoader iterators are already timed by another Outrider hook")
        self.base.__next__ = self._timed_next()
        self.multi.__init__ = self._marking_init()

    def _timed_next(self) -> Callable[[Any], Any]:
        waits = self.waits

        # Everything it touches is bound as a default argument: local loads, the cheapest there are (this runs
        # once per batch of every loader)
        @functools.wraps(self.original_next)
        def __next__(self: Any, _original: Callable[[Any], Any] = self.original_next, _waits: DataWaitState = waits,
                     _ring: Ring = waits.ring, _slots: list[float] = waits.ring.slots, _mask: int = waits.ring.mask,
                     _clock: Callable[[], float] = self.clock, _size: Callable[[Any], int] = batch_size,
                     _tokens: Callable[[Any], int] = batch_tokens,
                     _fixed: Callable[[Any, int, Any], tuple[int, int] | bool] = fixed_batches,
                     _sampler: Any = self.batch_sampler, _key: str = FIXED,
                     _carrying: tuple[int, int] = CARRYING) -> Any:
            t0 = _clock()
            batch = _original(self)
            n = _ring.n
            j = (n & _mask) << 1  # the wait's (begin, end) side by side: one cache line
            _slots[j] = t0
            _slots[j + 1] = _clock()
            _ring.n = n + 1
            try:
                known = getattr(self, _key, None)
                if known and self._num_yielded < known[1]:  # not the last batch of a fixed-size sampler
                    _waits.batch_samples += known[0]
                else:
                    size = _size(batch)
                    _waits.batch_samples += size
                    if known is None or known is _carrying:  # an iterator's first batch, or one of tokens
                        tokens = _tokens(batch)
                        _waits.batch_tokens += tokens
                        if known is None:
                            # batches of tokens are measured every time: their padded length varies
                            setattr(self, _key, _carrying if tokens else _fixed(self, size, _sampler))
            except Exception:  # an iterator of its own kind that takes no attribute: its batches are not counted
                pass
            return batch

        setattr(__next__, TIMED_MARK, True)
        return __next__

    def _marking_init(self) -> Callable[..., None]:
        original, waits = self.original_init, self.waits

        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            waits.starting_workers = True  # a process forked now is a DataLoader worker
            try:
                original(self, *args, **kwargs)
            finally:
                waits.starting_workers = False

        return __init__

    def detach(self) -> None:
        """Put torch's own methods back (tests, and a hook that is replaced). Idempotent."""
        if getattr(self.base.__dict__.get("__next__"), TIMED_MARK, False):
            self.base.__next__ = self.original_next
            self.multi.__init__ = self.original_init


def attach(waits: DataWaitState, torch: Any) -> DataLoaderTimer | None:
    try:
        module = torch.utils.data.dataloader
        return DataLoaderTimer(waits, module)
    except Exception as e:
        LOG.warning("outrider: cannot time DataLoader waits automatically in this torch (%s); wrap loaders in "
                    "outrider.dataloader() to measure them", e)
        return None
