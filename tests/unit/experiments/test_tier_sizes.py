"""`kvlab run offload --part curve|boundary` before any engine: the sizes asked, the oracle's
sizes, every engine's plan in a dry run (as the H200 would start them), bad options refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.core.errors import SettingError
from kvlab.experiments.pressure_plan import plan_pressure
from kvlab.experiments.tier_sizes import (
    DEFAULT_SIZES,
    check_sizes,
    oracle_tokens,
    sizes,
    tokens_of,
)

GIB = 2**30


def test_sizes_are_gib_or_multiples_of_the_working_set() -> None:
    p = plan_pressure("Qwen/Qwen3-8B", 4, 4096, 64, 147_456, ctx=8192, block_size=16)
    need = p.tier_bytes_needed / GIB
    found = sizes(("12", "0.5x", "1.5x"), p)
    assert [s.given for s in found] == ["0.5x", "12", "1.5x"]  # smallest first
    assert found[0].gb == pytest.approx(0.5 * need, rel=0.01)
    assert found[0].words == f"KV_OFFLOAD_GB {found[0].gb:g} (0.5x the working set)"
    assert [s.given for s in sizes((), p)] == list(DEFAULT_SIZES)  # below it to above it
    tokens = oracle_tokens(p, found)
    assert tokens[0] == 0 and tokens[-1] >= 2 * p.tier_tokens_needed - 1
    assert len(tokens) > 20 and {tokens_of(s.gb, p) for s in found} <= set(tokens)


@pytest.mark.parametrize("given", [("lots",), ("0x",), ("-2",), ("1x", "1x")])
def test_a_bad_size_is_refused_naming_it(given: tuple[str, ...]) -> None:
    with pytest.raises(SettingError, match="--tier-sizes"):
        check_sizes(given)


def _dry(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KVLAB_HOME": str(tmp_path / "home"), "KVLAB_PROFILE": "gpu-shaped",
           "VLLM_CMD": sys.executable, "KV_OFFLOAD_ALLOW_SWAP": "1", "MEM_FRACTION": "0.85"}
    return subprocess.run([sys.executable, "-m", "kvlab", "run", "offload", *args, "--dry-run",
                           "--json"], capture_output=True, text=True, env=env, check=False,
                          timeout=300)


def test_the_curve_plans_every_size_sharing_one_device(tmp_path: Path) -> None:
    result = _dry(tmp_path, "--part", "curve", "--tier-sizes", "0.25x,0.5x,1x,1.5x")
    assert result.returncode == 0, result.stderr
    plans = json.loads(result.stdout)["plans"]
    assert [p["label"] for p in plans] == ["offload-curve-load"] * 5
    assert "--kv-offloading-size" not in plans[0]["shell"]  # the reference: tier off
    gbs = [float(p["shell"].split("--kv-offloading-size ")[1].split()[0]) for p in plans[1:]]
    assert gbs == sorted(gbs) and gbs[2] == pytest.approx(2 * gbs[1], rel=0.02)
    # five engines on one device: each its share of MEM_FRACTION, the same device cache
    assert all("--gpu-memory-utilization 0.17 " in p["shell"] for p in plans)
    assert len({p["pressure"]["kv_cache_bytes"] for p in plans}) == 1


def test_the_boundary_plans_two_engines_for_every_length(tmp_path: Path) -> None:
    result = _dry(tmp_path, "--part", "boundary", "--lengths", "1000,2000,4000")
    assert result.returncode == 0, result.stderr
    plans = json.loads(result.stdout)["plans"]
    assert [p["label"] for p in plans] == ["offload-boundary-load"] * 2
    assert "openings of 1,000, 2,000, 4,000 tokens" in plans[1]["note"]
    assert "--kv-offloading-size" in plans[1]["shell"]
    bad = _dry(tmp_path, "--part", "boundary", "--lengths", "8,lots")
    assert bad.returncode == 2 and "--lengths" in bad.stderr and "Traceback" not in bad.stderr


def test_the_curve_with_lengths_plans_both_parts_on_one_start(tmp_path: Path) -> None:
    """The H200 phase: the boundary's lengths on the curve's five engines, no sixth."""
    result = _dry(tmp_path, "--part", "curve", "--lengths", "2000,4000,6000")
    assert result.returncode == 0, result.stderr
    plans = json.loads(result.stdout)["plans"]
    assert len(plans) == 5
    assert "and the boundary's runs at openings of 2,000, 4,000, 6,000 tokens" in \
        plans[0]["note"]
