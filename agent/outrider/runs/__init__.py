"""Run records: what `outrider run` keeps of each run (store.py: SQLite; recorder.py: KPIs per sweep, verdicts,
events), the HTML report (report.py) and the A/B comparison (compare.py)."""
