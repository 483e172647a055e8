"""`hinabench reproduce`: the plan (each paper figure measured / modeled / not reproducible here, and
why) on machines described as data, the budget's order, and a real --quick run on this machine that
stops at its budget, continues with the same --out, and leaves a report that opens in Chromium."""
from pathlib import Path

import pytest

from clihelp import invoke, read_csv
from hinabench import reproduce as rp
from hinabench.errors import UserError

HERE_LIKE = dict(summary="test machine", machine="test-1n", numa_nodes=1,
                 cuda=(False, "no CUDA device (torch x is a CPU build)"), perf=(False, "perf: no hardware counters"),
                 hbm=(False, "no HBM: no CPU-less NUMA node"), dtypes=("bf16",), kinds=("ffn", "linear"),
                 figures=("fig1", "fig4", "fig10", "fig15"), e2e=False)


def _assess(**over):
    caps = rp.Capabilities(**{**HERE_LIKE, **over})
    return {f.id: f.assess(caps) for f in rp.PAPER}


def test_every_paper_figure_is_planned_with_a_status_and_a_reason():
    a = _assess()
    assert set(a) == {"fig1", "fig4", "fig10", "fig11", "fig12", "fig13", "fig14", "fig15", "fig16", "table4", "attn"}
    assert all(x.status in (rp.MEASURED, rp.MODELED, rp.NOT_HERE) and x.detail for x in a.values())
    # this machine's kind: one node, no GPU, no perf counters, no HBM
    assert a["fig1"].status == rp.NOT_HERE and "CUDA" in a["fig1"].detail
    assert a["fig4"].status == rp.MEASURED and "two-node" in a["fig4"].detail and a["fig4"].suites == ("fig10",)
    assert a["fig10"].status == rp.MEASURED
    assert a["fig15"].status == rp.MODELED and "one NUMA node" in a["fig15"].detail
    assert a["fig16"].status == rp.NOT_HERE and "HBM" in a["fig16"].detail
    for f in ("fig12", "fig13", "fig14", "table4"):
        assert a[f].status == rp.NOT_HERE and "end-to-end" in a[f].detail
    assert a["fig11"].status == rp.NOT_HERE and "INT8" in a["fig11"].detail
    assert a["attn"].status == rp.NOT_HERE and "attention" in a["attn"].detail


def test_the_plan_follows_the_machine():
    big = _assess(numa_nodes=2, perf=(True, ""), cuda=(True, ""), hbm=(True, "CPU-less NUMA node(s) [2, 3]"))
    assert big["fig15"].status == rp.MEASURED and "perf" in big["fig15"].detail
    assert big["fig4"].suites == ("fig10", "fig15")
    assert big["fig1"].status == rp.MEASURED and big["fig1"].suites == ("fig1",)
    assert big["fig16"].status == rp.MEASURED
    two_no_perf = _assess(numa_nodes=2)
    assert two_no_perf["fig15"].status == rp.MODELED and "counters" in two_no_perf["fig15"].detail


def test_figures_join_the_plan_as_their_kernels_land():
    a = _assess(dtypes=("bf16", "int8", "fp8"), e2e=True, kinds=("ffn", "linear", "attention"),
                figures=("fig1", "fig4", "fig10", "fig11", "fig12", "fig13", "fig14", "table4", "fig15", "attn"))
    assert a["fig11"].status == rp.MEASURED and a["fig11"].suites == ("fig11",)
    for f in ("fig12", "fig13", "fig14", "table4"):
        assert a[f].status == rp.MEASURED and a[f].suites == ("e2e",), f
    assert a["attn"].status == rp.MEASURED and a["attn"].suites == ("attn", "attn-extend")


def test_an_e2e_job_is_done_once_this_out_finished_it(tmp_path):
    sp = rp._job_plan("e2e", True, tmp_path, "m", 1)
    assert sp.rows_todo == 1 and sp.job["layers"] == [1, 2]
    assert rp.job_estimate(sp, True, {}) == (rp.SUITES["e2e"].prior_s[1], "a prior: not calibrated")
    sp.path.parent.mkdir(parents=True)
    sp.path.write_text("x\n")
    rp.save_state(tmp_path, {"jobs": [{"name": "e2e", "keywords": sp.job, "rows": 12, "seconds": 99.0}]})
    again = rp._job_plan("e2e", True, tmp_path, "m", 1)
    assert again.rows_todo == 0 and again.rows_done == 12
    assert rp.job_estimate(again, True, rp.load_state(tmp_path)) == (99.0, "as measured before")
    assert rp._job_plan("e2e", False, tmp_path, "m", 1).rows_todo == 1      # the full job is another one


@pytest.mark.parametrize("text,secs", [("90s", 90), ("45m", 2700), ("1h30m", 5400), ("2h", 7200), ("10", 600),
                                       ("1.5m", 90)])
def test_budget_durations(text, secs):
    assert rp.parse_duration(text) == secs


@pytest.mark.parametrize("text", ["", "soon", "-5m", "0", "5x"])
def test_bad_budgets_are_user_errors(text):
    with pytest.raises(UserError):
        rp.parse_duration(text)


def _plan(costs: dict, figures: dict):
    caps = rp.Capabilities(**HERE_LIKE)
    figs = [(rp.PaperFigure(f, f), rp.Assessment(rp.MEASURED, "x", tuple(s))) for f, s in figures.items()]
    suites = {s: rp.SuitePlan(s, None, Path(s), todo_s=c, rows_todo=1) for s, c in costs.items()}
    return rp.Plan(caps=caps, quick=False, threads=1, out=Path("."), figures=figs, suites=suites)


def test_the_budget_completes_the_most_figures_cheapest_first_a_shared_suite_counted_once():
    plan = _plan({"big": 100.0, "mid": 30.0, "small": 20.0},
                 {"A": ["big"], "B": ["mid"], "C": ["small", "mid"], "D": ["small"]})
    rp.schedule(plan, 55.0)
    # D (20) then C (only mid is new: 30) fit in 55; then B (nothing new: 0) fits too; A does not
    assert plan.fits == {"D": True, "C": True, "B": True, "A": False}
    assert plan.order == ["small", "mid", "big"]


def test_bad_options_are_one_line_errors(tmp_path):
    r = invoke("reproduce", "--only", "fig99", "--out", str(tmp_path / "o"), "--plan-only")
    assert r.exit_code == 2 and "unknown figure" in r.output and "Traceback" not in r.output
    r = invoke("reproduce", "--budget", "soon", "--out", str(tmp_path / "o"))
    assert r.exit_code == 2 and "not a duration" in r.output


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """A --quick run of Figures 4 and 10 with two backends, first with a budget too small for any
    point (calibration only), then continued with the same --out."""
    out = tmp_path_factory.mktemp("reproduce") / "rep"
    args = ["reproduce", "--quick", "--only", "fig4,fig10,fig16", "--backends", "torch,hina:avx2", "--out", str(out)]
    first = invoke(*args, "--budget", "1s")
    second = invoke(*args, "--budget", "30m")
    third = invoke(*args, "--budget", "30m")
    return out, first, second, third


def test_quick_run_plans_stops_at_its_budget_and_continues(quick_run):
    out, first, second, third = quick_run
    assert first.exit_code == 0, first.output
    for text in ("fig4", "measured here", "fig16", "not reproducible here", "estimated", "calibrating"):
        assert text in first.output, text
    assert "budget reached before" in first.output and "no rows were measured" in first.output
    assert second.exit_code == 0, second.output
    assert "calibration from" in second.output               # kept from the first run, not repeated
    csvs = list((out / "results").rglob("fig10.csv"))
    assert len(csvs) == 1
    rows = read_csv(csvs[0])
    assert {r["backend"] for r in rows} == {"torch", "hina:avx2"} and {r["tokens_per_expert"] for r in rows} == {"1", "8"}
    assert all(r["status"] == "ok" for r in rows), [(r["backend"], r["reason"]) for r in rows]
    assert "hinabench reproduce" in rows[0]["command"]
    assert "figures drawn: fig10, fig4" in second.output
    # a third run has nothing left to measure and only redraws the report
    assert third.exit_code == 0 and "0 to measure" in third.output and len(read_csv(csvs[0])) == len(rows)
    state = rp.load_state(out)
    assert [r["figure"] for r in state["plan"]] == ["fig4", "fig10", "fig16"] and len(state["runs"]) == 3


def test_quick_runs_report_shows_the_plan_and_the_figures(quick_run):
    out = quick_run[0]
    index = (out / "site" / "index.html").read_text()
    assert "The paper&#x27;s figures on this machine" in index or "The paper's figures on this machine" in index
    assert "not reproducible here" in index and "no HBM" in index
    assert (out / "site" / "fig4.html").exists() and list((out / "site" / "img").rglob("fig4.png"))


def test_quick_runs_report_in_a_real_browser(quick_run, tmp_path):
    from test_report import CHROMIUM, _serve, watched_page
    if CHROMIUM is None:
        pytest.skip("no chromium binary (.ci/run installs it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extra")
    site = quick_run[0] / "site"
    problems = []
    with sync_api.sync_playwright() as p, _serve(site) as base:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        page = watched_page(browser, problems, 1400, 1000)
        for name in ("index", "fig4", "fig10"):
            page.goto(f"{base}/{name}.html")
            page.wait_for_load_state("load")
            imgs = page.eval_on_selector_all("img", "els => els.map(e => [e.complete, e.naturalWidth])")
            assert all(done and w > 0 for done, w in imgs), (name, imgs)
            assert imgs or name == "index"
        page.goto(f"{base}/index.html")
        assert page.locator("table.plan tbody tr").count() == 3
        shot = tmp_path / "reproduce-index.png"
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    assert shot.stat().st_size > 10_000
    assert not problems, problems
