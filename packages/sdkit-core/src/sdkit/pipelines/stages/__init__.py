"""The stages every pipeline shares: components compiled from their sources, running them
(execution), the denoising loop, the VAE (whole or tiled), graph pruning and the noise stream."""
