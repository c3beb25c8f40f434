"""Decisions: what a person (or auto-apply) did with a proposal, exactly once per proposal.

Two people may click "accept" and "reject" on the same proposal at the same moment, from two
browser tabs or two machines. A read-then-write check ("no decision yet? then insert") lets both
through. So the rule lives in the database: `decisions.proposal_id` is UNIQUE, the second INSERT
fails, and the loser is told who won. Decisions are never updated or deleted; changing one's
mind is a new proposal, not an edit of the audit trail.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from envsim.config import EnvConfig
from storage.models import Action, Decision, Proposal


class AlreadyDecided(Exception):
    """The proposal already has a decision; `decision` is the one that stands."""

    def __init__(self, decision: Decision):
        self.decision = decision
        when = decision.created_at.strftime("%Y-%m-%d %H:%M:%S UTC")
        super().__init__(
            f"proposal {decision.proposal_id} was already decided: {decision.action} by "
            f"{decision.user!r} at {when} (decision {decision.id})"
        )


def record_decision(
    session: Session,
    proposal_id: int,
    action: str,
    user: str,
    config: EnvConfig | dict[str, Any] | None,
    note: str = "",
    *,
    commit: bool = True,
    probes: list[str] | None = None,
) -> Decision:
    """Store the one decision on a proposal and commit it.

    `config` is the config actually applied (validated as an `EnvConfig` before it is stored): the proposal's
    projected config for accept and auto, the person's edited config for edit, None for reject. `probes` are the
    keys of the probes the person
    saw before deciding (the Measure panel), None when none was shown. With `commit=False` the row is only
    flushed, for a caller that holds the run's lock and commits the rest of its step with it.

    Raises:
        AlreadyDecided: the proposal had a decision already (or another one won a race just now).
        LookupError: no such proposal.
        ValueError: an unknown action, or a config that does not fit the action.
    """
    if action not in tuple(Action):
        raise ValueError(f"action must be one of {', '.join(Action)}; got {action!r}")
    if (action == Action.REJECT) != (config is None):
        need = "no config" if action == Action.REJECT else "the config it applies"
        raise ValueError(f"a decision to {action} takes {need}")
    decision = Decision(proposal_id=proposal_id, action=Action(action), user=user, config=config, note=note,
                        probes=probes)
    session.add(decision)
    if not commit:
        session.flush()
        return decision
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        winner = session.exec(select(Decision).where(Decision.proposal_id == proposal_id)).one_or_none()
        if winner is not None:
            raise AlreadyDecided(winner) from None
        if session.get(Proposal, proposal_id) is None:
            raise LookupError(f"no proposal {proposal_id}") from None
        raise
    return decision
