"""The one way configuration problems are worded and located (Config.json and pipeline files
both go through it; their own tests check the texts users see in context)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from replication.configproblems import (
    JSON,
    YAML,
    ConfigError,
    Positions,
    Problem,
    did_you_mean,
    format_loc,
    json_positions,
    located_problems,
    show,
    validation_problems,
)


def test_a_problem_is_one_line_with_what_is_known() -> None:
    assert str(Problem("a.yaml", "", "not YAML")) == "a.yaml: not YAML"
    assert str(Problem("a.yaml", "x[0].y", "bad", 3)) == "a.yaml:3: x[0].y: bad"
    assert str(Problem("a.json", "x", "bad", 3, 7, "queue 'q'")) == (
        "a.json:3:7: x: bad (in queue 'q')"
    )


def test_an_error_lists_every_problem_in_file_order() -> None:
    positions = Positions("f.yaml", {("b",): (5, 3), ("a",): (2, 1)})
    error = positions.error([(("b", "c"), "second"), (("a",), "first"), (("z",), "nowhere")])
    assert isinstance(error, ConfigError)
    assert str(error).splitlines() == [
        "f.yaml:2:1: a: first",
        "f.yaml:5:3: b.c: second",  # a missing property: where its parent is
        "f.yaml: z: nowhere",
    ]


def test_did_you_mean() -> None:
    assert did_you_mean("queu", ["queue", "topic"]) == " (did you mean 'queue'?)"
    assert did_you_mean("lockDuration", ["LockDuration"]) == (
        " (did you mean 'LockDuration'? case matters)"
    )
    assert did_you_mean("zzz", ["queue"]) == ""
    assert did_you_mean(5, ["queue"]) == ""


def test_locations_and_values_read_like_the_file() -> None:
    assert format_loc(("pipelines", 0, "steps", 1, "from")) == "pipelines[0].steps[1].from"
    assert format_loc(()) == ""
    assert (show({}, JSON), show([], JSON), show("x", JSON)) == ("an object", "an array", '"x"')
    assert (show({}, YAML), show([], YAML), show("x", YAML)) == ("a mapping", "a list", "'x'")
    assert show("y" * 100, JSON) == '"' + "y" * 55 + '..."'


def test_json_positions_find_properties_and_duplicates() -> None:
    positions, duplicates = json_positions("f.json", '{"a": {"b": 1,\n "b": 2}}')
    assert duplicates == [("a", "b")]
    assert positions.find(("a", "b")) == (2, 2)  # the later one: what json keeps
    assert positions.find(("a", "missing")) == (1, 2)  # its parent, at the parent's name


class _Pair(BaseModel):
    model_config = ConfigDict(extra="forbid")

    low: int
    high: int

    @model_validator(mode="after")
    def _ordered(self) -> _Pair:
        if self.low > self.high:
            raise located_problems([(("high",), f"must be at least low ({self.low})")])
        return self


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pairs: list[_Pair]


def test_pydantic_errors_in_plain_words_at_their_own_places() -> None:
    data = {"pairs": [{"low": 2, "high": 1}, {"low": "x", "hihg": 3}]}
    with pytest.raises(ValidationError, match=r"must be at least low \(2\)") as caught:
        _Doc.model_validate(data)
    assert sorted(validation_problems(caught.value, ("doc",), data, _Doc, JSON)) == [
        (("doc", "pairs", 0, "high"), "must be at least low (2)"),
        (("doc", "pairs", 1, "high"), "required property 'high' is missing"),
        (("doc", "pairs", 1, "hihg"), "unknown property 'hihg' (did you mean 'high'?)"),
        (("doc", "pairs", 1, "low"), 'expected an integer, got "x"'),
    ]
