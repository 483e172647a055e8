"""The measurement harness: points (the row key), sweeps (suites as data), the runner (validate, then
interleaved rounds), measure (one backend's turn), stats, the load meter and the results store."""
