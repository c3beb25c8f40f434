"""The Proposal tab: the engineer's rationale and diff, boards its config would make, and the decision
(accept, edit, reject and ask again, or auto-apply the run's proposals)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gradio as gr
from sqlalchemy import Engine

from envsim.config import ConfigError
from envsim.generator import GenerationError, generate
from lab.loop import advance
from lab.pages import figures, measure
from lab.pages.common import DECIDED, KNOB_COLUMNS, Page, config_from_table, config_rows, table, user_of, when
from lab.proposals import AlreadyDecided, ProposalError, ProposalState, decide_on, proposal_state, proposal_states
from lab.runs import run_of_proposal, set_run_auto_apply
from storage.models import Action

DIFF_HEADERS = ["size", "knob", "old", "new", "change", "projection"]


def proposal_choices(engine: Engine, run_id: int | None) -> list[tuple[str, int]]:
    if run_id is None:
        return []
    out = []
    for st in proposal_states(engine, run_id):
        p, d = st.proposal, st.decision
        state = f"{DECIDED[d.action]} by {d.user}" if d else ("failed, pending" if p.error else "pending")
        if st.superseded:
            state = "superseded"
        out.append((f"#{p.id} for stage {p.after_stage + 1}: {state}", p.id))
    return out


def proposal_view(engine: Engine, proposal_id: int | None) -> dict[str, Any]:
    """What the Proposal tab shows: status (who decided what and when), rationale, diff and the edit table."""
    if proposal_id is None:
        return dict(status="No proposal yet: the engineer proposes after a stage has been evaluated.",
                    rationale="", raw="", diff=table(DIFF_HEADERS, []), edit=[], agents=2, instances=512,
                    auto=False, pending=False, run_id=None)
    st = proposal_state(engine, int(proposal_id))
    if st is None:
        return proposal_view(engine, None) | {"status": f"There is no proposal {proposal_id}."}
    p, config = st.proposal, st.config
    rows = _diff_rows(st)
    changed = sum(1 for r in rows if r[4] not in ("0", "+0"))
    adjusted = len({a["field"] for a in p.adjustments})
    summary = f"{changed} of {len(rows)} values change"
    summary += f"; the projection adjusted {adjusted}." if adjusted else "."
    # Markdown joins single newlines; the heuristic engineer writes one line per change, so keep them apart.
    written = p.rationale.replace("\n", "  \n") if p.rationale else "_The engineer gave no rationale._"
    return dict(status=_status(st), rationale=f"{written}\n\n{summary}", raw=p.raw_answer,
                diff=table(DIFF_HEADERS, rows), edit=config_rows(config), agents=config.num_agents,
                instances=config.num_instances, auto=st.auto_apply, pending=st.pending, run_id=p.run_id)


def _diff_rows(st: ProposalState) -> list[list[Any]]:
    p = st.proposal
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
    return rows


def _status(st: ProposalState) -> str:
    p, d = st.proposal, st.decision
    title = f"**Proposal #{p.id}** by the `{p.engineer}` engineer, after stage {p.after_stage}, " \
            f"for stage {p.after_stage + 1} ({when(p.created_at)})."
    if d is not None:
        return f"{title}  \n✔ **{DECIDED[d.action]}** by **{d.user}** at {when(d.created_at)}" + \
            (f": “{d.note}”" if d.note else ".")
    if st.superseded:
        return f"{title}  \n**Superseded**: {st.superseded}. It can no longer be decided."
    if p.error:
        return f"{title}  \n✗ **The proposal failed**: {p.error}. The config in force stays; edit it " \
               "below or reject to ask the engineer again."
    return f"{title}  \n**Waiting for a decision.**"


def _fmt(value: Any, signed: bool = False) -> str:
    if isinstance(value, float):
        text = f"{value:+.4g}" if signed else f"{value:.4g}"
    else:
        text = f"{value:+d}" if signed and isinstance(value, int) else str(value)
    return "0" if text in ("+0", "-0") else text


def proposal_preview(engine: Engine, proposal_id: int | None, n: int = 4) -> tuple[Any, str]:
    """A few boards the proposed config would generate (the config in force, for a failed proposal)."""
    st = None if proposal_id is None else proposal_state(engine, int(proposal_id))
    if st is None:
        return figures.empty_figure("no proposal"), ""
    seed = st.proposal.id
    try:
        boards = generate(st.config, n, seed=seed)
    except GenerationError as err:
        return figures.empty_figure("this config cannot generate boards"), f"✗ {err}"
    panels = [(b, None, f"{b.size}x{b.size}, {len(b.holes)} holes{', needs a wait' if b.needs_wait else ''}")
              for b in boards]
    return figures.boards_figure(panels, ghost=True, columns=n, height=260), \
        f"{n} boards drawn from the proposed config (seed {seed}); dotted lines are the solver's plans."


def decide_proposal(engine: Engine, proposal_id: int | None, action: str, user: str, note: str = "",
                    rows: Sequence[Sequence[Any]] | None = None, agents: Any = None, instances: Any = None,
                    probes: list[str] | None = None) -> str:
    """Accept, edit or reject a proposal and move the run on; returns the message for the page.

    An invalid edit is refused with the validator's message naming the field and range, and nothing is
    stored; when someone else decided first, the message says who and what. `probes`: the keys of the probes
    the person saw (the Measure panel), kept with the decision.
    """
    if proposal_id is None:
        return "No proposal is open."
    edited = config_from_table(rows or [], agents, instances) if action == Action.EDIT else None
    try:
        decide_on(engine, int(proposal_id), action, user, edited=edited, note=note or "", probes=probes or None)
    except AlreadyDecided as err:
        d = err.decision
        return (f"⚠ Someone decided first: proposal #{proposal_id} was already {DECIDED[d.action]} by "
                f"**{d.user}** at {when(d.created_at)}. Your {action} was not recorded.")
    except ConfigError as err:
        return "✗ Not saved, the edit is not valid: " + "; ".join(err.problems)
    except ProposalError as err:
        return f"✗ {err}"
    run_id = run_of_proposal(engine, int(proposal_id))
    return f"✓ Proposal #{proposal_id} {DECIDED[action]} by {user}. Next: {advance(engine, run_id)}."


def toggle_auto_apply(engine: Engine, run_id: int | None, on: bool) -> str:
    if run_id is None:
        return "No run is open."
    set_run_auto_apply(engine, run_id, bool(on))
    if not on:
        return f"Auto-apply is off for run #{run_id}: each proposal waits for a person."
    return f"Auto-apply is on for run #{run_id}: proposals are accepted as they come. Now: {advance(engine, run_id)}."


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
    diff: gr.Dataframe
    preview_note: gr.Markdown
    preview: gr.Plot
    edit: gr.Dataframe
    agents: gr.Number
    instances: gr.Number
    note: gr.Textbox
    buttons: dict[Action, gr.Button]
    message: gr.Markdown
    decided: list[Any]
    measure: measure.MeasurePanel | None = None

    @property
    def outputs(self) -> list[Any]:
        """What `show_all` fills: the dropdown and everything `show` does."""
        return [self.pick, self.status, self.rationale, self.raw, self.diff, self.edit, self.agents, self.instances,
                self.auto, *self.buttons.values()]

    def show(self, proposal_id: int | None, edit_table: bool = True) -> dict[Any, Any]:
        """One proposal; without `edit_table` the edit table stays as typed (a refused edit is kept)."""
        v = proposal_view(self.engine, proposal_id)
        out = {self.status: v["status"], self.rationale: v["rationale"], self.raw: v["raw"], self.diff: v["diff"],
               self.auto: v["auto"]} | {b: gr.update(interactive=v["pending"]) for b in self.buttons.values()}
        if edit_table:
            out |= {self.edit: v["edit"], self.agents: v["agents"], self.instances: v["instances"]}
        return out

    def show_all(self, run_id: int | None, proposal_id: int | None = None, edit_table: bool = True) -> dict[Any, Any]:
        """The run's proposals in the dropdown, and the one asked for (else the newest) shown."""
        choices = proposal_choices(self.engine, run_id)
        ids = [c[1] for c in choices]
        chosen = proposal_id if proposal_id in ids else (ids[0] if ids else None)
        return {self.pick: gr.update(choices=choices, value=chosen)} | self.show(chosen, edit_table)

    def after_decision(self, run_id: int | None, proposal_id: int | None) -> dict[Any, Any]:
        return self.show_all(run_id, proposal_id, edit_table=False)

    def show_preview(self, proposal_id: int | None) -> dict[Any, Any]:
        fig, note = proposal_preview(self.engine, proposal_id)
        return {self.preview: fig, self.preview_note: note}

    def decider(self, action: Action):
        def decide(proposal_id, note, rows, agents, instances, seen, request: gr.Request) -> dict[Any, Any]:
            return {self.message: decide_proposal(self.engine, proposal_id, action, user_of(request), note, rows,
                                                  agents, instances, seen)}
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
            diff = gr.Dataframe(label="Config diff (⚠: the projection adjusted the engineer's value)",
                                interactive=False, elem_id="diff", max_height=440, wrap=True,
                                column_widths=["8%", "16%", "10%", "10%", "10%", "46%"])
    preview_note = gr.Markdown()
    preview = gr.Plot(label="Boards this config would generate")
    with gr.Accordion("Edit before applying", open=False):
        edit = gr.Dataframe(headers=KNOB_COLUMNS, type="array", interactive=True, elem_id="edit-config",
                            label="Config to apply (one row per map size)")
        with gr.Row():
            agents = gr.Number(label="num_agents", precision=0)
            instances = gr.Number(label="num_instances", precision=0)
    measured = measure.build(page.engine, pick, edit, agents, instances)
    note = gr.Textbox(label="Note (kept with the decision)", lines=1)
    with gr.Row():
        buttons = {Action.ACCEPT: gr.Button("Accept", variant="primary", elem_id="accept"),
                   Action.EDIT: gr.Button("Apply my edit", elem_id="submit-edit"),
                   Action.REJECT: gr.Button("Reject and ask again", variant="stop", elem_id="reject")}
    message = gr.Markdown(elem_id="decision-msg")
    tab = ProposalTab(page.engine, pick, auto, status, rationale, raw, diff, preview_note, preview, edit, agents,
                      instances, note, buttons, message, [], measured)
    _wire_decisions(page, tab)
    return tab


def _wire_decisions(page: Page, tab: ProposalTab) -> None:
    shown = [o for o in tab.outputs if o is not tab.pick]
    tab.pick.input(tab.show, tab.pick, shown).then(tab.show_preview, tab.pick, [tab.preview, tab.preview_note])
    tab.pick.change(tab.show_preview, tab.pick, [tab.preview, tab.preview_note], trigger_mode="always_last")
    decided_out = [o for o in tab.outputs if o not in (tab.edit, tab.agents, tab.instances)]
    for action, button in tab.buttons.items():
        tab.decided.append(
            button.click(tab.decider(action), [tab.pick, tab.note, tab.edit, tab.agents, tab.instances,
                                               tab.measure.seen], tab.message)
            .then(tab.after_decision, [page.run_pick, tab.pick], decided_out))
    tab.auto.input(tab.toggle, [page.run_pick, tab.auto], tab.message) \
        .then(tab.after_decision, [page.run_pick, tab.pick], decided_out)
