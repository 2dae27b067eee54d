"""Teacher scoring (opd, opsd; seed 002): a concurrency bound and its seconds in `time/scoring_s`."""

import asyncio
import time
from types import SimpleNamespace

from rl.config import load_config
from rl.loop.roles import Roles
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
