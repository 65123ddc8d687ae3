"""Runtimes that execute a policy network at some precision, behind one interface:
an *engine* is a callable from a float32 numpy batch to a float32 numpy batch.

- :mod:`.torch_backend`: PyTorch eager in fp32 / fp16 / bf16.
- :mod:`.onnxruntime`: ONNX Runtime fp32, and real int8 (integer matmuls / convs).
- :mod:`.reference`: PyTorch modules that simulate what the int8 runtime computes; every
  real backend is tested against it.
"""
