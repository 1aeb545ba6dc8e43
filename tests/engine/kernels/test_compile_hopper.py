"""The kernels compile for the H200 (sm_90) with Triton's own compiler, here without a GPU:
types, loop-carried values and constexprs are checked as the GPU build will check them (the
interpreter lets through, for one, a constexpr reassigned in a loop)."""

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


def compile_for_hopper(fn, signature: dict[str, str], constants: dict[str, object],  # type: ignore[no-untyped-def]
                       num_warps: int = 4, num_stages: int = 3, aligned: tuple[str, ...] = ()) -> str:
    """`aligned`: arguments the launch finds divisible by 16, as Triton's JIT specialises them (a
    torch tensor's pointer, a stride of 2,048): the vectorised and asynchronous loads need them."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(fn=fn, signature={**signature, **{name: "constexpr" for name in constants}},
                       constexprs=constants,
                       attrs={(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned})
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": num_warps, "num_stages": num_stages})
    return str(kernel.asm["ptx"])


CHUNK_REPORTS = {"keys_ptr": "*i64", "max_ptr": "*fp32", "share_ptr": "*fp64", "bad_ptr": "*i32"}
ROW_SETTINGS = {"temperature_ptr": "*fp32", "top_k_ptr": "*i64", "top_p_ptr": "*fp32", "seed_ptr": "*i64",
                "counter_ptr": "*i64"}


def test_sampler_kernels_compile_at_full_width() -> None:
    from engine.kernels import sampler, top_keys

    chunks = {"logits_ptr": "*fp32", "stride_row": "i32", "offset": "i32", "temperature_ptr": "*fp32",
              "second_temperature": "fp32", **CHUNK_REPORTS}
    compile_for_hopper(top_keys._top_chunks_kernel, chunks, {"N": 4096, "SPAN": 4096, "CHUNK_": 256, "CHUNKS": 16,
                                                             "K": 32, "TWO": True}, num_warps=2)
    code = {**ROW_SETTINGS, **CHUNK_REPORTS, "finite_ptr": "*i1", "out_ptr": "*i64", "stream": "i32",
            "max_top_k": "i32"}
    compile_for_hopper(sampler._sample_code_kernel, code, {"SPAN": 4096, "HAS_FINITE": True, "LOG_CHUNKS": 4,
                                                           "LOG_K": 5}, num_warps=2)
    main = {"logits_ptr": "*fp32", "stride_row": "i32", "ids_ptr": "*i64", "window_ptr": "*i64", **ROW_SETTINGS,
            **CHUNK_REPORTS, "finite_ptr": "*i1", "out_ptr": "*i64", "ras_temperature": "fp32", "ras_top_k": "i32",
            "ras_top_p": "fp32", "semantic_start": "i32", "semantic_end": "i32"}
    compile_for_hopper(sampler._sample_main_kernel, main, {"N": 4097, "SPAN": 4096, "WINDOW": 16, "HAS_FINITE": True,
                                                           "LOG_CHUNKS": 4, "LOG_K": 5}, num_warps=16)


def test_routing_and_deltanet_kernels_compile_at_full_size() -> None:
    from engine.kernels import deltanet_step, moe_routing

    routing = {"logits_ptr": "*bf16", "stride_row": "i32", "experts_ptr": "*i64", "weights_ptr": "*fp32"}
    compile_for_hopper(moe_routing._route_kernel, routing, {"E": 256, "SPAN": 256, "K": 8, "SLOTS": 8}, num_warps=1)
    state = {"mixed_ptr": "*bf16", "b_ptr": "*bf16", "a_ptr": "*bf16", "stride_mixed": "i32", "stride_b": "i32",
             "stride_a": "i32", "conv_state_ptr": "*bf16", "conv_weight_ptr": "*bf16", "a_log_ptr": "*fp32",
             "dt_bias_ptr": "*fp32", "state_ptr": "*fp32", "positions_ptr": "*i64", "slots_ptr": "*i64",
             "o_ptr": "*fp32"}
    compile_for_hopper(deltanet_step._deltanet_state_kernel, state, {"HK": 16, "REPEAT": 2, "DK": 128, "DV": 128,
                                                                     "BV": 32, "KERNEL": 4, "TAPS": 4})
    out = {"o_ptr": "*fp32", "z_ptr": "*bf16", "stride_z": "i32", "mixed_ptr": "*bf16", "stride_mixed": "i32",
           "conv_state_ptr": "*bf16", "norm_weight_ptr": "*bf16", "positions_ptr": "*i64", "slots_ptr": "*i64",
           "out_ptr": "*bf16", "norm_eps": "fp32"}
    compile_for_hopper(deltanet_step._deltanet_out_kernel, out, {"HV": 32, "DV": 128, "C": 8192, "CH": 256,
                                                                 "CH_SPAN": 256, "KERNEL": 4, "TAPS": 4})


@pytest.mark.parametrize("float8", [True, False])
@pytest.mark.parametrize("splits", [1, 16])
def test_ring_attention_compiles(float8: bool, splits: int) -> None:
    from engine.kernels import ring_attention as ra

    ring = "*fp8e4nv" if float8 else "*bf16"
    signature = {"q_ptr": "*bf16", "k_ptr": ring, "v_ptr": ring, "ks_ptr": "*fp32", "vs_ptr": "*fp32",
                 "pos_ptr": "*i64", "active_ptr": "*i1", "part_ptr": "*fp32", "used_ptr": "*i32",
                 **dict.fromkeys(STRIDES, "i32"), "sm_scale": "fp32"}
    ptx = compile_for_hopper(ra._split_kernel, signature, {"H": 32, "DH": 128, "SPLITS": splits, "BLOCK": ra.BLOCK_N,
                                                            "HAS_SCALE": float8, "DYNAMIC": True, "STATIC_BLOCKS": 0,
                                                            "DOTS": float8, "HAS_ACTIVE": True,
                                                            "SPLIT_SLOTS": ra.SPLIT_SLOTS})
    assert ".target sm_90" in ptx
    if float8:  # the tensor cores' form: its dots are Hopper's (wgmma) or Ampere's (mma) instructions
        assert "wgmma" in ptx or "mma.sync" in ptx
    compile_for_hopper(ra._combine_kernel, {"part_ptr": "*fp32", "used_ptr": "*i32", "out_ptr": "*bf16",
                                            "stride_ob": "i32", "stride_oh": "i32"},
                       {"H": 32, "DH": 128, "SPLITS": splits})


def test_cache_attention_compiles() -> None:
    from engine.kernels import cache_attention as ca

    signature = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "slot_ptr": "*i64", "pos_ptr": "*i64",
                 "part_ptr": "*fp32", "used_ptr": "*i32", **dict.fromkeys(
                     ("stride_qb", "stride_qh", "stride_ks", "stride_kr", "stride_kh", "stride_vs", "stride_vr",
                      "stride_vh"), "i32"), "sm_scale": "fp32"}
    ptx = compile_for_hopper(ca._split_kernel, signature, {"H": 16, "GROUP": 8, "ROWS": 16, "DH": 256, "SPLITS": 16,
                                                            "BLOCK": ca.BLOCK_N, "IEEE": False, "DYNAMIC": True,
                                                            "STATIC_BLOCKS": 0, "SPLIT_ROWS": ca.SPLIT_ROWS})
    assert ".target sm_90" in ptx and ("wgmma" in ptx or "mma.sync" in ptx)


@pytest.mark.parametrize("vocabulary", [2048, 32000])
def test_token_draw_compiles(vocabulary: int) -> None:
    from engine.kernels import token_draw as td

    signature = {"logits_ptr": "*fp32", "kth_ptr": "*fp32", "temperature_ptr": "*fp32", "seed_ptr": "*i64",
                 "counter_ptr": "*i64", "out_ptr": "*i64", "stride": "i32", "stream": "i32"}
    assert ".target sm_90" in compile_for_hopper(td._draw_kernel, signature, {"V": vocabulary, "BLOCK": td.BLOCK})
    if vocabulary <= td.ROW_BLOCK:  # an audio codebook: drawn from registers, its k-th largest found in the kernel
        row = {**signature, "top_k_ptr": "*i64"}
        del row["kth_ptr"]
        assert ".target sm_90" in compile_for_hopper(td._draw_row_kernel, row, {"V": vocabulary, "BLOCK": 2048})


@pytest.mark.parametrize("form", ["add", "plain", "gated"])
def test_norm_kernel_compiles(form: str) -> None:
    from engine.kernels import norm

    x = "*fp32" if form == "gated" else "*bf16"  # the gated norm reads the delta rule's float32 output
    signature = {"x_ptr": x, "update_ptr": "*bf16", "weight_ptr": "*bf16", "normed_ptr": "*bf16",
                 "summed_ptr": "*bf16", "stride_x": "i32", "stride_update": "i32", "eps": "fp32"}
    compile_for_hopper(norm._add_rms_norm_kernel, signature,
                       {"D": 2048 if form != "gated" else 128, "BLOCK": 2048 if form != "gated" else 128,
                        "HAS_UPDATE": form == "add", "ZERO_CENTRED": form != "gated", "GATED": form == "gated"},
                       num_warps=8)


@pytest.mark.parametrize("interleaved", [True, False])
def test_rotated_norm_kernel_compiles(interleaved: bool) -> None:
    from engine.kernels import norm

    signature = {"x_ptr": "*bf16", "weight_ptr": "*bf16", "rope_ptr": "*fp32", "out_ptr": "*bf16",
                 "stride_row": "i32", "stride_head": "i32", "eps": "fp32"}
    compile_for_hopper(norm._rotated_rms_norm_kernel, signature,
                       {"H": 16, "DH": 256, "HALF": 32, "BLOCK": 256, "INTERLEAVED": interleaved}, num_warps=2)


@pytest.mark.parametrize("padded", [True, False])
def test_deltanet_inputs_kernel_compiles(padded: bool) -> None:
    from engine.kernels import deltanet_inputs

    signature = {"mixed_ptr": "*bf16", "b_ptr": "*bf16", "a_ptr": "*bf16", "stride_mixed": "i32", "stride_b": "i32",
                 "stride_a": "i32", "a_log_ptr": "*fp32", "dt_bias_ptr": "*fp32", "valid_ptr": "*i64",
                 "q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "g_ptr": "*fp32", "beta_ptr": "*fp32",
                 "T": "i32", "scale": "fp32"}
    compile_for_hopper(deltanet_inputs._deltanet_inputs_kernel, signature,
                       {"HK": 16, "REPEAT": 2, "DK": 128, "DV": 128, "BLOCK_K": 128, "BLOCK_V": 128,
                        "HAS_VALID": padded}, num_warps=1)


@pytest.mark.parametrize("pairs,block_m", [(128, 16), (4096, 64)])
def test_expert_layout_kernel_compiles(pairs: int, block_m: int) -> None:
    from engine.kernels import expert_layout

    blocks = expert_layout.max_blocks(pairs, 256, block_m)
    chunks = -(-pairs // expert_layout.CHUNK)
    compile_for_hopper(expert_layout._chunk_counts_kernel,
                       {"ids_ptr": "*i64", "counts_ptr": "*i32", "rows_ptr": "*i32"},
                       {"P": pairs, "SLOTS": blocks * block_m, "SHARE": -(-blocks * block_m // chunks), "SPAN": 256,
                        "CHUNK_": expert_layout.CHUNK})
    compile_for_hopper(expert_layout._place_kernel,
                       {"ids_ptr": "*i64", "counts_ptr": "*i32", "rows_ptr": "*i32", "experts_ptr": "*i32"},
                       {"P": pairs, "CHUNKS": chunks, "CHUNKS_PAD": 1 << (chunks - 1).bit_length(), "BLOCKS": blocks,
                        "BLOCK_SHARE": 1 << (-(-blocks // chunks) - 1).bit_length(), "E": 256, "SPAN": 256,
                        "BLOCK_M": block_m, "CHUNK_": expert_layout.CHUNK})



@pytest.mark.parametrize("n,k", [(12352, 2048), (2048, 4096), (4097, 2048)])
def test_dense_rows_kernel_compiles(n: int, k: int) -> None:
    """DeltaNet's packed projection, an output projection, the candidate head (a masked column
    block): the 16 padded rows' dots on the tensor cores (Ampere's mma: Hopper's wgmma wants 64
    rows), the weight tiles copied asynchronously in 16-byte pieces, `stages` deep."""
    from engine.kernels import dense_rows as dr

    blocks = dr.config(n, k)
    signature = {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "M": "i32", "stride_x": "i32"}
    ptx = compile_for_hopper(dr._dense_rows_kernel, signature,
                             {"N": n, "K": k, "ROWS": dr.MAX_ROWS, "BLOCK_N": blocks.block_n,
                              "BLOCK_K": blocks.block_k, "FLOAT32": False},
                             num_warps=blocks.warps, num_stages=blocks.stages,
                             aligned=("x_ptr", "w_ptr", "out_ptr", "stride_x"))
    assert ".target sm_90" in ptx and ("wgmma" in ptx or "mma.sync" in ptx)
    assert "cp.async.cg.shared.global" in ptx and "ld.global.b16" not in ptx  # pipelined, 16-byte copies


def test_fp8_moe_gemm_compiles_at_full_size() -> None:
    """The experts' grouped GEMM at the full preset's 256 experts of 2,048 x 512 (gate/up, split K)."""
    from engine.kernels import fp8_moe as m

    gemm = {"a_ptr": "*fp8e4nv", "a_scale_ptr": "*fp32", "b_ptr": "*fp8e4nv", "b_scale_ptr": "*fp32", "c_ptr": "*fp32",
            "rows_ptr": "*i64", "experts_ptr": "*i64", "weights_ptr": "*fp32", "P": "i32"}
    ptx = compile_for_hopper(m._moe_gemm_kernel, gemm,
                             {"N": 1024, "K": 2048, "A_ROW_DIV": 8, "MUL_WEIGHTS": False, "ONE_PAIR": True,
                              "SPLIT_K": 4, "BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128}, num_stages=4)
    assert ".target sm_90" in ptx


def test_the_codec_snake_compiles_with_the_accurate_sin() -> None:
    from engine.kernels import snake

    ptx = compile_for_hopper(snake._snake_kernel, {"x_ptr": "*fp16", "alpha_ptr": "*fp32", "inverse_ptr": "*fp32",
                                                   "out_ptr": "*fp16", "C": "i32", "T": "i32"},
                             {"BLOCK_": snake.BLOCK}, aligned=("x_ptr", "out_ptr"))
    assert "sin.approx" not in ptx  # libdevice's sinf: the reference's accuracy
