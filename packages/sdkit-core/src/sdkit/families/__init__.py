"""Model families: shipped architecture graphs and the CLIP vocabulary for single-file checkpoints."""
