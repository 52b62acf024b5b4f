"""Definitions as operators write them: accepted, or refused in words that say what to fix."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog import rules
from catalog.definitions import ProfileSpec, format_duration, parse_definition, parse_duration, spec_to_definition

EXAMPLE = yaml.safe_load("""
name: llama-70b
description: general chat, long context
source: hf://meta-llama/Llama-3.1-70B-Instruct
aliases: [llama]
fallbacks: [llama-8b]
scaling: {min: 1, max: 4, idle_timeout: 30m}
profiles:
  - {name: nvl, engine: vllm, gpu_class: gb200-185g, gpus: 4, nodes: 2, tp: 8, pp: 1}
  - {name: cpu, engine: llamacpp, gpu_class: cpu, memory_gb: 8, gpus: 0, nodes: 1, tp: 1, pp: 1}
""")


def test_the_issue_example_reads_back_as_written():
    spec, problems = parse_definition(EXAMPLE)
    assert problems == []
    assert spec.min_replicas == 1 and spec.max_replicas == 4 and spec.idle_timeout_s == 1800
    assert [p.name for p in spec.profiles] == ["nvl", "cpu"]
    assert spec_to_definition(spec) == EXAMPLE


def with_(**changes):
    return {**EXAMPLE, **changes}


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (with_(profils=[]), "unknown field 'profils'"),
        (with_(profiles=[]), "at least one way to run"),
        (with_(scaling={"min": 3, "max": 1}), "max replicas (1) is below min replicas (3)"),
        (with_(scaling={"min": -1}), "scaling.min must be 0 or more"),
        (with_(scaling={"idle_timeout": "soon"}), "not a duration"),
        (with_(scaling={"idle_timeout": 2**63}), "longer than a year"),
        (with_(scaling={"idle_timeout": float("inf")}), "longer than a year"),
        (with_(source="s3://bucket/x"), "must start with one of"),
        (with_(aliases=["llama-70b"]), "the model's own name"),
        (with_(fallbacks=["llama-70b"]), "cannot fall back to itself"),
        (with_(profiles=[{"engine": "tgi", "gpu_class": "h100-80g"}]), "engine 'tgi' is not one llmgw can run"),
        (with_(profiles=[{"engine": "vllm", "gpu_class": "h100-80g", "gpus": 2, "tp": 4}]), "tp × pp (4 × 1 = 4)"),
        (with_(profiles=[{"engine": "vllm", "gpu_class": "a100-80g-mig-3g.40gb", "tp": 2, "gpus": 2}]), "MIG instance"),
        (with_(profiles=[{"engine": "llamacpp", "gpu_class": "cpu"}]), "needs memory_gb"),
        (with_(profiles=[{"engine": "vllm", "gpu_class": "h100-80g", "env": {"X": 1}}]), "quote numbers"),
        (with_(profiles=[{"name": "a", "engine": "vllm", "gpu_class": "h100-80g"}] * 2), "used twice"),
        (with_(name="has space"), "must start with a letter or digit"),
        ("just text", "must be a mapping"),
    ],
)
def test_problems_name_the_field_and_the_fix(data, words):
    spec, problems = parse_definition(data)
    assert spec is None
    assert any(words in p for p in problems), problems


def test_max_left_out_follows_min_but_leaves_room_on_demand():
    spec, _ = parse_definition(with_(scaling={"min": 0}))
    assert (spec.min_replicas, spec.max_replicas) == (0, 1)
    spec, _ = parse_definition(with_(scaling={"min": 3}))
    assert spec.max_replicas == 3


@pytest.mark.parametrize(("text", "seconds"), [("30m", 1800), ("1h30m", 5400), ("45s", 45), ("90", 90), (120, 120)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds
    assert parse_duration(format_duration(seconds)) == seconds


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=12,
    )
)
def test_any_input_gives_a_spec_or_problems_never_an_exception(data):
    spec, problems = parse_definition(data)
    assert (spec is None) == bool(problems)


def test_a_spec_states_its_own_shape_problems():
    """The one place a profile's fields meet the shape rules, for the parser, the admin and the scheduler."""
    mig = ProfileSpec(name="m", engine="vllm", gpu_class="a100-80g-mig-3g.40gb", gpus=2, tp=2)
    assert mig.problems() == rules.profile_problems(
        engine="vllm", gpu_class="a100-80g-mig-3g.40gb", gpus=2, nodes=1, tp=2, pp=1, memory_gb=None
    )
    assert mig.problems() and ProfileSpec(name="h", engine="vllm", gpu_class="h100-80g").problems() == []


def test_the_fingerprint_is_no_part_of_a_specs_content():
    spec = ProfileSpec(name="h", engine="vllm", gpu_class="h100-80g", env=(("A", "b"),))
    assert spec == ProfileSpec(name="h", engine="vllm", gpu_class="h100-80g", env=(("A", "b"),), fingerprint="x")
    assert "fingerprint" not in spec.definition() and spec.definition()["env"] == {"A": "b"}
