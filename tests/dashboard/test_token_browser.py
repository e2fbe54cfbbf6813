"""Token mode in a headless browser: ``broker --ui`` bound to this machine's own non-loopback
address (127.0.0.2 would still be loopback: ``loopback.is_loopback_bind``), opened at that
address as a colleague would. Chromium gives a plain-http page off loopback no
``crypto.subtle`` (not a secure context), so the page signs with its own SHA-256; the token
it mints is the one ``servicebus/sas.py`` mints, byte for byte, on either path. A wrong key
reads as a clear 401, the badge says it waits for a token (not "offline"), only the token
is kept (sessionStorage), and a Listen-only key shows the namespace but cannot send.
``--ui-token`` opens the page with a token ready.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from replication.broker.auth import EMULATOR_KEY, EMULATOR_RULE_NAME
from replication.servicebus.sas import generate_sas_token
from tests.broker.conftest import REPO_ROOT, connection_string, make_config
from tests.dashboard.test_browser import _errors, _shot, _text, _until
from tests.dashboard.test_browser import browser as browser  # the fixture, found by name
from tests.dashboard.test_explorer_browser import _click, _type
from tests.processes import Processes

from .support import start_broker

pytestmark = pytest.mark.timeout(300)

LISTEN_ONLY = {"Name": "watcher", "Key": "watcher-key-1", "Rights": ["Listen"]}
RULES = [
    {"Name": EMULATOR_RULE_NAME, "Key": EMULATOR_KEY, "Rights": ["Manage", "Send", "Listen"]},
    LISTEN_ONLY,
]
URL = re.compile(r"dashboard on (http://\S+)")


def _own_address() -> str:
    """This machine's address on its default route (no packet is sent), or skip."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.254", 9))
        except OSError:
            pytest.skip("no non-loopback IPv4 address to serve on")
        address = str(probe.getsockname()[0])
    if address.startswith("127."):
        pytest.skip("no non-loopback IPv4 address to serve on")
    return address


def _paste_key(driver: Any, key_name: str, key: str) -> None:
    _until(
        "the token form",
        lambda: driver.execute_script("return !document.getElementById('token-form').hidden"),
    )
    _type(driver, "#token-form [name=key_name]", key_name)
    _type(driver, "#token-form [name=key]", key)
    _click(driver, "#token-form button[type=submit]")


def test_the_page_mints_a_token_from_a_pasted_key(
    browser: Any, tmp_path: Path, processes: Processes
) -> None:
    address = _own_address()
    config = make_config({"work": {}}, RULES)
    _, port, _ = start_broker(processes, tmp_path, "--ui", "--host", address, config=config)
    browser.get(f"http://{address}:{port}/")
    _until(
        "the token form",
        lambda: browser.execute_script("return !document.getElementById('token-form').hidden"),
    )
    # plain http off loopback: no secure context, so no Web Crypto
    assert browser.execute_script("return [window.isSecureContext, !!crypto.subtle]") == [
        False,
        False,
    ]
    _until("the badge", lambda: _text(browser, "#live") == "needs a token")
    assert "SAS token is required" in _text(browser, "#error")
    _shot(browser, "token-1-form")

    # a wrong key: a clear 401, the form again, still waiting for a token
    _paste_key(browser, EMULATOR_RULE_NAME, "not-the-key")
    _until("the 401", lambda: "not authorized (401)" in _text(browser, "#error"))
    assert "Invalid SAS token signature" in _text(browser, "#error")
    assert "Invalid SAS token signature" in _text(browser, "#token-why")
    _until("the badge", lambda: _text(browser, "#live") == "needs a token")
    _shot(browser, "token-2-wrong-key")
    browser.get_log("browser")  # the refused requests so far were expected

    # the Listen-only key: the namespace, live; a send is refused for want of Send
    _paste_key(browser, LISTEN_ONLY["Name"], LISTEN_ONLY["Key"])
    _until("the namespace", lambda: "work" in _text(browser, "#namespaces"))
    _until("the live badge", lambda: _text(browser, "#live") == "live")
    assert not _text(browser, "#error")
    stored = browser.execute_script(
        "return [localStorage.length, Object.keys(sessionStorage), sessionStorage.getItem("
        "'sas-token')]"
    )
    assert stored[0] == 0 and stored[1] == ["sas-token"]
    assert stored[2].startswith("SharedAccessSignature sr=") and "skn=watcher" in stored[2]
    assert LISTEN_ONLY["Key"] not in stored[2]
    _shot(browser, "token-3-listen-only")
    browser.execute_script(
        "document.querySelector(`tr[data-entity='work']`).click();"
        "document.querySelector(`.tabs button[data-tab='send']`).click();"
        "document.getElementById('send-form').requestSubmit();"
    )
    _until("the refusal", lambda: "Send claim required" in _text(browser, "#error"))
    assert "not authorized (401)" in _text(browser, "#error")
    browser.get_log("browser")  # that 401 was the point

    # the Manage key: the send goes through
    browser.execute_script("sessionStorage.clear(); location.reload()")
    _until("the badge", lambda: _text(browser, "#live") == "needs a token")
    browser.get_log("browser")  # refused without a token, as it should be
    _paste_key(browser, EMULATOR_RULE_NAME, EMULATOR_KEY)
    _until("the live badge", lambda: _text(browser, "#live") == "live")
    browser.execute_script(
        "document.querySelector(`tr[data-entity='work']`).click();"
        "document.querySelector(`.tabs button[data-tab='send']`).click();"
        "document.getElementById('send-form').requestSubmit();"
    )
    _until("the send", lambda: _text(browser, "#send-result").startswith("sent "))
    assert not _text(browser, "#error")
    assert _errors(browser) == []


def test_the_page_signs_as_the_sdks_do(browser: Any, tmp_path: Path, processes: Processes) -> None:
    """The page's HMAC-SHA256 on both paths (Web Crypto here, on loopback; its own SHA-256)
    against RFC 4231's vectors and Python's ``hmac``, and whole tokens against ``sas.py``."""
    _, port, _ = start_broker(processes, tmp_path, "--ui")
    browser.get(f"http://127.0.0.1:{port}/")
    _until("the page", lambda: _text(browser, "#live") == "live")
    assert browser.execute_script("return !!crypto.subtle")
    script = """
        const [key, message, done] = arguments;
        const bytes = (hex) => new Uint8Array((hex.match(/../g) || []).map((h) => parseInt(h, 16)));
        const hex = (b) => [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
        hmacSha256(bytes(key), bytes(message)).then((subtle) => done(
            [hex(subtle), hex(hmacSha256Js(bytes(key), bytes(message)))]));
    """
    cases = [  # RFC 4231 test cases 1, 2, 6 and 7 (keys past one block), then edges
        (b"\x0b" * 20, b"Hi There"),
        (b"Jefe", b"what do ya want for nothing?"),
        (b"\xaa" * 131, b"Test Using Larger Than Block-Size Key - Hash Key First"),
        (
            b"\xaa" * 131,
            b"This is a test using a larger than block-size key and a larger than "
            b"block-size data. The key needs to be hashed before being used by the HMAC "
            b"algorithm.",
        ),
        (b"k", b""),
        (b"k" * 64, b"x" * 55),
        (b"k" * 65, b"x" * 56),
        (b"k", b"x" * 119),
    ]
    assert hmac.new(cases[1][0], cases[1][1], hashlib.sha256).hexdigest() == (
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    )
    for key, message in cases:
        expected = hmac.new(key, message, hashlib.sha256).hexdigest()
        got = browser.execute_async_script(script, key.hex(), message.hex())
        assert got == [expected, expected], (key, message)
    for uri, key_name, key in (
        ("sb://192.0.2.2", "RootManageSharedAccessKey", "SAS_KEY_VALUE"),
        ("sb://ns.servicebus.windows.net/orders/Subscriptions/all", "a b+c", "kéy/=+ !*'()"),
    ):
        minted = browser.execute_async_script(
            "const done = arguments[3]; mintToken(arguments[0], arguments[1], arguments[2],"
            " 1893456000).then(done);",
            uri,
            key_name,
            key,
        )
        assert minted == generate_sas_token(uri, key_name, key, 1893456000)
        js_only = browser.execute_async_script(
            "const done = arguments[3]; const subtle = crypto.subtle;"
            "Object.defineProperty(crypto, 'subtle', { value: undefined, configurable: true });"
            "mintToken(arguments[0], arguments[1], arguments[2], 1893456000).then((t) => {"
            "  Object.defineProperty(crypto, 'subtle', { value: subtle, configurable: true });"
            "  done(t); });",
            uri,
            key_name,
            key,
        )
        assert js_only == minted
    assert _errors(browser) == []


def test_ui_token_opens_the_page_with_a_token(
    browser: Any, tmp_path: Path, processes: Processes
) -> None:
    """``--ui-token`` with a connection string: the logged URL carries a token minted from
    its key after ``#sas=``; the page takes it, and the address bar loses it."""
    address = _own_address()
    config = make_config({"work": {}}, RULES)
    # the connection string's endpoint does not matter: the key signs for this namespace
    value = connection_string(5672, LISTEN_ONLY["Name"], LISTEN_ONLY["Key"])
    *_, log = start_broker(
        processes, tmp_path, "--ui", "--host", address, "--ui-token", value, config=config
    )
    found = URL.search(log)
    assert found is not None and "#sas=SharedAccessSignature" in found.group(1), log
    assert LISTEN_ONLY["Key"] not in log
    url = found.group(1).replace("localhost", address, 1)
    browser.get(url)
    _until("the namespace", lambda: "work" in _text(browser, "#namespaces"))
    _until("the live badge", lambda: _text(browser, "#live") == "live")
    assert browser.execute_script("return location.hash") == ""
    assert "skn=watcher" in browser.execute_script("return sessionStorage.getItem('sas-token')")
    assert browser.execute_script("return document.getElementById('token-form').hidden")
    assert _errors(browser) == []


def test_a_ui_token_the_broker_refuses_is_said(tmp_path: Path, processes: Processes) -> None:
    """A key the namespace does not have: the log says so, and the page will ask."""
    value = connection_string(5672, EMULATOR_RULE_NAME, "not-the-key")
    *_, log = start_broker(processes, tmp_path, "--ui", "--host", "0.0.0.0", "--ui-token", value)
    assert "--ui-token: this broker refuses it (Invalid SAS token signature" in log
    assert "the page will ask" in log


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--ui-token", "SharedAccessSignature sr=x"], "--ui-token needs --ui"),
        (["--ui", "--ui-token", "rootkey:secret"], "a SharedAccessSignature token or a connection"),
        (["--ui", "--ui-token", "SharedAccessSignature sr=x"], "--ui-token:"),
    ],
)
def test_ui_token_refuses_what_it_cannot_use(tmp_path: Path, args: list[str], said: str) -> None:
    """Exit 2 before anything listens, saying why."""
    done = subprocess.run(
        [sys.executable, "-m", "replication", "broker", "--config", "Config.json", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
    )
    assert done.returncode == 2 and said in done.stderr, done.stderr
