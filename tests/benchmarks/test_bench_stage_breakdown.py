"""The stage breakdown (benchmarks/stage_breakdown.py) at its CI budget: every part of a stage is reached by its
clock, as often as the run calls it, and the rows add up to the run."""

from __future__ import annotations

import math

from tests.benchmark_scripts import load


def test_every_part_of_a_small_run_is_clocked_and_the_rows_add_up(capsys, request):
    bench = load("stage_breakdown", request)
    figures = bench.main(bench.Args(quick=True))
    out = capsys.readouterr().out
    assert figures["steps"] == 1  # one GRPO step
    parts = {k: v for k, v in figures.items() if k not in ("seconds", "steps", "step_s")}
    assert math.isclose(sum(parts.values()), figures["seconds"], rel_tol=1e-9)
    assert all(v >= 0 for k, v in parts.items() if k != "other")
    # stage 0 and stage 1, each on its validation and its dev boards: four evaluations; one step's rollouts
    assert "evaluation > token generation" in parts and "rollouts > token generation" in parts
    for part in ("GRPO step > backward", "GRPO step > log-probs", "GRPO step > rewards", "training boards",
                 "loading the policy", "GRPO set-up", "saving the policy", "evaluation > storing episodes",
                 "storing the whole evaluation"):
        assert part in parts, part
    assert "a GRPO step: " in out and out.splitlines()[1].startswith("part (its own time)")
