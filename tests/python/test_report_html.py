"""The self-contained HTML report renders in a real headless browser (chromium): the charts are
drawn (non-empty SVG) and the page raises no script errors."""

import json
import shutil
import subprocess

import pytest

from tilelab import sim

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# Runs in the page after load: counts drawn SVG shapes per chart and records script errors.
PROBE = """
<script>
window.__errors = [];
window.addEventListener('error', e => window.__errors.push(String(e.message)));
window.addEventListener('load', () => {
  const charts = Array.from(document.querySelectorAll('svg')).map(svg => {
    const box = svg.getBoundingClientRect();
    return {width: box.width, height: box.height,
            shapes: svg.querySelectorAll('rect, path, polyline, polygon, line, circle').length};
  });
  const result = {charts, errors: window.__errors, title: document.title};
  document.body.insertAdjacentHTML('beforeend',
    '<pre id="probe-result">' + JSON.stringify(result) + '</pre>');
});
</script>
"""


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-packages.txt)")
def test_html_report_renders_in_chromium(tmp_path):
    report = sim.simulate_paged_attention_batch(
        prefill=[(128, 2048)], decode=[1024], num_heads=4, num_kv_heads=2
    )
    baseline = sim.simulate_paged_attention_batch(
        prefill=[(128, 2048)], decode=[1024], num_heads=4, num_kv_heads=2, tiling_factor=1
    )
    page = tmp_path / "report.html"
    report.save_html(page, compare={"tiling_factor=1": baseline})
    html = page.read_text()
    assert "<script" not in html.lower() and "http://" not in html and "https://" not in html
    probed = tmp_path / "probed.html"
    probed.write_text(html.replace("</head>", PROBE + "</head>", 1))
    result = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--virtual-time-budget=5000", "--dump-dom", probed.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    )
    dom = result.stdout
    marker = "<pre id=\"probe-result\">"
    start = dom.rindex(marker) + len(marker)  # the last: the script text contains it too
    probe = json.loads(dom[start : dom.index("</pre>", start)].replace("&quot;", '"'))
    assert probe["errors"] == []
    assert len(probe["charts"]) >= 4
    for chart in probe["charts"]:
        assert chart["width"] > 0 and chart["height"] > 0
        assert chart["shapes"] > 0, f"an empty chart: {chart}"
