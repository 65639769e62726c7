"""`python -m mlx_lm server` as a plan: the OpenAI API whose responses report cached prompt
tokens, the evidence of reuse across turns.
"""

from __future__ import annotations

from pathlib import Path

from kvlab.engines.plan import EnginePlan, Flag

MLX_LM = "mlx-lm"  # its name in plans and records
ROLE = "mlx"  # one mlx-lm server
SUBCOMMAND = ("-m", "mlx_lm", "server")


def server_plan(python: Path, model_dir: str, port: int, hub_cache: Path,
                host: str = "127.0.0.1", role: str = ROLE) -> EnginePlan:
    """`python -m mlx_lm server` on `port`: its OpenAI API reports cached prompt tokens per
    response, the evidence of reuse across turns. The model is a local directory
    (HF_HUB_OFFLINE); `/v1/models` also lists the Hugging Face cache and answers HTTP 500 where
    that directory does not exist (a fresh machine), so the plan gives it one (`hub_cache`)."""
    return EnginePlan(
        engine=MLX_LM, role=role, command=(str(python), *SUBCOMMAND),
        flags=(Flag("--model", model_dir), Flag("--host", host), Flag("--port", str(port))),
        env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub_cache)}, host=host, port=port,
        health_path="/health", private_dirs=(str(hub_cache),),
        summary=(("model", model_dir), ("listening on", f"http://{host}:{port}")),
        model=model_dir, served_name=model_dir)
