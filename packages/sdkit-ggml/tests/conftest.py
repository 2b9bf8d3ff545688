"""sdkit-ggml tests use sdkit.testing's fixtures (taef2, sd_graphs, one_node...)."""
