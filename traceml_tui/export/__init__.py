"""Exports of a run directory to tracking dashboards (derived indexes; the run directory stays authoritative)."""
