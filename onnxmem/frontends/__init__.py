"""Ways into onnxmem from a model that is no ONNX file yet: a Hugging Face config (hf, layers)."""
