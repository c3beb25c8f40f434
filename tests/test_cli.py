"""The `envlab` command line, end to end with tiny budgets."""

import json

from envsim.config import EnvConfig
from envsim.instance import Instance
from envsim.parser import format_plan
from envsim.suite import read_jsonl
from lab.cli import main

SMALL = EnvConfig(data_ratio={3: 0.5, 4: 0.5}, hole_ratio={3: 0.1, 4: 0.2}, wait_ratio={3: 0.5, 4: 0.0},
                  num_agents=2, num_instances=6)


def test_bench_suite_writes_the_validation_set(tmp_path, capsys):
    assert main(["bench-suite", "--split", "validation", "--out", str(tmp_path), "--workers", "1"]) == 0
    entries = read_jsonl(tmp_path / "validation.jsonl")
    assert len(entries) == 240 and {e.agents for e in entries} == {2}
    assert "validation: 240 boards" in capsys.readouterr().out


def test_generate_score_and_show(tmp_path, capsys):
    config_file = tmp_path / "config.json"
    config_file.write_text(SMALL.model_dump_json())
    boards_file = tmp_path / "boards.jsonl"
    assert main(["generate", "--config", str(config_file), "--seed", "4", "--out", str(boards_file)]) == 0
    boards = [Instance.from_json(line) for line in boards_file.read_text().splitlines()]
    assert [b.size for b in boards] == [3, 3, 3, 4, 4, 4]
    assert sum(b.needs_wait for b in boards if b.size == 3) == 2  # round_half_up(0.5 * 3)

    answers = tmp_path / "answers.jsonl"
    rows = [{"id": b.id, "answer": format_plan(b.reference_plan)} for b in boards[:4]]
    rows += [{"id": boards[4].id, "answer": "Agent 0: UP"}, {"id": boards[5].id, "answer": "no idea"}]
    answers.write_text("".join(json.dumps(r) + "\n" for r in rows))
    outcomes = tmp_path / "outcomes.jsonl"
    capsys.readouterr()
    assert main(["score", "--instances", str(boards_file), "--answers", str(answers), "--out", str(outcomes)]) == 0
    out = capsys.readouterr().out
    assert "6 episodes: valid 66.7%" in out
    assert "  wrong_agent_count: 1" in out and "  parse_error: 1" in out
    scored = [json.loads(line) for line in outcomes.read_text().splitlines()]
    assert [r["valid"] for r in scored] == [True, True, True, True, False, False]
    assert scored[0]["id"] == boards[0].id

    assert main(["show", "--instances", str(boards_file), "--index", "0", "--reference"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"instance {boards[0].id}: 3x3, 2 agents, 1 holes; opt_soc {boards[0].opt_soc}")
    assert "\nt=0\n" in out and out.rstrip().endswith(f"optimal soc {boards[0].opt_soc})")


def test_bad_input_gets_one_clear_line_and_exit_status_2(tmp_path, capsys):
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({**SMALL.model_dump(mode="json"), "hole_ratio": {"3": 0.7, "4": 0.2}}))
    assert main(["generate", "--config", str(broken)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"envlab generate: {broken}: hole_ratio[3] = 0.7 is outside 0..0.5")
    (tmp_path / "notjson.json").write_text("{data_ratio: 1")
    assert main(["generate", "--config", str(tmp_path / "notjson.json")]) == 2
    assert "not JSON" in capsys.readouterr().err
    boards = tmp_path / "boards.jsonl"
    boards.write_text('{"size": 3}\n')
    assert main(["show", "--instances", str(boards)]) == 2
    assert f"{boards}:1: not an instance or suite row" in capsys.readouterr().err
    impossible = tmp_path / "impossible.json"
    impossible.write_text(json.dumps({"data_ratio": {"3": 1}, "hole_ratio": {"3": 0.5}, "wait_ratio": {"3": 0},
                                      "num_agents": 5}))
    assert main(["generate", "--config", str(impossible)]) == 2
    assert "size 3: hole_ratio 0.5 leaves 4 ice cells, too few for 5 agents" in capsys.readouterr().err
