"""A PyTorch training step, device-neutral: what is true on every device (the tensors each op keeps for backward,
gradients, optimizer states, the schedule of one step, the what-ifs), read from the exported forward graph. What a
device's kernels, libraries and allocator add is asked of its DeviceModel (onnxmem.targets.torch).

step.py holds the entry points (training_memory, training_warnings, micro_batch_dims); options.py the options;
model.py builds the step model; export.py undoes what an export folded or fused; schedule.py, simulate.py and
optimizers.py run the step; whatifs.py the recompute and checkpoint what-ifs; rules.py the per-operator tables."""
