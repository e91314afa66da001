"""The search: strategies, the laws and their bounds, each law's examples, directed generation. A law raises
a properties.rule.failure.LawFailure and never diagnoses (the diagnosis is applied in cases/)."""
