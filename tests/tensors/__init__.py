"""Tests of straw.tensors (the tensor.v1 format, publishing, TensorRef, checked loads)."""
