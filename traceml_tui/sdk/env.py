"""Environment variables through which `traceml run` hands the run to its ranks.

The launcher sets these; the SDK reads them. Values never reach an artifact.
"""

RUN_DIR = "TRACEML_RUN_DIR"
RUN_NAME = "TRACEML_RUN_NAME"
NODE_RANK = "TRACEML_NODE_RANK"
NNODES = "TRACEML_NNODES"
NPROC_PER_NODE = "TRACEML_NPROC_PER_NODE"
TRACE_MAX_STEPS = "TRACEML_TRACE_MAX_STEPS"
VALIDATION_DIGEST = "TRACEML_VALIDATION_DIGEST"
#: Set by the user, not the launcher: ``0`` leaves plain ``torch.utils.data.DataLoader``s untimed.
TIME_DATALOADER = "TRACEML_TIME_DATALOADER"
#: Set by the user (or `traceml run --no-auto-attach`): ``0`` stops the bootstrap attaching trainer callbacks.
AUTO_ATTACH = "TRACEML_AUTO_ATTACH"
