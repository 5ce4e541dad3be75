"""Foreign metrics (a workload's own instrumentation) never carry a name Prometheus keeps for itself, nor one
outside its grammar: renamed `exported_<name>`, or left out, each said and counted. The end-to-end check with a
real Prometheus is tests/integration/test_reserved_names_scrape.py."""

from __future__ import annotations

from outrider.metrics.exposition import render
from outrider.metrics.foreign import ForeignDefinitions, ForeignMetric, public_names
from tests.helpers import samples


def test_reserved_names_and_labels_are_exported_and_renamed_apart() -> None:
    assert public_names("up", ()) == ("exported_up", (), "exported as exported_up")
    assert public_names("ok", ("__name__", "exported___name__", "a")) == (
        "ok", ("exported_exported___name__", "exported___name__", "a"),
        "label __name__ exported as exported_exported___name__"), "never onto a label the metric has"
    assert public_names("ok", ("a", "le"))[2] == "", "nothing to rename"


def test_a_renamed_metric_meeting_another_of_that_name_and_names_outside_the_grammar_are_left_out() -> None:
    dropped: dict[str, str] = {}
    metrics = {"up": ForeignMetric("gauge", "", (), values={(): 0.0}),
               "exported_up": ForeignMetric("gauge", "", (), values={(): 7.0}),
               "bad name": ForeignMetric("gauge", "", (), values={(): 1.0}),
               "twice": ForeignMetric("gauge", "", ("a", "a"), values={("1", "2"): 1.0}),
               "quote": ForeignMetric("gauge", "", ('a"b',), values={("1",): 1.0}),
               "w": ForeignMetric("gauge", "", ("__name__",), values={("x",): 1.0})}
    fams = ForeignDefinitions("test", "help").families(metrics, 100, dropped.__setitem__)
    got = samples(render(fams).decode())
    assert got == {("exported_up", ()): 7.0, ("w", (("exported___name__", "x"),)): 1.0}
    assert set(dropped) == {"collision:up", "renamed:up", "renamed:w", "invalid:bad name", "invalid:twice",
                            "invalid:quote"}
    otel = {f.defn.name: f.defn.otel_name for f in fams}
    assert otel == {"exported_up": "exported_up", "w": "w"}, "OTLP names are renamed alike"
