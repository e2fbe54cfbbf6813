"""The section scanner against the general decoder: same values, and it reads (does not
decline) every message our encoder writes with a data body."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from replication.amqp import codec, scan
from replication.amqp.errors import DecodeError
from replication.amqp.message import BodyType, Header, Properties, decode_message, encode_message
from replication.amqp.message import Message as AmqpMessage
from replication.amqp.types import symbol
from tests.amqp.strategies import amqp_messages


def _field_list(value: object, size: int) -> list[object]:
    """A header or properties object as the scanner's padded field list."""
    encoded = bytearray()
    codec.encode_into(encoded, value)
    fields = codec.decode(bytes(encoded[3:]))  # the list without its descriptor
    return list(fields) + [None] * (size - len(fields))


@settings(max_examples=settings.default.max_examples * 3 // 2)  # 300 on CI, 75 at a desk
@given(amqp_messages())
def test_scan_reads_what_the_general_decoder_reads(message: AmqpMessage) -> None:
    payload = encode_message(message)
    general = decode_message(payload)
    found = scan.scan(payload)  # never declines our own encoder's output
    assert found.body_is_data is (general.body_type is BodyType.DATA)
    assert found.data == (list(general.body) if found.body_is_data else [])
    assert found.header == (None if general.header is None else _field_list(general.header, 5))
    expected_properties = general.properties
    assert found.properties == (
        None if expected_properties is None else _field_list(expected_properties, 13)
    )
    if general.message_annotations:
        wanted = {key.encode(): key for key in general.message_annotations}
        assert scan.pick(payload, found.annotations_at, wanted) == general.message_annotations
    else:
        assert found.annotations_at == -1 or not codec.decode_at(payload, found.annotations_at)[0]
    if general.application_properties is not None:
        assert (
            scan.string_map(payload, found.application_properties_at)
            == general.application_properties
        )
    bare_sections = codec.decode_all(payload[found.bare_start : found.bare_end])
    assert not any(type(section) is Header for section in bare_sections)
    assert (found.bare_start < found.bare_end) is bool(bare_sections)


def test_pick_skips_unwanted_values_without_decoding_them() -> None:
    annotations = {symbol("x-opt-lock-token"): "t" * 300, symbol("x-opt-partition-key"): "pk"}
    payload = encode_message(AmqpMessage(body=[b"x"], message_annotations=annotations))
    found = scan.scan(payload)
    assert scan.pick(payload, found.annotations_at, {b"x-opt-partition-key": "key"}) == {
        "key": "pk"
    }


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\x00\x80" + bytes(8) + b"\xa0\x01x", "not a section with a smallulong descriptor"),
        (b"\x00\x53\x75\xa0\x05x", "the data section overruns the payload"),
        (b"\x00\x53\x73\x45\x00\x53\x70\x45", "section 0x70 out of order or repeated"),
        (b"\x00\x53\x73\x45\x00\x53\x73\x45", "section 0x73 out of order or repeated"),
        (b"\x00\x53\x75\xa0\x01x\x00\x53\x77\x40", "a body of data and amqp-value"),
        (b"\x00\x53\x79\x40", "descriptor 0x79 is not a section"),
        # descriptors of descriptors, never closed: passed over without recursion, then declined
        (b"\x00\x53\x75\xa0\x01x\x00\x53\x78" + b"\x00" * 50_000 + b"\x40", "malformed"),
    ],
    ids=[
        "ulong descriptor",
        "data shorter than its size",
        "header after properties",
        "properties twice",
        "data and amqp-value",
        "not a section",
        "nested deep",
    ],
)
def test_scan_declines_what_it_does_not_read(payload: bytes, reason: str) -> None:
    with pytest.raises(scan.Unusual, match=reason):
        scan.scan(payload)


def test_a_map_with_a_key_and_no_value_is_declined() -> None:
    payload = b"\x00\x53\x72\xc1\x03\x01\xa3\x00"
    with pytest.raises(scan.Unusual, match="offset 3: a map of 1 elements"):
        scan.pick(payload, scan.scan(payload).annotations_at, {})


def test_a_non_string_application_property_key_is_declined() -> None:
    """The general decoder then names the error (a binary key here)."""
    payload = b"\x00\x53\x74\xc1\x05\x02\xa0\x01k\x41" + b"\x00\x53\x75\xa0\x00"
    with pytest.raises(scan.Unusual, match="offset 6: an application-properties key 0xa0"):
        scan.string_map(payload, scan.scan(payload).application_properties_at)


def test_skip_at_passes_over_every_kind_of_value() -> None:
    values = [None, True, 7, 2**40, "s" * 300, symbol("sym"), b"b", [1, "two"], {"k": [1, 2]}]
    encoded = bytearray()
    for value in values:
        codec.encode_into(encoded, value)
    codec.encode_into(encoded, Properties(message_id="m"))  # a described list
    values.append("described")
    pos, seen = 0, 0
    while pos < len(encoded):
        pos = codec.skip_at(bytes(encoded), pos)
        seen += 1
    assert (pos, seen) == (len(encoded), len(values))
    with pytest.raises(DecodeError, match="invalid constructor 0xff"):
        codec.skip_at(b"\xff", 0)


def test_skip_at_passes_a_chain_of_descriptors_deeper_than_any_stack() -> None:
    """A peer's frame may hold one: compiled, a recursive skip would overflow the C stack and
    take the broker down (interpreted, it hit the recursion limit)."""
    depth = 200_000
    chain = b"\x00" * depth + b"\x40" * (depth + 1)  # each descriptor null, the value null
    assert codec.skip_at(chain, 0) == len(chain)
    payload = b"\x00\x53\x77" + chain  # an amqp-value body holding it
    assert scan.scan(payload).body_is_data is False
