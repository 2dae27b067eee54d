"""Checkpoints of a run: what a resume needs to continue exactly where the run stopped.

    runs/<name>/checkpoints/step_00000004/
        trainer/          model, optimizer and LR schedule (torch.distributed.checkpoint)
        rng/<process>.pt  python, numpy and torch RNG states of each process that draws numbers
        run_state.json    the controller's RunState (step, policy version, data cursor)
        step_record.json  the step's metrics record and logged samples (a resume logs them if the run did not)
        services.json     each service's counters (restarts, resubmitted, failed and served requests)
        config.toml       the resolved config the run was started with
        WEIGHTS_ONLY      only in a weights-only checkpoint (`checkpoint.final = "weights"`): trainer/ holds the
                          model and no optimizer or LR schedule; export and eval read it, a resume skips it
        MANIFEST.json     size and sha256 of every file above: a resume checks them before loading
        COMMITTED         written last: a checkpoint without it is ignored

A checkpoint is written into a temporary sibling directory named after its writer (host, pid and
process start time), synced to disk file by file, renamed into place, then marked COMMITTED (synced
too); only after that are old checkpoints pruned to the newest `checkpoint.keep`, and temporaries of
this writer or of a writer that no longer runs removed: a commit never touches another live
writer's temporary. A resume takes the newest committed checkpoint whose files match its manifest and
parse with the resume's own readers (`newest_loadable`), naming why it skipped any newer one. Rollouts in flight or buffered are not
saved: their rows are drawn again after a resume.

Loading a checkpoint runs no code from it: tensor files are read with `weights_only=True`. (The
config in it names importable objects, which is code: see docs/checkpoints.md, "Trust boundary".)
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import shutil
import socket
import stat
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

COMMITTED = "COMMITTED"
WEIGHTS_ONLY = "WEIGHTS_ONLY"
MANIFEST = "MANIFEST.json"
_PREFIX = "step_"
_TMP = ".tmp-"


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
        raise FileNotFoundError(
            f"{run_dir} has no committed checkpoint under {checkpoint_root(run_dir)}; nothing to resume"
        )
    return checkpoints[-1]


def is_weights_only(path: Path) -> bool:
    """Whether checkpoint `path` holds the model's weights only (`checkpoint.final = "weights"`): not resumable."""
    return (path / WEIGHTS_ONLY).is_file()


def newest_loadable(run_dir: Path, resumable: bool = False) -> Path:
    """The newest committed checkpoint that `damage` finds nothing wrong with (`resumable`: and that is not weights
    only); each newer one skipped is named with why on stderr."""
    newest_checkpoint(run_dir)  # none committed: FileNotFoundError
    weights_only_skipped = False
    for path in reversed(committed_checkpoints(run_dir)):
        if resumable and is_weights_only(path):
            weights_only_skipped = True
            print(
                f"rlmesh: warning: skipping checkpoint {path.name}: it holds weights only (checkpoint.final = "
                "'weights'), no optimizer state to resume (rlmesh export and rlmesh eval read it)",
                file=sys.stderr,
            )
            continue
        reason = damage(path)
        if reason is None:
            return path
        print(f"rlmesh: warning: skipping checkpoint {path.name}: {reason}", file=sys.stderr)
    why = "no committed checkpoint can be resumed" if weights_only_skipped else "every committed checkpoint is damaged"
    raise FileNotFoundError(f"{run_dir}: {why} (see the warnings above); nothing to resume")


def damage(path: Path) -> str | None:
    """Why checkpoint `path` cannot be loaded, or None: a file missing, truncated or changed since its commit
    (`MANIFEST.json`), or a part the resume reads that does not parse (`unreadable`). The second check also covers
    a checkpoint written before manifests existed, and one whose files were already bad when committed."""
    if (path / MANIFEST).is_file():
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except ValueError as exc:
            return f"unreadable {MANIFEST}: {exc}"
        for name, (size, digest) in sorted(manifest.items()):
            file = path / name
            if not file.is_file():
                return f"{name} is missing"
            if file.stat().st_size != size:
                return f"{name} has {file.stat().st_size} bytes, {size} when committed"
            if _sha256(file) != digest:
                return f"{name} differs from what was committed (sha256)"
    return unreadable(path)


def unreadable(path: Path) -> str | None:
    """The first part of checkpoint `path` that the resume's own readers reject, or None; reads everything but the
    tensor bytes of the trainer state (their sizes are checked against its index; the manifest checks their content)."""
    import tomllib

    from torch.distributed.checkpoint import FileSystemReader

    def trainer_index() -> None:
        metadata = FileSystemReader(str(path / "trainer")).read_metadata()
        for item in metadata.storage_data.values():
            file = path / "trainer" / item.relative_path
            if item.offset + item.length > file.stat().st_size:
                raise ValueError(
                    f"{item.relative_path} ends at byte {file.stat().st_size}, its index reads to {item.offset + item.length}"
                )

    parts = {
        "run_state.json": lambda: int(read_run_state(path)["step"]),
        "config.toml": lambda: tomllib.loads((path / "config.toml").read_text()),
        "trainer/": trainer_index,
        "step_record.json": lambda: read_step_record(path),
        "services.json": lambda: read_service_counters(path),
        **{
            f"rng/{file.name}": functools.partial(torch.load, file, weights_only=True)
            for file in sorted((path / "rng").glob("*.pt"))
        },
    }
    for name, read in parts.items():
        try:
            read()
        except Exception as exc:
            return f"{name} does not load: {type(exc).__name__}: {exc}"
    return None


def writer_identity() -> str:
    """This process as a checkpoint writer: host, pid and start time (a recycled pid is a different writer)."""
    return f"{socket.gethostname()}-{os.getpid()}-{int(psutil.Process().create_time() * 1000)}"


def _writer_alive(identity: str) -> bool:
    """Whether the writer `identity` still runs; a writer on another host counts as alive (it cannot be checked)."""
    host, pid, created = identity.rsplit("-", 2)
    if host != socket.gethostname():
        return True
    try:
        return int(psutil.Process(int(pid)).create_time() * 1000) == int(created)
    except psutil.Error:
        return False


def begin(run_dir: Path, step: int) -> Path:
    """A fresh temporary directory, named after this writer, to write the checkpoint of `step` into.

    It and its `trainer/` and `rng/` (made here, owned by this writer, so it can prune them later whoever wrote their
    files) get the run directory's permissions: ranks under another uid may write a checkpoint exactly when they may
    write the run directory (e.g. a group-writable, setgid run directory made under `umask 002`). Sticky and setuid
    bits are not copied: a sticky directory would keep this writer from pruning the ranks' files."""
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP}{_PREFIX}{step:08d}-", suffix=f"@{writer_identity()}", dir=root))
    mode = stat.S_IMODE(run_dir.stat().st_mode) & 0o2777
    for directory in (tmp, tmp / "trainer", tmp / "rng"):
        directory.mkdir(exist_ok=True)
        directory.chmod(mode)  # explicit: mkdir applies this process's umask, and mkdtemp makes 0o700
    return tmp


def commit(run_dir: Path, tmp: Path, step: int, keep: int) -> Path:
    """Sync `tmp` to disk with its manifest, rename it into place, mark it COMMITTED (synced), then prune
    to the newest `keep` and remove this writer's or dead writers' temporaries."""
    root = checkpoint_root(run_dir)
    final = root / f"{_PREFIX}{step:08d}"
    files = sorted(path for path in tmp.rglob("*") if path.is_file())
    for file in files:
        _fsync(file)
    manifest = {str(file.relative_to(tmp)): (file.stat().st_size, _sha256(file)) for file in files}
    _write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    for directory in sorted({file.parent for file in files} | {tmp}, key=lambda path: -len(path.parts)):
        _fsync(directory)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    _fsync(root)
    _write_synced(final / COMMITTED, f"{step}\n")
    _fsync(final)
    for old in committed_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old)
    for stale in root.glob(f"{_TMP}{_PREFIX}*"):
        writer = stale.name.rpartition("@")[2]  # "" for a temporary of a version that did not name its writer
        if writer in ("", writer_identity()) or not _writer_alive(writer):
            shutil.rmtree(stale, ignore_errors=True)
    return final


def set_aside(run_dir: Path, after: Path) -> list[Path]:
    """Rename committed checkpoints newer than `after` to `damaged-step_...` (a resume from an older one
    continues a trajectory they are not on); returns their new paths."""
    moved = []
    for path in committed_checkpoints(run_dir):
        if path.name > after.name:
            target = path.with_name(f"damaged-{path.name}")
            if target.exists():
                shutil.rmtree(target)
            path.rename(target)
            moved.append(target)
    return moved


def _sha256(path: Path) -> str:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())


def write_run_state(path: Path, run_state: Any) -> None:
    (path / "run_state.json").write_text(json.dumps(asdict(run_state), indent=2, sort_keys=True) + "\n")


def read_run_state(path: Path) -> dict[str, Any]:
    return json.loads((path / "run_state.json").read_text())


def write_step_record(path: Path, metrics: dict[str, Any], samples: dict[str, list[dict[str, Any]]]) -> None:
    """The step's reduced metrics and samples, committed with the checkpoint: a kill between the commit
    and the step's log lines loses neither."""
    (path / "step_record.json").write_text(
        json.dumps({"metrics": metrics, "samples": samples}, sort_keys=True, default=str) + "\n"
    )


def read_step_record(path: Path) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]] | None:
    """(metrics, samples) of the checkpoint's step, or None for a checkpoint written without them."""
    if not (path / "step_record.json").is_file():
        return None
    record = json.loads((path / "step_record.json").read_text())
    return record["metrics"], record["samples"]


def write_service_counters(path: Path, counters: dict[str, dict[str, Any]]) -> None:
    (path / "services.json").write_text(json.dumps(counters, indent=1, sort_keys=True) + "\n")


def read_service_counters(path: Path) -> dict[str, dict[str, Any]]:
    """Each service's counters by name ({} for a checkpoint written without them)."""
    return json.loads((path / "services.json").read_text()) if (path / "services.json").is_file() else {}


def rng_state() -> dict[str, Any]:
    """This process's python, numpy and torch RNG states (each of its GPUs' too, once it has used CUDA), as plain
    containers and tensors (loadable with `weights_only=True`)."""
    numpy_state = np.random.get_state(
        legacy=False
    )  # {"bit_generator", "state": {"key": uint32 [624], "pos"}, "has_gauss", "gauss"}
    numpy_state["state"]["key"] = torch.from_numpy(numpy_state["state"]["key"].astype(np.int64))
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []
    return {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state(), "cuda": cuda}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    numpy_state = {
        **state["numpy"],
        "state": {**state["numpy"]["state"], "key": state["numpy"]["state"]["key"].numpy().astype(np.uint32)},
    }
    np.random.set_state(numpy_state)
    torch.set_rng_state(state["torch"])
    if state.get("cuda"):  # a checkpoint from before CUDA states were saved has none
        torch.cuda.set_rng_state_all(state["cuda"])


def save_rng(path: Path, process: str) -> None:
    (path / "rng").mkdir(exist_ok=True)
    torch.save(rng_state(), path / "rng" / f"{process}.pt")


def load_rng(path: Path, process: str) -> None:
    """Restore `process`'s RNG; one missing (a replica lost while the checkpoint was written) keeps its own, with a warning."""
    file = path / "rng" / f"{process}.pt"
    if not file.is_file():
        print(
            f"rlmesh: warning: {path.name} has no RNG state of {process}; it continues from its own seed",
            file=sys.stderr,
        )
        return
    set_rng_state(torch.load(file, weights_only=True))


def save_trainer(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, weights_only: bool = False
) -> None:
    """Model, optimizer and LR schedule through torch.distributed.checkpoint (valid for one rank or many);
    `weights_only`: the model alone (a third of an fp32 AdamW checkpoint), which `rl.checkpoint.export` reads."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if weights_only:
        dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=path / "trainer")
        return
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save(
        {"model": model_state, "optimizer": optimizer_state, "scheduler": scheduler.state_dict()},
        checkpoint_id=path / "trainer",
    )


def load_trainer(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state, "scheduler": scheduler.state_dict()}
    dcp.load(state, checkpoint_id=path / "trainer")
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
