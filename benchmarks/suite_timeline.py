"""Where the test suite's time goes: per worker, its busy seconds and when it finished; per file, its seconds and when
it started. Reads the lines tests/support/timeline.py wrote during a run of the suite:

    RLMESH_TIMELINE=/tmp/timeline.jsonl PYTHONPATH=$PWD PYTEST_ADDOPTS="-p tests.support.timeline" scripts/test.sh
    .venv/bin/python benchmarks/suite_timeline.py /tmp/timeline.jsonl

A suite whose workers finish far apart started a long file late.
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("timeline", type=Path)
    parser.add_argument("--files", type=int, default=25, help="how many of the slowest files to list")
    args = parser.parse_args()
    records = [json.loads(line) for line in args.timeline.read_text().splitlines()]
    start = min(record["start"] for record in records)
    print(f"{len(records)} tests, first start to last end: {max(r['end'] for r in records) - start:.0f} s")
    for worker in sorted({record["worker"] for record in records}):
        mine = [record for record in records if record["worker"] == worker]
        busy = sum(record["end"] - record["start"] for record in mine)
        print(f"{worker}: busy {busy:.0f} s, done at {max(r['end'] for r in mine) - start:.0f} s")
    files: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        files[record["test"].split("::")[0]].append(record)
    print(f"\n{'seconds':>8} {'start':>6} {'end':>6}  worker  file (the {args.files} slowest, in order of start)")
    slowest = sorted(files.items(), key=lambda item: -sum(r["end"] - r["start"] for r in item[1]))[: args.files]
    for name, mine in sorted(slowest, key=lambda item: min(r["start"] for r in item[1])):
        seconds = sum(record["end"] - record["start"] for record in mine)
        first, last = min(r["start"] for r in mine) - start, max(r["end"] for r in mine) - start
        print(f"{seconds:8.0f} {first:6.0f} {last:6.0f}  {mine[0]['worker']:>6}  {name}")


if __name__ == "__main__":
    main()
