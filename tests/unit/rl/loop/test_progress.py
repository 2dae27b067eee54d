"""The loop's resumable state (`rl.loop.progress`): a trainer recovery's `Controller.rewind` rebuilds what a resume
from the same checkpoint builds, and drops what the steps since carried."""

from rl.checkpoint import store as checkpoint
from rl.config import load_config
from rl.loop.controller import Controller
from rl.loop.state import RunState
from tests.support.paths import E2E_CONFIGS

CONFIG = E2E_CONFIGS / "tiny_qwen3_e2e.toml"


def test_a_rewind_gives_the_progress_a_resume_from_the_same_checkpoint_starts_with(tmp_path):
    saved = RunState(step=2, policy_version=2, data_cursor=5, rows_done_ahead=[7])
    checkpoint.write(tmp_path, checkpoint.RUN_STATE, saved)
    resumed = Controller(load_config(CONFIG), resume_from=tmp_path)
    rewound = Controller(load_config(CONFIG))
    rewound.state.step, rewound.state.policy_version = 4, 4  # steps trained since the checkpoint, then lost
    rewound.generation_stats.row_started()
    rewound.progress.nonfinite_steps.in_row = 1
    before = rewound.progress
    rewound.rewind(tmp_path)
    assert rewound.buffer is not before.buffer and rewound.admission is not before.admission

    for controller in (resumed, rewound):
        assert controller.state == saved and controller.resume_from == tmp_path
        assert controller.admission.policy_version == 2 and controller.admission.accepted == 2 * 2  # rows_per_step 2
        assert controller.progress.nonfinite_steps.in_row == 0 and controller.generation_stats.running == 0
        assert controller.checkpoints.state is controller.state and controller.checkpoints.committed_step == 2
    assert [resumed.stream.next() for _ in range(3)] == [rewound.stream.next() for _ in range(3)]
