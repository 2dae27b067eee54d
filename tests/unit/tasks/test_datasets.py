"""Task rows from local JSONL and Parquet files with a column mapping, through the config."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rl.config import load_config
from rl.config.tasks import TaskConfig
from tasks.build import build_task

ROWS = [
    {"problem": "Ana has 2 coins and gets 3 more. How many?", "solution": 5, "source": "hand"},
    {"problem": "Ben has 7 books and gives away 4. How many are left?", "solution": 3, "source": "hand"},
]


@pytest.fixture
def files(tmp_path):
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    parquet = tmp_path / "validation.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS[:1]), parquet)
    return jsonl, parquet


def test_rows_from_jsonl_and_parquet_with_renamed_columns(files):
    jsonl, parquet = files
    built = build_task(
        TaskConfig(
            name="arithmetic_retry",
            args={"num_train": 3, "num_validation": 1},
            data={
                "train": str(jsonl),
                "validation": str(parquet),
                "columns": {"question": "problem", "answer": "solution"},
            },
        )
    )
    assert built.load_rows("train") == [
        {"question": r["problem"], "answer": r["solution"], "source": "hand"} for r in ROWS
    ]
    assert built.load_rows("validation") == [{"question": ROWS[0]["problem"], "answer": 5, "source": "hand"}]
    env = built.task.make_env(built.load_rows("train")[0])
    assert env.answer == "5"


def test_only_the_configured_split_comes_from_a_file(files):
    jsonl, _ = files
    built = build_task(
        TaskConfig(
            name="arithmetic_retry",
            args={"num_train": 3, "num_validation": 2},
            data={"train": str(jsonl), "columns": {"question": "problem", "answer": "solution"}},
        )
    )
    assert len(built.load_rows("train")) == 2 and len(built.load_rows("validation")) == 2
    assert built.load_rows("validation") == built.task.load_dataset("validation")


@pytest.mark.parametrize(
    "columns, match",
    [
        (
            {"question": "prompt", "answer": "solution"},
            r"no column\(s\) \['prompt'\]; the file has \['problem', 'solution', 'source'\]",
        ),
        ({"answer": "solution"}, r"rows need field\(s\) \['question'\]"),
    ],
)
def test_bad_column_mappings_name_the_problem(files, columns, match):
    built = build_task(
        TaskConfig(
            name="arithmetic_retry",
            args={"num_train": 3, "num_validation": 1},
            data={"train": str(files[0]), "columns": columns},
        )
    )
    with pytest.raises(ValueError, match=match):
        built.load_rows("train")


def test_missing_file_and_unknown_format(tmp_path):
    built = build_task(
        TaskConfig(
            name="reverse_text", args={"num_train": 3, "num_validation": 1}, data={"train": str(tmp_path / "x.jsonl")}
        )
    )
    with pytest.raises(ValueError, match="not found"):
        built.load_rows("train")
    (tmp_path / "x.csv").write_text("a\n1\n")
    built = build_task(
        TaskConfig(
            name="reverse_text", args={"num_train": 3, "num_validation": 1}, data={"train": str(tmp_path / "x.csv")}
        )
    )
    with pytest.raises(ValueError, match="unsupported data file type"):
        built.load_rows("train")


def test_controller_reads_the_file_rows(files, tmp_path):
    from rl.loop.controller import Controller

    jsonl, parquet = files
    config = load_config(
        None,
        {
            "model.path": "tiny-qwen3",
            "trainer.seq_len": "1024",
            "generator.max_model_len": "1024",
            "tasks": f'[{{name = "arithmetic_retry", data = {{train = "{jsonl}", validation = "{parquet}", columns = {{question = "problem", answer = "solution"}}}}}}]',
        },
    )
    controller = Controller(config)
    assert controller.validation_rows == [
        ("arithmetic_retry", {"question": ROWS[0]["problem"], "answer": 5, "source": "hand"})
    ]
    assert {row["answer"] for _, row in controller.stream.take(4)} == {5, 3}
