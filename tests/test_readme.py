"""README's shell commands work as written: each ```bash block, run line by line in a fresh virtual environment on
a fresh copy of the repository (the files git tracks), as a new user runs them. The test command itself (tox) is
not run again from inside the suite it starts; the install lines people copy into a pipeline are checked to name a
source that exists (this repository: onnxmem is not on PyPI)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def shell_blocks(text: str, language: str = "bash") -> list[str]:
    """Give the body of every fenced block of `language` in a Markdown text."""
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def test_the_blocks_are_found() -> None:
    blocks = shell_blocks(README)
    assert any("onnxmem report" in b for b in blocks) and any("tox" in b for b in blocks)
    assert shell_blocks("x\n```bash\necho a\n```\n```python\nprint()\n```\n") == ["echo a\n"]


def test_every_install_line_names_a_source_that_exists() -> None:
    # `pip install onnxmem` or "onnxmem[plot]" would fetch from PyPI, where no onnxmem of ours is: every install of
    # onnxmem is from a path (., ./onnxmem, ".[extra]")
    for line in README.splitlines():
        for target in re.findall(r"pip install ((?:\"[^\"]*\"|\S)+)", line):
            target = target.strip('"')
            if "onnxmem" in target or target.startswith((".", "./")):
                assert target.startswith((".", "./")), line


def _tracked_copy(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, files):
        source = ROOT / os.fsdecode(name)
        if source.is_file():
            (dest / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / os.fsdecode(name))


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs the git checkout")
def test_the_shell_blocks_run_in_a_fresh_venv(tmp_path: Path) -> None:
    repo, env_dir = tmp_path / "onnxmem", tmp_path / "venv"
    repo.mkdir()
    _tracked_copy(repo)
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / ("Scripts" if sys.platform == "win32" else "bin")
    environment = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(env_dir)}
    environment.pop("PYTHONPATH", None)
    ran = 0
    for block in shell_blocks(README):
        for line in block.splitlines():
            if not line.strip() or line.lstrip().startswith("#") or "tox" in line:
                continue  # (the test command: this suite is what it runs)
            result = subprocess.run(["bash", "-c", line], cwd=repo, env=environment, capture_output=True, text=True,
                                    timeout=900)
            assert result.returncode == 0, f"{line}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
            ran += 1
    assert ran >= 2
    # the first command's answer is there: a report of the decoder at the bound dims
    check = subprocess.run(["onnxmem", "report", "fixtures/gpt_decoder.onnx", "--dim", "batch=8", "--dim", "seq=512"],
                           cwd=repo, env=environment, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0 and check.stdout.startswith("onnxmem report: fixtures/gpt_decoder.onnx")
