"""`hinabench report`: the static HTML report, checked as files and in a real browser (headless
Chromium driven by Playwright: no console errors, every figure image loaded, the table filters and
sorts, a screenshot kept under pytest's tmp dir)."""
import contextlib
import functools
import http.server
import json
import re
import shutil
import threading
from pathlib import Path

import pytest

from clihelp import invoke
from synthetic import row, two_machines, write_csv

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "") if p and Path(p).exists()), None)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Two machines: a CPU box (fig10's rows, fig15's interleaved rows, torch-cuda unsupported) and a
    GPU host (CPU and torch-cuda rows: its fig1 can be drawn); statuses ok, wrong, unsupported, timeout."""
    root = tmp_path_factory.mktemp("report")
    a, b = two_machines(root / "results")
    write_csv(a / "fig15.csv", [row(x, 1, numa="interleave", remote_fraction_model=0.0,
                                    remote_fraction_basis="modeled: 1 node") for x in ("torch", "hina:avx2")])
    write_csv(a / "cuda.csv", [row("torch-cuda", 1, "unsupported", reason="no CUDA device: torch 2.13.0+cpu is built without CUDA")])
    write_csv(b / "cuda.csv", [row("torch-cuda", t, machine="intel-spr-112t-2n", median_ms=0.4 + 0.01 * t,
                                   versions=json.dumps({"device": "NVIDIA H200 [synthetic]"})) for t in (1, 8)])
    out = root / "site"
    r = invoke("report", str(root / "results" / "*"), "--out", str(out))
    assert r.exit_code == 0, r.output
    return out, r.output


def test_report_writes_an_index_and_a_page_per_figure_with_machines_side_by_side(site):
    out, output = site
    for page in ("index.html", "fig1.html", "fig10.html", "fig15.html", "rows.html"):
        assert (out / page).is_file(), page
    index = (out / "index.html").read_text()
    assert "amd-f25m1-2t-1n" in index and "intel-spr-112t-2n" in index
    assert "Intel Xeon (Sapphire Rapids)" in index                       # fingerprints
    # a figure that cannot be drawn is listed with its reason, never dropped
    assert re.search(r"amd-f25m1-2t-1n: <b>not drawn</b> — fig1 .*no ok rows of the CUDA backend", index)
    assert re.search(r"intel-spr-112t-2n: <b>not drawn</b> — no rows with --numa interleave", index)
    assert "fig15 [intel-spr-112t-2n]: not drawn" in output and "fig1 [intel-spr-112t-2n]: drawn" in output
    fig10 = (out / "fig10.html").read_text()
    assert fig10.count('class="panel" data-machine=') == 2                # one panel per machine
    assert 'src="img/amd-f25m1-2t-1n/fig10.png"' in fig10 and 'src="img/intel-spr-112t-2n/fig10.png"' in fig10
    assert "hinabench ffn --backends torch (synthetic rows for the tests)" in fig10   # the commands
    assert "made by: hinabench figure fig10" in fig10
    for text in ("unsupported", "timeout", "wrong", "no AMX tiles on this CPU", "did not answer within 600 s"):
        assert text in fig10, text                                       # statuses and reasons visible
    assert "GPU backends (torch-cuda) are in fig1, not here" in fig10      # CPU figures leave the GPU out, said so
    fig1 = (out / "fig1.html").read_text()
    assert fig1.count('class="panel" data-machine=') == 3                # each machine, and all together
    assert (out / "img" / "intel-spr-112t-2n" / "fig1.png").stat().st_size > 10_000


def test_the_report_is_self_contained(site):
    out, _ = site
    for page in out.glob("*.html"):
        text = page.read_text()
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", text), page.name     # no CDN, no remote
        for ref in re.findall(r'(?:src|href)="([^"#:]+)"', text):                    # every link resolves
            assert (out / ref).exists(), f"{page.name} links to missing {ref}"


def test_report_of_the_repositorys_results_draws_fig10_and_fig15_and_says_why_not_fig1(tmp_path):
    r = invoke("report", str(ROOT / "results"), "--out", str(tmp_path / "site"))
    assert r.exit_code == 0, r.output
    assert "fig10 [amd-f25m1-2t-1n]: drawn" in r.output and "fig15 [amd-f25m1-2t-1n]: drawn" in r.output
    assert "fig1 [amd-f25m1-2t-1n]: not drawn" in r.output and "torch-cuda" in r.output
    again = invoke("report", str(ROOT / "results"), "--out", str(tmp_path / "site"), "--all")
    assert again.exit_code == 0 and "run" in (tmp_path / "site" / "rows.html").read_text()


def test_report_errors_are_one_line(tmp_path):
    r = invoke("report", str(tmp_path / "none"), "--out", str(tmp_path / "s"))
    assert r.exit_code == 2 and "no results file at" in r.output


@contextlib.contextmanager
def _serve(folder: Path):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *a, **k: None
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def watched_page(browser, problems: list, width: int, height: int):
    """A page whose console errors and warnings, page errors, failed requests and HTTP errors are
    appended to `problems`."""
    page = browser.new_page(viewport={"width": width, "height": height})
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    return page


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (Debian: apt-get install chromium; .ci/run installs it)")
def test_the_report_in_a_real_browser(site, tmp_path, capsys):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extra")
    out, _ = site
    problems = []
    with sync_api.sync_playwright() as p, _serve(out) as base:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        page = watched_page(browser, problems, 1600, 1200)
        for url in [f"{base}/{n}.html" for n in ("index", "fig1", "fig10", "fig15", "rows")] + \
                   [(out / "fig10.html").as_uri(), (out / "index.html").as_uri()]:     # served, and file://
            page.goto(url)
            page.wait_for_load_state("load")
            imgs = page.eval_on_selector_all("img", "els => els.map(e => [e.getAttribute('src'), e.complete, e.naturalWidth])")
            assert all(done and w > 0 for _, done, w in imgs), (url, imgs)
            if "fig" in url.rsplit("/", 1)[-1]:
                assert imgs, f"{url}: no figure image"
        # the table filters: a backend name leaves only its rows
        page.goto(f"{base}/fig10.html")
        rows = page.locator("table.rows tbody tr")
        total = rows.count()
        page.fill("input.filter", "hina:amx")
        visible = page.locator("table.rows tbody tr:visible")
        n = visible.count()
        assert 0 < n < total
        assert all("hina:amx" in t for t in visible.all_inner_texts())
        assert page.inner_text(".shown") == f"{n} of {total} rows shown"
        page.fill("input.filter", "")
        def column(name):
            i = page.eval_on_selector("table.rows", "(t, n) => Array.from(t.tHead.rows[0].cells)"
                                                    ".findIndex(c => c.textContent === n)", name)
            return page.locator(f"table.rows tbody tr:visible td:nth-child({i + 1})").all_inner_texts()
        page.select_option("select.status", "timeout")
        assert column("status") == ["timeout"]
        page.select_option("select.status", "")
        # sorting: click "median ms" and the medians ascend, rows without one last
        page.click("table.rows th:text-is('median ms')")
        med = column("median ms")
        nums = [float(m) for m in med if m]
        assert len(nums) > 3 and nums == sorted(nums) and all(med[:len(nums)])
        page.click("table.rows th:text-is('median ms')")
        assert [float(m) for m in column("median ms") if m] == sorted(nums, reverse=True)
        page.fill("input.filter", "hina")
        shot = tmp_path / "report-fig10.png"
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    assert shot.stat().st_size > 50_000
    assert not problems, problems
    with capsys.disabled():
        print(f"\nreport screenshot: {shot}")
