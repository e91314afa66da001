"""The diagnosis: which defect explains a failure the rule decided (fault models, scoring, probes,
readouts, ablations, separation). Never a verdict; it imports the rule, never the search."""
