"""What every other package stands on: errors, settings (the seed scripts' names), profiles,
paths, the hardware probe, secrets, sizes, the `Args` base of commands' arguments, the KV
connectors' table (`connectors`) and kvlab's own version and record schema.

This module is the package's surface: other packages import core's names from here, never
from its modules (`tests/unit/test_architecture.py`).
"""

from kvlab.core import connectors
from kvlab.core.args import Args
from kvlab.core.connectors import Connector, ConnectorName, StoreName
from kvlab.core.env_example import env_example_text
from kvlab.core.errors import (
    EXIT_ALL_FAILED,
    EXIT_CODES,
    EXIT_INTERRUPTED,
    EXIT_NOT_CONVERGED,
    EngineError,
    InputError,
    KvlabError,
    RefusedError,
    SettingError,
    UnreachableError,
)
from kvlab.core.files import write_private
from kvlab.core.hardware import (
    UNDETECTED,
    Hardware,
    HostMemory,
    cuda_architecture,
    detect_hardware,
    device_memory_bytes,
)
from kvlab.core.jsondata import JsonObject, dig, integer, integers, items, number, obj, text
from kvlab.core.paths import PROXY_METRICS_PREFIX
from kvlab.core.profiles import (
    CPU_PROFILE,
    GPU_PROFILES,
    TINY_DIR,
    embedded,
    for_a_server,
    shaped_paths,
    wants_gpu,
)
from kvlab.core.say import Say, quiet
from kvlab.core.secrets import (
    REDACTED,
    is_secret_name,
    redact_argv,
    redact_text,
    secret_flag_values,
    secret_in_list,
    secret_in_text,
)
from kvlab.core.settings import (
    LoadedSettings,
    ProfileValues,
    Settings,
    load_settings,
)
from kvlab.core.sizes import human_bytes, store_size, tree_bytes
from kvlab.core.tokenizer import load_tokenizer
from kvlab.core.urls import api_base, server_root
from kvlab.core.version import SCHEMA, VERSION

__all__ = [
    "CPU_PROFILE",
    "EXIT_ALL_FAILED",
    "EXIT_CODES",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_CONVERGED",
    "GPU_PROFILES",
    "PROXY_METRICS_PREFIX",
    "REDACTED",
    "SCHEMA",
    "TINY_DIR",
    "UNDETECTED",
    "VERSION",
    "Args",
    "Connector",
    "ConnectorName",
    "EngineError",
    "Hardware",
    "HostMemory",
    "InputError",
    "JsonObject",
    "KvlabError",
    "LoadedSettings",
    "ProfileValues",
    "RefusedError",
    "Say",
    "SettingError",
    "Settings",
    "StoreName",
    "UnreachableError",
    "api_base",
    "connectors",
    "cuda_architecture",
    "detect_hardware",
    "device_memory_bytes",
    "dig",
    "embedded",
    "env_example_text",
    "for_a_server",
    "human_bytes",
    "integer",
    "integers",
    "is_secret_name",
    "items",
    "load_settings",
    "load_tokenizer",
    "number",
    "obj",
    "quiet",
    "redact_argv",
    "redact_text",
    "secret_flag_values",
    "secret_in_list",
    "secret_in_text",
    "server_root",
    "shaped_paths",
    "store_size",
    "text",
    "tree_bytes",
    "wants_gpu",
    "write_private",
]
