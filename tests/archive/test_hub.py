"""`envlab push`: a trained stage of the seeded lab's history run (tests/seeded.py), with a checkpoint folder and
benchmark episodes stored as the lab stores them, written as the folder the Hub gets, to its exact model card.

No test reaches the network, and no Hub server runs here: what an upload would send is tested through the dry run,
which writes the commit the Hub's upload API would be given (the same `CommitOperationAdd`s `upload` sends), and
the card through `huggingface_hub`'s own parsing of a card (`ModelCard.load`: its metadata, its model-index as
eval results); the Hub's server-side YAML check (`RepoCard.validate`) needs the Hub itself. The upload's failures
run the real `huggingface_hub`: no token anywhere, and a Hub endpoint where nothing listens.
"""

from __future__ import annotations

import hashlib
import json
from importlib.metadata import version
from pathlib import Path

import pytest
from huggingface_hub import EvalResult, ModelCard, constants
from sqlmodel import delete, select

from envsim.parser import format_plan
from envsim.scoring import score_answer
from envsim.suite import Entry, Split, boards_hash
from lab.cli import main
from storage.db import session
from storage.models import Decision, Episode, Run, Stage
from tests.seeded import OPEN_OFF_GRID, boards
from tests.servers import free_port
from training.evaluate import EpisodeResult, store_evaluation

REPO = "alice/envlab-curriculum"
WEIGHTS = b"\x00weights\x01" * 100
VERSIONS = "\n".join(f"  {name}: {version(name)}" for name in ("envlab", "trl", "transformers", "torch", "peft",
                                                                  "datasets", "huggingface_hub"))


@pytest.fixture
def pushable(lab, tmp_path: Path):
    """The seeded lab, its history run's stage 1 with a checkpoint folder and two benchmark episodes: (engine, ids,
    the --db setting, the run folder, the benchmark boards' hash)."""
    engine, ids = lab
    with session(engine) as s:
        run = s.get(Run, ids["history"])
        stage = s.exec(select(Stage).where(Stage.run_id == run.id, Stage.index == 1)).one()
        stage.checkpoint = f"{run.uuid}/stage-1/policy"
        s.add(stage)
        s.commit()
        uuid = run.uuid
    policy = tmp_path / uuid / "stage-1" / "policy"
    policy.mkdir(parents=True)
    (policy / "config.json").write_text('{"model_type": "qwen3"}\n')
    (policy / "model.safetensors").write_bytes(WEIGHTS)
    b = boards()
    bench = [Entry(split=Split.BENCHMARK, subset=0.25, instance=b["crossing"]),
             Entry(split=Split.BENCHMARK, subset=0.75, instance=b["open"])]
    answers = [format_plan(b["crossing"].reference_plan), OPEN_OFF_GRID]
    with session(engine) as s:
        store_evaluation(s, ids["history"], 1, Split.BENCHMARK,
                         [EpisodeResult(e.instance, a, score_answer(e.instance, a)) for e, a in zip(bench, answers,
                                                                                                      strict=True)],
                         [e.subset for e in bench])
    return engine, ids, str(tmp_path / "lab.db"), tmp_path / uuid, boards_hash(bench)


def card(run_id: int, proposal_id: int, boards: str, with_notes: bool = False) -> str:
    """The history run's card; who decided (and the note columns) only `with_notes`."""
    by, decisions = (" by alice", "| proposal | after stage | engineer | decision | by | note |\n"
                                  "| --- | --- | --- | --- | --- | --- |\n"
                                  f"| #{proposal_id} | 0 | heuristic | accept | alice |  |") if with_notes else \
        ("", f"| proposal | after stage | engineer | decision |\n| --- | --- | --- | --- |\n"
             f"| #{proposal_id} | 0 | heuristic | accept |")
    return f"""---
library_name: transformers
license: other
pipeline_tag: text-generation
tags:
- envlab
- mapf-frozenlake
- grpo
- trl
library_versions:
{VERSIONS}
model-index:
- name: {REPO}
  results:
  - task:
      type: text-generation
      name: MAPF-FrozenLake planning
    dataset:
      name: MAPF-FrozenLake benchmark, 2 agents
      type: mapf-frozenlake-benchmark
      config: 2-agents
      split: benchmark
      revision: {boards}
    metrics:
    - type: valid_rate
      value: 0.5
      name: valid rate (mean over map sizes)
    - type: optimal_rate
      value: 0.5
      name: optimal rate (mean over map sizes)
---

# {REPO}

Stage 1 of envlab run #{run_id} `curriculum`: a policy trained with GRPO (TRL) in stages on MAPF-FrozenLake. \
After each stage an environment engineer proposed the next stage's environment config, and a person (or the run \
itself, auto-apply) decided on it.

- Started from: `tiny`
- Engineer: `heuristic`
- Run seed: 0

## Config timeline

Each stage's config as it trained: stage 0's whole, then each value that changed from the stage before and who set \
it (engineer: proposed and accepted; person: a person's edit; auto-apply: applied by the run itself).

| stage | config from | changed |
| --- | --- | --- |
| 0 | initial config | `{{"data_ratio":{{"3":0.5,"4":0.5}},"hole_ratio":{{"3":0.2,"4":0.2}},\
"wait_ratio":{{"3":0.25,"4":0.25}},"agent_ratio":{{"2":1.0}},"num_instances":16}}` |
| 1 | proposal #{proposal_id}, accepted{by} | wait_ratio[3] 0.25 → 0.35 (engineer); \
hole_ratio[4] 0.2 → 0.15 (engineer) |

## Decisions

{decisions}

## Validation

Valid and optimal rates over each stage's validation episodes, pooled over map sizes.

| stage | valid | optimal | episodes |
| --- | --- | --- | --- |
| 0 | 0.0% | 0.0% | 3 |
| 1 | 66.7% | 66.7% | 3 |

## Benchmark

Stage 1, on the boards with sha256 `{boards}` (`envlab bench-suite` prints it); the mean over map sizes as the \
paper reports it:

valid rate / optimal rate

| agents | 3x3 | mean |
|---|---|---|
| 2 | 50.0% / 50.0% | 50.0% / 50.0% |

| agents | wait 0.25 | wait 0.75 |
|---|---|---|
| 2 | 100.0% / 100.0% | 0.0% / 0.0% |
"""


def test_a_dry_run_writes_the_checkpoint_and_its_model_card(pushable, capsys):
    engine, ids, db, run_dir, boards = pushable
    assert main(["push", str(ids["history"]), "--repo", REPO, "--dry-run", "--db", db]) == 0
    folder = run_dir / "hub" / "stage-1"
    plan = run_dir / "hub" / "stage-1.commit.json"
    assert capsys.readouterr().out == f"{folder}\n{plan}\n"
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert (folder / "model.safetensors").read_bytes() == WEIGHTS
    readme = card(ids["history"], ids["accepted"], boards)
    assert (folder / "README.md").read_text() == readme
    # the commit the upload would make: every file of the folder, its size and sha256, into the repo's root
    files = {"README.md": readme.encode(), "config.json": b'{"model_type": "qwen3"}\n', "model.safetensors": WEIGHTS}
    assert json.loads(plan.read_text()) == {
        "repo_id": REPO, "repo_type": "model", "commit_message": "envlab push: stage-1",
        "operations": [{"path_in_repo": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                       for name, data in files.items()]}
    # the second proposal waits for a decision: not in the card; pushed again, the folder is made anew
    (folder / "stale.bin").write_bytes(b"old")
    assert main(["push", str(ids["history"]), "--stage", "1", "--repo", REPO, "--dry-run", "--db", db]) == 0
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert (run_dir / "stage-1" / "policy" / "README.md").exists() is False  # the checkpoint is left as it was


def test_who_decided_their_notes_and_local_paths_stay_out_of_the_card_unless_asked(pushable, tmp_path):
    """A card is public: a person's name and note and this machine's folders are in it only with --with-notes."""
    engine, ids, db, run_dir, boards = pushable
    local = tmp_path / "home" / "alice" / "base-policy"
    local.mkdir(parents=True)
    with session(engine) as s:
        run = s.get(Run, ids["history"])
        run.policy, run.engineer_backend = str(local), f"hf:{local}"
        decision = s.exec(select(Decision).where(Decision.proposal_id == ids["accepted"])).one()
        decision.note = "ask Bob (bob@example.org) before stage 2"
        s.add_all([run, decision])
        s.commit()
    assert main(["push", str(ids["history"]), "--repo", REPO, "--dry-run", "--db", db]) == 0
    public = (run_dir / "hub" / "stage-1" / "README.md").read_text()
    assert "- Started from: a local folder (its path left out)" in public
    assert "- Engineer: `heuristic` (backend `hf:` a local folder (its path left out))" in public
    assert f"| 1 | proposal #{ids['accepted']}, accepted | wait_ratio[3]" in public
    assert f"| #{ids['accepted']} | 0 | heuristic | accept |\n" in public
    for private in ("by alice", "| alice |", "Bob", "bob@example.org", str(tmp_path)):
        assert private not in public
    assert main(["push", str(ids["history"]), "--repo", REPO, "--dry-run", "--with-notes", "--db", db]) == 0
    full = (run_dir / "hub" / "stage-1" / "README.md").read_text()
    assert f"- Started from: `{local}`" in full and f"- Engineer: `heuristic` (backend `hf:{local}`)" in full
    assert f"| 1 | proposal #{ids['accepted']}, accepted by alice | wait_ratio[3]" in full
    assert f"| #{ids['accepted']} | 0 | heuristic | accept | alice | ask Bob (bob@example.org) before stage 2 |" in full


def test_with_notes_the_card_names_who_decided(pushable):
    engine, ids, db, run_dir, boards = pushable
    assert main(["push", str(ids["history"]), "--repo", REPO, "--dry-run", "--with-notes", "--db", db]) == 0
    assert (run_dir / "hub" / "stage-1" / "README.md").read_text() == card(ids["history"], ids["accepted"], boards,
                                                                          with_notes=True)


@pytest.mark.parametrize(("args", "said"), [
    (["--stage", "0"], "stage 0 of run {run} is its starting policy (tiny), not trained by the run"),
    (["--stage", "5"], "run {run} has no stage 5"),
    ([], None),
])
def test_what_cannot_be_pushed_is_said_in_one_line(pushable, capsys, args, said):
    engine, ids, db, _, _ = pushable
    run = ids["history"] if said else ids["waiting"]
    said = said or "run {run} has no trained stage yet (stage 0 is its starting policy, tiny)"
    assert main(["push", str(run), *args, "--repo", REPO, "--dry-run", "--db", db]) == 2
    assert capsys.readouterr().err == f"envlab push: {said.format(run=run)}\n"


def test_a_repo_that_is_not_org_slash_name_is_refused(pushable, capsys):
    _, ids, db, _, _ = pushable
    assert main(["push", str(ids["history"]), "--repo", "just-a-name", "--dry-run", "--db", db]) == 2
    assert "argument --repo: 'just-a-name': expected ORG/NAME" in capsys.readouterr().err


def test_the_card_passes_the_hubs_own_parsing_with_the_benchmark_as_eval_results(pushable):
    """`huggingface_hub` reads the card back as the Hub's libraries do, refusing a malformed model-index: the base
    model, the license and each agent count's valid and optimal rate on the benchmark's boards."""
    engine, ids, db, run_dir, boards = pushable
    with session(engine) as s:
        run = s.get(Run, ids["history"])
        run.policy = "Qwen/Qwen3-4B"
        s.add(run)
        s.commit()
    assert main(["push", str(ids["history"]), "--repo", REPO, "--dry-run", "--license", "apache-2.0",
                 "--db", db]) == 0
    loaded = ModelCard.load(run_dir / "hub" / "stage-1" / "README.md")
    data = loaded.data
    assert (data.base_model, data.base_model_relation, data.license, data.model_name) == \
        ("Qwen/Qwen3-4B", "finetune", "apache-2.0", REPO)
    assert data.library_versions["trl"] == version("trl")
    common = {"task_type": "text-generation", "task_name": "MAPF-FrozenLake planning",
              "dataset_type": "mapf-frozenlake-benchmark", "dataset_name": "MAPF-FrozenLake benchmark, 2 agents",
              "dataset_config": "2-agents", "dataset_split": "benchmark", "dataset_revision": boards}
    assert data.eval_results == [
        EvalResult(**common, metric_type="valid_rate", metric_name="valid rate (mean over map sizes)",
                   metric_value=0.5),
        EvalResult(**common, metric_type="optimal_rate", metric_name="optimal rate (mean over map sizes)",
                   metric_value=0.5)]
    assert loaded.text.startswith(f"\n# {REPO}\n\nStage 1 of envlab run #{ids['history']} `curriculum`")
    assert "- Started from: `Qwen/Qwen3-4B`" in loaded.text


def test_a_stage_off_the_benchmark_has_no_eval_results(pushable):
    engine, ids, db, run_dir, _ = pushable
    with session(engine) as s:
        s.exec(delete(Episode).where(Episode.split == Split.BENCHMARK))
        s.commit()
    assert main(["push", str(ids["history"]), "--repo", REPO, "--dry-run", "--db", db]) == 0
    loaded = ModelCard.load(run_dir / "hub" / "stage-1" / "README.md")
    assert loaded.data.eval_results is None and "model-index" not in loaded.data.to_dict()
    assert loaded.text.endswith("No stage of this run was evaluated on the 3,150-board benchmark.\n")


def test_no_token_and_no_network_are_each_one_line(pushable, capsys, monkeypatch, tmp_path):
    _, ids, db, _, _ = pushable
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    assert main(["push", str(ids["history"]), "--repo", REPO, "--db", db]) == 2
    assert capsys.readouterr().err == ("envlab push: no Hugging Face token: set HF_TOKEN or run `hf auth login` "
                                       "(--dry-run writes the folder only)\n")
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    assert main(["push", str(ids["history"]), "--repo", REPO, "--db", db]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"envlab push: the upload to {REPO} failed: ") and err.count("\n") == 1
    assert "Traceback" not in err
