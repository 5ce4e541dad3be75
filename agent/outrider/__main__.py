"""`python -m outrider`: the `outrider` command (outrider.cli), for where the console script is not on PATH."""

from outrider.cli import main

raise SystemExit(main())
