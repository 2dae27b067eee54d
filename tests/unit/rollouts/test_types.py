import pytest

from rollouts.types import Rollout, RolloutGroup, RolloutStatus, RolloutTurn


def test_only_ongoing_is_not_terminal():
    assert [status for status in RolloutStatus if not status.is_terminal()] == [RolloutStatus.ONGOING]


def test_trainable_statuses():
    assert {status for status in RolloutStatus if status.is_trainable()} == {
        RolloutStatus.COMPLETED,
        RolloutStatus.TRUNCATED,
    }


@pytest.mark.parametrize("target", [s for s in RolloutStatus if s is not RolloutStatus.ONGOING])
def test_ongoing_moves_to_any_terminal_status(target):
    assert RolloutStatus.ONGOING.transition(target) is target


@pytest.mark.parametrize("terminal", [s for s in RolloutStatus if s.is_terminal()])
def test_terminal_status_never_changes(terminal):
    with pytest.raises(ValueError, match="terminal"):
        terminal.transition(RolloutStatus.COMPLETED)


def test_fail_keeps_partial_turns_and_records_error():
    rollout = Rollout(rollout_id="g/0", group_id="g", task_name="t", sample_index=0)
    rollout.turns.append(RolloutTurn(prompt_messages=[], prompt_token_ids=[1, 2]))
    rollout.fail(RolloutStatus.TIMEOUT, "env step timed out")
    assert rollout.status is RolloutStatus.TIMEOUT and rollout.error == "env step timed out"
    assert len(rollout.turns) == 1
    with pytest.raises(ValueError):
        rollout.fail(RolloutStatus.ERROR, "again")


def _multi_turn_rollout() -> Rollout:
    system = {"role": "system", "content": "You are a calculator."}
    user = {"role": "user", "content": "2+2?"}
    first_answer = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}],
    }
    tool = {"role": "tool", "content": "4"}
    return Rollout(
        rollout_id="sum/3/1",
        group_id="sum/3",
        task_name="calc",
        sample_index=1,
        turns=[
            RolloutTurn(
                prompt_messages=[system, user],
                prompt_token_ids=[10, 11, 12],
                completion_token_ids=[20, 21],
                completion_logprobs=[-0.125, -1.0000000000000002],
                finish_reason="stop",
                assistant_message=first_answer,
                env_messages=[tool],
                reward_components={"tool_ok": 1.0},
                policy_version=3,
            ),
            RolloutTurn(
                prompt_messages=[system, user, first_answer, tool],
                prompt_token_ids=[10, 11, 12, 20, 21, 30],
                completion_token_ids=[40],
                completion_logprobs=[-3.3e-08],
                finish_reason="length",
                assistant_message={"role": "assistant", "content": "4", "reasoning_content": "easy"},
                policy_version=4,
            ),
        ],
        status=RolloutStatus.TRUNCATED,
        reward=0.75,
        reward_components={"correct": 1.0, "format": 0.0},
        metadata={"note": "ünïcode ✓"},
    )


def test_multi_turn_rollout_json_round_trip_is_lossless():
    rollout = _multi_turn_rollout()
    restored = Rollout.model_validate_json(rollout.model_dump_json())
    assert restored == rollout
    assert restored.turns[0].completion_logprobs[1] == -1.0000000000000002
    assert restored.status is RolloutStatus.TRUNCATED
    assert restored.policy_versions == [3, 4]


def test_group_round_trip_and_min_policy_version():
    group = RolloutGroup(
        group_id="sum/3", task_name="calc", example={"q": "2+2", "answer": 4}, rollouts=[_multi_turn_rollout()]
    )
    assert RolloutGroup.model_validate_json(group.model_dump_json()) == group
    assert group.min_policy_version == 3


def test_unknown_field_is_rejected():
    with pytest.raises(Exception, match="extra"):
        Rollout(rollout_id="a", group_id="g", task_name="t", sample_index=0, rewrd=1.0)
