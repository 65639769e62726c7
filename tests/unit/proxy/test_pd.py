"""The proxy's pure parts: per-connector bodies, leg choice, URLs, config from settings."""

from __future__ import annotations

import copy

import pytest

from kvlab.core import connectors
from kvlab.core.errors import RefusedError, SettingError
from kvlab.core.settings import Settings
from kvlab.proxy import pd
from kvlab.proxy.app import request_id, upstream_message
from kvlab.proxy.config import ProxyConfig
from kvlab.proxy.legs import LegPool
from kvlab.proxy.upstream import parse_url

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "stream_options": {"include_usage": True}, "max_completion_tokens": 50,
        "min_tokens": 5, "temperature": 0, "cache_salt": "tenant-a"}


@pytest.mark.parametrize("connector", ["shared", "lmcache"])
def test_content_addressed_prefill_is_one_token_and_decode_is_untouched(connector: str) -> None:
    original = copy.deepcopy(CHAT)
    body = pd.prefill_body(CHAT, connectors.get(connector), "r1")
    assert body["max_tokens"] == 1 and body["max_completion_tokens"] == 1
    assert body["stream"] is False
    assert "stream_options" not in body and "min_tokens" not in body
    assert "kv_transfer_params" not in body
    assert body["cache_salt"] == "tenant-a" and body["messages"] == CHAT["messages"]
    plan = pd.decode_plan(CHAT, connectors.get(connector), "r1")
    assert plan.body is None and not plan.params_missing  # the client's bytes go as they are
    assert original == CHAT


def test_max_completion_tokens_only_where_the_client_used_it() -> None:
    body = pd.prefill_body({"model": "m", "prompt": "x", "max_tokens": 9}, connectors.SHARED, "r")
    assert body["max_tokens"] == 1 and "max_completion_tokens" not in body


def test_a_clients_kv_transfer_params_never_reach_an_engine() -> None:
    hostile = {**CHAT, "kv_transfer_params": {"do_remote_prefill": True,
                                              "remote_host": "attacker.example"}}
    for connector in connectors.CONNECTORS.values():
        prefill = pd.prefill_body(hostile, connector, "r")
        assert "attacker.example" not in repr(prefill)
        peer = pd.PrefillPeer("http://p:8998", "engine-p")
        plan = pd.decode_plan(hostile, connector, "r", {}, peer)
        assert plan.body is not None and "attacker.example" not in repr(plan.body)


def test_nixl_round_trip() -> None:
    prefill = pd.prefill_body(CHAT, connectors.NIXL, "r7")
    assert prefill["kv_transfer_params"]["do_remote_decode"] is True
    assert prefill["kv_transfer_params"]["do_remote_prefill"] is False
    assert pd.prefill_reply_needed(connectors.NIXL)
    assert not pd.prefill_reply_needed(connectors.SHARED)
    params = {"do_remote_prefill": True, "remote_block_ids": [[1, 2]], "remote_engine_id": "e",
              "remote_host": "10.0.0.1", "remote_port": 5600, "remote_request_id": "r7"}
    reply = {"choices": [], "kv_transfer_params": params}
    plan = pd.decode_plan(CHAT, connectors.NIXL, "r7", reply)
    assert plan.body is not None and plan.body["kv_transfer_params"] == params
    assert plan.body["stream"] is True and plan.body["max_completion_tokens"] == 50
    assert not plan.params_missing


@pytest.mark.parametrize("reply", [{"choices": []}, {"kv_transfer_params": None},
                                   {"kv_transfer_params": {}}, None])
def test_nixl_without_params_is_flagged(reply: dict[str, object] | None) -> None:
    plan = pd.decode_plan(CHAT, connectors.NIXL, "r", reply)
    assert plan.params_missing
    assert plan.body is not None and "kv_transfer_params" not in plan.body


def test_mooncake_shares_a_transfer_id_and_names_the_prefill_engine() -> None:
    prefill = pd.prefill_body(CHAT, connectors.MOONCAKE, "abc")
    peer = pd.PrefillPeer("http://10.0.0.1:8998", "engine-1")
    plan = pd.decode_plan(CHAT, connectors.MOONCAKE, "abc", None, peer)
    assert plan.body is not None
    decode = plan.body["kv_transfer_params"]
    assert prefill["kv_transfer_params"]["transfer_id"] == decode["transfer_id"] == "xfer-abc"
    assert decode["do_remote_prefill"] is True and decode["do_remote_decode"] is False
    assert decode["remote_bootstrap_addr"] == "http://10.0.0.1:8998"
    assert decode["remote_engine_id"] == "engine-1"
    assert pd.decode_plan(CHAT, connectors.MOONCAKE, "abc", None, pd.PrefillPeer()).params_missing


def test_unknown_connector_is_refused() -> None:
    with pytest.raises(SettingError, match="p2pnccl"):
        connectors.get("p2pnccl")
    with pytest.raises(SettingError, match="CONNECTOR"):
        ProxyConfig(prefill=("a:1",), decode=("b:2",), connector="p2pnccl")


def test_round_robin_and_least_outstanding() -> None:
    rr = LegPool("decode", ("a:1", "b:2", "c:3"), "round-robin", 1.0)
    assert [rr.pick().url for _ in range(4)] == ["http://a:1", "http://b:2", "http://c:3",
                                                 "http://a:1"]
    lo = LegPool("decode", ("a:1", "b:2"), "least-outstanding", 1.0)
    first, second = lo.pick(), lo.pick()
    assert {first.url, second.url} == {"http://a:1", "http://b:2"}
    LegPool.done(second)
    assert lo.pick() is second  # the idle one, whatever the rotation says
    assert lo.pick().outstanding == 2
    with pytest.raises(RefusedError, match="--prefill"):
        LegPool("prefill", (), "round-robin", 1.0)


@pytest.mark.parametrize(("given", "url"), [
    ("127.0.0.1:8100", "http://127.0.0.1:8100"),
    ("http://node-a:8100/v1", "http://node-a:8100"),
    ("[::1]:8200", "http://[::1]:8200"),
])
def test_engine_urls(given: str, url: str) -> None:
    assert parse_url(given)[2] == url


@pytest.mark.parametrize("bad", ["https://node:8100", "node-a", "node:notaport", ""])
def test_bad_engine_urls_are_refused(bad: str) -> None:
    with pytest.raises(SettingError):
        parse_url(bad)


def test_config_from_settings_follows_the_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    config = ProxyConfig.from_settings(Settings())
    assert config.urls == {"prefill": ["http://127.0.0.1:8100"],
                           "decode": ["http://127.0.0.1:8200"]}
    assert (config.host, config.port, config.connector) == ("127.0.0.1", 8000, "shared")
    assert (config.connect_timeout_s, config.prefill_timeout_s,
            config.decode_timeout_s) == (5.0, 300.0, 600.0)
    assert config.api_key == ""
    settings = Settings(prefill_host="node-a", decode_host="node-b", proxy_port=9000,
                        proxy_prefill_timeout_s=7, proxy_api_key_env="KVLAB_TEST_KEY")
    monkeypatch.setenv("KVLAB_TEST_KEY", "s3cret-value")
    config = ProxyConfig.from_settings(settings, decode=("d1:1", "d2:2"))
    assert config.urls["prefill"] == ["http://node-a:8100"]
    assert config.urls["decode"] == ["http://d1:1", "http://d2:2"]
    assert config.port == 9000 and config.prefill_timeout_s == 7
    assert config.api_key == "s3cret-value"
    assert "s3cret" not in repr(config) and "s3cret" not in repr(config.summary())
    xpyd = Settings(prefill_hosts="node-a,node-c", decode_hosts="node-b,node-d")
    config = ProxyConfig.from_settings(xpyd)  # every listed node, at the role's port
    assert config.urls == {"prefill": ["http://node-a:8100", "http://node-c:8100"],
                           "decode": ["http://node-b:8200", "http://node-d:8200"]}


def test_an_empty_key_variable_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVLAB_TEST_KEY", raising=False)
    with pytest.raises(SettingError, match="KVLAB_TEST_KEY"):
        ProxyConfig.from_settings(Settings(proxy_api_key_env="KVLAB_TEST_KEY"))


def test_request_ids_and_upstream_messages() -> None:
    assert request_id({b"x-request-id": b"abc-123"}) == b"abc-123"
    for bad in (b"has space", b"x" * 200, b"new\r\nline"):
        made = request_id({b"x-request-id": bad})
        assert made != bad and len(made) == 32
    assert upstream_message(b'{"error": {"message": "too long"}}') == "too long"
    assert upstream_message(b'{"object": "error", "message": "old vllm"}') == "old vllm"
    assert upstream_message(b"<html>oops</html>") == "<html>oops</html>"
    assert upstream_message(b"") == "(empty body)"


def test_the_command_refuses_engines_that_do_not_answer() -> None:
    import subprocess
    import sys

    from kvlab.engines.ports import free_port

    dead = free_port()
    run = subprocess.run([sys.executable, "-m", "kvlab", "proxy", "--prefill",
                          f"127.0.0.1:{dead}", "--decode", f"127.0.0.1:{free_port()}",
                          "--port", "0"], capture_output=True, text=True, timeout=60,
                         check=False)
    assert run.returncode == 2
    assert run.stderr.strip() == (f"kvlab: the prefill instance is not answering on "
                                  f"http://127.0.0.1:{dead} (ConnectError); start it first")
    bad = subprocess.run([sys.executable, "-m", "kvlab", "proxy", "--decode", "https://x:1"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "only http://" in bad.stderr
