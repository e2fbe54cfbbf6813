"""Where telemetry goes: a setting that is wrong leaves its home out, and says so."""

from __future__ import annotations

import pytest

from replication.telemetry.export import _exporters


def test_a_wrong_connection_string_leaves_azure_monitor_out_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Telemetry that cannot be sent must not stop the app from loading."""
    with caplog.at_level("ERROR", logger="replication.telemetry"):
        homes = _exporters({"APPLICATIONINSIGHTS_CONNECTION_STRING": "not a connection string"})
    assert homes == []
    assert "APPLICATIONINSIGHTS_CONNECTION_STRING is not usable" in caplog.text
