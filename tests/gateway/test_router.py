"""Routing: least loaded, prefix affinity, bounded load."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from gateway import router
from gateway.router import bound, choose, prompt_prefix

REPLICAS = ["a", "b", "c", "d"]


def test_without_a_prefix_the_least_loaded_replica_wins():
    assert choose(REPLICAS, {"a": 3, "b": 1, "c": 2, "d": 5}, None) == "b"


def test_ties_are_shared_rather_than_all_going_to_the_first():
    rng = random.Random(1)
    seen = {choose(REPLICAS, {}, None, rng=rng) for _ in range(100)}
    assert seen == set(REPLICAS)


def test_a_prefix_always_goes_to_the_same_replica_while_loads_are_even():
    picks = {choose(REPLICAS, {r: 2 for r in REPLICAS}, "You are a tutor.") for _ in range(20)}
    assert len(picks) == 1


def test_different_prefixes_spread_over_the_replicas():
    picks = {choose(REPLICAS, {}, f"system prompt number {i}") for i in range(200)}
    assert picks == set(REPLICAS)


def test_an_overloaded_favourite_is_passed_over_for_the_prefixs_next_choice():
    favourite = choose(REPLICAS, {}, "shared prefix")
    loads = {r: 1 for r in REPLICAS}
    loads[favourite] = 10
    second = choose(REPLICAS, loads, "shared prefix")
    assert second != favourite
    # ...and the same second choice every time, so the cache there warms up too.
    assert {choose(REPLICAS, loads, "shared prefix") for _ in range(10)} == {second}


def test_failed_replicas_are_excluded_until_none_is_left():
    assert choose(REPLICAS, {}, "p", exclude={"a", "b", "c"}) == "d"
    assert choose(REPLICAS, {}, "p", exclude=set(REPLICAS)) is None
    assert choose([], {}, None) is None


@given(
    loads=st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=8),
    prefix=st.one_of(st.none(), st.text(min_size=1, max_size=30)),
    factor=st.floats(min_value=1.0, max_value=3.0),
)
def test_the_choice_is_never_above_the_load_bound(loads, prefix, factor):
    replicas = [f"r{i}" for i in range(len(loads))]
    in_flight = dict(zip(replicas, loads, strict=True))
    picked = choose(replicas, in_flight, prefix, load_factor=factor)
    assert picked in replicas
    least = min(loads)
    cap = bound(sum(loads), len(loads), factor)
    # Either within the bound, or (no replica is) the least loaded one.
    assert in_flight[picked] + 1 <= cap or in_flight[picked] == least


def test_prompt_prefix_reads_messages_and_prompts():
    body = {"messages": [{"role": "system", "content": "abc" * 200}, {"role": "user", "content": "q"}]}
    assert prompt_prefix(body, 10) == "system:abc"
    assert prompt_prefix({"prompt": "hello world"}, 5) == "hello"
    assert prompt_prefix({"prompt": ["first", "second"]}, 100) == "first"
    assert prompt_prefix({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}, 100) == (
        "user:hi\n"
    )
    assert prompt_prefix({"input": "x"}, 10) is None
    assert prompt_prefix({"prompt": "x"}, 0) is None


@given(
    st.lists(st.sampled_from("abcdef"), min_size=1, max_size=6, unique=True),
    st.sets(st.sampled_from("abcdef")),
    st.sets(st.sampled_from("abcdef")),
    st.sets(st.sampled_from("abcdef")),
    st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 50)),
    st.one_of(st.none(), st.text(max_size=10)),
)
def test_a_preferred_replica_is_chosen_while_one_is_left_and_another_only_then(
    replicas, preferred, then, exclude, in_flight, prefix
):
    chosen = router.choose_preferring(replicas, preferred, in_flight, prefix, exclude=exclude, then=then)
    left = [r for r in replicas if r not in exclude]
    if not left:
        assert chosen is None
    elif any(r in preferred for r in left):
        assert chosen in preferred and chosen in left
    elif any(r in then for r in left):
        assert chosen in then and chosen in left, "the replicas that reload to switch come second"
    else:
        assert chosen in left
