"""Sampling for learnability (SFL, Rutherford et al. 2024, "No Regrets"): the `learnability` engineer scores the
boards it probes one by one on the policy itself, replays the most learnable of them as half of the next stage
(SFL's buffer, share `SFL_RHO`) and draws the other half fresh from a config it builds from the same probes.

Per map size, every cell of a `HOLE_CELLS` x `WAIT_CELLS` grid over the legal ranges (`grid`: the centres of
equal bins, so the cells span the whole space, not a neighbourhood of the current config) is probed as a one-size
config (`training.probe`, the run's checkpoint, seed and temperature) on `LEARN_BOARDS` boards each answered
`LEARN_ANSWERS` times. Each board's learnability is p_b(1 - p_b), p_b its valid share over its 8 answers (4 values
above 0: 7/64, 3/16, 15/64, 1/4, where 4 answers gave only 3/16 and 1/4); a cell's is the mean over its boards.

The buffer, as SFL keeps it: of every board probed this proposal (all cells of all sizes), the
`round(SFL_RHO x num_instances)` with the highest p_b(1 - p_b) (ties: smaller size, then lower hole ratio, lower
wait ratio, earlier board of the probe; a board drawn in two cells counts once, at its better rank). A board with
p_b(1 - p_b) = 0, one the policy always or never solves, carries no GRPO signal and never enters; nor does a board
the run holds out (its validation and dev boards, the benchmark's at its agent counts: `held_out`, which the propose
job passes). The boards are the probe's own (`training.probe.probe_boards` draws them again from the cell, the
seed and the board count, exactly, with their solver labels); the proposal carries them (`EngineerAnswer.replay`,
stored as `Proposal.replay`), a decision that applies a config passes them on to its stage, and the stage trains on
them as they are beside `num_instances` minus their number drawn fresh from the config (`training.stage`). Fewer
learnable boards than the buffer's room leave more of the stage fresh. The replayed boards are not a knob of the
config: the config stays the environment's distribution, which a person reviews and edits.

The fresh share's config, as before: the size's hole and wait ratios become its most learnable cell, its data
share follows that learnability (never below `LEARN_FLOOR`), and `random_share` becomes `SFL_RANDOM_SHARE`: half
of every size's fresh boards have their hole and wait ratios drawn uniformly over their ranges, board by board
(`envsim.generator.broad_boards`), as SFL's fresh levels come from the generator.

Where the run has several agent counts (`Evidence.agent_counts`), each count is probed as sizes are: the kept
config (every size on its kept cell) with every board at that count, on the same boards and answers per size; its
learnability is the data-weighted mean of its sizes', and the agent shares follow it (never below `LEARN_FLOOR`).
One count takes every board unprobed; a run without counts keeps the mix. Those probes weigh the counts only: the
buffer holds boards of the grid's cells, drawn with the config's agent mix.

Why not the engineer it replaces: it probed 4 candidates close to the current pair (0.1 more or fewer holes, one
other wait ratio) on 4 boards x 8 answers each. Measured on the `hardstart` study, measuring the same candidates
twice differed as much as the candidates did, and the kept candidate's learnability did not predict the next
stage's gain (r = -0.09): the choice was noise. The grid's cells lie far apart, and the buffer no longer rests on
one cell's mean: SFL ranks levels, not regions, because learnability varies most between boards.

Compute per proposal: sizes x (cells + agent counts, where several) x boards x answers sampled answers; with the
defaults on 8 sizes and one agent count, 8 x 6 x 16 x 8 = 6,144 (twice the 3,072 of 4 answers a board); agent counts
2, 3, 4 add 8 x 3 x 16 x 8 = 3,072. Sampling time grows with the answers: the 4-answer grid took 2.8x the seconds of
the engineer before it (500 s against 177 s on a 2-core machine at a load average of 10), so this one takes about
5.6x (not measured again). Drawing the buffer's boards again costs solver time only, no sampling. A cell found in
the probe cache costs nothing; `compute` says what was spent.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

from envsim.config import AGENT_RATIO, KNOBS, RANDOM_SHARE, EnvConfig, mix_text
from envsim.generator import round_half_up
from envsim.instance import Instance
from lab.context import Evidence, knob_text
from lab.engineers.answer import EngineerAnswer, FillCheck, ProbeFn, answer_of, revert_unfillable, shares, with_changes
from lab.engineers.needs import Needs
from storage.models import ProbeCompute, Replay
from storage.settings import RunSettings
from training.probe import ProbeResult, SizeProbe, probe_boards  # torch loads only where a probe samples

HOLE_CELLS = 3  # hole ratios per size: the centres of 3 equal bins of 0..0.5 (0.08, 0.25, 0.42)
WAIT_CELLS = 2  # wait ratios per size: the centres of 2 equal bins of 0..1 (0.25, 0.75); 0 alone for one agent
# Each cell is probed on this many boards, each answered this many times: 16 boards, since learnability varies
# most from board to board; 8 answers make each board's p_b(1 - p_b), the score a board enters the buffer by.
LEARN_BOARDS = 16
LEARN_ANSWERS = 8
LEARN_FLOOR = 0.02  # the least data weight a size gets (learnability is at most 0.25): no size is dropped
SFL_RHO = 0.5  # the share of the next stage's boards replayed from the buffer (SFL's rho); the rest drawn fresh
SFL_RANDOM_SHARE = 0.5  # the share of each size's fresh boards drawn broadly at random (the rest on the kept cell)


def _centres(lo: float, hi: float, n: int) -> list[float]:
    return [round(lo + (hi - lo) * (i + 0.5) / n, 2) for i in range(n)]


def grid(fewest_agents: int) -> list[tuple[float, float]]:
    """The (hole, wait) cells the engineer measures at every size, hole first then wait, each ascending: the
    centres of `HOLE_CELLS` x `WAIT_CELLS` equal bins of the legal ranges (a lone agent never waits: wait 0 where
    the fewest agents on a board, `fewest_agents`, is 1)."""
    holes = _centres(*KNOBS["hole_ratio"], HOLE_CELLS)
    waits = [0.0] if fewest_agents == 1 else _centres(*KNOBS["wait_ratio"], WAIT_CELLS)
    return [(h, w) for h in holes for w in waits]


@dataclass(frozen=True)
class Cell:
    """One measured cell of one size: its hole and wait ratios, the probe's numbers, and what its boards were drawn
    from (the one-size config and the probe's seed: `probe_boards` draws them again)."""

    hole: float
    wait: float
    probe: SizeProbe
    config: EnvConfig
    seed: int

    @property
    def size(self) -> int:
        return self.probe.size

    def text(self) -> str:
        return (f"hole {knob_text(self.hole)}, wait {knob_text(self.wait)} (p {self.probe.p:.0%}, learnability "
                f"{self.probe.learnability:.3f})")


def learnability(evidence: Evidence, *, seed: int = 0, probe_fn: ProbeFn | None = None,
                 cannot_fill: FillCheck | None = None, held_out: Collection[str] = frozenset(),
                 **_options: Any) -> EngineerAnswer:
    """Per size, probe every cell of `grid` (one size per probe), keep the most learnable (a tie keeps the earlier
    cell), set data_ratio in proportion to the kept learnability (never below `LEARN_FLOOR`) and `random_share`
    to `SFL_RANDOM_SHARE`; replay the most learnable boards probed (`buffer`, none in `held_out`) as `SFL_RHO` of
    the next stage (module doc).

    `probe_fn(config) -> ProbeResult` measures a one-size config on the run's checkpoint; the propose job passes
    one (`training.probe.measure` with `LEARN_BOARDS` x `LEARN_ANSWERS`). A cell the generator cannot make is
    skipped (a size with none keeps its ratios, at the floor weight), and with `cannot_fill` (the next stage's
    check) a size whose kept cell the stage's boards cannot fill goes back to its current ratios
    (`revert_unfillable`). The rationale names per size the kept cell and the runner-up with p and learnability;
    `compute` is what the probes cost (a probe found in the cache costs nothing); `replay` the buffer's boards.
    """
    base = evidence.current.config
    if probe_fn is None:
        return EngineerAnswer(prompt="", raw="", proposed=None, projection=None, rationale="",
                              error="the learnability engineer measures configs on the policy: it needs a probe "
                                    "(the propose job passes one)")
    hole, wait, weight = dict(base.hole_ratio), dict(base.wait_ratio), {}
    spent: list[ProbeResult] = []
    lines: list[str] = []
    probed: list[Cell] = []
    for size in base.sizes:
        cells = measure_cells(base, size, probe_fn, spent)
        probed += cells
        if not cells:
            weight[size] = LEARN_FLOOR
            lines.append(f"size {size}: no cell of the grid could be generated; kept hole {knob_text(hole[size])}, "
                         f"wait {knob_text(wait[size])}")
            continue
        ranked = sorted(cells, key=lambda cell: -cell.probe.learnability)  # stable: a tie keeps the earlier cell
        kept = ranked[0]
        hole[size], wait[size] = kept.hole, kept.wait
        weight[size] = max(kept.probe.learnability, LEARN_FLOOR)
        line = f"size {size}: {kept.text()} kept, of {len(cells)} cells"
        if len(ranked) > 1:
            line += f"; runner-up {ranked[1].text()}"
        lines.append(line)
    data = shares(weight)
    for i, size in enumerate(base.sizes):
        lines[i] += f"; data_ratio {knob_text(base.data_ratio[size])} -> {knob_text(data[size])}"
    lines.append(f"{RANDOM_SHARE} {knob_text(base.random_share)} -> {knob_text(SFL_RANDOM_SHARE)}: that share of "
                 "each size's boards has its hole and wait ratios drawn at random over their ranges, the rest "
                 "is drawn on the kept cell")
    config = with_changes(base, data_ratio=data, hole_ratio=hole, wait_ratio=wait, random_share=SFL_RANDOM_SHARE)
    mix, said = measure_mix(config, evidence.agent_counts, probe_fn, spent)
    config = with_changes(config, agent_ratio=mix)
    lines += said
    config, reverted = revert_unfillable(config, base, cannot_fill)
    lines += reverted
    room = round_half_up(SFL_RHO * base.num_instances)
    replay, skipped = buffer(probed, room, held_out)
    lines.append(buffer_text(probed, replay, skipped, room, base.num_instances))
    compute = compute_of(spent)
    cost = ProbeCompute.model_validate(compute)
    lines.append(f"probe compute: {cost.completions} sampled answers, {cost.seconds:.1f} s "
                 f"({cost.probes} probes, {cost.cached} cached)")
    return replace(answer_of(config, base, "\n".join(lines)), compute=compute, replay=tuple(replay))


def board_learnability(valid: int, answers: int) -> float:
    """p_b(1 - p_b) of a board with `valid` of its `answers` valid."""
    return valid * (answers - valid) / (answers * answers)


def buffer(cells: list[Cell], room: int, held_out: Collection[str] = frozenset()) -> tuple[list[Instance], int]:
    """SFL's buffer: the `room` boards of `cells` with the highest p_b(1 - p_b) above 0, most learnable first (ties:
    smaller size, lower hole ratio, lower wait ratio, earlier board of its probe), each drawn again from its cell
    (`probe_boards`); a board whose id is in `held_out`, or kept already (two cells may draw the same board), is
    passed over. Returns the boards and how many held-out ones were passed over."""
    ranked = sorted(((board_learnability(v, cell.probe.answers), cell, i) for cell in cells
                     for i, v in enumerate(cell.probe.board_valid) if 0 < v < cell.probe.answers),
                    key=lambda t: (-t[0], t[1].size, t[1].hole, t[1].wait, t[2]))
    drawn: dict[tuple[int, float, float], list[Instance]] = {}
    kept: dict[str, Instance] = {}
    skipped = 0
    for _, cell, i in ranked:
        if len(kept) == room:
            break
        where = (cell.size, cell.hole, cell.wait)
        if where not in drawn:
            drawn[where] = probe_boards(cell.config, cell.size, cell.probe.boards, cell.seed)
        board = drawn[where][i]
        if board.id in held_out:
            skipped += 1
        elif board.id not in kept:
            kept[board.id] = board
    return list(kept.values()), skipped


def buffer_text(cells: list[Cell], replay: list[Instance], skipped: int, room: int, n: int) -> str:
    """The rationale's line on the buffer: how many boards it replays of how many probed, by size."""
    probed = sum(len(cell.probe.board_valid) for cell in cells)
    signal = sum(0 < v < cell.probe.answers for cell in cells for v in cell.probe.board_valid)
    line = (f"buffer: {len(replay)} of the stage's {n} boards replayed (room for {room}, {SFL_RHO:g} of them), the "
            f"most learnable of {probed} boards probed ({signal} with learnability above 0)")
    if replay:
        line += f"; sizes {Replay(boards=tuple(replay)).sizes_text()}"
    if skipped:
        line += f"; {skipped} held-out boards passed over"
    return line + f"; the other {n - len(replay)} drawn fresh from the config"


def learnability_needs(_settings: RunSettings) -> Needs:
    """A probe of `LEARN_BOARDS` boards x `LEARN_ANSWERS` answers per cell, whatever the run's probe size, and the
    run's held-out boards, which the buffer never replays."""
    return Needs(probe={"boards": LEARN_BOARDS, "answers": LEARN_ANSWERS}, held_out=True)


def measure_cells(base: EnvConfig, size: int, probe_fn: ProbeFn, spent: list[ProbeResult]) -> list[Cell]:
    """Each cell of `grid` at `size` with its measurement, probed as a one-size config (no random share: the cell
    alone); a cell the generator cannot make is left out. Every probe is added to `spent`."""
    from envsim.generator import GenerationError

    cells = []
    for h, w in grid(base.agent_counts[0]):
        one = EnvConfig(data_ratio={size: 1.0}, hole_ratio={size: h}, wait_ratio={size: w},
                        agent_ratio=base.agent_ratio, num_instances=base.num_instances)
        try:
            spent.append(probe_fn(one))
        except GenerationError:
            continue
        cells.append(Cell(h, w, spent[-1].sizes[size], one, spent[-1].seed))
    return cells


def measure_mix(config: EnvConfig, counts: tuple[int, ...] | None, probe_fn: ProbeFn,
                spent: list[ProbeResult]) -> tuple[dict[int, float], list[str]]:
    """The agent mix over the run's agent counts and its rationale line (none where it stays): each count probed on
    `config` (its kept cells, no random share) with every board at that count, weighted by the data-weighted mean
    learnability of its sizes, never below `LEARN_FLOOR` (a count the generator cannot make gets the floor). One
    count takes every board unprobed; no counts keep `config`'s mix. Every probe is added to `spent`."""
    from envsim.generator import GenerationError

    if counts is None or len(counts) == 1:
        mix = dict(config.agent_ratio) if counts is None else {counts[0]: 1.0}
        changed = mix != config.agent_ratio
        return mix, [f"{AGENT_RATIO} {mix_text(config.agent_ratio)} -> {mix_text(mix)}: the run's one agent count"] \
            if changed else []
    measured: dict[int, float | None] = {}
    for k in counts:
        try:
            spent.append(probe_fn(with_changes(config, agent_ratio={k: 1.0}, random_share=0.0)))
        except GenerationError:
            measured[k] = None
            continue
        result = spent[-1]
        weight = sum(result.data_ratio.get(s, 0.0) for s in result.sizes)
        measured[k] = sum(result.data_ratio.get(s, 0.0) * m.learnability for s, m in result.sizes.items()) / (
            weight or 1.0)
    mix = shares({k: max(v, LEARN_FLOOR) if v is not None else LEARN_FLOOR for k, v in measured.items()})
    why = "; ".join(f"{k}: learnability {v:.3f}" if v is not None else f"{k}: cannot be generated"
                    for k, v in measured.items())
    return mix, [f"{AGENT_RATIO} {mix_text(config.agent_ratio)} -> {mix_text(mix)} (each agent count probed on the "
                 f"kept cells, floor {LEARN_FLOOR:g}: {why})"]


def planned_answers(config: EnvConfig, agent_counts: tuple[int, ...] | None = None) -> int:
    """The answers one proposal's probes sample on `config` where none is found in the cache and every cell can be
    generated (what `compute_of` counts then): per size, each cell of `grid`, and where the run has several agent
    counts (`agent_counts`, else the config's) one probe of every size per count, each `LEARN_BOARDS` boards x
    `LEARN_ANSWERS` answers. The defaults on 8 sizes and one count: 8 x 6 x 16 x 8 = 6,144."""
    counts = agent_counts or config.agent_counts
    probes = len(grid(config.agent_counts[0])) + (len(counts) if len(counts) > 1 else 0)
    return len(config.sizes) * probes * LEARN_BOARDS * LEARN_ANSWERS


def compute_of(results: list[ProbeResult]) -> dict[str, Any]:
    """What probes cost (a `ProbeCompute`, as `Proposal.compute` stores it): the answers sampled and the seconds spent
    by those not found in the cache."""
    new = [r for r in results if not r.cached]
    return ProbeCompute(completions=sum(r.completions for r in new), seconds=round(sum(r.seconds for r in new), 3),
                        probes=len(results), cached=len(results) - len(new)).model_dump()
