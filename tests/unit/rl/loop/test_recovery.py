"""When a trainer loss is recovered and when it stops the run (`rl.loop.recovery.TrainerRecovery`), with a stand-in
controller whose training fails as a lost trainer makes it fail; the recovery itself runs in tests/e2e/test_trainer_recovery.py."""

import asyncio
import contextlib
import threading
import types
from types import SimpleNamespace

import pytest
import torch
import torch.distributed.checkpoint as dcp

from rl.config import load_config
from rl.loop.recovery import TrainerLost, TrainerRecovery
from rl.loop.roles import RESUME_HINT, DeadlineMissed
from rl.loop.state import Checkpoints, RunState
from tests.support.held_commit import HeldCommit
from tests.support.paths import TINY
from tests.support.runs import fake_run


class StandInRoles:
    def __init__(self):
        self.on_trainer_lost = None
        self.trainer_pids: list[int] = []
        self.trainer_calls: dict[str, int] = {}
        self.run_log = None
        self.stopped: list[str] = []

    def stop_run(self, message: str) -> None:
        self.stopped.append(message)


class StandInController:
    """`train()` runs `training` (a coroutine function) once per call."""

    def __init__(self, budget: int, training):
        self.config = load_config(TINY, {"run.max_trainer_recoveries": str(budget)})
        self.roles = StandInRoles()
        self.training = training
        self.trained = 0

    async def train(self):
        self.trained += 1
        return await self.training()

    async def drop_step_in_flight(self):
        pass


def test_a_missed_trainer_deadline_with_no_recovery_left_stops_the_run_naming_it():
    async def missed():
        raise DeadlineMissed("trainer train step took longer than trainer.call_timeout_s=1 s")

    controller = StandInController(0, missed)
    with pytest.raises(TrainerLost, match="trainer.call_timeout_s=1 s") as raised:
        asyncio.run(TrainerRecovery(controller).train())
    assert RESUME_HINT in str(raised.value) and controller.trained == 1


def test_a_deadline_missed_inside_the_producers_task_group_is_a_trainer_loss():
    async def missed_in_group():
        raise ExceptionGroup("rows", [DeadlineMissed("trainer logprobs took longer")])

    with pytest.raises(TrainerLost, match="trainer logprobs took longer"):
        asyncio.run(TrainerRecovery(StandInController(0, missed_in_group)).train())


def test_other_failures_are_not_the_trainers_and_pass_through():
    async def bug():
        raise ValueError("a bug in a reward function")

    controller = StandInController(2, bug)
    recovery = TrainerRecovery(controller)
    with pytest.raises(ValueError, match="a bug"):
        asyncio.run(recovery.train())
    assert recovery.count == 0 and recovery.lost is None


def test_a_loss_reported_from_another_thread_stops_the_training_at_once():
    async def trains_forever():
        await asyncio.Event().wait()

    controller = StandInController(0, trains_forever)
    recovery = TrainerRecovery(controller)
    assert controller.roles.on_trainer_lost == recovery.lose

    async def run():
        asyncio.get_running_loop().call_later(
            0.1, lambda: threading.Thread(target=recovery.lose, args=("rank 0 died",)).start()
        )
        await asyncio.wait_for(recovery.train(), 10)

    with pytest.raises(TrainerLost, match="the trainer was lost: rank 0 died"):
        asyncio.run(run())


def test_a_loss_names_the_trainer_calls_in_flight():
    async def trains_forever():
        await asyncio.Event().wait()

    controller = StandInController(0, trains_forever)
    controller.roles.trainer_calls = {"train step": 1, "checkpoint save": 1}
    recovery = TrainerRecovery(controller)

    async def run():
        asyncio.get_running_loop().call_later(0.1, recovery.lose, "the trainer's process(es) [7] exited")
        await asyncio.wait_for(recovery.train(), 10)

    with pytest.raises(TrainerLost, match=r"\[7\] exited \(during its checkpoint save, train step\)"):
        asyncio.run(run())


def test_a_loss_before_the_training_starts_stops_the_run_as_any_actor_failure():
    controller = StandInController(2, None)
    recovery = TrainerRecovery(controller)
    recovery.lose("the trainer died while loading the model")
    assert controller.roles.stopped == [f"the trainer died while loading the model\n{RESUME_HINT}"]
    assert recovery.lost is None


class RecoveringRoles(StandInRoles):
    """Roles whose trainer restart never ends (a slow reload of a large model), so a Ctrl-C lands inside the recovery."""

    def __init__(self):
        super().__init__()
        self.restarting = asyncio.Event()
        self.generators = self

    @contextlib.asynccontextmanager
    async def updating(self):
        yield

    async def restart_trainer(self):
        self.restarting.set()
        await asyncio.Event().wait()


def test_ctrl_c_during_a_recovery_says_which_checkpoints_are_on_disk_and_how_to_resume(tmp_path):
    from rl.commands.train import _interrupted_message

    async def lost():
        raise DeadlineMissed("trainer train step took longer than trainer.call_timeout_s=1 s")

    controller = StandInController(2, lost)
    controller.roles = RecoveringRoles()
    controller.run_dir = fake_run(tmp_path, [2, 4])
    controller.state = types.SimpleNamespace(step=5)
    # no Ctrl-C checkpoint (the training was not running) and no save under way
    controller.checkpoints = types.SimpleNamespace(report=None, settled=lambda stop=False: asyncio.sleep(0))
    controller.recovery = recovery = TrainerRecovery(controller)

    async def ctrl_c_while_recovering():
        training = asyncio.create_task(recovery.train())
        await asyncio.wait_for(controller.roles.restarting.wait(), 10)
        training.cancel()  # what the first Ctrl-C does to the run's task
        with pytest.raises(asyncio.CancelledError):
            await training

    asyncio.run(ctrl_c_while_recovering())
    run_dir = controller.run_dir
    message = _interrupted_message(controller, None)
    assert "nothing to resume" not in message
    assert message == (
        f"rlmesh: interrupted during trainer recovery 1 of 2; {run_dir} holds committed checkpoint(s) step_00000002, "
        "step_00000004 (the steps after step_00000004 are not saved)\n"
        f"resume with: .venv/bin/rlmesh train --resume {run_dir}"
    )
    assert TrainerRecovery(StandInController(2, lost)).interrupted_message() is None  # no loss: the report says it


class ReachedTheReplacement(Exception):
    """The stand-in roles' `generators.updating()`: the recovery got past reading the checkpoints."""


def test_a_recovery_reads_the_checkpoints_only_once_a_commit_under_way_has_ended(tmp_path, monkeypatch):
    """The trainer is lost while step 1's checkpoint is being committed: the recovery waits for that commit thread
    (it cannot be stopped) and recovers from its checkpoint, instead of reading the checkpoints beside it (and
    finding none)."""
    held = HeldCommit(monkeypatch)
    controller = StandInController(1, None)
    controller.config = load_config(TINY, {"run.output_dir": str(tmp_path), "checkpoint.every_steps": "1"})
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    async def trainer_part(path, weights_only=False):
        dcp.save({"model": {"w": torch.arange(4.0)}}, checkpoint_id=path / "trainer")

    @contextlib.asynccontextmanager
    async def updating():
        raise ReachedTheReplacement()
        yield

    controller.roles.save_checkpoint = trainer_part
    controller.roles.generators = SimpleNamespace(updating=updating)
    controller.state = RunState(step=1, policy_version=1)
    controller.run_dir = run_dir
    controller.checkpoints = Checkpoints(controller.state, controller.roles, controller.config)

    async def run():
        saving = asyncio.create_task(controller.checkpoints.save(run_dir))
        await asyncio.to_thread(held.started.wait)
        saving.cancel()  # the train task, cancelled by the loss
        recovery = TrainerRecovery(controller)
        recovery.lost = "the trainer's process(es) [7] exited"
        asyncio.get_running_loop().call_later(0.2, held.release.set)
        await recovery._recover()

    with pytest.raises(ReachedTheReplacement):
        asyncio.run(run())
    assert held.outcomes == ["step_00000001"]


@pytest.mark.parametrize("committed", ["none", "every one damaged"])
def test_a_loss_with_no_loadable_checkpoint_stops_the_run_saying_there_is_nothing_to_resume(tmp_path, committed):
    """Nothing to recover from is nothing to resume either: the message says to start again, never to resume."""

    async def lost():
        raise DeadlineMissed("trainer train step took longer than trainer.call_timeout_s=1 s")

    controller = StandInController(2, lost)
    if committed == "none":
        controller.run_dir = tmp_path / "run"
        controller.run_dir.mkdir()
    else:
        controller.run_dir = fake_run(tmp_path, [1])
        (controller.run_dir / "checkpoints" / "step_00000001" / "run_state.json").write_text("{}")
    controller.state = SimpleNamespace(step=2)
    controller.checkpoints = SimpleNamespace(settled=lambda stop=False: asyncio.sleep(0))
    with pytest.raises(TrainerLost) as raised:
        asyncio.run(TrainerRecovery(controller).train())
    message = str(raised.value)
    assert message.startswith("the trainer was lost (DeadlineMissed('trainer train step took longer")
    assert RESUME_HINT not in message and "--resume" not in message
    if committed == "none":
        assert message.endswith(
            "the run committed no checkpoint before it: nothing to recover from or to resume, start the run again "
            "(checkpoint.every_steps = N keeps a checkpoint every N steps)"
        )
    else:
        assert message.endswith(
            "every committed checkpoint is damaged (see the warnings above); nothing to resume; start the run again"
        )
