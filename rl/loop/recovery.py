"""In-run trainer recovery: a lost trainer is replaced and the run goes on from its newest checkpoint.

    loss:     Monarch's supervision (`Roles.on_trainer_lost`), a rank's process gone (its pid, every second on this
              host), or a trainer call that failed or missed its deadline
    recover:  the step in flight is cancelled (its rollouts, metric states and log lines are dropped) → the old mesh
              stopped and its processes killed → a new trainer mesh (every rank) → the newest loadable checkpoint loaded
              into it, into the reward replicas (RNG) and this process (RNG, progress: `rewind`) → the logs cut back to
              its step → the generators reload its policy version through the normal weight sync → the steps since are
              trained again

Every request carries its own sampling seed, so at `run.max_policy_staleness = 0` the steps trained again are the
clean run's, bit for bit (as after a resume; `tests/e2e/test_trainer_recovery.py`); under a staleness budget every
row is still trained exactly once. `run.max_trainer_recoveries` recoveries at most: one loss more, or a loss before
the first committed checkpoint, stops the run with `TrainerLost`.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Protocol

import psutil
from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError

from rl.checkpoint import store as checkpoint
from rl.checkpoint.resume import restore_logs
from rl.config import Config
from rl.console import say
from rl.loop.admission import Admission
from rl.loop.roles import RESUME_HINT, DeadlineMissed, Roles
from rl.loop.state import Checkpoints, RunState
from rl.loop.weight_update import sync_policy
from rl.metrics.actor import gather_states
from rl.metrics.reduce import Reduce, drain_states, record_metric

PID_CHECK_S = 1.0
"""How often the trainer ranks' processes on this host are checked (Monarch's supervision polls about every 10 s)."""


class TrainerLost(RuntimeError):
    """The trainer was lost and the run cannot recover it (`run.max_trainer_recoveries` spent, no checkpoint yet)."""


class Recoverable(Protocol):
    """What the recovery needs of the run's controller (`rl.loop.controller.Controller`, which imports this module)."""

    config: Config
    roles: Roles
    checkpoints: Checkpoints

    @property
    def state(self) -> RunState: ...

    @property
    def admission(self) -> Admission: ...

    @property
    def run_dir(self) -> Path: ...

    async def train(self) -> dict[str, Any]:
        """The training, from the controller's progress to the run's end."""
        ...

    async def drop_step_in_flight(self) -> None:
        """Cancel the train step in flight, if any."""
        ...

    def rewind(self, checkpoint_dir: Path) -> None:
        """The loop's progress as of committed checkpoint `checkpoint_dir`."""
        ...


class TrainerRecovery:
    """Runs the controller's training, and after each trainer loss a recovery and the training again (module docstring)."""

    def __init__(self, controller: Recoverable):
        self.controller = controller
        self.budget = controller.config.run.max_trainer_recoveries
        self.count = 0
        """Recoveries started so far."""
        self.lost: str | None = None
        """Why the trainer was lost, from the loss until a new trainer runs."""
        self._lost_at = 0.0
        self.recovering = False
        """From a recovery's start until the new trainer trains: a Ctrl-C then leaves the run directory as
        `interrupted_message` says."""
        self._train_task: asyncio.Task | None = None
        self._training = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watched_pids: list[int] = []
        self._watched: list[psutil.Process] = []
        controller.roles.on_trainer_lost = self.lose

    def lose(self, reason: str) -> None:
        """The trainer is lost (from any thread): the training stops and `train` recovers it; before the training
        started (set-up, a resume's load) the run stops as on any actor's failure."""
        if self.lost is not None:
            return
        if not self._training:
            self.controller.roles.stop_run(f"{reason.strip()}\n{RESUME_HINT}")
            return
        if calls := self.controller.roles.trainer_calls.copy():  # a copy in one step: another thread may change it
            reason = f"{reason.strip()} (during its {', '.join(sorted(calls))})"
        self.lost, self._lost_at = reason.strip(), time.monotonic()
        if self._train_task is not None:
            self._loop.call_soon_threadsafe(self._train_task.cancel)

    async def train(self) -> dict[str, Any]:
        """`controller.train()`, started again from the newest checkpoint after each trainer loss (within the budget)."""
        self._loop, self._training = asyncio.get_running_loop(), True
        watch = asyncio.create_task(self._watch_pids())
        try:
            while True:
                try:
                    if self.lost is not None:
                        self.recovering = True
                        await self._recover()
                        self.recovering = False
                    self._train_task = asyncio.create_task(self.controller.train())
                    return await self._train_task
                except (Exception, asyncio.CancelledError) as exc:
                    if (
                        isinstance(exc, TrainerLost)
                        or asyncio.current_task().cancelling()
                        or not self._trainer_failed(exc)
                    ):
                        raise  # the run itself was stopped (Ctrl-C, another actor's failure), or not by the trainer
                    self.lose(repr(exc))
                    if self.count >= self.budget:
                        raise TrainerLost(self._stop_message()) from exc
                finally:
                    self._train_task = None
        finally:
            self._training = False
            watch.cancel()

    def keeps_run_dir(self, ended_by: BaseException | None) -> bool:
        """Whether the training, ended by `ended_by`, ended on a trainer loss that a recovery follows: the run directory
        then stays locked through the recovery (a second launcher could otherwise take it over and write its logs)."""
        if ended_by is None or isinstance(ended_by, TrainerLost) or self.count >= self.budget:
            return False
        if self.lost is not None:
            return True
        return not isinstance(ended_by, asyncio.CancelledError) and self._trainer_failed(ended_by)

    def interrupted_message(self) -> str | None:
        """What a Ctrl-C between a trainer's loss and the new trainer's training leaves on disk and how to go on; None
        when no loss or recovery was under way (the Ctrl-C checkpoint's report says it then)."""
        if self.lost is None and not self.recovering:
            return None
        run_dir = self.controller.run_dir
        committed = checkpoint.committed_checkpoints(run_dir)
        aside = sorted(checkpoint.checkpoint_root(run_dir).glob("damaged-*"))
        where = f"trainer recovery {self.count} of {self.budget}" if self.recovering else "the trainer's loss"
        if not committed:
            return f"rlmesh: interrupted during {where}; no checkpoint was committed: nothing to resume, start it again"
        kept = f"; kept aside (not resumed from): {', '.join(path.name for path in aside)}" if aside else ""
        return (
            f"rlmesh: interrupted during {where}; {run_dir} holds committed checkpoint(s) "
            f"{', '.join(path.name for path in committed)} (the steps after {committed[-1].name} are not saved){kept}\n"
            f"resume with: .venv/bin/rlmesh train --resume {run_dir}"
        )

    def _trainer_failed(self, exc: BaseException) -> bool:
        """Whether `exc` ended the training because of the trainer: its loss seen already, a trainer call that failed or
        missed its deadline (possibly inside the producer's task group), or a rank's process gone."""
        if self.lost is not None or self._exited():
            return True
        if isinstance(exc, BaseExceptionGroup):
            return exc.subgroup((DeadlineMissed, SupervisionError)) is not None
        return isinstance(exc, (DeadlineMissed, SupervisionError))

    def _stop_message(self) -> str:
        spent = f"; run.max_trainer_recoveries = {self.budget} spent" if self.budget else ""
        return f"the trainer was lost: {self.lost}{spent}\n{RESUME_HINT}"

    def _exited(self) -> list[int]:
        """The trainer ranks' processes on this host that are gone (a zombie counts as gone; ranks on other hosts are
        left to Monarch's supervision)."""
        pids = self.controller.roles.trainer_pids
        if pids != self._watched_pids:  # a new trainer: find its ranks among this process's descendants
            self._watched_pids = pids
            self._watched = [child for child in psutil.Process().children(recursive=True) if child.pid in pids]
        return [process.pid for process in self._watched if not _alive(process)]

    async def _watch_pids(self) -> None:
        """Lose the trainer as soon as one of its ranks' processes on this host exits."""
        while True:
            await asyncio.sleep(PID_CHECK_S)
            if self.lost is None and (gone := self._exited()):
                self.lose(f"the trainer's process(es) {gone} exited")

    async def _recover(self) -> None:
        """A new trainer on the newest loadable checkpoint, the controller and the logs rewound to it, the generators
        on its policy version; the recovery's metrics go into the next step's record."""
        controller = self.controller
        self.count += 1
        lost_step = controller.state.step
        self._say(f"trainer lost after step {lost_step}: {self.lost}")
        await controller.drop_step_in_flight()  # the step in flight must not touch the rewound progress
        # a save under way stops, and its commit thread, if writing, ends before the checkpoints are read and renamed
        await controller.checkpoints.settled(stop=True)
        run_dir = controller.run_dir
        try:
            newest = await asyncio.to_thread(checkpoint.newest_loadable, run_dir)
        except FileNotFoundError as exc:  # none committed, or every one damaged (each named on stderr)
            why = (
                f"{exc}; start the run again"
                if checkpoint.committed_checkpoints(run_dir)
                else "the run committed no checkpoint before it: nothing to recover from or to resume, start the run "
                "again (checkpoint.every_steps = N keeps a checkpoint every N steps)"
            )
            raise TrainerLost(f"the trainer was lost ({self.lost}); {why}") from exc
        self._say(f"recovery {self.count} of {self.budget}: a new trainer loads checkpoint {newest.name}")
        # no replacement generator loads a version while the trainer is replaced: the lost trainer's weight files are
        # removed, and the version it would load is rewound; it loads the recovered one after this sync
        async with controller.roles.generators.updating():
            await controller.roles.restart_trainer()
            self.lost = None  # the new trainer's own loss counts from here
            drain_states()  # the cancelled step's records in this process, and in the reward replicas:
            await gather_states(controller.roles.reward.actors(), controller.config.run.metrics_timeout_s)
            for moved in checkpoint.set_aside(run_dir, newest):
                self._say(f"a checkpoint newer than the one recovered is kept aside as {moved}")
            restore_logs(run_dir, newest)
            controller.rewind(newest)
            await controller.roles.load_checkpoint(newest, service_counters=False)
            checkpoint.load_rng(newest, "controller")
            synced = await sync_policy(
                controller.roles,
                controller.state,
                controller.admission,
                controller.state.policy_version,
                rewind=True,
                updating_held=True,
            )
        seconds, replayed = time.monotonic() - self._lost_at, lost_step - controller.state.step
        record_metric("recovery/trainer_count", self.count, Reduce.MAX)
        record_metric("recovery/trainer_s", seconds, Reduce.SUM)
        record_metric("recovery/replayed_steps", replayed, Reduce.SUM)
        if "weight_sync/attested" in synced:  # the recovered version's proof (its step's record has the first one's)
            record_metric("recovery/attested", synced["weight_sync/attested"], Reduce.MIN)
        self._say(f"trainer recovered {seconds:.1f} s after its loss; training step {controller.state.step + 1} again")

    def _say(self, line: str) -> None:
        """A line on the console and in the run's log."""
        say(line)
        if (run_log := self.controller.roles.run_log) is not None:
            run_log.file.write(f"rlmesh: {line}\n")


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
