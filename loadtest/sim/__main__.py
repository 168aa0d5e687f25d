from loadtest.sim.cli import main

raise SystemExit(main())
