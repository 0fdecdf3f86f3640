"""Dumb widgets: each receives a slice of a snapshot through a reactive and draws it."""
