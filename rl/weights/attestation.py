"""Attested weight sync: fingerprints of a policy version, and the check that a generator serves it.

The trainer fingerprints every tensor of a version as published (after the cast to the generators' dtype); each
generator replica measures the same fingerprints on the weights vLLM holds after its load (`rl.weights.vllm_attest`,
after vLLM's renaming, fusing and tensor-parallel slicing) and the version it now stamps on completions. A replica
whose measurement disagrees refuses traffic and is replaced like a dead one.

A tensor `W` (viewed as a matrix [rows, cols]: 1-D tensors as one column) has three numbers:
    sum         1ᵀ W 1
    projection  uᵀ W v, with u [rows] and v [cols] seeded ±1 vectors (seeded by the tensor's name)
    norm        ‖W‖_F, the scale of the tolerance.
Both sum and projection are linear in `W` and the probe vectors are ±1, so a block of `W` (a tensor-parallel shard,
one part of a fused qkv or gate_up weight) has its own share `u[rows]ᵀ W[rows, cols] v[cols]`: a generator adds the
shares of its pieces, and one that holds its weights packed for a kernel (vLLM on CPU) measures a piece by running
that kernel on the two probe columns (1 and v). ±1 inputs are exact in every float dtype.

Arithmetic is fp32 (a float64 pass costs 5-10x more on a CPU): each side's row dot products round, by about
2⁻²⁴·√cols·‖row‖, and a kernel's outputs round to its dtype, by about ε_out·|y|; over the rows (±1 weights) both add
up like a random walk, to about (2⁻²⁴·√cols + ε_out)·‖W‖_F. The tolerance is `SIGMAS` times that. One fp32 training
step moves ‖W‖_F by far more (Adam at lr 1e-5 on weights of rms 0.04: 2.5e-4 relative, against 16·2⁻²⁴·√1536 = 4e-5);
a bf16 kernel's output rounding (2⁻⁹) hides changes that small, so a layer measured through a 16-bit kernel proves
the load to 16-bit precision only.

Nothing here is specific to the full policy: an adapter-only sync (LoRA) is attested the same way, with the trainer
fingerprinting the adapter's tensors (`fingerprint_state_dict`) and the generator measuring the adapter vLLM loaded
in its LoRA layers' slot (`rl.weights.vllm_attest.adapter_pieces`, beside `loaded_pieces`, which walks the base weights).

Importing torch alone: vLLM's worker processes import this module.
"""

from __future__ import annotations

import functools
import math
import zlib
from dataclasses import dataclass, field

import torch

PROBE_SEED = 0x5EED
"""Seed of the ±1 probe vectors (mixed with each tensor's name)."""

SIGMAS = 16.0
"""The tolerance in units of the expected rounding (module docstring): the largest error measured on SmolLM2-135M
and tiny-qwen3 (vLLM 0.32 on CPU) was below 1 unit."""

UNIT_ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-9, "float16": 2.0**-12, "float64": 2.0**-53}


@dataclass(frozen=True)
class TensorPrint:
    """The fingerprint of one published tensor (see the module docstring)."""

    sum: float
    projection: float
    norm: float
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Fingerprints:
    """A published policy version's fingerprints, by the trainer's parameter names (tied tensors under one name)."""

    policy_version: int
    tensors: dict[str, TensorPrint]
    seed: int = PROBE_SEED
    seconds: float = 0.0
    """What computing them cost the trainer."""
    rewind: bool = False
    """The controller moves the generators back to this older version on purpose (a trainer recovery reloads the
    last checkpoint's): the version counter may go backward this once."""

    def non_finite(self) -> list[str]:
        """The tensors holding an inf or NaN (their sum or projection is not finite): a version no generator should serve."""
        return [name for name, p in self.tensors.items() if not math.isfinite(p.sum + p.projection)]

    def to_message(self) -> dict:
        """Plain values (what vLLM's RPC serializer carries to its workers)."""
        return {
            "policy_version": self.policy_version,
            "seed": self.seed,
            "tensors": {name: [list(p.shape), p.dtype] for name, p in self.tensors.items()},
        }


@dataclass(frozen=True)
class Piece:
    """A block `[row_start:row_end, col_start:col_end]` of published tensor `name` (as a matrix), measured on a
    generator: its share of the sum and the projection, and how it was read ("exact": the bytes; "kernel": through
    the layer's matmul)."""

    name: str
    rows: tuple[int, int]
    cols: tuple[int, int]
    sum: float
    projection: float
    dtype: str
    how: str

    def to_message(self) -> list:
        return [self.name, list(self.rows), list(self.cols), self.sum, self.projection, self.dtype, self.how]

    @classmethod
    def from_message(cls, message: list) -> Piece:
        name, rows, cols, sum_, projection, dtype, how = message
        return cls(name, tuple(rows), tuple(cols), float(sum_), float(projection), dtype, how)


@dataclass
class Verdict:
    """The outcome of one replica's attestation: attested when nothing failed."""

    policy_version: int
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    """Seconds the replica spent measuring its weights (while its engine was paused)."""
    tensors: int = 0
    kernel_tensors: int = 0
    """How many tensors were checked, and how many of them through a kernel (a coarser tolerance) for some piece."""

    @property
    def attested(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        shown = "; ".join(self.failures[:5])
        more = f" (and {len(self.failures) - 5} more)" if len(self.failures) > 5 else ""
        return f"weight attestation of policy version {self.policy_version} failed: {shown}{more}"


def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """The [rows, cols] a tensor of `shape` is fingerprinted as: dim 0 by the rest (a scalar is 1x1, 1-D is a column)."""
    if len(shape) == 0:
        return 1, 1
    return shape[0], math.prod(shape[1:])


def probe_vectors(name: str, shape: tuple[int, ...], seed: int = PROBE_SEED) -> tuple[torch.Tensor, torch.Tensor]:
    """The ±1 vectors (u [rows], v [cols], float64) of tensor `name`: the same on every process.

    u is seeded by the name, v by the column count alone, so the parts of a fused layer (q, k and v of one input)
    share their v and the layer's kernel measures them all in one call."""
    rows, cols = matrix_shape(shape)
    return _signs(rows, zlib.crc32(name.encode()), seed), _signs(cols, 0, seed)


@functools.lru_cache(maxsize=8192)
def _signs(length: int, key: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed((seed * 1_000_003 + key * 7919 + length) % 2**63)
    return torch.randint(0, 2, (length,), generator=generator, dtype=torch.int8).to(torch.float64) * 2 - 1


def _as_float32_matrix(tensor: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    matrix = tensor.detach().reshape(rows, cols)
    return matrix if matrix.dtype == torch.float32 else matrix.float()


def fingerprint(name: str, tensor: torch.Tensor, seed: int = PROBE_SEED) -> TensorPrint:
    """A whole tensor's fingerprint, computed where the tensor is (fp32; see the module docstring)."""
    shape = tuple(tensor.shape)
    rows, cols = matrix_shape(shape)
    u, v = probe_vectors(name, shape, seed)
    matrix = _as_float32_matrix(tensor, rows, cols)
    projected = torch.mv(matrix, v.to(device=matrix.device, dtype=torch.float32))
    return TensorPrint(
        matrix.sum().item(),
        (u @ projected.cpu().double()).item(),
        torch.linalg.vector_norm(matrix).item(),
        shape,
        str(tensor.dtype).removeprefix("torch."),
    )


def fingerprint_state_dict(
    state_dict: dict[str, torch.Tensor], policy_version: int, seed: int = PROBE_SEED
) -> Fingerprints:
    """Fingerprints of the tensors as published (already in the wire dtype); a tied tensor under its first name."""
    seen: set[int] = set()
    tensors: dict[str, TensorPrint] = {}
    for name, tensor in state_dict.items():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        tensors[name] = fingerprint(name, tensor, seed)
    return Fingerprints(policy_version, tensors, seed)


def exact_piece(
    name: str, block: torch.Tensor, full_shape: tuple[int, ...], rows: tuple[int, int], cols: tuple[int, int], seed: int
) -> Piece:
    """The share of block `W[rows, cols]` (given as a tensor holding exactly those elements), read from its bytes."""
    u, v = probe_vectors(name, full_shape, seed)
    matrix = _as_float32_matrix(block, rows[1] - rows[0], cols[1] - cols[0])
    projected = torch.mv(matrix, v[cols[0] : cols[1]].to(device=matrix.device, dtype=torch.float32))
    return Piece(
        name,
        rows,
        cols,
        matrix.sum().item(),
        (u[rows[0] : rows[1]] @ projected.cpu().double()).item(),
        str(block.dtype).removeprefix("torch."),
        "exact",
    )


def kernel_piece(
    name: str,
    outputs: torch.Tensor,
    full_shape: tuple[int, ...],
    rows: tuple[int, int],
    cols: tuple[int, int],
    dtype: torch.dtype,
    seed: int,
) -> Piece:
    """The share of block `W[rows, cols]` from a kernel's outputs `[2, rows]` on the inputs `kernel_inputs(...)`."""
    u, _ = probe_vectors(name, full_shape, seed)
    outputs = outputs.detach().to(device="cpu", dtype=torch.float64)
    return Piece(
        name,
        rows,
        cols,
        outputs[0].sum().item(),
        (u[rows[0] : rows[1]] @ outputs[1]).item(),
        str(dtype).removeprefix("torch."),
        "kernel",
    )


def kernel_inputs(name: str, full_shape: tuple[int, ...], cols: tuple[int, int], seed: int) -> torch.Tensor:
    """The two probe inputs `[2, cols]` (float64) of block columns `cols`: all ones, and v's slice."""
    _, v = probe_vectors(name, full_shape, seed)
    part = v[cols[0] : cols[1]]
    return torch.stack([torch.ones_like(part), part])


def check(
    expected: Fingerprints,
    pieces: list[Piece],
    *,
    served_version: int,
    previous_version: int,
) -> Verdict:
    """Whether `pieces` (from every worker of one replica) prove it serves `expected`.

    Fails on: a served version (what completions are stamped with) other than the published one, or one that did
    not move forward from the previous; a published tensor that is missing or not wholly covered; replicas of one
    block (tensor-parallel copies) that disagree; a dtype other than the published one; a sum or projection outside
    `tolerance`.
    """
    verdict = Verdict(expected.policy_version)
    failures = verdict.failures
    if served_version != expected.policy_version:
        failures.append(f"serves version {served_version}, published {expected.policy_version}")
    if served_version <= previous_version and expected.policy_version > 0 and not expected.rewind:
        failures.append(f"version counter went from {previous_version} to {served_version} (not forward)")
    by_name: dict[str, dict[tuple, list[Piece]]] = {}
    for piece in pieces:
        by_name.setdefault(piece.name, {}).setdefault((piece.rows, piece.cols), []).append(piece)
    for name, published in expected.tensors.items():
        blocks = by_name.get(name)
        if not blocks:
            failures.append(f"{name}: not found in the served model")
            continue
        verdict.tensors += 1
        total = projection = 0.0
        covered = 0
        kernel = False
        for (rows, cols), copies in blocks.items():
            first = copies[0]
            for copy in copies[1:]:
                if abs(copy.sum - first.sum) > tolerance(published, copy) or abs(copy.projection - first.projection) > (
                    tolerance(published, copy)
                ):
                    failures.append(f"{name}: tensor-parallel copies of rows {rows} cols {cols} differ")
            if wrong := next((copy for copy in copies if copy.dtype != published.dtype), None):
                failures.append(f"{name}: served in {wrong.dtype}, published in {published.dtype}")
            kernel = kernel or any(copy.how == "kernel" for copy in copies)
            total += first.sum
            projection += first.projection
            covered += (rows[1] - rows[0]) * (cols[1] - cols[0])
        verdict.kernel_tensors += kernel
        rows, cols = matrix_shape(published.shape)
        if covered != rows * cols:
            failures.append(f"{name}: the served model holds {covered} of its {rows * cols} elements")
            continue
        limit = sum(max(tolerance(published, piece) for piece in copies) for copies in blocks.values())
        if not math.isfinite(published.sum + published.projection):  # NaN equals nothing: nothing can be proven
            failures.append(f"{name}: the published weights are not finite")
        elif not abs(total - published.sum) <= limit:  # a NaN served sum fails too
            failures.append(f"{name}: sum {total:.9g}, published {published.sum:.9g}")
        elif not abs(projection - published.projection) <= limit:
            failures.append(f"{name}: projection {projection:.9g}, published {published.projection:.9g}")
    return verdict


def tolerance(published: TensorPrint, piece: Piece) -> float:
    """How far a piece's sum or projection may be off: `SIGMAS` times the rounding of both sides' fp32 dot products
    over its columns and of a kernel's outputs (module docstring), at the scale of the whole tensor's norm."""
    columns = piece.cols[1] - piece.cols[0]
    output = UNIT_ROUNDOFF.get(piece.dtype, UNIT_ROUNDOFF["float16"]) if piece.how == "kernel" else 0.0
    accumulate = UNIT_ROUNDOFF["float32"] * math.sqrt(max(columns, matrix_shape(published.shape)[1]))
    return SIGMAS * (2 * accumulate + output) * published.norm + 1e-30
