from gatekeeper import drop_working_folder

drop_working_folder()  # before the CLI imports numpy, yaml, scipy: see its docstring

from gatekeeper.cli import main  # noqa: E402 - after the working folder is off sys.path

raise SystemExit(main())
