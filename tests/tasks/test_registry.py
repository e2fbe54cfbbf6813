"""The step registry: built-in steps are there without importing their modules, an app's own
step is checked and built like a built-in one, and the step API does not import the steps."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from replication.messages import Message
from replication.pipeline import PipelineConfigError, parse_pipelines
from replication.tasks import registry
from replication.tasks.steps import Step, StepConfigError, StepContext, StepOptions, step

SETTINGS = {
    "Bus": "Endpoint=sb://primary.example/;SharedAccessKeyName=k;SharedAccessKey=s",
}


class SuffixOptions(StepOptions):
    suffix: str


def _suffix(options: SuffixOptions, context: StepContext) -> Step:
    """Appends ``suffix`` to the body."""

    def run(message: Message) -> list[Message]:
        return [message.copy(body=message.body + options.suffix.encode())]

    return run


@pytest.fixture
def suffix_step() -> Iterator[str]:
    step("test-suffix", SuffixOptions)(_suffix)
    yield "test-suffix"
    registry.unregister("test-suffix")


def test_the_built_in_steps_are_registered() -> None:
    names = registry.names()
    for name in ("route", "transcode", "filter", "dedupe", "encrypt", "chain", "batch"):
        assert name in names
    assert names == sorted(names)
    assert [spec.name for spec in registry.specs()] == names
    assert registry.lookup("Transcode") is None  # names are case-sensitive


def test_an_unknown_step_is_a_config_error() -> None:
    with pytest.raises(StepConfigError, match=r"^unknown step 'nope'; known steps: attest, "):
        registry.build_step("nope")


def test_an_apps_own_step_is_checked_and_built_like_a_built_in(suffix_step: str) -> None:
    text = textwrap.dedent(f"""\
        pipelines:
          - name: tagged
            source: {{connection: Bus, queue: a}}
            steps:
              - {suffix_step}: {{suffix: "!"}}
            target: {{connection: Bus, queue: b}}
    """)
    built = parse_pipelines(text, "pipelines.yaml").get("tagged").build(SETTINGS)
    (out,) = built.task.plan(Message(body=b"hi")).outputs
    assert out.body == b"hi!"
    bad = text.replace('{suffix: "!"}', "{sufix: x}")
    with pytest.raises(PipelineConfigError, match="unknown property 'sufix'") as caught:
        parse_pipelines(bad, "pipelines.yaml")
    assert str(caught.value).splitlines() == [
        "pipelines.yaml:5:9: pipelines[0].steps[0].test-suffix.suffix: required property "
        "'suffix' is missing",
        "pipelines.yaml:5:23: pipelines[0].steps[0].test-suffix.sufix: unknown property 'sufix' "
        "(did you mean 'suffix'?)",
    ]


def test_unregistered_steps_are_gone(suffix_step: str) -> None:
    assert registry.lookup(suffix_step) is not None
    registry.unregister(suffix_step)
    assert registry.lookup(suffix_step) is None
    registry.unregister(suffix_step)  # unknown names are ignored


def test_the_step_api_imports_no_step() -> None:
    """Steps import ``steps``; only the registry imports the steps (no import cycle)."""
    code = (
        "import sys, replication.tasks.steps\n"
        "loaded = [m for m in sys.modules if m.startswith(('replication.tasks.router', "
        "'replication.tasks.editors', 'replication.tasks.registry'))]\n"
        "print(loaded)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"
