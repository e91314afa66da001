"""The rule: what a case is, the one comparison core, the one acceptance rule and what a failure of it
carries (acceptance, compare, attribution, failure), with what the search and the diagnosis share (the
coverage bins, input transforms, the ledger of known failures). It imports neither room above it."""
