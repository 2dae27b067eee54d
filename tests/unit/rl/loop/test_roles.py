"""Teacher scoring (opd, opsd; seed 002): a concurrency bound and its seconds in `time/scoring_s`; a frozen model
whose token ids reach the loss must share the policy's tokenizer, checked when the run is set up."""

import asyncio
import time
from types import SimpleNamespace

import pytest

from rl.config import load_config
from rl.loop.controller import Controller
from rl.loop.roles import Roles, tokenizer_mismatches
from rl.metrics.reduce import drain_states, reduce_states
from tests.support.paths import E2E_CONFIGS


class CountingTeacher:
    """Stands in for a frozen model's generator service: scores a sequence in 50 ms (logprob -id for each token),
    counting how many it scores at once."""

    def __init__(self):
        self.running = self.most = 0
        self.prompt_logprobs = SimpleNamespace(route=self.route)

    async def route(self, ids):
        self.running += 1
        self.most = max(self.most, self.running)
        await asyncio.sleep(0.05)
        self.running -= 1
        return [-float(token) for token in ids]


async def test_teacher_scoring_is_bounded_and_timed():
    config = load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml", {"run.max_concurrent_scoring": "3"})
    roles = Roles(config, stop_run=lambda message: None, policy_version=lambda: 0)
    roles.frozen["teacher"] = teacher = CountingTeacher()
    sequences = [[index, index + 1] for index in range(10)]
    drain_states()
    start = time.perf_counter()
    scored = await roles.prompt_logprobs("teacher", sequences)
    elapsed = time.perf_counter() - start
    assert scored == [[-float(index), -float(index + 1)] for index in range(10)]
    assert teacher.most == 3  # 10 sequences, at most 3 at once: 4 waves of 50 ms
    metrics, _ = reduce_states([drain_states()])
    assert 4 * 0.05 <= metrics["time/scoring_s"] <= elapsed


@pytest.mark.parametrize("role", ["teacher", "sampler"])
def test_a_frozen_model_with_another_tokenizer_is_refused_at_set_up(role):
    kind = "opd" if role == "teacher" else "sft"
    overrides = {
        "models.big.path": "'smollm2-135m-instruct'",  # the policy is tiny-qwen3: Qwen3's tokenizer, not SmolLM2's
        "tasks.0.algorithm": f"{{type = '{kind}', {role} = 'big'}}",
    }
    config = load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml", overrides)
    [problem] = tokenizer_mismatches(config)
    assert f"[models.big] (smollm2-135m-instruct), tasks.0 (sum_digits)'s {role}, does not share" in problem
    with pytest.raises(ValueError, match="does not share the policy's tokenizer"):
        Controller(config)
    same = load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml", {**overrides, "models.big.path": "'tiny-qwen3'"})
    assert tokenizer_mismatches(same) == []
