"""`retake bench kernels`: without CUDA it says so and exits 2; its cases (every kernel and
its reference on random inputs) run at a small config, here through Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

from backend.cli import main
from engine.bench import kernels as bench
from engine.drama3.config import Drama3Config
from engine.drama3.tiny import tiny_config


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for machines without CUDA")
def test_without_cuda_it_says_so_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "kernels", "--rows", "1"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def small_config() -> Drama3Config:
    raw = tiny_config()
    raw["audio_decoder_config"]["vocab_size"] = 32  # a 33-candidate main head: quick in the interpreter
    raw["semantic_end_token_id"] = raw["semantic_start_token_id"] + 31
    return Drama3Config.from_dict(raw)


def test_dense_cases_only_at_rows_the_kernel_takes() -> None:
    """Past 16 rows dense_rows is F.linear itself: nothing to time."""
    from engine.bench.dense_cases import dense_cases

    assert len(dense_cases(small_config(), 16, torch.device("cpu"))) == 27  # 8 weights, 3 + 16 blocks swept
    assert dense_cases(small_config(), 17, torch.device("cpu")) == []


@pytest.mark.kernel
def test_every_case_runs_its_kernel_and_reference() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = small_config()
    with torch.inference_mode():
        cases = bench.cases(config, rows=2, device=device, lm={"dim": 64, "num_heads": 2, "context": 40})
        assert {case.kernel for case in cases} == {"sample_main", "sample_code", "add_rms_norm", "deltanet_step",
                                                   "moe_routing", "expert_layout", "fp8_moe", "fp8_moe pairs split 1",
                                                   "fp8_moe experts",
                                                   "cache_attention kv 512", "cache_attention kv 4096",
                                                   "personaplex ring", "personaplex ring block 64 warps 4",
                                                   "personaplex ring block 128 warps 2",
                                                   "personaplex ring block 128 warps 4",
                                                   "personaplex ring block 64 warps 1",
                                                   "personaplex ring block 32 warps 4 tensor cores",
                                                   *(f"dense_rows {role}" for role in (
                                                       "deltanet_in", "attention_in", "out", "shared_up",
                                                       "shared_down", "router", "head", "tower_down",
                                                       "deltanet_in bn64 bk256",
                                                       "deltanet_in bn16 bk256", "deltanet_in bn32 bk128",
                                                       # the narrow weights' K blocks are capped at K (128 here)
                                                       *(f"{narrow} bn16 bk128 s{stages} w{warps}"
                                                         for narrow in ("out", "shared_up", "shared_down")
                                                         for stages, warps in ((4, 8), (6, 4), (8, 4), (8, 8))),
                                                       *(f"tower_down bn16 bk{bk} s{stages} w{warps}"
                                                         for bk, stages, warps in ((128, 8, 4), (256, 4, 8),
                                                                                   (256, 6, 4), (256, 8, 8)))))}
        for case in cases:
            got, expected = case.call(0), case.reference(0)
            assert case.bytes > 0 and case.copies >= 1 and case.per_step >= 1
            got = got[0] if isinstance(got, tuple) else got
            expected = expected[0] if isinstance(expected, tuple) else expected
            assert isinstance(got, torch.Tensor) and got.shape == expected.shape, case.kernel
            if case.kernel.startswith("sample") or case.kernel == "expert_layout":
                assert torch.equal(got, expected), case.kernel
            if case.kernel.startswith(("personaplex ring", "dense_rows")):  # bfloat16 results, to their rounding
                torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=2e-2)
