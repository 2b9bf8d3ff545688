"""Prompts to text-encoder states: the CLIP and T5 tokenizers, A1111's prompt weights and 75-token
chunks, and the encoding itself."""
