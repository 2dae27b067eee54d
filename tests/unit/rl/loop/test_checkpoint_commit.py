"""A checkpoint's commit (sha256 and fsync of every file: minutes at 8B with AdamW) runs off the controller's event
loop, so pings and generation go on meanwhile: a coroutine ticking every 10 ms keeps ticking, through a commit slowed
to 1 s and through the real hashing and fsync of a 64 MB file set (which stalls a loop that commits on it)."""

import asyncio
import time

from rl.checkpoint import store as checkpoint
from rl.config import load_config
from rl.loop.state import RunState, save_checkpoint
from tests.support.paths import TINY

COMMIT_S = 1.0


FILES, FILE_BYTES = 64, 1 << 20


class NoRoles:
    async def save_checkpoint(self, tmp, weights_only=False):
        pass


class ShardWritingRoles:
    """Roles that leave FILES trainer shards of FILE_BYTES each, as the ranks of a large model do (off the loop: the
    ranks are other processes)."""

    async def save_checkpoint(self, tmp, weights_only=False):
        def write() -> None:
            for index in range(FILES):
                (tmp / "trainer" / f"__{index}_0.distcp").write_bytes(index.to_bytes(4, "little") * (FILE_BYTES // 4))

        await asyncio.to_thread(write)


async def largest_gap_while(work) -> tuple[float, float]:
    """(longest gap between ticks of a 10 ms ticker, seconds `work` took) while awaiting `work`."""
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
    start = time.perf_counter()
    await work
    took = time.perf_counter() - start
    done.set()
    await ticking
    return max(gaps), took


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
    assert max(gaps) < COMMIT_S / 2, f"the loop stalled {max(gaps):.2f} s during the commit"


async def test_the_event_loop_keeps_ticking_while_a_large_file_set_is_hashed_and_fsynced(tmp_path):
    config = load_config(TINY)

    async def on_the_loop():  # what the commit did before: hashing and fsync on the loop's own thread
        state = RunState(step=1, policy_version=1)
        tmp = checkpoint.begin(tmp_path / "blocking", state.step)
        await ShardWritingRoles().save_checkpoint(tmp)
        checkpoint.commit(tmp_path / "blocking", tmp, state.step, keep=1)

    stalled, _ = await largest_gap_while(on_the_loop())
    assert stalled > 0.2, f"the file set is too small to show anything: a blocking commit stalled only {stalled:.2f} s"

    state = RunState(step=1, policy_version=1)
    gap, took = await largest_gap_while(save_checkpoint(tmp_path / "threaded", state, ShardWritingRoles(), config))
    committed = checkpoint.newest_checkpoint(tmp_path / "threaded")
    assert len(list((committed / "trainer").iterdir())) == FILES
    assert gap < stalled / 2, f"the loop stalled {gap:.2f} s during a {took:.2f} s save (on the loop: {stalled:.2f} s)"
