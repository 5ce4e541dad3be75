"""Prometheus's exposition messages (io.prometheus.client, client_model's metrics.proto: the fields Prometheus
2.42 reads) as real protobuf classes, built here from a descriptor with the protobuf runtime, so the agent's
hand-written encoder is read back by protobuf's own parser, not by code of the agent's.

`parse_exposition(body)` reads a delimited page (each MetricFamily after its varint length) with
google.protobuf.proto.parse_length_prefixed.
"""

from __future__ import annotations

import io
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, proto

F = descriptor_pb2.FieldDescriptorProto
OPTIONAL, REPEATED = F.LABEL_OPTIONAL, F.LABEL_REPEATED


def _message(file: descriptor_pb2.FileDescriptorProto, name: str,
             fields: list[tuple[str, int, int, int, str]]) -> None:
    """fields: (name, number, type, label, message type name or "")."""
    m = file.message_type.add(name=name)
    for field_name, number, kind, label, type_name in fields:
        f = m.field.add(name=field_name, number=number, type=kind, label=label)
        if type_name:
            f.type_name = f".io.prometheus.client.{type_name}"


def _file() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(name="outrider_test/prometheus_metrics.proto",
                                              package="io.prometheus.client", syntax="proto2")
    enum = file.enum_type.add(name="MetricType")
    for i, name in enumerate(["COUNTER", "GAUGE", "SUMMARY", "UNTYPED", "HISTOGRAM", "GAUGE_HISTOGRAM"]):
        enum.value.add(name=name, number=i)
    _message(file, "LabelPair", [("name", 1, F.TYPE_STRING, OPTIONAL, ""), ("value", 2, F.TYPE_STRING, OPTIONAL, "")])
    _message(file, "Gauge", [("value", 1, F.TYPE_DOUBLE, OPTIONAL, "")])
    _message(file, "Counter", [("value", 1, F.TYPE_DOUBLE, OPTIONAL, "")])
    _message(file, "Untyped", [("value", 1, F.TYPE_DOUBLE, OPTIONAL, "")])
    _message(file, "Bucket", [("cumulative_count", 1, F.TYPE_UINT64, OPTIONAL, ""),
                              ("upper_bound", 2, F.TYPE_DOUBLE, OPTIONAL, ""),
                              ("cumulative_count_float", 4, F.TYPE_DOUBLE, OPTIONAL, "")])
    _message(file, "BucketSpan", [("offset", 1, F.TYPE_SINT32, OPTIONAL, ""),
                                  ("length", 2, F.TYPE_UINT32, OPTIONAL, "")])
    _message(file, "Histogram", [
        ("sample_count", 1, F.TYPE_UINT64, OPTIONAL, ""), ("sample_sum", 2, F.TYPE_DOUBLE, OPTIONAL, ""),
        ("bucket", 3, F.TYPE_MESSAGE, REPEATED, "Bucket"), ("sample_count_float", 4, F.TYPE_DOUBLE, OPTIONAL, ""),
        ("schema", 5, F.TYPE_SINT32, OPTIONAL, ""), ("zero_threshold", 6, F.TYPE_DOUBLE, OPTIONAL, ""),
        ("zero_count", 7, F.TYPE_UINT64, OPTIONAL, ""), ("zero_count_float", 8, F.TYPE_DOUBLE, OPTIONAL, ""),
        ("negative_span", 9, F.TYPE_MESSAGE, REPEATED, "BucketSpan"),
        ("negative_delta", 10, F.TYPE_SINT64, REPEATED, ""), ("negative_count", 11, F.TYPE_DOUBLE, REPEATED, ""),
        ("positive_span", 12, F.TYPE_MESSAGE, REPEATED, "BucketSpan"),
        ("positive_delta", 13, F.TYPE_SINT64, REPEATED, ""), ("positive_count", 14, F.TYPE_DOUBLE, REPEATED, "")])
    _message(file, "Metric", [
        ("label", 1, F.TYPE_MESSAGE, REPEATED, "LabelPair"), ("gauge", 2, F.TYPE_MESSAGE, OPTIONAL, "Gauge"),
        ("counter", 3, F.TYPE_MESSAGE, OPTIONAL, "Counter"), ("untyped", 5, F.TYPE_MESSAGE, OPTIONAL, "Untyped"),
        ("timestamp_ms", 6, F.TYPE_INT64, OPTIONAL, ""), ("histogram", 7, F.TYPE_MESSAGE, OPTIONAL, "Histogram")])
    _message(file, "MetricFamily", [
        ("name", 1, F.TYPE_STRING, OPTIONAL, ""), ("help", 2, F.TYPE_STRING, OPTIONAL, ""),
        ("type", 3, F.TYPE_ENUM, OPTIONAL, "MetricType"), ("metric", 4, F.TYPE_MESSAGE, REPEATED, "Metric")])
    return file


_pool = descriptor_pool.DescriptorPool()
_pool.Add(_file())
MetricFamily: Any = message_factory.GetMessageClass(_pool.FindMessageTypeByName("io.prometheus.client.MetricFamily"))
COUNTER, GAUGE, HISTOGRAM = 0, 1, 4


def parse_exposition(body: bytes) -> list[Any]:
    """The MetricFamily messages of a delimited protobuf page; every byte of it must belong to one."""
    stream = io.BytesIO(body)
    out = []
    while stream.tell() < len(body):
        out.append(proto.parse_length_prefixed(MetricFamily, stream))
    return out


def native_buckets(h: Any) -> dict[int, int]:
    """A native histogram's positive buckets, {Prometheus bucket index: count}, from its spans and deltas, zero
    counts left out."""
    out: dict[int, int] = {}
    index, count, deltas = 0, 0, iter(h.positive_delta)
    for n, span in enumerate(h.positive_span):
        index += span.offset if n == 0 else span.offset + 1
        for k in range(span.length):
            count += next(deltas)
            if count:
                out[index + k] = count
        index += span.length - 1
    assert next(deltas, None) is None, "as many deltas as the spans' buckets"
    return out
