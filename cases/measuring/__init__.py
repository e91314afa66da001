"""Measuring the suite itself: its cost (bench), the envelope's tightness, and the kill matrices of
mutants and conforming variants."""
