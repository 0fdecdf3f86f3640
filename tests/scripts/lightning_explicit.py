"""The Lightning example with traceml's explicit callback added by the script itself.

Run from a folder holding a copy of examples/lightning/train.py (imported from there); arguments are the example's.
"""

import sys

from train import build

from traceml_tui.integrations.lightning import TraceMLCallback

trainer, model, train, val = build(sys.argv[1:], callbacks=[TraceMLCallback()])
trainer.fit(model, train, val)
