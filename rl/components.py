"""Name → object resolution for tasks and reward functions chosen in config.

A config names a component either by a short registered name ("sum_digits") or by an
import path ("my_package.my_module:MyTask"), so a user's own package plugs in without
editing rlmesh.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from typing import Any

TASKS: dict[str, str] = {
    "sum_digits": "tasks.sum_digits:SumDigitsTask",
    "reverse_text": "tasks.reverse_text:ReverseTextTask",
    "arithmetic_retry": "tasks.arithmetic_retry:ArithmeticRetryTask",
    "calculator_tool": "tasks.calculator_tool:CalculatorToolTask",
    "alphabet_sort": "tasks.alphabet_sort:AlphabetSortTask",
    "reasoning_gym": "tasks.reasoning_gym:ReasoningGymTask",
    "verifiers": "tasks.verifiers_env:VerifiersTask",
    "openenv": "tasks.openenv_env:OpenEnvTask",
    "agent": "tasks.agent:AgentTask",
}

REWARD_FNS: dict[str, str] = {
    "digit_sum_correct": "tasks.sum_digits:digit_sum_correct",
    "answer_is_number": "tasks.sum_digits:answer_is_number",
    **{
        name: f"rubrics.builtins:{name}"
        for name in (
            "exact_match",
            "numeric_match",
            "math_verify",
            "answer_tag_format",
            "boxed_format",
            "length_penalty",
            "env_reward",
            "diversity_bonus",
        )
    },
    "judge": "rubrics.judge:judge",
}


def import_object(path: str) -> Any:
    """Import `package.module:attr` (or `package.module.attr`)."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"{path!r} is not an import path of the form 'package.module:Name'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        top = module_name.partition(".")[0]
        if exc.name != top:  # the package imports, something inside it does not
            raise ValueError(f"cannot import module {module_name!r} for {path!r}: {exc}") from exc
        searched = [entry or os.getcwd() for entry in sys.path if os.path.isdir(entry or ".")]
        raise ValueError(
            f"cannot import {path!r}: no package or module {top!r} on the import path, which holds the directory "
            f"rlmesh was started from ({os.getcwd()}) and PYTHONPATH; searched: {', '.join(searched[:6])}"
            f"{' ...' if len(searched) > 6 else ''}. A task package beside the config is found when rlmesh starts "
            f"in the directory holding {top}/ (cd there) or with that directory on PYTHONPATH"
        ) from exc
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} for {path!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise ValueError(f"module {module_name!r} has no attribute {attr!r}") from exc


def resolve(name_or_path: str, registry: dict[str, str], kind: str) -> Any:
    """A registered name or an import path → the object it names."""
    if name_or_path in registry:
        return import_object(registry[name_or_path])
    if ":" in name_or_path or "." in name_or_path:
        return import_object(name_or_path)
    close = difflib.get_close_matches(name_or_path, registry, n=1)
    raise ValueError(
        f"unknown {kind} {name_or_path!r}{f'; did you mean {close[0]!r}?' if close else ''}: registered {kind}s are "
        f"{sorted(registry)}, or give 'package.module:Name'"
    )


def fn_name(fn: Any) -> str:
    """A callable's name; a `functools.partial` is named after the function it wraps."""
    fn = getattr(fn, "func", fn)
    return getattr(fn, "__name__", type(fn).__name__)
