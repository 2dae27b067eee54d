"""Task rows from local files (JSONL, JSON or Parquet) through the `datasets` library, offline.

A task config's `data` table names a file per split and maps the task's row fields to the
file's columns, so a task written for `{question, answer}` rows reads a file whose columns are
`problem` and `solution`: `data = { train = "gsm.parquet", columns = { question = "problem", answer = "solution" } }`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def load_file_rows(path: str, columns: dict[str, str], required: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Rows of a local file as dicts, the mapped columns renamed to the task's field names.

    Unmapped columns are kept as they are. Raises ValueError naming the file and the columns it
    has when a mapped column or a `required` field is missing.
    """
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    file = Path(path)
    builder = _BUILDERS.get(file.suffix.lower())
    if builder is None:
        raise ValueError(f"{path}: unsupported data file type {file.suffix!r}; use one of {sorted(_BUILDERS)}")
    if not file.is_file():
        raise ValueError(f"data file not found: {path}")
    datasets.disable_progress_bars()
    table = datasets.load_dataset(builder, data_files=str(file.resolve()), split="train")
    absent = sorted(column for column in columns.values() if column not in table.column_names)
    if absent:
        raise ValueError(f"{path}: no column(s) {absent}; the file has {table.column_names}")
    renamed = {column: field for field, column in columns.items()}
    rows = [{renamed.get(key, key): value for key, value in row.items()} for row in table]
    available = {renamed.get(column, column) for column in table.column_names}
    missing = sorted(field for field in required if field not in available)
    if missing:
        raise ValueError(
            f"{path}: rows need field(s) {missing}; map them with data.columns (the file has {table.column_names})"
        )
    return rows


def check_rows(rows: list[Any], fields: tuple[str, ...], where: str) -> None:
    """Raise ValueError naming `where` (task, split, source), the row and the field when a row is not a dict
    or lacks one of `fields` (absent or None: files give None for a key a row lacks, and a reward that
    compares with `str(None)` would then pay the answer "None")."""
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{where}: row {index} is a {type(row).__name__}, not a dict")
        for field in fields:
            if row.get(field) is None:
                state = "null" if field in row else "missing"
                raise ValueError(f"{where}: row {index} has field {field!r} {state}: {_preview(row)}")


def _preview(row: dict[str, Any]) -> str:
    text = repr(row)
    return text if len(text) <= 200 else text[:197] + "..."
