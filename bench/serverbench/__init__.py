"""The TLS server benchmark (bench/bench_server.py, whose docstring says what it measures), in modules of one part
each: `launch` (the files' places, free ports, a server process for a `with`; the soak and bench_slow_clients.py
use it too), `clients` (wrk, or Python processes), `rounds` (the servers, started, then measured round after
round), `report` (the table, the ratios, the goals, the JSON). The no-op and stub servers are bench_server.py's
own hidden subcommands."""
