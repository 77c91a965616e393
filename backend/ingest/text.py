"""Text every database can store: NUL characters and invalid UTF-8 replaced (U+FFFD), counted.

PostgreSQL refuses NUL in text columns and a driver cannot encode a lone surrogate: one such
string in one attribute failed the whole batch. upb refuses a protobuf string field that is
not UTF-8 (the whole request): such a request is re-read with every string field as bytes.
"""

import threading
from functools import cache

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb

REPLACEMENT = "\ufffd"
_counts = threading.local()
"""Strings replaced in the request this thread is decoding (decode() resets and reads it)."""


def replaced() -> int:
    """Strings replaced so far in this thread (a running count: callers take differences)."""
    return getattr(_counts, "replaced", 0)


def count(strings: int) -> None:
    _counts.replaced = replaced() + strings


def safe(text: str) -> str:
    """text with NUL characters replaced (counted). Lone surrogates cannot get this far:
    upb refuses them, and decoded bytes are valid UTF-8 by construction."""
    if "\x00" in text:
        count(1)
        return text.replace("\x00", REPLACEMENT)
    return text


def parsed(repairs: int) -> None:
    """How many strings parsing this thread's request repaired (decode() takes it)."""
    _counts.parsed = repairs


def take_parsed() -> int:
    repairs, _counts.parsed = getattr(_counts, "parsed", 0), 0
    return repairs


def utf8(body: bytes) -> str:
    """body as text, invalid UTF-8 replaced (a parse repair)."""
    try:
        return body.decode()
    except UnicodeDecodeError:
        fixed = body.decode(errors="replace")
        parsed(fixed.count(REPLACEMENT) - body.count(REPLACEMENT.encode()))
        return fixed


def repaired_protobuf(body: bytes) -> tuple[bytes, int]:
    """An ExportTraceServiceRequest whose string fields are made valid UTF-8, and how many
    were not. DecodeError if it is not a protobuf message even read as bytes."""
    lenient = _lenient_class().FromString(body)
    repairs = _repair(lenient)
    return lenient.SerializeToString(), repairs


def _repair(message) -> int:
    repairs = 0
    for field, value in message.ListFields():
        if field.type == field.TYPE_MESSAGE:
            items = value if _is_repeated(field) else [value]
            repairs += sum(_repair(item) for item in items)
        elif field.type == field.TYPE_BYTES and field.name in _strings_of(message.DESCRIPTOR):
            if _is_repeated(field):
                continue  # OTLP has no repeated string field
            fixed = value.decode(errors="replace").encode()
            if fixed != value:
                setattr(message, field.name, fixed)
                repairs += 1
    return repairs


def _is_repeated(field) -> bool:
    return field.is_repeated


@cache
def _strings_of(descriptor) -> frozenset[str]:
    """The fields of this (lenient) message that are strings in the real schema."""
    real = pb.DESCRIPTOR.pool.FindMessageTypeByName(descriptor.full_name)
    return frozenset(f.name for f in real.fields if f.type == f.TYPE_STRING)


@cache
def _lenient_class():
    """ExportTraceServiceRequest with every string field declared as bytes (the same wire
    format), in a pool of its own."""
    pool = descriptor_pool.DescriptorPool()
    for file in _files(pb.DESCRIPTOR):
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        for message in _all_messages(proto.message_type):
            for field in message.field:
                if field.type == field.TYPE_STRING:
                    field.type = field.TYPE_BYTES
        pool.Add(proto)
    name = pb.ExportTraceServiceRequest.DESCRIPTOR.full_name
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def _files(file, seen=None) -> list:
    """file and its dependencies, dependencies first."""
    seen = {} if seen is None else seen
    for dependency in file.dependencies:
        _files(dependency, seen)
    seen.setdefault(file.name, file)
    return list(seen.values())


def _all_messages(messages):
    for message in messages:
        yield message
        yield from _all_messages(message.nested_type)
