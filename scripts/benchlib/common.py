"""What every part of the benchmark shares: paths, the dataset's tensors, logging, and the
side interpreters some peers run in (probed, made, installed into)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
VENV_PY = REPO / ".venv" / "bin" / "python"
TENSORS = ("id", "x", "emb", "label")
ROW_BYTES = 8 + 4 + 64 * 4 + 4  # tensor bytes per row
MB = 1e6


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def probe(python: Path, code: str) -> str | None:
    """None if PYTHON runs CODE, else the error's last line."""
    r = subprocess.run(
        [str(python), "-W", "ignore", "-c", code],
        capture_output=True, text=True, timeout=300,
    )
    if r.returncode == 0:
        return None
    lines = [x for x in (r.stderr or r.stdout).strip().splitlines() if x.strip()]
    return lines[-1] if lines else f"exit {r.returncode}"


def pip_install(python: Path, *pkgs) -> str | None:
    r = subprocess.run([str(python), "-m", "pip", "install", "-q", *pkgs], capture_output=True, text=True)
    if r.returncode != 0:
        lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
        return lines[-1] if lines else f"pip exit {r.returncode}"
    return None


def make_venv(venv: Path) -> str | None:
    """Creates the virtual environment VENV with this interpreter, unless it has a python: None,
    else why it could not."""
    if (venv / "bin" / "python").exists():
        return None
    r = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
    return None if r.returncode == 0 else r.stderr.strip()[-200:]
