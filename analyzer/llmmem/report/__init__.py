"""Renderers of a budget: text (rich) and JSON."""
