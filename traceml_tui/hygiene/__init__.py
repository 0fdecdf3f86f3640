"""Training-run hygiene (seed 004): the ``hygiene:`` config, checkpoint publishing,
the validation backlog and its drainer, early stopping and the one canonical
learning curve. Nothing here imports torch or matplotlib at import time.
"""

from traceml_tui.hygiene.config import HygieneConfigError, parse_hygiene, validation_config_digest
from traceml_tui.hygiene.early_stopping import EarlyStopping

__all__ = ["EarlyStopping", "HygieneConfigError", "parse_hygiene", "validation_config_digest"]
