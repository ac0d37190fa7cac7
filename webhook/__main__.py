"""`python -m webhook` is the same as the `gpupool` command."""

from webhook.cli import main

raise SystemExit(main())
