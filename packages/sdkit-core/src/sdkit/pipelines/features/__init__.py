"""What a pipeline adds to txt2img, each declared as a ``Feature`` (``feature.py``): ControlNet,
inpainting, the hires fix, and LoRAs, embeddings and a VAE file over a checkpoint's weights."""
