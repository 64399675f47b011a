"""The three workloads of the comparison (passthrough, key-ordered processing, key-range
delivery), each a function the runner calls with its options and the progress callback."""
