"""Proposals and decisions: what an engineer returned, its diff against the config in force, and what a
person (or auto-apply) did with it.

A proposal is stored before anyone decides. A decision goes through `storage.decisions.record_decision`,
whose UNIQUE constraint makes "one decision per proposal" a fact of the database: when two people click
at once, one wins and the other gets `AlreadyDecided` naming the winner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session, select

from envsim.config import (
    AGENT_RATIO,
    GLOBALS,
    KNOBS,
    NUM_AGENTS,
    RANDOM_SHARE,
    ConfigError,
    EnvConfig,
    Projection,
    project,
)
from envsim.generator import Unfillable, cannot_fill, stage_seed
from lab.engineers import EngineerAnswer
from lab.text import TEXT_LIMIT, clipped, too_long
from storage.db import lock_run, stage_at
from storage.db import session as open_session
from storage.decisions import AlreadyDecided, record_decision
from storage.models import Action, Decision, Proposal, Replay, Run, Stage

__all__ = ["AlreadyDecided", "Change", "Decided", "ProposalError", "ProposalState", "Superseded", "current_proposal",
           "decide", "decision_of", "diff", "fill_check", "fillable", "project_edit", "proposal_state",
           "proposal_states", "self_summary", "store_proposal"]


class ProposalError(ValueError):
    """A decision that cannot be taken as asked (e.g. accepting a proposal that failed)."""


class Superseded(ProposalError):
    """The proposal is no longer its run's current one (a newer one replaced it, or its stage has passed)."""


@dataclass(frozen=True)
class Change:
    """One knob of one size (`size` None for a global knob; `count`: the agent count of an `agent_ratio` share):
    old and new values, and whether projection had to adjust the engineer's value."""

    knob: str
    size: int | None
    old: float
    new: float
    change: float
    adjusted: bool
    count: int | None = None

    @property
    def field(self) -> str:
        """The value's name as adjustments and the page say it: `wait_ratio[3]`, `agent_ratio[2]`, `num_instances`."""
        key = self.size if self.size is not None else self.count
        return self.knob if key is None else f"{self.knob}[{key}]"

    def value(self, config: EnvConfig) -> float:
        """This value in `config` (a share of an agent count the config does not name: 0)."""
        if self.count is not None:
            return config.agent_ratio.get(self.count, 0.0)
        knob = getattr(config, self.knob)
        return knob if self.size is None else knob[self.size]


def diff(old: EnvConfig, new: EnvConfig, adjusted_fields: frozenset[str] = frozenset()) -> list[Change]:
    """Every knob of every size, in table order (sizes, then knobs, then the agent mix by count, then globals),
    changed or not; `random_share` last, where either config draws boards broadly (a row of 0 -> 0 would only say
    that nothing is). An `agent_ratio` share counts as adjusted where the answer's `num_agents` was."""
    out = [Change(k, s, getattr(old, k)[s], getattr(new, k)[s], getattr(new, k)[s] - getattr(old, k)[s],
                  f"{k}[{s}]" in adjusted_fields)
           for s in new.sizes for k in KNOBS]
    for count in sorted(old.agent_ratio.keys() | new.agent_ratio.keys()):
        was, now = old.agent_ratio.get(count, 0.0), new.agent_ratio.get(count, 0.0)
        out.append(Change(AGENT_RATIO, None, was, now, now - was,
                          f"{AGENT_RATIO}[{count}]" in adjusted_fields or NUM_AGENTS in adjusted_fields, count))
    out += [Change(g, None, getattr(old, g), getattr(new, g), getattr(new, g) - getattr(old, g), g in adjusted_fields)
            for g in GLOBALS]
    if old.random_share or new.random_share:
        out.append(Change(RANDOM_SHARE, None, old.random_share, new.random_share,
                          new.random_share - old.random_share, RANDOM_SHARE in adjusted_fields))
    return out


SUMMARY_CHARS = 300  # the most of one earlier rationale the self-summary repeats
PAST = {Action.ACCEPT: "accepted", Action.EDIT: "edited", Action.REJECT: "rejected"}


def self_summary(session: Session, run_id: int, before_stage: int) -> str | None:
    """The engineer's own words from the run's earlier rounds, one line per proposal made after a stage before
    `before_stage`, with what became of it: the context's self-summary module. None when there were none."""
    rows = session.exec(select(Proposal).where(Proposal.run_id == run_id, Proposal.after_stage < before_stage)
                        .order_by(Proposal.after_stage, Proposal.id)).all()
    lines = []
    for p in rows:
        said = " ".join((p.rationale or "").split())
        said = said[:SUMMARY_CHARS] + ("…" if len(said) > SUMMARY_CHARS else "")
        decision = decision_of(session, p.id)
        if p.error:
            fate = f"failed: {p.error}"
        elif decision is None:
            fate = "not decided"
        else:
            fate = "auto-applied" if decision.action == Action.AUTO else f"{PAST[decision.action]} by {decision.user}"
        lines.append(f"- after stage {p.after_stage}: {said or '(no rationale)'} [{fate}]")
    return "\n".join(lines) or None


def fill_check(run_seed: int, stage_index: int) -> Callable[[EnvConfig], Unfillable | None]:
    """The generator's check for a run's stage: why that stage's seed cannot fill a config (`Unfillable`: the size
    and the generator's message), or None when it can. Remembered per config and seed in this process, since an
    unfillable config costs every try (and a person's edit is checked as it is typed, then again as it is
    decided): the generator is a pure function of them."""
    seed = stage_seed(run_seed, stage_index)

    def check(config: EnvConfig) -> Unfillable | None:
        return _cannot_fill(config.model_dump_json(), seed)

    return check


@lru_cache(maxsize=256)
def _cannot_fill(config_json: str, seed: int) -> Unfillable | None:
    return cannot_fill(EnvConfig.model_validate_json(config_json), seed)


def fillable(answer: EngineerAnswer, check: Callable[[EnvConfig], Unfillable | None]) -> EngineerAnswer:
    """The answer, or the answer failed with the generator's message when its config cannot be generated: a
    stage is never queued on a config its boards cannot be drawn from (it would fail the same way on every
    resume)."""
    if answer.projection is None or (why := check(answer.projection.config)) is None:
        return answer
    return replace(answer, projection=None, error=f"the generator cannot fill the proposed config: {why}")


def store_proposal(session: Session, run_id: int, after_stage: int, engineer: str, answer: EngineerAnswer,
                   current: EnvConfig) -> Proposal:
    """Keep everything an engineer returned, with its diff; a failed answer is kept too, with its error. The boards
    it would replay (`EngineerAnswer.replay`) are kept with a config only: a failed answer replays nothing. Its
    prompt, raw answer and rationale are kept up to `lab.text.ANSWER_LIMIT` characters each (`clipped`)."""
    projection = answer.projection
    changes: list[Change] = []
    if projection is not None:
        adjusted = frozenset(a.field for a in projection.adjustments)
        changes = diff(current, projection.config, adjusted)
    row = Proposal(
        run_id=run_id, after_stage=after_stage, engineer=engineer, prompt=clipped(answer.prompt),
        raw_answer=clipped(answer.raw),
        parsed_config=answer.proposed,
        projected_config=projection.config if projection else None,
        adjustments=[{"field": a.field, "old": _json(a.old), "new": _json(a.new), "reason": a.reason}
                     for a in (projection.adjustments if projection else ())],
        rationale=clipped(answer.rationale), diff={"changes": [asdict(change) for change in changes]},
        error=answer.error, compute=answer.compute,
        replay=Replay(boards=answer.replay) if answer.replay and projection is not None else None,
    )
    session.add(row)
    session.commit()
    session.refresh(row)
    return row


def _json(value: Any) -> Any:
    """Adjustment values can be NaN-free floats, ints, None or (for huge clamped numbers) anything: keep it JSON."""
    return value if value is None or isinstance(value, int | float | str) else repr(value)


def decision_of(session: Session, proposal_id: int) -> Decision | None:
    return session.exec(select(Decision).where(Decision.proposal_id == proposal_id)).one_or_none()


def current_proposal(session: Session, run_id: int) -> Proposal | None:
    """The proposal that decides the run's next stage: the newest one after the run's last stage.

    Every other undecided proposal of the run is superseded: it can be read, never decided.
    """
    last = session.exec(select(Stage.index).where(Stage.run_id == run_id).order_by(Stage.index.desc())).first()
    if last is None:
        return None
    return session.exec(select(Proposal).where(Proposal.run_id == run_id, Proposal.after_stage == last)
                        .order_by(Proposal.id.desc())).first()


def superseded_by(session: Session, proposal: Proposal) -> str | None:
    """Why `proposal` can no longer be decided, or None while it is the run's current one."""
    current = current_proposal(session, proposal.run_id)
    if current is not None and current.id == proposal.id:
        return None
    if current is not None and current.after_stage == proposal.after_stage:
        return f"proposal {proposal.id} was superseded by proposal {current.id}"
    return f"proposal {proposal.id} was superseded: stage {proposal.after_stage + 1} has its config already"


@dataclass(frozen=True)
class ProposalState:
    """A proposal as a person reviews it: its decision, or why it can no longer be decided, the config in
    force when it was made, and whether its run applies proposals by itself."""

    proposal: Proposal
    decision: Decision | None
    superseded: str | None  # `superseded_by`'s reason; None when decided or still the run's current one
    base: EnvConfig  # the config of stage `after_stage`, which the proposal would replace
    auto_apply: bool
    stage_seconds: float | None = None  # stage `after_stage`'s own wall time (training and evaluation)
    run_seed: int = 0  # its run's seed: the next stage's boards are drawn from it (`cannot_fill`)

    @property
    def pending(self) -> bool:
        return self.decision is None and self.superseded is None

    @property
    def failed(self) -> bool:
        """The proposal failed (`Proposal.error`): it has no config to accept, only one to edit or reject."""
        return self.proposal.projected_config is None

    @property
    def config(self) -> EnvConfig:
        """The config the proposal would apply: its projected one, or (a failed proposal) the one in force."""
        return _proposed(self.proposal, self.base)

    @property
    def engineer_config(self) -> EnvConfig | None:
        """What the engineer proposed: the projected config, or for a failed proposal its answer's config projected
        as the engineer's answers are (what its rationale tells; None where the answer had none that reads)."""
        if self.proposal.projected_config is not None:
            return self.proposal.projected_config
        if self.proposal.parsed_config is None:
            return None
        try:
            return project(self.proposal.parsed_config, self.base).config
        except ConfigError:
            return None

    def cannot_fill(self, config: EnvConfig) -> Unfillable | None:
        """Why the stage this proposal decides cannot generate `config`: the check `decide` runs on an edit."""
        return fill_check(self.run_seed, self.proposal.after_stage + 1)(config)

    @property
    def applied(self) -> EnvConfig | None:
        """The config its decision applied (`Decision.config`: a person's edit as stored), None while undecided
        or when it was rejected."""
        d = self.decision
        return d.config if d is not None else None


def _state(s: Session, proposal: Proposal) -> ProposalState:
    run = s.get(Run, proposal.run_id)
    decision = decision_of(s, proposal.id)
    base = stage_at(s, proposal.run_id, proposal.after_stage)
    took = (base.finished_at - base.started_at).total_seconds() if base.started_at and base.finished_at else None
    return ProposalState(proposal, decision, superseded_by(s, proposal) if decision is None else None,
                         base.config, run.settings.auto_apply, took, run.seed)


def proposal_state(engine: Engine, proposal_id: int) -> ProposalState | None:
    with open_session(engine) as s:
        proposal = s.get(Proposal, proposal_id)
        return None if proposal is None else _state(s, proposal)


def proposal_states(engine: Engine, run_id: int) -> list[ProposalState]:
    """A run's proposals, newest first."""
    with open_session(engine) as s:
        proposals = s.exec(select(Proposal).where(Proposal.run_id == run_id).order_by(Proposal.id.desc()))
        return [_state(s, p) for p in proposals]


def _proposed(proposal: Proposal, base: EnvConfig) -> EnvConfig:
    """The config a proposal would apply: its projected one, or (a failed proposal) `base`, the one in force."""
    return proposal.projected_config or base


def project_edit(edited: Any, base: EnvConfig, proposed: EnvConfig) -> Projection:
    """A person's edit (a config JSON object, e.g. the page's table) validated strictly and projected against
    `base`, the config in force: `ConfigError` naming the field and range when it is invalid. The table has no cell
    for `random_share`, so an edit that leaves it out keeps the one of `proposed` (`ProposalState.config`). What
    the page shows while a person types, what is measured and what `decide` stores are this projection."""
    if isinstance(edited, dict) and RANDOM_SHARE not in edited:
        edited = {**edited, RANDOM_SHARE: proposed.random_share}
    return project(edited, base, strict=True)


@dataclass(frozen=True)
class Decided:
    """What `decide` stored: the decision and, for an edit, the person's config as projected (`edit`, with what the
    projection changed in it) and the config the proposal would have applied (`proposed`), which the edit is told
    against."""

    decision: Decision
    edit: Projection | None = None
    proposed: EnvConfig | None = None


def decide(session: Session, proposal_id: int, action: str, user: str, edited: Any = None,
           note: str = "", *, commit: bool = True, probes: list[str] | None = None) -> Decided:
    """Record what was done with a proposal and return the decision, with the edit as projected (`Decided`).

    accept / auto: the proposal's projected config. edit: `edited` (a config JSON object, e.g. the
    page's table) validated strictly and projected against the proposal's base (`project_edit`); an invalid edit raises
    `ConfigError` naming the field and range, and nothing is stored. reject: no config (the loop asks
    the engineer again). `probes` are the keys of the probes the person saw (the Measure panel). The run's
    lock is held from the check to the write, so a decision never lands on a proposal that another process has
    just replaced. Raises `AlreadyDecided` when someone else decided
    first, `Superseded` when the proposal is no longer the run's current one, `ProposalError` for a note longer
    than `lab.text.TEXT_LIMIT`.
    """
    if (why := too_long("decision note", note, TEXT_LIMIT)) is not None:
        raise ProposalError(why)
    proposal = session.get(Proposal, proposal_id)
    if proposal is None:
        raise LookupError(f"no proposal {proposal_id}")
    edit = proposed = None
    if action == Action.EDIT:  # before the lock: an unfillable config spends every try of the generator
        in_force = stage_at(session, proposal.run_id, proposal.after_stage)
        base = in_force.config
        proposed = _proposed(proposal, base)
        edit = project_edit(edited, base, proposed)
        check = fill_check(session.get(Run, proposal.run_id).seed, proposal.after_stage + 1)
        if (why := check(edit.config)) is not None:
            raise ProposalError(f"the edited config cannot be generated: {why}")
    lock_run(session, proposal.run_id)
    try:
        config = _applied_config(session, proposal, action, edit.config if edit is not None else None)
        decision = record_decision(session, proposal_id, action, user, config, note, commit=commit, probes=probes)
    except BaseException as err:
        if isinstance(err, AlreadyDecided) and err.decision in session:
            session.expunge(err.decision)  # the caller reads who won after the rollback below
        session.rollback()  # and so let go of the run's lock
        raise
    return Decided(decision, edit, proposed)


def _applied_config(session: Session, proposal: Proposal, action: str,
                    edited: EnvConfig | None) -> EnvConfig | None:
    """The config a decision applies (`edited`: the person's edit, validated and checked already)."""
    if (earlier := decision_of(session, proposal.id)) is not None:
        raise AlreadyDecided(earlier)
    if (why := superseded_by(session, proposal)) is not None:
        raise Superseded(why)
    if action in (Action.ACCEPT, Action.AUTO):
        if proposal.projected_config is None:
            raise ProposalError(f"proposal {proposal.id} failed ({proposal.error}); edit it or reject it instead")
        return proposal.projected_config
    if action == Action.EDIT:
        return edited
    if action != Action.REJECT:
        raise ProposalError(f"unknown action {action!r}: accept, edit, reject or auto")
    return None


def repeats_rejected(engine: Engine, proposal: Proposal) -> int | None:
    """The id of an earlier proposal of the same run and stage that was rejected and proposed exactly this config
    (a deterministic engineer asked again answers the same), None when there is none."""
    if proposal.projected_config is None:
        return None
    with open_session(engine) as s:
        earlier = s.exec(select(Proposal).where(Proposal.run_id == proposal.run_id,
                                                Proposal.after_stage == proposal.after_stage,
                                                Proposal.id < proposal.id).order_by(Proposal.id.desc())).all()
        for other in earlier:
            decision = decision_of(s, other.id)
            if decision is not None and decision.action == Action.REJECT \
                    and other.projected_config == proposal.projected_config:
                return other.id
    return None
