"""Peak memory per step: the kernel's high-water mark sees a copy that is already gone, and a reset starts a new window."""

import json

import matplotlib.image
import torch

from rl.metrics.memory import MIB, peak_rss_bytes, peak_states, reset_peaks, rss_bytes
from rl.metrics.reduce import reduce_states
from rl.metrics.report import plots


def _touch_and_free(nbytes: int) -> None:
    """Allocate `nbytes`, write every page (resident), and free them."""
    buffer = torch.ones(nbytes // 4, dtype=torch.float32)
    del buffer


def test_the_peak_counts_a_freed_copy_until_a_reset_starts_a_new_window():
    reset_peaks()
    before = rss_bytes()
    _touch_and_free(128 * MIB)
    assert rss_bytes() - before < 32 * MIB  # gone: a sample of RSS now would not see it
    assert peak_rss_bytes() - before >= 120 * MIB  # the high-water mark did
    reset_peaks()
    assert peak_rss_bytes() - rss_bytes() < 16 * MIB


def test_peak_states_merge_as_the_largest_process_of_a_role():
    reset_peaks()
    _touch_and_free(96 * MIB)
    big = peak_states("trainer")
    small = peak_states("trainer")  # a new window, without the 96 MiB copy
    assert set(big) == {"memory/trainer/peak_rss_mb", "memory/trainer/rss_mb"}
    assert big["memory/trainer/rss_mb"]["max"] <= big["memory/trainer/peak_rss_mb"]["max"] - 80  # the copy is gone
    metrics, _ = reduce_states([small, big])
    assert metrics["memory/trainer/peak_rss_mb"] == big["memory/trainer/peak_rss_mb"]["max"]
    assert big["memory/trainer/peak_rss_mb"]["max"] - small["memory/trainer/peak_rss_mb"]["max"] >= 80


def test_the_report_draws_every_role_s_peak(tmp_path):
    records = [
        {"step": step, "memory/trainer/peak_rss_mb": 900.0 + step, "memory/launcher/peak_rss_mb": 300.0}
        for step in (1, 2, 3)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    assert "memory.png" in plots(records, tmp_path)
    height, width, _ = matplotlib.image.imread(tmp_path / "memory.png").shape
    assert width > 500 and height > 300
