"""mlx-lm (Apple's MLX; Linux CPU wheels here): its server and its prompt-cache file.

`adapter.py` is mlx-lm as kvlab's `Engine`; `server.py` its server's plan; `cache_file.py`
the prompt-cache file, the offload lab's fourth tier on the Apple track. Only modules named for
mlx import this package outside `engines/` (`experiments/mlx_cache.py`).
"""

from kvlab.engines.mlx.cache_file import (
    DIGEST_KEY,
    ShimAnswer,
    check_file,
    manifest,
    partial_of,
    require_mlx,
    run_step,
)
from kvlab.engines.mlx.server import server_plan

__all__ = ["DIGEST_KEY", "ShimAnswer", "check_file", "manifest", "partial_of", "require_mlx",
           "run_step", "server_plan"]
