from outrider.cli import main

raise SystemExit(main())
