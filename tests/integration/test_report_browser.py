"""The comparison report as a person sees it: `report.html` rendered by a real headless
Chromium (skipped where none is installed; `.ci/run` installs it), its screenshot not blank,
the table's text and the figures' coloured lines on screen."""

import shutil
import subprocess

import pytest
from test_compare import training_rows, write_run

from pretrain.eval.compare import find_runs, write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def screenshot(page, out, width: int, height: int):
    """A PNG of `page` at width x height pixels, as an (height, width, channels) array."""
    import matplotlib.image

    subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--window-size={width},{height}",
            f"--screenshot={out}",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return matplotlib.image.imread(out)


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium)")
def test_the_report_renders_with_its_table_and_figures(tmp_path):
    for lr in (1e-4, 1e-3):
        write_run(tmp_path / "runs" / f"lr{lr}", lr, [training_rows(lr, range(8))])
    page, _ = write_report(find_runs([tmp_path / "runs"]), tmp_path / "report")
    top = screenshot(page, tmp_path / "top.png", 1200, 400)[..., :3]
    dark = (top.max(axis=-1) < 0.35).mean()  # text and table borders on a white page
    assert 0.002 < dark < 0.5, dark
    full = screenshot(page, tmp_path / "full.png", 1200, 3000)[..., :3]
    spread = full.max(axis=-1) - full.min(axis=-1)
    assert (spread > 0.3).mean() > 1e-4  # matplotlib's coloured lines: the figures drew
    assert full.std() > 0.05  # not blank
