"""Reference results on the 3,150-board benchmark that the lab ships as files, for the Leaderboard: the paper's
rows and the shipped tiny policy's own result.

Both live in `assets/leaderboard/` as JSON with rates in percent, rounded to two decimals as the paper
prints them. `paper.json` holds the paper's means over map sizes (with its source); `tiny.json` is written
by `benchmarks/tiny_benchmark.py` (`tiny_result`) and holds the full tables of `envsim.suite.report` as
well, with the command that made it and when. The page shows them apart from the lab's own checkpoints, each
labelled with where it comes from, so a reference number is never read as a local one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envsim.suite import Report

LEADERBOARD_DIR = Path(__file__).resolve().parents[2] / "assets" / "leaderboard"
PAPER_FILE = LEADERBOARD_DIR / "paper.json"
TINY_FILE = LEADERBOARD_DIR / "tiny.json"
TINY_NAME = "tiny policy (shipped, assets/tiny-policy)"


@dataclass(frozen=True)
class ReferenceRow:
    """One row of a mean-over-sizes table: a name, where it comes from, per number of agents the
    (valid %, optimal %) mean over map sizes, and the `envsim.suite.boards_hash` of the boards it was scored on
    ("" where unknown: the paper's rows, a tiny.json written before it kept the hash)."""

    name: str
    source: str
    mean_over_sizes: dict[int, tuple[float, float]]
    boards: str = ""


def _means(raw: dict[str, Any]) -> dict[int, tuple[float, float]]:
    return {int(agents): (float(v["valid"]), float(v["optimal"])) for agents, v in sorted(raw.items())}


def paper_rows(path: Path = PAPER_FILE) -> list[ReferenceRow]:
    """The paper's rows, each with the file's source line."""
    data = json.loads(path.read_text())
    return [ReferenceRow(row["name"], data["source"], _means(row["mean_over_sizes"])) for row in data["rows"]]


def tiny_row(path: Path = TINY_FILE) -> ReferenceRow | None:
    """The shipped tiny policy's result, or None when the file is missing (never written yet)."""
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    failed = ", ".join(f"{kind} {n:,}" for kind, n in data["failures"].items())
    source = f"greedy answers to the {data['boards']:,} benchmark boards, {data['date']}, `{data['command']}`" + \
        (f"; failures: {failed}" if failed else "")
    name, trained = data["name"], data.get("trained_agents")
    if trained:
        counts = ", ".join(map(str, trained))
        name += f"; imitation of solver plans on {counts} agents, no RL"
        source += (f". It learnt by imitation of the solver's plans (a warm start on boards of {counts} agents) and "
                   "was never trained by RL, where the paper's rows are GRPO runs that trained on 2 agents")
        unseen = sorted({int(a) for a in data["mean_over_sizes"]} - set(trained))
        if unseen and all(data["mean_over_sizes"][str(a)]["valid"] == 0 for a in unseen):
            source += (f". It was warm-started on boards of {counts} agents only, and a policy answers for the agent "
                       f"counts it has seen: on {', '.join(map(str, unseen))} agents its answers name the wrong "
                       "number of agents (`wrong_agent_count`), so it scores 0 there")
    return ReferenceRow(name, source, _means(data["mean_over_sizes"]), data.get("boards_sha256", ""))


def percent(rate: float) -> float:
    return round(100 * rate, 2)


def tiny_result(table: Report, failures: dict[str, int], boards: int, command: str, date: str,
                seconds: float, trained_agents: tuple[int, ...] | None = None) -> dict[str, Any]:
    """What `tiny.json` holds: `table` (the benchmark's `envsim.suite.report`) in percent, the mean over sizes
    per number of agents, per (agents, size) and per (agents, wait subset) with their episode counts, and how
    many answers failed in each way (`failures`, most frequent first), and the boards' hash (`boards_sha256`)."""
    return {
        "name": TINY_NAME, "policy": "tiny", "split": "benchmark", "boards": boards, "boards_sha256": table.boards,
        "unit": "percent", "decoding": "greedy",
        "mean_over_sizes": {str(a): {"valid": percent(v), "optimal": percent(o)}
                            for a, (v, o) in table.mean_over_sizes.items()},
        "by_size": [{"agents": a, "size": n, "valid": percent(v), "optimal": percent(o), "n": count}
                    for (a, n), (v, o, count) in table.by_size.items()],
        "by_subset": [{"agents": a, "subset": w, "valid": percent(v), "optimal": percent(o), "n": count}
                      for (a, w), (v, o, count) in table.by_subset.items()],
        "failures": dict(sorted(failures.items(), key=lambda kv: (-kv[1], kv[0]))),
        "command": command, "date": date, "seconds": round(seconds, 1),
    } | ({"trained_agents": list(trained_agents)} if trained_agents else {})
