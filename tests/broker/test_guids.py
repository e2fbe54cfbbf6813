"""The broker's GUIDs: random version-4 UUIDs, and their bytes written without ``UUID``'s
Python properties."""

from __future__ import annotations

import uuid

import pytest

from replication.broker.guids import GUIDS, guid_bytes, guid_bytes_le


@pytest.mark.parametrize(
    "guid",
    [
        uuid.UUID(int=0),
        uuid.UUID(int=2**128 - 1),
        uuid.UUID("00112233-4455-6677-8899-aabbccddeeff"),
        *(GUIDS.uuid() for _ in range(20)),
    ],
)
def test_guid_bytes_are_the_uuids_own(guid: uuid.UUID) -> None:
    assert guid_bytes(guid) == guid.bytes
    assert guid_bytes_le(guid) == guid.bytes_le
    assert uuid.UUID(bytes_le=guid_bytes_le(guid)) == guid


def test_guids_are_random_version_4() -> None:
    guids = [GUIDS.uuid() for _ in range(1000)]
    assert len(set(guids)) == 1000
    assert {guid.version for guid in guids} == {4}
    assert {guid.variant for guid in guids} == {uuid.RFC_4122}
    assert all(len(GUIDS.hex()) == 32 for _ in range(10))
