"""Why a job is slow: signals over a sliding window of sweeps (signals.py), a verdict with its evidence and a
recommendation (bottleneck.py), exported by the `diagnosis` collector."""
