"""The envlab web lab: review, replay and steer runs in the browser.

`python app.py` (or `envlab serve`) opens the lab on the embedded defaults: the SQLite file `runs/envlab.db`
(or `--db` / `$ENVLAB_DB`), one worker process beside the page, the `tiny` policy. The page only reads rows
and calls `lab`, `envsim` and `storage`: it queues jobs and a worker trains (docs/loop.md). Per-user state
(the open episode, the playground's board) lives in `gr.State`; everything else is in the database, which
the page polls with `gr.Timer`.

A worker is started beside the page unless `--no-worker` is given or one is visibly at work: a running job
whose heartbeat is fresh. An idle worker writes nothing (a worker has no row of its own), so a lab whose
worker idles on another machine gets a second one here; that is harmless, as claims are exclusive.

The callbacks are plain functions of `(engine, ...)` returning values for the widgets, so tests call them
without a browser; `build_demo` wires them to widgets.
"""

from __future__ import annotations

import argparse
import atexit
import errno
import html
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np
from sqlalchemy import Engine
from sqlmodel import select

from envsim.config import KNOB_HELP, KNOBS, ConfigError, EnvConfig, project
from envsim.generator import GenerationError, generate, random_board, round_half_up
from envsim.instance import Instance
from envsim.rules import MIN_SIZE
from envsim.scoring import Outcome, score_answer
from envsim.solver import Unsolved, label
from envsim.suite import Entry, Split, report
from lab import figures
from lab.engineers import ENGINEERS
from lab.loop import LoopError, advance, cancel, create_run, jobs_of, resume, set_auto_apply, stages_of, switch_engineer
from lab.loop import queue_benchmark as loop_queue_benchmark
from lab.proposals import AlreadyDecided, ProposalError, decide, decision_of, superseded_by
from storage.db import make_engine, session, upgrade
from storage.models import (
    ACTIVE_JOB,
    Episode,
    Job,
    JobStatus,
    Proposal,
    Run,
    RunStatus,
    StageMetric,
    StageStatus,
    TrainingLog,
    utcnow,
)
from storage.queue import stale_after_s

ASSETS = Path(__file__).parent / "assets"
KNOB_COLUMNS = ["size", *KNOBS]
QUEUE_PATIENCE_S = 20  # a job queued longer than this with nobody running anything: the worker looks down
POLL_S = 2.0
PLAY_S = 0.6
ALL = "all"
DECIDED = {"accept": "accepted", "edit": "edited", "reject": "rejected", "auto": "auto-applied"}


def _table(headers: list[str], rows: list[list[Any]]) -> dict[str, Any]:
    return {"headers": headers, "data": rows}


def user_of(request: gr.Request | None) -> str:
    """Who clicked: the login name under `--auth`, else "local"."""
    return (getattr(request, "username", None) or "local") if request is not None else "local"


def _when(t) -> str:
    return f"{t:%Y-%m-%d %H:%M:%S} UTC" if t else "-"


def _ago(t) -> str:
    seconds = (utcnow() - t).total_seconds()
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


def outcome_of(ep: Episode, instance: Instance) -> Outcome:
    """The stored outcome, or the answer scored again when the row holds no replayable one."""
    if ep.outcome and "positions" in ep.outcome:
        return Outcome.from_dict(ep.outcome)
    return score_answer(instance, ep.completion)


# ---------------------------------------------------------------- the worker beside the page


def worker_status(engine: Engine) -> tuple[str, str]:
    """Whether a worker is picking up jobs, read from the jobs table: (state, one line for a person), state
    one of "busy", "down", "waiting", "idle"."""
    now = utcnow()
    with session(engine) as s:
        running = list(s.exec(select(Job).where(Job.status == JobStatus.RUNNING).order_by(Job.id)))
        queued = list(s.exec(select(Job).where(Job.status == JobStatus.QUEUED).order_by(Job.id)))
    fresh = [j for j in running if j.heartbeat_at and now - j.heartbeat_at < timedelta(seconds=stale_after_s())]
    if fresh:
        j = fresh[0]
        step = f", step {j.step}/{j.total}" if j.total else ""
        more = f"; {len(queued)} queued" if queued else ""
        return "busy", f"Worker busy: {j.kind} job {j.id}{step} (heartbeat {_ago(j.heartbeat_at)}){more}."
    if running:
        j = running[0]
        return "down", (f"Job {j.id} ({j.kind}) has sent no heartbeat since {_ago(j.heartbeat_at)}: its worker "
                f"({j.worker}) seems to be down. Start one with `envlab worker`; it fails the stale job, "
                "and the Train tab can queue it again.")
    if queued:
        waited = (now - queued[0].created_at).total_seconds()
        if waited > QUEUE_PATIENCE_S:
            return "down", (f"{len(queued)} job(s) queued, the oldest for {waited:.0f} s, and no worker has taken "
                    "one: no worker seems to be running. Start one with `envlab worker`.")
        return "waiting", f"{len(queued)} job(s) queued, waiting for a worker."
    return "idle", "Worker idle: no jobs queued."


def worker_badge(engine: Engine) -> str:
    state, text = worker_status(engine)
    return f'<div class="worker {state}"><span class="dot"></span>{html.escape(text)}</div>'.replace(
        "`envlab worker`", "<code>envlab worker</code>")


def worker_busy(engine: Engine) -> bool:
    return worker_status(engine)[0] == "busy"


def start_worker(db: str | None) -> subprocess.Popen:
    """`envlab worker` as a child process on the same database; it stops when the page stops."""
    env = dict(os.environ)
    if db:
        env["ENVLAB_DB"] = db
    proc = subprocess.Popen([sys.executable, "-m", "lab.cli", "worker"], env=env)  # same working directory

    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()

    atexit.register(stop)
    return proc


# ---------------------------------------------------------------- runs


def run_choices(engine: Engine) -> list[tuple[str, int]]:
    with session(engine) as s:
        runs = list(s.exec(select(Run).order_by(Run.id.desc())))
    return [(f"#{r.id} {r.name} ({r.status})", r.id) for r in runs]


def runs_table(engine: Engine) -> dict[str, Any]:
    rows = []
    with session(engine) as s:
        for r in s.exec(select(Run).order_by(Run.id.desc())):
            stages = stages_of(s, r.id)
            done = sum(st.status == StageStatus.DONE for st in stages)
            engineer = r.engineer + (f" ({r.engineer_backend})" if r.engineer_backend else "")
            rows.append([r.id, r.name, r.status, r.policy, engineer,
                         f"{max(done - 1, 0)}/{r.settings.get('stages', '?')} trained",
                         "on" if r.settings.get("auto_apply") else "off", _when(r.created_at)])
    return _table(["id", "name", "status", "policy", "engineer", "stages", "auto-apply", "created"], rows)


def config_rows(config: EnvConfig) -> list[list[Any]]:
    return [[row["size"], *(round(row[k], 4) for k in KNOBS)] for row in config.knob_rows()]


def _number_or_text(value: Any) -> Any:
    """A table cell as a number when it reads as one; otherwise as typed, so the validator can name it."""
    if isinstance(value, int | float):
        return value
    try:
        return float(str(value).strip())
    except ValueError:
        return value


def config_from_table(rows: Sequence[Sequence[Any]], num_agents: Any, num_instances: Any) -> dict[str, Any]:
    """The raw config a person typed: one row per size; checked later by `project(..., strict=True)`."""
    raw: dict[str, Any] = {k: {} for k in KNOBS}
    for row in rows:
        if not row or all(str(v).strip() == "" for v in row):
            continue
        size = str(row[0]).strip().removesuffix(".0")
        for knob, value in zip(KNOBS, row[1:], strict=False):
            raw[knob][size] = _number_or_text(value)
    raw["num_agents"] = _number_or_text(num_agents)
    raw["num_instances"] = _number_or_text(num_instances)
    return raw


def create_run_from_form(engine: Engine, name: str, description: str, policy: str, engineer: str, backend: str,
                         base_url: str, stages: Any, instances: Any, agents: Any, seed: Any, auto_apply: bool,
                         table: Sequence[Sequence[Any]]) -> tuple[str, int | None]:
    """Validate the form, store the run and queue its stage 0; returns (message, new run id or None)."""
    name, description, policy, backend, base_url = ((v or "").strip() for v in (name, description, policy, backend,
                                                                               base_url))  # hidden fields send None
    try:
        config = project(config_from_table(table, agents, instances), strict=True).config
    except ConfigError as err:
        return "✗ The initial config is not valid, nothing was stored: " + "; ".join(err.problems), None
    try:
        with session(engine) as s:
            run = create_run(s, name=name or "run", description=description, config=config, stages=int(stages),
                             policy=policy or "tiny", engineer=engineer, engineer_backend=backend,
                             auto_apply=bool(auto_apply), seed=int(seed or 0), base_url=base_url or None)
    except (LoopError, ValueError, TypeError) as err:
        return f"✗ Not created: {err}", None
    return (f"✓ Created run #{run.id} **{run.name}**: stage 0 (the starting policy, evaluated on the "
            "validation set) is queued. Follow it in the Train tab."), run.id


# ---------------------------------------------------------------- stage review


def _metric_dicts(rows: Sequence[StageMetric]) -> list[dict[str, Any]]:
    return [{"size": m.size, "episodes": m.episodes, "valid": m.valid, "optimal": m.optimal,
             "failures": m.failures} for m in rows]


def _metrics(s, run_id: int, split: Split = Split.VALIDATION) -> dict[int, list[StageMetric]]:
    out: dict[int, list[StageMetric]] = {}
    query = select(StageMetric).where(StageMetric.run_id == run_id, StageMetric.split == split)
    for m in s.exec(query.order_by(StageMetric.stage_index, StageMetric.size)):
        out.setdefault(m.stage_index, []).append(m)
    return out


def _share(rows: Sequence[StageMetric], key: str) -> str:
    n = sum(m.episodes for m in rows)
    return f"{sum(getattr(m, key) for m in rows) / n:.1%}" if n else "-"


def review(engine: Engine, run_id: int | None, stage_index: int | None) -> dict[str, Any]:
    """Everything the Stage review tab shows for one stage of a run (default: the latest evaluated)."""
    empty = figures.empty_figure
    if run_id is None:
        note = "No run is open: create one in the Runs tab or pick one above."
        return dict(note=note, stages=[], stage=None, table=_table(["stage"], []), rates=empty(note),
                    curves=empty(note), failures=empty(note), training=empty(note), sizes=[], kinds=[])
    with session(engine) as s:
        stages = stages_of(s, run_id)
        metrics = _metrics(s, run_id)
        decisions = _stage_decisions(s, run_id)
        evaluated = [st.index for st in stages if st.index in metrics]
        if stage_index is None or stage_index not in [st.index for st in stages]:
            stage_index = evaluated[-1] if evaluated else (stages[-1].index if stages else None)
        logs = [] if stage_index is None else [
            (log.step, log.metrics) for log in s.exec(select(TrainingLog).where(
                TrainingLog.run_id == run_id, TrainingLog.stage_index == stage_index).order_by(TrainingLog.step))]
        kinds = sorted(s.exec(select(Episode.failure).where(
            Episode.run_id == run_id, Episode.stage_index == stage_index, Episode.failure.is_not(None)).distinct()))
    rows = [[st.index, st.status, decisions.get(st.index, "initial config"), _share(metrics.get(st.index, []), "valid"),
             _share(metrics.get(st.index, []), "optimal"), sum(m.episodes for m in metrics.get(st.index, []))]
            for st in stages]
    current = metrics.get(stage_index, [])
    if current:
        note = f"Stage {stage_index}: valid {_share(current, 'valid')}, optimal {_share(current, 'optimal')} " \
               f"over {sum(m.episodes for m in current)} validation boards."
    elif stage_index is not None:
        status = next(st.status for st in stages if st.index == stage_index)
        note = (f"Stage {stage_index} is {status} and has no evaluation yet: its results appear here when its job "
                "ends (the Train tab shows its progress).")
    else:
        note = "This run has no stages yet."
    why = "no evaluation yet" if stage_index is not None else note
    return dict(
        note=note, stages=[(f"stage {st.index} ({st.status})", st.index) for st in stages], stage=stage_index,
        table=_table(["stage", "status", "config from", "valid", "optimal", "episodes"], rows),
        rates=figures.rates_figure(_metric_dicts(current)) if current else empty(why),
        curves=figures.curves_figure({k: _metric_dicts(v) for k, v in metrics.items()}),
        failures=figures.failure_heatmap(_metric_dicts(current)) if current else empty(why),
        training=figures.training_figure(logs), sizes=sorted(m.size for m in current), kinds=kinds)


def _stage_decisions(s, run_id: int) -> dict[int, str]:
    """Stage k+1's config came from the decision on a proposal made after stage k: say which."""
    out = {}
    for p in s.exec(select(Proposal).where(Proposal.run_id == run_id).order_by(Proposal.id)):
        d = decision_of(s, p.id)
        if d is not None and d.action != "reject":
            out[p.after_stage + 1] = f"proposal #{p.id}, {DECIDED[d.action]} by {d.user}"
    return out


def gallery(engine: Engine, run_id: int | None, stage_index: int | None, size: Any = ALL,
            failure: str = ALL, limit: int = 200) -> tuple[dict[str, Any], str]:
    """The failed validation episodes of a stage, filtered by map size and failure type."""
    headers = ["episode", "size", "agents", "failure", "what happened"]
    if run_id is None or stage_index is None:
        return _table(headers, []), "No stage to show: open a run first."
    with session(engine) as s:
        query = select(Episode).where(Episode.run_id == run_id, Episode.stage_index == stage_index,
                                      Episode.split == Split.VALIDATION, Episode.failure.is_not(None))
        if size not in (None, ALL, ""):
            query = query.where(Episode.size == int(size))
        if failure not in (None, ALL, ""):
            query = query.where(Episode.failure == failure)
        episodes = list(s.exec(query.order_by(Episode.size, Episode.id).limit(limit)))
    rows = [[ep.id, ep.size, ep.num_agents, ep.failure, ep.outcome.get("message", "")] for ep in episodes]
    if rows:
        note = f"{len(rows)} failed episode(s){' (first ' + str(limit) + ')' if len(rows) == limit else ''}. " \
               "Click a row to replay it."
    else:
        note = "No failed episodes match these filters." if (size, failure) != (ALL, ALL) else \
            "No failed episodes at this stage (or it has not been evaluated yet)."
    return _table(headers, rows), note


# ---------------------------------------------------------------- episode viewer


def episode_view(engine: Engine, episode_id: Any) -> dict[str, Any]:
    """One episode for the viewer: the board's state (for `gr.State`), a header, the answer and the
    "same board across stages" strip; `error` says why nothing could be shown."""
    try:
        episode_id = int(episode_id)
    except (TypeError, ValueError):
        return {"error": "Type an episode number, or click a failed episode in the Stage review tab."}
    with session(engine) as s:
        ep = s.get(Episode, episode_id)
        if ep is None:
            return {"error": f"There is no episode {episode_id}."}
        same = list(s.exec(select(Episode).where(
            Episode.run_id == ep.run_id, Episode.instance_id == ep.instance_id, Episode.split == ep.split)
            .order_by(Episode.stage_index, Episode.id)))
    instance = Instance.model_validate(ep.instance)
    outcome = outcome_of(ep, instance)
    header = (f"**Episode {ep.id}**: run #{ep.run_id}, stage {ep.stage_index}, {ep.split} board `{ep.instance_id}` "
              f"({instance.size}x{instance.size}, {instance.num_agents} agents, optimal makespan "
              f"{instance.opt_makespan if instance.opt_makespan is not None else '?'}).  \n"
              f"{verdict(instance, outcome)} [Link to this episode](?episode={ep.id})")
    panels, strip_rows = [], []
    if ep.split == Split.VALIDATION and len(same) > 1:
        for other in same:
            o = outcome if other.id == ep.id else outcome_of(other, instance)
            tag = "valid" if o.valid else str(o.failure)
            panels.append((instance, o, f"stage {other.stage_index}: {tag}"))
            strip_rows.append([other.stage_index, other.id, tag, o.message, other.completion[:300]])
    return {"error": None, "view": {"instance": instance.model_dump(mode="json"), "outcome": outcome.to_dict()},
            "header": header, "answer": ep.completion, "end": figures.last_step(outcome),
            "strip": figures.boards_figure(panels, columns=min(len(panels), 5)) if panels else None,
            "strip_table": _table(["stage", "episode", "outcome", "message", "answer"], strip_rows)}


def draw(view: dict[str, Any] | None, step: Any, ghost: bool = True) -> tuple[Any, str]:
    """The viewer's board at `step` and the events that happen then (for any view: episode or playground)."""
    if not view:
        return figures.empty_figure("no board open"), ""
    instance = Instance.model_validate(view["instance"])
    outcome = Outcome.from_dict(view["outcome"]) if view.get("outcome") else None
    step = int(step or 0)
    fig = figures.board_figure(instance, outcome, step, ghost=ghost)
    if outcome is None:
        return fig, ""
    now = [figures.describe(e) for e in outcome.events if e.time == step]
    later = [e for e in outcome.events if e.time > step]
    text = ("**At this step:** " + "; ".join(now)) if now else f"Nothing goes wrong at t={step}."
    if later:
        text += f" Next event: {figures.describe(later[0])}."
    if ghost and instance.reference_plan is None:
        text += " (This board has no solver plan, so no ghost.)"
    return fig, text


def replay_file(view: dict[str, Any] | None) -> str | None:
    """The open episode as a standalone animated HTML file (Plotly's own play button and slider)."""
    if not view or not view.get("outcome"):
        return None
    instance = Instance.model_validate(view["instance"])
    path = Path(tempfile.mkdtemp(prefix="envlab-replay-")) / f"replay-{instance.id}.html"
    figures.write_replay_html(figures.replay_figure(instance, Outcome.from_dict(view["outcome"])), str(path))
    return str(path)


# ---------------------------------------------------------------- proposal review


def proposal_choices(engine: Engine, run_id: int | None) -> list[tuple[str, int]]:
    if run_id is None:
        return []
    out = []
    with session(engine) as s:
        for p in s.exec(select(Proposal).where(Proposal.run_id == run_id).order_by(Proposal.id.desc())):
            d = decision_of(s, p.id)
            state = f"{DECIDED[d.action]} by {d.user}" if d else ("failed, pending" if p.error else "pending")
            if d is None and superseded_by(s, p):
                state = "superseded"
            out.append((f"#{p.id} for stage {p.after_stage + 1}: {state}", p.id))
    return out


def proposal_view(engine: Engine, proposal_id: int | None) -> dict[str, Any]:
    """What the Proposal tab shows: status (who decided what and when), rationale, diff and the edit table."""
    headers = ["size", "knob", "old", "new", "change", "projection"]
    if proposal_id is None:
        return dict(status="No proposal yet: the engineer proposes after a stage has been evaluated.",
                    rationale="", raw="", diff=_table(headers, []), edit=[], agents=2, instances=512,
                    auto=False, pending=False, run_id=None)
    with session(engine) as s:
        p = s.get(Proposal, int(proposal_id))
        if p is None:
            return proposal_view(engine, None) | {"status": f"There is no proposal {proposal_id}."}
        run = s.get(Run, p.run_id)
        d = decision_of(s, p.id)
        superseded = superseded_by(s, p) if d is None else None
        base = EnvConfig.model_validate(stages_of(s, p.run_id)[p.after_stage].config)
    reasons = {a["field"]: a["reason"] for a in p.adjustments}
    rows = []
    for c in p.diff.get("changes", []):
        field = c["knob"] if c["size"] is None else f"{c['knob']}[{c['size']}]"
        said = (p.parsed_config or {}).get(c["knob"])
        said = said.get(str(c["size"]), said.get(c["size"])) if isinstance(said, dict) else said
        flag = f"⚠ {reasons.get(field, 'adjusted')}" + (f" (engineer said {said})" if said is not None else "") \
            if c["adjusted"] else ""
        rows.append(["all" if c["size"] is None else c["size"], c["knob"], _fmt(c["old"]), _fmt(c["new"]),
                     _fmt(c["change"], signed=True), flag])
    config = EnvConfig.model_validate(p.projected_config) if p.projected_config else base
    title = f"**Proposal #{p.id}** by the `{p.engineer}` engineer, after stage {p.after_stage}, " \
            f"for stage {p.after_stage + 1} ({_when(p.created_at)})."
    if d is not None:
        status = f"{title}  \n✔ **{DECIDED[d.action]}** by **{d.user}** at {_when(d.created_at)}" + \
                 (f": “{d.note}”" if d.note else ".")
    elif superseded:
        status = f"{title}  \n**Superseded**: {superseded}. It can no longer be decided."
    elif p.error:
        status = f"{title}  \n✗ **The proposal failed**: {p.error}. The config in force stays; edit it " \
                 "below or reject to ask the engineer again."
    else:
        status = f"{title}  \n**Waiting for a decision.**"
    changed = sum(1 for r in rows if r[4] not in ("0", "+0"))
    summary = f"{changed} of {len(rows)} values change"
    summary += f"; the projection adjusted {len(reasons)}." if reasons else "."
    # Markdown joins single newlines; the heuristic engineer writes one line per change, so keep them apart.
    written = p.rationale.replace("\n", "  \n") if p.rationale else "_The engineer gave no rationale._"
    rationale = f"{written}\n\n{summary}"
    return dict(status=status, rationale=rationale, raw=p.raw_answer, diff=_table(headers, rows),
                edit=config_rows(config), agents=config.num_agents, instances=config.num_instances,
                auto=bool(run.settings.get("auto_apply")), pending=d is None and not superseded, run_id=p.run_id)


def _fmt(value: Any, signed: bool = False) -> str:
    if isinstance(value, float):
        text = f"{value:+.4g}" if signed else f"{value:.4g}"
    else:
        text = f"{value:+d}" if signed and isinstance(value, int) else str(value)
    return "0" if text in ("+0", "-0") else text


def proposal_preview(engine: Engine, proposal_id: int | None, n: int = 4) -> tuple[Any, str]:
    """A few boards the proposed config would generate (the config in force, for a failed proposal)."""
    if proposal_id is None:
        return figures.empty_figure("no proposal"), ""
    with session(engine) as s:
        p = s.get(Proposal, int(proposal_id))
        if p is None:
            return figures.empty_figure("no proposal"), ""
        config = p.projected_config or stages_of(s, p.run_id)[p.after_stage].config
    config = EnvConfig.model_validate(config)
    try:
        boards = generate(config, n, seed=p.id)
    except GenerationError as err:
        return figures.empty_figure("this config cannot generate boards"), f"✗ {err}"
    panels = [(b, None, f"{b.size}x{b.size}, {len(b.holes)} holes{', needs a wait' if b.needs_wait else ''}")
              for b in boards]
    return figures.boards_figure(panels, ghost=True, columns=n, height=260), \
        f"{n} boards drawn from the proposed config (seed {p.id}); dotted lines are the solver's plans."


def _after_decision(engine: Engine, proposal_id: int, verb: str, user: str) -> str:
    with session(engine) as s:
        run_id = s.get(Proposal, proposal_id).run_id
    return f"✓ Proposal #{proposal_id} {verb} by {user}. Next: {advance(engine, run_id)}."


def decide_proposal(engine: Engine, proposal_id: int | None, action: str, user: str, note: str = "",
                    table: Sequence[Sequence[Any]] | None = None, agents: Any = None, instances: Any = None) -> str:
    """Accept, edit or reject a proposal and move the run on; returns the message for the page.

    An invalid edit is refused with the validator's message naming the field and range, and nothing is
    stored; when someone else decided first, the message says who and what.
    """
    if proposal_id is None:
        return "No proposal is open."
    edited = config_from_table(table or [], agents, instances) if action == "edit" else None
    try:
        with session(engine) as s:
            decide(s, int(proposal_id), action, user, edited=edited, note=note or "")
    except AlreadyDecided as err:
        d = err.decision
        return (f"⚠ Someone decided first: proposal #{proposal_id} was already {DECIDED[d.action]} by "
                f"**{d.user}** at {_when(d.created_at)}. Your {action} was not recorded.")
    except ConfigError as err:
        return "✗ Not saved, the edit is not valid: " + "; ".join(err.problems)
    except ProposalError as err:
        return f"✗ {err}"
    return _after_decision(engine, int(proposal_id), DECIDED[action], user)


def toggle_auto_apply(engine: Engine, run_id: int | None, on: bool) -> str:
    if run_id is None:
        return "No run is open."
    with session(engine) as s:
        set_auto_apply(s, run_id, bool(on))
    if not on:
        return f"Auto-apply is off for run #{run_id}: each proposal waits for a person."
    return f"Auto-apply is on for run #{run_id}: proposals are accepted as they come. Now: {advance(engine, run_id)}."


# ---------------------------------------------------------------- training progress


def train_view(engine: Engine, run_id: int | None) -> dict[str, Any]:
    """The run's jobs as the worker last wrote them: progress of the active one, its log tail, results."""
    headers = ["job", "kind", "for", "status", "progress", "heartbeat", "error"]
    if run_id is None:
        return dict(status="No run is open.", progress="", jobs=_table(headers, []), log="", results="")
    with session(engine) as s:
        run = s.get(Run, run_id)
        jobs = jobs_of(s, run_id)
        stages = stages_of(s, run_id)
        metrics = _metrics(s, run_id)
    rows = [[j.id, j.kind, _job_target(j), j.status, f"{j.step}/{j.total}" if j.total else str(j.step),
             _ago(j.heartbeat_at) if j.heartbeat_at and j.status == JobStatus.RUNNING else "", j.error or ""]
            for j in reversed(jobs)]
    active = next((j for j in jobs if j.status in ACTIVE_JOB), None)
    shown = active or (jobs[-1] if jobs else None)
    if shown is None:
        progress = "<p>No jobs for this run yet.</p>"
    else:
        total = shown.total or 0
        label = f"{shown.kind} job {shown.id} ({_job_target(shown)}): {shown.status}"
        label += f", step {shown.step} of {total}" if total else ""
        share = 1.0 if shown.status == JobStatus.DONE else (shown.step / total if total else 0.0)
        error = f'<div class="error">{html.escape(shown.error)}</div>' if shown.error else ""
        progress = (f'<div class="lab-progress {shown.status}"><div>{html.escape(label)}</div>'
                    f'<div class="bar" id="job-progress" data-step="{shown.step}" data-total="{total}" '
                    f'data-status="{shown.status}"><span style="width: {share:.0%}"></span></div>{error}</div>')
    trained = sum(st.status == StageStatus.DONE for st in stages[1:])
    waiting = {RunStatus.WAITING: " **A proposal waits for your decision in the Proposal tab.**",
               RunStatus.FAILED: f" **{run.status_reason}**. Fix the cause, then *Resume* (retry), or switch "
                                 "the engineer below.",
               RunStatus.CANCELLED: f" {run.status_reason}. *Resume* picks it up again."}.get(run.status, "")
    status = (f"Run #{run.id} **{run.name}** is **{run.status}**: {trained} of {run.settings['stages']} "
              f"training stages done; stages: " + ", ".join(f"{st.index} {st.status}" for st in stages) + "." + waiting)
    last_done = next((st for st in reversed(stages) if st.index in metrics), None)
    results = ""
    if last_done is not None:
        lines = [f"**Stage {last_done.index} results** (validation):", "", "| size | valid | optimal | episodes |",
                 "|---|---|---|---|"]
        lines += [f"| {m.size}x{m.size} | {m.valid / m.episodes:.0%} | {m.optimal / m.episodes:.0%} | {m.episodes} |"
                  for m in metrics[last_done.index] if m.episodes]
        results = "\n".join(lines)
    return dict(status=status, progress=progress, jobs=_table(headers, rows),
                log=shown.log_tail if shown else "", results=results)


def _job_target(job: Job) -> str:
    p = job.payload
    if "stage_index" in p:
        return f"stage {p['stage_index']}"
    if "after_stage" in p:
        return f"proposal after stage {p['after_stage']}"
    return json.dumps(p)


def advance_run(engine: Engine, run_id: int | None) -> str:
    if run_id is None:
        return "No run is open."
    try:
        return f"Run #{run_id}: {advance(engine, run_id)}."
    except LoopError as err:
        return f"✗ {err}"


def resume_run(engine: Engine, run_id: int | None) -> str:
    if run_id is None:
        return "No run is open."
    requeued = resume(engine, run_id)
    if not requeued:
        return f"Run #{run_id}: nothing had failed; now {advance(engine, run_id)}."
    return f"Run #{run_id}: queued job(s) {', '.join(map(str, requeued))} again (a stage resumes from its checkpoint)."


def cancel_run_jobs(engine: Engine, run_id: int | None) -> str:
    if run_id is None:
        return "No run is open."
    active = cancel(engine, run_id)
    if not active:
        return f"Run #{run_id} is cancelled; no job of it was queued or running. *Resume* picks it up again."
    return f"Run #{run_id} is cancelled. Cancel requested for job(s) " + ", ".join(map(str, active)) + \
        ": a queued job stops at once, a running one when its worker next reports. *Resume* picks the run up again."


def switch_run_engineer(engine: Engine, run_id: int | None, engineer: str, backend: str) -> str:
    if run_id is None:
        return "No run is open."
    try:
        requeued = switch_engineer(engine, run_id, engineer, (backend or "").strip())
    except LoopError as err:
        return f"✗ {err}"
    return f"Run #{run_id} now asks the `{engineer}` engineer; resumed ({len(requeued)} job(s) queued again). " \
        f"Now: {advance(engine, run_id)}."


# ---------------------------------------------------------------- playground


def make_board(size: Any, agents: Any, hole_ratio: Any, seed: Any) -> tuple[dict | None, str, str]:
    """A random labelled board from knobs: (view, its picture, message)."""
    size, agents = int(size), int(agents)
    rng = np.random.default_rng(int(seed or 0))
    board = random_board(size, round_half_up(float(hole_ratio) * size * size), agents, rng)
    if board is None:
        return None, "", f"✗ A {size}x{size} board with hole ratio {hole_ratio} has no room for {agents} agents' " \
                         "starts and goals in one ice region: lower the hole ratio or the agents."
    return _labelled(board)


def read_board(text: str) -> tuple[dict | None, str, str]:
    """A pasted board (`Instance.from_str`: a picture with A/a letters or the canonical text form)."""
    try:
        board = Instance.from_str(text)
    except ValueError as err:
        return None, text, f"✗ Cannot read this board: {err}"
    return _labelled(board)


def _labelled(board: Instance) -> tuple[dict, str, str]:
    labelled = label(board)
    if isinstance(labelled, Unsolved):
        message = "No plan solves this board (or the solver gave up): scoring works, but there is no ghost."
        labelled = board
    else:
        message = (f"Optimal makespan {labelled.opt_makespan}, optimal sum of costs {labelled.opt_soc}"
                   f"{', needs a wait' if labelled.needs_wait else ''}. Type a plan below.")
    return {"instance": labelled.model_dump(mode="json"), "outcome": None}, labelled.picture(), message


def plan_text(plan: Sequence[Sequence[str]]) -> str:
    return "\n".join(f"Agent {i}: {' '.join(actions)}" for i, actions in enumerate(plan))


def play_plan(view: dict | None, text: str) -> tuple[dict | None, str, int]:
    """Score a typed plan on the playground's board: (view with the outcome, verdict, last step)."""
    if not view:
        return view, "Make or paste a board first.", 0
    instance = Instance.model_validate(view["instance"])
    if not text.strip():
        return {**view, "outcome": None}, "Type a plan, one line per agent: `Agent 0: RIGHT DOWN WAIT`.", 0
    outcome = score_answer(instance, text)
    return {**view, "outcome": outcome.to_dict()}, verdict(instance, outcome), figures.last_step(outcome)


def verdict(instance: Instance, outcome: Outcome) -> str:
    if outcome.valid:
        head = "✓ **valid**" + (" and **optimal**" if outcome.optimal else ", not optimal")
        return f"{head}: {outcome.message}."
    what = outcome.message.removeprefix(f"{outcome.failure}: ")
    on_goal = f" Agents on their goal at the end: {outcome.isr:.0%}." if outcome.failure == "goal_not_reached" else ""
    return f"✗ **{outcome.failure}**: {what}.{on_goal}"


# ---------------------------------------------------------------- leaderboard


def checkpoint_choices(engine: Engine) -> list[tuple[str, str]]:
    """Every (run, stage) with episodes on the benchmark."""
    with session(engine) as s:
        pairs = list(s.exec(select(Episode.run_id, Episode.stage_index).where(Episode.split == Split.BENCHMARK)
                            .distinct().order_by(Episode.run_id, Episode.stage_index)))
        names = {r.id: r.name for r in s.exec(select(Run))}
    return [(f"run #{r} {names.get(r, '')}, stage {k}", f"{r}:{k}") for r, k in pairs]


def leaderboard(engine: Engine, keys: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The paper's tables for each chosen checkpoint, side by side: valid / optimal per (agents, size) with
    the mean over sizes, and per (agents, wait subset)."""
    reports = {}
    with session(engine) as s:
        for key in keys:
            run_id, stage_index = map(int, key.split(":"))
            episodes = list(s.exec(select(Episode).where(Episode.run_id == run_id, Episode.stage_index == stage_index,
                                                         Episode.split == Split.BENCHMARK)))
            entries = [Entry(split=Split.BENCHMARK, subset=-1.0 if ep.subset is None else ep.subset,
                             instance=Instance.model_validate(ep.instance)) for ep in episodes]
            reports[key] = report(entries, [ep.valid for ep in episodes], [ep.optimal for ep in episodes])
    if not reports:
        note = ("No checkpoint is chosen, or none has been evaluated on the benchmark yet: pick a run and stage "
                "below and queue a benchmark evaluation (3,150 boards).")
        return _table(["agents", "size"], []), _table(["agents", "wait subset"], []), note
    cell = "{:.1%} / {:.1%}".format
    keys = list(reports)
    rows_size = sorted({k for r in reports.values() for k in r.by_size})
    by_size = [[a, f"{n}x{n}", *(cell(*reports[k].by_size[(a, n)][:2]) if (a, n) in reports[k].by_size else "-"
                                 for k in keys)] for a, n in rows_size]
    for a in sorted({a for a, _ in rows_size}):
        by_size.append([a, "mean", *(cell(*reports[k].mean_over_sizes[a]) if a in reports[k].mean_over_sizes
                                     else "-" for k in keys)])
    rows_subset = sorted({k for r in reports.values() for k in r.by_subset})
    by_subset = [[a, "unknown" if w < 0 else f"{w:.2f}", *(cell(*reports[k].by_subset[(a, w)][:2])
                                                          if (a, w) in reports[k].by_subset else "-" for k in keys)]
                 for a, w in rows_subset]
    labels = dict((v, lbl) for lbl, v in checkpoint_choices(engine))
    columns = [labels.get(k, k) for k in keys]
    note = "Each cell: valid rate / optimal rate."
    if any(w < 0 for _, w in rows_subset):
        note += " Wait subset “unknown”: those episodes were stored before episodes kept their subset."
    return _table(["agents", "size", *columns], by_size), _table(["agents", "wait subset", *columns], by_subset), note


def queue_benchmark(engine: Engine, run_id: int | None, stage_index: Any) -> str:
    if run_id is None or stage_index in (None, ""):
        return "Pick a run and one of its evaluated stages first."
    try:
        job = loop_queue_benchmark(engine, int(run_id), int(stage_index))
    except LoopError as err:
        return f"✗ {err}"
    return f"Queued benchmark job {job.id} for run #{run_id}, stage {stage_index}: the worker evaluates 3,150 boards."


# ---------------------------------------------------------------- the page


INTRO = """# envlab
An LLM policy trains in stages on MAPF-FrozenLake; after each stage an *environment engineer* proposes the next
stage's environment and you review it. **Runs** → create or open a run · **Stage review** → what the policy gets
right and wrong · **Episode** → replay one answer · **Proposal** → accept, edit or reject the engineer's
next config · **Train** → the worker's progress · **Playground** → try boards and plans · **Leaderboard** →
benchmark tables."""


def build_demo(engine: Engine) -> gr.Blocks:
    """The lab's page on `engine` (migrated already); launch it with `launch`."""
    knob_help = " ".join(f"**{k}**: {v}." for k, v in KNOB_HELP.items() if k in KNOBS)
    default = EnvConfig.default()
    with gr.Blocks(title="envlab") as demo:
        gr.Markdown(INTRO, elem_id="intro")
        with gr.Row(equal_height=True):
            run_pick = gr.Dropdown(label="Open run", choices=[], value=None, scale=3, elem_id="run-pick")
            refresh = gr.Button("↻ Refresh", scale=0, min_width=100)
            worker_md = gr.HTML(elem_id="worker-status")
        poll = gr.Timer(POLL_S)

        with gr.Tabs(elem_id="tabs") as tabs:
            # ---------------------------------------------------------------- 1. runs
            with gr.Tab("Runs", id="runs"):
                runs_df = gr.Dataframe(label="Runs (newest first); pick one in “Open run” above", interactive=False,
                                       elem_id="runs-table")
                with gr.Accordion("New run", open=True):
                    with gr.Row():
                        name = gr.Textbox(label="Name", value="my run", elem_id="new-name")
                        policy = gr.Textbox(label="Policy", value="tiny",
                                            info="`tiny` (ships in assets/, trains on a CPU), `gemma3-270m`, a "
                                                 "checkpoint folder or a Hugging Face model name")
                        engineer = gr.Dropdown(label="Engineer", choices=list(ENGINEERS), value="heuristic",
                                               elem_id="new-engineer")
                        backend = gr.Textbox(label="LLM backend", placeholder="hf:policy", visible=False,
                                             info="hf:policy (the policy itself, as in the paper), hf:gemma3-270m, "
                                                  "or openai:<model> with a server URL")
                        base_url = gr.Textbox(label="Server URL (openai backend)", visible=False,
                                              placeholder="http://localhost:8000/v1")
                    with gr.Row():
                        stages = gr.Number(label="Training stages", value=3, precision=0, minimum=1)
                        instances = gr.Number(label="Training instances per stage", value=default.num_instances,
                                              precision=0, minimum=1)
                        agents = gr.Number(label="Agents per training board", value=default.num_agents, precision=0)
                        seed = gr.Number(label="Seed", value=0, precision=0)
                        auto = gr.Checkbox(label="Auto-apply proposals (no review)", value=False)
                    description = gr.Textbox(label="Description (optional)", lines=1)
                    gr.Markdown(f"Initial config (stage 0 and the round-0 default), one row per map size. {knob_help}")
                    config_df = gr.Dataframe(value=config_rows(default), headers=KNOB_COLUMNS, type="array",
                                             interactive=True, elem_id="new-config", label="Initial config")
                    create = gr.Button("Create run and queue stage 0", variant="primary", elem_id="create-run")
                    create_msg = gr.Markdown(elem_id="create-msg")

            # ---------------------------------------------------------------- 2. stage review
            with gr.Tab("Stage review", id="review"):
                with gr.Row():
                    stage_pick = gr.Dropdown(label="Stage", choices=[], value=None, scale=1)
                    review_md = gr.Markdown(elem_id="review-note")
                stages_df = gr.Dataframe(label="Stages", interactive=False)
                with gr.Row():
                    rates_plot = gr.Plot(label="Valid and optimal rate per map size")
                    curves_plot = gr.Plot(label="Across stages")
                with gr.Row():
                    failures_plot = gr.Plot(label="Failures: map size × failure type")
                    training_plot = gr.Plot(label="Training curves")
                gr.Markdown("### Failure gallery")
                with gr.Row():
                    size_filter = gr.Dropdown(label="Map size", choices=[ALL], value=ALL, scale=0, min_width=140)
                    failure_filter = gr.Dropdown(label="Failure type", choices=[ALL], value=ALL, scale=0,
                                                 min_width=200)
                    gallery_md = gr.Markdown(elem_id="gallery-note")
                gallery_df = gr.Dataframe(interactive=False, elem_id="gallery", max_height=360, wrap=True)

            # ---------------------------------------------------------------- 3. episode viewer
            with gr.Tab("Episode", id="episode"):
                with gr.Row():
                    episode_id = gr.Number(label="Episode", value=None, precision=0, scale=0, min_width=140,
                                           elem_id="episode-id")
                    open_episode = gr.Button("Open", scale=0, min_width=90)
                    episode_md = gr.Markdown("Open an episode from the failure gallery, or type its number.",
                                             elem_id="episode-header")
                view = gr.State(None)
                with gr.Row():
                    with gr.Column(scale=3):
                        board_plot = gr.Plot(show_label=False, elem_id="replay")
                        step = gr.Slider(0, 1, value=0, step=1, label="Time step t", elem_id="replay-step")
                        with gr.Row():
                            play = gr.Button("▶ Play", scale=0, min_width=110, elem_id="replay-play")
                            ghost = gr.Checkbox(label="Show the solver's optimal plan as a ghost", value=True)
                            export = gr.DownloadButton("Save animated replay (HTML)", scale=0)
                        step_md = gr.Markdown(elem_id="replay-events")
                    with gr.Column(scale=2):
                        answer = gr.Textbox(label="The policy's raw answer", lines=18, interactive=False,
                                            elem_id="raw-answer")
                strip_md = gr.Markdown()
                strip_plot = gr.Plot(show_label=False, visible=False)
                strip_df = gr.Dataframe(label="Its answer at each stage", interactive=False, visible=False, wrap=True)
                playing = gr.State(False)
                ticker = gr.Timer(PLAY_S, active=False)

            # ---------------------------------------------------------------- 4. proposal review
            with gr.Tab("Proposal", id="proposal"):
                with gr.Row():
                    proposal_pick = gr.Dropdown(label="Proposal", choices=[], value=None, scale=2,
                                                elem_id="proposal-pick")
                    auto_toggle = gr.Checkbox(label="Auto-apply this run's proposals", value=False, scale=1,
                                              elem_id="auto-apply")
                proposal_status = gr.Markdown(elem_id="proposal-status")
                with gr.Row():
                    with gr.Column(scale=2):
                        gr.Markdown("#### The engineer's rationale")
                        rationale = gr.Markdown(elem_id="rationale")
                        with gr.Accordion("Raw answer", open=False):
                            raw = gr.Textbox(show_label=False, lines=8, interactive=False)
                    with gr.Column(scale=3):
                        diff_df = gr.Dataframe(label="Config diff (⚠: the projection adjusted the engineer's value)",
                                               interactive=False, elem_id="diff", max_height=440, wrap=True,
                                               column_widths=["8%", "16%", "10%", "10%", "10%", "46%"])
                preview_md = gr.Markdown()
                preview_plot = gr.Plot(label="Boards this config would generate")
                with gr.Accordion("Edit before applying", open=False):
                    edit_df = gr.Dataframe(headers=KNOB_COLUMNS, type="array", interactive=True, elem_id="edit-config",
                                           label="Config to apply (one row per map size)")
                    with gr.Row():
                        edit_agents = gr.Number(label="num_agents", precision=0)
                        edit_instances = gr.Number(label="num_instances", precision=0)
                note = gr.Textbox(label="Note (kept with the decision)", lines=1)
                with gr.Row():
                    accept = gr.Button("Accept", variant="primary", elem_id="accept")
                    submit_edit = gr.Button("Apply my edit", elem_id="submit-edit")
                    reject = gr.Button("Reject and ask again", variant="stop", elem_id="reject")
                decision_md = gr.Markdown(elem_id="decision-msg")

            # ---------------------------------------------------------------- 5. train
            with gr.Tab("Train", id="train"):
                train_status = gr.Markdown(elem_id="train-status")
                with gr.Row():
                    queue_next = gr.Button("Queue what comes next", variant="primary", elem_id="queue-next")
                    resume_button = gr.Button("Resume (retry what failed)", elem_id="resume")
                    cancel = gr.Button("Cancel this run", variant="stop", elem_id="cancel")
                with gr.Row():
                    switch_to = gr.Dropdown(list(ENGINEERS), value="heuristic", label="Switch the engineer to",
                                            elem_id="switch-engineer", scale=1)
                    switch_backend = gr.Textbox(label="Backend (llm only)", placeholder="hf:policy", scale=1)
                    switch_button = gr.Button("Switch engineer and resume", elem_id="switch", scale=1)
                gr.Markdown("_Queue what comes next_ moves the run one step along the loop: it queues the next "
                            "stage or asks the engineer for a proposal (nothing, while a proposal waits for you). "
                            "The worker runs what is queued; this page never trains.")
                train_msg = gr.Markdown(elem_id="train-msg")
                progress = gr.HTML(elem_id="progress")
                results_md = gr.Markdown(elem_id="stage-results")
                log_tail = gr.Textbox(label="Log of the job above (last lines)", lines=10, interactive=False,
                                      elem_id="log-tail", autoscroll=True, placeholder="(no log lines yet)")
                jobs_df = gr.Dataframe(label="Jobs of this run (newest first)", interactive=False)

            # ---------------------------------------------------------------- 6. playground
            with gr.Tab("Playground", id="playground"):
                pg_view = gr.State(None)
                with gr.Row():
                    with gr.Column(scale=2):
                        gr.Markdown("**Make a board from knobs**")
                        with gr.Row():
                            pg_size = gr.Slider(MIN_SIZE, 10, value=4, step=1, label="Size")
                            pg_agents = gr.Slider(1, 7, value=2, step=1, label="Agents")
                        with gr.Row():
                            pg_holes = gr.Slider(0, 0.5, value=0.2, step=0.05, label="Hole ratio")
                            pg_seed = gr.Number(label="Seed", value=0, precision=0)
                        pg_make = gr.Button("Make board")
                        gr.Markdown("**…or paste one**: `.` ice, `H` hole, `A`/`a` agent 0's start/goal, `B`/`b` …")
                        pg_text = gr.Textbox(label="Board", lines=6, value="A.b\n.H.\nB.a", elem_id="pg-board")
                        pg_read = gr.Button("Read board")
                        pg_msg = gr.Markdown()
                        pg_plan = gr.Textbox(label="Plan (one line per agent)", lines=4, elem_id="pg-plan",
                                             placeholder="Agent 0: RIGHT DOWN\nAgent 1: UP WAIT RIGHT")
                        with gr.Row():
                            pg_solver = gr.Button("Use the solver's plan")
                            pg_episode = gr.Number(label="Episode", value=None, precision=0, min_width=100)
                            pg_load = gr.Button("Load episode")
                    with gr.Column(scale=3):
                        pg_verdict = gr.Markdown(elem_id="pg-verdict")
                        pg_plot = gr.Plot(show_label=False, elem_id="pg-board-plot")
                        pg_step = gr.Slider(0, 1, value=0, step=1, label="Time step t")
                        pg_events = gr.Markdown()

            # ---------------------------------------------------------------- 7. leaderboard
            with gr.Tab("Leaderboard", id="leaderboard"):
                lb_pick = gr.Dropdown(label="Checkpoints evaluated on the benchmark", choices=[], multiselect=True,
                                      elem_id="lb-pick")
                lb_md = gr.Markdown()
                lb_size = gr.Dataframe(label="Valid / optimal rate by agents × map size", interactive=False,
                                       visible=False)
                lb_subset = gr.Dataframe(label="Valid / optimal rate by agents × wait subset", interactive=False,
                                         visible=False)
                gr.Markdown("**Evaluate a checkpoint**: a stage of the open run on the 3,150 benchmark boards "
                            "(agents 3-5, sizes up to 10x10), as a job for the worker.")
                with gr.Row():
                    lb_stage = gr.Number(label="Stage", value=None, precision=0, scale=0, min_width=120)
                    lb_queue = gr.Button("Queue the benchmark evaluation", scale=0, min_width=260)
                    lb_msg = gr.Markdown()

        # ---------------------------------------------------------------- wiring
        def top(run_id):
            choices = run_choices(engine)
            ids = [c[1] for c in choices]
            return gr.update(choices=choices, value=run_id if run_id in ids else None), runs_table(engine), \
                worker_badge(engine)

        def show_review(run_id, stage_index):
            r = review(engine, run_id, stage_index)
            table, note = gallery(engine, run_id, r["stage"])
            return (gr.update(choices=r["stages"], value=r["stage"]), r["note"], r["table"], r["rates"], r["curves"],
                    r["failures"], r["training"], gr.update(choices=[ALL, *r["sizes"]], value=ALL),
                    gr.update(choices=[ALL, *r["kinds"]], value=ALL), table, note)

        review_out = [stage_pick, review_md, stages_df, rates_plot, curves_plot, failures_plot, training_plot,
                      size_filter, failure_filter, gallery_df, gallery_md]

        def show_proposals(run_id, proposal_id=None):
            choices = proposal_choices(engine, run_id)
            ids = [c[1] for c in choices]
            chosen = proposal_id if proposal_id in ids else (ids[0] if ids else None)
            return (gr.update(choices=choices, value=chosen), *show_proposal(chosen))

        def show_proposal(proposal_id):
            v = proposal_view(engine, proposal_id)
            buttons = [gr.update(interactive=v["pending"])] * 3
            return (v["status"], v["rationale"], v["raw"], v["diff"], v["edit"], v["agents"], v["instances"],
                    v["auto"], *buttons)

        proposal_out = [proposal_status, rationale, raw, diff_df, edit_df, edit_agents, edit_instances, auto_toggle,
                        accept, submit_edit, reject]

        def show_train(run_id):
            t = train_view(engine, run_id)
            return t["status"], t["progress"], t["jobs"], t["log"], t["results"]

        train_out = [train_status, progress, jobs_df, log_tail, results_md]

        def show_episode(ep_id, ghost_on):
            v = episode_view(engine, ep_id)
            if v["error"]:
                return (None, v["error"], "", gr.update(maximum=1, value=0), figures.empty_figure(v["error"]), "",
                        "", gr.update(visible=False), gr.update(visible=False), False, gr.Timer(active=False),
                        "▶ Play")
            fig, events = draw(v["view"], 0, ghost_on)
            has_strip = v["strip"] is not None
            strip_note = "### Same board across stages" if has_strip else \
                ("" if v["view"] is None else "_This board was evaluated at one stage only._")
            return (v["view"], v["header"], v["answer"], gr.update(maximum=max(v["end"], 1), value=0), fig, events,
                    strip_note, gr.update(value=v["strip"], visible=has_strip),
                    gr.update(value=v["strip_table"], visible=has_strip), False, gr.Timer(active=False), "▶ Play")

        episode_out = [view, episode_md, answer, step, board_plot, step_md, strip_md, strip_plot, strip_df, playing,
                       ticker, play]

        def on_load(request: gr.Request):
            params = dict(request.query_params) if request is not None else {}
            run_id, tab, proposal_id = None, gr.update(), None
            ep = params.get("episode")
            if params.get("proposal", "").isdigit():
                proposal_id = int(params["proposal"])
                with session(engine) as s:
                    p = s.get(Proposal, proposal_id)
                    run_id = p.run_id if p else None
                tab = gr.Tabs(selected="proposal")
            if params.get("run", "").isdigit():
                run_id = int(params["run"])
            if ep and ep.isdigit():
                tab = gr.Tabs(selected="episode")
                with session(engine) as s:
                    row = s.get(Episode, int(ep))
                    run_id = row.run_id if row else run_id
            if run_id is None:
                choices = run_choices(engine)
                run_id = choices[0][1] if choices else None
            # The proposal goes out with the first answer: a link to a proposal paints in one round trip.
            return (*top(run_id), tab, int(ep) if ep and ep.isdigit() else None, *show_proposals(run_id, proposal_id))

        refresh.click(top, run_pick, [run_pick, runs_df, worker_md]) \
            .then(show_review, [run_pick, stage_pick], review_out) \
            .then(show_proposals, [run_pick, proposal_pick], [proposal_pick, *proposal_out]) \
            .then(lambda: gr.update(choices=checkpoint_choices(engine)), None, lb_pick)
        run_pick.input(lambda run_id: show_review(run_id, None), run_pick, review_out) \
            .then(show_proposals, run_pick, [proposal_pick, *proposal_out]) \
            .then(show_train, run_pick, train_out)

        def on_poll(run_id):
            return (worker_badge(engine), *show_train(run_id))

        poll.tick(on_poll, run_pick, [worker_md, *train_out], show_progress="hidden")

        # runs
        def on_create(*form):
            message, run_id = create_run_from_form(engine, *form)
            if run_id is None:
                return message, gr.update(), gr.update(), gr.update(), gr.update(), gr.update()
            choices = run_choices(engine)
            return message, gr.update(choices=choices, value=run_id), runs_table(engine), worker_badge(engine), \
                gr.Tabs(selected="train"), message

        create.click(on_create, [name, description, policy, engineer, backend, base_url, stages, instances, agents,
                                 seed, auto, config_df], [create_msg, run_pick, runs_df, worker_md, tabs, train_msg]) \
            .then(show_train, run_pick, train_out) \
            .then(lambda run_id: show_review(run_id, None), run_pick, review_out) \
            .then(show_proposals, run_pick, [proposal_pick, *proposal_out])

        engineer.input(lambda name: [gr.update(visible=name == "llm")] * 2, engineer, [backend, base_url])

        # stage review
        stage_pick.input(show_review, [run_pick, stage_pick], review_out)
        gr.on([size_filter.input, failure_filter.input],
              lambda run_id, st, size, kind: gallery(engine, run_id, st, size, kind),
              [run_pick, stage_pick, size_filter, failure_filter], [gallery_df, gallery_md])

        def on_gallery_select(evt: gr.SelectData):
            return evt.row_value[0], gr.Tabs(selected="episode")

        gallery_df.select(on_gallery_select, None, [episode_id, tabs]) \
            .then(show_episode, [episode_id, ghost], episode_out)

        # episode viewer
        gr.on([open_episode.click, episode_id.submit], show_episode, [episode_id, ghost], episode_out)
        gr.on([step.input, ghost.input], draw, [view, step, ghost], [board_plot, step_md], show_progress="hidden")

        def on_play(v, is_playing, t):
            if not v:
                return False, gr.Timer(active=False), "▶ Play", t
            end = figures.last_step(Outcome.from_dict(v["outcome"])) if v.get("outcome") else 0
            starting = not is_playing
            t = 0 if starting and t >= end else t
            return starting, gr.Timer(active=starting), "❚❚ Pause" if starting else "▶ Play", t

        play.click(on_play, [view, playing, step], [playing, ticker, play, step])

        def on_tick(v, t, ghost_on):
            end = figures.last_step(Outcome.from_dict(v["outcome"])) if v and v.get("outcome") else 0
            t = min(int(t or 0) + 1, end)
            fig, events = draw(v, t, ghost_on)
            going = t < end
            return t, fig, events, going, gr.Timer(active=going), "❚❚ Pause" if going else "▶ Play"

        ticker.tick(on_tick, [view, step, ghost], [step, board_plot, step_md, playing, ticker, play],
                    show_progress="hidden")
        export.click(replay_file, view, export)

        # proposal review
        proposal_pick.input(show_proposal, proposal_pick, proposal_out) \
            .then(lambda pid: proposal_preview(engine, pid), proposal_pick, [preview_plot, preview_md])
        proposal_pick.change(lambda pid: proposal_preview(engine, pid), proposal_pick, [preview_plot, preview_md],
                             trigger_mode="always_last")

        def on_decide(action):
            def handler(pid, note_text, table, n_agents, n_instances, request: gr.Request):
                return decide_proposal(engine, pid, action, user_of(request), note_text, table, n_agents, n_instances)
            return handler

        def after_decision(run_id, proposal_id):
            """Status, diff and buttons again, but not the edit table: a refused edit stays as typed."""
            pick, status, rationale_text, raw_text, diff, _, _, _, *rest = show_proposals(run_id, proposal_id)
            return pick, status, rationale_text, raw_text, diff, *rest

        decided_out = [proposal_pick, proposal_status, rationale, raw, diff_df, auto_toggle, accept, submit_edit,
                       reject]
        for button, action in ((accept, "accept"), (submit_edit, "edit"), (reject, "reject")):
            button.click(on_decide(action), [proposal_pick, note, edit_df, edit_agents, edit_instances], decision_md) \
                .then(after_decision, [run_pick, proposal_pick], decided_out) \
                .then(show_train, run_pick, train_out)
        auto_toggle.input(lambda run_id, on: toggle_auto_apply(engine, run_id, on), [run_pick, auto_toggle],
                          decision_md) \
            .then(after_decision, [run_pick, proposal_pick], decided_out)

        # train
        queue_next.click(lambda run_id: advance_run(engine, run_id), run_pick, train_msg) \
            .then(show_train, run_pick, train_out)
        resume_button.click(lambda run_id: resume_run(engine, run_id), run_pick, train_msg) \
            .then(show_train, run_pick, train_out)
        cancel.click(lambda run_id: cancel_run_jobs(engine, run_id), run_pick, train_msg) \
            .then(show_train, run_pick, train_out)
        switch_button.click(lambda run_id, e, b: switch_run_engineer(engine, run_id, e, b),
                            [run_pick, switch_to, switch_backend], train_msg).then(show_train, run_pick, train_out)

        # playground
        def pg_show(v, t=None):
            end = figures.last_step(Outcome.from_dict(v["outcome"])) if v and v.get("outcome") else 0
            t = end if t is None else t
            fig, events = draw(v, t, True)
            return fig, gr.update(maximum=max(end, 1), value=t), events

        def pg_new(result):
            v, picture, message = result
            return (v, picture or gr.update(), message, "", "", *pg_show(v))

        pg_board_out = [pg_view, pg_text, pg_msg, pg_plan, pg_verdict, pg_plot, pg_step, pg_events]
        pg_make.click(lambda *a: pg_new(make_board(*a)), [pg_size, pg_agents, pg_holes, pg_seed], pg_board_out)
        pg_read.click(lambda text: pg_new(read_board(text)), pg_text, pg_board_out)

        def pg_score(v, text):
            v, message, _ = play_plan(v, text)
            return (v, message, *pg_show(v))

        pg_plan.change(pg_score, [pg_view, pg_plan], [pg_view, pg_verdict, pg_plot, pg_step, pg_events],
                       trigger_mode="always_last", show_progress="hidden")
        pg_step.input(lambda v, t: draw(v, t, True), [pg_view, pg_step], [pg_plot, pg_events], show_progress="hidden")

        def pg_use_solver(v):
            if not v or not v["instance"].get("reference_plan"):
                return gr.update(), "This board has no solver plan (make or read a board first)."
            return plan_text(v["instance"]["reference_plan"]), gr.update()

        pg_solver.click(pg_use_solver, pg_view, [pg_plan, pg_msg])

        def pg_from_episode(ep_id):
            v = episode_view(engine, ep_id)
            if v["error"]:
                return gr.update(), gr.update(), v["error"], gr.update()
            instance = Instance.model_validate(v["view"]["instance"])
            return ({"instance": v["view"]["instance"], "outcome": None}, instance.picture(),
                    f"Episode {ep_id} loaded: its answer is in the plan box; edit it and watch the verdict.",
                    v["answer"])

        pg_load.click(pg_from_episode, pg_episode, [pg_view, pg_text, pg_msg, pg_plan])

        # leaderboard
        def show_leaderboard(keys):
            by_size, by_subset, message = leaderboard(engine, keys or [])
            shown = bool(by_size["data"])
            return gr.update(value=by_size, visible=shown), gr.update(value=by_subset, visible=shown), message

        lb_pick.change(show_leaderboard, lb_pick, [lb_size, lb_subset, lb_md])
        lb_queue.click(lambda run_id, st: queue_benchmark(engine, run_id, st), [run_pick, lb_stage], lb_msg)

        # the page opens: a run, and the tab a link asks for (?episode=ID, ?proposal=ID, ?run=ID)
        load = demo.load(on_load, None, [run_pick, runs_df, worker_md, tabs, episode_id, proposal_pick, *proposal_out])
        load.then(show_episode, [episode_id, ghost], episode_out) \
            .then(show_review, [run_pick, stage_pick], review_out) \
            .then(show_train, run_pick, train_out) \
            .then(lambda: gr.update(choices=checkpoint_choices(engine)), None, lb_pick) \
            .then(show_leaderboard, lb_pick, [lb_size, lb_subset, lb_md]) \
            .then(lambda text: pg_new(read_board(text)), pg_text, pg_board_out)
    return demo


# ---------------------------------------------------------------- the command


def read_auth(value: str | None) -> list[tuple[str, str]] | None:
    """`user:password`, or a file of such lines (blank lines and `#` comments skipped)."""
    if not value:
        return None
    path = Path(value)
    lines = path.read_text().splitlines() if path.is_file() else [value]
    pairs = []
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, password = line.partition(":")
        if not sep or not user or not password:
            raise SystemExit(f"--auth: expected user:password (or a file of such lines), got {line[:40]!r}")
        pairs.append((user, password))
    return pairs


def launch(demo: gr.Blocks, host: str = "127.0.0.1", port: int | None = None,
           auth: list[tuple[str, str]] | None = None, block: bool = True) -> None:
    """Serve the page; with `block`, say where in one line and serve until interrupted. Raises OSError when
    the port is taken."""
    demo.launch(server_name=host, server_port=port, auth=auth, prevent_thread_lock=True, quiet=True,
                css_paths=[ASSETS / "lab.css"], theme=gr.themes.Soft(), footer_links=[], ssr_mode=False,
                show_error=True)
    if block:
        print(f"envlab: serving on http://{host}:{demo.server_port}", flush=True)
        demo.block_thread()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="envlab serve", description="The envlab web lab.")
    p.add_argument("--host", help="address to bind (0.0.0.0 to expose the lab; use --auth); "
                                   "default: $GRADIO_SERVER_NAME, else 127.0.0.1")
    p.add_argument("--port", type=int, help="default: $GRADIO_SERVER_PORT, else 7860")
    p.add_argument("--auth", help="user:password, or a file with one user:password per line")
    p.add_argument("--db", help="database path or URL (default: $ENVLAB_DB, else runs/envlab.db)")
    p.add_argument("--no-worker", action="store_true", help="do not start a worker beside the page")
    return p


def address(host: str | None, port: int | None) -> tuple[str, int]:
    """Where to serve: the flags, else Gradio's own GRADIO_SERVER_NAME and GRADIO_SERVER_PORT, else
    127.0.0.1:7860."""
    host = host or os.environ.get("GRADIO_SERVER_NAME") or "127.0.0.1"
    if port is None:
        raw = os.environ.get("GRADIO_SERVER_PORT") or "7860"
        if not raw.isdigit():
            raise SystemExit(f"envlab serve: GRADIO_SERVER_PORT={raw!r} is not a port number")
        port = int(raw)
    return host, port


def port_free(host: str, port: int) -> bool:
    """Whether the page can listen on `(host, port)`; any reason but a taken port ends the command."""
    try:
        socket.create_server((host, port)).close()
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            return False
        raise SystemExit(f"envlab serve: cannot serve on {host}:{port}: {err.strerror or err}") from None
    return True


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    host, port = address(args.host, args.port)
    taken = f"envlab serve: port {port} is taken; choose another with --port N or GRADIO_SERVER_PORT"
    if not port_free(host, port):  # before the worker starts and the page is built
        print(taken, file=sys.stderr)
        return 2
    auth = read_auth(args.auth)
    if host not in ("127.0.0.1", "localhost") and not auth:
        print(f"warning: serving on {host} without --auth: anyone who can reach it can decide proposals",
              file=sys.stderr)
    engine = make_engine(args.db)
    upgrade(engine)
    if args.no_worker:
        print("not starting a worker (--no-worker): queued jobs wait for `envlab worker`", file=sys.stderr)
    elif worker_busy(engine):
        print("a worker is already at work on this database: not starting another", file=sys.stderr)
    else:
        start_worker(args.db)
    # SIGTERM ends the page like Ctrl-C does, so the atexit hook stops the worker it started.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        launch(build_demo(engine), host, port, auth)
    except OSError:
        if port_free(host, port):
            raise
        print(taken, file=sys.stderr)  # taken between the check and the launch
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
