"""Everything that belongs to one runtime or device, behind one small interface each.

- ort/: onnxruntime inference, one `ExecutionProvider` per provider (ort/base.py): what the provider does to the
  graph, its kernels' in-place and alias declarations, prepacked weights, kernel scratch, its arena. ort/cpu and
  ort/cuda hold each provider's code and rule tables; ort/ itself what they share.
- torch/: a PyTorch training step, one `DeviceModel` per device (torch/base.py): which kernel an op takes and what
  it saves there, the library buffers a step leaves behind, the allocator that turns live bytes into held bytes.

The generic passes take a target object and never test a provider's or a device's name.
"""
