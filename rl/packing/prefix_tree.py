"""Prefix-shared packing: the samples of a batch as prefix trees, so a shared prefix is forwarded once.

The samples of a group share their prompt (multi-turn samples may share more; a chat template's
system prompt is shared by every group). Sorted by their token ids, samples sit next to those they
share the longest prefix with; rows are filled in that order, each sample adding only the tokens after
its common prefix with the previous sample of its row (a tree cut by a row boundary repeats the
shared prefix in the next row). Laid out in that order, a row's tokens are a depth-first walk of its
trie, so every node's subtree is the contiguous span [node, subtree_end):

    node q may attend to node k  <=>  k <= q < subtree_end[k]  <=>  k is q or one of q's prefix tokens

Position ids are depths, so under that mask every token sees exactly the tokens (and positions) it saw
when it was sampled: its logprob, and the gradient through it, equal an independent forward of its sample.

The batch keeps the logical layout of `rl.packing.rows` (each sample whole in the row that forwards it; every
stream the loss reads) and adds the forward layout, F <= the row capacity columns:
  fwd_input_ids, fwd_position_ids [R,F]; fwd_parent [R,F] (the column whose output predicts the node, -1
  for roots and padding); fwd_subtree_end [R,F]; fwd_index [R,L] (the forward column of each logical token).
Padding nodes are roots that only see themselves. Rows are balanced: the smallest capacity that needs no
more rows than `seq_len` does (at least `min_rows`, rounded up to `rows_multiple_of`: the trainer's ranks times
its minibatches, and its ranks), so the widest row, which every row of a forward is padded to, is as short as it can be.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from rl.config.roles import TrainerConfig
from rl.packing.rows import TrainSample, check_packable, check_packing, lay_out, pack_samples, trim_padding


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def fill_rows(lengths: list[int], shared: list[int], capacity: int) -> list[list[int]]:
    """Next-fit of samples (in trie order) into rows of `capacity` forwarded tokens; positions in that order.

    `shared[k]` is sample k's common prefix with sample k-1: what it costs less when both share a row.
    """
    rows: list[list[int]] = []
    used = 0
    for k, length in enumerate(lengths):
        cost = length - shared[k] if rows else length
        if rows and used + cost <= capacity:
            rows[-1].append(k)
            used += cost
        else:
            rows.append([k])
            used = length
    return rows


def row_cost(row: list[int], lengths: list[int], shared: list[int]) -> int:
    """Forwarded tokens of a row of samples (positions in trie order)."""
    return lengths[row[0]] + sum(lengths[k] - shared[k] for k in row[1:])


def split_rows(rows: list[list[int]], lengths: list[int], shared: list[int], target: int) -> list[list[int]]:
    """Cut the costliest row in two (where the halves are most even) until there are `target` rows or no row can be cut."""
    rows = list(rows)
    while len(rows) < target:
        cuttable = [r for r, row in enumerate(rows) if len(row) > 1]
        if not cuttable:
            break
        r = max(cuttable, key=lambda r: row_cost(rows[r], lengths, shared))
        row = rows[r]
        cut = min(
            range(1, len(row)),
            key=lambda c: max(row_cost(row[:c], lengths, shared), row_cost(row[c:], lengths, shared)),
        )
        rows[r : r + 1] = [row[:cut], row[cut:]]
    return rows


def pack_trees(
    samples: list[TrainSample], *, seq_len: int, pad_token_id: int, rows_multiple_of: int = 1, min_rows: int = 1
) -> TensorDict:
    """Pack samples as prefix trees into rows of at most `seq_len` forwarded tokens (see the module docstring).

    Returns the logical layout of `rl.packing.rows.pack_samples` (rows as wide as their longest concatenation of
    samples) plus the `fwd_*` forward layout; checked (`check_trees`) before it is returned.
    """
    check_packable(samples, seq_len, "pack_trees")
    order = sorted(range(len(samples)), key=lambda i: (samples[i].input_ids, i))  # trie (depth-first) order
    ids = [samples[i].input_ids for i in order]
    lengths = [len(tokens) for tokens in ids]
    shared = [0] + [common_prefix(ids[k - 1], ids[k]) for k in range(1, len(ids))]
    target = max(min_rows, len(fill_rows(lengths, shared, seq_len)))
    target = min(len(samples), -(-target // rows_multiple_of) * rows_multiple_of)
    low, high = max(lengths), seq_len  # the smallest capacity that needs at most `target` rows
    while low < high:
        middle = (low + high) // 2
        if len(fill_rows(lengths, shared, middle)) <= target:
            high = middle
        else:
            low = middle + 1
    rows = split_rows(fill_rows(lengths, shared, low), lengths, shared, target)

    nodes = [_row_trie([ids[k] for k in row]) for row in rows]
    width = max(len(tokens) for tokens, *_ in nodes)
    logical_width = max(sum(lengths[k] for k in row) for row in rows)
    batch = lay_out(samples, [[order[k] for k in row] for row in rows], width=logical_width, pad_token_id=pad_token_id)
    shape = (len(rows), width)
    forward = {
        "fwd_input_ids": torch.full(shape, pad_token_id, dtype=torch.long),
        "fwd_position_ids": torch.zeros(shape, dtype=torch.long),
        "fwd_parent": torch.full(shape, -1, dtype=torch.long),
        "fwd_subtree_end": torch.arange(1, width + 1).repeat(len(rows), 1),
        "fwd_index": torch.zeros(len(rows), logical_width, dtype=torch.long),
    }
    for r, (tokens, depth, parent, end, paths) in enumerate(nodes):
        n = len(tokens)
        forward["fwd_input_ids"][r, :n] = torch.tensor(tokens)
        forward["fwd_position_ids"][r, :n] = torch.tensor(depth)
        forward["fwd_parent"][r, :n] = torch.tensor(parent)
        forward["fwd_subtree_end"][r, :n] = torch.tensor(end)
        flat = [node for path in paths for node in path]
        forward["fwd_index"][r, : len(flat)] = torch.tensor(flat)
    for key, value in forward.items():
        batch[key] = value
    check_packing(batch, samples)
    check_trees(batch)
    return batch


def _row_trie(row_ids: list[list[int]]) -> tuple[list[int], list[int], list[int], list[int], list[list[int]]]:
    """One row's trie of token lists in trie order: (tokens, depths, parents, subtree ends, each sample's node path)."""
    tokens: list[int] = []
    depth: list[int] = []
    parent: list[int] = []
    end: list[int] = []
    paths: list[list[int]] = []
    path: list[int] = []  # the previous sample's nodes, by depth
    for sample_ids in row_ids:
        keep = common_prefix(path and [tokens[node] for node in path], sample_ids)
        for node in path[keep:]:  # the previous sample's branch ends where this one leaves it
            end[node] = len(tokens)
        path = path[:keep]
        for t in range(keep, len(sample_ids)):
            tokens.append(sample_ids[t])
            depth.append(t)
            parent.append(path[-1] if path else -1)
            end.append(-1)
            path.append(len(tokens) - 1)
        paths.append(list(path))
    for node in path:
        end[node] = len(tokens)
    return tokens, depth, parent, end, paths


def check_trees(batch: TensorDict) -> None:
    """Fail loudly unless every logical token's forward node carries its token, its position and exactly its prefix.

    Walks each sample's nodes: node t holds the sample's token t at depth t, its parent is node t-1, and
    under the subtree mask it attends to the sample's nodes 0..t and to nothing else.
    """
    for r in range(batch.batch_size[0]):
        ids, end, parent = batch["fwd_input_ids"][r], batch["fwd_subtree_end"][r], batch["fwd_parent"][r]
        columns = torch.arange(len(ids))
        sees = (columns[None, :] <= columns[:, None]) & (columns[:, None] < end[None, :])  # [F,F]: query, key
        visible = sees.sum(dim=1)  # [F] keys each node attends to
        index, sequence_ids = batch["fwd_index"][r], batch["sequence_ids"][r]
        for i in sequence_ids.unique().tolist():
            if i < 0:
                continue
            nodes = index[sequence_ids == i]
            if batch["fwd_input_ids"][r][nodes].tolist() != batch["input_ids"][r][sequence_ids == i].tolist():
                raise AssertionError(f"sample {i}: forward tokens differ from the sample's")
            if batch["fwd_position_ids"][r][nodes].tolist() != list(range(len(nodes))):
                raise AssertionError(f"sample {i}: forward positions are not its depths")
            if parent[nodes].tolist() != [-1, *nodes[:-1].tolist()]:
                raise AssertionError(f"sample {i}: a forward node's parent is not the sample's previous token")
            prefix = torch.ones(
                len(nodes), len(nodes), dtype=torch.bool
            ).tril()  # token t sees tokens 0..t of its sample ...
            if not torch.equal(sees[nodes][:, nodes], prefix) or visible[nodes].tolist() != list(
                range(1, len(nodes) + 1)
            ):  # ... and no more
                raise AssertionError(f"sample {i}: a token attends to something other than its own prefix")


def pack_batch(
    samples: list[TrainSample],
    *,
    seq_len: int,
    pad_token_id: int,
    prefix_sharing: bool,
    rows_multiple_of: int = 1,
    min_rows: int = 1,
) -> TensorDict:
    """The trainer's batch: prefix trees (`pack_trees`), or samples side by side (`pack_samples`), without padding columns."""
    if prefix_sharing:
        return pack_trees(
            samples, seq_len=seq_len, pad_token_id=pad_token_id, rows_multiple_of=rows_multiple_of, min_rows=min_rows
        )
    return trim_padding(pack_samples(samples, seq_len=seq_len, pad_token_id=pad_token_id))


def packing_metrics(batch: TensorDict) -> dict[str, float]:
    """Forwarded and logical tokens of a batch and its packing efficiency (real over all forwarded positions).

    logical_tokens / forward_tokens is what prefix sharing saves: 1 without it.
    """
    real = batch["sequence_ids"] >= 0  # [R,L]
    logical = float(real.sum())
    if "fwd_index" in batch:
        # [R,F], 1 on used nodes
        nodes = torch.zeros(batch["fwd_input_ids"].shape, device=batch["fwd_index"].device).scatter_reduce(
            1, batch["fwd_index"], real.float(), "amax"
        )
        forward, positions = float(nodes.sum()), nodes.numel()
    else:
        forward, positions = logical, real.numel()
    return {
        "train/packing_efficiency": forward / positions,
        "train/forward_tokens": forward,
        "train/logical_tokens": logical,
    }


def pack_for_trainer(samples: list[TrainSample], trainer: TrainerConfig, pad_token_id: int) -> TensorDict:
    """A step's batch as `trainer` takes it: `[R, L]` rows as wide as the widest, R a multiple of its ranks and at
    least one row per rank and minibatch."""
    return pack_batch(
        samples,
        seq_len=trainer.seq_len,
        pad_token_id=pad_token_id,
        prefix_sharing=trainer.prefix_sharing,
        rows_multiple_of=trainer.ranks,
        min_rows=trainer.ranks * trainer.ppo_n_minibatches,
    )
