"""The page's actions as a person does them in a browser, each timed from its click to the page showing its result,
for the browser's speed figures (benchmarks/bench_page.py) and the walk through every tab (`Walk.every_tab`, which
tests/benchmarks/test_bench_page.py takes beside the same stage).

Each action first brings the page where the person would be (a fresh load, untimed), then clicks and waits for what
the action shows: the run's status, the proposal's, the gallery's failure row, the replay's board at its first or
last step, the decision's message, the edit check's line, an experiment's curves. The clock is the page's own: from
the press that makes the action (the last pointer or key press in the page: the option picked, not the click that
opened the dropdown) to the moment the result was seen drawn, so the time Playwright takes to find, wait for and
press an element on a busy machine is no part of the page's figure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lab.pages.episode import PLAY_S
from tests.seeded import propose
from tests.servers import goto

TIMEOUT_MS = 60_000
BUSY = ".pending, .eta-bar, .progress-text, .meta-text"  # what Gradio shows while an event of the page runs

ERRORS_SEEN = """() => {
    window.__errors = [];
    const seen = e => window.__errors.push(e.textContent.trim().slice(0, 300) + " @ " +
                                           (e.closest("[id]") ? e.closest("[id]").id : ""));
    new MutationObserver(records => {
        for (const r of records) for (const n of r.addedNodes) {
            if (!(n instanceof Element)) continue;
            for (const e of [n, ...n.querySelectorAll('[data-testid="toast-body"], .error')]) {
                if (e.matches('[data-testid="toast-body"], .toast-body.error, .wrap .error')) seen(e);
            }
        }
    }).observe(document, {childList: true, subtree: true});
}"""


ACTED = """() => {
    window.__acted = null;  // when the last press in the page happened (performance.now())
    for (const kind of ["pointerdown", "keydown"]) {
        document.addEventListener(kind, () => { window.__acted = performance.now(); }, true);
    }
}"""


def open_run_pick(page, label: str) -> None:
    """Pick a run in the "Open run" dropdown above the tabs, as a person does."""
    page.locator("#run-pick input").click()
    page.get_by_role("option", name=label, exact=False).first.click()


@dataclass
class Walk:
    """The page at `url` over the seeded lab (`ids` from `tests.seeded.seed_lab`, plus `big`: a stored
    10x10 episode, and `experiment`: an experiment of `arms` arms and `experiment_runs` runs, all done) in the
    Playwright `page`. `waits`: the history run's proposal that waits for a decision."""

    page: Any
    url: str
    engine: Any
    ids: dict[str, int]
    waits: list[int] = field(default_factory=list)
    turn: int = 0
    leaving: Callable[[], Any] | None = None  # called before each fresh load (what the page showed is read then)

    def __post_init__(self) -> None:
        self.waits = [self.ids["second"]]
        self.page.add_init_script(f"({ACTED})()")  # every page loaded from now on keeps its last press's time

    def settle(self, quiet_s: float = 0.5) -> None:
        """Until no event of the page is in flight (no progress shown) for `quiet_s`: what the page does as it
        loads is not the action's time."""
        deadline, quiet_since = time.monotonic() + TIMEOUT_MS / 1000, None
        while time.monotonic() < deadline:
            busy = self.page.evaluate(f"() => document.querySelectorAll('{BUSY}').length")
            now = time.monotonic()
            quiet_since = None if busy else (quiet_since or now)
            if quiet_since is not None and now - quiet_since >= quiet_s:
                return
            time.sleep(0.05)

    def load(self, query: str, ready: str) -> None:
        """A fresh page at `?query`, ready when `ready` (a text) is on it and its loading events are done."""
        if self.leaving is not None:
            self.leaving()
        goto(self.page, f"{self.url}?{query}")
        self.page.get_by_text(ready).first.wait_for(state="attached", timeout=TIMEOUT_MS)
        self.settle()

    def load_run(self, run_id: int) -> None:
        """A fresh page with the run open (in the "Open run" dropdown), on the Runs tab."""
        if self.leaving is not None:
            self.leaving()
        goto(self.page, f"{self.url}?run={run_id}")
        self.page.wait_for_function(f"""() => {{ const i = document.querySelector('#run-pick input');
                                                 return i && i.value.startsWith('#{run_id} '); }}""",
                                    timeout=TIMEOUT_MS)
        self.settle()

    def timed(self, click: Callable[[], Any], *shown: Callable[[], Any]) -> float:
        """Seconds from the press `click` makes to the last of `shown` seen, on the page's clock (on the driver's,
        from the call of `click`, where the page saw no press)."""
        self.page.evaluate("() => { window.__acted = null; }")
        t0 = time.perf_counter()
        click()
        for wait in shown:
            wait()
        driver = time.perf_counter() - t0
        in_page = self.page.evaluate("() => window.__acted === null ? null : performance.now() - window.__acted")
        return driver if in_page is None else in_page / 1000

    def text(self, selector: str, text: str) -> Callable[[], Any]:
        """Waits for `text` in `selector`, drawn (in the tab shown or one behind it)."""
        return lambda: self.page.locator(selector).get_by_text(text).first.wait_for(state="attached",
                                                                                     timeout=TIMEOUT_MS)

    def open_run(self) -> float:
        """From one run to the other in the "Open run" dropdown, on the Train tab: the tab shown redrawn (waited
        for: its status; the other tabs a run fills are drawn when opened)."""
        self.turn += 1
        first, then = ((self.ids["history"], self.ids["waiting"]) if self.turn % 2
                       else (self.ids["waiting"], self.ids["history"]))
        self.load_run(first)
        self.page.get_by_role("tab", name="Train").click()
        self.text("#train-status", f"Run #{first} ")()
        self.settle()
        return self.timed(lambda: open_run_pick(self.page, f"#{then} "), self.text("#train-status", f"Run #{then} "))

    def open_proposal(self) -> float:
        """Another proposal of the run in the Proposal tab's dropdown: its status drawn (with its diff, by the same
        event)."""
        self.load(f"proposal={self.waits[0]}", f"Proposal #{self.waits[0]}")
        other = self.ids["accepted"]

        def pick() -> None:
            self.page.locator("#proposal-pick input").click()
            self.page.get_by_role("option", name=f"#{other} ", exact=False).first.click()
        return self.timed(pick, self.text("#proposal-status", f"Proposal #{other}"))

    def first_visit_to_review(self) -> float:
        """The Stage review tab opened for the first time since the page loaded: its failure gallery drawn."""
        history = self.ids["history"]
        self.load_run(history)
        return self.timed(lambda: self.page.get_by_role("tab", name="Stage review").click(),
                          lambda: self.page.locator("#gallery [role=gridcell]", has_text="vertex_conflict")
                          .first.wait_for(timeout=TIMEOUT_MS))

    def failure_to_replay(self) -> float:
        """A failure row of the Stage review gallery clicked, the tab drawn (its four plots follow its gallery): the
        Episode tab shows its replay at t = 0."""
        self.first_visit_to_review()
        self.page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')]"
                                    ".filter(d => d.data && d.data.length && d.offsetParent).length === 4",
                                    timeout=TIMEOUT_MS)
        self.settle()
        clash = self.ids["clash"]
        row = self.page.locator("#gallery [role=gridcell]", has_text="vertex_conflict").first
        return self.timed(lambda: row.click(),
                          lambda: self.page.get_by_text(f"Episode {clash}").first.wait_for(timeout=TIMEOUT_MS),
                          lambda: self.page.wait_for_function(
                              "() => { const d = document.querySelector('#replay .js-plotly-plot');"
                              " return d && d.data && d.data.some(t => t.name === 'agent 0'); }",
                              timeout=TIMEOUT_MS))

    def play_to_the_end(self, steps: int) -> float:
        """Play on the stored 10x10 episode, to its last step (the button says Play again): the figure is the time
        beyond the replay's own pace (`steps` x PLAY_S)."""
        big = self.ids["big"]
        self.load(f"episode={big}", f"Episode {big}")
        play = self.page.locator("#replay-play")
        seconds = self.timed(lambda: play.click(), lambda: play.get_by_text("Pause").wait_for(timeout=TIMEOUT_MS),
                             lambda: self.page.wait_for_function(
                                 f"() => document.querySelector('#replay-step input[type=number]').value == '{steps}'",
                                 timeout=TIMEOUT_MS + int(steps * PLAY_S * 1000)),
                             lambda: play.get_by_text("Play").wait_for(timeout=TIMEOUT_MS))
        return max(seconds - steps * PLAY_S, 0.0)

    def decision(self) -> float:
        """Reject and ask again, on the proposal that waits: the decision's message shown. Then (untimed) the
        engineer's next proposal, for the next decision."""
        pending = self.waits[0]
        self.load(f"proposal={pending}", "Waiting for a decision")
        seconds = self.timed(lambda: self.page.click("#reject"),
                             self.text("#decision-msg", f"Proposal #{pending} rejected by"))
        self.waits[0] = propose(self.engine, self.ids["history"])
        return seconds

    def edit_check(self) -> float:
        """One cell of the edit table typed (a hole ratio): the line saying what "Apply my edit" would store."""
        self.turn += 1
        pending = self.waits[0]
        self.load(f"proposal={pending}", "Waiting for a decision")
        self.page.get_by_text("Edit before applying").click()
        cell = self.page.locator('#edit-config [data-testid="cell-0-2"]')
        cell.dblclick()
        typed = cell.locator("textarea, input").first
        typed.fill("0.35" if self.turn % 2 else "0.25")
        return self.timed(lambda: typed.press("Enter"), self.text("#edit-check", "will store"))

    def compare(self) -> float:
        """The Compare tab opened for the first time since the page loaded: the seeded experiment (`experiment`, of
        `arms` arms) drawn, its summary and one curve per arm."""
        self.load_run(self.ids["history"])
        return self.timed(lambda: self.page.get_by_role("tab", name="Compare").click(), *self.compare_drawn())

    def compare_drawn(self) -> list[Callable[[], Any]]:
        """Waits for the Compare tab to show the seeded experiment: its summary and one curve per arm."""
        done = f"{self.ids['experiment_runs']} of {self.ids['experiment_runs']} runs done"
        curves = ("() => { const d = document.querySelector('#compare-curves .js-plotly-plot'); return d && d.data &&"
                  f" d.data.filter(t => t.mode === 'lines+markers').length === {self.ids['arms']}; }}")
        return [self.text("#compare-summary", done),
                lambda: self.page.wait_for_function(curves, timeout=TIMEOUT_MS)]

    def every_tab(self, steps: int) -> None:
        """A walk through every tab clicking what only reads, while the stage beside the page trains: the run whose
        stage trains opened on the Train tab (its progress bar running), the Runs table, a proposal with its edit
        table and its whole diff, Stage review's failure row to its replay played to its end (`steps`), the
        Playground's board and solver, the Leaderboard, Compare; then a poll or two."""
        from lab.pages.web import POLL_S

        page = self.page
        self.turn = 0
        self.open_run()  # from the history run to the waiting one, whose stage trains (tests/stage_beside.py)
        page.wait_for_function("() => { const b = document.querySelector('#job-progress');"
                               " return b && b.dataset.status === 'running' && Number(b.dataset.step) > 0; }",
                               timeout=TIMEOUT_MS)
        page.get_by_role("tab", name="Runs").click()
        page.locator("#runs-table").get_by_text("curriculum").wait_for(timeout=TIMEOUT_MS)
        self.open_proposal()
        page.get_by_text("Edit before applying").click()  # opened, nothing typed
        page.click("#changed-only")  # every value of the diff, then only the changed ones again
        page.click("#changed-only")
        self.failure_to_replay()  # Stage review first, then its failure row to the Episode tab
        self.play_to_the_end(steps)
        page.get_by_role("tab", name="Playground").click()
        page.locator("#pg-board-plot .js-plotly-plot").wait_for(timeout=TIMEOUT_MS)  # the first visit's read
        page.get_by_role("button", name="Read board").click()
        page.get_by_role("button", name="Use the solver's plan").click()
        page.wait_for_function("() => document.querySelector('#pg-plan textarea').value.includes('Agent 0:')",
                               timeout=TIMEOUT_MS)
        assert "Agent 1:" in page.locator("#pg-plan textarea").input_value()
        page.locator("#pg-verdict").get_by_text("valid", exact=False).first.wait_for(timeout=TIMEOUT_MS)
        page.get_by_role("tab", name="Leaderboard").click()
        page.locator("#lb-reference [role=gridcell]").first.wait_for(timeout=TIMEOUT_MS)
        page.get_by_role("tab", name="Compare").click()
        page.click("#compare-refresh")
        for wait in self.compare_drawn():
            wait()
        time.sleep(2 * POLL_S)  # a poll or two of the page while the stage still writes

    def actions(self, steps: int) -> dict[str, Callable[[], float]]:
        """Every action the page's speed is judged by, by name."""
        return {"open a run (the tab shown)": self.open_run,
                "open a proposal (with its boards)": self.open_proposal,
                "first visit to Stage review": self.first_visit_to_review,
                "a failure row to its replay": self.failure_to_replay,
                f"Play to the end, 10x10 ({steps} steps): beyond its pace": lambda: self.play_to_the_end(steps),
                "a decision (reject and ask again)": self.decision,
                "the live edit check (one cell typed)": self.edit_check,
                "Compare (an experiment drawn)": self.compare}
