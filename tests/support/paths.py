"""Where the tests find the repository, the shipped configs and the end-to-end tests' own configs."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"  # the configs users run
E2E_CONFIGS = REPO / "tests" / "e2e" / "configs"  # the tiny-model configs the tests run
TINY = E2E_CONFIGS / "tiny_qwen3_e2e.toml"
