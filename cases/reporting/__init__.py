"""Reporting: a run's verdicts as terminal text, JSON and HTML, and the comparison of two reports."""
