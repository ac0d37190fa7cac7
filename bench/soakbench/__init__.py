"""The soak and the two-replica burst (bench/soak.py, whose docstring says what they measure), in modules of one part
each: `procfs` (memory and CPU from /proc), `sim` (the simulator's process and its API), `pools` (the benchmark's
own pools and Pods), `reviews` (the mix of Pod shapes sent), `client` (a keep-alive TLS connection, the answers),
`metrics` (quantiles, the server's /metrics), `servers` (`gpupool serve` against the simulator), `prober` (watch
lag), `load` (the open-loop load, the Pods created), `run` and `report` (part 1, the soak), `burst` (part 2, two
replicas, one burst). Servers are started with bench/serverbench/'s `running`."""
