"""`rlmesh train --config a.toml --config b.toml [...]` and `rlmesh train --resume RUN_A --resume RUN_B [...]`: LoRA
runs as tenants of one generator engine and one trainer (`rl.loop.tenants`). Overrides apply to every tenant; a
`--config` tenant and a `--resume` tenant may be mixed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from rl.config import ConfigError, load_config
from rl.console import fail, say

if TYPE_CHECKING:
    from rl.processes.interrupts import InterruptibleRun


def is_tenant_run(run_dir: Path) -> bool:
    """Whether `run_dir` was trained as a LoRA tenant: its newest checkpoint holds an adapter named after the tenant
    (a solo run's is peft's "default"), so a `--resume` of it alone resumes it as the one tenant."""
    from torch.distributed.checkpoint import FileSystemReader

    from rl.checkpoint import store

    try:
        newest = store.newest_checkpoint(run_dir)
        keys = FileSystemReader(str(newest / store.TRAINER)).read_metadata().state_dict_metadata
    except (OSError, ValueError, RuntimeError):
        return False  # the ordinary resume says what is wrong
    return any(".lora_A." in key and ".lora_A.default." not in key for key in keys)


def train_tenants(
    config_paths: list[str], resume_dirs: list[Path], overrides: dict[str, str], interruptible: InterruptibleRun
) -> int:
    """Run every tenant to its end under `interruptible` (its Ctrl-C and SIGTERM); the exit code (0: every tenant
    finished, 1: one or more failed, 2: refused, 130: interrupted)."""
    from rl.checkpoint.resume import NothingToResume, resume_config, take_over
    from rl.checkpoint.run_dir import RunDirBusy
    from rl.loop.tenants import Tenants

    locks = []
    try:
        configs = [load_config(path, overrides) for path in config_paths]
        resumes: list[Path | None] = [None] * len(configs)
        for run_dir in resume_dirs:
            config, resume_from = resume_config(run_dir, overrides)
            locks.append(take_over(run_dir, resume_from))
            configs.append(config)
            resumes.append(resume_from)
        tenants = Tenants(configs, resumes)
    except (ConfigError, ValueError, NothingToResume, RunDirBusy) as exc:
        for lock in locks:
            lock.release()
        return fail(str(exc), 2)
    try:
        results = interruptible.run(tenants.run())
    except KeyboardInterrupt:
        return fail("interrupted; the tenants' actors stopped (resume each from its last checkpoint)", 130)
    except (OSError, RuntimeError, TimeoutError) as exc:  # the shared actors did not start
        return fail(f"the tenants stopped: {exc}", 1)
    finally:
        for lock in locks:
            lock.release()
    failed = 0
    for name, result in results.items():
        controller = tenants.controllers[name]
        if isinstance(result, BaseException):
            failed += 1
            why = "; ".join(controller.actor_failures) or repr(result)
            fail(f"tenant {name} stopped: {why}", 1)
        else:
            say(f"tenant {name} finished")
            print(json.dumps({"tenant": name, **result}, indent=2))
    return 1 if failed else 0
