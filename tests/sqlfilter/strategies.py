"""Hypothesis strategies for filter and action syntax trees, and for messages to run them on."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import strategies as st

from replication.sqlfilter import MessageFacts
from replication.sqlfilter.ast import (
    ARITHMETIC_OPERATORS,
    COMPARISON_OPERATORS,
    And,
    Binary,
    Comparison,
    Exists,
    In,
    IsNull,
    Like,
    Literal,
    NewId,
    Not,
    Or,
    Parameter,
    Property,
    PropertyFunction,
    Remove,
    Scope,
    Set,
    Unary,
)
from replication.sqlfilter.facts import SETTABLE_NAMES, SYSTEM_PROPERTIES
from replication.sqlfilter.like import check_pattern

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
PARAMETERS: dict[str, Any] = {
    "@p": 1,
    "@Name": "a",
    "@when": NOW,
    "@span": timedelta(minutes=5),
    "@flag": True,
    "@ratio": 0.5,
    "@nothing": None,
}
"""Every generated tree may use these; pass them when parsing."""

LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
longs = st.integers(LONG_MIN, LONG_MAX)
doubles = st.floats(allow_nan=False, allow_infinity=False)

# a few names, so that generated filters meet the properties generated messages have
NAMES = ["a", "B", "color", "my prop", "and", "x]y", "Größe"]
SYSTEM_NAMES = [p.name for p in SYSTEM_PROPERTIES]

user_properties = st.one_of(st.sampled_from(NAMES), st.text(min_size=1, max_size=5)).map(
    lambda name: Property(Scope.USER, name)
)
system_properties = st.sampled_from(SYSTEM_NAMES).map(lambda name: Property(Scope.SYS, name))
properties = st.one_of(user_properties, system_properties)
parameters = st.sampled_from([name[1:] for name in PARAMETERS]).map(Parameter)


def literals() -> st.SearchStrategy[Literal]:
    small = st.one_of(
        st.integers(-3, 3), st.sampled_from([0.5, -1.5, 2.0]), st.sampled_from(["a", "A", "", "a%"])
    )
    wide = st.one_of(longs, doubles, st.text(max_size=6))
    return st.one_of(st.none(), st.booleans(), small, wide).map(Literal)


def values(deterministic: bool = False) -> st.SearchStrategy[Any]:
    """Value trees; ``deterministic`` leaves out ``newid()``."""
    leaves = st.one_of(literals(), properties, parameters)
    if not deterministic:
        leaves = st.one_of(leaves, st.just(NewId()))
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.builds(Unary, st.sampled_from("+-"), inner),
            st.builds(Binary, st.sampled_from(ARITHMETIC_OPERATORS), inner, inner),
            st.builds(PropertyFunction, inner),
        ),
        max_leaves=6,
    )


@st.composite
def likes(draw: st.DrawFn, value_trees: st.SearchStrategy[Any]) -> Like:
    operand = draw(value_trees)
    pattern = draw(
        st.one_of(st.text(alphabet="ab%_!\\", max_size=6).map(Literal), properties, parameters)
    )
    escape = draw(
        st.one_of(st.none(), st.sampled_from(["!", "\\", "%"]).map(Literal), user_properties)
    )
    if isinstance(pattern, Literal) and (escape is None or isinstance(escape, Literal)):
        escape_char = None if escape is None else escape.value
        if check_pattern(pattern.value, escape_char) is not None:  # type: ignore[arg-type]
            escape = None
    return Like(operand, pattern, escape, draw(st.booleans()))


def predicates(deterministic: bool = False) -> st.SearchStrategy[Any]:
    value_trees = values(deterministic)
    atoms = st.one_of(
        st.builds(Comparison, st.sampled_from(COMPARISON_OPERATORS), value_trees, value_trees),
        st.builds(
            IsNull,
            st.one_of(properties, st.builds(PropertyFunction, value_trees)),
            st.booleans(),
        ),
        st.builds(
            In,
            value_trees,
            st.lists(value_trees, min_size=1, max_size=3).map(tuple),
            st.booleans(),
        ),
        likes(value_trees),
        st.builds(Exists, properties),
    )
    return st.recursive(
        atoms,
        lambda inner: st.one_of(
            st.builds(Not, inner),
            st.lists(inner, min_size=2, max_size=3).map(tuple).map(And),
            st.lists(inner, min_size=2, max_size=3).map(tuple).map(Or),
        ),
        max_leaves=5,
    )


targets = st.one_of(
    user_properties, st.sampled_from(SETTABLE_NAMES).map(lambda n: Property(Scope.SYS, n))
)
statements = st.lists(
    st.one_of(st.builds(Set, targets, values()), st.builds(Remove, targets)),
    min_size=1,
    max_size=4,
).map(tuple)

# -- messages ---------------------------------------------------------------------------------

property_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    longs,
    st.sampled_from([0.5, -1.5, 2.0, float("nan")]),
    doubles,
    st.sampled_from(["a", "A", "", "a%", "ab!", "sys.Label", "color"]),
    st.text(max_size=4),
    st.just(NOW),
    st.just(timedelta(minutes=5)),
    st.just(uuid.UUID(int=7)),
)


@st.composite
def messages(draw: st.DrawFn) -> MessageFacts:
    user = draw(st.dictionaries(st.sampled_from(NAMES), property_values, max_size=5))
    system = draw(
        st.dictionaries(
            st.sampled_from(["Label", "To", "MessageId", "SequenceNumber", "EnqueuedTimeUtc"]),
            st.sampled_from(["a", "A", 1, NOW]),
            max_size=3,
        )
    )
    return MessageFacts(system, user)
