"""The simulator as a fleet: N engines behind a router, in one process (live or replay)."""
