"""The model of a run, shared by every part of traceml.

Textual-free and torch-free. Each fact has one home here:

* :mod:`.records` — the JSONL record schema (encode, decode, validate);
* :mod:`.rundir` — the run directory: every path of a run, named and listed once;
* :mod:`.artifacts` — typed manifest, node outcome and summary structs;
* :mod:`.lease` — the launcher lease: a node launcher's heartbeat file, its length and its decoding;
* :mod:`.state` — ``RunStatus``, ``RankState``, ``BacklogState`` and the pure rules that decide them;
* :mod:`.atomic` — atomic side-file writes and whole-line appends.

Everything else imports from here; nothing here imports the daemon, the TUI,
the launcher or torch (an import-linter contract holds this).
"""
