"""Deployment: a policy exported as an ONNX model with its JSON sidecar
(:mod:`quarl.export.artifact`) and its latency, size and memory per precision on this machine
(:mod:`quarl.export.bench`)."""
