"""The README's screenshots: one PNG per tab of the web lab, taken from the real page on a real small run.

A temporary SQLite database gets one run of the shipped `tiny` policy with the heuristic engineer, trained
here by the lab's own worker functions: stage 0 evaluated, the engineer's first proposal accepted, stage 1
trained and evaluated, and the engineer's second proposal left waiting for a person (a few minutes on a
CPU). The page is served on it and Debian's Chromium, driven by Playwright, opens each tab and saves
`docs/screenshots/<tab>.png` (1280x800, the visible part of the page, in 256 colours).

The Compare tab needs an experiment, which that one run is not: its picture is taken on the lab's study
(`--study`, by default `docs/results/second-pass/study.db.gz`, gunzipped to a temporary file) served by a second
short server, with its newest experiment (`second-pass`) selected and its curves drawn.

    python docs/screenshots.py [--out docs/screenshots] [--db /tmp/shots.db] [--study FILE] [--only compare]

With `--db`, the run is built in that file the first time and reused on the next calls (to retake the
pictures after a change to the page without training again). `--only` takes a comma-separated list of
pictures (`runs,stage-review,episode,proposal,train,playground,leaderboard,compare`); `--only compare` needs
no run at all, so it trains nothing. `--study ''` leaves the Compare picture out.

Needs `pip install playwright` and `apt-get install chromium` (never `playwright install`).
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from envsim.config import EnvConfig
from lab.jobs.worker import WorkerOptions, handlers, run_worker
from lab.loop import Step, advance, after_job, create_run, decide_and_advance
from lab.pages import web as app
from lab.proposals import proposal_states
from lab.runs import failed_episodes, run_list
from storage.db import make_engine, session, upgrade
from storage.models import RunStatus
from storage.settings import RunSettings

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]
VIEWPORT = {"width": 1280, "height": 800}
SETTLE_S = 2.0  # after a tab shows its content: plots finish drawing
STUDY = Path(__file__).resolve().parent / "results" / "second-pass" / "study.db.gz"
RUN_SHOTS = ("runs", "stage-review", "episode", "proposal", "train", "playground", "leaderboard")


@dataclass
class Args:
    out: str = str(Path(__file__).resolve().parent / "screenshots")
    db: str = ""  # default: a temporary file; a file that holds the run already is reused
    instances: int = 64
    validation_boards: int = 48
    threads: int = 2
    study: str = str(STUDY) if STUDY.exists() else ""  # an experiment's database (.db or .db.gz); '' = no compare.png
    only: str = ""  # comma-separated pictures to take; '' = all of them


def until_waiting(engine, run_id: int) -> Step:
    """Run the run's jobs in this process until it waits for a person (or ends)."""
    work = handlers()
    while True:
        state = advance(engine, run_id)
        print(f"run {run_id}: {state.text}", file=sys.stderr, flush=True)
        if state.status != RunStatus.ACTIVE:
            return state
        run_worker(engine, work, WorkerOptions(once=True, after=after_job))


def pending_proposal(engine, run_id: int) -> int:
    return next(p.proposal.id for p in proposal_states(engine, run_id) if p.pending)


def build_run(engine, args: Args) -> int:
    """A real small run: stage 0, an accepted proposal, stage 1, a proposal waiting."""
    config = EnvConfig.default(sizes=(3, 4, 5), num_instances=args.instances)
    with session(engine) as s:
        run_id = create_run(s, name="first run", config=config, settings=RunSettings(stages=2,
                            validation_boards=args.validation_boards), engineer="heuristic",
                            description="the tiny policy, the heuristic engineer, two stages").id
    until_waiting(engine, run_id)
    decide_and_advance(engine, pending_proposal(engine, run_id), "accept", "local", note="looks sensible")
    state = until_waiting(engine, run_id)
    if state.status != RunStatus.WAITING:
        raise SystemExit(f"the run should wait for a decision after stage 1, but it is {state.text}")
    return run_id


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def save(page, path: Path) -> Path:
    """The visible part of the page as a PNG in 256 colours (a third of the bytes, no visible change on a UI)."""
    page.screenshot(path=str(path))
    with Image.open(path) as shot:
        small = shot.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)
    print(f"{path} ({path.stat().st_size // 1024} KB)", file=sys.stderr, flush=True)
    return path


def shoot(url: str, run_id: int, episode_id: int, proposal_id: int, out: Path,
          names: tuple[str, ...] = RUN_SHOTS) -> list[Path]:
    """Open each tab in Chromium, wait for its content, save its PNG; returns the files."""
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    shots = [  # (file, address, tab, text that shows the tab has its content)
        ("runs", f"?run={run_id}", "Runs", "first run"),
        ("stage-review", f"?run={run_id}", "Stage review", "Failure gallery"),
        ("episode", f"?episode={episode_id}", "Episode", f"Episode {episode_id}"),
        ("proposal", f"?proposal={proposal_id}", "Proposal", f"Proposal #{proposal_id}"),
        ("train", f"?run={run_id}", "Train", "Stage 1 results"),
        ("playground", f"?run={run_id}", "Playground", "Plan (one line per agent)"),
        ("leaderboard", f"?run={run_id}", "Leaderboard", "LLM-as-Environment-Engineer"),
    ]
    files = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        page.set_default_timeout(30_000)
        for name, address, tab, marker in shots:
            if name not in names:
                continue
            page.goto(url + address)
            page.get_by_role("tab", name=tab).click()
            page.get_by_text(marker).filter(visible=True).first.wait_for()
            if name != "runs":  # the tab bar at the top: more of the tab, less of the header above it
                page.locator("#tabs").evaluate("tabs => window.scrollTo(0, tabs.offsetTop - 8)")
            time.sleep(SETTLE_S)
            files.append(save(page, out / f"{name}.png"))
        browser.close()
    return files


def shoot_compare(url: str, out: Path) -> Path:
    """The Compare tab on a study's database: its newest experiment selected (the tab picks it) and drawn."""
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        page.set_default_timeout(30_000)
        page.goto(url)
        page.get_by_role("tab", name="Compare").click()
        page.locator("#compare-summary").get_by_text("runs done").first.wait_for()
        page.locator("#compare-curves .js-plotly-plot .scatterlayer .trace").first.wait_for()
        page.locator("#tabs").evaluate("tabs => window.scrollTo(0, tabs.offsetTop - 8)")
        time.sleep(SETTLE_S)
        path = save(page, out / "compare.png")
        browser.close()
    return path


def compare_shot(study: str, out: Path) -> Path:
    """Serve the page on a copy of the study's database (gunzipped when it ends in .gz) and take compare.png."""
    db = Path(tempfile.mkdtemp(prefix="envlab-study-")) / "study.db"
    with (gzip.open if study.endswith(".gz") else open)(study, "rb") as src, open(db, "wb") as dst:
        shutil.copyfileobj(src, dst)
    engine = make_engine(str(db))
    upgrade(engine)
    demo = app.build_demo(engine)
    port = free_port()
    app.launch(demo, port=port, block=False)
    try:
        return shoot_compare(f"http://127.0.0.1:{port}/", out)
    finally:
        demo.close()
        engine.dispose()
        shutil.rmtree(db.parent, ignore_errors=True)


def main(args: Args) -> None:
    torch.set_num_threads(args.threads)
    names = tuple(n.strip() for n in args.only.split(",") if n.strip()) or (*RUN_SHOTS, "compare")
    unknown = set(names) - {*RUN_SHOTS, "compare"}
    if unknown:
        raise SystemExit(f"--only: no picture called {', '.join(sorted(unknown))}")
    if "compare" in names:
        if args.study:
            compare_shot(args.study, Path(args.out))
        elif args.only:
            raise SystemExit("--only compare needs --study (an experiment's database)")
    run_names = tuple(n for n in names if n in RUN_SHOTS)
    if not run_names:
        return
    db = args.db or str(Path(tempfile.mkdtemp(prefix="envlab-shots-")) / "envlab.db")
    engine = make_engine(db)
    upgrade(engine)
    t0 = time.perf_counter()
    built = run_list(engine)
    run_id = built[-1].run.id if built else build_run(engine, args)
    print(f"the run is ready in {db} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    episode_id = failed_episodes(engine, run_id, 1, limit=1)[0][0].id
    demo = app.build_demo(engine)
    port = free_port()
    app.launch(demo, port=port, block=False)
    try:
        shoot(f"http://127.0.0.1:{port}/", run_id, episode_id, pending_proposal(engine, run_id), Path(args.out),
              run_names)
    finally:
        demo.close()
        engine.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in vars(Args()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    main(Args(**vars(parser.parse_args())))
