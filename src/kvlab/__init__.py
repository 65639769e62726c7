"""kvlab: measure and prove KV-cache reuse on your own machines."""

from kvlab.core import SCHEMA, VERSION

__version__ = VERSION
__all__ = ["SCHEMA", "__version__"]
