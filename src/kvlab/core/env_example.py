"""kvlab's own env-example.txt: every setting, grouped as the labs' .env groups them, each
with its description and default, from the settings model (`kvlab init` writes it)."""

from __future__ import annotations

from kvlab.core.settings import SCRIPT_SWITCHES, SECRET_FIELDS, Settings, shown_value

_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("the two machines", ("prefill_host", "decode_host", "prefill_hosts", "decode_hosts",
                          "side_channel_addr",
                          "prefill_side_channel_port", "decode_side_channel_port",
                          "cluster_iface", "prefill_devices", "decode_devices")),
    ("the connector", ("connector", "kv_shared_path")),
    ("models", ("model", "small_model", "served_name", "hf_home")),
    ("serving", ("prefill_port", "decode_port", "proxy_port", "serve_host", "ctx", "max_seqs",
                 "mem_fraction", "split_mem_fraction")),
    ("the offload lab", ("kv_offload_gb", "kv_offload_backend", "kv_offload_allow_swap")),
    ("llama.cpp", ("llama_model", "llama_port", "llama_parallel",
                   "llama_slot_save_path", "llama_cache_type")),
    ("the load generator", ("load_test", "concurrency", "requests", "max_tokens", "prompt_set",
                            "preamble_tokens", "preamble_words", "labbook")),
    ("secrets: export them in your shell instead of writing them here",
     ("hf_token", "loadtest_api_key_env")),
    ("switches the seed scripts read from the shell", ("offload", "single_machine",
                                                       "monolithic", "vllm_tag", "llama_bin")),
    ("kvlab's own", ("kvlab_home", "kvlab_profile", "vllm_cmd", "lmcache_cmd", "cpu_kv_cache_gb",
                     "kv_cache_bytes", "enforce_eager", "proxy_api_key_env",
                     "proxy_connect_timeout_s", "proxy_prefill_timeout_s",
                     "proxy_decode_timeout_s", "proxy_max_body_bytes", "proxy_workers",
                     "proxy_max_request_line_bytes", "proxy_max_header_bytes",
                     "proxy_max_headers", "proxy_max_head_bytes", "proxy_head_timeout_s",
                     "proxy_keepalive_timeout_s", "proxy_client_stall_timeout_s",
                     "proxy_max_connections")),
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
            if name in SCRIPT_SWITCHES:  # set in the shell: `. ./.env` would override it
                lines.append(f"#   set it in the shell for one run; here it would override "
                             f"the shell's {name.upper()} in the seed scripts")
                lines.append(f"# {name.upper()}={value}")
            else:
                lines.append(f"{name.upper()}={value}")
    missing = set(Settings.model_fields) - covered
    assert not missing, f"env-example.txt lacks {sorted(missing)}"
    return "\n".join(lines) + "\n"
