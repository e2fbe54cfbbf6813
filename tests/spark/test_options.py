"""The connection option both Spark sources take: a connection string, or the name of an
environment setting holding one (as Functions bindings name app settings)."""

from __future__ import annotations

import pytest

from replication.spark.options import OptionError, connection_option


def test_a_connection_string_or_the_setting_that_holds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert connection_option({"connectionstring": "Endpoint=sb://a/"}) == "Endpoint=sb://a/"
    monkeypatch.setenv("Bus", "Endpoint=sb://b/")
    assert connection_option({"connection": "Bus"}) == "Endpoint=sb://b/"
    monkeypatch.delenv("Bus")
    with pytest.raises(OptionError, match="names the setting 'Bus', which is not set"):
        connection_option({"connection": "Bus"})
    with pytest.raises(OptionError, match="give option 'connectionString'"):
        connection_option({})
