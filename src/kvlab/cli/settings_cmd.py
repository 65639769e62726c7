"""`kvlab settings` (effective values and their sources) and `kvlab init` (env-example.txt)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from kvlab.cli.common import Output, json_option, settings_from
from kvlab.core.errors import InputError
from kvlab.core.settings import SECRET_FIELDS, Settings, shown_value


@click.command("settings")
@json_option
@click.pass_context
def settings_command(ctx: click.Context, as_json: bool) -> None:
    """Show each effective setting and where its value came from (secrets masked)."""
    loaded = settings_from(ctx)
    rows = loaded.rows()
    data = {
        "env_file": str(loaded.env_file) if loaded.env_file else None,
        "profile": loaded.profile,
        "profile_reason": loaded.profile_reason,
        "settings": {key: {"value": value, "source": source} for key, value, source in rows},
        "unknown_keys": loaded.unknown_keys,
    }

    def human(console: Console) -> None:
        table = Table("setting", "value", "source", box=None, pad_edge=False)
        for column in table.columns:
            column.overflow = "fold"
        for key, value, source in rows:
            table.add_row(key, value, source)
        console.print(table)
        console.print(f"\nprofile: {loaded.profile} ({loaded.profile_reason or 'none'})")
        console.print(f"settings file: {loaded.env_file or 'none (./.env not found)'}")
        if loaded.unknown_keys:
            console.print("unknown keys in the settings file (ignored): "
                          + ", ".join(loaded.unknown_keys))

    Output(as_json).result(data, human)


_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("the two machines", ("prefill_host", "decode_host", "side_channel_addr",
                          "prefill_side_channel_port", "decode_side_channel_port",
                          "cluster_iface")),
    ("the connector", ("connector", "kv_shared_path")),
    ("models", ("model", "small_model", "served_name", "hf_home")),
    ("serving", ("prefill_port", "decode_port", "proxy_port", "serve_host", "ctx", "max_seqs",
                 "mem_fraction", "split_mem_fraction")),
    ("the offload lab", ("kv_offload_gb", "kv_offload_backend", "offload")),
    ("llama.cpp", ("llama_model", "llama_bin", "llama_port", "llama_parallel",
                   "llama_slot_save_path", "llama_cache_type")),
    ("the load generator", ("load_test", "concurrency", "requests", "max_tokens", "prompt_set",
                            "preamble_tokens", "preamble_words", "labbook")),
    ("secrets: export them in your shell instead of writing them here",
     ("hf_token", "loadtest_api_key_env")),
    ("switches the seed scripts read from the shell", ("single_machine", "monolithic",
                                                       "vllm_tag")),
    ("kvlab's own", ("kvlab_home", "kvlab_profile", "vllm_cmd", "cpu_kv_cache_gb",
                     "kv_cache_bytes", "enforce_eager", "proxy_api_key_env",
                     "proxy_connect_timeout_s", "proxy_prefill_timeout_s",
                     "proxy_decode_timeout_s", "proxy_max_body_bytes", "proxy_workers")),
)


def env_example_text() -> str:
    """kvlab's own commented env-example.txt, generated from the settings model."""
    defaults = Settings.model_construct()
    lines = [
        "# kvlab settings. Copy to .env and edit; the seed labs' names, so an existing",
        "# lab .env keeps working. Precedence: flag > shell environment > .env > default.",
        "# An empty value means unset (the default applies).",
    ]
    covered: set[str] = set()
    for title, names in _GROUPS:
        lines += ["", f"# --- {title}"]
        for name in names:
            covered.add(name)
            info = Settings.model_fields[name]
            lines.append(f"# {info.description}")
            value = "" if name in SECRET_FIELDS else shown_value(defaults, name)
            lines.append(f"{name.upper()}={value}")
    missing = set(Settings.model_fields) - covered
    assert not missing, f"env-example.txt lacks {sorted(missing)}"
    return "\n".join(lines) + "\n"


@click.command("init")
@click.option("--out", type=click.Path(dir_okay=False), default="env-example.txt",
              show_default=True, help="Where to write the example settings file.")
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
@json_option
def init_command(out: str, force: bool, as_json: bool) -> None:
    """Write a commented env-example.txt with every setting kvlab reads."""
    path = Path(out)
    if path.exists() and not force:
        raise InputError(f"{path} exists; pass --force to overwrite it")
    path.write_text(env_example_text(), encoding="utf-8")
    Output(as_json).result({"written": str(path)},
                           lambda c: c.print(f"wrote {path}; copy it to .env and edit"))


COMMANDS = (settings_command, init_command)
