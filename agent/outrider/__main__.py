"""`python -m outrider`: the `outrider` command (outrider.commands.cli), for where the console script is not on PATH."""

from outrider.commands.cli import main

raise SystemExit(main())
