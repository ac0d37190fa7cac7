"""One Pod's admission: the Pod read once into a checked view, its gpupool.io/ annotations into a
request, the decision, the quota checks, the patch and the verdict (core.evaluate, core.Admitter).
Pure: it reads the pools through webhook.pools and imports no web framework or Kubernetes client."""
