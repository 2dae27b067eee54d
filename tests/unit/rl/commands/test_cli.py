"""The CLI explains itself: override syntax in the help, `--version`, per-command help, "did you mean"."""

import signal

import pytest

from rl.commands import cli, train
from rl.commands.cli import main
from rl.processes.guard import GUARDED_ENV
from tests.support.paths import E2E_CONFIGS, REPO


def test_help_shows_the_override_syntax_and_each_command_its_own_resume_help(capsys):
    for command, resume_help in (("train", "continue RUN_DIR"), ("validate", "check that RUN_DIR can be resumed")):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = " ".join(capsys.readouterr().out.split())
        assert "--section.key value" in out and "--run.steps 4 --trainer.lr 1e-5" in out and resume_help in out
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith("rlmesh 0.")


def test_report_refuses_options_it_does_not_have(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(tmp_path), "--run.steps", "4"])
    assert exit_info.value.code == 2 and "unrecognized arguments: --run.steps 4" in capsys.readouterr().err


@pytest.mark.parametrize(
    "override, suggestion",
    [
        (["--trainer.lrr", "1e-5"], "trainer.lrr: Extra inputs are not permitted; did you mean 'lr'?"),
        (["--trainr.lr", "1"], "trainr: Extra inputs are not permitted; did you mean 'trainer'?"),
        (["--tasks", "[{name = 'sum_digit'}]"], "unknown task 'sum_digit'; did you mean 'sum_digits'?"),
        (
            ["--tasks", "[{name = 'sum_digits', rubric = { reward_fns = [{ fn = 'exact_mach' }] }}]"],
            "unknown reward function 'exact_mach'; did you mean 'exact_match'?",
        ),
    ],
)
def test_unknown_keys_tasks_and_reward_names_get_a_did_you_mean(capsys, override, suggestion):
    assert main(["validate", *override]) == 2
    assert suggestion in capsys.readouterr().err


def test_a_run_stopped_by_a_service_out_of_replicas_ends_with_the_resume_hint():
    """A lost generator host leaves the service without replicas; its message names no resume: the CLI adds it."""
    from types import SimpleNamespace

    from rl.commands.train import _stopped_message
    from rl.loop.roles import RESUME_HINT

    out_of_replicas = "generator: replacement of replica generator/0#0 failed to start: ...; 0 replicas left"
    saved = SimpleNamespace(
        actor_failures=[out_of_replicas], checkpoints=SimpleNamespace(committed_step=2), resume_from=None
    )
    assert _stopped_message(saved) == f"run stopped:\n{out_of_replicas}\n{RESUME_HINT}"
    unsaved = SimpleNamespace(
        actor_failures=[out_of_replicas], checkpoints=SimpleNamespace(committed_step=0), resume_from=None
    )
    assert _stopped_message(unsaved).endswith(
        "the run stopped before any checkpoint: nothing to resume, start it again"
    )
    hinted = SimpleNamespace(
        actor_failures=[f"trainer lost; {RESUME_HINT}"], checkpoints=saved.checkpoints, resume_from=None
    )
    assert _stopped_message(hinted).count(RESUME_HINT) == 1  # not twice


def test_a_run_stopped_by_the_rollout_breaker_says_why_and_how_to_resume():
    """The breaker's own message (a real `CircuitBreaker` opened by failed groups) is what the CLI prints, with the
    resume hint when a checkpoint was committed."""
    from types import SimpleNamespace

    from rl.commands.train import _stopped_message
    from rl.config.services import BreakerConfig
    from rl.loop.roles import RESUME_HINT
    from rl.services.breaker import CircuitBreaker

    failures: list[str] = []
    breaker = CircuitBreaker(BreakerConfig(max_consecutive_failed_groups=2), on_open=failures.append)
    for _ in range(3):
        breaker.record(True, "ValueError: this rubric always fails")
    stopped = SimpleNamespace(actor_failures=failures, checkpoints=SimpleNamespace(committed_step=1), resume_from=None)
    assert _stopped_message(stopped) == (
        "run stopped:\nrollout circuit breaker: 2 consecutive groups failed "
        "(services.breaker.max_consecutive_failed_groups = 2); last error: ValueError: this rubric always fails\n"
        f"{RESUME_HINT}"
    )


def test_a_run_on_attached_workers_is_guarded_and_others_are_not(monkeypatch, tmp_path):
    """`rlmesh train` on attached workers runs its launcher as a guarded child (rl/processes/guard.py): a worker
    restarted under the run kills it with SIGSEGV inside Monarch. Other schedulers, and the guarded child itself,
    run the launcher in the process."""
    attach = ["train", "--config", str(E2E_CONFIGS / "tiny_qwen3_multihost.toml"), "--run.output_dir", str(tmp_path)]
    args, extra = cli.build_parser().parse_known_args(attach)
    assert train.guarded_run_dir(args, extra) == tmp_path / "tiny_qwen3_multihost"
    local = ["train", "--config", str(REPO / "configs" / "sum_digits_smollm2_cpu.toml")]
    assert train.guarded_run_dir(*cli.build_parser().parse_known_args(local)) is None
    monkeypatch.setenv(GUARDED_ENV, "1")
    assert train.guarded_run_dir(args, extra) is None


def test_a_launcher_killed_by_a_signal_is_explained_with_the_resume_hint_when_there_is_a_checkpoint(tmp_path):
    message = train.launcher_killed_message(signal.SIGSEGV, tmp_path)
    assert "died of SIGSEGV, a crash in the launcher's native runtime" in message
    assert message.endswith("no checkpoint was committed: nothing to resume, start it again")
    (tmp_path / "checkpoints" / "step_2").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_2" / "COMMITTED").touch()
    message = train.launcher_killed_message(signal.SIGKILL, tmp_path)
    assert "died of SIGKILL, killed by another process or by the kernel" in message
    assert message.endswith(f"resume from the last checkpoint with `rlmesh train --resume {tmp_path}`")
