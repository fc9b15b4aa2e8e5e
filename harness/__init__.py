"""Validation and benchmark harness for the RMSNorm kernels.

Data flows one way: cases -> impls -> validate -> timing -> records -> plot/report.
"""
