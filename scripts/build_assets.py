"""Build the offline model assets (idempotent; instant when cached) and print their folders: the set-up's
(`rl.assets.BUILT_AT_SETUP`), or every built-in model with `--all`."""

import sys
import time

from rl.assets import BUILT_AT_SETUP, BUILTIN_MODELS


def main() -> None:
    names = list(BUILTIN_MODELS) if "--all" in sys.argv[1:] else BUILT_AT_SETUP
    for name in names:
        start = time.perf_counter()
        path = BUILTIN_MODELS[name]()
        print(f"{name}\t{path}\t({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
