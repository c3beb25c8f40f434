"""The Compare tab: its view of a scripted experiment, and the tab in a real browser (Debian's Chromium driven by
Playwright, as in tests/test_browser.py) drawing one curve per arm."""

from __future__ import annotations

from pathlib import Path

import pytest

import app
from lab.pages.compare import compare_view
from lab.study.comparison import Rate, comparison, report_markdown
from lab.study.experiments import create_experiment, experiment_runs
from lab.text import as_text
from storage.db import make_engine, upgrade
from storage.settings import RunSettings
from tests.recorded import CONFIG, scripted_experiment
from tests.servers import TIMEOUT_MS, free_port


def test_the_view_draws_each_arm_tables_its_sizes_and_links_its_runs(empty_lab):
    experiment = scripted_experiment(empty_lab, seeds=2, stages=1)
    view = compare_view(empty_lab, experiment.id, Rate.OPTIMAL)
    c = comparison(empty_lab, experiment.id)
    means = {t.name: list(t.y) for t in view["figure"].data if t.mode == "lines+markers"}
    assert means == {arm: [c.estimate(arm, Rate.OPTIMAL, k).mean for k in (0, 1)] for arm in ("fixed", "heuristic")}
    assert view["sizes"]["headers"] == ["map size", "fixed", "heuristic"]  # one row per size: all of them in view
    assert [row[0] for row in view["sizes"]["data"]] == ["3x3", "4x4", "all"]
    e = c.estimate("heuristic", Rate.OPTIMAL, 1, 3)
    assert view["sizes"]["data"][0][2] == f"{e.mean:.1%} [{e.low * 100:.1f}, {e.high * 100:.1f}]"
    d = c.difference("heuristic", Rate.OPTIMAL, 1, against="fixed")
    assert view["differences"]["headers"] == ["difference", "mean [95% t interval]", "sd", "detectable (80% power)",
                                              "every seed"]
    assert view["differences"]["data"] == [["heuristic - fixed", f"{d.mean * 100:+.1f}% [{d.low * 100:+.1f}, "
                                            f"{d.high * 100:+.1f}]", f"{d.sd * 100:.2f}", f"{d.detectable * 100:.2f}",
                                            ", ".join(f"{v * 100:+.1f}" for v in d.values)]]
    assert "Student-t interval" in view["summary"] and "bootstrap" not in view["summary"]
    for run in experiment_runs(empty_lab, experiment.id):
        assert f"[seed {run.seed}](?run={run.id}) (done)" in view["links"]
    assert "each on 8 boards in 1 GRPO steps" in view["summary"]
    assert compare_view(empty_lab, None)["links"] == ""
    assert "gunzip -k docs/results/study-6seed/study.db.gz" in compare_view(empty_lab, None)["summary"]


def test_an_experiment_s_and_its_arms_names_show_as_typed_in_the_report_and_the_tab(empty_lab):
    """Names a person typed (`envlab experiment new --name ... --arms NAME=SPEC`) go into report.md and the tab's
    Markdown as text: no image, link, tag or table cell comes of them."""
    from markdown_it import MarkdownIt

    name, arm = '<img src="http://127.0.0.1:9/img"> ![x](http://127.0.0.1:9/md)', "a|b_*c*"
    experiment = create_experiment(empty_lab, name=name, arms=[f"{arm}=fixed", "heuristic"], seeds=1, config=CONFIG,
                                   settings=RunSettings(stages=1, validation_boards=8))
    c = comparison(empty_lab, experiment.id)
    report = report_markdown(c)
    assert report.startswith(f"# Experiment {as_text(name)}\n")
    assert f"Arms: {as_text(arm)} (fixed), heuristic (heuristic)." in report
    assert f"| {as_text(arm)} | - | - | - |" in report  # one cell: the pipe in its name is text
    rendered = MarkdownIt("commonmark").enable("table").render(report)
    assert "<img" not in rendered and "<a " not in rendered
    view = compare_view(empty_lab, experiment.id)
    assert view["summary"].startswith(f"**{as_text(name)}**: 0 of 2 runs done.")
    assert f"`envlab experiment report {experiment.id}`" in view["summary"]
    assert view["links"].startswith(f"Runs:\n\n- **{as_text(arm)}**: [seed 0]")


def test_the_compare_tab_shows_one_curve_per_arm(empty_lab, page):
    scripted_experiment(empty_lab, name="older", seeds=1, stages=1)
    experiment = scripted_experiment(empty_lab, name="newest", seeds=2, stages=1)
    demo = app.build_demo(empty_lab)
    port = free_port()
    app.launch(demo, port=port, block=False)
    try:
        page.goto(f"http://127.0.0.1:{port}/")
        page.get_by_role("tab", name="Compare").click()
        page.locator("#compare-summary").get_by_text("newest: 4 of 4 runs done").wait_for()
        curves = """() => {
            const div = document.querySelector('#compare-curves .js-plotly-plot');
            return div && div.data ? div.data.filter(t => t.mode === 'lines+markers').map(t => t.name) : [];
        }"""
        page.wait_for_function(f"({curves})().length === 2", timeout=TIMEOUT_MS)
        assert sorted(page.evaluate(curves)) == ["fixed", "heuristic"]
        names = page.evaluate("() => document.querySelector('#compare-curves .js-plotly-plot').data.map(t => t.name)")
        assert {"fixed interval", "heuristic seeds"} <= set(names)
        first = experiment_runs(empty_lab, experiment.id)[0]
        link = page.locator("#compare-runs a", has_text="seed 0").first
        assert link.get_attribute("href") == f"?run={first.id}"
        page.locator("#compare-sizes th", has_text="heuristic").first.wait_for()
        page.wait_for_function("() => (document.querySelector('#compare-differences') || {}).textContent"
                               "?.includes('heuristic - fixed')", timeout=TIMEOUT_MS)
        page.goto(f"http://127.0.0.1:{port}/{link.get_attribute('href')}")  # where the link leads: the run, open
        page.wait_for_function("id => (document.querySelector('#run-pick input') || {}).value?.startsWith(id)",
                               arg=f"#{first.id} ")
    finally:
        demo.close()


@pytest.mark.parametrize("name", ["defaults", "hardstart"])
def test_the_shipped_study_is_what_its_database_says(name: str, tmp_path: Path):
    """docs/results/study-6seed/NAME: its report, runs.csv, summary.csv and differences.csv are remade exactly from
    the study's database shipped beside them (every seed's rate, the intervals, the paired differences)."""
    import csv
    import gzip
    import shutil

    from lab.study.comparison import difference_rows, report_markdown, seed_rows, summary_rows

    study = Path(__file__).resolve().parents[2] / "docs" / "results" / "study-6seed"
    shipped = study / name
    db = tmp_path / "study.db"
    with gzip.open(study / "study.db.gz", "rb") as src, db.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    engine = make_engine(str(db))
    upgrade(engine)  # as `envlab experiment report` does
    c = comparison(engine, name)
    assert report_markdown(c) == (shipped / "report.md").read_text()
    for file, (header, rows) in (("runs.csv", seed_rows(c)), ("summary.csv", summary_rows(c)),
                                 ("differences.csv", difference_rows(c))):
        with (shipped / file).open(newline="") as f:
            assert list(csv.reader(f)) == [header, *([str(v) for v in row] for row in rows)]
    arms = ("random", "evidence", "heuristic") + (("fixed", "learnability") if name == "hardstart" else ())
    assert {(r.arm, r.seed): r.status for r in experiment_runs(engine, c.experiment.id)} == {
        (arm, seed): "done" for arm in arms for seed in range(6)}
    engine.dispose()
