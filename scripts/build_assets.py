"""Build the offline model assets (idempotent; instant when cached) and print their folders."""

import time

from rl.assets import BUILTIN_MODELS


def main() -> None:
    for name, build in BUILTIN_MODELS.items():
        start = time.perf_counter()
        path = build()
        print(f"{name}\t{path}\t({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
