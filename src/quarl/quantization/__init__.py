"""Quantizing a policy: :class:`~quarl.quantization.config.QuantConfig` (a precision label
parsed once onto a command's options), the precision registry
(:mod:`quarl.quantization.precisions`), ``quantize(policy, config) -> Policy``
(:mod:`quarl.quantization.api`) and the automatic int mode choice with its candidates and
cache. It sits above :mod:`quarl.policies`; the kernels it builds are :mod:`quarl.quant`'s."""
