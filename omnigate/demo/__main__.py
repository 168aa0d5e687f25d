"""`python -m omnigate.demo …` is `omnigate demo …`."""

import sys

from omnigate.demo.run import main

raise SystemExit(main(sys.argv[1:]))
