"""The Hugging Face example with traceml's explicit callback added by the script itself.

Run from a folder holding a copy of examples/hf_trainer/train.py (imported from there); arguments are the example's.
The example's ``main`` trains and then frees the DDP model before the process group goes, as the automatic run
does: without that a rank now and then aborts in gloo's teardown at exit (docs/trainers.md, "Limits").
"""

import sys

from train import main

from traceml_tui.integrations.hf import TraceMLCallback

main(sys.argv[1:], callbacks=[TraceMLCallback()])
