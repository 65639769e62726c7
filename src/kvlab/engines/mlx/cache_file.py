"""mlx-lm's explicit prompt-cache file, the offload lab's fourth tier on the Apple track,
timed the way llama.cpp's slot save and restore is.

kvlab runs mlx-lm in a venv of its own (`engines/install.py`) through a shim
(`engines/shims/mlx_prompt_cache.py`) and keeps here what it knows about the file: the
manifest kvlab writes into its safetensors metadata (the file itself refuses nothing: a cache
from another model of the same shapes loads silently), the check before a load, and one step
of the shim. Deliberately not here: its server (`server.py`, `adapter.py`).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from kvlab.core import EngineError, RefusedError
from kvlab.engines import install, local

# mlx-lm flattens the metadata it is given under the key prefix "0." in the file
METADATA_PREFIX = "0."
DIGEST_KEY, MODEL_KEY, VERSION_KEY = "kvlab_model_digest", "kvlab_model", "kvlab_mlx_lm"
STEP_TIMEOUT_S = 600.0


class ShimAnswer(BaseModel):
    """One step of the shim, as it printed it."""

    model_config = ConfigDict(extra="forbid")

    mlx_lm: str
    device: str
    prompt_tokens: int
    cold_s: float | None = None
    cold_top: list[tuple[str, float]] = []
    prefill_s: float | None = None
    save_s: float | None = None
    saved_tokens: int | None = None
    file_bytes: int | None = None
    load_s: float | None = None
    cached_tokens: int | None = None
    restored_s: float | None = None
    restored_top: list[tuple[str, float]] = []


def require_mlx(home: Path) -> Path:
    """The mlx-lm venv's interpreter (EngineError naming the fix when there is none)."""
    python = install.mlx_python(home)
    if python is None:
        raise EngineError("mlx-lm is not installed: run `kvlab engines install` (or "
                          "`kvlab engines install --only mlx`)")
    return python


def manifest(model_dir: str) -> dict[str, str]:
    """What kvlab writes into a cache file's metadata: the model it was computed for."""
    return {DIGEST_KEY: local.content_digest(model_dir) or "unknown",
            MODEL_KEY: str(Path(model_dir).resolve()),  # its path: "hf" named no model
            VERSION_KEY: install.MLX_LM_VERSION}


def file_manifest(path: Path) -> dict[str, str]:
    """The kvlab manifest in a cache file's metadata (empty when kvlab wrote none)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            found = handle.metadata() or {}
    except (OSError, ValueError, SafetensorError) as exc:
        raise RefusedError(f"{path} is not a readable prompt-cache file ({exc}): it was cut or "
                           "changed after mlx-lm wrote it; nothing was loaded from it") from None
    return {k.removeprefix(METADATA_PREFIX): v for k, v in found.items()
            if k.removeprefix(METADATA_PREFIX).startswith("kvlab_")}


def check_file(path: Path, model_dir: str) -> None:
    """Refuse a cache file that kvlab's manifest does not show computed for this model."""
    found, wanted = file_manifest(path), manifest(model_dir)
    if DIGEST_KEY not in found:
        raise RefusedError(f"{path} carries no kvlab manifest ({DIGEST_KEY}): nothing says "
                           "which model computed it, and mlx-lm would load it into any model "
                           "of the same shapes")
    if found[DIGEST_KEY] != wanted[DIGEST_KEY]:
        raise RefusedError(
            f"{path} was computed for another model: {DIGEST_KEY} {found[DIGEST_KEY]} "
            f"({found.get(MODEL_KEY, '?')}) against {wanted[DIGEST_KEY]} "
            f"({wanted[MODEL_KEY]}); its cache would load silently and answer wrongly")


def partial_of(path: Path) -> Path:
    """Where the shim writes the file before renaming it to `path` (whole or absent)."""
    return path.with_name(f".partial-{path.name}")


def run_step(python: Path, step: str, job: Path, timeout_s: float = STEP_TIMEOUT_S
             ) -> ShimAnswer:
    """One shim step in the mlx-lm venv; its answer, or EngineError with its last error."""
    try:
        # umask 077: the cache file holds the user's prompt, so it is born 0600
        done = subprocess.run([str(python), str(install.MLX_SHIM), step, str(job)],
                              capture_output=True, text=True, timeout=timeout_s, check=False,
                              umask=0o077)
    except subprocess.TimeoutExpired:
        raise EngineError(f"mlx-lm's {step} step did not finish in {timeout_s:.0f} s") from None
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-2:])
        raise EngineError(f"mlx-lm's {step} step failed (exit {done.returncode}): {tail}")
    try:
        return ShimAnswer.model_validate(json.loads(done.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError) as exc:
        raise EngineError(f"mlx-lm's {step} step printed no answer kvlab reads ({exc})") \
            from None
