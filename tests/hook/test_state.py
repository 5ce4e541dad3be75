"""The hook's state parts (hook/state.py): the ring the step and data-wait paths write and the publisher drains, and
what each part keeps of a parent across a fork."""

from __future__ import annotations

import pytest

from outrider.hook.state import DataWaitState, LoopAccounting, Ring, StepState


def test_a_ring_drains_what_was_written_since_the_last_drain_in_order() -> None:
    ring = Ring(4)
    for k in range(3):
        ring.put(float(k), k + 0.5)
    first, n = ring.pending()
    assert (first, n) == (0, 3)
    assert list(ring.entries(first, n)) == [(0.0, 0.5), (1.0, 1.5), (2.0, 2.5)]
    ring.drained = n
    ring.put(3.0, 3.5)
    ring.put(4.0, 4.5)  # wraps to the first place
    first, n = ring.pending()
    assert list(ring.entries(first, n)) == [(3.0, 3.5), (4.0, 4.5)]
    assert ring.end_of(4) == 4.5


def test_a_lapped_ring_drains_the_entries_it_still_holds_and_keeps_the_count() -> None:
    ring = Ring(4)
    for k in range(10):
        ring.put(float(k), float(k))
    first, n = ring.pending()
    assert n == 10, "the count is exact however far the ring laps"
    assert first == 6, "only the newest four entries are still held"
    assert [b for b, _ in ring.entries(first, n)] == [6.0, 7.0, 8.0, 9.0]


def test_the_hot_paths_inline_write_is_the_rings_put() -> None:
    """api.py's step paths and torch_data's __next__ write (n & mask) << 1 and the slot after it by hand."""
    by_put, by_hand = Ring(8), Ring(8)
    for k in range(13):
        by_put.put(k, k + 0.25)
        n = by_hand.n
        j = (n & by_hand.mask) << 1
        by_hand.slots[j] = k
        by_hand.slots[j + 1] = k + 0.25
        by_hand.n = n + 1
    assert by_put.slots == by_hand.slots and by_put.n == by_hand.n


@pytest.mark.parametrize("size", [0, 3, 4095, -4])
def test_a_ring_is_sized_to_a_power_of_two(size: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        Ring(size)


def test_a_forked_child_drains_none_of_its_parents_entries() -> None:
    steps, waits, loop = StepState(), DataWaitState(), LoopAccounting()
    steps.ring.put(0.0, 1.0)
    steps.sample_sum, steps.token_sum, steps.loop_tid, steps.begin = 8, 9, 1234, 5.0
    waits.ring.put(0.5, 0.75)
    waits.batch_samples = 8
    loop.collectives.append((0.0, 1.0, "all_reduce", True))
    loop.checkpoints.append((0.0, 1.0))
    account = loop.account
    steps.after_fork_in_child()
    waits.after_fork_in_child()
    loop.after_fork_in_child()
    assert steps.ring.pending() == (1, 1) and waits.ring.pending() == (1, 1)
    assert (steps.samples_drained, steps.tokens_drained, steps.loop_tid, steps.begin) == (8, 9, 0, 0.0)
    assert waits.batch_drained == 8
    assert not loop.collectives and not loop.checkpoints and loop.account is not account
