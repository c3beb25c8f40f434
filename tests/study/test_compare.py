"""The Compare tab: its view of a scripted experiment, and the tab in a real browser (Debian's Chromium driven by
Playwright, as in tests/pages/test_browser.py) drawing one curve per arm; the comparisons with the baseline,
Holm-adjusted, on known p-values, on comparisons built by hand and on scripted runs whose valid and optimal rates
differ; the primary metric an experiment is made with; and what every arm spent, on scripted runs with known job
times and probe answers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from sqlmodel import select

from envsim.instance import Instance
from envsim.parser import format_plan
from envsim.scoring import score_answer
from envsim.solver import label
from lab import cli
from lab.jobs.worker import WorkerOptions, run_worker
from lab.loop import after_job, run_propose_job
from lab.pages import web as app
from lab.pages.compare import compare_view
from lab.study.comparison import (
    POOLED,
    Comparison,
    Rate,
    answers_statement,
    comparison,
    compute_rows,
    finding,
    holm,
    holm_levels,
    paired_p,
    report_markdown,
)
from lab.study.experiments import ExperimentError, create_experiment, experiment_runs, find_experiment, log_dir
from lab.text import as_text
from storage.db import make_engine, session, upgrade
from storage.models import Experiment, Job, JobKind, JobStatus, Proposal, Run, Stage
from storage.payloads import StagePayload
from storage.settings import ExperimentSettings, RunSettings
from tests.boards import CROSSING, OPEN
from tests.recorded import BOARDS, CONFIG, scripted_experiment
from tests.servers import TIMEOUT_MS, free_port, goto
from training.evaluate import EpisodeResult, store_evaluation

STUDY_DB = Path(__file__).resolve().parents[2] / "docs" / "results" / "study-6seed" / "study.db.gz"


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
    assert view["differences"]["headers"] == ["difference", "mean [95% t interval] (points)", "sd (points)",
                                              "detectable, 80% power (points)", "every seed (points)"]
    assert view["differences"]["data"] == [["heuristic - fixed", f"{d.mean * 100:+.2f} [{d.low * 100:+.2f}, "
                                            f"{d.high * 100:+.2f}]", f"{d.sd * 100:.2f}", f"{d.detectable * 100:.2f}",
                                            ", ".join(f"{v * 100:+.2f}" for v in d.values)]]
    assert "Student-t interval" in view["summary"] and "bootstrap" not in view["summary"]
    assert "primary metric) first, Holm-adjusted over 1 comparison with fixed: the interval" in view["summary"]
    for run in experiment_runs(empty_lab, experiment.id):
        assert f"[seed {run.seed}](?run={run.id}) (done)" in view["links"]
    assert "each on 8 boards in 1 GRPO steps" in view["summary"]
    assert compare_view(empty_lab, None)["links"] == ""
    assert "gunzip -k docs/results/second-pass/study.db.gz" in compare_view(empty_lab, None)["summary"]


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
    assert view["summary"].startswith(f"**{as_text(name)}**: 0 of 2 runs done, 0 of 4 stages evaluated; time left: "
                                      "not known until a stage has trained.\n\n")
    assert "Last, what every arm spent so far, summed" in view["summary"]
    assert "Runs: 0 of 2 done, 0 of 4 stages evaluated. Arms: " in report
    assert "## Compute per arm\n\nRuns go on: what they spent so far, the mean over every run" in report
    assert f"`envlab experiment report {experiment.id}`" in view["summary"]
    assert (f"primary metric) first, Holm-adjusted over the comparisons with {as_text(arm)}, none yet (no arm has 2 "
            "seeds paired with it): the interval") in view["summary"]
    assert view["links"].startswith(f"Runs:\n\n- **{as_text(arm)}**: [seed 0]")


@contextmanager
def compare_tab(engine, page) -> Iterator[int]:
    """The lab served on a free port (yielded), open in the browser on its Compare tab (clicked as soon as the page
    shows: the tab may be drawn before the page's first answer, which starts its poll, or after it)."""
    demo = app.build_demo(engine)
    port = free_port()
    app.launch(demo, port=port, block=False)
    try:
        goto(page, f"http://127.0.0.1:{port}/")
        page.get_by_role("tab", name="Compare").click()
        yield port
    finally:
        demo.close()


def test_the_compare_tab_shows_one_curve_per_arm(empty_lab, page):
    scripted_experiment(empty_lab, name="older", seeds=1, stages=1)
    experiment = scripted_experiment(empty_lab, name="newest", seeds=2, stages=1)
    with compare_tab(empty_lab, page) as port:
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
        primary = "() => (document.querySelector('#compare-primary') || {}).textContent || ''"
        page.wait_for_function(f"({primary})().includes('+12.50 [+12.50, +12.50] ★')", timeout=TIMEOUT_MS)
        assert "Valid rate (the primary metric), stage 1: each arm minus fixed, paired by seed (points); " \
               "Holm-adjusted over 1 comparison with fixed" in page.evaluate(primary)  # its label, set per experiment
        goto(page, f"http://127.0.0.1:{port}/{link.get_attribute('href')}")  # where the link leads: the run, open
        page.wait_for_function("id => (document.querySelector('#run-pick input') || {}).value?.startsWith(id)",
                               arg=f"#{first.id} ")


def test_the_compare_tab_redraws_a_study_under_way_as_its_stages_end(empty_lab, page):
    """Watched on the Compare tab, an experiment whose last run ends is redrawn by the page's poll, no click; so it
    is when the run ends before the page's first answer has read the lab (the tab drawn before that answer: the poll
    compares what the tab was drawn from, not what the page first read)."""
    from sqlalchemy import update

    experiment = scripted_experiment(empty_lab, name="watched", seeds=1, stages=1)
    last = experiment_runs(empty_lab, experiment.id)[-1]
    with session(empty_lab) as s:
        s.exec(update(Stage).where(Stage.run_id == last.id, Stage.index == 1).values(status="running"))
        s.exec(update(Run).where(Run.id == last.id).values(status="active"))
        s.commit()
    with compare_tab(empty_lab, page):
        page.locator("#compare-summary").get_by_text("watched: 1 of 2 runs done").wait_for()
        with session(empty_lab) as s:
            s.exec(update(Stage).where(Stage.run_id == last.id, Stage.index == 1).values(status="done"))
            s.exec(update(Run).where(Run.id == last.id).values(status="done"))
            s.commit()
        page.locator("#compare-summary").get_by_text("watched: 2 of 2 runs done.").wait_for()


SHIPPED_ARMS = {"defaults": (("random", "evidence", "heuristic"), 6),
                "hardstart": (("random", "evidence", "heuristic", "fixed", "learnability"), 6),
                "second-pass": (("random", "static", "schedule", "evidence", "bandit"), 8)}


@pytest.mark.parametrize(("folder", "name"), [("study-6seed", "defaults"), ("study-6seed", "hardstart"),
                                              ("second-pass", "second-pass")])
def test_the_shipped_study_is_what_its_database_says(folder: str, name: str, tmp_path: Path):
    """docs/results/FOLDER: each experiment's report, runs.csv, summary.csv and differences.csv are remade exactly
    from the database shipped beside them (every seed's rate, the intervals, the paired differences)."""
    import csv
    import gzip
    import shutil

    from lab.study.comparison import difference_rows, report_markdown, seed_rows, summary_rows
    from lab.study.example import shipped_report

    study = Path(__file__).resolve().parents[2] / "docs" / "results" / folder
    shipped = shipped_report(study, name)
    assert shipped == (study if folder == name else study / name)
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
    arms, seeds = SHIPPED_ARMS[name]
    assert {(r.arm, r.seed): r.status for r in experiment_runs(engine, c.experiment.id)} == {
        (arm, seed): "done" for arm in arms for seed in range(seeds)}
    engine.dispose()


def test_the_shipped_study_draws_on_compare_without_loading_torch(tmp_path: Path):
    """Every experiment of the shipped database recorded its rollouts per stage, so the Compare tab draws it without
    counting them again (which loads torch and TRL: tens of seconds on a loaded machine, on the tab's first visit)."""
    import subprocess
    import sys

    script = (
        "import gzip, shutil, sys\n"
        "from storage.db import make_engine, upgrade\n"
        "from lab.pages.compare import compare_view\n"
        f"db = {str(tmp_path / 'study.db')!r}\n"
        f"with gzip.open({str(STUDY_DB)!r}, 'rb') as src, open(db, 'wb') as dst: shutil.copyfileobj(src, dst)\n"
        "engine = make_engine(db); upgrade(engine)\n"
        "views = [compare_view(engine, key) for key in (1, 2)]\n"
        "print(sorted(v['summary'].split('**')[1] for v in views), 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "['defaults', 'hardstart'] False"


def test_holm_on_known_p_values():
    """Sorted 0.01, 0.03, 0.04: 3 x 0.01 = 0.03, 2 x 0.03 = 0.06, 1 x 0.04 = 0.04 raised to the 0.06 before it; the
    first step (0.01 < 0.05 / 3) rejects, the second (0.03 > 0.05 / 2) does not, so it and every later step keep its
    level, 97.5%."""
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm_levels([0.01, 0.04, 0.03]) == pytest.approx([1 - 0.05 / 3, 0.975, 0.975])
    assert holm([0.001, 0.01, 0.04]) == pytest.approx([0.003, 0.02, 0.04])  # every step rejects: 95% at the last
    assert holm_levels([0.001, 0.01, 0.04]) == pytest.approx([1 - 0.05 / 3, 0.975, 0.95])
    assert holm([0.6, 0.7]) == [1.0, 1.0] and holm([0.2]) == [0.2] and holm([]) == holm_levels([]) == []
    assert holm_levels([0.2]) == [0.95]  # one comparison: the plain 95% interval
    differences = [0.010, 0.003, 0.012, 0.005]
    assert paired_p(differences) == pytest.approx(stats.ttest_1samp(differences, 0).pvalue)
    assert (paired_p([0.01]), paired_p([0.0, 0.0]), paired_p([0.02, 0.02])) == (None, 1.0, 0.0)


def built(arms: dict[str, list[float]], stage: int = 1) -> Comparison:
    """A comparison of these arms' valid rates at `stage`, seed k the k-th value, built without a database."""
    settings = ExperimentSettings(run=RunSettings(stages=stage), config=CONFIG, steps_per_stage=1, validation_boards=8)
    experiment = Experiment(id=1, name="built", policy="tiny", seeds=4, settings=settings,
                            arms=[{"name": a, "engineer": a, "backend": "", "context": ""} for a in arms])
    values = {(arm, Rate.VALID, stage, POOLED): dict(enumerate(v)) for arm, v in arms.items()}
    return Comparison(experiment, list(arms), [0, 1, 2, 3], stage, [], {}, values, {})


def test_the_finding_names_the_arms_whose_holm_interval_excludes_zero():
    """heuristic is 2.1 points above fixed on every seed (p 0.0007); evidence's p of 0.038 is below 0.05 alone but
    not once Holm-adjusted (2 x 0.038 = 0.075); random is noise (p 0.89)."""
    fixed = [0.5] * 4
    arms = {"fixed": fixed, "random": [0.510, 0.490, 0.520, 0.485], "heuristic": [0.520, 0.525, 0.518, 0.521],
            "evidence": [0.510, 0.503, 0.512, 0.505]}
    c = built(arms)
    assert finding(c) == ("heuristic - fixed: +2.10 points [+1.39, +2.81], Holm p 0.002; the others do not differ "
                          "from fixed beyond their intervals (valid rate at stage 1, Holm over 3 comparisons).")
    by_arm = {a.arm: a for a in c.versus_baseline(Rate.VALID, 1)}
    evidence = by_arm["evidence"]
    assert (evidence.difference.p, evidence.holm_p) == pytest.approx((0.0376, 0.0752), abs=1e-4)
    assert evidence.difference.low > 0 and not evidence.excludes_zero  # its own 95% interval does; at 97.5% it does not
    assert (by_arm["heuristic"].level, evidence.level, by_arm["random"].level) == pytest.approx((1 - 0.05 / 3, 0.975,
                                                                                               0.975))
    assert finding(built({k: v for k, v in arms.items() if k != "heuristic"})) == (
        "No arm differs from fixed beyond its interval (valid rate at stage 1, Holm over 2 comparisons).")
    assert finding(built({"fixed": fixed, "random": arms["random"]})) == (
        "random does not differ from fixed beyond its interval (valid rate at stage 1, Holm over 1 comparison).")
    assert finding(built({"fixed": fixed, "random": arms["random"][:1]})) == (
        "No arm has 2 seeds paired with fixed yet: no interval to compare (valid rate at stage 1).")


def test_the_finding_of_scripted_runs_opens_the_report_and_the_tab(empty_lab):
    """heuristic solves 2, 2 and 1 boards of 8 more than fixed at stage 2 (tests.recorded.solved): differences of
    25, 25 and 12.5 points, t = 5 with 2 degrees of freedom, p = 1 - 5 / sqrt(27) = 0.038."""
    experiment = scripted_experiment(empty_lab)
    c = comparison(empty_lab, experiment.id)
    sentence = ("heuristic - fixed: +20.83 points [+2.91, +38.76], Holm p 0.038 (valid rate at stage 2, Holm over 1 "
                "comparison).")
    assert finding(c) == sentence
    assert c.versus_baseline(Rate.VALID, 2)[0].difference.p == pytest.approx(1 - 5 / 27 ** 0.5)
    report = report_markdown(c)
    assert report.startswith(f"# Experiment cmp\n\n{sentence}\n\n")
    assert ("## Valid rate minus fixed, paired by seed (points): Holm-adjusted over 1 comparison with fixed" in report)
    assert "| heuristic - fixed | 2 | +20.83 [+2.91, +38.76] ★ | 95.00% | 0.038 | 0.038 |" in report
    view = compare_view(empty_lab, experiment.id)
    assert view["summary"].startswith(f"**cmp**: 6 of 6 runs done.\n\n{sentence}\n\nNo report written yet: "
                                      f"`envlab experiment report {experiment.id}`")
    assert view["primary"] == {"headers": ["difference (valid rate)", "stage",
                                           "mean [interval at the Holm level] (points)", "level", "p", "Holm p"],
                               "data": [["heuristic - fixed", "2", "+20.83 [+2.91, +38.76] ★", "95.00%", "0.038",
                                         "0.038"]]}
    assert view["primary_label"] == ("Valid rate (the primary metric), stage 2: each arm minus fixed, paired by seed "
                                     "(points); Holm-adjusted over 1 comparison with fixed. ★: the interval excludes "
                                     "zero")
    written = log_dir(empty_lab, experiment) / "report" / "report.md"  # where `envlab experiment report` writes it
    assert f"curves.png to {as_text(str(written.parent))}." in view["summary"]
    written.parent.mkdir(parents=True)
    written.write_text(report)
    assert f"Report: {as_text(str(written))} (with runs.csv" in compare_view(empty_lab, experiment.id)["summary"]


# Stage 1's boards answered, (valid, of which optimal), by arm and seed; stage 0: 2 valid, 1 of them optimal
ANSWERED = {("fixed", 0): (4, 3), ("fixed", 1): (5, 4), ("fixed", 2): (4, 4),
            ("heuristic", 0): (6, 3), ("heuristic", 1): (6, 5), ("heuristic", 2): (7, 4)}


def late_stage(engine, job, progress):
    """The stage job without training: of the 8 boards the first `optimal` answered with the reference plan, the
    next `valid - optimal` with it one step late (every agent waits first: valid, not optimal), the rest wrong."""
    payload = StagePayload.of(job)
    run_id, k = payload.run_id, payload.stage_index
    with session(engine) as s:
        run = s.get(Run, run_id)
        valid, optimal = (2, 1) if k == 0 else ANSWERED[(run.arm, run.seed)]
        results = []
        for i, board in enumerate(BOARDS):
            late = [("WAIT", *actions) for actions in board.reference_plan]
            text = "no idea" if i >= valid else format_plan(board.reference_plan if i < optimal else late)
            results.append(EpisodeResult(board, text, score_answer(board, text)))
        store_evaluation(s, run_id, k, "validation", results)
        store_evaluation(s, run_id, k, "dev", results)
        stage = s.exec(select(Stage).where(Stage.run_id == run_id, Stage.index == k)).one()
        stage.status, stage.checkpoint = "done", f"{run.uuid}/stage-{k}"
        s.add(stage)
        s.commit()
    return {"stage_index": k}


def test_the_primary_metric_is_stored_and_leads_with_the_optimal_rate_beside_the_valid(empty_lab, tmp_path, capsys):
    """Made with `--primary optimal`: the report and the tab lead with the optimal rate. Paired by seed, stage 1's
    valid differences are 2, 1 and 3 boards of 8 (25 points, sd 12.5: t = 2 sqrt(3), p = 1 - sqrt(6/7) = 0.074) and
    the optimal ones 0, 1 and 0 (4.17 points, t = 1, p = 1 - 1/sqrt(3) = 0.423), t(0.975, 2) = 4.303."""
    (tmp_path / "small.json").write_text(CONFIG.model_dump_json())
    assert cli.main(["experiment", "new", "--name", "opt", "--arms", "fixed,heuristic", "--seeds", "3", "--stages",
                     "1", "--config", str(tmp_path / "small.json"), "--validation-boards", "8", "--grpo",
                     "max_steps=1", "--primary", "optimal", "--db", str(tmp_path / "lab.db")]) == 0
    assert "the report leads with the optimal rate" in capsys.readouterr().out
    assert cli.main(["experiment", "new", "--name", "x", "--arms", "fixed", "--primary", "best", "--db",
                     str(tmp_path / "lab.db")]) == 2
    assert "--primary: invalid choice: 'best' (choose from 'valid', 'optimal')" in capsys.readouterr().err
    with pytest.raises(ExperimentError, match="primary = 'best': the primary metric is one of valid, optimal"):
        create_experiment(empty_lab, name="x", arms=["fixed"], seeds=1, settings=RunSettings(stages=1),
                          primary="best")
    while run_worker(empty_lab, {"stage": late_stage, "propose": run_propose_job},
                     WorkerOptions(once=True, poll_s=0.01, after=after_job)):
        pass
    experiment = find_experiment(empty_lab, "opt")
    assert experiment.settings.primary == "optimal"  # read back from its row
    assert ExperimentSettings.model_validate(experiment.settings.model_dump(exclude={"primary"})).primary == "valid"
    c = comparison(empty_lab, "opt")
    assert c.rates == (Rate.OPTIMAL, Rate.VALID)
    assert c.estimate("heuristic", Rate.OPTIMAL, 1).values == (3 / 8, 5 / 8, 4 / 8)
    assert c.estimate("heuristic", Rate.VALID, 1).values == (6 / 8, 6 / 8, 7 / 8)
    sentence = ("heuristic does not differ from fixed beyond its interval (optimal rate at stage 1, Holm over 1 "
                "comparison).")
    optimal_row = ["heuristic - fixed", "1", "+4.17 [-13.76, +22.09]", "95.00%", "0.423", "0.423"]
    valid_row = ["heuristic - fixed", "1", "+25.00 [-6.05, +56.05]", "95.00%", "0.074", "0.074"]
    assert finding(c) == sentence
    report = report_markdown(c)
    assert report.startswith(f"# Experiment opt\n\n{sentence}\n\n") and "Primary metric: the optimal rate." in report
    sections = [line for line in report.splitlines() if line.startswith("## ")]
    assert sections[:5] == ["## Compute per arm", "## Validation optimal rate", "## Validation valid rate",
                            "## Optimal rate minus fixed, paired by seed (points): Holm-adjusted over 1 comparison "
                            "with fixed",
                            "## Valid rate minus fixed, paired by seed (points): Holm-adjusted over 1 comparison with "
                            "fixed"]
    assert "| heuristic | 12.5% [12.5, 12.5] (12.5, 12.5, 12.5) | 50.0% [18.9, 81.1] (37.5, 62.5, 50.0) |" in report
    assert "| " + " | ".join(optimal_row) + " |" in report and "| " + " | ".join(valid_row) + " |" in report
    view = compare_view(empty_lab, experiment.id)
    assert view["rate"] == Rate.OPTIMAL and f"\n\n{sentence}\n\n" in view["summary"]
    assert (view["primary"]["data"], view["secondary"]["data"]) == ([optimal_row], [valid_row])
    assert view["primary_label"].startswith("Optimal rate (the primary metric), stage 1: each arm minus fixed")
    assert view["secondary_label"].startswith("Valid rate, stage 1: each arm minus fixed")
    assert view["differences"]["data"][0][1] == "+4.17 [-13.76, +22.09]"  # the figure's rate: the optimal
    assert compare_view(empty_lab, experiment.id, Rate.VALID)["differences"]["data"][0][1] == "+25.00 [-6.05, +56.05]"


def timed_jobs(engine, experiment_id: int) -> None:
    """Every job of the experiment's runs made to take a known time: a stage job 60 s, a propose job 6 s for `fixed`
    and 30 s for `heuristic`, and one probe job more, of 120 s, on heuristic's seed 0."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    with session(engine) as s:
        runs = {r.id: r for r in s.exec(select(Run).where(Run.experiment_id == experiment_id))}
        for job in s.exec(select(Job).where(Job.run_id.in_(list(runs)))):
            seconds = 60 if job.kind == JobKind.STAGE else 6 if runs[job.run_id].arm == "fixed" else 30
            job.started_at, job.finished_at = start, start + timedelta(seconds=seconds)
            s.add(job)
        seed_0 = next(r.id for r in runs.values() if (r.arm, r.seed) == ("heuristic", 0))
        s.add(Job(kind=JobKind.PROBE, run_id=seed_0, target=1, status=JobStatus.DONE, started_at=start,
                  finished_at=start + timedelta(seconds=120)))
        s.commit()


def probed(engine, experiment_id: int, answers: int) -> None:
    """Each heuristic proposal sampled `answers` answers measuring configs (as the learnability engineer records
    them)."""
    with session(engine) as s:
        for proposal in s.exec(select(Proposal).join(Run, Run.id == Proposal.run_id)
                               .where(Run.experiment_id == experiment_id, Run.arm == "heuristic")):
            proposal.compute = {"completions": answers, "seconds": 1.5, "probes": 2, "cached": 0}
            s.add(proposal)
        s.commit()


def test_the_compute_table_sums_each_arm_s_runs_and_says_where_probes_break_equal_compute(empty_lab):
    """2 arms x 2 seeds of 1 stage on 8 boards, 4 generations each in batches of 32: 1 GRPO step and 32 rollouts a
    trained stage. Per run, stages 0 and 1 each answer 8 validation and 8 dev boards (32 answers) and its jobs
    take 2 x 60 s of stages and one proposal (6 s for fixed, 30 s for heuristic; `timed_jobs`). heuristic's 2
    proposals sample 16 answers each (`probed`): 32 on its 128 answers in training and evaluation, 25%, so 80
    answers a run against fixed's 64, 1.25x; with 3 each (6 of 128: 4.7%) it is not said, 1.05x."""
    experiment = scripted_experiment(empty_lab, seeds=2, stages=1)
    assert experiment.settings.steps_per_stage == 1
    timed_jobs(empty_lab, experiment.id)
    probed(empty_lab, experiment.id, answers=16)
    c = comparison(empty_lab, experiment.id)
    assert c.stage_rollouts == 32
    headers, rows = compute_rows(c)
    assert headers == ["arm", "runs", "GRPO steps (optimizer steps)",
                       "GRPO rollouts (completions sampled for training boards)",
                       "probe answers (completions sampled measuring configs)", "validation + dev answers (episodes)",
                       "stage jobs (min)", "propose jobs (min)", "probe jobs (min)",
                       "answers per run (rollouts + probe + validation + dev) vs the cheapest arm"]
    assert rows == [["fixed", "2", "2 (1)", "64 (32)", "0 (0)", "64 (32)", "4.0 (2.0)", "0.2 (0.1)", "0.0 (0.0)",
                     "1.00x"],
                    ["heuristic", "2", "2 (1)", "64 (32)", "32 (16)", "64 (32)", "4.0 (2.0)", "1.0 (0.5)", "2.0 (1.0)",
                     "1.25x"]]
    sentence = ("The arms are not at equal compute in answers: heuristic's probes add 25.0% to the 128 answers its "
                "runs generated in training and evaluation (1.25x the cheapest arm's answers per run).")
    assert answers_statement(c) == sentence
    report = report_markdown(c)
    lines = report.splitlines()
    statement = next(line for line in lines if line.startswith("Policy tiny, 2 arms x 2 seeds"))
    unmatched = ("Compute not matched: every arm trained the same GRPO steps, and heuristic's probe answers came on "
                 "top (`envlab experiment new --match-compute` gives the arms without probes extra GRPO steps for "
                 "them).")
    assert statement.endswith("heuristic sampled 32 answers in 3 s over 2 proposals; fixed spent none. " + unmatched
                              + " " + sentence)
    section = lines.index("## Compute per arm")
    assert lines.index(statement) < section < lines.index("## Validation valid rate")
    assert "A rollout: one completion GRPO samples for a training board, 32 per trained stage (32 per step)" in report
    assert lines[section + 4:section + 8] == ["| " + " | ".join(headers) + " |", "|---" * len(headers) + "|",
                                              *("| " + " | ".join(row) + " |" for row in rows)]
    view = compare_view(empty_lab, experiment.id)
    assert view["compute"] == {"headers": headers, "data": rows}
    assert sentence in view["summary"]
    probed(empty_lab, experiment.id, answers=3)
    c = comparison(empty_lab, experiment.id)
    assert compute_rows(c)[1][1][4:] == ["6 (3)", "64 (32)", "4.0 (2.0)", "1.0 (0.5)", "2.0 (1.0)", "1.05x"]
    assert answers_statement(c) == "" and "not at equal compute" not in report_markdown(c)


def test_a_study_under_way_counts_its_evaluated_stages_and_says_its_compute_is_so_far(empty_lab):
    """4 runs of 1 stage, one of them back at work with its stage 1 not evaluated: 3 of 4 runs done and 7 of 8
    stages evaluated (stage 0 counts), in the report and the tab, and the compute is what was spent so far."""
    from sqlalchemy import delete, update

    from storage.models import StageMetric

    experiment = scripted_experiment(empty_lab, seeds=2, stages=1)
    run = experiment_runs(empty_lab, experiment.id)[-1]
    with session(empty_lab) as s:
        s.exec(delete(StageMetric).where(StageMetric.run_id == run.id, StageMetric.stage_index == 1))
        s.exec(update(Stage).where(Stage.run_id == run.id, Stage.index == 1).values(status="queued"))
        s.exec(update(Run).where(Run.id == run.id).values(status="active"))
        s.commit()
    c = comparison(empty_lab, experiment.id)
    assert not c.ended and c.progress_text() == ", 7 of 8 stages evaluated"
    report = report_markdown(c)
    assert "\nRuns: 3 of 4 done, 7 of 8 stages evaluated. Arms: fixed (fixed), heuristic (heuristic)." in report
    assert ("## Compute per arm\n\nRuns go on: what they spent so far, the mean over every run of the arm, begun "
            "or not. Each cell: the sum") in report
    summary = compare_view(empty_lab, experiment.id)["summary"]
    assert summary.startswith("**cmp**: 3 of 4 runs done, 7 of 8 stages evaluated; time left: about 0.0 h over one "
                              "worker (none is running its jobs now) (1 trained stage at 0.0 min; each a median of "
                              "this experiment's).\n\n")
    assert "Last, what every arm spent so far, summed over its runs" in summary


MIXED_BOARDS = [label(OPEN), label(CROSSING), label(Instance.from_str("A.a\nB.b\nC.c")),
                label(Instance.from_str("A..a\nB..b\nC..c\n...."))]  # 2, 2, 3 and 3 agents
# Stage 1's boards answered right (the reference plan), by arm and seed: (2-agent boards, 3-agent boards); stage 0
# answers every board wrong
MIXED_RIGHT = {("fixed", 0): (2, 0), ("fixed", 1): (1, 0), ("heuristic", 0): (2, 2), ("heuristic", 1): (2, 1)}


def mixed_stage(engine, job, progress):
    """The stage job without training, on validation boards of 2 and 3 agents (`MIXED_RIGHT`)."""
    payload = StagePayload.of(job)
    run_id, k = payload.run_id, payload.stage_index
    with session(engine) as s:
        run = s.get(Run, run_id)
        two, three = (0, 0) if k == 0 else MIXED_RIGHT[(run.arm, run.seed)]
        right = [*MIXED_BOARDS[:two], *MIXED_BOARDS[2:2 + three]]
        results = [EpisodeResult(b, text := format_plan(b.reference_plan) if b in right else "no idea",
                                 score_answer(b, text)) for b in MIXED_BOARDS]
        store_evaluation(s, run_id, k, "validation", results)
        stage = s.exec(select(Stage).where(Stage.run_id == run_id, Stage.index == k)).one()
        stage.status, stage.checkpoint = "done", f"{run.uuid}/stage-{k}"
        s.add(stage)
        s.commit()
    return {"stage_index": k}


def test_validation_boards_of_two_agent_counts_give_each_count_s_rate_in_the_report_and_the_tab(empty_lab):
    experiment = create_experiment(empty_lab, name="mix", arms=["fixed", "heuristic"], seeds=2, config=CONFIG,
                                   settings=RunSettings(stages=1, validation_boards=4))
    while run_worker(empty_lab, {"stage": mixed_stage, "propose": run_propose_job},
                     WorkerOptions(once=True, poll_s=0.01, after=after_job)):
        pass
    c = comparison(empty_lab, experiment.id)
    assert c.agents == [2, 3]
    assert c.agents_estimate("fixed", Rate.VALID, 1, 2).values == (1.0, 0.5)
    assert c.agents_estimate("fixed", Rate.VALID, 1, 3).values == (0.0, 0.0)
    assert c.agents_estimate("heuristic", Rate.OPTIMAL, 1, 3).values == (1.0, 0.5)
    assert c.estimate("heuristic", Rate.VALID, 1).values == (1.0, 0.75)  # pooled over sizes and counts as before
    assert c.estimate("fixed", Rate.VALID, 1, 3).values == (2 / 3, 1 / 3)  # 3x3: the 2-agent boards and a 3-agent one
    t = stats.t.ppf(0.975, 1) * np.std([1.0, 0.5], ddof=1) / np.sqrt(2)  # the interval of (100%, 50%)
    rows = [["fixed", f"75.0% [{(0.75 - t) * 100:.1f}, {(0.75 + t) * 100:.1f}]", "0.0% [0.0, 0.0]"],
            ["heuristic", "100.0% [100.0, 100.0]", f"75.0% [{(0.75 - t) * 100:.1f}, {(0.75 + t) * 100:.1f}]"]]
    report = report_markdown(c)
    section = report[report.index("## Stage 1 by agent count (valid rate)"):].splitlines()
    assert section[4:8] == ["| arm | 2 agents | 3 agents |", "|---|---|---|", "| " + " | ".join(rows[0]) + " |",
                            "| " + " | ".join(rows[1]) + " |"]
    view = compare_view(empty_lab, experiment.id)
    assert [row[0] for row in view["sizes"]["data"]] == ["3x3", "4x4", "all", "2 agents", "3 agents"]
    assert view["sizes"]["data"][3:] == [["2 agents", rows[0][1], rows[1][1]], ["3 agents", rows[0][2], rows[1][2]]]
    assert view["sizes_label"].startswith("Last stage by map size, then by agent count")
