"""Read an offline `.wandb` file with wandb's own record type (`wandb_internal_pb2.Record`).

wandb 0.31 writes the file from its Go core and ships no Python reader, so the framing is read
here: a 7-byte header (`:W&B`, magic 0xBEE1, version 0), then LevelDB-log blocks of 32 KiB whose
chunks are `crc32c (4) | length (2, LE) | type (1: full, 2: first, 3: middle, 4: last) | data`.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
HEADER = 7


def records(path: Path) -> Iterator[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a .wandb file"
    offset, pending = HEADER, b""
    while offset + HEADER <= len(data):
        left_in_block = BLOCK - offset % BLOCK
        if left_in_block < HEADER:  # block trailer padding
            offset += left_in_block
            continue
        length, kind = struct.unpack_from("<HB", data, offset + 4)
        if offset + HEADER + length > len(data):  # a chunk still being written
            return
        chunk = data[offset + HEADER : offset + HEADER + length]
        offset += HEADER + length
        if kind == 0 and length == 0:  # zero fill at the end of a block
            continue
        pending += chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def finished_records(path: Path, patience_s: float = 60.0) -> list[wandb_internal_pb2.Record]:
    """All records once the run's `exit` record is on disk: wandb's core may write the file after `finish()` returns."""
    deadline = time.monotonic() + patience_s
    while True:
        found = list(records(path))
        if any(record.WhichOneof("record_type") == "exit" for record in found) or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def history(path: Path) -> list[dict[str, Any]]:
    """Every history row of the run (one per step): {key: decoded JSON value}, with `_step`.

    Items are stored flat under a key path (a table is `["reward/samples", "path"]`, ...); they are nested back.
    """
    rows = []
    for record in finished_records(path):
        if record.WhichOneof("record_type") != "history":
            continue
        row: dict[str, Any] = {}
        for item in record.history.item:
            *parents, last = list(item.nested_key) or [item.key]
            node = row
            for parent in parents:
                node = node.setdefault(parent, {})
            node[last] = json.loads(item.value_json)
        rows.append(row)
    return rows
