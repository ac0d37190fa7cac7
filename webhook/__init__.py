"""gpupool: a mutating admission webhook that places GPU Pods on the best-fitting free GPUs."""

__version__ = "0.1.0"
