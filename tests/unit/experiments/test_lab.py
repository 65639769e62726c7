"""HF_TOKEN from `.env` reaches the engines `kvlab run` starts, and is written nowhere.

The engine is a small stand-in that reports, in a file of its own, whether HF_TOKEN reached
its environment (never the value); what is checked is what `Lab` and `engines()` do with it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvlab.core.settings import load_settings
from kvlab.engines.plan import EnginePlan
from kvlab.engines.ports import free_port
from kvlab.experiments.lab import Lab, engines

TOKEN = "hf_secretvalue_0123456789"
ENGINE = """
import os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        return

Path(sys.argv[2]).write_text("set" if os.environ.get("HF_TOKEN") else "unset")
print("env-reporting engine starting", flush=True)
HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


async def test_hf_token_from_dotenv_reaches_a_run_engine_and_nothing_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVLAB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    env_file = tmp_path / "lab.env"
    env_file.write_text(f"HF_TOKEN={TOKEN}\n", encoding="utf-8")
    settings = load_settings(env_file).values
    script, seen = tmp_path / "engine.py", tmp_path / "seen.txt"
    script.write_text(ENGINE, encoding="utf-8")
    port = free_port()
    plan = EnginePlan(engine="env-reporter", role="baseline",
                      command=(sys.executable, str(script)), positional=(str(port), str(seen)),
                      port=port)
    lab = Lab(settings)
    async with engines(lab, [plan], labels=["secret-check"], ready_timeout_s=60) as (proc,):
        log = proc.log_path
    assert seen.read_text(encoding="utf-8") == "set"
    written = [log, Path(settings.labbook), *(tmp_path / "home").rglob("*")]
    for path in (p for p in written if p.is_file()):
        assert TOKEN not in path.read_text(encoding="utf-8", errors="replace"), path
    assert lab.written and TOKEN not in str(plan.as_dict())


def test_a_runs_scratch_is_private_kept_from_clean_and_removed_after(tmp_path: Path) -> None:
    # a llama-server's slot directory under scratch/ was removable by another kvlab's
    # `kvlab clean` while the run's engine wrote to it
    from kvlab.core.settings import Settings
    from kvlab.engines.cleanup import clean

    settings = Settings(kvlab_home=str(tmp_path / "home"),
                        llama_slot_save_path=str(tmp_path / "slots"))
    lab = Lab(settings)
    slots = lab.scratch("interference-slots")
    assert lab.scratch("interference-slots") == slots  # made once, not emptied again
    assert slots.is_dir() and (slots.stat().st_mode & 0o777) == 0o700
    (slots / "slot.bin").write_bytes(b"prompt")
    assert (slots / "slot.bin").exists() and str(slots.parent) not in clean(settings).removed
    assert (slots / "slot.bin").exists()
    lab.cleanup()
    assert not slots.parent.exists()
