"""Rows turned into things to read: renderers (table, Markdown, CSV, JSON), targets, figures."""
