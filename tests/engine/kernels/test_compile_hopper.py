"""PersonaPlex's kernels compile for the H200 (sm_90) with Triton's own compiler, here without a GPU:
types, loop-carried values and constexprs are checked as the GPU build will check them."""

from __future__ import annotations

import importlib.util
import os

import pytest

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter compiles nothing"),
    pytest.mark.slow,
]
STRIDES = ("stride_qb", "stride_qh", "stride_kb", "stride_kh", "stride_kc", "stride_vb", "stride_vh", "stride_vc",
           "stride_sb", "stride_sh", "stride_tb", "stride_th", "capacity", "context")


def compile_for_hopper(fn, signature: dict[str, str], constants: dict[str, object]) -> str:  # type: ignore[no-untyped-def]
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(fn=fn, signature={**signature, **{name: "constexpr" for name in constants}},
                       constexprs=constants)
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32))
    return str(kernel.asm["ptx"])


@pytest.mark.parametrize("float8", [True, False])
@pytest.mark.parametrize("splits", [1, 16])
def test_ring_attention_compiles(float8: bool, splits: int) -> None:
    from engine.kernels import ring_attention as ra

    ring = "*fp8e4nv" if float8 else "*bf16"
    signature = {"q_ptr": "*bf16", "k_ptr": ring, "v_ptr": ring, "ks_ptr": "*fp32", "vs_ptr": "*fp32",
                 "pos_ptr": "*i64", "part_ptr": "*fp32", **dict.fromkeys(STRIDES, "i32"), "sm_scale": "fp32"}
    ptx = compile_for_hopper(ra._split_kernel, signature, {"H": 32, "DH": 128, "SPLITS": splits, "BLOCK": ra.BLOCK_N,
                                                            "HAS_SCALE": float8, "DYNAMIC": True, "STATIC_BLOCKS": 0})
    assert ".target sm_90" in ptx
    compile_for_hopper(ra._combine_kernel, {"part_ptr": "*fp32", "out_ptr": "*bf16", "stride_ob": "i32",
                                            "stride_oh": "i32"}, {"H": 32, "DH": 128, "SPLITS": splits})


@pytest.mark.parametrize("vocabulary", [2048, 32000])
def test_token_draw_compiles(vocabulary: int) -> None:
    from engine.kernels import token_draw as td

    signature = {"logits_ptr": "*fp32", "kth_ptr": "*fp32", "temperature_ptr": "*fp32", "seed_ptr": "*i64",
                 "counter_ptr": "*i64", "out_ptr": "*i64", "stride": "i32", "stream": "i32"}
    assert ".target sm_90" in compile_for_hopper(td._draw_kernel, signature, {"V": vocabulary, "BLOCK": td.BLOCK})
