"""Checkpoints of a run: what a resume needs to continue exactly where the run stopped.

    runs/<name>/checkpoints/step_00000004/
        the parts of `PARTS` (trainer state, RNG states, run state, step record, service counters, config, and the
                          weights-only marker)
        MANIFEST.json     size and sha256 of every file of the parts: a resume checks them before loading
        COMMITTED         written last: a checkpoint without it is ignored

`PARTS` is the one list of a checkpoint's parts: each is written through it (`write`) and read back through it by
the resume (`read`) and by the damage check (`unreadable`), which reads every part.

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

import hashlib
import json
import os
import random
import shutil
import socket
import stat
import tempfile
import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

from rl.console import warn

COMMITTED = "COMMITTED"
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
    return read(path, WEIGHTS_ONLY)


def newest_loadable(run_dir: Path, resumable: bool = False) -> Path:
    """The newest committed checkpoint that `damage` finds nothing wrong with (`resumable`: and that is not weights
    only); each newer one skipped is named with why on stderr."""
    newest_checkpoint(run_dir)  # none committed: FileNotFoundError
    weights_only_skipped = False
    for path in reversed(committed_checkpoints(run_dir)):
        if resumable and is_weights_only(path):
            weights_only_skipped = True
            warn(
                f"skipping checkpoint {path.name}: it holds weights only (checkpoint.final = 'weights'), no optimizer "
                "state to resume (rlmesh export and rlmesh eval read it)"
            )
            continue
        reason = damage(path)
        if reason is None:
            return path
        warn(f"skipping checkpoint {path.name}: {reason}")
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
    """The first part of checkpoint `path` that its reader in `PARTS` rejects, or None (the trainer state's tensor
    bytes are not read: their sizes are checked against its index, and the manifest checks their content)."""
    for name in PARTS:
        try:
            read(path, name)
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
    to the newest `keep` (`pruned`) and remove this writer's or dead writers' temporaries."""
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
    for old in pruned(committed_checkpoints(run_dir), keep):
        shutil.rmtree(old)
    for stale in root.glob(f"{_TMP}{_PREFIX}*"):
        writer = stale.name.rpartition("@")[2]  # "" for a temporary of a version that did not name its writer
        if writer in ("", writer_identity()) or not _writer_alive(writer):
            shutil.rmtree(stale, ignore_errors=True)
    return final


def pruned(committed: list[Path], keep: int) -> list[Path]:
    """The checkpoints a commit deletes: all but the newest `keep`, and but the newest resumable one when those hold
    weights only (a `final = "weights"` checkpoint never takes the place of the run's last resumable one)."""
    kept = committed[-keep:]
    if all(is_weights_only(path) for path in kept):
        kept += [path for path in committed if not is_weights_only(path)][-1:]
    return [path for path in committed if path not in kept]


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


def rng_state() -> dict[str, Any]:
    """This process's python, numpy and torch RNG states (each of its GPUs' too, once it has used CUDA), as plain
    containers and tensors (loadable with `weights_only=True`)."""
    # {"bit_generator", "state": {"key": uint32 [624], "pos"}, "has_gauss", "gauss"}
    numpy_state = np.random.get_state(legacy=False)
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


def load_rng(path: Path, process: str) -> None:
    """Restore `process`'s RNG; one missing (a replica lost while the checkpoint was written) keeps its own, with a warning."""
    file = path / RNG / f"{process}.pt"
    if not file.is_file():
        warn(f"{path.name} has no RNG state of {process}; it continues from its own seed")
        return
    set_rng_state(torch.load(file, weights_only=True))


def load_trainer(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    init_optimizer_state(optimizer)
    model_state, optimizer_state = _trained_state(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state, "scheduler": scheduler.state_dict()}
    dcp.load(state, checkpoint_id=path / TRAINER)  # fails on any trainable tensor the checkpoint lacks
    set_state_dict(  # not strict: the frozen weights stay the model's own
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=StateDictOptions(ignore_frozen_params=True, strict=False),
    )
    scheduler.load_state_dict(state["scheduler"])


def save_trainer_rank(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    rank: int,
    weights_only: bool = False,
) -> None:
    """A trainer rank's share of the checkpoint being written at `path`: its shards of the trainer state (every rank
    writes, `torch.distributed.checkpoint`) and, from rank 0, the trainer's RNG (`weights_only`: the model alone)."""
    write(path, TRAINER, model, optimizer, scheduler, weights_only)
    if rank == 0:
        write(path, RNG, "trainer")


def load_trainer_rank(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    """What `save_trainer_rank` saved, into a (fresh) trainer rank: its shards of the trainer state and the RNG."""
    load_trainer(path, model, optimizer, scheduler)
    load_rng(path, "trainer")


def init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Give a fresh optimizer its state (AdamW's moments, zeros), one parameter at a time: what a checkpoint's state is
    loaded into. torch's `get_state_dict` would make it with one step on zero gradients for all parameters at once: the
    gradients and the step's temporaries beside the moments (a sharded rank held 5 times its shard of the weights at
    that peak, where the moments are 2). Here each step holds one parameter's gradient and temporaries; with the
    learning rate at 0 no weight moves (AdamW's decay multiplies by 1 - lr x decay). An optimizer that has a state
    already, or a gradient (a stateless one, torch's own test), is left as it is."""
    params = [param for group in optimizer.param_groups for param in group["params"] if param.requires_grad]
    if optimizer.state or any(param.grad is not None for param in params):
        return
    lrs = [group.get("lr") for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        if "lr" in group:
            group["lr"] = torch.tensor(0.0) if isinstance(group["lr"], torch.Tensor) else 0.0
    try:
        for param in params:
            param.grad = torch.zeros_like(param)
            optimizer.step()  # steps the parameters that have a gradient: this one
            param.grad = None
    finally:
        for group, lr in zip(optimizer.param_groups, lrs, strict=True):
            if lr is not None:
                group["lr"] = lr


def _trained_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model state a checkpoint holds, and the optimizer's: every frozen parameter is left out (a LoRA run's base
    comes from the model's files), a tied alias of one too (`ignore_frozen_params` alone keeps those)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer, options=StateDictOptions(ignore_frozen_params=True))
    frozen = {name for name, parameter in model.named_parameters(remove_duplicate=False) if not parameter.requires_grad}
    return {name: value for name, value in model_state.items() if name not in frozen}, optimizer_state


def _write_trainer(
    target: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, weights_only: bool = False
) -> None:
    """The model's trainable parameters (a LoRA run's adapters; frozen weights are the base model's files), optimizer
    and LR schedule through torch.distributed.checkpoint (valid for one rank or many); `weights_only`: the model's
    part alone (a third of an fp32 AdamW checkpoint), which `rl.checkpoint.export` reads."""
    import torch.distributed.checkpoint as dcp

    model_state, optimizer_state = _trained_state(model, optimizer)
    if weights_only:
        dcp.save({"model": model_state}, checkpoint_id=target)
        return
    dcp.save(
        {"model": model_state, "optimizer": optimizer_state, "scheduler": scheduler.state_dict()}, checkpoint_id=target
    )


def _read_trainer_index(target: Path) -> None:
    """The trainer state's index, with every tensor's bytes inside its file (`load_trainer` loads the tensors)."""
    from torch.distributed.checkpoint import FileSystemReader

    for item in FileSystemReader(str(target)).read_metadata().storage_data.values():
        file = target / item.relative_path
        if item.offset + item.length > file.stat().st_size:
            raise ValueError(
                f"{item.relative_path} ends at byte {file.stat().st_size}, its index reads to {item.offset + item.length}"
            )


def _write_rng(target: Path, process: str) -> None:
    target.mkdir(exist_ok=True)
    torch.save(rng_state(), target / f"{process}.pt")


def _read_rngs(target: Path) -> dict[str, Any]:
    """Every process's RNG state by process name; a file that does not load is named."""
    states = {}
    for file in sorted(target.glob("*.pt")):
        try:
            states[file.stem] = torch.load(file, weights_only=True)
        except Exception as exc:
            raise ValueError(f"{file.name}: {type(exc).__name__}: {exc}") from exc
    return states


def _read_run_state(target: Path) -> dict[str, Any]:
    state = json.loads(target.read_text())
    int(state["step"])  # a state without an integer step does not load
    return state


def _write_step_record(target: Path, metrics: dict[str, Any], samples: dict[str, list[dict[str, Any]]]) -> None:
    target.write_text(json.dumps({"metrics": metrics, "samples": samples}, sort_keys=True, default=str) + "\n")


def _read_step_record(target: Path) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]] | None:
    """(metrics, samples), or None for a checkpoint written without them."""
    if not target.is_file():
        return None
    record = json.loads(target.read_text())
    return record["metrics"], record["samples"]


def _write_weights_only_marker(target: Path) -> None:
    target.write_text(
        "checkpoint.final = 'weights': the model's weights, no optimizer state; export or evaluate it, it cannot be "
        "resumed\n"
    )


@dataclass(frozen=True)
class Part:
    """One part of a checkpoint: what it holds, its writer `(target, *value)` and its reader `(target) -> value`,
    `target` being the part's own path in the checkpoint directory."""

    holds: str
    write: Callable[..., None]
    read: Callable[[Path], Any]


TRAINER, RNG, RUN_STATE, STEP_RECORD, SERVICES, CONFIG, WEIGHTS_ONLY = (
    "trainer/",
    "rng/",
    "run_state.json",
    "step_record.json",
    "services.json",
    "config.toml",
    "WEIGHTS_ONLY",
)
PARTS: dict[str, Part] = {
    TRAINER: Part(
        "model, optimizer and LR schedule (torch.distributed.checkpoint); the model alone in a weights-only one",
        _write_trainer,
        _read_trainer_index,
    ),
    RNG: Part("python, numpy and torch RNG states, one file per process that draws numbers", _write_rng, _read_rngs),
    RUN_STATE: Part(
        "the controller's RunState (step, policy version, data cursor)",
        lambda target, run_state: target.write_text(json.dumps(asdict(run_state), indent=2, sort_keys=True) + "\n"),
        _read_run_state,
    ),
    STEP_RECORD: Part(
        "the step's metrics record and logged samples, committed with the checkpoint: a kill between the commit and "
        "the step's log lines loses neither (a resume logs them if the run did not)",
        _write_step_record,
        _read_step_record,
    ),
    SERVICES: Part(
        "each service's counters (restarts, resubmitted, failed and served requests); {} when written without them",
        lambda target, counters: target.write_text(json.dumps(counters, indent=1, sort_keys=True) + "\n"),
        lambda target: json.loads(target.read_text()) if target.is_file() else {},
    ),
    CONFIG: Part(
        "the resolved config the run was started with",
        Path.write_text,
        lambda target: tomllib.loads(target.read_text()),
    ),
    WEIGHTS_ONLY: Part(
        'only in a weights-only checkpoint (`checkpoint.final = "weights"`): trainer/ holds the model and no '
        "optimizer or LR schedule; export and eval read it, a resume skips it (read: whether it is there)",
        _write_weights_only_marker,
        Path.is_file,
    ),
}
"""The parts of a checkpoint by their name in its directory: the one list the writers, the resume and the damage
check use."""


def write(path: Path, name: str, *value: Any) -> None:
    """Write part `name` of the checkpoint (or run directory, for its config) being written at `path`."""
    PARTS[name].write(path / name, *value)


def read(path: Path, name: str) -> Any:
    """Part `name` of checkpoint `path` as its reader returns it (raises when it does not load)."""
    return PARTS[name].read(path / name)
