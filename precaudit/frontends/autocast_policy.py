"""torch.autocast's policies by op, as torch 2.13 registers them, and the ops the installed torch registers.

How autocast decides, and how precaudit reads it from the installed torch: frontends/autocast.py. The tables here
are what tests/test_autocast.py checks a torch upgrade against; the replay reads each op's policy from its
kernel, and falls back on the table only for an op whose kernel it cannot replay.
"""

from __future__ import annotations

import torch

__all__ = ["POLICY", "POLICY_TORCH", "policy_of", "registered_ops"]

_KEYS = {"cuda": "AutocastCUDA", "cpu": "AutocastCPU"}

# torch 2.13's autocast lists by policy (aten/src/ATen/autocast_mode.cpp, as the dispatcher registers them);
# tests/test_autocast.py compares them with the installed torch.
POLICY_TORCH = "2.13"
POLICY: dict[str, dict[str, tuple[str, ...]]] = {
    "cuda": {
        "lower_precision_fp": (
            "_convolution", "_convolution.deprecated", "_scaled_dot_product_flash_attention",
            "_thnn_fused_gru_cell", "_thnn_fused_lstm_cell", "addbmm", "addmm", "addmv", "addr", "baddbmm", "bmm",
            "chain_matmul", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d.input",
            "conv_transpose3d.input", "convolution", "cudnn_convolution", "cudnn_convolution_transpose", "einsum",
            "gru_cell", "linalg_multi_dot", "linalg_vecdot", "linear", "lstm_cell", "matmul", "mm", "mv", "prelu",
            "rnn_relu_cell", "rnn_tanh_cell", "scaled_dot_product_attention"),
        "fp32": (
            "_upsample_bicubic2d_aa", "_upsample_bilinear2d_aa", "_upsample_nearest_exact1d",
            "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "acos", "asin", "binary_cross_entropy_with_logits",
            "cdist", "cosh", "cosine_embedding_loss", "cosine_similarity", "dist", "erfinv", "exp", "expm1",
            "frobenius_norm.dim", "group_norm", "hinge_embedding_loss", "huber_loss", "kl_div", "l1_loss", "layer_norm",
            "log", "log10", "log1p", "log2", "logsumexp", "margin_ranking_loss", "mse_loss", "multi_margin_loss",
            "multilabel_margin_loss", "native_layer_norm", "nll_loss", "nll_loss2d", "nuclear_norm", "nuclear_norm.dim",
            "pdist", "poisson_nll_loss", "pow.Scalar", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "reciprocal",
            "renorm", "rms_norm", "rsqrt", "sinh", "smooth_l1_loss", "soft_margin_loss", "softplus", "tan",
            "triplet_margin_loss", "upsample_bicubic2d", "upsample_bilinear2d", "upsample_linear1d",
            "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "upsample_trilinear3d"),
        "fp32_set_opt_dtype": (
            "cumprod", "cumsum", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "linalg_vector_norm",
            "log_softmax.int", "prod", "prod.dim_int", "softmax.int", "sum", "sum.dim_IntList"),
        "fp32_append_dtype": ("norm.Scalar", "norm.ScalarOpt_dim"),
        "promote": ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler", "index_put",
                    "scatter_add", "tensordot", "vdot"),
        "banned": ("binary_cross_entropy",),
    },
    "cpu": {
        "lower_precision_fp": (
            "_addmm_activation", "_convolution.deprecated", "_native_multi_head_attention", "addbmm", "addmm",
            "baddbmm", "bmm", "conv1d", "conv1d.padding", "conv2d", "conv2d.padding", "conv3d", "conv3d.padding",
            "conv_tbc", "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "linalg_vecdot",
            "linear", "matmul", "mkldnn_rnn_layer", "mm", "prelu", "scaled_dot_product_attention"),
        "fp32": (
            "_grid_sampler_2d_cpu_fallback", "_lu_with_info", "adaptive_avg_pool3d", "adaptive_max_pool3d",
            "avg_pool3d", "binary_cross_entropy", "binary_cross_entropy_with_logits", "cdist", "cholesky",
            "cholesky_inverse", "cholesky_solve", "cosine_embedding_loss", "cross_entropy_loss", "ctc_loss.IntList",
            "ctc_loss.Tensor", "fake_quantize_per_tensor_affine", "fft_fft", "fft_fft2", "fft_fftn", "fft_hfft",
            "fft_ifft", "fft_ifft2", "fft_ifftn", "fft_ihfft", "fft_irfft", "fft_irfft2", "fft_irfftn", "fft_rfft",
            "fft_rfft2", "fft_rfftn", "fractional_max_pool2d", "fractional_max_pool3d", "geqrf", "grid_sampler",
            "grid_sampler_2d", "grid_sampler_3d", "hinge_embedding_loss", "huber_loss", "inverse", "kl_div", "l1_loss",
            "linalg_cholesky", "linalg_cholesky_ex", "linalg_cond", "linalg_cond.p_str", "linalg_eig", "linalg_eigh",
            "linalg_eigvals", "linalg_eigvalsh", "linalg_householder_product", "linalg_inv", "linalg_inv_ex",
            "linalg_lstsq", "linalg_matrix_rank", "linalg_matrix_rank.atol_rtol_float",
            "linalg_matrix_rank.atol_rtol_tensor", "linalg_matrix_rank.tol_tensor", "linalg_qr", "linalg_solve",
            "linalg_svd", "linalg_svdvals", "linalg_tensorinv", "linalg_tensorsolve", "lu_solve",
            "margin_ranking_loss", "max_pool3d", "max_unpool2d", "max_unpool3d", "mse_loss", "multi_margin_loss",
            "multilabel_margin_loss", "multilabel_margin_loss_forward", "nanquantile", "nanquantile.scalar", "nll_loss",
            "nll_loss2d", "orgqr", "ormqr", "pinverse", "poisson_nll_loss", "polar", "qr", "quantile",
            "quantile.scalar", "reflection_pad1d", "reflection_pad2d", "replication_pad1d", "replication_pad2d",
            "replication_pad3d", "smooth_l1_loss", "soft_margin_loss", "stft", "stft.center", "svd", "trace",
            "triangular_solve", "triplet_margin_loss", "view_as_complex"),
        "fp32_set_opt_dtype": ("prod", "prod.dim_int"),
        "promote": ("cat", "index_copy", "stack"),
    },
}


def registered_ops(device: str) -> frozenset[str]:
    """The ops torch's autocast handles on this device, as the dispatcher lists them: 'aten::mm', ..."""
    return frozenset(torch._C._dispatch_get_registrations_for_dispatch_key(_KEYS[device]))


def policy_of(device: str, op: str) -> str | None:
    """The tabled policy of an op ('pow.Tensor_Scalar'), or None for an op autocast leaves alone."""
    return next((policy for policy, ops in POLICY[device].items() if op in ops), None)
