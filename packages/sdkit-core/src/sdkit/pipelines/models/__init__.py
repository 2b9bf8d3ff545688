"""The pipeline classes, one per model family (SD 1.x/2.x, SDXL, SD3, Flux, Chroma), on the
generation template of ``base.Pipeline``, with the request classes of the families that need one."""
