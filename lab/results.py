"""A stage's results, read one way: what the page, `envlab run` and the engineer's context all show.

A stage evaluated on a split has one `StageMetric` row per (map size, agent count) (written by
`training.evaluate`). `stage_summaries` reads them in one query and gives each stage its `StageSummary`: the
`envsim.scoring.Tally` of each size (summed over agent counts), of each agent count (summed over sizes) and,
summed, the pooled tally. The rates are the tally's (docs/results.md): a stage's valid rate is its pooled rate,
valid episodes over all its episodes of the split; a size's rate is over that size's episodes, an agent count's
over the episodes of boards with that many agents. The unweighted mean over sizes is the paper's benchmark figure
and appears only on the Leaderboard (`envsim.suite.report`).

`outcome_of` is the one judgement of whether a stored outcome can be shown as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from sqlmodel import Session, col, select

from envsim.instance import Instance
from envsim.scoring import Outcome, Tally, score_answer
from envsim.suite import Split
from storage.models import Episode, StageMetric
from training.evaluate import summed, tally_of


@dataclass(frozen=True)
class StageSummary:
    """One stage's results on one split: a tally per map size (smallest first, summed over agent counts), per
    (map size, agent count) as stored (`cells`), per agent count (fewest first, summed over sizes) and their pooled
    tally. The sums over sizes are made where they are read, as the pooled one is: a row an older version stored
    unchecked fails the view that sums it, not every reader of the run."""

    stage_index: int
    by_size: dict[int, Tally]
    cells: dict[tuple[int, int], Tally] = field(default_factory=dict)

    @cached_property  # computed once per summary: a comparison reads them for every run, stage and rate
    def pooled(self) -> Tally:
        return Tally.total(self.by_size.values())

    @cached_property
    def by_agents(self) -> dict[int, Tally]:
        counts = sorted({agents for _, agents in self.cells})
        return {k: Tally.total(t for (_, agents), t in self.cells.items() if agents == k) for k in counts}


def stage_summaries(s: Session, run_id: int, split: Split = Split.VALIDATION,
                    stage_index: int | None = None) -> dict[int, StageSummary]:
    """Every evaluated stage of a run (or only `stage_index`), by stage index, from one query.

    A stage with no rows on `split` (not evaluated yet) has no entry.
    """
    query = select(StageMetric).where(StageMetric.run_id == run_id, StageMetric.split == split)
    if stage_index is not None:
        query = query.where(StageMetric.stage_index == stage_index)
    return _summaries(s.exec(query.order_by(StageMetric.stage_index, StageMetric.size, StageMetric.agents)))


def runs_summaries(s: Session, run_ids: Sequence[int], split: Split = Split.VALIDATION
                   ) -> dict[int, dict[int, StageSummary]]:
    """`stage_summaries` of each of `run_ids` (a run with no rows on `split` has no entry), from one query."""
    query = select(StageMetric).where(col(StageMetric.run_id).in_(run_ids), StageMetric.split == split)
    rows: dict[int, list[StageMetric]] = {}
    for m in s.exec(query.order_by(StageMetric.run_id, StageMetric.stage_index, StageMetric.size,
                                   StageMetric.agents)):
        rows.setdefault(m.run_id, []).append(m)
    return {run_id: _summaries(ms) for run_id, ms in rows.items()}


def _summaries(metrics: Iterable[StageMetric]) -> dict[int, StageSummary]:
    """The summaries of one run's metric rows, ordered by stage, size and agent count."""
    rows: dict[int, list[StageMetric]] = {}
    for m in metrics:
        rows.setdefault(m.stage_index, []).append(m)
    return {k: StageSummary(k, summed(ms), {(m.size, m.agents): tally_of(m) for m in ms}) for k, ms in rows.items()}


def outcome_of(episode: Episode, instance: Instance | None = None) -> Outcome:
    """The episode's stored outcome when it is complete enough to replay (it has the agents' positions);
    otherwise its answer scored again, which gives the same outcome since the rules are deterministic."""
    if episode.outcome and "positions" in episode.outcome:
        return Outcome.from_dict(episode.outcome)
    return score_answer(instance or Instance.model_validate(episode.instance), episode.completion)
