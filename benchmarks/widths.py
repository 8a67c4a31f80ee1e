"""What a person sees, measured: for report, fit and check (text at 80 columns, and the HTML page in a 1280-px
headless Chromium where one is installed), the widest line, whether the verdict is in the first 3 lines, and the
page's width.

Models: fixtures (gpt_decoder, transformer_encoder, unet), a model with dynamo-length names (200+ characters, as
tests/test_cli_output builds it), a ResNet-50 exported by torch's dynamo exporter (torchvision through
../shared/tools/tvshim.py; left out with --no-torch), and a 100k-node Llama-like decoder (benchmarks/llm_graphs
'deep', weights absent). Every command runs as a whole `onnxmem` process with COLUMNS=80 and stdout a pipe, as a
CI log sees it.

    python benchmarks/widths.py [--no-torch] [--before CHECKOUT]

--before CHECKOUT: the same table for another checkout's onnxmem (its source folder put first on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.llm_graphs import SHAPES, make_llama  # noqa: E402
from benchmarks.tables import markdown_table  # noqa: E402
from tests.test_cli_output import long_names  # noqa: E402
from tests.test_html_browser import _MEASURE  # noqa: E402

BROWSER = next((found for name in ("chromium", "chromium-browser", "google-chrome") if (found := shutil.which(name))),
               None)
# the answer each command's first lines must hold
VERDICT = {"report": re.compile(r"^(total|training step) peak "),
           "fit": re.compile(r"^(largest|nothing fits|every|fewest)"),
           "check": re.compile(r"^(FITS|DOES NOT FIT): needs ")}
# the arithmetic under it (check and fit: needs = peak + rounding, budget = memory - fixed costs)
ARITHMETIC = {"report": re.compile(r"^  = "), "fit": re.compile(r"^  needs .* = peak"),
              "check": re.compile(r"^  needs .* = peak")}


def models(folder: Path, torch: bool) -> list[tuple[str, Path, dict[str, str]]]:
    """Give (name, path, the --dim values) of every model measured, built in `folder`."""
    found = [("gpt_decoder", ROOT / "fixtures" / "gpt_decoder.onnx", {"batch": "32", "seq": "512"}),
             ("transformer_encoder", ROOT / "fixtures" / "transformer_encoder.onnx", {}),
             ("unet", ROOT / "fixtures" / "unet.onnx", {})]
    long = folder / "long_names.onnx"
    onnx.save(long_names(6), long)
    found.append(("long names (200+ chars)", long, {"batch": "8"}))
    if torch:
        found.append(("resnet50 (dynamo export)", resnet50(folder / "resnet50.onnx"), {"batch": "32"}))
    deep = folder / "deep.onnx"
    onnx.save(make_llama(SHAPES["deep"]), deep)
    found.append((f"llama deep ({len(onnx.load(deep, load_external_data=False).graph.node):,} nodes)", deep,
                  {"batch": "1", "seq": "16", "past": "16"}))
    return found


def resnet50(path: Path) -> Path:
    """Export torchvision's ResNet-50 (random weights) with torch's dynamo exporter, batch dynamic."""
    from benchmarks.zoo import import_torchvision

    torchvision = import_torchvision()
    import torch

    torch.manual_seed(0)
    model = torchvision.models.resnet50().eval()
    with torch.no_grad(), contextlib.redirect_stdout(sys.stderr):  # (the exporter's progress: not the table)
        torch.onnx.export(model, (torch.randn(2, 3, 224, 224),), str(path), dynamo=True, external_data=False,
                          input_names=["pixel_values"], dynamic_shapes=({0: torch.export.Dim("batch", min=1,
                                                                                              max=4096)},))
    return path


def dim_args(dims: dict[str, str]) -> list[str]:
    """Give the --dim options of `dims` (none: --default-dim 1)."""
    return [a for k, v in dims.items() for a in ("--dim", f"{k}={v}")] or ["--default-dim", "1"]


def commands(model: Path, dims: dict[str, str]) -> dict[str, list[str]]:
    """Give the command lines measured: a report, a fit of the batch on an A100-80GB, a check against 16 GiB."""
    others = {k: v for k, v in dims.items() if k != "batch"}
    return {"report": ["report", str(model), *dim_args(dims)],
            "fit": ["fit", str(model), *dim_args(others), "--gpu", "A100-80GB", "--runtime", "onnxruntime",
                    "--no-what-if"],
            "check": ["check", str(model), *dim_args(dims), "--budget", "16GiB", "--runtime", "onnxruntime"]}


def onnxmem(args: list[str], source: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(source)}
    return subprocess.run([sys.executable, "-m", "onnxmem.cli.commands", *args], capture_output=True, text=True,
                          env=env, cwd=source, timeout=900, check=False)


def page_width(page: str, folder: Path) -> str:
    """Give the HTML page's width in a 1280-px window (document.scrollWidth), or why it was not measured."""
    if BROWSER is None:
        return "no chromium"
    measured = folder / "page.html"
    measured.write_text(page.replace("</body>", _MEASURE + "</body>"))
    done = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--window-size=1280,900", "--virtual-time-budget=5000", "--dump-dom", measured.as_uri()],
                          capture_output=True, text=True, timeout=300, check=False)
    found = re.search(r'<pre id="measured">(.*?)</pre>', done.stdout, re.S)
    if not found:
        return "not measured"
    result = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    return (f"{result['scrollWidth']} px" + (f", {len(result['scrolled'])} scrolled inside" if result["scrolled"]
                                              else "")
            + (f", {len(result['overlaps'])} overlaps" if result["overlaps"] else ""))


def measure(source: Path, torch: bool) -> list[list[str]]:
    rows = []
    with tempfile.TemporaryDirectory() as temp:
        folder = Path(temp)
        for name, model, dims in models(folder, torch):
            for command, args in commands(model, dims).items():
                done = onnxmem(args, source)
                if done.returncode not in (0, 1):
                    rows.append([name, command, "error", "", "", "", done.stderr.strip()[-60:]])
                    continue
                lines = done.stdout.splitlines()
                widest = max((len(line) for line in lines), default=0)
                verdict = next((i + 1 for i, line in enumerate(lines[:3]) if VERDICT[command].search(line)), None)
                sums = any(ARITHMETIC[command].search(line) for line in lines[:6])
                html = onnxmem([*args, "--format", "html"], source)
                rows.append([name, command, str(widest), str(sum(len(line) > 80 for line in lines)),
                             f"line {verdict}" if verdict else "no", "yes" if sums else "no",
                             page_width(html.stdout, folder) if html.returncode in (0, 1) else "error"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-torch", action="store_true", help="leave out the ResNet-50 (needs torch, torchvision)")
    parser.add_argument("--before", type=Path, default=None, help="another checkout to measure the same way")
    options = parser.parse_args()
    headers = ["model", "command", "widest line (80 cols)", "lines > 80", "verdict in first 3",
               "its arithmetic", "HTML at 1280 px"]
    for label, source in (("before", options.before), ("this checkout", ROOT)):
        if source is None:
            continue
        print(f"\n{label}: {source}\n")
        print(markdown_table(headers, measure(source.resolve(), not options.no_torch)))


if __name__ == "__main__":
    main()
