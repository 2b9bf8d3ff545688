"""From a path to a pipeline: ``load_pipeline`` and the registered loaders (diffusers ONNX folders,
single-file checkpoints), the folder layout, and a registered family as a pipeline."""
