"""`python -m omnigate …` is the `omnigate` console script."""

from omnigate.cli import main

raise SystemExit(main())
