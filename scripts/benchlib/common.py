"""What every part of the benchmark shares: paths, the dataset's tensors, logging."""

from __future__ import annotations

import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
VENV_PY = REPO / ".venv" / "bin" / "python"
TENSORS = ("id", "x", "emb", "label")
ROW_BYTES = 8 + 4 + 64 * 4 + 4  # tensor bytes per row
MB = 1e6


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)
