"""The runs as a frame, what every other room of kit.results reads: collect (run folders -> one
row per run, through kit.runs), discover (which profiles have finished runs), stats (the
significance tests), no_runs (`NoRuns`, the one-line 'nothing to show' every room raises, and
the command that makes the runs). Imports no other room."""
