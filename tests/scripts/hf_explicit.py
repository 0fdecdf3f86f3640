"""The Hugging Face example with traceml's explicit callback added by the script itself.

Run from a folder holding a copy of examples/hf_trainer/train.py (imported from there); arguments are the example's.
"""

import sys

from train import build_trainer

from traceml_tui.integrations.hf import TraceMLCallback

build_trainer(sys.argv[1:], callbacks=[TraceMLCallback()]).train()
