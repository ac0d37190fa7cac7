"""`python -m webhook` is the same as the `gpupool` command."""

from webhook.commands.cli import main

raise SystemExit(main())
