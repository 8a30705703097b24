"""A checkpoint on disk, read without loading it: the model config and the safetensors headers."""
