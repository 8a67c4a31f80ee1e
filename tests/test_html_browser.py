"""The HTML pages in a real browser (headless Chromium, Debian's `chromium` package): at 1280 px wide nothing
overflows sideways and no two labels of a chart overlap; a screenshot of each page is taken. Skipped, with the
reason, where no Chromium is installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from onnx import TensorProto

import onnxmem
from benchmarks.llm_graphs import SHAPES, make_llama
from onnxmem.training.step import TrainingOptions
from onnxmem.views.html import check_page, fit_page, report_page
from onnxmem.views.series import series_of

from . import graphs
from .test_cli_output import long_names

_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = next((found for name in _BROWSERS if (found := shutil.which(name))), None)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium to render the pages in (Debian: apt-get "
                                                         "install chromium)")
WINDOW = 1280

# Measures the page once it is laid out, and writes what it found into the DOM that --dump-dom prints: the page's
# width against the window's, the elements that scroll sideways inside it, and every pair of texts of one chart
# whose boxes overlap.
_MEASURE = """<script>
window.addEventListener('load', () => {
  const overlaps = [];
  for (const svg of document.querySelectorAll('svg')) {
    const boxes = [...svg.querySelectorAll('text')].filter(t => t.textContent.trim())
      .map(t => [t.textContent, t.getBoundingClientRect()]);
    for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
      const [a, p] = boxes[i], [b, q] = boxes[j];
      const dx = Math.min(p.right, q.right) - Math.max(p.left, q.left);
      const dy = Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top);
      if (dx > 1 && dy > 1) overlaps.push([a, b]);
    }
  }
  const scrolled = [...document.body.querySelectorAll('*')].filter(e => e.scrollWidth > e.clientWidth + 1
    && ['auto', 'scroll'].includes(getComputedStyle(e).overflowX)).map(e => e.tagName);
  const out = document.createElement('pre');
  out.id = 'measured';
  out.textContent = JSON.stringify({scrollWidth: document.documentElement.scrollWidth,
                                    innerWidth: window.innerWidth, overlaps, scrolled});
  document.body.appendChild(out);
});
</script>"""


def _browser(*args: str) -> subprocess.CompletedProcess[str]:
    assert BROWSER is not None
    return subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--no-first-run", f"--window-size={WINDOW},900", *args],
                          capture_output=True, text=True, timeout=120, check=False)


def measure(page: str, folder: Path, name: str) -> dict[str, object]:
    """Give what the browser measured of `page` at 1280 px (scrollWidth, innerWidth, overlaps), and take its
    screenshot (folder/name.png)."""
    measured = folder / f"{name}.measured.html"
    measured.write_text(page.replace("</body>", _MEASURE + "</body>"))
    plain, shot = folder / f"{name}.html", folder / f"{name}.png"
    plain.write_text(page)
    _browser(f"--screenshot={shot}", plain.as_uri())
    assert shot.exists() and shot.stat().st_size > 1000, "no screenshot"
    done = _browser("--virtual-time-budget=5000", "--dump-dom", measured.as_uri())
    found = re.search(r'<pre id="measured">(.*?)</pre>', done.stdout, re.S)
    assert found, done.stderr[-2000:]
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def _report() -> str:
    report = onnxmem.analyze(long_names(6), {"batch": 4})
    return report_page(report, series_of(report))


def _training() -> str:
    report = onnxmem.analyze(make_llama(SHAPES["tiny"], TensorProto.FLOAT), {"batch": 2, "seq": 16, "past": 1},
                             training=TrainingOptions())
    return report_page(report, series_of(report))


def _fit() -> str:
    result = onnxmem.fit(make_llama(SHAPES["tiny"], TensorProto.FLOAT), memory="40MiB", search="seq",
                         dims={"batch": 2, "past": 1}, runtime="onnxruntime", reserve="0B")
    assert result.report is not None
    return fit_page(result, series_of(result.report))


def _check() -> str:
    gate = onnxmem.check(graphs.symbolic_mlp(), {"batch": 8}, memory="700KiB")
    assert gate.report is not None
    return check_page(gate, series_of(gate.report))


def _check_far_under_budget() -> str:
    # a peak of 264 KiB against 15 GiB: the peak's label sits on the weights' at the foot of the chart
    gate = onnxmem.check(str(Path(__file__).parent.parent / "fixtures" / "transformer_encoder.onnx"), default_dim=1,
                         memory="16GiB", runtime="onnxruntime")
    assert gate.report is not None
    return check_page(gate, series_of(gate.report))


@pytest.mark.parametrize("name, make", [("report", _report), ("training", _training), ("fit", _fit),
                                        ("check", _check), ("check-far-under", _check_far_under_budget)])
def test_the_page_fits_1280_px_and_no_labels_overlap(tmp_path: Path, name: str, make: Callable[[], str]) -> None:
    found = measure(make(), tmp_path, name)
    assert found["innerWidth"] == WINDOW
    assert found["scrollWidth"] <= WINDOW, f"the page overflows sideways: {found['scrollWidth']} px"
    assert found["scrolled"] == [], f"these scroll sideways: {found['scrolled']}"
    assert found["overlaps"] == [], f"labels overlap: {found['overlaps']}"


def test_an_overflowing_page_is_caught(tmp_path: Path) -> None:
    # the measure itself: a page wider than the window is seen as such
    page = ("<!DOCTYPE html><html><body><div style='width:2000px'>wide</div><pre style='overflow-x:auto'>"
            + "x" * 400 + "</pre></body></html>")
    found = measure(page, tmp_path, "wide")
    assert isinstance(found["scrollWidth"], int) and found["scrollWidth"] > WINDOW
    assert found["scrolled"] == ["PRE"]  # a block with its own sideways scrollbar (the old page's text)
