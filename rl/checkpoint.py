"""Checkpoints of a run: what a resume needs to continue exactly where the run stopped.

    runs/<name>/checkpoints/step_00000004/
        trainer/          model, optimizer and LR schedule (torch.distributed.checkpoint)
        rng/<process>.pt  python, numpy and torch RNG states of each process that draws numbers
        run_state.json    the controller's RunState (step, policy version, data cursor)
        config.toml       the resolved config the run was started with
        COMMITTED         written last: a checkpoint without it is ignored

A checkpoint is written into a temporary sibling directory, renamed into place, then marked
COMMITTED; only after that are old checkpoints pruned to the newest `checkpoint.keep`.
Rollouts in flight or buffered are not saved: their rows are drawn again after a resume.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

COMMITTED = "COMMITTED"
_PREFIX = "step_"


def checkpoint_root(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def committed_checkpoints(run_dir: Path) -> list[Path]:
    """Committed checkpoints of a run, oldest first."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    return sorted(path for path in root.glob(f"{_PREFIX}*") if (path / COMMITTED).exists())


def newest_checkpoint(run_dir: Path) -> Path:
    """The newest committed checkpoint; a clear error when there is none."""
    checkpoints = committed_checkpoints(run_dir)
    if not checkpoints:
        raise FileNotFoundError(f"{run_dir} has no committed checkpoint under {checkpoint_root(run_dir)}; nothing to resume")
    return checkpoints[-1]


def begin(run_dir: Path, step: int) -> Path:
    """A fresh temporary directory to write the checkpoint of `step` into."""
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{_PREFIX}{step:08d}-", dir=root))
    tmp.chmod(0o755)
    return tmp


def commit(run_dir: Path, tmp: Path, step: int, keep: int) -> Path:
    """Rename `tmp` into place, mark it COMMITTED, then prune to the newest `keep` (and stale temporaries)."""
    final = checkpoint_root(run_dir) / f"{_PREFIX}{step:08d}"
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    (final / COMMITTED).write_text(f"{step}\n")
    for old in committed_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old)
    for stale in checkpoint_root(run_dir).glob(f".tmp-{_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)
    return final


def write_run_state(path: Path, run_state: Any) -> None:
    (path / "run_state.json").write_text(json.dumps(asdict(run_state), indent=2, sort_keys=True) + "\n")


def read_run_state(path: Path) -> dict[str, Any]:
    return json.loads((path / "run_state.json").read_text())


def rng_state() -> dict[str, Any]:
    """This process's python, numpy and torch RNG states."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_rng(path: Path, process: str) -> None:
    (path / "rng").mkdir(exist_ok=True)
    torch.save(rng_state(), path / "rng" / f"{process}.pt")


def load_rng(path: Path, process: str) -> None:
    set_rng_state(torch.load(path / "rng" / f"{process}.pt", weights_only=False))


def save_trainer(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    """Model, optimizer and LR schedule through torch.distributed.checkpoint (valid for one rank or many)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state, "scheduler": scheduler.state_dict()}, checkpoint_id=path / "trainer")


def load_trainer(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state, "scheduler": scheduler.state_dict()}
    dcp.load(state, checkpoint_id=path / "trainer")
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
