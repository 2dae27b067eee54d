"""Policy weights in one shared-memory file, and the handle that names them: what crosses a process boundary.

A `SharedWeights` handle (a path, a size and a layout: plain values) is all that travels between the trainer,
the generator actor and vLLM's workers; each process maps the file itself. This module imports torch
alone, so vLLM's worker processes can import it without Monarch or torchstore.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

SHM_DIR = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
SHM_PREFIX = "rlmesh-weights-"
ALIGN = 64
"""Every tensor starts on a 64-byte boundary of the file."""


@dataclass(frozen=True)
class SharedWeights:
    """A version's bytes in a shared-memory file.

    `layout` maps each parameter name to (byte offset, shape, dtype name); tied parameters share an offset.
    """

    path: str
    nbytes: int
    layout: dict[str, tuple[int, tuple[int, ...], str]]

    def to_message(self) -> dict:
        """The handle as plain dicts, lists and numbers (what vLLM's RPC serializer carries)."""
        return {"path": self.path, "nbytes": self.nbytes, "layout": {k: list(v) for k, v in self.layout.items()}}

    @classmethod
    def from_message(cls, message: dict) -> SharedWeights:
        layout = {
            name: (int(offset), tuple(shape), dtype) for name, (offset, shape, dtype) in message["layout"].items()
        }
        return cls(message["path"], int(message["nbytes"]), layout)


def map_file(path: str, nbytes: int, *, create: bool = False) -> torch.Tensor:
    """A uint8 tensor over the shared file: writes are seen by every mapper. `create`: make it and reserve its
    bytes first, so a full /dev/shm fails here with ENOSPC instead of SIGBUS at the first write to a page."""
    if create:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, nbytes)
        except OSError as exc:
            os.close(fd)
            os.unlink(path)
            raise OSError(
                exc.errno, f"cannot reserve {nbytes / 2**20:.0f} MiB for weights in {path}: {exc.strerror}"
            ) from None
        os.close(fd)
    return torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)


def pin_for_device_copies(buffer: torch.Tensor) -> None:
    """Page-lock a mapped file for CUDA (`cudaHostRegister`), so device-to-host copies into it run at pinned-memory
    speed instead of through the driver's pageable staging buffer; once per file (the publisher reuses its two)."""
    error = torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), buffer.numel(), 0)
    if int(error) != 0:
        raise RuntimeError(f"cudaHostRegister of the {buffer.numel() / 2**20:.0f} MiB weight file failed: {error}")


def view(buffer: torch.Tensor, offset: int, shape: tuple[int, ...], dtype: str) -> torch.Tensor:
    """The tensor at `offset` of a mapped file."""
    dtype_ = getattr(torch, dtype)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype_).element_size()
    return buffer[offset : offset + nbytes].view(dtype_).view(shape)


def write(buffer: torch.Tensor, entry: tuple[int, tuple[int, ...], str], tensor: torch.Tensor) -> None:
    """Copy one tensor into its place `entry` (offset, shape, dtype) of a mapped file, cast to the file's dtype; a
    GPU tensor is cast on the GPU first, so only the file's bytes cross to the host."""
    target = view(buffer, *entry)
    target.copy_(tensor if tensor.device.type == "cpu" else tensor.to(target.dtype))


def plan_layout(
    state_dict: dict[str, torch.Tensor], dtype: torch.dtype | None, key=lambda tensor: tensor.data_ptr()
) -> tuple[dict[str, tuple[int, tuple[int, ...], str]], int]:
    """Layout and total bytes of `state_dict` with floating tensors in `dtype` (None: each its own);
    `key(tensor)` identifies tied ones, stored once."""
    layout: dict[str, tuple[int, tuple[int, ...], str]] = {}
    offsets: dict[object, int] = {}
    nbytes = 0
    for name, tensor in state_dict.items():
        out_dtype = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        if key(tensor) not in offsets:
            offsets[key(tensor)] = nbytes
            nbytes += -(-tensor.numel() * torch.empty((), dtype=out_dtype).element_size() // ALIGN) * ALIGN
        layout[name] = (offsets[key(tensor)], tuple(tensor.shape), str(out_dtype).removeprefix("torch."))
    return layout, nbytes


def file_path(tag: str) -> str:
    """A shared file owned by this process (`remove_dead_shared_files` deletes it once the process is gone)."""
    return str(SHM_DIR / f"{SHM_PREFIX}{os.getpid()}-{tag}")


def shm_free_bytes() -> int:
    """Free bytes where the weight files live (Docker gives /dev/shm 64 MB unless told otherwise)."""
    return shutil.disk_usage(SHM_DIR).free


class MappedFiles:
    """Reader side: the state dict a handle names, each file mapped once per process."""

    def __init__(self) -> None:
        self._mapped: dict[str, torch.Tensor] = {}

    def state_dict(self, handle: SharedWeights) -> dict[str, torch.Tensor]:
        if handle.path not in self._mapped or self._mapped[handle.path].numel() != handle.nbytes:
            self._mapped[handle.path] = map_file(handle.path, handle.nbytes)
        buffer = self._mapped[handle.path]
        return {name: view(buffer, *entry) for name, entry in handle.layout.items()}
