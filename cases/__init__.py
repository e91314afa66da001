"""Cases: the catalog (SPEC §5 and edge cases), captured regressions, the ledger and the CLI."""
