"""Image and latent maths with no model in it: init images, output images and their PNG
parameters, inpainting masks, ControlNet preprocessors, the hires fix's sizes and latent upscale."""
