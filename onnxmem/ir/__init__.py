"""The model as the passes read it: load.py (the file without its weight data, checked as it is read), modelcheck.py
(the structural checks and their messages), graph.py (the one central graph of ops and tensors, with typed facts),
dtypes.py and tensor_types.py (element sizes and the (dtype, shape) pairs inference gives)."""
