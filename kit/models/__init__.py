"""Encoders and their checkpoints: any Hugging Face encoder family by name (backbones), classic
BERT folders (checkpoints), tiny test encoders (zoo) and the one checkpoint-folder layout every
trained kit model is saved in and loaded from (model_io).
Imports kit.config, kit.data, the method registry's table and kit.io only."""
