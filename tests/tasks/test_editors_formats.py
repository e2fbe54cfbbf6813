"""Editor steps over body formats: transcode, transform, validate, enrich, partition, batch.

Every step is built with ``build_step`` and run with ``run_chain`` so the error paths are the
real ones: dead-letter carries the step's reason, ``drop`` drops (listed in ``dropped``),
``route`` sends the message to ``error_target`` with ``repl-error-*`` properties. Avro bytes
are checked against fastavro read independently and the single-object fingerprint against a
CRC-64-AVRO computed here from the spec.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import re
import zlib
from datetime import UTC, datetime, timedelta
from typing import Any

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from replication.messages import Message
from replication.tasks.editors.batching import BatchFailed, BatchStep
from replication.tasks.registry import build_step
from replication.tasks.steps import (
    ERROR_DESCRIPTION,
    ERROR_REASON,
    ERROR_STEP,
    BoundStep,
    Outcome,
    StepConfigError,
    StepContext,
    run_chain,
)

ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "qty", "type": "int"},
        {"name": "price", "type": "double"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
        {"name": "attrs", "type": {"type": "map", "values": "long"}, "default": {}},
        {"name": "blob", "type": "bytes", "default": "\u00ff"},
        {
            "name": "customer",
            "type": {
                "type": "record",
                "name": "Customer",
                "fields": [{"name": "name", "type": "string"}, {"name": "vip", "type": "boolean"}],
            },
        },
    ],
}
ORDER_JSON = {
    "id": "o-1",
    "qty": 3,
    "price": 9.5,
    "note": "ring twice",
    "status": "PAID",
    "tags": ["a", "b"],
    "attrs": {"w": 7},
    "blob": base64.b64encode(b"\x00\xffbin").decode(),
    "customer": {"name": "Ada", "vip": True},
}
POINT = {
    "type": "record",
    "name": "Point",
    "fields": [{"name": "x", "type": "int"}, {"name": "y", "type": "int"}],
}


# ---------------------------------------------------------------------- helpers


def msg(body: Any = None, **fields: Any) -> Message:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    fields.setdefault("message_id", "m-1")
    return Message(body=raw, **fields)


def run(name: str, options: dict[str, Any], message: Message, **ctx: Any) -> Outcome:
    return run_chain(message, [build_step(name, options, StepContext(**ctx) if ctx else None)])


def one(outcome: Outcome) -> Message:
    assert outcome.dead_letter is None, outcome.dead_letter
    assert not outcome.dropped, outcome.dropped
    assert len(outcome.outputs) == 1, outcome.outputs
    return outcome.outputs[0]


def body(message: Message) -> Any:
    return json.loads(message.body)


def dead(outcome: Outcome, reason: str) -> str:
    """Asserts a dead-letter with this exact reason; returns the description."""
    assert outcome.outputs == []
    assert outcome.dead_letter is not None, "expected a dead-letter"
    assert outcome.dead_letter[0] == reason, outcome.dead_letter
    return outcome.dead_letter[1]


def avro_read(data: bytes, schema: Any) -> Any:
    return fastavro.schemaless_reader(io.BytesIO(data), fastavro.parse_schema(schema), None)


def avro_write(datum: Any, schema: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
    return out.getvalue()


def crc64_avro(data: bytes) -> bytes:
    """CRC-64-AVRO (Rabin) as the Avro spec gives it, little-endian as written."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp.to_bytes(8, "little")


# ---------------------------------------------------------------------- error policies


@pytest.mark.parametrize(
    "name, options, message, reason",
    [
        (
            "transcode",
            {"from": "json", "to": "avro-binary", "schema": POINT},
            msg(b"{"),
            "invalid JSON body",
        ),
        (
            "transcode",
            {"from": "avro-binary", "to": "json", "schema": POINT},
            msg(b"\x02"),
            "invalid Avro body",
        ),
        (
            "transcode",
            {"from": "json", "to": "avro-binary", "schema": POINT},
            msg({"x": 1}),
            "value does not fit the Avro schema",
        ),
        ("transcode", {"decompress": "gzip"}, msg(b"not gzip"), "invalid gzip body"),
        ("transform", {"drop": ["a"], "missing": "fail"}, msg({"b": 1}), "missing field"),
        (
            "validate",
            {"json_schema": {"required": ["a"]}},
            msg({}),
            "$: 'a' is a required property",
        ),
        ("partition", {"session_id": "body:tenant"}, msg({}), "missing session id"),
        ("enrich", {"body": {"x": 1}}, msg(b"plain"), "invalid JSON body"),
        ("unbatch", {}, msg({"not": "an array"}), "batch body is not a JSON array"),
    ],
)
def test_every_error_path(name: str, options: dict, message: Message, reason: str) -> None:
    # dead-letter (default): the source is dead-lettered with "<step>: <reason>"
    description = dead(run(name, options, message), f"{name}: {reason}")
    # drop: nothing sent, the drop recorded
    dropped = run(name, {**options, "on_error": "drop"}, message)
    assert dropped.outputs == [] and dropped.dead_letter is None
    assert dropped.dropped and dropped.dropped[0][0] == name
    assert reason in dropped.dropped[0][1]
    # route: the unchanged message goes to the error target with the reason in properties
    routed = one(run(name, {**options, "on_error": "route", "error_target": "errors"}, message))
    assert routed.target == "errors"
    assert routed.body == message.body
    props = routed.application_properties
    assert props[ERROR_STEP] == name
    assert props[ERROR_REASON] == reason
    assert props[ERROR_DESCRIPTION] == description[:1024]


def test_route_needs_an_error_target() -> None:
    with pytest.raises(StepConfigError, match="error_target"):
        build_step("transform", {"drop": ["a"], "on_error": "route"})


# ---------------------------------------------------------------------- transcode: Avro


@pytest.mark.parametrize("fmt", ["avro-binary", "avro-single-object", "avro-container"])
def test_json_avro_json_round_trip(fmt: str) -> None:
    to_avro = build_step("transcode", {"from": "json", "to": fmt, "schema": ORDER})
    to_json = build_step("transcode", {"from": fmt, "to": "json", "schema": ORDER})
    original = msg(ORDER_JSON, content_type="application/json", subject="s")
    avro = one(run_chain(original, [to_avro]))
    assert (
        avro.content_type
        == {
            "avro-binary": "avro/binary",
            "avro-single-object": "avro/single-object",
            "avro-container": "avro/container",
        }[fmt]
    )
    assert avro.subject == "s" and avro.message_id == "m-1"
    back = one(run_chain(avro, [to_json]))
    assert back.content_type == "application/json"
    expected = [ORDER_JSON] if fmt == "avro-container" else ORDER_JSON
    assert body(back) == expected


def test_avro_binary_is_what_fastavro_reads() -> None:
    out = one(
        run("transcode", {"from": "json", "to": "avro-binary", "schema": ORDER}, msg(ORDER_JSON))
    )
    datum = avro_read(out.body, ORDER)
    assert datum["blob"] == b"\x00\xffbin"
    assert datum["customer"] == {"name": "Ada", "vip": True}
    assert datum["status"] == "PAID"
    # and fastavro's own bytes decode to the same JSON
    back = one(
        run(
            "transcode",
            {"from": "avro-binary", "to": "json", "schema": ORDER},
            msg(avro_write(datum, ORDER)),
        )
    )
    assert body(back) == ORDER_JSON


def test_single_object_header_and_spec_fingerprint() -> None:
    out = one(
        run("transcode", {"from": "json", "to": "avro-single-object", "schema": "int"}, msg(1))
    )
    # Avro spec test vector: the fingerprint of "int" is 8247732601305521295
    assert out.body[:2] == b"\xc3\x01"
    assert out.body[2:10] == (8247732601305521295).to_bytes(8, "little")
    assert out.body[2:10] == crc64_avro(b'"int"')
    assert out.body[10:] == b"\x02"
    record = one(
        run(
            "transcode",
            {"from": "json", "to": "avro-single-object", "schema": POINT},
            msg({"x": 1, "y": 2}),
        )
    )
    canonical = (
        b'{"name":"Point","type":"record","fields":[{"name":"x","type":"int"},'
        b'{"name":"y","type":"int"}]}'
    )
    assert record.body[2:10] == crc64_avro(canonical)
    assert record.body[10:] == avro_write({"x": 1, "y": 2}, POINT)


def test_single_object_written_with_another_schema_is_refused() -> None:
    written = one(
        run(
            "transcode",
            {"from": "json", "to": "avro-single-object", "schema": POINT},
            msg({"x": 1, "y": 2}),
        )
    )
    other = {**POINT, "name": "Other"}
    outcome = run(
        "transcode", {"from": "avro-single-object", "to": "json", "schema": other}, written
    )
    assert "expected" in dead(outcome, "transcode: unknown Avro schema fingerprint")
    no_header = run(
        "transcode",
        {"from": "avro-single-object", "to": "json", "schema": POINT},
        msg(avro_write({"x": 1, "y": 2}, POINT)),
    )
    assert "C3 01" in dead(no_header, "transcode: invalid Avro body")


def test_avro_container_from_json_array_and_single_value() -> None:
    points = [{"x": 1, "y": 2}, {"x": 3, "y": 4}]
    out = one(
        run(
            "transcode",
            {"from": "json", "to": "avro-container", "schema": POINT, "container_codec": "deflate"},
            msg(points),
        )
    )
    reader = fastavro.reader(io.BytesIO(out.body))
    assert list(reader) == points
    assert reader.codec == "deflate"
    single = one(
        run("transcode", {"from": "json", "to": "avro-container", "schema": POINT}, msg(points[0]))
    )
    assert list(fastavro.reader(io.BytesIO(single.body))) == [points[0]]
    # reading needs no schema: the container carries it
    back = one(run("transcode", {"from": "avro-container", "to": "json"}, out))
    assert body(back) == points
    # a container of one record becomes one datum; of two, it cannot
    binary = one(run("transcode", {"from": "avro-container", "to": "avro-binary"}, single))
    assert avro_read(binary.body, POINT) == points[0]
    two = run("transcode", {"from": "avro-container", "to": "avro-binary"}, out)
    assert "2 records" in dead(two, "transcode: cannot transcode")


def test_avro_container_with_reader_schema_projects() -> None:
    out = one(
        run(
            "transcode",
            {"from": "json", "to": "avro-container", "schema": POINT},
            msg([{"x": 1, "y": 2}]),
        )
    )
    only_x = {"type": "record", "name": "Point", "fields": [{"name": "x", "type": "int"}]}
    back = one(run("transcode", {"from": "avro-container", "to": "json", "schema": only_x}, out))
    assert body(back) == [{"x": 1}]


def test_avro_to_avro_reencodes() -> None:
    binary = msg(avro_write({"x": 5, "y": -6}, POINT))
    out = one(
        run(
            "transcode",
            {"from": "avro-binary", "to": "avro-single-object", "schema": POINT},
            binary,
        )
    )
    assert out.body[:2] == b"\xc3\x01" and out.body[10:] == binary.body


def test_schema_from_file_and_as_json_text(tmp_path) -> None:
    path = tmp_path / "point.avsc"
    path.write_text(json.dumps(POINT))
    from_file = one(
        run(
            "transcode",
            {"from": "json", "to": "avro-binary", "schema_file": str(path)},
            msg({"x": 1, "y": 2}),
        )
    )
    as_text = one(
        run(
            "transcode",
            {"from": "json", "to": "avro-binary", "schema": json.dumps(POINT)},
            msg({"x": 1, "y": 2}),
        )
    )
    assert from_file.body == as_text.body == avro_write({"x": 1, "y": 2}, POINT)
    bare = one(
        run("transcode", {"from": "json", "to": "avro-binary", "schema": "string"}, msg("hi"))
    )
    assert bare.body == b"\x04hi"


def test_logical_types_round_trip() -> None:
    schema = {
        "type": "record",
        "name": "L",
        "fields": [
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
            {
                "name": "amount",
                "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
            },
        ],
    }
    value = {
        "at": "2026-01-02T03:04:05.123000Z",
        "day": "2026-01-02",
        "id": "12345678-1234-5678-1234-567812345678",
        "amount": "12.34",
    }
    avro = one(
        run("transcode", {"from": "json", "to": "avro-binary", "schema": schema}, msg(value))
    )
    datum = avro_read(avro.body, schema)
    assert datum["at"] == datetime(2026, 1, 2, 3, 4, 5, 123000, tzinfo=UTC)
    back = one(run("transcode", {"from": "avro-binary", "to": "json", "schema": schema}, avro))
    assert body(back) == value
    # epoch integers in the logical type's unit are accepted too
    as_int = one(
        run(
            "transcode",
            {"from": "json", "to": "avro-binary", "schema": schema},
            msg({**value, "at": 1767323045123}),
        )
    )
    assert avro_read(as_int.body, schema)["at"] == datum["at"]
    too_precise = run(
        "transcode",
        {"from": "json", "to": "avro-binary", "schema": schema},
        msg({**value, "amount": "1.234"}),
    )
    assert "$.amount" in dead(too_precise, "transcode: value does not fit the Avro schema")


@pytest.mark.parametrize(
    "change, where",
    [
        ({"qty": "3"}, "$.qty: expected an integer"),
        ({"qty": 2**31}, "$.qty: 2147483648 is out of range for int"),
        ({"status": "LOST"}, "$.status"),
        ({"tags": ["a", 1]}, "$.tags[1]: expected a string"),
        ({"attrs": {"w": "x"}}, "$.attrs.w"),
        ({"blob": "***"}, "$.blob: not valid base64"),
        ({"customer": {"name": "Ada"}}, "$.customer.vip: required field is missing"),
        ({"note": 5}, "$.note"),
    ],
)
def test_json_that_does_not_fit_the_schema(change: dict, where: str) -> None:
    outcome = run(
        "transcode",
        {"from": "json", "to": "avro-binary", "schema": ORDER},
        msg({**ORDER_JSON, **change}),
    )
    assert where in dead(outcome, "transcode: value does not fit the Avro schema")


def test_optional_and_default_fields_may_be_missing() -> None:
    minimal = {k: ORDER_JSON[k] for k in ("id", "qty", "price", "status", "customer")}
    out = one(
        run(
            "transcode",
            {"from": "json", "to": "avro-binary", "schema": ORDER},
            msg({**minimal, "extra": "ignored"}),
        )
    )
    datum = avro_read(out.body, ORDER)
    assert datum["note"] is None and datum["tags"] == [] and datum["attrs"] == {}
    assert datum["blob"] == b"\xff"  # a bytes default is a string of code points 0-255
    assert "extra" not in datum


@pytest.mark.parametrize(
    "data, hint",
    [
        (b"", "EOF"),
        (avro_write({"x": 1, "y": 2}, POINT) + b"\x00", "1 bytes left over"),
        (b"\x01", ""),
    ],
)
def test_corrupt_avro_binary(data: bytes, hint: str) -> None:
    outcome = run("transcode", {"from": "avro-binary", "to": "json", "schema": POINT}, msg(data))
    assert hint in dead(outcome, "transcode: invalid Avro body")


def test_corrupt_avro_container() -> None:
    good = one(
        run(
            "transcode",
            {"from": "json", "to": "avro-container", "schema": POINT},
            msg([{"x": 1, "y": 2}]),
        )
    ).body
    for data in (b"Obj\x01garbage", good[: len(good) - 5], b"{}"):
        outcome = run("transcode", {"from": "avro-container", "to": "json"}, msg(data))
        dead(outcome, "transcode: invalid Avro container")


def test_transcode_options_are_checked() -> None:
    bad = [
        ({"from": "json"}, "'from' and 'to' go together"),
        ({"to": "json"}, "'from' and 'to' go together"),
        ({}, "nothing to do: give 'from'/'to', 'decompress' or 'compress'"),
        ({"from": "json", "to": "avro-binary"}, "avro-binary needs 'schema' or 'schema_file'"),
        (
            {"from": "avro-single-object", "to": "json"},
            "avro-single-object needs 'schema' or 'schema_file'",
        ),
        ({"from": "json", "to": "avro-container"}, "avro-container needs 'schema' or"),
        (
            {"from": "json", "to": "avro-binary", "schema": POINT, "schema_file": "x.avsc"},
            "give 'schema' or 'schema_file', not both",
        ),
        ({"compress": "br"}, "compress: Input should be 'gzip' or 'deflate'"),
        ({"compress": "gzip", "content_type": "x/y"}, "'content_type' needs 'to'"),
        ({"from": "json", "to": "json", "colour": "red"}, "colour: Extra inputs are not permitted"),
        ({"from": "xml", "to": "json"}, "from: Input should be 'json', 'avro-binary'"),
    ]
    for options, message in bad:
        with pytest.raises(StepConfigError, match="^step 'transcode': " + re.escape(message)):
            build_step("transcode", options)
    unknown_field = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "nope"}]}
    for schema in (unknown_field, "no-such-type", {"type": "enum"}):
        with pytest.raises(StepConfigError, match="invalid Avro schema"):
            build_step("transcode", {"from": "json", "to": "avro-binary", "schema": schema})
    with pytest.raises(StepConfigError, match="cannot read"):
        build_step("transcode", {"from": "json", "to": "avro-binary", "schema_file": "/nope"})


def test_content_type_override_and_json_normalising() -> None:
    out = one(
        run(
            "transcode",
            {"from": "json", "to": "json", "content_type": "application/vnd.x+json"},
            msg(b'{ "a" : [1, 2] ,"b":"\\u00e9"}'),
        )
    )
    assert out.content_type == "application/vnd.x+json"
    assert out.body == '{"a":[1,2],"b":"é"}'.encode()


# ---------------------------------------------------------------------- transcode: compression


def test_gzip_round_trip_and_property() -> None:
    original = msg({"a": "x" * 500}, application_properties={"keep": 1})
    packed = one(run("transcode", {"compress": "gzip"}, original))
    assert packed.application_properties == {"keep": 1, "content-encoding": "gzip"}
    assert len(packed.body) < len(original.body)
    assert gzip.decompress(packed.body) == original.body
    assert packed.content_type == original.content_type
    unpacked = one(run("transcode", {"decompress": "gzip"}, packed))
    assert unpacked.body == original.body
    assert unpacked.application_properties == {"keep": 1}
    # the same body always gives the same bytes (no timestamp in the gzip header)
    assert packed.body[4:8] == b"\x00\x00\x00\x00"
    assert one(run("transcode", {"compress": "gzip"}, original)).body == packed.body


def test_deflate_is_zlib_and_raw_deflate_is_read() -> None:
    packed = one(run("transcode", {"compress": "deflate"}, msg(b"hello hello hello")))
    assert zlib.decompress(packed.body) == b"hello hello hello"
    assert packed.application_properties["content-encoding"] == "deflate"
    raw = zlib.compressobj(wbits=-15)
    raw_body = raw.compress(b"raw!") + raw.flush()
    out = one(run("transcode", {"decompress": "deflate"}, msg(raw_body)))
    assert out.body == b"raw!"


def test_auto_decompress_follows_the_property_and_stacks() -> None:
    plain = msg(b"payload")
    assert one(run("transcode", {"decompress": "auto"}, plain)) == plain
    packed = run_chain(
        plain,
        [
            build_step("transcode", {"compress": "deflate"}),
            build_step("transcode", {"compress": "gzip"}),
        ],
    )
    twice = one(packed)
    assert twice.application_properties["content-encoding"] == "deflate, gzip"
    once = one(run("transcode", {"decompress": "auto"}, twice))
    assert once.application_properties["content-encoding"] == "deflate"
    back = one(run("transcode", {"decompress": "auto"}, once))
    assert back.body == b"payload" and "content-encoding" not in back.application_properties
    brotli = msg(b"x", application_properties={"content-encoding": "br"})
    dead(
        run("transcode", {"decompress": "auto"}, brotli), "transcode: unsupported content-encoding"
    )


def test_corrupt_and_oversized_compressed_bodies() -> None:
    packed = gzip.compress(b"z" * 10_000)
    truncated = run("transcode", {"decompress": "gzip"}, msg(packed[:-10]))
    assert "truncated" in dead(truncated, "transcode: invalid gzip body")
    flipped = bytearray(packed)
    flipped[12] ^= 0xFF
    dead(
        run("transcode", {"decompress": "gzip"}, msg(bytes(flipped))),
        "transcode: invalid gzip body",
    )
    trailing = run("transcode", {"decompress": "deflate"}, msg(zlib.compress(b"a") + b"junk"))
    dead(trailing, "transcode: invalid deflate body")
    bomb = run("transcode", {"decompress": "gzip", "max_decompressed_bytes": 1000}, msg(packed))
    dead(bomb, "transcode: gzip body too large")
    # several gzip members are one body (as gzip -d does)
    members = gzip.compress(b"ab") + gzip.compress(b"cd")
    assert one(run("transcode", {"decompress": "gzip"}, msg(members))).body == b"abcd"


def test_transcode_with_compression_both_ways() -> None:
    there = build_step(
        "transcode", {"from": "json", "to": "avro-binary", "schema": ORDER, "compress": "gzip"}
    )
    back = build_step(
        "transcode", {"decompress": "auto", "from": "avro-binary", "to": "json", "schema": ORDER}
    )
    packed = one(run_chain(msg(ORDER_JSON), [there]))
    assert packed.content_type == "avro/binary"
    assert avro_read(gzip.decompress(packed.body), ORDER)["id"] == "o-1"
    assert body(one(run_chain(packed, [back]))) == ORDER_JSON
    # transcoding a still-compressed body is refused, not misread
    refused = run_chain(
        packed, [build_step("transcode", {"from": "avro-binary", "to": "json", "schema": ORDER})]
    )
    assert "decompress first" in dead(refused, "transcode: body is compressed")


json_scalars = st.none() | st.booleans() | st.text(max_size=20)


@given(
    st.fixed_dictionaries(
        {
            "name": st.text(max_size=30),
            "count": st.integers(-(2**63), 2**63 - 1),
            "ratio": st.floats(allow_nan=False, allow_infinity=False),
            "ok": st.booleans(),
            "maybe": st.none() | st.text(max_size=10),
            "items": st.lists(st.integers(-(2**31), 2**31 - 1), max_size=5),
            "labels": st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=4),
            "raw": st.binary(max_size=20).map(lambda b: base64.b64encode(b).decode()),
        }
    ),
    st.sampled_from(["avro-binary", "avro-single-object", "avro-container"]),
    st.sampled_from([None, "gzip", "deflate"]),
)
def test_property_json_avro_json_round_trip(value: dict, fmt: str, coding: str | None) -> None:
    schema = {
        "type": "record",
        "name": "P",
        "fields": [
            {"name": "name", "type": "string"},
            {"name": "count", "type": "long"},
            {"name": "ratio", "type": "double"},
            {"name": "ok", "type": "boolean"},
            {"name": "maybe", "type": ["null", "string"]},
            {"name": "items", "type": {"type": "array", "items": "int"}},
            {"name": "labels", "type": {"type": "map", "values": "string"}},
            {"name": "raw", "type": "bytes"},
        ],
    }
    steps: list[BoundStep] = [
        build_step("transcode", {"from": "json", "to": fmt, "schema": schema, "compress": coding}),
        build_step(
            "transcode", {"from": fmt, "to": "json", "schema": schema, "decompress": "auto"}
        ),
    ]
    out = one(run_chain(msg(value), steps))
    assert body(out) == ([value] if fmt == "avro-container" else value)
    assert "content-encoding" not in out.application_properties


# ---------------------------------------------------------------------- transform


NESTED = {"id": 1, "order": {"customer": {"id": "c", "name": "Ada"}, "qty": 2}, "x": [1, {"y": 2}]}


def test_project_keeps_listed_fields_in_order() -> None:
    out = one(run("transform", {"project": ["order.qty", "id", "order.customer.id"]}, msg(NESTED)))
    assert out.body == b'{"order":{"qty":2,"customer":{"id":"c"}},"id":1}'
    assert one(run("transform", {"project": ["nope", "id"]}, msg(NESTED))).body == b'{"id":1}'


def test_drop_removes_nested_fields() -> None:
    out = one(run("transform", {"drop": ["order.customer.name", "x", "missing.path"]}, msg(NESTED)))
    assert body(out) == {"id": 1, "order": {"customer": {"id": "c"}, "qty": 2}}


def test_rename_keeps_place_moves_and_overwrites() -> None:
    out = one(
        run(
            "transform",
            {
                "rename": {
                    "id": "orderId",
                    "order.qty": "quantity",
                    "order.customer.id": "order.customer.ref",
                }
            },
            msg(NESTED),
        )
    )
    assert list(body(out)) == ["orderId", "order", "x", "quantity"]
    assert body(out)["order"] == {"customer": {"ref": "c", "name": "Ada"}}
    assert body(out)["quantity"] == 2
    clash = one(run("transform", {"rename": {"a": "b"}}, msg({"a": 1, "b": 2, "c": 3})))
    assert clash.body == b'{"b":1,"c":3}'


def test_flatten_separator_and_lists() -> None:
    out = one(run("transform", {"flatten": True}, msg(NESTED)))
    assert body(out) == {
        "id": 1,
        "order.customer.id": "c",
        "order.customer.name": "Ada",
        "order.qty": 2,
        "x": [1, {"y": 2}],
    }
    underscore = one(
        run("transform", {"flatten": True, "separator": "_", "flatten_lists": True}, msg(NESTED))
    )
    assert body(underscore) == {
        "id": 1,
        "order_customer_id": "c",
        "order_customer_name": "Ada",
        "order_qty": 2,
        "x_0": 1,
        "x_1_y": 2,
    }
    empty = one(run("transform", {"flatten": True}, msg({"a": {}, "b": {"c": []}})))
    assert body(empty) == {"a": {}, "b.c": []}
    collide = run("transform", {"flatten": True}, msg({"a.b": 1, "a": {"b": 2}}))
    assert "'a.b'" in dead(collide, "transform: flattened keys collide")


def test_operations_run_in_order() -> None:
    options = {
        "project": ["order", "id"],
        "drop": ["order.customer.name"],
        "rename": {"order.customer": "order.buyer"},
        "flatten": True,
    }
    out = one(run("transform", options, msg(NESTED)))
    assert body(out) == {"order.qty": 2, "order.buyer.id": "c", "id": 1}


def test_missing_fail_and_bad_bodies() -> None:
    for options in ({"project": ["nope"]}, {"rename": {"nope": "x"}}, {"drop": ["id.deeper"]}):
        outcome = run("transform", {**options, "missing": "fail"}, msg(NESTED))
        assert "is not in the body" in dead(outcome, "transform: missing field")
    dead(run("transform", {"flatten": True}, msg([1, 2])), "transform: JSON body is not an object")
    assert "line 1" in dead(
        run("transform", {"flatten": True}, msg(b"{nope")), "transform: invalid JSON body"
    )
    dead(run("transform", {"flatten": True}, msg(b"\xff\xfe")), "transform: invalid JSON body")
    into_scalar = run("transform", {"rename": {"id": "x.y"}}, msg({"id": 1, "x": 5}))
    dead(into_scalar, "transform: field is not an object")


def add_total(value: dict) -> dict:
    return {**value, "total": value["qty"] * value["price"]}


def split_items(message: Message) -> list[Message]:
    data = json.loads(message.body)
    return [message.copy(body=json.dumps(item).encode(), subject="item") for item in data["items"]]


def returns_none(value: Any) -> None:
    return None


def explodes(value: Any) -> Any:
    raise KeyError("boom")


def test_callable_on_the_body_runs_after_the_operations() -> None:
    ref = f"{__name__}:add_total"
    out = one(
        run("transform", {"rename": {"n": "qty"}, "callable": ref}, msg({"n": 2, "price": 1.5}))
    )
    assert body(out) == {"qty": 2, "price": 1.5, "total": 3.0}


def test_callable_on_the_message_can_split_and_filter() -> None:
    ref = f"{__name__}:split_items"
    outs = run(
        "transform",
        {"callable": ref, "callable_takes": "message"},
        msg({"items": [{"a": 1}, {"a": 2}]}),
    )
    assert [body(m) for m in outs.outputs] == [{"a": 1}, {"a": 2}]
    assert {m.subject for m in outs.outputs} == {"item"}
    none = run("transform", {"callable": ref, "callable_takes": "message"}, msg({"items": []}))
    assert none.outputs == [] and none.dead_letter is None and not none.dropped
    # a message-callable may handle bodies that are not JSON
    text = one(
        run("transform", {"callable": "copy:copy", "callable_takes": "message"}, msg(b"plain text"))
    )
    assert text.body == b"plain text"


def test_callable_failures() -> None:
    assert "returned None" in dead(
        run("transform", {"callable": f"{__name__}:returns_none"}, msg({})),
        "transform: callable failed",
    )
    assert "KeyError" in dead(
        run("transform", {"callable": f"{__name__}:explodes"}, msg({})),
        "transform: callable failed",
    )
    for ref, message in [
        ("no_such_module_xyz:f", "cannot load callable 'no_such_module_xyz:f': No module named"),
        (f"{__name__}:missing", f"cannot load callable '{__name__}:missing': module "),
        ("json", "callable: callable must look like 'package.module:function'"),
        (f"{__name__}:ORDER", f"'{__name__}:ORDER' is not callable"),
    ]:
        with pytest.raises(StepConfigError, match=re.escape(message)):
            build_step("transform", {"callable": ref})
    for options, message in [
        ({}, "nothing to do: give project, drop, rename, flatten or callable"),
        ({"drop": ["a..b"]}, "drop: bad field path 'a..b'"),
        ({"rename": {"": "x"}}, "rename: bad field path ''"),
        ({"separator": ""}, "separator: String should have at least 1 character"),
    ]:
        with pytest.raises(StepConfigError, match="^step 'transform': " + re.escape(message)):
            build_step("transform", options)


# ---------------------------------------------------------------------- validate


ORDER_JSON_SCHEMA = {
    "type": "object",
    "required": ["id", "qty"],
    "properties": {
        "id": {"type": "string"},
        "qty": {"type": "integer", "minimum": 1},
        "lines": {"type": "array", "items": {"type": "object", "required": ["sku"]}},
        "email": {"type": "string", "format": "email"},
    },
}


def test_json_schema_passes_conforming_messages_unchanged() -> None:
    message = msg({"id": "a", "qty": 1, "lines": [{"sku": "x"}]}, session_id="s")
    assert one(run("validate", {"json_schema": ORDER_JSON_SCHEMA}, message)) == message


def test_json_schema_violation_names_path_and_message() -> None:
    outcome = run(
        "validate",
        {"json_schema": ORDER_JSON_SCHEMA},
        msg({"id": "a", "qty": 0, "lines": [{"sku": "x"}, {}]}),
    )
    assert outcome.dead_letter is not None
    reason, description = outcome.dead_letter
    assert reason in (
        "validate: $.qty: 0 is less than the minimum of 1",
        "validate: $.lines[1]: 'sku' is a required property",
    )
    assert "$.qty: 0 is less than the minimum of 1" in description
    assert "$.lines[1]: 'sku' is a required property" in description


def test_json_schema_routes_and_drops() -> None:
    bad = msg({"id": 5, "qty": 1})
    routed = one(
        run(
            "validate",
            {"json_schema": ORDER_JSON_SCHEMA, "on_error": "route", "error_target": "invalid"},
            bad,
        )
    )
    assert routed.target == "invalid"
    assert routed.application_properties[ERROR_REASON] == "$.id: 5 is not of type 'string'"
    dropped = run("validate", {"json_schema": ORDER_JSON_SCHEMA, "on_error": "drop"}, bad)
    assert dropped.outputs == [] and dropped.dropped[0][0] == "validate"


def test_json_schema_options(tmp_path) -> None:
    path = tmp_path / "order.schema.json"
    path.write_text(json.dumps(ORDER_JSON_SCHEMA))
    bad_email = msg({"id": "a", "qty": 1, "email": "not-an-email"})
    assert one(run("validate", {"json_schema_file": str(path)}, bad_email)) == bad_email
    checked = run("validate", {"json_schema_file": str(path), "check_formats": True}, bad_email)
    dead(checked, "validate: $.email: 'not-an-email' is not a 'email'")
    many = run(
        "validate",
        {"json_schema": {"items": {"type": "string"}}, "max_errors": 2},
        msg([1, 2, 3, 4]),
    )
    assert many.dead_letter is not None
    assert many.dead_letter[0] in {
        f"validate: $[{i}]: {i + 1} is not of type 'string'" for i in range(4)
    }
    assert many.dead_letter[1].splitlines() == [
        "$[0]: 1 is not of type 'string'",
        "$[1]: 2 is not of type 'string'",
        "... 2 more",
    ]
    dead(run("validate", {"json_schema": True}, msg(b"nope")), "validate: invalid JSON body")
    with pytest.raises(StepConfigError, match="invalid JSON Schema"):
        build_step("validate", {"json_schema": {"type": "no-such-type"}})
    with pytest.raises(StepConfigError, match="cannot read JSON Schema"):
        build_step("validate", {"json_schema_file": str(tmp_path / "missing.json")})
    for options, message in [
        ({}, "give a JSON Schema or an Avro schema"),
        ({"json_schema": {}, "json_schema_file": "x"}, "give 'json_schema' or 'json_schema_file'"),
        ({"avro_schema": POINT, "avro_schema_file": "x"}, "give 'avro_schema' or 'avro_schema_"),
        ({"json_schema": {}, "body": "avro-binary"}, "body avro-binary needs 'avro_schema' or"),
    ]:
        with pytest.raises(StepConfigError, match="^step 'validate': " + re.escape(message)):
            build_step("validate", options)


def test_avro_schema_on_json_bodies() -> None:
    good = msg(ORDER_JSON)
    assert one(run("validate", {"avro_schema": ORDER}, good)) == good
    bad = msg({**ORDER_JSON, "tags": ["a", 2]})
    dead(
        run("validate", {"avro_schema": ORDER}, bad),
        "validate: $.tags[1]: expected a string, got 2",
    )
    missing = msg({k: v for k, v in ORDER_JSON.items() if k != "qty"})
    dead(
        run("validate", {"avro_schema": ORDER}, missing),
        "validate: $.qty: required field is missing",
    )


def test_avro_bodies_are_decoded_then_checked() -> None:
    data = avro_write({"x": 1, "y": -5}, POINT)
    assert (
        one(run("validate", {"avro_schema": POINT, "body": "avro-binary"}, msg(data))).body == data
    )
    dead(
        run("validate", {"avro_schema": POINT, "body": "avro-binary"}, msg(data[:1])),
        "validate: invalid Avro body",
    )
    both = {
        "avro_schema": POINT,
        "body": "avro-binary",
        "json_schema": {"properties": {"y": {"minimum": 0}}},
    }
    dead(run("validate", both, msg(data)), "validate: $.y: -5 is less than the minimum of 0")


# ---------------------------------------------------------------------- enrich


def test_enrich_properties_static_settings_and_timestamp() -> None:
    clock = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    options = {
        "properties": {"region": "westeurope", "hop": 2, "mirrored": True},
        "properties_from_settings": {"env": "APP_ENV"},
        "timestamp_property": "processed-at",
    }
    message = msg(b"\x00binary", application_properties={"region": "old", "keep": "k"})
    out = one(run("enrich", options, message, settings={"APP_ENV": "prod"}, now=lambda: clock))
    assert out.body == b"\x00binary"  # bodies are not touched without body fields
    assert out.application_properties == {
        "region": "westeurope",
        "keep": "k",
        "hop": 2,
        "mirrored": True,
        "env": "prod",
        "processed-at": "2026-01-02T03:04:05.6789010Z",
    }


def test_enrich_body_fields_and_overwrite() -> None:
    options = {
        "body": {"meta.source": "sb-east", "id": "new"},
        "body_from_settings": {"meta.env": "APP_ENV"},
    }
    message = msg({"id": "old", "meta": {"v": 1}})
    out = one(run("enrich", options, message, settings={"APP_ENV": "test"}))
    assert body(out) == {"id": "new", "meta": {"v": 1, "source": "sb-east", "env": "test"}}
    kept = one(
        run(
            "enrich",
            {**options, "overwrite": False, "properties": {"p": "new"}},
            msg({"id": "old"}, application_properties={"p": "old"}),
            settings={"APP_ENV": "test"},
        )
    )
    assert body(kept) == {"id": "old", "meta": {"source": "sb-east", "env": "test"}}
    assert kept.application_properties == {"p": "old"}


def test_enrich_errors() -> None:
    with pytest.raises(StepConfigError, match="APP_ENV"):
        build_step(
            "enrich", {"properties_from_settings": {"env": "APP_ENV"}}, StepContext(settings={})
        )
    with pytest.raises(StepConfigError, match=r"^step 'enrich': nothing to do: give properties"):
        build_step("enrich", {})
    dead(run("enrich", {"body": {"a": 1}}, msg([1])), "enrich: JSON body is not an object")
    dead(run("enrich", {"body": {"a.b": 1}}, msg({"a": 3})), "enrich: field is not an object")


# ---------------------------------------------------------------------- partition


def test_partition_key_and_session_from_body_and_property() -> None:
    message = msg(
        {"customer": {"id": "c-9"}, "lines": [{"n": 42}]}, application_properties={"tenant": "t1"}
    )
    out = one(run("partition", {"partition_key": {"body": "customer.id"}}, message))
    assert out.partition_key == "c-9" and out.session_id is None
    out = one(run("partition", {"session_id": "property:tenant"}, message))
    assert out.session_id == "t1"
    out = one(run("partition", {"partition_key": "body:lines.0.n"}, message))
    assert out.partition_key == "42"
    flag = one(run("partition", {"session_id": "body:ok"}, msg({"ok": True})))
    assert flag.session_id == "true"


def test_partition_defaults_and_missing() -> None:
    options = {"session_id": {"body": "customer.id", "default": "unknown"}}
    assert one(run("partition", options, msg({}))).session_id == "unknown"
    assert one(run("partition", options, msg({"customer": {"id": ""}}))).session_id == "unknown"
    described = dead(
        run("partition", {"partition_key": "property:tenant"}, msg({})),
        "partition: missing partition key",
    )
    assert "property 'tenant' is missing" in described
    unusable = run("partition", {"session_id": "body:customer"}, msg({"customer": {"id": 1}}))
    assert "unusable" in dead(unusable, "partition: missing session id")
    long = run("partition", {"session_id": "body:k"}, msg({"k": "x" * 129}))
    dead(long, "partition: session id too long")
    # a property-only source does not need a JSON body
    plain = one(
        run(
            "partition", {"session_id": "property:t"}, msg(b"\x00", application_properties={"t": 7})
        )
    )
    assert plain.session_id == "7"


def test_partition_key_follows_session_id() -> None:
    message = msg({"s": "A", "p": "B"}, partition_key="old")
    out = one(run("partition", {"session_id": "body:s"}, message))
    assert out.session_id == "A" and out.partition_key == "A"
    same = one(run("partition", {"session_id": "body:s", "partition_key": "body:s"}, message))
    assert same.session_id == same.partition_key == "A"
    differ = run("partition", {"session_id": "body:s", "partition_key": "body:p"}, message)
    dead(differ, "partition: partition key differs from session id")
    no_key = one(run("partition", {"session_id": "body:s"}, msg({"s": "A"})))
    assert no_key.partition_key is None


def test_partition_overwrite_false_keeps_existing() -> None:
    message = msg({"s": "new"}, session_id="old")
    kept = one(run("partition", {"session_id": "body:s", "overwrite": False}, message))
    assert kept.session_id == "old"
    assert one(run("partition", {"session_id": "body:s"}, message)).session_id == "new"


def test_partition_options_are_checked() -> None:
    one_of = "session_id: give exactly one of 'body' or 'property'"
    for options, message in [
        ({}, "give partition_key and/or session_id"),
        ({"session_id": "column:x"}, "session_id: use 'body:<path>' or 'property:<name>'"),
        ({"session_id": {"body": "a", "property": "b"}}, one_of),
        ({"session_id": {}}, one_of),
        ({"session_id": {"body": "a", "default": ""}}, "session_id: default must have 1 to 128"),
    ]:
        with pytest.raises(StepConfigError, match="^step 'partition': " + re.escape(message)):
            build_step("partition", options)
    dead(run("partition", {"session_id": "body:s"}, msg(b"nope")), "partition: invalid JSON body")


# ---------------------------------------------------------------------- batch / unbatch


def batch_step(**options: Any) -> BatchStep:
    built = build_step("batch", options)
    assert isinstance(built.run, BatchStep) and built.run.accepts_list is True
    return built.run


def test_batch_groups_by_session_and_keeps_order() -> None:
    messages = [
        msg({"n": 0}, message_id="a", session_id="s1"),
        msg({"n": 1}, message_id="b", session_id="s2"),
        msg({"n": 2}, message_id="c", session_id="s1"),
        msg({"n": 3}, message_id="d", session_id="s2"),
        msg({"n": 4}, message_id="e", session_id="s1", target="other"),
    ]
    result = batch_step().batch(messages)
    assert result.failures == []
    assert result.members == [[0, 2], [1, 3], [4]]
    assert [body(m) for m in result.outputs] == [
        [{"n": 0}, {"n": 2}],
        [{"n": 1}, {"n": 3}],
        [{"n": 4}],
    ]
    assert [(m.session_id, m.target) for m in result.outputs] == [
        ("s1", None),
        ("s2", None),
        ("s1", "other"),
    ]
    assert {m.content_type for m in result.outputs} == {"application/json"}
    assert [m.application_properties["batch-count"] for m in result.outputs] == [2, 2, 1]


def test_batch_limits() -> None:
    messages = [msg({"n": i, "pad": "x" * 50}, message_id=str(i)) for i in range(7)]
    by_count = batch_step(max_messages=3).batch(messages)
    assert by_count.members == [[0, 1, 2], [3, 4, 5], [6]]
    size = len(json.dumps({"n": 0, "pad": "x" * 50}, separators=(",", ":")))
    by_size = batch_step(max_bytes=2 + 2 * (size + 1)).batch(messages)
    assert by_size.members == [[0, 1], [2, 3], [4, 5], [6]]
    assert all(len(m.body) <= 2 + 2 * (size + 1) for m in by_size.outputs)
    huge = batch_step(max_bytes=10).batch(messages[:2])
    assert huge.members == [[0], [1]]  # too big alone still goes, alone
    unlimited = batch_step(max_bytes=None, max_messages=1000).batch(messages)
    assert unlimited.members == [list(range(7))]


def test_batch_message_fields() -> None:
    ttl = timedelta(minutes=5)
    messages = [
        msg(
            {"n": 0},
            message_id="a",
            correlation_id="c",
            subject="x",
            time_to_live=ttl,
            sequence_number=10,
            application_properties={"tenant": "t", "seq": 1, "k": "v"},
        ),
        msg(
            {"n": 1},
            message_id="b",
            correlation_id="c",
            subject="y",
            time_to_live=ttl,
            sequence_number=11,
            application_properties={"tenant": "t", "seq": 2},
        ),
        msg(
            {"n": 2},
            message_id="c",
            correlation_id="c",
            subject="x",
            time_to_live=ttl,
            sequence_number=12,
            application_properties={"tenant": "t", "seq": 1, "k": "v"},
        ),
    ]
    [out] = batch_step(batch_count_property="n-items").batch(messages).outputs
    assert out.application_properties == {"tenant": "t", "n-items": 3}
    assert out.correlation_id == "c" and out.time_to_live == ttl
    assert out.subject is None
    assert out.sequence_number == 10  # the first member's source facts
    again = batch_step().batch([m.copy() for m in messages]).outputs[0]
    assert again.message_id == out.message_id  # deterministic: dedupe works on redelivery
    other = batch_step().batch(messages[:1]).outputs[0]
    assert other.message_id != out.message_id


def test_batch_failures_and_policies() -> None:
    messages = [
        msg({"n": 0}, message_id="a"),
        msg(b"not json", message_id="b"),
        msg({"n": 2}, message_id="c"),
    ]
    step = batch_step()
    result = step.batch(messages)
    assert result.members == [[0, 2]]
    assert [(i, f.reason) for i, f in result.failures] == [(1, "invalid JSON body")]
    with pytest.raises(BatchFailed, match=r"^invalid JSON body: 1 message\(s\) failed") as failed:
        step(messages)
    assert failed.value.result.members == [[0, 2]]
    assert failed.value.reason == "invalid JSON body"
    dropped = batch_step(on_error="drop")(messages)
    assert [body(m) for m in dropped] == [[{"n": 0}, {"n": 2}]]
    routed = batch_step(on_error="route", error_target="bad")(messages)
    assert len(routed) == 2 and routed[1].target == "bad" and routed[1].body == b"not json"
    assert routed[1].application_properties[ERROR_STEP] == "batch"
    assert routed[1].application_properties[ERROR_REASON] == "invalid JSON body"
    compressed = msg({"n": 0}, application_properties={"content-encoding": "gzip"})
    assert step.batch([compressed]).failures[0][1].reason == "body is compressed"


def test_batch_in_a_chain_is_a_batch_of_one() -> None:
    out = one(run("batch", {}, msg({"n": 1})))
    assert body(out) == [{"n": 1}]
    dead(run("batch", {}, msg(b"nope")), "batch: invalid JSON body")


def test_batch_unbatch_round_trip_with_metadata() -> None:
    messages = [
        msg(
            {"n": 0},
            message_id="a",
            subject="one",
            content_type="application/json",
            application_properties={"p": 1, "common": "c"},
        ),
        msg(
            b"\x00\x01 binary",
            message_id="b",
            correlation_id="corr",
            application_properties={"when": datetime(2026, 1, 1, tzinfo=UTC), "common": "c"},
        ),
    ]
    [batched] = batch_step(include_metadata=True).batch(messages).outputs
    elements = body(batched)
    assert elements[0] == {
        "body": {"n": 0},
        "message_id": "a",
        "subject": "one",
        "content_type": "application/json",
        "properties": {"p": 1, "common": "c"},
    }
    assert base64.b64decode(elements[1]["body_base64"]) == b"\x00\x01 binary"
    parts = run("unbatch", {"include_metadata": True}, batched).outputs
    assert [p.body for p in parts] == [b'{"n":0}', b"\x00\x01 binary"]
    assert [p.message_id for p in parts] == ["a", "b"]
    assert [p.subject for p in parts] == ["one", None]
    assert parts[1].correlation_id == "corr"
    assert [p.content_type for p in parts] == ["application/json", None]
    assert parts[0].application_properties == {"p": 1, "common": "c"}
    assert parts[1].application_properties == {"when": "2026-01-01 00:00:00+00:00", "common": "c"}


def test_unbatch_json_array() -> None:
    batched = msg(
        [{"n": 0}, 5, "s"],
        message_id="B",
        session_id="s1",
        application_properties={"batch-count": 3, "tenant": "t"},
    )
    parts = run("unbatch", {}, batched).outputs
    assert [p.body for p in parts] == [b'{"n":0}', b"5", b'"s"']
    assert [p.message_id for p in parts] == ["B:0", "B:1", "B:2"]
    assert {p.session_id for p in parts} == {"s1"}
    assert all(p.application_properties == {"tenant": "t"} for p in parts)
    assert run("unbatch", {}, msg([])).outputs == []
    long_id = run("unbatch", {}, msg([1], message_id="x" * 128)).outputs[0].message_id
    assert long_id is not None and len(long_id) <= 128
    bad_envelope = run("unbatch", {"include_metadata": True}, msg([{"no": "body"}]))
    dead(bad_envelope, "unbatch: invalid batch element")


def test_batch_and_unbatch_avro_container() -> None:
    messages = [msg({"x": i, "y": -i}, message_id=str(i)) for i in range(3)]
    [batched] = batch_step(format="avro-container", schema=POINT).batch(messages).outputs
    assert batched.content_type == "avro/container"
    assert list(fastavro.reader(io.BytesIO(batched.body))) == [{"x": i, "y": -i} for i in range(3)]
    parts = run("unbatch", {"format": "avro-container"}, batched).outputs
    assert [body(p) for p in parts] == [{"x": i, "y": -i} for i in range(3)]
    binary = run(
        "unbatch",
        {"format": "avro-container", "item_format": "avro-binary", "schema": POINT},
        batched,
    ).outputs
    assert [p.body for p in binary] == [avro_write({"x": i, "y": -i}, POINT) for i in range(3)]
    assert {p.content_type for p in binary} == {"avro/binary"}
    # Avro members in, one container out
    single = [msg(avro_write({"x": 1, "y": 2}, POINT)), msg(b"\x00")]
    result = batch_step(format="avro-container", schema=POINT, item_format="avro-binary").batch(
        single
    )
    assert result.members == [[0]] and result.failures[0][1].reason == "invalid Avro body"
    unfit = batch_step(format="avro-container", schema=POINT).batch([msg({"x": "no"})])
    assert unfit.failures[0][1].reason == "value does not fit the Avro schema"
    dead(
        run("unbatch", {"format": "avro-container"}, msg(b"garbage")),
        "unbatch: invalid Avro container",
    )


def test_batch_options_are_checked() -> None:
    for options, message in [
        ({"format": "avro-container"}, "format avro-container needs 'schema' or 'schema_file'"),
        ({"item_format": "avro-binary"}, "'item_format' is for format avro-container"),
        (
            {"format": "avro-container", "schema": POINT, "include_metadata": True},
            "'include_metadata' is for format json",
        ),
        ({"max_messages": 0}, "max_messages: Input should be greater than or equal to 1"),
    ]:
        with pytest.raises(StepConfigError, match="^step 'batch': " + re.escape(message)):
            build_step("batch", options)
    with pytest.raises(
        StepConfigError, match=r"^step 'unbatch': item_format avro-binary needs 'schema' or"
    ):
        build_step("unbatch", {"format": "avro-container", "item_format": "avro-binary"})


@given(
    st.lists(
        st.tuples(
            st.sampled_from([None, "s1", "s2"]),
            st.recursive(
                json_scalars | st.integers(-1000, 1000),
                lambda inner: (
                    st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=4), inner, max_size=3)
                ),
                max_leaves=8,
            ),
        ),
        max_size=12,
    ),
    st.integers(1, 4),
)
def test_property_batch_then_unbatch_gives_each_session_in_order(
    items: list[tuple[str | None, Any]], max_messages: int
) -> None:
    messages = [msg(value, message_id=str(i), session_id=s) for i, (s, value) in enumerate(items)]
    result = batch_step(max_messages=max_messages).batch(messages)
    assert sorted(i for members in result.members for i in members) == list(range(len(items)))
    unbatch = build_step("unbatch", {})
    by_session: dict[str | None, list[Any]] = {}
    for output, members in zip(result.outputs, result.members, strict=True):
        assert len({messages[i].session_id for i in members}) == 1
        for part in run_chain(output, [unbatch]).outputs:
            by_session.setdefault(part.session_id, []).append(body(part))
    expected: dict[str | None, list[Any]] = {}
    for session, value in items:
        expected.setdefault(session, []).append(value)
    assert by_session == expected
