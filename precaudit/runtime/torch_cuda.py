"""PyTorch eager on CUDA: float16 and bfloat16 ops compute in their dtype, but reductions and the normalization
kernels accumulate in float32 (opmath), with eps a double.

Read in pytorch aten/src/ATen/native/cuda/layer_norm_kernel.cu (T_ACC = acc_type<T, true>: float for half and
bfloat16; mean and rstd in the accumulate type), aten/src/ATen/native/cuda/ReduceSumProdKernel.cu (sum of half with a
float accumulator) and the native_layer_norm schema (float eps, a C++ double). The torch frontend already lowers
layer_norm, group_norm, batch_norm and rms_norm with float32 statistics (stash_type 1): what this model adds is that
the output of a mean or a sum is still written in the input's dtype. No GPU here.
"""

from __future__ import annotations

from .base import Fact, Runtime

__all__ = ["TorchCuda"]

OPMATH_NORMS = Fact(
    "opmath-normalizations", "layer_norm, group_norm, batch_norm and rms_norm accumulate half and bfloat16 in float32 "
    "(acc_type), eps passed as a double", "pytorch aten/src/ATen/native/cuda/layer_norm_kernel.cu (T_ACC)")
REDUCTIONS_WRITE_INPUT_DTYPE = Fact(
    "reductions-write-input-dtype", "sum and mean accumulate half in float32 but write their result in half: a "
    "hand-written variance above 65504 is inf", "pytorch aten/src/ATen/native/cuda/ReduceSumProdKernel.cu "
    "(sum_kernel_impl<at::Half, float>)")
ELEMENTWISE = Fact(
    "elementwise-in-dtype", "elementwise ops (x * x, pow, exp) compute in the tensor's dtype",
    "pytorch aten/src/ATen/native/cuda/BinaryMulKernel.cu (opmath inside one op, rounded to the dtype on write)")


class TorchCuda(Runtime):
    name = "torch-cuda"
    title = "PyTorch eager (CUDA)"
    versions = ("2.13",)
    facts = (OPMATH_NORMS, REDUCTIONS_WRITE_INPUT_DTYPE, ELEMENTWISE)
    runs = ("torch",)
