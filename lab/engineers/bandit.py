"""The `bandit` engineer: a self-evolving curriculum (SEC; Chen et al. 2025, "Self-Evolving Curriculum for LLM
Reasoning"), a non-stationary multi-armed bandit over cells (agent count, map size).

- Arms: the run's agent counts (`evidence.agent_counts`) x the config's map sizes.
- Reward of a cell in a trained stage: the mean |advantage| of the stage's answers on that cell's boards, TRL's own
  advantages as the stage logged them (`training.advantage`, `StageResult.cells`): a proxy for what the cell
  taught, since a group whose answers all earn the same reward has advantage 0. It costs no forward pass.
- Value: TD(0) with learning rate `ALPHA`, per stage, for each cell the stage trained on:
  `Q <- ALPHA * r + (1 - ALPHA) * Q`. A cell no stage trained on keeps the prior `PRIOR`.
- Next stage: a Boltzmann distribution over the cells, `exp(Q / TEMPERATURE)` normalised.

No hidden state: Q is a pure function of the run's per-stage cell rewards, recomputed from every stage of the
evidence (`values`), so the same logs give the same proposal (asked again, it answers the same config).

The prior is optimistic. Mean |advantage| is never negative, and 0 means "taught nothing": a prior of 0 would rank a
cell never tried (the 3- and 4-agent cells of a run whose first stages trained 2 agents) with the cells known to
teach nothing. `PRIOR` = 1 sits at the top of what a cell measures here (optimistic initial values, Sutton & Barto
2.6): an untried cell is tried, and a cell's optimism fades as its stages come in (one stage at `ALPHA` 0.5 leaves
it halfway between 1 and its reward).

The temperature fits the scale of mean |advantage| here, not SEC's rewards in [0, 1]. With the lab's rewards (0 to
2.4 an answer) centred per group and not scaled (the tiny policy's `scale_rewards="none"`), a group's mean
|advantage| runs from 0 (every answer alike) to 1.2 (half the answers valid and optimal, half earning nothing); with
TRL's `scale_rewards="group"` it is at most sqrt((G-1)/G), 0.87 at 4 answers a group. The validity and optimality
terms alone give a cell about 4p(1-p) (p its valid rate): 0.51 at 85%, 1.0 at 50%, so sizes where the tiny policy
is valid 21% to 85% of the time (docs/experiments.md, the default scenario) should differ by up to about 0.5 (an
estimate). `TEMPERATURE` = 0.25 gives a cell whose Q is 0.25 higher e (2.7) times the share, 0.5 higher about 7
times; SEC's tau 1 on this scale would make a gap of 0.5 a factor 1.6.

The config is not a distribution over cells: it has shares per map size (`data_ratio`) and one agent mix for every
size (`agent_ratio`), and the generator deals the mix out size by size (`envsim.generator.cell_counts`), so the next
stage trains on the product of the two. The Boltzmann joint is mapped to its marginals: `data_ratio[s]` is the sum
over agent counts of the cells at size `s`, `agent_ratio[k]` the sum over sizes of the cells at `k` (both as shares
in steps of 0.001, `answer.shares`). Hole and wait ratios stay as they are. A mix the next stage's seed cannot fill
goes back to the current one (`revert_unfillable`).

A trained stage of the evidence without the record (trained before it existed) fails the proposal: Q would rest on
part of the run's stages. Stage 0 trains nothing: after it, every cell has the prior and the shares are uniform.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from envsim.config import AGENT_RATIO, mix_text
from lab.context import Evidence, knob_text
from lab.engineers.answer import EngineerAnswer, FillCheck, answer_of, revert_unfillable, shares, with_changes
from training.advantage import Cell, CellSignal

ALPHA = 0.5  # the TD(0) learning rate: the weight of a stage's reward in a cell's Q (SEC's)
PRIOR = 1.0  # the Q of a cell no stage trained on: optimistic (module doc)
TEMPERATURE = 0.25  # the Boltzmann temperature, in units of mean |advantage| (module doc)


def values(stages: Sequence[Mapping[Cell, CellSignal]], arms: Sequence[Cell], alpha: float = ALPHA,
           prior: float = PRIOR) -> dict[Cell, float]:
    """Q of each arm after the stages' rewards, oldest stage first: TD(0) from `prior`, one update per stage for each
    cell it trained on (a cell with no group keeps its Q); cells outside `arms` are not arms."""
    q = dict.fromkeys(arms, prior)
    for stage in stages:
        for cell, signal in stage.items():
            if cell in q and signal.groups:
                q[cell] = alpha * signal.mean + (1 - alpha) * q[cell]
    return q


def boltzmann(q: Mapping[Cell, float], temperature: float = TEMPERATURE) -> dict[Cell, float]:
    """The cells' shares `exp(Q / temperature)`, normalised to sum to 1."""
    top = max(q.values())
    weights = {cell: math.exp((v - top) / temperature) for cell, v in q.items()}  # shifted: no overflow
    total = sum(weights.values())
    return {cell: w / total for cell, w in weights.items()}


def marginals(joint: Mapping[Cell, float]) -> tuple[dict[int, float], dict[int, float]]:
    """A distribution over cells as the config's two marginals: per map size (over agent counts) and per agent count
    (over sizes)."""
    sizes: dict[int, float] = {}
    counts: dict[int, float] = {}
    for (k, s), p in joint.items():
        sizes[s] = sizes.get(s, 0.0) + p
        counts[k] = counts.get(k, 0.0) + p
    return dict(sorted(sizes.items())), dict(sorted(counts.items()))


def bandit(evidence: Evidence, *, seed: int = 0, cannot_fill: FillCheck | None = None,
           **_options: Any) -> EngineerAnswer:
    """The next config from the run's per-cell rewards (module doc); a failed answer where a trained stage of the
    evidence has no per-cell record. Without the run's agent counts (evidence made outside a run) the cells are the
    config's counts and the agent mix stays."""
    base = evidence.current.config
    stages = (*evidence.history, evidence.current)
    if missing := [st.stage_index for st in stages if st.stage_index > 0 and st.cells is None]:
        named = ", ".join(map(str, missing))
        return EngineerAnswer(prompt="", raw="", proposed=None, projection=None, rationale="", error=(
            f"the bandit reads each trained stage's GRPO advantages per cell (agent count, map size) from its "
            f"training logs, and stage{'s' if len(missing) > 1 else ''} {named} recorded none (trained before the "
            f"record existed?): its Q values would rest on part of the run, so it proposes nothing"))
    counts = evidence.agent_counts or base.agent_counts
    arms = [(k, s) for k in counts for s in base.sizes]
    trained = [st for st in stages if st.cells is not None]
    q = values([st.cells for st in trained], arms)
    joint = boltzmann(q)
    by_size, by_count = marginals(joint)
    data = shares(by_size)
    mix = shares(by_count) if evidence.agent_counts is not None else dict(base.agent_ratio)
    lines = [f"SEC bandit over {len(arms)} cells (agent counts {list(counts)} x sizes {list(base.sizes)}): per "
             f"stage a cell trained in, Q <- {ALPHA:g} r + {1 - ALPHA:g} Q, r its mean |advantage| there; a cell "
             f"never trained keeps the prior Q {PRIOR:g}; shares exp(Q / {TEMPERATURE:g}), normalised"]
    if not trained:
        lines.append("no stage has trained yet: every cell keeps the prior, so the shares are uniform over the cells")
    lines += [_cell_line(cell, trained, q[cell], joint[cell]) for cell in arms]
    lines.append("data_ratio (each size's cells summed): " + ", ".join(
        f"{s}: {knob_text(base.data_ratio[s])} -> {knob_text(data[s])}" for s in base.sizes))
    if evidence.agent_counts is None:
        lines.append(f"{AGENT_RATIO} {mix_text(base.agent_ratio)} kept (no run's agent counts to choose among)")
    else:
        lines.append(f"{AGENT_RATIO} (each count's cells summed): {mix_text(base.agent_ratio)} -> {mix_text(mix)}")
    config = with_changes(base, data_ratio=data, agent_ratio=mix)
    config, reverted = revert_unfillable(config, base, cannot_fill)
    return answer_of(config, base, "\n".join(lines + reverted))


def _cell_line(cell: Cell, trained: Sequence[Any], q: float, share: float) -> str:
    """A cell's rewards stage by stage, its Q and its share of the joint."""
    k, s = cell
    seen = [(st.stage_index, st.cells[cell]) for st in trained if cell in st.cells and st.cells[cell].groups]
    rewards = ", ".join(f"stage {i}: r {c.mean:.3f} ({c.groups} group{'s' if c.groups > 1 else ''})"
                        for i, c in seen) or "never trained"
    return f"{k} agents, size {s}: {rewards}; Q {q:.3f}{' (prior)' if not seen else ''}, share {share:.3f}"
