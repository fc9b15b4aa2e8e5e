"""Validation and benchmark harness for the RMSNorm kernels.

Data flows one way: cases -> ops (inputs, reference, bytes model, impls) -> validate ->
plan -> measure (timing) -> records -> analysis -> plot/report; bench and sweep are the
command lines that drive it.
"""
