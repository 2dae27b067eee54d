"""`rlmesh new-task` writes a package whose own test passes, and whose config validates."""

import os
import shlex
import subprocess
import sys

from rl.cli import main
from tests.support.paths import REPO


def test_generated_package_passes_its_own_test_and_validates(tmp_path, capsys):
    assert main(["new-task", "word_math", "--dir", str(tmp_path)]) == 0
    package = tmp_path / "word_math"
    assert sorted(p.name for p in package.iterdir()) == ["__init__.py", "config.toml", "task.py", "test_task.py"]
    printed = capsys.readouterr().out.split("run its test with: ")[1].strip()
    assert printed == f"{sys.executable} -m pytest {package}/test_task.py"  # this interpreter: works outside the venv
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    result = subprocess.run(
        [*shlex.split(printed), "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "6 passed" in result.stdout
    validated = subprocess.run(
        [sys.executable, "-m", "rl.cli", "validate", "--config", str(package / "config.toml")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert validated.returncode == 0, validated.stderr
    assert 'name = "word_math.task:WordMathTask"' in validated.stdout
    assert "warning" not in validated.stderr  # the resolved precision pair is one known to learn
    assert "lr = 2e-05" in validated.stdout


def test_bad_names_and_existing_folders_are_refused(tmp_path, capsys):
    assert main(["new-task", "Word-Math", "--dir", str(tmp_path)]) == 2
    assert "lower-case Python identifier" in capsys.readouterr().err
    (tmp_path / "taken").mkdir()
    assert main(["new-task", "taken", "--dir", str(tmp_path)]) == 2
    assert "already exists" in capsys.readouterr().err
