"""``python -m replication resolve``: the chain, the namespace alone on the last line, and a
non-zero exit with the reason when it cannot resolve."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from replication.cli import main
from tests.broker.conftest import REPO_ROOT

from .dns_server import ALIAS, DnsServer

SB1 = "sb1-test-example-com.servicebus.windows.net"


def test_resolve_prints_the_chain_and_the_host_last(
    dns_server: DnsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["resolve", ALIAS, "--nameserver", dns_server.address]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"alias {ALIAS}",
        "CNAME sb1.test.example.com (ttl 60)",
        "SRV _azure_servicebus._amqp.sb1.test.example.com (ttl 60):",
        f"  1 1 5671 {SB1}  <- chosen",
        f"  2 2 443 {SB1}  (port 443, not 5671)",
        SB1,
    ]


def test_resolve_reads_the_nameserver_setting_and_fails_clearly(
    dns_server: DnsServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REPLICATION_DNS_NAMESERVER", dns_server.address)
    assert main(["resolve", "nowhere.test.example.com"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "error: nowhere.test.example.com does not exist (NXDOMAIN): check the alias\n"
    )


def test_resolve_a_file_and_argument_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    share = tmp_path / "primary.txt"
    share.write_text(f"# primary\n{SB1}\n")
    assert main(["resolve", "--file", str(share)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"file {share} (line 2)", SB1]
    assert main(["resolve", "--file", str(tmp_path / "missing.txt")]) == 1
    assert "error: cannot read" in capsys.readouterr().err
    for wrong, message in [
        ([], "one of the arguments alias --file is required"),
        ([ALIAS, "--file", str(share)], "argument --file: not allowed with argument alias"),
        (["--file", str(share), ALIAS], "argument alias: not allowed with argument --file"),
    ]:
        with pytest.raises(SystemExit, match=r"^2$") as exited:
            main(["resolve", *wrong])
        assert exited.value.code == 2
        assert message in capsys.readouterr().err
    assert main(["resolve", "a..b.example"]) == 1
    assert (
        capsys.readouterr().err
        == "error: 'a..b.example' is not a DNS name: A DNS label is empty.\n"
    )


def test_the_module_entry_point(dns_server: DnsServer) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "replication", "resolve", ALIAS, "--nameserver",
         dns_server.address],
        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == SB1
