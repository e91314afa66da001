"""Running cases: the worker pool (local processes or Ray), ``pfa-verify run``, shrinking and the search."""
