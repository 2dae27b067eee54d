"""Partial rollouts that keep their tokens, in a whole run: at staleness budget 2 with `generator.on_weight_update =
"continue"`, weight updates reach the generator while its requests decode. Each such request pauses, the weights
swap, and it goes on from the tokens it has. Every trained completion then labels each token with the one version
that sampled it, versions never go back within a completion, none is older than the budget allows at the step that
trains it, and every row is still trained exactly once.

That a continued request samples no token twice and loses none is shown token for token against replays under each
version's weights in `tests/e2e/test_engine_loop.py`; this test checks the run around it.
"""

from tests.support.paths import TINY
from tests.support.runs import assert_rows_trained_once, read_jsonl, train_to_end

STEPS, GROUPS_PER_STEP, GROUP_SIZE, BUDGET, MAX_NEW_TOKENS = 3, 2, 4, 2, 64


def test_requests_continued_across_weight_updates_keep_their_tokens_labelled_by_version(tmp_path):
    train_to_end(
        "--config",
        str(TINY),
        "--run.output_dir",
        str(tmp_path),
        "--run.steps",
        str(STEPS),
        "--run.max_policy_staleness",
        str(BUDGET),
        "--generator.on_weight_update",
        "continue",
        "--run.eval_every",
        "0",
        "--wandb.enabled",
        "false",
        # one request decodes at a time, to the random-weight model's full 64 tokens: generation outlasts a training
        # step, so each weight update lands while a request decodes
        "--generator.max_num_seqs",
        "1",
        "--tasks.0.env.max_new_tokens",
        str(MAX_NEW_TOKENS),
        "--tasks.0.env.max_total_tokens",
        "128",
        "--tasks.0.rubric.reward_fns",
        "[{fn = 'tests.support.e2e_rewards:by_sample_index'}]",  # no group is dropped for zero advantage
    )
    run_dir = tmp_path / "tiny_qwen3_e2e"
    assert_rows_trained_once(run_dir, STEPS, GROUPS_PER_STEP, GROUP_SIZE)
    turns = [
        (record["step"], turn)
        for record in read_jsonl(run_dir / "rollouts.jsonl")
        if record["kind"] == "train"
        for turn in record["rollout"]["turns"]
    ]
    continued = 0
    for step, turn in turns:
        tokens, versions = turn["completion_token_ids"], turn["token_policy_versions"]
        assert len(turn["completion_logprobs"]) == len(tokens) <= MAX_NEW_TOKENS
        if not versions:  # one version sampled every token
            assert step - 1 - turn["policy_version"] <= BUDGET
            continue
        continued += 1
        assert len(versions) == len(tokens)
        assert versions == sorted(versions) and versions[0] < versions[-1]
        assert turn["policy_version"] == versions[0]  # a turn's version is its oldest token's
        assert step - 1 - versions[0] <= BUDGET and versions[-1] <= step - 1  # trained at step s by version s - 1
    assert continued > 0, "no request was in flight at a weight update: the test proves nothing"
