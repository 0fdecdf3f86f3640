"""One screen per file: Runs, Run detail, Backlog, Compare."""
