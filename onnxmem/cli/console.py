"""The `onnxmem` command's entry point: a SIGINT or SIGTERM while the command starts (its imports take about half
a second) ends it with one line and exit 130 or 143, never a traceback; then the CLI takes over (cli.run)."""

from __future__ import annotations

import gc
import os
import signal
import sys
from types import FrameType


def _early(signum: int, frame: FrameType | None) -> None:
    sys.stderr.write(f"onnxmem: {'interrupted' if signum == signal.SIGINT else 'terminated'}\n")
    sys.stderr.flush()
    os._exit(128 + signum)


def run() -> None:
    """The console command: the early handlers, then the CLI (which installs its own)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) != signal.SIG_IGN:  # (a background job of a shell ignores SIGINT: it still does)
            signal.signal(signum, _early)
    gc.disable()  # (as cli.main does for every command, here already for the imports: no cycles worth collecting)
    if sys.argv[1:2] != ["validate"]:
        # numpy (which onnx imports) starts OpenBLAS's thread pool as it loads, a tenth of a second of CPU that the
        # analysis never uses: it does no linear algebra. Validate is left as it is: it measures a runtime in this
        # process. A value the user set wins.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from onnxmem.cli.commands import run as cli_run

    cli_run()
