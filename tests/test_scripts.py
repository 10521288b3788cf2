"""The task entry points (scripts/task.sh, scripts/plain.sh, pixi.toml, .ci/run, scripts/compile-check.sh) and the
repository's self-containment. Fast: nothing is built or installed; commands that would run Python run a stand-in
interpreter that records its working directory and arguments."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None or not (ROOT / "scripts" / "task.sh").is_file(),
                                reason="needs bash and the source checkout")


def run(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([BASH, *args], cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=60)


def task_names() -> list[str]:
    result = run("scripts/task.sh", "--list")
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def pixi_tasks() -> dict[str, dict]:
    pixi = tomllib.loads((ROOT / "pixi.toml").read_text())
    tasks = dict(pixi["tasks"])
    for feature in pixi.get("feature", {}).values():
        tasks.update(feature.get("tasks", {}))
    return {name: {"cmd": task} if isinstance(task, str) else task for name, task in tasks.items()}


def test_every_pixi_task_goes_through_the_task_entry():
    names = task_names()
    tasks = pixi_tasks()
    assert {"build", "test", "demo", "bench", "conda-build", "build-aiter", "compile-check"} <= set(names)
    for name, task in tasks.items():
        assert shlex.split(task["cmd"]) == ["bash", "scripts/task.sh", name], (name, task["cmd"])
        for dependency in task.get("depends-on", []):
            assert dependency in tasks, f"pixi task {name!r} depends on unknown task {dependency!r}"
    assert set(tasks) == set(names), "pixi.toml and scripts/task.sh list different tasks"


def test_ci_runs_the_readme_test_command_then_the_compile_checks():
    readme = (ROOT / "README.md").read_text()
    assert "bash scripts/plain.sh test" in readme
    commands = [shlex.split(line) for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.startswith("bash ")]
    assert commands == [["bash", "scripts/plain.sh", "test"], ["bash", "scripts/plain.sh", "compile-check", "all"]]
    assert {command[2] for command in commands} <= set(task_names())
    # The suite's two other paths: every op forced to its reference, and the oldest jax the package accepts.
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r'^JAX_AITER_BACKEND=xla PYTHON="\$PWD/\.venv/bin/python" bash scripts/task\.sh test$', ci, re.M)
    assert re.search(r'^"\$oldest/bin/python" -m pip install -q "\$JA_WHEEL\[test\]" "jax==\$floor"', ci, re.M)
    assert re.search(r'^PYTHON="\$PWD/\$oldest/bin/python" bash scripts/task\.sh test$', ci, re.M)


def test_plain_without_a_task_prints_usage_and_fails():
    venv_before = (ROOT / ".venv").exists()
    result = run("scripts/plain.sh")
    assert result.returncode != 0
    assert "usage: scripts/plain.sh <task>" in result.stderr
    assert "compile-check" in result.stderr  # the task list comes from scripts/task.sh
    assert (ROOT / ".venv").exists() == venv_before


def test_plain_rejects_an_unknown_task_before_making_the_venv():
    venv_before = (ROOT / ".venv").exists()
    result = run("scripts/plain.sh", "no-such-task")
    assert result.returncode == 2
    assert "unknown task 'no-such-task'" in result.stderr
    assert (ROOT / ".venv").exists() == venv_before


def test_task_entry_rejects_an_unknown_task():
    result = run("scripts/task.sh", "no-such-task")
    assert result.returncode == 2
    assert "unknown task 'no-such-task'" in result.stderr
    assert run("scripts/task.sh").returncode != 0
    assert run("scripts/task.sh", "--needs-package", "no-such-task").returncode == 2


def test_tasks_that_run_jax_aiter_need_the_installed_package():
    needs = {name: run("scripts/task.sh", "--needs-package", name).returncode for name in task_names()}
    assert set(needs.values()) <= {0, 1}
    assert {name for name, code in needs.items() if code == 0} >= {"test", "demo", "info", "bench"}
    assert needs["compile-check"] == 1


@pytest.fixture
def fake_python(tmp_path) -> tuple[Path, Path]:
    """An executable that records (working directory, arguments) per call and succeeds."""
    log = tmp_path / "calls.log"
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text('#!/bin/sh\n{ printf "cwd=%s\\n" "$PWD"; for a in "$@"; do printf "arg=%s\\n" "$a"; done;'
                      f' echo end; }} >> "{log}"\n')
    python.chmod(0o755)
    return python, log


def calls(log: Path) -> list[tuple[Path, list[str]]]:
    out = []
    for record in log.read_text().split("end\n")[:-1]:
        lines = record.splitlines()
        out.append((Path(lines[0].removeprefix("cwd=")), [line.removeprefix("arg=") for line in lines[1:]]))
    return out


def _inside_tree(path: Path) -> bool:
    return path.resolve().is_relative_to(ROOT.resolve())


@pytest.mark.parametrize("task", ["demo", "info"])
def test_commands_run_the_installed_package_from_outside_the_tree(task, fake_python, tmp_path):
    python, log = fake_python
    result = run("scripts/task.sh", task, "--steps", "3", env={"PYTHON": str(python), "TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    (check_cwd, check_args), (cwd, args) = calls(log)
    assert check_args == ["-c", "import jax_aiter"]
    assert args == ["-m", "jax_aiter.cli", task, "--steps", "3"]
    assert not _inside_tree(cwd) and not _inside_tree(check_cwd)
    assert not (cwd / "jax_aiter").exists()


def test_tests_start_in_tests_and_bench_runs_the_installed_cli(fake_python, tmp_path):
    python, log = fake_python
    env = {"PYTHON": str(python), "TMPDIR": str(tmp_path)}
    assert run("scripts/task.sh", "test", "-k", "mxfp4", env=env).returncode == 0
    assert run("scripts/task.sh", "bench", "--quick", env=env).returncode == 0
    assert run("scripts/task.sh", "build", env=env).returncode == 0
    (test_cwd, test_args), (_, check_args), (bench_cwd, bench_args), (build_cwd, build_args) = calls(log)
    # From tests/, `import jax_aiter` finds the installed package, not the source tree's jax_aiter/.
    assert test_cwd == ROOT / "tests" and not (test_cwd / "jax_aiter").exists()
    assert test_args[:2] == ["-m", "pytest"] and "-k" in test_args and "mxfp4" in test_args
    # jax-aiter bench of the installed package, started outside the tree, writing into the repository's bench-out/.
    assert check_args == ["-c", "import jax_aiter"]
    assert bench_args == ["-m", "jax_aiter.cli", "bench", "--out", str(ROOT / "bench-out"), "--quick"]
    assert not _inside_tree(bench_cwd)
    assert build_args == ["-m", "pip", "install", "--no-build-isolation", "--no-deps", "."] and build_cwd == ROOT


def test_compile_check_rejects_an_unknown_mode():
    for args in (["bogus"], ["hip", "extra"]):
        result = run("scripts/compile-check.sh", *args)
        assert result.returncode == 2
        assert "usage: scripts/compile-check.sh [cuda|hip|aiter|all]" in result.stderr
    # Through the task entry, arguments pass through to the script.
    assert run("scripts/task.sh", "compile-check", "bogus").returncode == 2


def test_compile_check_covers_the_gpu_sources_and_the_aiter_bridge():
    script = (ROOT / "scripts" / "compile-check.sh").read_text()
    assert "csrc/gpu/*.cu" in script
    sources = re.findall(r"csrc/aiter/\w+\.cc", script)
    assert sources
    for source in sources:
        assert (ROOT / source).is_file(), source


def test_nothing_points_outside_the_repository():
    if shutil.which("git") is None or subprocess.run(["git", "-C", str(ROOT), "rev-parse"],
                                                     capture_output=True).returncode != 0:
        pytest.skip("needs git and a git checkout")
    result = subprocess.run(["git", "-C", str(ROOT), "grep", "-n", r"\.\./shared"], capture_output=True,
                            text=True)
    assert result.returncode == 1 and result.stdout == "", f"references outside the repository:\n{result.stdout}"
