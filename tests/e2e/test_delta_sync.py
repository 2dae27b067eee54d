"""Delta weight sync in real runs (tiny Qwen3, fp32 trainer at lr 1e-6, bf16 generators): after the first, full, sync
each version crosses as a delta of at most a tenth of its size, every sync is attested, and the file each generator's
vLLM loads from holds the trainer's weights cast to bf16 bit for bit. The trainer is SIGKILLed in the middle of the
delta chain and recovered in the run: the new trainer has no copy, so the recovered version goes whole (to generators
holding a newer or the same version), the chain goes on from it, and every trained step's rollouts come from the
version the step before published, attested. Then the run is resumed (again no copy: its first version goes whole)
and a generator is killed in the middle of the delta chain: its replacement has no base, the trainer publishes the
current version whole for it, and the chain goes on.

The generators' files are read after the launcher and every actor are SIGKILLed at the step they are compared at, which
the run never passes: it plans one step more, whose training rows the reward holds (`held_even_token_share`), so it
neither ends (a clean end removes the files) nor moves the generators to another version before the kill. The
trainer's weights are the step's committed checkpoint, cast by torch here. The resumed run ends by itself:
its replicas prove each version bit for bit before loading it (`rl.weights.delta.ResidentWeights`), and attest it
after."""

import json
import os
import signal
import time
from pathlib import Path

import torch

from rl.checkpoint import store as checkpoint
from rl.checkpoint.export import read_model_state
from rl.weights.shared_file import SHM_DIR, SHM_PREFIX, map_file, plan_layout, view
from tests.support.e2e_rewards import HOLD_FROM_VERSION_ENV
from tests.support.launch import Launch, actor_pids, trainer_pids
from tests.support.runs import read_jsonl

DELTA_RUN = (
    "--generator.dtype",
    "bfloat16",
    "--loss.rollout_correction.preset",
    "decoupled_token_is",
    "--trainer.lr",
    "1e-6",
    "--tasks.0.rubric.reward_fns",
    "[{fn = 'tests.support.e2e_rewards:held_even_token_share'}]",
)
"""The delta runs' overrides; their reward is `even_token_share` unless a launch holds a version's rows (`held_at`)."""


def held_at(step: int) -> dict[str, str]:
    """The launcher's environment for a run that stays at step `step`: the rows of step `step + 1` (sampled by version
    `step`) are held, so the run plans that step but does not train it."""
    return {HOLD_FROM_VERSION_ENV: str(step)}


def records(run_dir: Path) -> dict[int, dict]:
    by_step = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        by_step[record["step"]] = record
    return by_step


def show(by_step: dict[int, dict], steps) -> None:
    """Each step's sync on the test's output (-s): bytes, whether a delta, changed fraction, seconds."""
    for step in steps:
        record = by_step[step]
        print(
            f"step {step}: {record['weight_sync/bytes'] / 1e6:.2f} MB, delta {record['weight_sync/delta']:.0f}, "
            f"changed {record.get('weight_sync/changed_fraction', 0):.4f}, sync {record['time/weight_sync_s']:.2f} s"
        )


def stop_at(launch: Launch, run_dir: Path, step: int, timeout: float = 600) -> list[int]:
    """Wait for `step`'s line and checkpoint, then SIGKILL everything; the generator processes that were alive. The
    launch must stay at `step` (`held_at(step)`) until the kill."""
    launch.wait_for_line(f"v{step} ", timeout=timeout)
    deadline = time.monotonic() + 120
    while not any(path.name == f"step_{step:08d}" for path in checkpoint.committed_checkpoints(run_dir)):
        assert time.monotonic() < deadline, f"no checkpoint of step {step}"
        time.sleep(0.1)
    pids = list(actor_pids(launch.process.pid, "generator/").values())
    assert launch.process.poll() is None, launch.output()  # still at `step`: its generators' files are in place
    launch.kill_everything()
    launch.process.wait(timeout=30)
    return pids


def assert_generators_hold(run_dir: Path, step: int, pids: list[int]) -> None:
    """Each generator's resident file is the trainer's step-`step` weights cast to bf16, bit for bit."""
    from transformers import AutoModelForCausalLM

    from rl.assets import resolve_model_path

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-qwen3"), dtype=torch.float32)
    state = model.state_dict()  # the trainer's names and ties (what it publishes)
    trained = read_model_state(checkpoint.committed_checkpoints(run_dir)[-1])
    assert checkpoint.committed_checkpoints(run_dir)[-1].name == f"step_{step:08d}"
    with torch.no_grad():
        for name, tensor in trained.items():
            state[name].copy_(tensor)
    # the publisher's order (a tie's names together, where the first stands) and layout (ties once), which a
    # generator's copy keeps; through torchstore a tie arrives under each name, in a place of its own: the file's size
    # tells which
    ties: dict[int, list[str]] = {}
    for name, tensor in state.items():
        ties.setdefault(tensor.data_ptr(), []).append(name)
    state = {name: state[name] for names in ties.values() for name in names}
    layouts = {
        plan_layout(state, torch.bfloat16)[1]: plan_layout(state, torch.bfloat16),
        plan_layout(state, torch.bfloat16, key=id)[1]: plan_layout(state, torch.bfloat16, key=id),
    }
    for pid in pids:
        [path] = SHM_DIR.glob(f"{SHM_PREFIX}{pid}-resident-*")
        layout, nbytes = layouts[path.stat().st_size]
        try:
            buffer = map_file(str(path), nbytes)
            for name, tensor in state.items():
                held = view(buffer, *layout[name])
                assert torch.equal(held.view(torch.int16), tensor.to(torch.bfloat16).view(torch.int16)), (pid, name)
        finally:
            path.unlink()


def test_deltas_are_small_attested_and_exact_through_a_trainer_recovery_a_replacement_mid_chain_and_a_resume(tmp_path):
    run_dir = tmp_path / "run" / "tiny_qwen3_e2e"
    every_2 = ("--checkpoint.every_steps", "2")
    replicas = ("--generator.num_replicas", "2")
    launch = Launch(tmp_path / "run", *DELTA_RUN, *every_2, "--run.steps", "7", *replicas, env=held_at(6))
    try:
        launch.wait_for_line("step    3 v3", timeout=600)
        [trainer] = trainer_pids(launch)
        os.kill(trainer, signal.SIGKILL)  # the generators hold version 3, applied as a delta onto version 2
        launch.wait_for_line("trainer recovered", timeout=600)
        pids = stop_at(launch, run_dir, 6)
    finally:
        launch.kill_everything()
    # back to step 2's checkpoint: the generators, on version 3, load version 2 whole (an older one, on purpose)
    assert "loads checkpoint step_00000002" in launch.text, launch.output()
    recovered = 2
    by_step = records(run_dir)
    show(by_step, range(1, 7))
    full = by_step[1]["weight_sync/bytes"]
    assert by_step[1]["weight_sync/delta"] == 0
    for step in range(1, 7):
        assert by_step[step]["weight_sync/attested"] == 1, by_step[step]
    # the new trainer's first sync (the recovered version, whole) goes into the next step's record, beside its delta
    after = by_step[recovered + 1]
    assert after["recovery/trainer_count"] == 1 and after["recovery/attested"] == 1, after
    assert after["recovery/replayed_steps"] == 1, after  # step 3 trained again: its version 3 a delta onto the new 2
    assert after["weight_sync/delta"] == 0 and after["weight_sync/bytes"] >= full, after
    for step in (step for step in range(2, 7) if step != recovered + 1):  # before the loss and after the recovery
        assert by_step[step]["weight_sync/delta"] == 1, by_step[step]
        assert by_step[step]["weight_sync/bytes"] <= 0.1 * full, by_step[step]
        assert 0 < by_step[step]["weight_sync/changed_fraction"] < 0.05, by_step[step]
    assert by_step[6]["services/generator/restarts"] == 0  # no replica failed a sync's proof and was replaced
    # at staleness 0 each step's rollouts were sampled from the version the step before published (and attested)
    train = [record for record in read_jsonl(run_dir / "rollouts.jsonl") if record["kind"] == "train"]
    assert sorted({record["step"] for record in train}) == list(range(1, 7))
    assert all(turn["policy_version"] == record["step"] - 1 for record in train for turn in record["rollout"]["turns"])
    assert len(pids) == 2
    assert_generators_hold(run_dir, 6, pids)

    # resumed (a new trainer: no copy), then a generator killed in the middle of the chain; the run goes on meanwhile
    launch = Launch(tmp_path / "run", "--run.steps", "80", "--run.eval_every", "1000", resume=run_dir)
    try:
        launch.wait_for_line("v8 ", timeout=600)
        victim = next(iter(actor_pids(launch.process.pid, "generator/").values()))
        os.kill(victim, signal.SIGKILL)
        launch.wait_for_line("replaced; serving again", timeout=600)
        assert launch.process.wait(timeout=600) == 0, launch.output()
    finally:
        launch.kill_everything()
    by_step = records(run_dir)
    assert by_step[7]["weight_sync/delta"] == 0 and by_step[7]["weight_sync/bytes"] >= full  # the resume: whole
    assert by_step[8]["weight_sync/delta"] == 1 and by_step[8]["weight_sync/attested"] == 1
    repairs = [step for step in range(9, 81) if by_step[step]["weight_sync/delta"] == 0]
    assert repairs, "the replacement loaded no full version"  # its repair adds the full bytes to a step's record
    repaired = repairs[0]
    assert by_step[repaired]["weight_sync/bytes"] >= full
    assert repaired + 5 <= 80, "the replacement came too late to see the chain go on"
    for step in range(repaired + 1, repaired + 6):  # both replicas apply deltas again, proven
        assert by_step[step]["weight_sync/delta"] == 1, by_step[step]
        assert by_step[step]["weight_sync/bytes"] <= 0.1 * full, by_step[step]
    for step in range(repaired + 1, 81):
        assert by_step[step]["weight_sync/attested"] == 1, by_step[step]


def test_a_sharded_trainer_and_tensor_parallel_generators_take_exact_deltas_through_torchstore(tmp_path):
    """A 2-rank (FSDP2) trainer, each rank keeping and diffing only its shards, and a TP=2 generator (each vLLM worker
    loads its shard from the replica's proven file), over torchstore: deltas from step 2, attested every step, and the
    replica's file holds the trainer's weights cast to bf16 bit for bit."""
    run_dir = tmp_path / "run" / "tiny_qwen3_e2e"
    sharded = ("--trainer.num_procs", "2", "--generator.tensor_parallel_size", "2")
    transport = ("--weight_sync.transport", "torchstore", "--run.weight_sync_timeout_s", "300")
    steps = ("--run.steps", "4", "--run.eval_every", "0", "--checkpoint.every_steps", "1")
    launch = Launch(tmp_path / "run", *DELTA_RUN, *sharded, *transport, *steps, env=held_at(3))
    try:
        pids = stop_at(launch, run_dir, 3, timeout=900)  # two ranks, an engine core and two workers on two cores
    finally:
        launch.kill_everything()
    by_step = records(run_dir)
    show(by_step, (1, 2, 3))
    full = by_step[1]["weight_sync/bytes"]
    assert by_step[1]["weight_sync/delta"] == 0
    for step in (1, 2, 3):
        assert by_step[step]["weight_sync/attested"] == 1, by_step[step]
    for step in (2, 3):
        assert by_step[step]["weight_sync/delta"] == 1, by_step[step]
        assert by_step[step]["weight_sync/bytes"] <= 0.1 * full, by_step[step]
    assert len(pids) == 1
    assert_generators_hold(run_dir, 3, pids)
