"""What the llama-server experiments share: their own server plans, logs and long prompts.

An experiment chooses its own server settings (context, slots, the RAM prompt cache) so a slot
can hold its prompt, and records them; it always binds a free loopback port, so it never
collides with a server the user runs on LLAMA_PORT. Prompts are deterministic text cut to an
exact token count with the server's own tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from kvlab.core import SettingError, Settings
from kvlab.engines.llamacpp import facts
from kvlab.engines.llamacpp.client import LlamaClient
from kvlab.engines.models import prose
from kvlab.engines.plan import EnginePlan
from kvlab.engines.ports import free_port
from kvlab.records import LlamaServerLine

TEMPLATE_MARGIN = 32  # chat-template tokens around a user message, with room to spare


def check_fits(prompt_tokens: int, max_tokens: int, ctx: int, parallel: int) -> None:
    """Refuse settings where one slot (CTX / parallel tokens) cannot hold the conversation."""
    per_slot = ctx // parallel
    needed = prompt_tokens + max_tokens + TEMPLATE_MARGIN
    if needed > per_slot:
        raise SettingError(
            f"a slot holds CTX/parallel = {ctx}/{parallel} = {per_slot} tokens, but the prompt "
            f"needs {needed} ({prompt_tokens} + {max_tokens} generated + template); raise --ctx "
            "or lower --parallel or --prompt-tokens"
        )


@dataclass(frozen=True)
class SlotRunSpec:
    """One long prompt on a llama-server started for the experiment: its size, the server's
    --ctx-size, --parallel and --cache-ram, and whether the slot file is kept afterwards."""

    prompt_tokens: int = 2000
    ctx: int = 8192
    parallel: int = 2
    max_tokens: int = 8
    cache_ram_mib: int = 0  # 0 keeps the RAM prompt cache from faking a restore
    label: str = ""
    keep_file: bool = False

    def check(self) -> None:
        check_fits(self.prompt_tokens, self.max_tokens, self.ctx, self.parallel)


def server_plan(settings: Settings, binary: Path, *, role: str, ctx: int, parallel: int,
                slot_dir: Path, cache_ram_mib: int | None = None,
                accepted: frozenset[str] | None = None,
                chosen: facts.LlamaOptions | None = None) -> EnginePlan:
    """A llama-server plan on a free port with these settings, its flags checked; `chosen`
    carries the other options an experiment varies (KV type, prompt caching, log level)."""
    at = settings.model_copy(update={"ctx": ctx})
    opts = replace(chosen or facts.LlamaOptions(), port=free_port(), parallel=parallel,
                   role=role, slot_save_path=str(slot_dir), cache_ram_mib=cache_ram_mib)
    plan = facts.plan(at, binary, opts)
    facts.check_plan_flags(plan, accepted if accepted is not None
                           else facts.help_flags(binary))
    return plan


READY_S = 120.0  # llama-server loads a tiny GGUF in seconds; a real one in well under this


def server_fields(plan: EnginePlan, ctx: int, parallel: int,
                  cache_ram_mib: int | None) -> LlamaServerLine:
    """The server settings an experiment chose, for its notebook line."""
    k, v = facts.kv_types(plan)
    return LlamaServerLine(
        ctx=ctx, parallel=parallel, tokens_per_slot=ctx // parallel,
        cache_ram_mib=cache_ram_mib if cache_ram_mib is not None
        else facts.CACHE_RAM_DEFAULT_MIB,
        flash_attn=facts.flash_attn_mode(plan), kv_type_k=k, kv_type_v=v, argv=plan.argv())


async def prompt_of(client: LlamaClient, tokens: int, seed: int = 7) -> str:
    """Deterministic text that is `tokens` tokens long in this server's tokenizer."""
    lines = max(64, tokens // 4)
    ids = await client.tokenize(prose(lines, seed))
    while len(ids) < tokens:
        lines *= 2
        ids = await client.tokenize(prose(lines, seed))
    return await client.detokenize(ids[:tokens])
