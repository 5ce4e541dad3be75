"""Tokens with zero configuration: a DataLoader's tokenizer batches (a dict with `input_ids`) are counted as the
tokens, every batch (their padded length varies), until the job counts its own."""

from __future__ import annotations

from collections import UserDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import outrider
from outrider.hook.runtime import Hook
from outrider.hook.torch_data import batch_tokens
from tests.helpers import value
from tests.hook.torch_hook import read, torch_hooked

torch = pytest.importorskip("torch")


@pytest.fixture
def hooked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hook]:
    with torch_hooked(tmp_path, monkeypatch) as hook:
        yield hook


class Sentences(torch.utils.data.Dataset):  # type: ignore[misc]
    """Tokenised sentences of lengths 3 to 9, padded per batch as a collator pads them."""

    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int) -> Any:
        return i


def pad(items: list[int]) -> dict[str, Any]:
    longest = max(3 + i % 7 for i in items)
    return {"input_ids": torch.zeros(len(items), longest, dtype=torch.long),
            "attention_mask": torch.ones(len(items), longest, dtype=torch.long)}


def train(loader: Any, tokens: bool = False) -> int:
    model = torch.nn.Embedding(10, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    carried = 0
    for batch in loader:
        ids = batch["input_ids"]
        carried += ids.numel()
        opt.zero_grad()
        if tokens:
            with outrider.step(tokens=ids.numel() - 1):
                model(ids).sum().backward()
                opt.step()
        else:
            model(ids).sum().backward()
            opt.step()
    return carried


def test_the_tokens_a_loaders_batches_carry_are_counted_every_batch(tmp_path: Path, hooked: Hook) -> None:
    carried = train(torch.utils.data.DataLoader(Sentences(), batch_size=4, collate_fn=pad))
    parsed = read(tmp_path, hooked)
    assert value(parsed, "outrider_tokens_total", rank="") == carried
    assert value(parsed, "outrider_samples_total", rank="") == 20


def test_tokens_the_steps_count_replace_the_batches(tmp_path: Path, hooked: Hook) -> None:
    train(torch.utils.data.DataLoader(Sentences(), batch_size=4, collate_fn=pad), tokens=True)
    parsed = read(tmp_path, hooked)
    declared = sum(4 * max(3 + i % 7 for i in range(k, k + 4)) - 1 for k in range(0, 20, 4))
    assert value(parsed, "outrider_tokens_total", rank="") == declared


@pytest.mark.parametrize(("batch", "tokens"), [
    ({"input_ids": torch.zeros(4, 7)}, 28), (UserDict({"input_ids": torch.zeros(2, 5, 3)}), 10),
    ({"input_ids": torch.zeros(4)}, 0), ((torch.zeros(4, 7), torch.zeros(4)), 0), (torch.zeros(4, 7), 0),
    ({"pixels": torch.zeros(4, 7)}, 0), ({"input_ids": [[1, 2], [3, 4]]}, 0),
])
def test_a_batch_carries_tokens_only_as_a_tokenizers_input_ids(batch: Any, tokens: int) -> None:
    assert batch_tokens(batch) == tokens
