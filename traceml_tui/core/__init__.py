"""The model of a run, shared by every part of traceml.

Textual-free and torch-free. Each fact has one home here:

* :mod:`.records` — the JSONL record schema (encode, decode, validate);
* :mod:`.rundir` — the run directory: every path of a run, named and listed once;
* :mod:`.artifacts` — typed manifest (its guard contract and hygiene block too), node outcome and summary structs;
* :mod:`.lease` — the launcher lease: a node launcher's heartbeat file, its length and its decoding;
* :mod:`.state` — ``RunStatus``, ``RankState``, ``BacklogState`` and the pure rules that decide them;
* :mod:`.jsonl` — "complete lines only": the lines and records of a JSONL file (whole, chunked or a tail);
* :mod:`.hygiene_files` — typed, bounded backlog files, ``early_stopping.json`` and the export cursor;
* :mod:`.backlog` — one backlog entry assembled from its files, "outstanding", a run's validation settings;
* :mod:`.freshness` — eval freshness: the newest evaluated step and the lag behind training;
* :mod:`.stopping` — the early-stopping policy's own state as every surface shows it;
* :mod:`.atomic` — atomic side-file writes and whole-line appends.
* :mod:`.lifeline` — a child dies with its parent (the parent-death signal), for every floor that starts one.

docs/contracts.md ("Where each fact lives") lists which surfaces call which.
Everything else imports from here; nothing here imports the daemon, the TUI,
the launcher or torch (an import-linter contract holds this).
"""
