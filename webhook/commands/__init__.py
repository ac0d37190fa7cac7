"""The `gpupool` command and its subcommands (serve, explain, inventory, certs): the only place that
reads flags and environment variables and turns errors into `gpupool <command>: error: ...`."""
