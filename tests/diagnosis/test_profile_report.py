"""The loop's profile from the agent's families to the run's summary and report: shares and hottest lines summed
over ranks, kept through the record's JSON, shown in the HTML report and the summary's lines."""

from __future__ import annotations

import json
from dataclasses import asdict

from outrider.diagnosis.profile import loop_profile
from outrider.metrics.family import Family, HistogramValue
from outrider.runs.measured import Measured, measure
from outrider.runs.report import render
from outrider.runs.store import RunRecord


def families() -> list[Family]:
    samples = Family("outrider_train_loop_samples_total")
    frames = Family("outrider_train_loop_frame_samples_total")
    for rank, (python, native) in {"0": (60.0, 30.0), "1": (50.0, 60.0)}.items():
        samples.add(python, rank, "", "python").add(native, rank, "", "native")
        frames.add(python - 20, rank, "", "python", "proj/train.py:42 tokenize")
        frames.add(native, rank, "", "native", "torch/nn/modules/linear.py:125 forward")
    step = Family("outrider_train_step_duration_seconds").add(HistogramValue((1.0,), (10, 0), 5.0), "0", "")
    return [samples, frames, step]


def test_profile_summed_over_ranks_through_json_into_the_report() -> None:
    p = loop_profile(families())
    assert p is not None and p.samples == 200.0 and p.where == {"python": 110.0, "native": 90.0}
    assert p.frames[0] == ("native", "torch/nn/modules/linear.py:125 forward", 90.0)
    assert p.shares() == [("python", 0.55), ("native", 0.45)]
    m = measure(families())
    back = Measured.from_json(json.loads(json.dumps(asdict(m))))
    assert back.profile == p, "the summary's JSON keeps the profile"
    rows = dict(back.profile_rows())
    assert "python 55%, native 45%" in rows["loop"] and "proj/train.py:42 tokenize (python, 35%)" in rows[""]
    rec = RunRecord("r1", ["python", "train.py"], 0.0, 10.0, 0, {"measured": asdict(m)})
    page = render(rec)
    assert 'id="profile"' in page and "proj/train.py:42 tokenize" in page and "200 samples" in page
    assert loop_profile([]) is None
    empty = RunRecord("r2", ["true"], 0.0, 1.0, 0, {})
    assert "No stack samples" in render(empty)
