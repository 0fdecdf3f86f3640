"""The ingest daemon: run folders tailed into a local SQLite index, exactly once (docs/daemon.md).

Rooms that follow the data (docs/daemon.md, "Modules"); each returns what it found, none calls back:

* ``watcher`` — inotify hints: sets of paths that changed;
* ``plan`` — pass planning: the known runs and streams, the hints waiting, the timed poll's rounds, the
  gap between passes; returns targets;
* ``stream`` — every byte rule of one file (descriptors, identity, generation, tail check, rotation,
  complete lines, the line limit, NUL hold-back, side-file bytes); returns cuts and cursors, no SQL;
* ``decode`` (with ``blockcheck``) — blocks of complete lines → records and step rows (pure);
* ``cold`` — a large backlog: newest first, its progress, the decode process;
* ``store`` — all of the writer's SQL for what was read (rows, side files, errors, cursors, the end of
  a pass); ``aggregates`` and ``live`` — rolling windows, rollups and series; ``sidefiles``, ``leases``,
  ``refusals`` — side-file facts, launcher leases, refused files;
* ``index``, ``lock``, ``locations`` — the schema and its upgrades, the single writer, the index's place;
* ``service`` — ``Ingester``: lifecycle, the serve loop, one transaction per pass; it decodes what the
  stream returns and routes it through the store;
* ``writer_health`` — who writes the index and the time states are decided at;
* ``reader`` — the read side's entrance (``status_cli``, ``metrics`` and the TUI read through it): the
  connection, versions, runs and views; its rooms hold the only reading SQL, split by what they read:
  ``read_runs`` (each run's word decided), ``read_series``, ``read_backlog``, ``read_events``, ``read_files``
  (reached as ``reader.series``, ``reader.backlog``, ``reader.events``, ``reader.files``), ``read_query``.

The daemon imports ``traceml_tui.core`` and nothing else of traceml.
"""
