"""The ggml runtime: the ctypes library, devices, graph contexts and running a built graph.
Imports nothing of sdkit_ggml outside this package."""
