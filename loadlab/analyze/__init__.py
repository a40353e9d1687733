"""Analysis of a run folder. Reads only the run folder; never imports Locust or the simulator."""
