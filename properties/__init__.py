"""Properties of the FP8 paged-attention kernel, three rooms: ``rule`` (the comparison core, the acceptance
rule, a law's failure as data), ``search`` (strategies, laws) and ``diagnosis`` (which defect explains a
failure); search and diagnosis each import the rule, never each other."""
