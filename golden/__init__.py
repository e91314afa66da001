"""pfa-verify's golden: FP8 paged attention (GLM-4.5, Ascend 950) and AT-12 in plain torch, on the CPU.

It is the spec (docs/spec.md) in code, one module per stage:

- ``codec``: E4M3 encode/decode (``Fp8Codec``, the spec's E4M3FN and the PyPTO calculator's variant)
- ``quant``: per-token / per-channel quantization (SPEC §3)
- ``paging``: block tables and paged <-> contiguous layouts (SPEC §2.2)
- ``matmul``: exact FP32 accumulation of E4M3 products
- ``softmax_state``: local softmax and the online (m, l, O) update (SPEC §2.3)
- ``attention``: the stages of SPEC §2 and the vectorized golden; ``attention_loop``: the plain loop
- ``model``: the freedoms of a conforming kernel (SPEC §4.1); ``envelope/`` (stages, builder, fold): the
  acceptance envelope that holds every conforming result (SPEC §4.2); ``intervals``: float32 outward rounding
  and ulps; ``sum_bounds``: any-order float32 sum error bounds (both read by the envelope, AT-12's bounds and
  the laws)
- ``at12``: QK^T MatMul Scale (SPEC §6)
- ``validate``: argument checks shared with the kernel wrappers; ``inputs``: configs and bundles
"""
from .at12 import qk_matmul_scale, qk_matmul_scale_loop
from .attention import PagedAttentionCall, checked_call, paged_attention_envelope, paged_attention_fp8
from .attention_loop import paged_attention_fp8_loop
from .codec import PYPTO_CALCULATOR_CODEC, SPEC_CODEC, Fp8Codec, get_codec
from .envelope import AttentionEnvelope
from .inputs import DISTRIBUTIONS, GARBAGE, InputBundle, PagedAttentionConfig, check_size, make_inputs, memory_limit
from .model import DETERMINISTIC_MODEL, EXACT_MODEL, SPEC_MODEL, ConformanceModel
from .paging import contiguous_to_paged, gen_block_table, paged_to_contiguous
from .quant import FP8_MAX, quantize_per_channel, quantize_per_token
from .softmax_state import OnlineSoftmaxState

__all__ = [
    "paged_attention_fp8", "paged_attention_fp8_loop", "qk_matmul_scale", "qk_matmul_scale_loop",
    "paged_attention_envelope", "checked_call", "PagedAttentionCall", "AttentionEnvelope", "ConformanceModel", "SPEC_MODEL", "DETERMINISTIC_MODEL", "EXACT_MODEL",
    "Fp8Codec", "SPEC_CODEC", "PYPTO_CALCULATOR_CODEC", "get_codec",
    "quantize_per_token", "quantize_per_channel", "FP8_MAX",
    "gen_block_table", "contiguous_to_paged", "paged_to_contiguous",
    "OnlineSoftmaxState", "PagedAttentionConfig", "InputBundle", "make_inputs", "DISTRIBUTIONS", "GARBAGE",
    "check_size", "memory_limit",
]
