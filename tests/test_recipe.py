"""A settings file written with TRL's and PEFT's own names (a `trl grpo --config recipe.yaml` recipe): each name read
as the lab setting it becomes, said on stderr with its line, refused in one line where two say different things, and
a recipe that runs a stage of LoRA on exactly the modules it names."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from sqlmodel import select

from lab.cli import arguments, main
from lab.settings import settings_from_args
from storage.db import checkpoint_of, make_engine, session
from storage.models import Run, Stage
from storage.settings import RunSettings, SettingsError
from training.policy import lora_config

pytest.importorskip("peft")

TINY = Path(__file__).resolve().parents[1] / "assets" / "tiny-policy"

RECIPE = """\
# Model arguments (TRL's ModelConfig)
use_peft: true
lora_r: 4
lora_alpha: 8
lora_dropout: 0.0
lora_target_modules: [q_proj, v_proj]
chat_template_kwargs:
  enable_thinking: false
# GRPO trainer config, at the top level as TRL reads it
learning_rate: 1.0e-3
max_steps: 2
num_generations: 4
per_device_train_batch_size: 8
temperature: 1.5
# the lab's own
stages: 1
"""

SAID = """\
{path}:2: use_peft -> lora
{path}:3: lora_r -> lora
{path}:7: chat_template_kwargs -> thinking
{path}:10: learning_rate -> grpo.learning_rate
{path}:11: max_steps -> grpo.max_steps
{path}:12: num_generations -> grpo.num_generations
{path}:13: per_device_train_batch_size -> grpo.per_device_train_batch_size
{path}:14: temperature -> grpo.temperature
"""


def recipe(tmp_path: Path, text: str = RECIPE) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


def settings_of(path: Path) -> RunSettings:
    return settings_from_args(arguments().parse_args(["run", "--settings", str(path)]))


def test_each_trl_name_becomes_a_lab_setting_and_says_so(tmp_path, capsys):
    path = recipe(tmp_path)
    assert settings_of(path) == RunSettings(
        stages=1, lora=4, lora_alpha=8, lora_dropout=0.0, lora_target_modules=("q_proj", "v_proj"), thinking="off",
        grpo={"learning_rate": 1e-3, "max_steps": 2, "num_generations": 4, "per_device_train_batch_size": 8,
              "temperature": 1.5}, dev_per_size=30, dev_per_seed=True)
    assert capsys.readouterr().err == SAID.format(path=path)
    # use_peft alone: TRL's own default rank; enable_thinking true: the thinking mode on
    alone = settings_of(recipe(tmp_path, "use_peft: true\nchat_template_kwargs: {enable_thinking: true}\n"))
    assert (alone.lora, alone.lora_alpha, alone.thinking) == (16, None, "on")
    given = lora_config(4, 8, 0.0, ("q_proj", "v_proj"))
    assert (given.r, given.lora_alpha, given.lora_dropout, given.target_modules) == (4, 8, 0.0, {"q_proj", "v_proj"})
    before = lora_config(4)  # a run stored before these settings: alpha twice the rank, dropout 0.05, every linear
    assert (before.r, before.lora_alpha, before.lora_dropout, before.target_modules) == (4, 8, 0.05, "all-linear")


@pytest.mark.parametrize(("text", "said"), [
    ("lora_r: 4\nlora: 8\n", "1: lora_r: lora_r and lora (line 2) both give LoRA's rank: keep one"),
    ("use_peft: false\nlora_r: 4\n", "1: use_peft: use_peft is false but lora is 4"),
    ("use_peft: yes please\n", "1: use_peft: 'yes please' is not true or false"),
    ("chat_template_kwargs: {enable_thinking: true}\nthinking: 'off'\n",
     "1: chat_template_kwargs: chat_template_kwargs and thinking (line 2) both set the thinking mode: keep one"),
    ("chat_template_kwargs: {add_generation_prompt: false}\n",
     "1: chat_template_kwargs: the lab reads enable_thinking only (true or false: its thinking setting)"),
    ("lora_dropout: 0.1\n",
     "1: lora_dropout: LoRA is off (lora = 0): give lora a rank (a TRL recipe's lora_r) to use it"),
    ("lora_r: 4\nlora_target_modules: q_proj\n",
     "2: lora_target_modules = 'q_proj': a list of module names (e.g. [q_proj, v_proj]) or all-linear"),
    ("max_steps: 2\ngrpo:\n  max_steps: 3\n", "3: max_steps is given twice (first on line 1)"),
    ("output_dir: /srv/elsewhere\n", "1: grpo: output_dir: not a GRPOConfig field a run may set"),
])
def test_what_a_recipe_cannot_say_is_refused_naming_its_line(tmp_path, text, said):
    path = recipe(tmp_path, text)
    with pytest.raises(SettingsError) as refused:
        settings_of(path)
    assert str(refused.value).startswith(f"{path}:{said}"), str(refused.value)


def test_a_trl_recipe_runs_a_stage_of_lora_on_the_modules_it_names(tmp_path, capsys, monkeypatch):
    """`envlab run --settings recipe.yaml`, the tiny policy, 2 GRPO steps of 2 boards, 4 answers each: stage 1's
    checkpoint differs from the policy it started from in the query and value projections only (the adapters, folded
    in)."""
    monkeypatch.setenv("ENVLAB_RUNS", str(tmp_path / "runs"))
    path, db = recipe(tmp_path), tmp_path / "lab.db"
    assert main(["run", "--settings", str(path), "--instances", "8", "--validation-boards", "2",
                 "--dev-per-size", "3", "--auto-apply", "--db", str(db)]) == 0
    assert capsys.readouterr().err.startswith(SAID.format(path=path))
    engine = make_engine(str(db))
    with session(engine) as s:
        run = s.exec(select(Run)).one()
        stage = s.exec(select(Stage).where(Stage.run_id == run.id, Stage.index == 1)).one()
        trained = load_file(Path(checkpoint_of(engine, stage)) / "model.safetensors")
    engine.dispose()
    assert (run.settings.lora, run.settings.lora_alpha, run.settings.lora_dropout, run.settings.lora_target_modules,
            run.settings.grpo["max_steps"]) == (4, 8, 0.0, ("q_proj", "v_proj"), 2)
    start = load_file(TINY / "model.safetensors")
    changed = {name for name in start if not torch.equal(start[name], trained[name].to(start[name].dtype))}
    assert {name.rsplit(".", 2)[-2] for name in changed} == {"q_proj", "v_proj"}, sorted(changed)
