import sys
from pathlib import Path

from outrider.dashboards import render_all

target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[3] / "dashboards"
target.mkdir(parents=True, exist_ok=True)
for name, text in render_all().items():
    (target / name).write_text(text)
print(f"wrote {len(render_all())} dashboards to {target}")
