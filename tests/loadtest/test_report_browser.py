"""The report pages in a real browser: headless Chromium lays each page out and paints it; every chart must
have drawn (its area not blank, its series' colours on screen) where the page says it is.

Two runs of Chromium per page: one dumps the DOM of a copy with a probe script that writes each chart's box
into the body (the page itself has no script), one takes a screenshot of the page as shipped, cut per box.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from loadtest import charts, html
from loadtest.compare import compare_rows
from tests.loadtest.report_docs import run_doc, sweep_doc

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not Path("/usr/bin/chromium").exists(),
        reason="headless Chromium is not installed (/usr/bin/chromium): apt-get install -y chromium",
    ),
]

WIDTH = 1280
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
]
PROBE = """<script>
const boxes = [...document.querySelectorAll("figure")].map(f => {
  const r = f.querySelector("svg").getBoundingClientRect();
  return [f.id, r.left + scrollX, r.top + scrollY, r.width, r.height, f.querySelectorAll("svg path").length];
});
document.body.dataset.boxes = JSON.stringify(boxes);
document.body.dataset.height = document.documentElement.scrollHeight;
</script>"""


def chromium(tmp: Path, *args: str) -> str:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    done = subprocess.run(
        ["/usr/bin/chromium", *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def painted(page: str, tmp: Path) -> tuple[Image.Image, dict[str, tuple[int, int, int, int, int]]]:
    """The page's screenshot and each chart's (x, y, w, h, paths) as Chromium laid it out."""
    src = tmp / "page.html"
    src.write_text(page, encoding="utf-8")
    probe = tmp / "probe.html"
    probe.write_text(page.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    dom = chromium(tmp, f"--window-size={WIDTH},1000", "--dump-dom", probe.as_uri())
    body = re.search(r"<body[^>]*>", dom)
    assert body, dom[:500]
    attrs = dict(re.findall(r'data-(boxes|height)="([^"]*)"', body.group(0)))
    boxes = json.loads(attrs["boxes"].replace("&quot;", '"'))
    height = int(attrs["height"])
    shot = tmp / "shot.png"
    chromium(tmp, f"--window-size={WIDTH},{height}", f"--screenshot={shot}", src.as_uri())
    image = Image.open(shot).convert("RGB")
    assert image.size == (WIDTH, height)
    return image, {b[0]: tuple(round(v) for v in b[1:]) for b in boxes}  # type: ignore[misc]


def _rgb(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def _colours(image: Image.Image) -> list[tuple[int, tuple[int, int, int]]]:
    found = image.getcolors(image.width * image.height)
    assert found is not None
    return found


def ink(image: Image.Image) -> float:
    """Share of pixels that are not (near) white."""
    return sum(n for n, p in _colours(image) if min(p) < 235) / (image.width * image.height)


def has_colour(image: Image.Image, color: str, at_least: int = 15) -> bool:
    r, g, b = _rgb(color)
    near = sum(n for n, p in _colours(image) if abs(p[0] - r) + abs(p[1] - g) + abs(p[2] - b) < 40)
    return near >= at_least


# The colours each chart paints its series in (loadtest/charts.py).
SERIES = {
    "chart-requests": (charts.OFFERED, charts.COMPLETED, charts.REFUSED[0], charts.REFUSED[1]),
    "chart-latency": (charts.P99, charts.SLO),
    "chart-speech": (charts.P99, charts.SLO),
    "chart-engines": ("#6a3d9a", charts.COMPLETED, charts.REFUSED[0]),
    "chart-slo-bucket": (charts.COMPLETED, charts.OFFERED),
    "chart-slo-tenant": (charts.COMPLETED, charts.OFFERED),
    "chart-slo-priority": (charts.COMPLETED, charts.OFFERED),
    "chart-slo-class": (charts.COMPLETED, charts.OFFERED),
    "chart-sweep": (charts.OFFERED, charts.P99, charts.SLO, charts.COMPLETED, charts.REFUSED[0]),
}


def check_drawn(image: Image.Image, box: tuple[int, int, int, int, int], key: str) -> None:
    x, y, w, h, paths = box
    assert w > 600 and h > 150 and paths > 20, (key, box)  # laid out at its size, with its marks
    area = image.crop((x, y, x + w, y + h))
    assert ink(area) > 0.02, (key, ink(area))
    missing = [c for c in SERIES[key] if not has_colour(area, c)]
    assert missing == [], (key, missing)


def test_every_chart_of_a_run_report_draws_in_chromium(tmp_path: Path) -> None:
    image, boxes = painted(html.render(run_doc()), tmp_path)
    assert list(boxes) == [f"chart-{c.key}" for c in charts.run_charts(run_doc())]
    assert len(boxes) == 8
    for key, box in boxes.items():
        check_drawn(image, box, key)
    tables = image.crop((0, 0, WIDTH, min(boxes.values(), key=lambda b: b[1])[1]))
    assert ink(tables) > 0.02  # the tables above the charts painted too


def test_compare_draws_a_and_b_side_by_side_in_chromium(tmp_path: Path) -> None:
    a, b = run_doc(name="before"), run_doc(slow=3.0, name="after")
    image, boxes = painted(html.render_compare(a, b, [("", compare_rows(a, b))], ("a", "b")), tmp_path)
    x, y, w, h, _ = boxes["chart-latency"]
    for half in (image.crop((x, y, x + w // 2, y + h)), image.crop((x + w // 2, y, x + w, y + h))):
        assert ink(half) > 0.02 and has_colour(half, charts.P99) and has_colour(half, charts.SLO)
    for key, box in boxes.items():
        check_drawn(image, box, key)


def test_a_sweep_report_draws_its_curve_the_slo_and_the_pick_in_chromium(tmp_path: Path) -> None:
    image, boxes = painted(html.render(sweep_doc()), tmp_path)
    assert next(iter(boxes)) == "chart-sweep"
    for key, box in boxes.items():
        check_drawn(image, box, key)
