"""The torchvision shim the tests that import transformers need: the PyPI torchvision wheel, which transformers
imports, does not load on the CPU build of torch without shared/tools/tvshim.py (beside the repository or at
/work/shared/tools). Where it is not found, nothing is done: the tests then skip on transformers' import."""

from __future__ import annotations

import sys
from pathlib import Path


def load_tvshim() -> None:
    """Import shared/tools/tvshim.py once, where it is found."""
    found = next((d for d in (Path(__file__).resolve().parents[2] / "shared" / "tools", Path("/work/shared/tools"))
                  if (d / "tvshim.py").is_file()), None)
    if found is not None and "tvshim" not in sys.modules:
        sys.path.insert(0, str(found))
        __import__("tvshim")
