"""The report's indented JSON writer is ``json.dumps(value, indent=N, allow_nan=False)`` to the
byte, over generated values of every JSON type (and the non-string keys, tuples and subclasses
of int and float json accepts), and fails where it fails."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodtrace.renderers.json_text import dumps_indented, dumps_items

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12),
    st.floats(allow_nan=False, allow_infinity=False).map(np.float64),  # a float subclass: written as a float
)
keys = st.one_of(st.text(max_size=8), st.integers(-5, 5), st.floats(allow_nan=False, allow_infinity=False),
                 st.booleans(), st.none())
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.lists(inner, max_size=3).map(tuple),
                            st.dictionaries(keys, inner, max_size=4)),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(values, st.integers(0, 4))
def test_the_text_is_json_dumps_s(value: Any, indent: int) -> None:
    assert dumps_indented(value, indent) == json.dumps(value, indent=indent, allow_nan=False)
    # set in a text at some indentation: every line after the first indented further
    assert dumps_indented(value, indent, "\n    ") == json.dumps(value, indent=indent, allow_nan=False).replace(
        "\n", "\n    ")


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(keys, values, max_size=6), st.integers(0, 4))
def test_an_object_written_from_its_pairs_is_the_object_s_text(value: dict[Any, Any], indent: int) -> None:
    # twice: the second time the keys' text comes from what the first one kept
    for _ in range(2):
        assert dumps_items(value.items(), indent, "\n  ") == json.dumps(value, indent=indent, allow_nan=False).replace(
            "\n", "\n  ")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, {"a": [1, math.nan]}, {math.inf: 1}])
def test_a_float_json_cannot_hold_is_a_value_error_as_in_json(bad: Any) -> None:
    with pytest.raises(ValueError):
        json.dumps(bad, indent=2, allow_nan=False)
    with pytest.raises(ValueError):
        dumps_indented(bad, 2)


@pytest.mark.parametrize("bad", [{"a": object()}, [np.int64(3)], {(1, 2): 3}, {1, 2}])
def test_what_json_cannot_encode_is_a_type_error_as_in_json(bad: Any) -> None:
    with pytest.raises(TypeError):
        json.dumps(bad, indent=2, allow_nan=False)
    with pytest.raises(TypeError):
        dumps_indented(bad, 2)
