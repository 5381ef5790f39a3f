"""Parsing the model's answer: both formats, last action wins, garbage never raises."""
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.actions import ACTIONS, parse_action


def test_tag_format():
    assert parse_action("<action>right</action>") == "right"
    assert parse_action("I see the goal. <action> Down </action>") == "down"
    assert parse_action("<ACTION>stop</ACTION>") == "stop"


def test_tuple_format():
    assert parse_action("('move', 0)") == "right"
    assert parse_action('("move", 3)') == "down"
    assert parse_action("('stop', 'stop')") == "stop"
    assert parse_action(("move", 1)) == "up"
    assert parse_action(("move", 4)) is None and parse_action(("move", True)) is None


def test_last_action_wins_across_formats():
    assert parse_action("<action>left</action> no wait <action>up</action>") == "up"
    assert parse_action("<action>left</action> ('move', 0)") == "right"
    assert parse_action("('move', 0) then <action>stop</action>") == "stop"
    # an invalid last action makes the answer invalid: the model said something we cannot do
    assert parse_action("<action>left</action><action>jump</action>") is None


def test_garbage_and_empty():
    for bad in ["", "   ", "right-ish", "<action></action>", "<action>north</action>", "('move', 9)",
                "('move', -1)", "('fly', 0)", "<action>right", "action>right</action>", None, 3.5, ["right"]]:
        assert parse_action(bad) is None, bad


def test_huge_inputs_parse_quickly():
    junk = "x<action" * 200_000 + "<action>left</action>" + "(" * 300_000
    assert parse_action(junk) == "left"
    assert parse_action("a" * 5_000_000) is None


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_text_parses_to_an_action_or_none(text):
    assert parse_action(text) in ACTIONS + (None,)


@settings(max_examples=100, deadline=None)
@given(prefix=st.text(max_size=50), action=st.sampled_from(ACTIONS))
def test_an_appended_action_is_found(prefix, action):
    assert parse_action(prefix + f"<action>{action}</action>") == action
