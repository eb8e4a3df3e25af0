"""``--output`` rows are strict JSON: what ``json.loads(parse_constant=...)`` and other
languages' parsers read."""

from __future__ import annotations

import json

import pytest

from bass.cli.rows import LOGPROB_FLOOR, line


def strict(text: str) -> dict:
    def refuse(name):
        raise AssertionError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_a_minus_inf_log_probability_is_written_as_the_floor():
    record = {"completion": "x", "logprobs": [-0.5, float("-inf")],
              "prompt_logprobs": [None, float("-inf"), -2.0]}  # fmt: skip
    text = line(record)
    assert text.endswith("\n") and text.count("\n") == 1
    row = strict(text)
    assert row["logprobs"] == [-0.5, LOGPROB_FLOOR]
    assert row["prompt_logprobs"] == [None, LOGPROB_FLOOR, -2.0]
    assert record["logprobs"][1] == float("-inf")  # the caller's record unchanged


def test_a_row_without_log_probabilities_is_written_as_is():
    record = {"completion": "x", "settings": {"temperature": 0.7}}
    assert strict(line(record)) == record


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_nan_or_plus_inf_is_refused_not_written(bad):
    with pytest.raises(ValueError):
        line({"completion": "x", "logprobs": [bad]})
