"""`outrider top`'s reads of /metrics: the protobuf exposition read as the text format reads, with each histogram
family's sketch beside it, so that a percentile over a window is the sketches' difference's (10 ms and 20 ms steps
told apart); the text format where the agent answers with it; and an answer that is not a page (garbled, endless,
dripping) an error top says, not a crash or a wait without end."""

from __future__ import annotations

import contextlib
import http.server
import math
import threading
from collections.abc import Iterator

import pytest

from outrider.commands import top
from outrider.metrics.exposition import PROTOBUF_CONTENT_TYPE, TEXT_CONTENT_TYPE
from outrider.metrics.exposition import render as render_text
from outrider.metrics.family import Family, HistogramValue
from outrider.metrics.protobuf_exposition import render
from outrider.metrics.quantile import histogram_quantile
from outrider.metrics.wire import varint
from outrider.shared.sketch import RELATIVE_ERROR, Sketch
from tests.prometheus_model import MetricFamily
from tests.servers import HostilePeer

STEP = "outrider_train_step_duration_seconds"
BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1)
FAST = [0.0101 + 0.00001 * (i % 7) for i in range(300)]  # 10 ms steps
SLOW = [0.0201 + 0.00001 * (i % 5) for i in range(110)]  # 20 ms steps


def steps(values: list[float], sketched: bool = True) -> HistogramValue:
    counts = [0] * (len(BOUNDS) + 1)
    for v in values:
        counts[sum(1 for b in BOUNDS if b < v)] += 1
    return HistogramValue(BOUNDS, tuple(counts), sum(values), Sketch.of_values(values) if sketched else None)


def page(*ranks: HistogramValue) -> list[Family]:
    fam = Family(STEP)
    for rank, h in enumerate(ranks):
        fam.add(h, *[str(rank) if n == "rank" else "" for n in fam.defn.label_names])
    return [fam, Family("outrider_train_steps_total").add(sum(h.count for h in ranks),
                                                          *[""] * Family("outrider_train_steps_total").defn.arity)]


def read(fams: list[Family], protobuf: bool = True) -> dict[top.Sample, float]:
    if protobuf:
        return top.parse(render(fams), PROTOBUF_CONTENT_TYPE)
    return top.parse(render_text(fams), TEXT_CONTENT_TYPE)


def nearest_rank(values: list[float], q: float) -> float:
    """The value of rank ceil(q * n), as the sketch ranks."""
    return sorted(values)[max(1, math.ceil(q * len(values))) - 1]


def test_a_protobuf_read_is_the_text_reads_samples_and_the_sketch_of_every_series() -> None:
    fams = page(steps(FAST[:200] + SLOW[:10]), steps(FAST[200:] + SLOW[10:]))
    pb, text = read(fams), read(fams, protobuf=False)
    assert {k: v for k, v in pb.items() if not k[0].endswith(top.SKETCH)} == text
    h = top.histogram(pb, STEP)
    assert h is not None and h.sketch == Sketch.of_values(FAST + SLOW), "the two ranks' sketches summed"
    classic = top.histogram(text, STEP)
    assert classic is not None and classic.sketch is None and (classic.bounds, classic.counts) == (h.bounds, h.counts)


def test_the_percentiles_of_a_window_are_its_steps_to_within_the_sketchs_error() -> None:
    """300 steps of 10 ms, then a window of 110 of 20 ms and 90 of 10 ms: over the window p25 is 10 ms, p50 and p99
    20 ms, as its steps' own (over the whole run p50 is 10 ms: the window is the sketches' difference). Classic
    buckets put both durations in (10 ms, 25 ms] and answer 13.75, 17.5 and 24.9 ms."""
    before = FAST
    window = SLOW + FAST[:90]
    for protobuf in (True, False):
        old, new = read(page(steps(before)), protobuf), read(page(steps(before + window)), protobuf)
        for q in (0.25, 0.5, 0.99):
            got = top.delta_quantile(new, old, STEP, q)
            assert got is not None
            ratio = got / nearest_rank(window, q)
            if protobuf:
                assert abs(ratio - 1) <= RELATIVE_ERROR, (q, ratio)
            else:
                classic = histogram_quantile(q, steps(before + window).since(steps(before)))
                assert got == classic and abs(ratio - 1) > 0.05, (q, ratio)


def test_a_family_with_a_series_without_its_sketch_has_no_sketch_in_the_read() -> None:
    pb = read(page(steps(FAST), steps(SLOW, sketched=False)))
    assert not [k for k in pb if k[0].endswith(top.SKETCH)]
    h = top.histogram(pb, STEP)
    assert h is not None and h.sketch is None and h.count == len(FAST) + len(SLOW)


def test_an_earlier_read_without_the_sketch_leaves_the_window_to_the_classic_buckets() -> None:
    """An agent upgraded between two reads: the window cannot subtract a sketch it never saw."""
    old, new = read(page(steps(FAST)), protobuf=False), read(page(steps(FAST + SLOW)))
    got = top.delta_quantile(new, old, STEP, 0.5)
    assert got == histogram_quantile(0.5, steps(FAST + SLOW).since(steps(FAST)))


@contextlib.contextmanager
def answering(body: bytes, content_type: str) -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_garbled_protobuf_page_is_an_error_top_says(capsys: pytest.CaptureFixture[str]) -> None:
    good = render(page(steps(FAST)))
    with answering(good[: len(good) // 2], PROTOBUF_CONTENT_TYPE) as url:
        with pytest.raises(top.UnreadablePage, match="not a protobuf exposition: family 1"):
            top.fetch(url)
        assert top.run_top(url, interval_s=0.1, once=True) == 1
    assert "cannot read" in capsys.readouterr().err
    with answering(good, PROTOBUF_CONTENT_TYPE) as url:
        assert top.fetch(url) == read(page(steps(FAST)))


def test_a_text_answer_is_read_as_text() -> None:
    fams = page(steps(FAST))
    with answering(render_text(fams), TEXT_CONTENT_TYPE) as url:
        assert top.fetch(url) == read(fams, protobuf=False)


def test_an_endless_page_is_not_read_past_the_limit() -> None:
    peer = HostilePeer("flood")
    try:
        with pytest.raises(top.UnreadablePage, match="a page over"):
            top.fetch(peer.start())
    finally:
        peer.close()
    assert peer.sent_bytes < 1 << 30


def test_an_answer_that_drips_is_given_up_at_the_read_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(top, "READ_LIMIT_S", 0.5)  # the peer takes 11.5 s to send its 46 bytes
    peer = HostilePeer("trickle")
    try:
        with pytest.raises(top.UnreadablePage, match=r"no whole answer within 0\.5 s"):
            top.fetch(peer.start())
    finally:
        peer.close()


def test_a_family_named_like_a_sketchs_bucket_is_left_out() -> None:
    """A protobuf page may name a family anything; one with a space in its name is no metric, and taken in it would
    pass for the step histogram's sketch (a NaN count, no bucket label)."""
    impostor = MetricFamily(name=STEP + top.SKETCH, type=1)
    impostor.metric.add().gauge.value = math.nan
    body = impostor.SerializeToString()
    m = top.parse(render(page(steps(FAST))) + varint(len(body)) + body, PROTOBUF_CONTENT_TYPE)
    h = top.histogram(m, STEP)
    assert h is not None and h.sketch == Sketch.of_values(FAST)
