"""Shapes: dims.py (the model's symbolic input dims and their binding), infer.py (ONNX's inference with the
project's own rules, rules.py, for operators ONNX does not type), values.py (shape values computed from the graph),
sizing.py (bind and infer: every tensor's dtype and shape at the bound dims)."""
