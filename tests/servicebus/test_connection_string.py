"""The one connection-string parser, with ``azure-servicebus``'s own parser as the oracle:
what the SDK accepts we read the same way, what it refuses we refuse (two leniencies are
the JavaScript SDK's: empty parts, and an Endpoint without a scheme)."""

from __future__ import annotations

import re

import pytest
from azure.servicebus._base_handler import _parse_conn_str

from replication.host.embedded import emulator_port
from replication.servicebus.connection_string import (
    ConnectionString,
    ConnectionStringError,
    namespace_of,
    with_endpoint,
)

KEY = "SharedAccessKeyName=Root;SharedAccessKey=c2VjcmV0PQ=="
ACCEPTED = [
    f"Endpoint=sb://ns.servicebus.windows.net/;{KEY}",
    f"Endpoint=sb://ns.servicebus.windows.net/;{KEY};",
    "endpoint=sb://NS.servicebus.windows.net;sharedaccesskeyname=Root;SHAREDACCESSKEY=k==",
    f"Endpoint=sb://localhost:5672;{KEY};UseDevelopmentEmulator=true",
    f"Endpoint=sb://localhost:5672;{KEY};UseDevelopmentEmulator=True",  # not the emulator
    f"Endpoint=sb://localhost;{KEY};UseDevelopmentEmulator=TRUE",
    f"Endpoint=sb://ns.servicebus.windows.net/;{KEY};EntityPath=orders",
    f"HostName=sb://ns.servicebus.windows.net/;{KEY}",
    "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessSignature=SharedAccessSignature "
    "sr=x&sig=y&se=1999999999&skn=Root",
    f" Endpoint=sb://ns.servicebus.windows.net:9999/;{KEY}",
]
MALFORMED = "Connection string is either blank or malformed"
NO_ENDPOINT = "Connection string has no Endpoint"
BOTH_KEY_PARTS = "Connection string must have both SharedAccessKeyName and SharedAccessKey"
REFUSED = [  # (text, what the SDK says, what we say)
    ("", MALFORMED, NO_ENDPOINT),
    ("Endpoint", MALFORMED, MALFORMED + ": every part is key=value"),
    ("SharedAccessKeyName=Root;SharedAccessKey=k", MALFORMED, NO_ENDPOINT),
    ("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root", BOTH_KEY_PARTS, None),
    ("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKey=k", BOTH_KEY_PARTS, None),
    (
        "Endpoint=sb://ns.servicebus.windows.net/",
        "At least one of the SharedAccessKey or SharedAccessSignature must be present",
        None,
    ),
    (
        f"Endpoint=sb://ns.servicebus.windows.net/;{KEY};SharedAccessSignature=x",
        "Only one of the SharedAccessKey or SharedAccessSignature must be present",
        None,
    ),
    (
        f"Endpoint=sb://;{KEY}",
        "Invalid Endpoint on the Connection String",
        "Invalid Endpoint on the connection string: 'sb://'",
    ),
]


@pytest.mark.parametrize("text", ACCEPTED)
def test_reads_what_the_sdk_reads(text: str) -> None:
    host, key_name, key, entity, signature, _expiry, emulator = _parse_conn_str(text)
    ours = ConnectionString.parse(text)
    assert ours.netloc == host
    assert (ours.key_name, ours.key, ours.entity_path) == (key_name, key, entity)
    assert ours.signature == signature
    assert ours.use_development_emulator is emulator
    assert ours.use_tls is not emulator


@pytest.mark.parametrize(("text", "sdk_says", "we_say"), REFUSED, ids=[r[0] for r in REFUSED])
def test_refuses_what_the_sdk_refuses(text: str, sdk_says: str, we_say: str | None) -> None:
    """We refuse in the SDK's words, except where ours say more (None: the same words)."""
    with pytest.raises(ValueError, match="^" + re.escape(sdk_says)):
        _parse_conn_str(text)
    with pytest.raises(ConnectionStringError, match="^" + re.escape(we_say or sdk_says)):
        ConnectionString.parse(text)


def test_ports_follow_the_emulator_flag() -> None:
    assert ConnectionString.parse(f"Endpoint=sb://h;{KEY}").port == 5671
    assert ConnectionString.parse(f"Endpoint=sb://h;{KEY};UseDevelopmentEmulator=true").port == 5672
    assert ConnectionString.parse(f"Endpoint=sb://h:1234;{KEY}").port == 1234
    assert ConnectionString.parse(f"Endpoint=sb://h:1234;{KEY}").host == "h"


def test_the_local_host_agrees_about_the_emulator_flag() -> None:
    """``UseDevelopmentEmulator=True`` is TLS to the SDKs, so it names no local broker."""
    assert emulator_port(f"Endpoint=sb://localhost:5680;{KEY};UseDevelopmentEmulator=true") == 5680
    assert emulator_port(f"Endpoint=sb://localhost:5680;{KEY};UseDevelopmentEmulator=True") is None
    assert emulator_port(f"Endpoint=sb://ns.example;{KEY};UseDevelopmentEmulator=true") is None
    assert emulator_port("not a connection string") is None


def test_namespace_and_endpoint_rewrites() -> None:
    assert namespace_of(f"Endpoint=sb://NS.Example:99/;{KEY}") == "ns.example:99"
    moved = with_endpoint(f"HostName=sb://a/;{KEY};;EntityPath=q", "b:1", emulator=True)
    assert moved == f"Endpoint=sb://b:1/;{KEY};EntityPath=q;UseDevelopmentEmulator=true"
    assert ConnectionString.parse(moved).use_development_emulator
    with pytest.raises(ConnectionStringError, match="Endpoint"):
        with_endpoint(KEY, "b")
