"""onnxruntime's CPU execution provider: its class (provider.py), its kernels' tables (tables.py: in place, aliases,
prepacked weights, scratch; kernels.py: the float16 kernels it registers), the float16 Casts it inserts (float16.py)
and the function bodies it inlines (inline.py)."""
