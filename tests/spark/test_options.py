"""The Spark sources' options: the connection option both take (a connection string, or the
name of an environment setting holding one, as Functions bindings name app settings), and
the pipeline stream's ``maxSecondsPerTrigger``."""

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


def test_a_pipeline_stream_s_seconds_per_trigger_must_be_positive() -> None:
    from replication.spark.pipeline_source import PipelineSourceOptions

    given = {"pipeline": "pipelines: []", "pipelineName": "copy"}
    assert PipelineSourceOptions.parse(given).max_seconds_per_trigger == 30.0
    parsed = PipelineSourceOptions.parse({**given, "maxSecondsPerTrigger": "2.5"})
    assert parsed.max_seconds_per_trigger == 2.5
    with pytest.raises(OptionError, match="'maxSecondsPerTrigger' must be more than 0"):
        PipelineSourceOptions.parse({**given, "maxSecondsPerTrigger": "0"})


def test_the_runner_refuses_seconds_per_trigger_that_are_not_more_than_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import argparse

    from replication.spark.runner import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    given = ["--pipeline", "copy"]
    assert parser.parse_args(given).max_seconds_per_trigger == 30.0
    five = parser.parse_args([*given, "--max-seconds-per-trigger", "5"])
    assert five.max_seconds_per_trigger == 5
    for bad, said in (("0", "give more than 0 seconds"), ("soon", "is not a number of seconds")):
        with pytest.raises(SystemExit) as exited:
            parser.parse_args([*given, "--max-seconds-per-trigger", bad])
        assert exited.value.code == 2
        assert said in capsys.readouterr().err
