"""vLLM where it is installed: rollouts in a stage (TRL's colocate or server mode), and validation and benchmark
answers, on CUDA. Without vLLM (or without a GPU) every caller falls back to transformers and says so.

Three ways a stage reaches vLLM, all through TRL's `GRPOConfig` (`use_vllm`, `vllm_mode`):
- **colocate**: TRL starts a vLLM engine inside the stage's own process, sharing its GPU (`vllm_fields` gives it a
  third of the GPU's memory unless the run says otherwise); it ends with the process.
- **server**: one `trl vllm-serve` per worker (`Server`), started by the worker for the first stage that asks for
  it (`serve_for_job`, the worker's one hook) and kept across stages; TRL pushes the trained weights into it over a
  weight-sync link (NCCL) each step. A stage closes its end of that link when it ends (`close_link`), so the next
  stage opens a fresh one; a run whose policy has another architecture gets a server of its own (the old one is
  stopped). The worker's server stops when the worker exits.
- **validation and the benchmark**: `generate_texts` answers a checkpoint folder's prompts with `vllm.LLM`.

TRL 1.16 supports vLLM 0.22.0 to 0.31.0 (`trl.import_utils.is_vllm_available`); the `vllm` extra pins that range.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("envlab.vllm")

GROUP_PORT_SETTING = "ENVLAB_VLLM_GROUP_PORT"  # the weight-sync group port of the worker's server, for its stages
SERVER_URL_SETTING = "ENVLAB_VLLM_SERVER_URL"  # the worker's server, for the stages it runs (and their children)
COLOCATE_MEMORY = 0.3  # the GPU memory share of a colocated engine (TRL's vllm_gpu_memory_utilization)
SERVE_TIMEOUT_S = 600.0  # a large model loads and compiles for minutes


class VLLMError(RuntimeError):
    """The vLLM server did not start or answer; the message says what it printed last."""


def available() -> bool:
    """Whether vLLM can generate here: the package is installed and there is a CUDA device."""
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return torch.cuda.is_available()


# ---------------------------------------------------------------- a stage's rollouts (TRL)


def vllm_fields(fields: dict[str, Any], server_url: str | None = None,
                longest_prompt: int | None = None) -> dict[str, Any]:
    """`GRPOConfig` fields with vLLM's filled in: colocate gets `COLOCATE_MEMORY` of the GPU, sleeps between
    generations (its memory is free for the update) and, where the stage's `longest_prompt` (in tokens) is known,
    a context of that prompt plus `max_completion_length` (`vllm_max_model_length`): left to the model's config,
    Qwen3's 40,960 positions would take about 6 GB of KV cache for 4B. Server mode, without a URL of its own, uses
    the worker's server (`server_url`, else `$ENVLAB_VLLM_SERVER_URL`). Fields the run set itself stay as they are."""
    if not fields.get("use_vllm"):
        return fields
    fields = dict(fields)
    mode = fields.setdefault("vllm_mode", "colocate")
    if mode == "colocate":
        fields.setdefault("vllm_gpu_memory_utilization", COLOCATE_MEMORY)
        fields.setdefault("vllm_enable_sleep_mode", True)
        if longest_prompt is not None and fields.get("max_completion_length") is not None:
            fields.setdefault("vllm_max_model_length", longest_prompt + fields["max_completion_length"])
    elif mode == "server" and not fields.get("vllm_server_base_url"):
        url = server_url or os.environ.get(SERVER_URL_SETTING)
        if url:
            fields["vllm_server_base_url"] = url
            if (group := os.environ.get(GROUP_PORT_SETTING)) is not None:  # each server its own: no two collide
                fields.setdefault("vllm_group_port", int(group))
    return fields


def close_link(trainer: Any) -> None:
    """Close the trainer's end of the weight-sync link to a vLLM server (server mode), so that the next stage's
    trainer can open its own with the same server; nothing to do in colocate mode or without vLLM."""
    generation = getattr(trainer, "vllm_generation", None)
    client = getattr(generation, "vllm_client", None)
    if client is not None:
        client.close_communicator()
        log.info("closed the weight-sync link to %s", getattr(client, "base_url", "the vLLM server"))


def stop_colocated(trainer: Any) -> None:
    """Stop TRL's colocated vLLM engine (colocate mode; nothing to do otherwise) and take it off the trainer, so
    that its share of the GPU is free before validation starts an engine of its own."""
    generation = getattr(trainer, "vllm_generation", None)
    if getattr(generation, "llm", None) is not None:
        stop_engine(generation.llm)
        generation.llm = None


def stop_engine(llm: Any) -> None:
    """End an in-process vLLM engine: its engine core, then vLLM's process groups (and torch's default group, which
    the engine made or joined: this process's collective work is over). Its memory goes back once nothing refers
    to it and `free_memory` runs."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if callable(getattr(core, "shutdown", None)):
        core.shutdown()
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()


def free_memory() -> None:
    """Collect what nothing refers to any more (a trainer, an engine: both hold reference cycles), and hand CUDA's
    cached blocks back to the device where there is one: a vLLM engine sizes itself by the memory the device
    reports free, which counts PyTorch's cache as taken."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- the worker's server (`trl vllm-serve`)


def serve_command(model: str, port: int, *, host: str = "127.0.0.1", gpu_memory_utilization: float = 0.9,
                  max_model_len: int | None = None) -> list[str]:
    """The `trl vllm-serve` command line for `model` on `port` (TRL adds the weight-transfer settings)."""
    trl = Path(sys.executable).with_name("trl")  # the environment's own `trl` command, else the one on PATH
    command = [str(trl) if trl.is_file() else "trl", "vllm-serve", "--model", model, "--host", host, "--port",
               str(port), "--gpu_memory_utilization", str(gpu_memory_utilization)]
    if max_model_len is not None:
        command += ["--max_model_len", str(max_model_len)]
    return command


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One vLLM server process: started in a process group of its own (stop ends it and every child), ready when
    `GET /health` answers 200."""

    def __init__(self, model: str, command: list[str], port: int, *, gpus: str | None = None,
                 host: str = "127.0.0.1"):
        self.model, self.command, self.port, self.gpus, self.host = model, command, port, gpus, host
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = SERVE_TIMEOUT_S) -> Server:
        env = dict(os.environ)
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus
        self.process = subprocess.Popen(self.command, env=env, start_new_session=True, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if self.process.poll() is not None:
                tail = (self.process.stdout.read() if self.process.stdout else "")[-2000:]
                raise VLLMError(f"the vLLM server for {self.model} exited with {self.process.returncode} before it "
                                f"was ready: {tail.strip() or '(no output)'}")
            if time.monotonic() > deadline:
                self.stop()
                raise VLLMError(f"the vLLM server for {self.model} was not ready at {self.url} after {timeout:g} s")
            time.sleep(0.2)
        log.info("vLLM server for %s ready at %s (pid %s)", self.model, self.url, self.process.pid)
        return self

    def healthy(self) -> bool:
        import httpx

        try:
            return httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace_s: float = 30.0) -> None:
        """End the server's whole process group: SIGTERM, then SIGKILL after `grace_s`."""
        if not self.running():
            return
        pgid = os.getpgid(self.process.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.process.wait()
        log.info("vLLM server for %s stopped", self.model)


_server: Server | None = None  # this worker's server


def split_for_server(gpus: Sequence[str], vllm_gpus: Sequence[str] = ()) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(training GPUs, server GPUs) of a worker that owns `gpus` and serves vLLM to its stages: `vllm_gpus` where
    given (none of them trains), else the last of its GPUs. A worker of one GPU cannot: the server and training rank
    0 would share the device, and TRL's weight sync refuses two ranks on one device. A worker of none (no CUDA here)
    leaves the server's devices as they are."""
    if vllm_gpus:
        train = tuple(g for g in gpus if g not in vllm_gpus)
        if gpus and not train:
            raise VLLMError(f"--vllm-gpus {','.join(vllm_gpus)} leaves no GPU of {','.join(gpus)} to train on")
        return train, tuple(vllm_gpus)
    if len(gpus) == 1:
        raise VLLMError(f"server mode needs a GPU of its own beside the training ones, and this worker owns GPU "
                        f"{gpus[0]} only: use vllm_mode colocate (the one-GPU way), or give the worker two GPUs")
    return tuple(gpus[:-1]), tuple(gpus[-1:])


def ensure_server(model: str, gpus: str | None = None,
                  command: Callable[[str, int], list[str]] = serve_command) -> Server:
    """This worker's server for `model` on `gpus` (None: the devices the worker sees): the running one, or a new one
    on a free port with a free weight-sync group port of its own (an old one for another model or devices is
    stopped first); `command(model, port)` is its command line. Stopped when the worker exits."""
    global _server
    if _server is not None and _server.running() and (_server.model, _server.gpus) == (model, gpus):
        return _server
    stop_server()
    port = free_port()
    _server = Server(model, command(model, port), port, gpus=gpus).start()
    atexit.register(stop_server)
    os.environ[SERVER_URL_SETTING] = _server.url
    os.environ[GROUP_PORT_SETTING] = str(free_port())
    return _server


def stop_server() -> None:
    """Stop this worker's server, if it runs."""
    global _server
    if _server is not None:
        _server.stop()
        _server = None
    os.environ.pop(SERVER_URL_SETTING, None)
    os.environ.pop(GROUP_PORT_SETTING, None)


def serve_for_job(engine: Any, job: Any, gpus: Sequence[str] = (),
                  vllm_gpus: Sequence[str] = ()) -> tuple[str | None, tuple[str, ...]]:
    """The worker's hook before it runs a job, with the GPUs it owns: a stage of a run whose GRPO settings ask for
    vLLM's server mode with no URL of their own gets this worker's server, for the run's policy, on GPUs of its own
    (`split_for_server`). Returns the server's URL (None: nothing to serve) and the GPUs the job trains on. Without
    vLLM the stage itself says so and generates with transformers."""
    if job.kind != "stage" or not available():
        return None, tuple(gpus)
    from storage.db import session
    from storage.models import Run
    from storage.payloads import StagePayload
    from training.policy import policy_folder

    with session(engine) as s:
        run = s.get(Run, StagePayload.of(job).run_id)
    # a run's own server URL is not a setting it may make (`storage.settings.GRPO_FIELDS`): the worker's serves it
    grpo = run.settings.overrides if run is not None else None
    if not (grpo and grpo.vllm_server):
        return None, tuple(gpus)
    train, served = split_for_server(gpus, vllm_gpus)
    return ensure_server(policy_folder(run.policy), ",".join(served) or None).url, train


def with_server(handler: Callable[..., Any], gpus: Sequence[str] = (),
                vllm_gpus: Sequence[str] = ()) -> Callable[..., Any]:
    """The worker's one hook for a job run in its own process: `handler` (a job kind's) run after `serve_for_job`
    has the server it needs up, on GPUs of the worker's own (`gpus`, `vllm_gpus`) apart from the one it trains on;
    a server that cannot start, or has no GPU of its own, fails the job with why."""
    def run(engine: Any, job: Any, progress: Callable[..., bool]) -> Any:
        if (url := serve_for_job(engine, job, gpus, vllm_gpus)[0]) is not None:
            progress(0, None, f"the worker's vLLM server for this run's policy: {url}")
        return handler(engine, job, progress)

    return run


# ---------------------------------------------------------------- validation and benchmark answers


def sampling_kwargs(max_tokens: int, *, sampled: bool, seed: int, min_tokens: int = 0,
                    generation_config: Any = None) -> dict[str, Any]:
    """`vllm.SamplingParams` fields for one evaluation: greedy (temperature 0), or sampled as the model's own
    `generation_config` says (its temperature, top-k, top-p; vLLM's defaults where it says nothing)."""
    kwargs: dict[str, Any] = {"max_tokens": max_tokens, "seed": seed, "skip_special_tokens": True}
    if min_tokens:
        kwargs["min_tokens"] = min_tokens
    if not sampled:
        return {**kwargs, "temperature": 0.0}
    kwargs["temperature"] = getattr(generation_config, "temperature", None) or 1.0
    if top_k := getattr(generation_config, "top_k", None):
        kwargs["top_k"] = top_k
    if top_p := getattr(generation_config, "top_p", None):
        kwargs["top_p"] = top_p
    return kwargs


def vllm_engine(model: str, gpu_memory_utilization: float = COLOCATE_MEMORY) -> Any:
    """A `vllm.LLM` for a checkpoint folder (the engine validation and the benchmark answer with)."""
    from vllm import LLM

    return LLM(model=model, gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=True)


def generate_texts(engine: Any, prompts: list[list[int]] | list[str], max_tokens: int, *, sampled: bool = True,
                   seed: int = 0, min_tokens: int = 0, generation_config: Any = None) -> list[str]:
    """The engine's completions of `prompts`, in order: token ids (as `Policy.token_ids` makes them, so vLLM reads
    exactly what transformers would), or text."""
    from vllm import SamplingParams

    params = SamplingParams(**sampling_kwargs(max_tokens, sampled=sampled, seed=seed, min_tokens=min_tokens,
                                              generation_config=generation_config))
    inputs = [{"prompt_token_ids": p} if isinstance(p, list) else p for p in prompts]
    return [out.outputs[0].text for out in engine.generate(inputs, params, use_tqdm=False)]
