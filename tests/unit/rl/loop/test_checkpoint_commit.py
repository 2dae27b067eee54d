"""A checkpoint's commit (sha256 and fsync of every file: minutes at 8B with AdamW) runs off the controller's event
loop, so pings and generation go on meanwhile: a coroutine ticking every 10 ms keeps ticking through a commit that
blocks its thread for 2 s. (How long a real commit would stall the loop depends on the disk and the page cache: a
measurement, not a test.)"""

import asyncio
import time

from rl.checkpoint import store as checkpoint
from rl.config import load_config
from rl.loop.state import RunState, save_checkpoint
from tests.support.paths import TINY

COMMIT_S = 2.0  # a commit on the loop would stall it this long; a loaded 2-core box stalls it far less


class NoRoles:
    async def save_checkpoint(self, tmp, weights_only=False):
        pass


async def test_the_event_loop_keeps_ticking_while_a_checkpoint_commits(tmp_path, monkeypatch):
    commit = checkpoint.commit

    def slow_commit(*args, **kwargs):
        time.sleep(COMMIT_S)  # blocks whichever thread runs it, as hashing a large checkpoint does
        return commit(*args, **kwargs)

    monkeypatch.setattr(checkpoint, "commit", slow_commit)
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker():
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    await save_checkpoint(tmp_path, RunState(step=1, policy_version=1), NoRoles(), load_config(TINY))
    done.set()
    await ticking
    assert checkpoint.newest_checkpoint(tmp_path).name == "step_00000001"
    assert max(gaps) < COMMIT_S * 0.75, f"the loop stalled {max(gaps):.2f} s during the commit"
