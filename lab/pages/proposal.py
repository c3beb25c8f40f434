"""The Proposal tab: the engineer's rationale and diff, boards its config would make, and the decision
(accept, edit, reject and ask again, or auto-apply the run's proposals)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gradio as gr
from sqlalchemy import Engine

from envsim.config import AGENT_COUNTS, AGENT_RATIO, ConfigError, ConfigProblem, EnvConfig, Projection
from envsim.generator import GenerationError, generate, placement
from lab.engineers import ENGINEERS
from lab.loop import advance, decide_and_advance
from lab.pages import figures, measure
from lab.pages.common import (
    BAD_ROW,
    DECIDED,
    KNOB_COLUMNS,
    MIX_COLUMNS,
    VIEW,
    Page,
    cannot_draw,
    config_from_table,
    config_rows,
    mix_rows,
    no_progress,
    table,
    user_of,
    when,
)
from lab.proposals import (
    AlreadyDecided,
    ProposalError,
    ProposalState,
    diff,
    project_edit,
    proposal_state,
    proposal_states,
    repeats_rejected,
)
from lab.runs import set_run_auto_apply
from lab.text import TEXT_LIMIT, as_text
from storage.models import Action, Proposal

DIFF_HEADERS = ["size", "knob", "old", "new", "change", "note"]
PERSON = "✎"  # marks a value a person's edit set, in the diff
EDIT_LABEL = "Config to apply (one row per map size): edit it, then “Apply my edit”"
MIX_LABEL = ("Agent mix to apply (agent_ratio: each count's share of the stage's boards; 0: none; the shares are "
             "rescaled to sum to 1). In force: the current stage's")


def proposal_choices(engine: Engine, run_id: int | None,
                     states: Sequence[ProposalState] | None = None) -> list[tuple[str, int]]:
    """The Proposal dropdown's choices, newest first (of `states` when given: read once by the caller)."""
    if run_id is None:
        return []
    out = []
    for state in proposal_states(engine, run_id) if states is None else states:
        p, d = state.proposal, state.decision
        status = f"{DECIDED[d.action]} by {d.user}" if d else ("failed, waits for you" if p.error else
                                                              "waits for your decision")
        if state.superseded:
            status = "superseded"
        out.append((f"#{p.id} for stage {p.after_stage + 1}: {status}", p.id))
    return out


def pending_of(engine: Engine, run_id: int | None, states: Sequence[ProposalState] | None = None) -> int | None:
    """The run's proposal that waits for a decision, if any (of `states` when given: read once by the caller)."""
    if states is None:
        states = [] if run_id is None else proposal_states(engine, run_id)
    return next((state.proposal.id for state in states if state.pending), None)


@dataclass(frozen=True)
class ProposalView:
    """What the Proposal tab shows of one proposal (`proposal_view`)."""

    status: str  # who decided what and when, or why nothing is shown
    rationale: str  # the engineer's, then what changes and what measuring cost
    raw: str  # the engineer's answer as given
    diff: Any  # every value's row (old, new, change, note)
    changed: Any  # the rows that change
    edit: list[list[Any]]  # the config table: the decision's config, else the proposal's
    agents: list[list[Any]]  # the agent mix table: a row per count, its share here and in force (`mix_rows`)
    instances: int
    auto: bool  # the run auto-applies its proposals
    pending: bool  # it waits for a decision
    run_id: int | None
    label: str  # the edit table's label: what that config is
    failed: bool = False  # the proposal failed: nothing to accept, only an edit or a rejection


NO_PROPOSAL = "No proposal yet: the engineer proposes after a stage has been evaluated."


def no_proposal(status: str = NO_PROPOSAL) -> ProposalView:
    """The view without a proposal: new tables each time, since the page may hold on to what it was given."""
    return ProposalView(status=status, rationale="", raw="", diff=table(DIFF_HEADERS, []),
                        changed=table(DIFF_HEADERS, []), edit=[], agents=[],
                        instances=512, auto=False, pending=False, run_id=None, label=EDIT_LABEL)


def proposal_view(engine: Engine, proposal_id: int | None) -> ProposalView:
    """What the Proposal tab shows: status (who decided what and when), rationale, the diff (changed values
    first; a decided proposal's diff is of the config its decision applied) and the config table."""
    if proposal_id is None:
        return no_proposal()
    try:
        state = proposal_state(engine, int(proposal_id))
    except BAD_ROW as err:
        return no_proposal(cannot_draw(f"Proposal {proposal_id}", None, err))
    if state is None:
        return no_proposal(f"There is no proposal {proposal_id}.")
    p = state.proposal
    rows, changed = diff_rows(state)
    person = sum(1 for r in rows if r[3].startswith(PERSON))
    adjusted = len({a["field"] for a in p.adjustments})
    moved = sum(1 for r in changed if r[4] != "0" or r[3].startswith(PERSON))  # not a failed proposal's unapplied
    summary = f"{moved} of {len(rows)} values change"
    summary += f"; the person set {person} of them ({PERSON} in the diff)" if person else ""
    summary += f"; the projection adjusted {adjusted}." if adjusted else "."
    summary += _compute_text(state)
    # Markdown joins single newlines; the heuristic engineer writes one line per change, so keep them apart. A
    # rationale is text from outside (a model, an archive): shown as typed, no image, link, form or tag comes of it.
    written = as_text(p.rationale).replace("\n", "  \n") if p.rationale else "_The engineer gave no rationale._"
    config = state.applied or state.config
    status = _status(state)
    if state.pending and (same := repeats_rejected(engine, p)) is not None:
        status += (f"  \n⚠ **The same config as rejected proposal #{same}**: the `{p.engineer}` engineer answered "
                   "the same when asked again. Edit it below, or switch the engineer in the Train tab.")
    if (replay := replay_text(p)) is not None:
        summary += f"\n\n{replay}"
    if placed := _placed(config):
        summary += "\n\nThe generator deals each agent count only to the sizes that hold it: " + "; ".join(placed) + "."
    return ProposalView(status=status, rationale=f"{written}\n\n{summary}", raw=p.raw_answer,
                        diff=table(DIFF_HEADERS, rows), changed=table(DIFF_HEADERS, changed), edit=config_rows(config),
                        agents=mix_rows(config, state.base), instances=config.num_instances, auto=state.auto_apply,
                        pending=state.pending, run_id=p.run_id, label=_edit_label(state), failed=state.failed)


def _placed(config: EnvConfig) -> list[str]:
    """What the generator's rule moved in `config` (no agent count on a size too small for it); none where no size
    holds a count at all (the preview says why)."""
    try:
        return placement(config).notes(config)
    except GenerationError:
        return []


def _compute_text(state: ProposalState) -> str:
    """What the engineer spent measuring configs on the policy, beside what the stage it read took."""
    compute = state.proposal.spent
    if compute is None:
        return ""
    text = (f" Measuring configs on the policy cost {compute.completions:,} sampled answers in "
            f"{compute.seconds:.0f} s ({compute.probes} probes, {compute.cached} of them cached)")
    if state.stage_seconds is not None:
        text += f"; stage {state.proposal.after_stage} itself took {state.stage_seconds:.0f} s"
    return text + "."



def replay_text(proposal: Proposal) -> str | None:
    """The line on the boards the next stage replays as they are (`Proposal.replay`), read-only: they are no knob of
    the config, and an edit of the config keeps them. None where it replays none."""
    replay = proposal.replay
    if replay is None:
        return None
    try:
        return (f"The next stage replays {len(replay.boards)} boards from the buffer (sizes {replay.sizes_text()}) "
                "as they are, beside the boards drawn from this config.")
    except ValueError as err:
        return f"⚠ The boards this proposal replays cannot be read: {err}"


def _edit_label(state: ProposalState) -> str:
    d = state.decision
    if state.applied is not None:
        return f"The config {DECIDED[d.action]} (as stored with the decision; the stage trained on it)"
    if d is not None:
        return "The config the engineer proposed (rejected: never applied)"
    return "The config the engineer proposed (superseded: never applied)" if state.superseded else EDIT_LABEL


def diff_rows(state: ProposalState) -> tuple[list[list[Any]], list[list[Any]]]:
    """Every value's row (old, new, change, note), and the rows that change, in table order. `new` is what the
    decision applied when there is one (a person's value marked ✎, with the engineer's in the note), else what
    the engineer proposed (bold when it changes). A failed proposal applies nothing of its own: its table is the
    config in force, and a note gives each value the engineer proposed (`ProposalState.engineer_config`, what its
    rationale tells) where it differs from the row's."""
    p = state.proposal
    reasons = {a["field"]: a["reason"] for a in p.adjustments}
    offered, applied = state.config, state.applied  # offered: the table a person was shown to accept or edit
    engineer = state.engineer_config if state.failed else offered
    rows, changed = [], []
    for change in diff(state.base, applied or offered, frozenset(reasons)):
        field = change.field
        by_person = applied is not None and change.value(offered) != change.new
        proposed = None if engineer is None else change.value(engineer)
        unapplied = state.failed and not by_person and proposed is not None and proposed != change.new
        notes = []
        if change.adjusted and not by_person:
            said = (p.parsed_config or {}).get(change.knob)
            key = change.size if change.size is not None else change.count
            said = said.get(str(key), said.get(key)) if isinstance(said, dict) else said
            notes.append(f"⚠ {reasons.get(field, 'adjusted')}" + (f" (engineer said {said})" if said is not None
                                                                   else ""))
        if by_person:
            notes.append(f"{PERSON} set by {state.decision.user}"
                         + (f"; the engineer proposed {_fmt(proposed)}" if proposed is not None else ""))
        if unapplied:
            notes.append(f"the engineer proposed {_fmt(proposed)} (its proposal failed: not applied)")
        new = _fmt(change.new)
        new = f"{PERSON} {new}" if by_person else (f"**{new}**" if change.change != 0 else new)
        row = ["all" if change.size is None else change.size, field if change.size is None else change.knob,
               _fmt(change.old), new, _fmt(change.change, signed=True), "; ".join(notes)]
        rows.append(row)
        if change.change != 0 or by_person or unapplied:
            changed.append(row)
    return rows, changed


def _status(state: ProposalState) -> str:
    p, d = state.proposal, state.decision
    title = f"**Proposal #{p.id}** by the `{p.engineer}` engineer, after stage {p.after_stage}, " \
            f"for stage {p.after_stage + 1} ({when(p.created_at)})."
    if d is not None:
        done = f"{title}  \n✔ **{DECIDED[d.action]}** by **{as_text(d.user)}** at {when(d.created_at)}" + \
            (f": “{as_text(d.note)}”" if d.note else ".")
        if d.action == Action.EDIT:
            done += f"  \nThe diff and the table show the config as stored with the decision ({PERSON}: the " \
                    "person's value, where it differs from the engineer's)."
        return done
    if state.superseded:
        return f"{title}  \n**Superseded**: {state.superseded}. It can no longer be decided."
    if p.error:
        return f"{title}  \n✗ **The proposal failed**: {as_text(p.error)}. The config in force stays; edit it " \
               "below or reject to ask the engineer again."
    waiting = f"{title}  \n**Waiting for a decision.**"
    if (engineer := ENGINEERS.get(p.engineer)) is not None and engineer.same_when_asked_again:
        waiting += (f" Asked again, the `{p.engineer}` engineer answers this same config ({engineer.why_same}): "
                    "to change it, edit it below, or switch the run's engineer in the Train tab before rejecting.")
    return waiting


def _fmt(value: Any, signed: bool = False) -> str:
    if isinstance(value, float):
        text = f"{value:+.4g}" if signed else f"{value:.4g}"
    else:
        text = f"{value:+d}" if signed and isinstance(value, int) else str(value)
    return "0" if text in ("+0", "-0") else text


def proposal_preview(engine: Engine, proposal_id: int | None, n: int = 4) -> tuple[Any, str]:
    """A few boards the proposed config would generate (the config in force, for a failed proposal); once decided,
    the config its decision stored."""
    try:
        state = None if proposal_id is None else proposal_state(engine, int(proposal_id))
    except BAD_ROW as err:
        note = cannot_draw(f"Proposal {proposal_id}", None, err)
        return figures.empty_figure(note), note
    if state is None:
        return figures.empty_figure("no proposal"), ""
    seed = state.proposal.id
    try:
        boards = generate(state.applied or state.config, n, seed=seed)
    except GenerationError as err:
        return figures.empty_figure("this config cannot generate boards"), f"✗ {err}"
    panels = [(b, None, f"{b.size}x{b.size}, {len(b.holes)} holes{', needs a wait' if b.needs_wait else ''}")
              for b in boards]
    which = "stored with the decision" if state.applied is not None else \
        ("in force (the proposal failed)" if state.failed else "proposed")
    return figures.boards_figure(panels, ghost=True, columns=n, height=260), \
        f"{n} boards drawn from the config {which} (seed {seed}); dotted lines are the solver's plans."


def _problems(err: ConfigError) -> str:
    """The validator's problems, each once: a bad size is named by every knob of its row, and said once."""
    return "; ".join(dict.fromkeys(p.message if p.field == "size" else str(p) for p in err.records))


def _edit_config(rows: Sequence[Sequence[Any]] | None, agents: Any, instances: Any) -> dict[str, Any]:
    return config_from_table(rows or [], agents, instances)


def _stored_text(engineer: EnvConfig, projection: Projection) -> str:
    """What an edit stores, against the engineer's proposal: each value that differs as shown, and each share the
    projection rescaled so that data_ratio and agent_ratio sum to 1 (with what was typed) where the rescaling moves
    it from what was typed as shown (shares typed as the table rounds them are rescaled, but move no digit)."""
    made = projection.config
    typed = {a.field: a.old for a in projection.adjustments}
    moved = {a.field for a in projection.adjustments if _fmt(a.old) != _fmt(a.new)}
    parts = []
    for change in diff(engineer, made):
        field, now = change.field, _fmt(change.new)
        if field in moved or (change.change != 0 and now != _fmt(change.old)):
            parts.append(f"{field} {now}" + (f" (you typed {_fmt(typed[field])})" if field in moved else ""))
    text = ", ".join(parts) if parts else "the engineer's config as proposed (no value differs)"
    for name in ("data_ratio", AGENT_RATIO):  # in strict mode the only adjustments are these rescalings
        shares = [a.old for a in projection.adjustments if a.field.startswith(f"{name}[")]
        if any(field.startswith(f"{name}[") for field in moved):
            text += f"; the {name} shares you typed sum to {sum(shares):.4g}, so each is rescaled to make them sum to 1"
    return text


def bad_cells(problems: Sequence[ConfigProblem], rows: Sequence[Sequence[Any]]) -> list[tuple[int, int]]:
    """The (row, column) of the edit table that each problem names (a knob of a size: that knob's column in the
    size's row; a wrong size: the size cell of its row), for the page to mark them."""
    sizes = [str(row[0]).strip().removesuffix(".0") if row else "" for row in rows]
    cells = []
    for problem in problems:
        if problem.size is None or str(problem.size) not in sizes:
            continue
        row = sizes.index(str(problem.size))
        if problem.field == "size":
            cells.append((row, 0))
        elif problem.field in KNOB_COLUMNS:
            cells.append((row, KNOB_COLUMNS.index(problem.field)))
    return list(dict.fromkeys(cells))


def bad_mix_cells(problems: Sequence[ConfigProblem], rows: Sequence[Sequence[Any]]) -> list[tuple[int, int]]:
    """The (row, column) of the agent mix table that each `agent_ratio` problem names: the count cell of a count
    outside the rules' range (`legal` is then the counts' range) or of a key that is no count, the share cell of a
    share that is not a number or out of its range; every share cell where the shares sum to 0."""
    counts = [str(row[0]).strip().removesuffix(".0") if row else "" for row in rows]
    typed = [i for i, row in enumerate(rows) if row and any(str(v).strip() for v in row)]
    cells = []
    for problem in problems:
        if problem.field != AGENT_RATIO:
            continue
        if problem.count is not None and str(problem.count) in counts:
            cells.append((counts.index(str(problem.count)), 0 if problem.legal == AGENT_COUNTS else 1))
        elif problem.count is None and problem.legal == AGENT_COUNTS:  # a key that reads as no count
            cells += [(i, 0) for i in typed if not counts[i].lstrip("-").isdigit()]
        elif problem.count is None:
            cells += [(i, 1) for i in typed]
    return list(dict.fromkeys(cells))


def cell_marks(cells: Sequence[tuple[int, int]], table_id: str = "edit-config") -> str:
    """A style that outlines the given cells of a Gradio table in red."""
    if not cells:
        return ""
    chosen = ", ".join(f'#{table_id} [data-testid="cell-{row}-{col}"]' for row, col in cells)
    return f"<style>{chosen} {{ background: #fde2e2 !important; outline: 2px solid #d62728; }}</style>"


def rescaled(rows: Sequence[Sequence[Any]]) -> tuple[list[list[Any]], str]:
    """The edit table with its data_ratio shares divided by their sum (rounded to 4 places), and what was done;
    the table as it is when a share is not a number or they sum to 0."""
    column = KNOB_COLUMNS.index("data_ratio")
    table_rows = [list(r) for r in rows if r and any(str(v).strip() for v in r)]
    try:
        shares = [float(r[column]) for r in table_rows]
    except (TypeError, ValueError):
        return table_rows, "✗ Not rescaled: every data_ratio must be a number first."
    total = sum(shares)
    if total <= 0:
        return table_rows, "✗ Not rescaled: the data_ratio shares sum to 0."
    for r, share in zip(table_rows, shares, strict=True):
        r[column] = round(share / total, 4)
    return table_rows, f"The data_ratio shares summed to {total:.4g}: each is divided by it."


def edit_check(engine: Engine, proposal_id: int | None, rows: Sequence[Sequence[Any]] | None, agents: Any,
               instances: Any, state: ProposalState | None = None) -> tuple[str, bool, list[ConfigProblem]]:
    """While a person edits the table: what "Apply my edit" would store (the same projection `decide` makes),
    or the one line that says why it cannot be applied; whether it can; and the problems, to mark their cells.
    `state`: the proposal's state when the caller read it already (one read per keystroke)."""
    if state is None and proposal_id is not None:
        state = proposal_state(engine, int(proposal_id))
    if state is None or not state.pending:
        return "", True, []
    try:
        projection = project_edit(_edit_config(rows, agents, instances), state.base, state.config)
    except ConfigError as err:
        return f"✗ This edit cannot be applied: {_problems(err)}.", False, list(err.records)
    if (why := state.cannot_fill(projection.config)) is not None:  # the check `decide` runs: refused there too
        return f"✗ This config cannot be generated: {why}.", False, []
    if not projection.adjustments and not any(change.change for change in diff(state.config, projection.config)):
        if state.failed:
            return "The table is the config in force: *Apply my edit* keeps it for the next stage.", True, []
        return "The table is the engineer's proposal as it stands: *Accept* applies it.", True, []
    return f"*Apply my edit* will store: {_stored_text(state.config, projection)}.", True, []


def decide_proposal(engine: Engine, proposal_id: int | None, action: str, user: str, note: str = "",
                    rows: Sequence[Sequence[Any]] | None = None, agents: Any = None, instances: Any = None,
                    probes: list[str] | None = None) -> str:
    """Accept, edit or reject a proposal and move the run on; returns the message for the page.

    An invalid edit is refused with the validator's message naming the field and range, and nothing is
    stored; a stored edit is told value by value; when someone else decided first, the message says who and
    what. `probes`: the keys of the probes the person saw (the Measure panel), kept with the decision.
    """
    if proposal_id is None:
        return "No proposal is open."
    edited = _edit_config(rows, agents, instances) if action == Action.EDIT else None
    try:  # one session: the decision, what it stores and the run's next step
        done, step = decide_and_advance(engine, int(proposal_id), action, user, edited=edited, note=note or "",
                                        probes=probes or None)
    except AlreadyDecided as err:
        d = err.decision
        return (f"⚠ Someone decided first: proposal #{proposal_id} was already {DECIDED[d.action]} by "
                f"**{as_text(d.user)}** at {when(d.created_at)}. Your {action} was not recorded.")
    except ConfigError as err:
        return "✗ Not saved, the edit is not valid: " + _problems(err)
    except (ProposalError, LookupError) as err:
        return f"✗ {err}"
    stored = None if done.edit is None else _stored_text(done.proposed, done.edit)
    said = f"✓ Proposal #{proposal_id} {DECIDED[action]} by {as_text(user)}"
    said += f"; stored: {stored}." if stored else "."
    return f"{said} Next: {step.text}."


def toggle_auto_apply(engine: Engine, run_id: int | None, on: bool) -> str:
    if run_id is None:
        return "No run is open."
    set_run_auto_apply(engine, run_id, bool(on))
    if not on:
        return f"Auto-apply is off for run #{run_id}: each proposal waits for a person."
    step = advance(engine, run_id)
    return f"Auto-apply is on for run #{run_id}: proposals are accepted as they come. Now: {step.text}."


@dataclass(eq=False)
class ProposalTab:
    """The tab's widgets. `decided` are the events of the decision buttons and the auto-apply box, for the
    page to refresh the Train tab after them."""

    engine: Engine
    pick: gr.Dropdown
    auto: gr.Checkbox
    status: gr.Markdown
    rationale: gr.Markdown
    raw: gr.Textbox
    changed_only: gr.Checkbox
    diff: gr.Dataframe
    preview_note: gr.Markdown
    preview: gr.Plot
    edit: gr.Dataframe
    agents: gr.Dataframe  # the agent mix table (`mix_rows`)
    instances: gr.Number
    check: gr.Markdown
    marks: gr.HTML  # a style that marks the edit table's bad cells
    note: gr.Textbox
    buttons: dict[Action, gr.Button]
    message: gr.Markdown
    decided: list[Any]
    shown: gr.State  # the proposal drawn: what every event reads, never the dropdown's value in flight
    measure: measure.MeasurePanel | None = None

    @property
    def outputs(self) -> list[Any]:
        """What `show_all` fills: the dropdown and everything `show` does."""
        return [self.pick, self.status, self.rationale, self.raw, self.changed_only, self.diff, self.edit,
                self.agents, self.instances, self.check, self.marks, self.auto, self.note, self.shown,
                *self.buttons.values()]

    def show(self, proposal_id: int | None, edit_table: bool = True) -> dict[Any, Any]:
        """One proposal; without `edit_table` the edit table and the note stay as typed (a refused edit is kept).
        With it (another proposal, or one decided) the note box is emptied: a note belongs to one decision."""
        v = proposal_view(self.engine, proposal_id)
        out = {self.status: v.status, self.rationale: v.rationale, self.raw: v.raw,
               self.changed_only: True, self.diff: v.changed, self.auto: v.auto, self.shown: proposal_id} | \
            self.button_states(v.pending, v.failed)
        if edit_table:
            out |= {self.edit: gr.update(value=v.edit, label=v.label), self.agents: v.agents,
                    self.instances: v.instances, self.check: "", self.marks: "", self.note: ""}
        return out

    def button_states(self, pending: bool, failed: bool, ok: bool = True) -> dict[Any, Any]:
        """The decision buttons: enabled while the proposal waits (Accept and the edit while the table can be
        applied); a failed proposal has nothing to accept, so Accept is disabled and the edit is the main button."""
        return {self.buttons[Action.ACCEPT]: gr.update(interactive=pending and ok and not failed,
                                                      variant="secondary" if failed else "primary"),
                self.buttons[Action.EDIT]: gr.update(interactive=pending and ok,
                                                    variant="primary" if failed else "secondary"),
                self.buttons[Action.REJECT]: gr.update(interactive=pending)}

    def show_diff(self, proposal_id: int | None, changed_only: bool) -> dict[Any, Any]:
        v = proposal_view(self.engine, proposal_id)
        return {self.diff: v.changed if changed_only else v.diff}

    def show_all(self, run_id: int | None, proposal_id: int | None = None, edit_table: bool = True) -> dict[Any, Any]:
        """The run's proposals in the dropdown, and the one asked for (else the one that waits, else the newest)
        shown."""
        try:  # one read of the run's proposals: the choices and the one chosen among them agree
            states = [] if run_id is None else proposal_states(self.engine, run_id)
            choices = proposal_choices(self.engine, run_id, states)
            ids = [choice[1] for choice in choices]
            chosen = proposal_id if proposal_id in ids else (pending_of(self.engine, run_id, states) or
                                                              (ids[0] if ids else None))
        except BAD_ROW as err:  # this run's rows cannot be read: say so, and the other runs still draw
            return {self.pick: gr.update(choices=[], value=None)} | self.show(None) | {
                self.status: cannot_draw("The Proposal tab", run_id, err)}
        return {self.pick: gr.update(choices=choices, value=chosen)} | self.show(chosen, edit_table)

    def follow(self, run_id: int | None, shown: int | None, jump: bool = True) -> dict[Any, Any]:
        """After the database changed (the page's poll): with `jump` (a proposal was stored) the one that now
        waits is selected; the one shown stays otherwise, and a table the person is editing (the shown proposal
        still waits) is kept."""
        try:
            waiting = pending_of(self.engine, run_id)
            chosen = waiting if waiting is not None and (jump or shown is None) else shown
            state = None if chosen is None else proposal_state(self.engine, int(chosen))
        except BAD_ROW:
            return self.show_all(run_id)
        return self.show_all(run_id, chosen, edit_table=chosen != shown or state is None or not state.pending)

    def after_decision(self, run_id: int | None, proposal_id: int | None) -> dict[Any, Any]:
        """The proposal as it now stands: the config as stored once decided, and its boards drawn again from it (the
        proposal shown stays the same, so the preview's own event does not fire); a refused edit stays as typed."""
        state = None if proposal_id is None else proposal_state(self.engine, int(proposal_id))
        return self.show_all(run_id, proposal_id, edit_table=state is None or not state.pending) | \
            self.show_preview(proposal_id)

    def show_preview(self, proposal_id: int | None) -> dict[Any, Any]:
        fig, note = proposal_preview(self.engine, proposal_id)
        return {self.preview: fig, self.preview_note: note}

    def checker(self, proposal_id: int | None, rows: Any, agents: Any, instances: Any) -> dict[Any, Any]:
        """The edit checked as it is typed: what would be stored, or why not, with the bad cells marked (and
        then no decision button but Reject is enabled)."""
        state = None if proposal_id is None else proposal_state(self.engine, int(proposal_id))  # the one read
        text, ok, problems = edit_check(self.engine, proposal_id, rows, agents, instances, state)
        pending = state is not None and state.pending
        marks = "" if ok else (cell_marks(bad_cells(problems, rows or []))
                               + cell_marks(bad_mix_cells(problems, agents or []), "edit-agents"))
        buttons = self.button_states(pending, state is not None and state.failed, ok)
        del buttons[self.buttons[Action.REJECT]]  # a rejection needs no table
        return {self.check: text, self.marks: marks} | buttons

    def rescale(self, proposal_id: int | None, rows: Any, agents: Any, instances: Any) -> dict[Any, Any]:
        """One click: the table's data_ratio shares made to sum to 1, then checked as if typed."""
        table_rows, done = rescaled(rows or [])
        checked = self.checker(proposal_id, table_rows, agents, instances)
        return checked | {self.edit: table_rows, self.check: f"{done} {checked[self.check]}"}

    def decider(self, action: Action):
        def decide(proposal_id, note, rows, agents, instances, seen, request: gr.Request) -> dict[Any, Any]:
            said = decide_proposal(self.engine, proposal_id, action, user_of(request), note, rows, agents,
                                   instances, seen)
            # A note is typed for one decision: once one is recorded (or lost to someone else's), the box empties.
            recorded = said.startswith(("✓", "⚠"))
            return {self.message: said} | ({self.note: ""} if recorded else {})
        return decide

    def toggle(self, run_id: int | None, on: bool) -> dict[Any, Any]:
        return {self.message: toggle_auto_apply(self.engine, run_id, on)}


def build(page: Page) -> ProposalTab:
    with gr.Row():
        pick = gr.Dropdown(label="Proposal", choices=[], value=None, scale=2, elem_id="proposal-pick")
        auto = gr.Checkbox(label="Auto-apply this run's proposals", value=False, scale=1, elem_id="auto-apply")
    status = gr.Markdown(elem_id="proposal-status")
    with gr.Row():
        with gr.Column(scale=2):
            gr.Markdown("#### The engineer's rationale")
            rationale = gr.Markdown(elem_id="rationale")
            with gr.Accordion("Raw answer", open=False):
                raw = gr.Textbox(show_label=False, lines=8, interactive=False)
        with gr.Column(scale=3):
            changed_only = gr.Checkbox(label="Changed values only", value=True, elem_id="changed-only")
            diff_df = gr.Dataframe(label=f"Config diff (new in bold when it changes; {PERSON}: a person's edit; "
                                         "⚠: the projection adjusted the engineer's value)",
                                   interactive=False, elem_id="diff", max_height=440, wrap=True,
                                   datatype=["str", "str", "str", "markdown", "str", "str"],
                                   column_widths=["7%", "15%", "11%", "13%", "11%", "43%"])
    preview_note = gr.Markdown()
    preview = gr.Plot(label="Boards this config would generate")
    with gr.Accordion("Edit before applying", open=False, elem_id="edit-accordion"):
        check = gr.Markdown(elem_id="edit-check")
        marks = gr.HTML(elem_id="edit-marks")
        edit = gr.Dataframe(headers=KNOB_COLUMNS, type="array", interactive=True, elem_id="edit-config",
                            label=EDIT_LABEL)
        with gr.Row():
            agents = gr.Dataframe(headers=MIX_COLUMNS, type="array", interactive=True, static_columns=[2],
                                  elem_id="edit-agents", label=MIX_LABEL, scale=2)
            with gr.Column(scale=1):
                # No `precision=0`: it would round 1.5 to 2 unsaid; the config's validator names a fraction instead.
                instances = gr.Number(label="num_instances", elem_id="edit-instances")
                rescale = gr.Button("Rescale data_ratio to sum to 1", min_width=240, elem_id="rescale")
    shown = gr.State(None)
    measured = measure.build(page, shown, edit, agents, instances)
    note = gr.Textbox(label="Note (kept with this decision only)", lines=1, elem_id="decision-note",
                      max_length=TEXT_LIMIT)
    message = gr.Markdown(elem_id="decision-msg")
    with gr.Row():
        buttons = {Action.ACCEPT: gr.Button("Accept", variant="primary", elem_id="accept"),
                   Action.EDIT: gr.Button("Apply my edit", elem_id="submit-edit"),
                   Action.REJECT: gr.Button("Reject and ask again", variant="stop", elem_id="reject")}
    tab = ProposalTab(page.engine, pick, auto, status, rationale, raw, changed_only, diff_df, preview_note, preview,
                      edit, agents, instances, check, marks, note, buttons, message, [], shown, measured)
    _wire_decisions(page, tab)
    rescale.click(tab.rescale, [shown, edit, agents, instances],
                  [edit, check, marks, *buttons.values()], **no_progress(page))
    return tab


def _wire_decisions(page: Page, tab: ProposalTab) -> None:
    shown = [o for o in tab.outputs if o is not tab.pick]
    after = [*tab.outputs, tab.preview, tab.preview_note]  # `after_decision`'s
    tab.pick.select(tab.show, tab.pick, shown, show_progress_on=tab.pick, trigger_mode="always_last", **VIEW)
    tab.shown.change(tab.show_preview, tab.shown, [tab.preview, tab.preview_note], trigger_mode="always_last")
    tab.changed_only.input(tab.show_diff, [tab.shown, tab.changed_only], tab.diff, trigger_mode="always_last")
    # Gradio drops an input event while the one before it is pending (its default "once"): the last edit must
    # always be the one checked, so a new one runs after the pending one (as every input event of the page does).
    gr.on([tab.edit.input, tab.agents.input, tab.instances.input], tab.checker,
          [tab.shown, tab.edit, tab.agents, tab.instances], [tab.check, tab.marks, *tab.buttons.values()],
          trigger_mode="always_last", **no_progress(page))
    for action, button in tab.buttons.items():
        tab.decided.append(
            button.click(tab.decider(action), [tab.shown, tab.note, tab.edit, tab.agents, tab.instances,
                                               tab.measure.seen], [tab.message, tab.note])
            .then(tab.after_decision, [page.run_pick, tab.shown], after, **no_progress(page)))
    tab.auto.input(tab.toggle, [page.run_pick, tab.auto], tab.message, trigger_mode="always_last") \
        .then(tab.after_decision, [page.run_pick, tab.shown], after, **no_progress(page))
