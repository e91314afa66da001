"""Properties of the FP8 paged-attention kernel: strategies, laws, the comparison core, attribution."""
