"""The Runs tab: every run, and the form that creates one and queues its stage 0."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gradio as gr
from sqlalchemy import Engine

from envsim.config import KNOB_HELP, KNOBS, ConfigError, EnvConfig, project
from lab.engineers import ENGINEERS
from lab.loop import LoopError
from lab.pages.common import KNOB_COLUMNS, Page, config_from_table, config_rows, table, when
from lab.runs import new_run, run_list


def run_choices(engine: Engine) -> list[tuple[str, int]]:
    """The "Open run" dropdown's choices, newest first."""
    return [(f"#{row.run.id} {row.run.name} ({row.run.status})", row.run.id) for row in run_list(engine)]


def runs_table(engine: Engine) -> dict[str, Any]:
    rows = []
    for row in run_list(engine):
        r = row.run
        engineer = r.engineer + (f" ({r.engineer_backend})" if r.engineer_backend else "")
        stages = f"{row.trained}/{r.settings.get('stages', '?')} trained"
        auto = "on" if r.settings.get("auto_apply") else "off"
        rows.append([r.id, r.name, r.status, r.policy, engineer, stages, auto, when(r.created_at)])
    return table(["id", "name", "status", "policy", "engineer", "stages", "auto-apply", "created"], rows)


def create_run_from_form(engine: Engine, name: str, description: str, policy: str, engineer: str, backend: str,
                         base_url: str, stages: Any, instances: Any, agents: Any, seed: Any, auto_apply: bool,
                         rows: Sequence[Sequence[Any]]) -> tuple[str, int | None]:
    """Validate the form, store the run and queue its stage 0; returns (message, new run id or None)."""
    name, description, policy, backend, base_url = ((v or "").strip() for v in (name, description, policy, backend,
                                                                               base_url))  # hidden fields send None
    try:
        config = project(config_from_table(rows, agents, instances), strict=True).config
    except ConfigError as err:
        return "✗ The initial config is not valid, nothing was stored: " + "; ".join(err.problems), None
    try:
        run = new_run(engine, name=name or "run", description=description, config=config, stages=int(stages),
                         policy=policy or "tiny", engineer=engineer, engineer_backend=backend,
                         auto_apply=bool(auto_apply), seed=int(seed or 0), base_url=base_url or None)
    except (LoopError, ValueError, TypeError) as err:
        return f"✗ Not created: {err}", None
    return (f"✓ Created run #{run.id} **{run.name}**: stage 0 (the starting policy, evaluated on the "
            "validation set) is queued. Follow it in the Train tab."), run.id


@dataclass(eq=False)
class RunsTab:
    """The tab's widgets; `form` is the create form's inputs, in `create_run_from_form`'s order."""

    table: gr.Dataframe
    form: list[Any]
    create: gr.Button
    message: gr.Markdown


def build(page: Page) -> RunsTab:
    knob_help = " ".join(f"**{k}**: {v}." for k, v in KNOB_HELP.items() if k in KNOBS)
    default = EnvConfig.default()
    runs_df = gr.Dataframe(label="Runs (newest first); pick one in “Open run” above", interactive=False,
                           elem_id="runs-table")
    with gr.Accordion("New run", open=True):
        with gr.Row():
            name = gr.Textbox(label="Name", value="my run", elem_id="new-name")
            policy = gr.Textbox(label="Policy", value="tiny",
                                info="`tiny` (ships in assets/, trains on a CPU), `gemma3-270m`, a "
                                     "checkpoint folder or a Hugging Face model name")
            engineer = gr.Dropdown(label="Engineer", choices=list(ENGINEERS), value="heuristic", elem_id="new-engineer")
            backend = gr.Textbox(label="LLM backend", placeholder="hf:policy", visible=False,
                                 info="hf:policy (the policy itself, as in the paper), hf:gemma3-270m, "
                                      "or openai:<model> with a server URL")
            base_url = gr.Textbox(label="Server URL (openai backend)", visible=False,
                                  placeholder="http://localhost:8000/v1")
        with gr.Row():
            stages = gr.Number(label="Training stages", value=3, precision=0, minimum=1)
            instances = gr.Number(label="Training instances per stage", value=default.num_instances, precision=0,
                                  minimum=1)
            agents = gr.Number(label="Agents per training board", value=default.num_agents, precision=0)
            seed = gr.Number(label="Seed", value=0, precision=0)
            auto = gr.Checkbox(label="Auto-apply proposals (no review)", value=False)
        description = gr.Textbox(label="Description (optional)", lines=1)
        gr.Markdown(f"Initial config (stage 0 and the round-0 default), one row per map size. {knob_help}")
        config_df = gr.Dataframe(value=config_rows(default), headers=KNOB_COLUMNS, type="array", interactive=True,
                                 elem_id="new-config", label="Initial config")
        create = gr.Button("Create run and queue stage 0", variant="primary", elem_id="create-run")
        message = gr.Markdown(elem_id="create-msg")

    def show_backend(chosen: str) -> dict[Any, Any]:
        return {backend: gr.update(visible=chosen == "llm"), base_url: gr.update(visible=chosen == "llm")}

    engineer.input(show_backend, engineer, [backend, base_url])
    form = [name, description, policy, engineer, backend, base_url, stages, instances, agents, seed, auto, config_df]
    return RunsTab(runs_df, form, create, message)
