"""The first Ctrl-C commits the last completed step (a train step in flight finishes first), within
`checkpoint.interrupt_save_s`; past it the report says how many steps were lost.

The controller's own loop runs; generation, the trainer and the actors' part of a checkpoint are replaced (the run
state, the step's record and the commit are the real ones). A real Ctrl-C and resume: tests/e2e/test_interrupt.py."""

import asyncio
import contextlib
import json

import pytest
import torch
import torch.distributed.checkpoint as dcp

from rl.checkpoint import run_dir as run_dirs
from rl.checkpoint import store as checkpoint
from rl.config import load_config
from rl.loop.controller import Controller
from rl.loop.roles import DeadlineMissed
from rl.loop.state import row_index_of
from rollouts.types import Rollout, RolloutGroup, RolloutStatus, RolloutTurn
from tests.support.held_commit import HeldCommit
from tests.support.paths import E2E_CONFIGS

NEVER = asyncio.Event  # an event nobody sets


def group(row_id: str, task_name: str, row: dict, version: int) -> RolloutGroup:
    """Two rollouts with rewards 1 and 0: something to learn."""
    turn = RolloutTurn(
        prompt_messages=[], prompt_token_ids=[1, 2], completion_token_ids=[3], completion_logprobs=[-0.5],
        policy_version=version,
    )  # fmt: skip
    rollouts = [
        Rollout(
            rollout_id=f"{row_id}/{index}",
            group_id=row_id,
            task_name=task_name,
            sample_index=index,
            turns=[turn],
            status=RolloutStatus.COMPLETED,
            reward=float(index == 0),
        )
        for index in range(2)
    ]
    return RolloutGroup(group_id=row_id, task_name=task_name, example=row, rollouts=rollouts)


class StubbedRun:
    """A controller whose rows of step `generation_stops_at` never finish generating and whose train step
    `train_step_waits_at` waits for `release`."""

    def __init__(self, tmp_path, generation_stops_at=None, train_step_waits_at=None, save_s="40", every_steps="0"):
        self.controller = controller = Controller(
            load_config(
                E2E_CONFIGS / "tiny_qwen3_e2e.toml",
                {
                    "run.output_dir": str(tmp_path),
                    "run.steps": "10",
                    "run.eval_every": "0",
                    "algorithm.group_size": "2",
                    "checkpoint.interrupt_save_s": save_s,
                    "checkpoint.every_steps": every_steps,
                    "wandb.enabled": "false",
                },
            )
        )
        controller.checkpoints.save_on_interrupt = True
        self.in_flight, self.release = asyncio.Event(), asyncio.Event()
        rows_per_step = controller.config.run.groups_per_step

        async def make(row_id, task_name, row, group_size, sampling, sampler="policy", rollout_fn=None):
            if generation_stops_at and row_index_of(row_id) >= (generation_stops_at - 1) * rows_per_step:
                await NEVER().wait()
            return group(row_id, task_name, row, controller.state.policy_version)

        async def train_step(groups):
            _samples, metrics = await controller.samples.build(groups)
            if controller.state.step + 1 == train_step_waits_at:
                self.in_flight.set()
                await self.release.wait()
            controller.state.policy_version += 1
            await controller.admission.set_policy_version(controller.state.policy_version)
            return metrics

        async def no_states(step):
            return []

        self.trainer_saves: list[str] = []

        async def trainer_part(path, weights_only=False):  # the trainer's model and optimizer would go here
            self.trainer_saves.append(path.name.split("-")[1])  # the step of ".tmp-step_N-XXXX@writer"
            (path / "trainer_saved").write_text("")

        controller.scored_groups.make = make
        controller.train_step = train_step
        controller.roles.gather_states = no_states
        controller.roles.save_checkpoint = trainer_part

    async def interrupt(self, when, then=None) -> None:
        """Run `train()`, cancel it (the first Ctrl-C) once `when()` holds, call `then()`, wait for it to stop."""
        task = asyncio.create_task(self.controller.train())
        while not when():
            await asyncio.sleep(0.01)
        task.cancel()
        if then is not None:
            asyncio.get_running_loop().call_later(0.1, then)
        with pytest.raises(asyncio.CancelledError):
            await task


def logged_steps(run_dir) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


async def test_ctrl_c_while_the_next_batch_generates_commits_the_last_step(tmp_path):
    run = StubbedRun(tmp_path, generation_stops_at=3)
    controller = run.controller
    await run.interrupt(lambda: controller.state.step == 2 and controller._unlogged is None)
    report = controller.checkpoints.report
    run_dir = report.run_dir
    assert (report.step, report.error) == (2, None) and report.checkpoint == checkpoint.newest_checkpoint(run_dir)
    assert (
        checkpoint.read(report.checkpoint, checkpoint.RUN_STATE)["step"] == 2
        and (report.checkpoint / "trainer_saved").exists()
    )
    assert logged_steps(run_dir) == [1, 2]
    assert report.message() == (
        f"rlmesh: interrupted after step 2; it is saved in {report.checkpoint}\n"
        f"resume with: .venv/bin/rlmesh train --resume {run_dir}"
    )


async def test_a_train_step_in_flight_finishes_and_is_committed_with_its_record(tmp_path):
    run = StubbedRun(tmp_path, train_step_waits_at=3)
    await run.interrupt(run.in_flight.is_set, then=run.release.set)  # the trainer finishes after the Ctrl-C
    report = run.controller.checkpoints.report
    assert (report.step, report.error) == (3, None) and report.checkpoint.name == "step_00000003"
    metrics, _samples = checkpoint.read(report.checkpoint, checkpoint.STEP_RECORD)
    assert metrics["policy_version"] == 3 and metrics["reward/mean"] == 0.5
    assert logged_steps(report.run_dir) == [1, 2, 3]


async def test_a_save_past_its_budget_says_how_many_steps_were_lost(tmp_path):
    run = StubbedRun(tmp_path, train_step_waits_at=3, save_s="0.2")  # the trainer never finishes step 3
    await run.interrupt(run.in_flight.is_set)
    report = run.controller.checkpoints.report
    assert checkpoint.committed_checkpoints(report.run_dir) == []
    assert report.message() == (
        "rlmesh: interrupted after step 2; its checkpoint could not be saved (took longer than "
        "checkpoint.interrupt_save_s = 0.2 s): 2 step(s) lost, nothing is saved. Keep progress with "
        "--checkpoint.every_steps N or a larger --checkpoint.interrupt_save_s"
    )
    run.release.set()


async def test_a_run_stopped_again_during_the_save_still_reports_where_it_stands(tmp_path):
    """A second cancel while the Ctrl-C checkpoint is saving (the trainer's step 3 never finishes): the report says
    step 2 was trained and not saved, not that nothing was trained."""
    run = StubbedRun(tmp_path, train_step_waits_at=3)
    task = asyncio.create_task(run.controller.train())
    while not run.in_flight.is_set():
        await asyncio.sleep(0.01)
    task.cancel()  # the first Ctrl-C: the save waits for the step in flight
    await asyncio.sleep(0.2)
    task.cancel()  # stopped again before it committed
    with pytest.raises(asyncio.CancelledError):
        await task
    report = run.controller.checkpoints.report
    assert report is not None and checkpoint.committed_checkpoints(report.run_dir) == []
    assert report.message().startswith(
        "rlmesh: interrupted after step 2; its checkpoint could not be saved (the run was stopped again before it "
        "committed): 2 step(s) lost, nothing is saved."
    )
    run.release.set()


class Updating:
    """The generators' service as the recovery uses it, with no generator: its `updating()` pause, its metrics."""

    @contextlib.asynccontextmanager
    async def updating(self):
        yield

    def metrics(self) -> dict[str, float]:
        return {}


async def test_a_recovering_run_keeps_its_run_directory_locked_until_it_stops(tmp_path):
    run = StubbedRun(tmp_path, train_step_waits_at=None, every_steps="1")
    controller = run.controller
    trained = controller.train_step
    held_during_restart: list[bool] = []
    restarting = asyncio.Event()

    async def trainer_lost_at_step_3(groups):
        if controller.state.step == 2:
            raise DeadlineMissed("trainer train step took longer than trainer.call_timeout_s=1 s")
        return await trained(groups)

    async def restart_trainer():  # a large model's reload: the Ctrl-C lands here
        try:
            run_dirs.lock(controller.logger.run_dir).release()
            held_during_restart.append(False)
        except run_dirs.RunDirBusy:
            held_during_restart.append(True)
        restarting.set()
        await NEVER().wait()

    async def loadable_trainer_part(path, weights_only=False):  # what a recovery checks it can load
        dcp.save({"model": {"w": torch.arange(8.0)}}, checkpoint_id=path / "trainer")

    controller.train_step = trainer_lost_at_step_3
    controller.roles.save_checkpoint = loadable_trainer_part
    controller.roles.restart_trainer = restart_trainer
    controller.roles.generators = Updating()
    recovering = asyncio.create_task(controller.recovery.train())
    await asyncio.wait_for(restarting.wait(), 30)
    recovering.cancel()
    with pytest.raises(asyncio.CancelledError):
        await recovering
    run_dir = controller.logger.run_dir
    assert held_during_restart == [True]  # a second `rlmesh train --resume` would have been refused
    assert run_dirs.held_here(run_dir) and controller.run_lock is not None
    controller.run_lock.release()  # what Controller.run does when the run stops
    assert not run_dirs.held_here(run_dir)


async def test_a_run_keeps_one_checkpoint_by_default(tmp_path):
    """A full checkpoint is ~80 GB at 7B: by default only the newest (whole, as every commit is atomic) stays."""
    run = StubbedRun(tmp_path, generation_stops_at=4, every_steps="1")
    controller = run.controller
    await run.interrupt(lambda: controller.state.step == 3 and controller._unlogged is None)
    committed = checkpoint.committed_checkpoints(controller.checkpoints.report.run_dir)
    assert [path.name for path in committed] == ["step_00000003"]  # steps 1 and 2 were committed, then deleted


async def test_ctrl_c_during_a_regular_commit_adopts_it_instead_of_saving_the_step_again(tmp_path, monkeypatch):
    """The Ctrl-C lands while step 1's regular checkpoint is being committed: the interrupt waits for that commit, the
    trainer writes step 1 once, one commit runs, and the step is logged with the record it committed."""
    held = HeldCommit(monkeypatch)
    run = StubbedRun(tmp_path, every_steps="1")
    await run.interrupt(held.started.is_set, then=held.release.set)
    report = run.controller.checkpoints.report
    assert run.trainer_saves == ["step_00000001"]
    assert held.outcomes == ["step_00000001"]
    checkpoints = checkpoint.checkpoint_root(report.run_dir)
    assert [path.name for path in checkpoints.iterdir()] == ["step_00000001"]
    assert report.message() == (
        f"rlmesh: interrupted after step 1; it is saved in {checkpoints / 'step_00000001'}\n"
        f"resume with: .venv/bin/rlmesh train --resume {report.run_dir}"
    )
    committed, _samples = checkpoint.read(checkpoints / "step_00000001", checkpoint.STEP_RECORD)
    [logged] = [json.loads(line) for line in (report.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert logged["step"] == 1 and logged["reward/mean"] == committed["reward/mean"] == 0.5


async def test_a_commit_past_the_budget_is_reported_as_writing_then_as_saved_once_it_completes(tmp_path, monkeypatch):
    """The budget runs out while step 1's commit is still being written: the report names that commit rather than
    saying nothing is saved, and reads the run directory when printed, so once the commit completes it says saved."""
    held = HeldCommit(monkeypatch)
    run = StubbedRun(tmp_path, every_steps="1", save_s="0.2")
    await run.interrupt(held.started.is_set)
    checkpoints = run.controller.checkpoints
    report = checkpoints.report
    assert report.message().startswith(
        "rlmesh: interrupted after step 1; its checkpoint could not be saved (took longer than "
        "checkpoint.interrupt_save_s = 0.2 s): 1 step(s) lost, nothing is saved (the commit of step 1 was still being "
        "written: if it completes, a resume continues from it)."
    )
    held.release.set()
    await checkpoints.settled()
    assert held.outcomes == ["step_00000001"] and run.trainer_saves == ["step_00000001"]
    assert report.message().startswith(
        f"rlmesh: interrupted after step 1; it is saved in {checkpoint.checkpoint_root(report.run_dir)}/step_00000001"
    )


async def test_a_stopped_save_ends_only_once_its_commit_thread_has(tmp_path, monkeypatch):
    """What a trainer recovery waits for before it reads and renames checkpoints: a save stopped during its commit
    ends when the commit thread does, not before."""
    held = HeldCommit(monkeypatch)
    run = StubbedRun(tmp_path, every_steps="1", save_s="0")
    await run.interrupt(held.started.is_set)
    settled = asyncio.create_task(run.controller.checkpoints.settled(stop=True))
    await asyncio.sleep(0.2)
    assert not settled.done() and held.outcomes == []
    held.release.set()
    await settled
    assert held.outcomes == ["step_00000001"]
