"""A trained stage to the Hugging Face Hub (`envlab push`): its policy folder and a model card, as one folder.

The card says how the policy came to be, from what the lab stores and computes already: the policy the run
started from, the config timeline with who set each value (`lab.runs.config_timeline`, the Stage review tab's),
every decision (`lab.proposals.proposal_states`), each stage's validation rates
(`lab.results.stage_summaries`, pooled as everywhere, docs/results.md) and the benchmark tables of the stages
evaluated on it (`lab.runs.benchmark_report`, with the hash of their boards). Nothing here computes a number of its own.

A card is public: who decided, the notes they kept and this machine's paths (a policy or an engineer's model loaded
from a folder) stay out of it unless the push asks for them (`with_notes`, `envlab push --with-notes`).

The card is `huggingface_hub`'s own `ModelCard`, its YAML header a `ModelCardData`: the base model (where the run
started from a Hub model), the license, the library versions of the machine that pushed it, and the pushed stage's
benchmark as `eval_results` (the valid and optimal rate of each agent count, the mean over map sizes as the paper
reports it, with the boards' hash as the dataset's revision), which the Hub shows as the model's evaluation results.

The folder is `<run folder>/hub/stage-<k>/`, made anew on each push; the checkpoint's files are hard links where the
filesystem allows (a large policy is not copied), else copies. Uploading is one commit of the Hub's own upload API
(`HfApi().create_repo(exist_ok=True)`, then `create_commit` with a `CommitOperationAdd` per file of the folder), with
the token `huggingface_hub` finds (`HF_TOKEN`, or `hf auth login`). A dry run makes the same operations and writes
them, instead of sending them, to `<run folder>/hub/stage-<k>.commit.json` (`commit_plan`).
"""

from __future__ import annotations

import json
import os
import shutil
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine

from lab.loop import missing_checkpoint, stages_of
from lab.proposals import proposal_states
from lab.results import stage_summaries
from lab.runs import ConfigStep, benchmark_checkpoints, benchmark_report, config_timeline
from storage.db import UnsafePath, checkpoint_of, run_folder, session
from storage.models import Run, Stage, StageStatus

if TYPE_CHECKING:
    from huggingface_hub import CommitOperationAdd, EvalResult, ModelCard

TAGS = ["envlab", "mapf-frozenlake", "grpo", "trl"]
# The policies of the lab's own names that start from a model on the Hub, and that model's Hub id and license.
HUB_BASES = {"gemma3-270m": ("google/gemma-3-270m", "gemma")}
# The libraries whose versions the card names: the lab, and what trained and loads the policy.
LIBRARIES = ("envlab", "trl", "transformers", "torch", "peft", "datasets", "huggingface_hub")
BENCHMARK = "mapf-frozenlake-benchmark"  # the benchmark as the card's eval results name it (`envlab bench-suite`)


class PushError(RuntimeError):
    """A stage that cannot be pushed, or an upload that failed: the message says why in one line."""


def pushed_stage(engine: Engine, run_id: int, stage_index: int | None) -> tuple[Run, Stage, Path]:
    """The run, the stage to push (`stage_index`, else its last finished trained stage) and its checkpoint folder."""
    with session(engine) as s:
        run, stages = s.get(Run, run_id), stages_of(s, run_id)
    if run is None:
        raise PushError(f"no run {run_id} in this database")
    done = [stage for stage in stages if stage.status == StageStatus.DONE and stage.index > 0]
    if stage_index is None:
        if not done:
            raise PushError(f"run {run_id} has no trained stage yet (stage 0 is its starting policy, {run.policy})")
        stage_index = done[-1].index
    stage = next((stage for stage in stages if stage.index == stage_index), None)
    if stage is None or stage_index == 0:
        raise PushError(f"run {run_id} has no stage {stage_index}" if stage is None else
                        f"stage 0 of run {run_id} is its starting policy ({run.policy}), not trained by the run")
    if stage.status != StageStatus.DONE:
        raise PushError(f"stage {stage_index} of run {run_id} is {stage.status}: only a finished stage is pushed")
    if (why := missing_checkpoint(engine, run_id, stage_index)) is not None:
        raise PushError(why)
    return run, stage, Path(checkpoint_of(engine, stage))


def _cell(value: object) -> str:
    """Text for a Markdown table cell: one line, no column breaks."""
    return " ".join(str(value).split()).replace("|", "\\|")


def _changes(step: ConfigStep) -> str:
    if step.stage_index == 0:
        return f"`{step.config.model_dump_json()}`"
    return "; ".join(f"{c.field} {c.old:.4g} → {c.new:.4g} ({step.set_by[c.field]})" for c in step.changes) or \
        "no value changed"


def _local(spec: str) -> bool:
    """Whether a policy or model spec names a folder on this machine (not a name such as `tiny` or `Qwen/Qwen3-4B`)."""
    return spec.startswith(("/", "~", ".")) or Path(spec).exists()


def _spec(spec: str, with_notes: bool) -> str:
    """A policy or model spec as the card shows it: a folder of this machine only `with_notes`."""
    return f"`{spec}`" if with_notes or not _local(spec) else "a local folder (its path left out)"


def base_model(spec: str) -> str | None:
    """The Hub id a run's starting policy derives from: a Hub model's own name (`Qwen/Qwen3-4B`), the Hub model behind
    one of the lab's names (`HUB_BASES`); None for the lab's own `tiny` policies and a folder of this machine."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if spec in HUB_BASES:
        return HUB_BASES[spec][0]
    if _local(spec) or spec.count("/") != 1:
        return None
    try:
        validate_repo_id(spec)
    except HFValidationError:
        return None
    return spec


def default_license(spec: str) -> str:
    """The card's license where the push names none: the license of the Hub model the lab's name stands for
    (`HUB_BASES`), else `other` (the Hub's value for a license it does not list)."""
    return HUB_BASES[spec][1] if spec in HUB_BASES else "other"


def library_versions() -> dict[str, str]:
    """The installed version of each of `LIBRARIES` (those installed)."""
    found = {}
    for name in LIBRARIES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def eval_results(engine: Engine, run: Run, stage: Stage) -> list[EvalResult]:
    """The stage's benchmark as `huggingface_hub.EvalResult`s: per agent count, its valid and optimal rate (the mean
    over map sizes, `lab.runs.benchmark_report`), on the boards whose hash is the dataset's revision. Empty where
    the stage was not evaluated on the benchmark."""
    from huggingface_hub import EvalResult

    if (run.id, stage.index) not in {(r, k) for r, k, _ in benchmark_checkpoints(engine)}:
        return []
    report = benchmark_report(engine, run.id, stage.index)
    return [EvalResult(task_type="text-generation", task_name="MAPF-FrozenLake planning", dataset_type=BENCHMARK,
                       dataset_name=f"MAPF-FrozenLake benchmark, {k} agents", dataset_config=f"{k}-agents",
                       dataset_split="benchmark", dataset_revision=report.boards, metric_type=metric,
                       metric_name=f"{metric.replace('_', ' ')} (mean over map sizes)", metric_value=round(rate, 4))
            for k, (valid, optimal) in sorted(report.mean_over_sizes.items())
            for metric, rate in (("valid_rate", valid), ("optimal_rate", optimal))]


def model_card(engine: Engine, run: Run, stage: Stage, repo: str, with_notes: bool = False,
               license: str | None = None) -> ModelCard:
    """The README.md of the pushed folder as `huggingface_hub.ModelCard`: its `ModelCardData` (base model, license,
    library versions, the benchmark as eval results), then how the policy came to be (the stages up to `stage` and
    the decisions that led to them). Who decided, their notes and this machine's paths only `with_notes`;
    `license` a Hub license id (default `default_license`)."""
    from huggingface_hub import ModelCard, ModelCardData

    base = base_model(run.policy)
    data = ModelCardData(base_model=base, base_model_relation="finetune" if base else None,
                         license=license or default_license(run.policy), library_name="transformers",
                         pipeline_tag="text-generation", tags=TAGS, model_name=repo,
                         eval_results=eval_results(engine, run, stage) or None,
                         library_versions=library_versions())
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{card_text(engine, run, stage, repo, with_notes)}")


def card_text(engine: Engine, run: Run, stage: Stage, repo: str, with_notes: bool = False) -> str:
    """The card's Markdown below its header (`model_card`)."""
    backend = run.engineer_backend
    if backend:
        kind, _, name = backend.partition(":")
        backend = f"`{backend}`" if with_notes or not _local(name) else f"`{kind}:` a local folder (its path left out)"
    engineer = f"`{run.engineer}`" + (f" (backend {backend})" if backend else "")
    lines = [f"# {repo}", "",
             f"Stage {stage.index} of envlab run #{run.id} `{run.name}`: a policy trained with GRPO (TRL) in stages on "
             "MAPF-FrozenLake. After each stage an environment engineer proposed the next stage's environment "
             "config, and a person (or the run itself, auto-apply) decided on it.", "",
             f"- Started from: {_spec(run.policy, with_notes)}", f"- Engineer: {engineer}", f"- Run seed: {run.seed}",
             "",
             "## Config timeline", "",
             "Each stage's config as it trained: stage 0's whole, then each value that changed from the stage before "
             "and who set it (engineer: proposed and accepted; person: a person's edit; auto-apply: applied by the "
             "run itself).", "", "| stage | config from | changed |", "| --- | --- | --- |"]
    lines += [f"| {step.stage_index} | {_cell(step.source if with_notes else step.origin)} | {_cell(_changes(step))} |"
              for step in config_timeline(engine, run.id) if step.stage_index <= stage.index]
    headers = ["proposal", "after stage", "engineer", "decision", *(("by", "note") if with_notes else ())]
    lines += ["", "## Decisions", "", "| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    for p in reversed(proposal_states(engine, run.id)):
        if p.decision is not None and p.proposal.after_stage < stage.index:
            said = (p.decision.user, p.decision.note) if with_notes else ()
            cells = [f"#{p.proposal.id}", p.proposal.after_stage, p.proposal.engineer, p.decision.action, *said]
            lines.append("| " + " | ".join(map(_cell, cells)) + " |")
    return "\n".join(lines + _rates(engine, run, stage)) + "\n"


def _rates(engine: Engine, run: Run, stage: Stage) -> list[str]:
    """The card's validation rates per stage, and the benchmark tables of the stages evaluated on it."""
    with session(engine) as s:
        summaries = stage_summaries(s, run.id)
    lines = ["", "## Validation", "", "Valid and optimal rates over each stage's validation episodes, pooled over map "
             "sizes.", "", "| stage | valid | optimal | episodes |", "| --- | --- | --- | --- |"]
    lines += [f"| {k} | {t.valid_rate:.1%} | {t.optimal_rate:.1%} | {t.episodes} |"
              for k, t in ((k, summaries[k].pooled) for k in sorted(summaries) if k <= stage.index)]
    lines += ["", "## Benchmark", ""]
    stages = [k for run_id, k, _ in benchmark_checkpoints(engine) if run_id == run.id and k <= stage.index]
    if not stages:
        return [*lines, "No stage of this run was evaluated on the 3,150-board benchmark."]
    for k in stages:
        report = benchmark_report(engine, run.id, k)
        lines += [f"Stage {k}, on the boards with sha256 `{report.boards}` (`envlab bench-suite` prints it); the "
                  "mean over map sizes as the paper reports it:", "", report.to_markdown(), ""]
    return lines[:-1]


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def write_folder(engine: Engine, run_id: int, stage_index: int | None, repo: str, with_notes: bool = False,
                 license: str | None = None) -> Path:
    """The folder to upload, made anew: the stage's checkpoint files and the model card (`model_card`; who decided,
    their notes and local paths only `with_notes`)."""
    run, stage, checkpoint = pushed_stage(engine, run_id, stage_index)
    try:
        folder = run_folder(engine, run.uuid) / "hub" / f"stage-{stage.index}"
    except UnsafePath as err:
        raise PushError(str(err)) from None
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(checkpoint, folder, copy_function=_link_or_copy)
    (folder / "README.md").unlink(missing_ok=True)  # a link into the checkpoint: never written through
    model_card(engine, run, stage, repo, with_notes, license).save(folder / "README.md")
    return folder


def commit_message(folder: Path) -> str:
    return f"envlab push: {folder.name}"


def operations(folder: Path) -> list[CommitOperationAdd]:
    """The commit that uploads `folder`: a `huggingface_hub.CommitOperationAdd` per file, by its path in the folder."""
    from huggingface_hub import CommitOperationAdd

    return [CommitOperationAdd(path_in_repo=path.relative_to(folder).as_posix(), path_or_fileobj=path)
            for path in sorted(folder.rglob("*")) if path.is_file()]


def commit_plan(folder: Path, repo: str) -> Path:
    """What `upload` would send, written instead of sent, beside the folder (`stage-<k>.commit.json`): the repo, the
    commit message and each operation's path in the repo, size and sha256, as the Hub's upload computes them."""
    files = [{"path_in_repo": op.path_in_repo, "size": op.upload_info.size, "sha256": op.upload_info.sha256.hex()}
             for op in operations(folder)]
    plan = folder.with_name(f"{folder.name}.commit.json")
    plan.write_text(json.dumps({"repo_id": repo, "repo_type": "model", "commit_message": commit_message(folder),
                                "operations": files}, indent=1) + "\n")
    return plan


def upload(folder: Path, repo: str) -> str:
    """`folder` to the Hub model repo `repo` (made when missing) as one commit (`operations`); the commit's URL. A
    missing token, a refusal or a network error is a `PushError` in one line."""
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.errors import HTTPError

    if get_token() is None:
        raise PushError("no Hugging Face token: set HF_TOKEN or run `hf auth login` (--dry-run writes the folder only)")
    api = HfApi()
    try:
        api.create_repo(repo, exist_ok=True)
        commit = api.create_commit(repo_id=repo, operations=operations(folder), commit_message=commit_message(folder))
    except (OSError, HTTPError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise PushError(f"the upload to {repo} failed: {first}") from None
    return str(commit.commit_url)
