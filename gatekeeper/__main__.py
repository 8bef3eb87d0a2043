from gatekeeper.cli import main

raise SystemExit(main())
