"""On a GPU: the fast path against its reference paths. fla's chunked DeltaNet equals our
torch recurrence; compiled decode layers equal eager ones; graph replays of the whole
decode step (the Decoder with graphs, fast path installed) give eager's frames.

Compiled against eager in float32 is compared with TF32 off and the FP8 experts' plain
path (dequantised weights, float32 activations): the served W8A8 path quantises the
experts' activations to float8, where a one-ulp difference from a fused kernel flips a
rounding worth ~1e-3, so compiled and eager cannot agree to float32 rounding through it.
`retake bench numerics` measures every combination (scripts/gpu runs it); graph replays
are compared with the W8A8 path on, exactly."""

from __future__ import annotations

import pytest
import torch

from engine.drama3.decoder import Decoder
from engine.drama3.deltanet import chunked_delta_rule, l2_normalize
from engine.drama3.fast import KERNELS, fla_delta_rule, install_fast_path
from engine.drama3.moe import Experts

pytestmark = pytest.mark.gpu  # exact_float32: tests/engine/conftest.py


def float_activations(model) -> None:
    """The FP8 experts' plain path: dequantised weights, activations not quantised."""
    for module in model.modules():
        if isinstance(module, Experts):
            module.w8a8 = False


def delta_inputs(B: int, T: int, H: int, Dk: int, Dv: int) -> tuple[torch.Tensor, ...]:
    q = l2_normalize(torch.randn(B, T, H, Dk, device="cuda")) * Dk ** -0.5
    k = l2_normalize(torch.randn(B, T, H, Dk, device="cuda"))
    v = torch.randn(B, T, H, Dv, device="cuda")
    g = -torch.rand(B, T, H, device="cuda") * 0.5
    beta = torch.rand(B, T, H, device="cuda")
    state = torch.randn(B, H, Dk, Dv, device="cuda") * 0.1
    return q, k, v, g, beta, state


@pytest.mark.parametrize("T", [5, 64, 300])
def test_fla_chunked_equals_torch_reference(T: int) -> None:
    pytest.importorskip("fla.ops.gated_delta_rule")
    torch.manual_seed(T)
    inputs = delta_inputs(2, T, 4, 64, 64)
    out, state = fla_delta_rule(*inputs)
    ref_out, ref_state = chunked_delta_rule(*inputs)
    assert (out - ref_out).norm() / ref_out.norm() < 2e-2
    assert (state - ref_state).norm() / ref_state.norm() < 2e-2


def frames_of(decoder: Decoder, prompt, steps: int, run) -> torch.Tensor:
    decoder.prefill(prompt, 0)
    position, out = len(prompt.rows) - 1, []
    for step in range(steps):
        run(position + step)
        out.append(decoder.status[0].clone())  # finite, then the new frame
    return torch.stack(out).cpu()


def test_fast_path_decode_matches_eager(tiny_checkpoint, exact_float32) -> None:
    """In float32 (no TF32, experts' activations not quantised) the compiled layers agree
    with eager to rounding, so a seeded take draws the same frames; graph replays equal
    eager steps of the same bucket exactly. (In bfloat16 the fused and unfused roundings
    differ enough to move draws of the tiny model's near-flat random heads, so frames are
    not compared there.)"""
    from engine.drama3.checkpoint import load_model
    from engine.drama3.prompt import build_prompt
    from engine.drama3.sampling import Sampling

    model, config, tokenizer = load_model(tiny_checkpoint, device="cuda", dtype=torch.float32)
    float_activations(model)
    prompt = build_prompt("The fast path, checked.", None, [], Sampling(max_new_tokens=32, seed=4), tokenizer, config)
    steps, max_rows = 24, len(prompt.rows) + 64
    model.setup_caches(1, max_rows, "cuda", torch.float32)
    with torch.inference_mode():
        install_fast_path(model, compile_layers=False, kernels=("prefill_norms",))  # one prefill in both runs
        eager = Decoder(model, max_rows)
        kv = eager.kv_len(len(prompt.rows) + steps)
        reference = frames_of(eager, prompt, steps, lambda position: eager.advance(kv))
        hidden_reference = eager.hidden.clone()
        assert "compiled_decode_layers" in install_fast_path(model)
        compiled = frames_of(eager, prompt, steps, lambda position: eager.advance(kv))
        assert torch.equal(compiled, reference)
        assert (eager.hidden - hidden_reference).norm() / hidden_reference.norm() < 1e-4
        graphed = Decoder(model, max_rows, graphs=True)
        graphed.capture()
        stepped = frames_of(graphed, prompt, steps,
                            lambda position: graphed.advance(graphed.graph_kv_len(position)))
        replayed = frames_of(graphed, prompt, steps, graphed.step)
        assert torch.equal(replayed, stepped)


def test_compiled_prefill_matches_eager(tiny_checkpoint, exact_float32) -> None:
    """Prefill chunks through layers compiled with a symbolic row count are as close to the
    float64 prefill as the eager float32 ones (TF32 off, experts' activations not quantised,
    no Triton kernel in either run: this compares compiling alone).

    Not compiled against eager directly: both run fla's chunked DeltaNet, which casts q, k and
    v to bfloat16 (fast.py `fla_delta_rule`), so a float32 difference of one ulp before it can
    move a bfloat16 rounding (0.4%), and the two runs differed by 1.1e-4 to 3.7e-4 (stop 35,
    stop 42's H100) where a 1e-4 bound was asked of them. A defect of the compiled layers (a
    wrong mask, a reduction in another dtype) would take them far from float64; rounding
    leaves them as near as eager."""
    from engine.drama3.checkpoint import load_model
    from engine.drama3.prompt import build_prompt
    from engine.drama3.sampling import Sampling

    max_rows = 512

    def hiddens(dtype: torch.dtype, fast: dict | None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The last row's hidden after each prompt's prefill, eager then (if `fast`) compiled."""
        model, config, tokenizer = load_model(tiny_checkpoint, device="cuda", dtype=dtype)
        float_activations(model)
        model.setup_caches(1, max_rows, "cuda", dtype)
        prompts = [build_prompt(text, None, [], Sampling(max_new_tokens=16, seed=1), tokenizer, config)
                   for text in ("A first prompt.", "A second, longer prompt of another length.")]
        runs: list[list[torch.Tensor]] = []
        with torch.inference_mode():
            if fast is not None:
                install_fast_path(model, compile_layers=False, kernels=())  # fla prefill in both runs
            decoder = Decoder(model, max_rows)
            for compiled in (False, True) if fast is not None else (False,):
                if compiled:
                    assert "compiled_prefill_layers" in install_fast_path(model, **fast)
                runs.append([])
                for prompt in prompts:
                    decoder.prefill(prompt)
                    runs[-1].append(decoder.hidden.double().clone())  # [1, D]
        return runs[0], runs[-1]

    truth, _ = hiddens(torch.float64, None)  # torch's DeltaNet rule, float64 throughout
    eager, compiled = hiddens(torch.float32, {"compile_prefill": True, "kernels": ()})
    for want, plain, fast in zip(truth, eager, compiled, strict=True):
        plain_error = ((plain - want).norm() / want.norm()).item()
        fast_error = ((fast - want).norm() / want.norm()).item()
        assert plain_error < 2e-2  # fla's bfloat16 inputs: well under 1% (stop 42: to be read here)
        assert fast_error <= 2 * plain_error + 1e-6, (fast_error, plain_error)


def test_batched_graph_replays_match_eager_steps(tiny_checkpoint) -> None:
    """Three slots, two takes at different positions (slot 1 free): the Decoder's graph
    replays give the eager step's frames for both takes, fast path installed."""
    from engine.drama3.checkpoint import load_model
    from engine.drama3.prompt import build_prompt
    from engine.drama3.sampling import Sampling

    model, config, tokenizer = load_model(tiny_checkpoint, device="cuda", dtype=torch.float32)
    prompts = {0: build_prompt("The first take.", None, [], Sampling(max_new_tokens=32, seed=4), tokenizer, config),
               2: build_prompt("A second take, with a longer line than the first.", None, [],
                               Sampling(temperature=0.7, top_k=10, max_new_tokens=32, seed=5), tokenizer, config)}
    steps = 20
    max_rows = max(len(p.rows) for p in prompts.values()) + 64
    model.setup_caches(3, max_rows, "cuda", torch.float32)
    with torch.inference_mode():
        install_fast_path(model)
        graphed = Decoder(model, max_rows, slots=3, graphs=True)
        graphed.capture()

        def frames(run) -> torch.Tensor:
            for slot, prompt in prompts.items():
                graphed.prefill(prompt, slot)
            furthest, out = max(len(p.rows) for p in prompts.values()) - 1, []
            for step in range(steps):
                run(furthest + step)
                out.append(graphed.status[[0, 2]].clone())
            return torch.stack(out).cpu()

        stepped = frames(lambda position: graphed.advance(graphed.graph_kv_len(position)))
        replayed = frames(graphed.step)
    assert torch.equal(replayed, stepped)


def test_a_seeded_take_draws_the_same_frames_in_any_row_and_bucket(tiny_checkpoint, exact_float32) -> None:
    """The decode graphs step the decoding rows through a static index, one graph per row
    bucket: a seeded take gives the same frames alone (1-row graph), beside another (2-row
    graph, in another slot), among four (4-row graph) and three (the 4-row graph padded
    with a row that is not decoding); a graph replay equals the same step launched. In
    float32 with the experts' plain path (a one-ulp difference of another batch size stays
    one ulp); bfloat16 and W8A8 can move a draw of the tiny model's near-flat heads."""
    from engine.drama3.checkpoint import load_model
    from engine.drama3.prompt import build_prompt
    from engine.drama3.sampling import Sampling

    model, config, tokenizer = load_model(tiny_checkpoint, device="cuda", dtype=torch.float32)
    float_activations(model)
    texts = ("The first take.", "A second take, longer than the first.", "A third.", "And a fourth, the last.")
    prompts = [build_prompt(text, None, [], Sampling(max_new_tokens=32, seed=10 + i), tokenizer, config)
               for i, text in enumerate(texts)]
    steps, max_rows = 16, max(len(p.rows) for p in prompts) + 64
    with torch.inference_mode():
        install_fast_path(model)
        decoder = Decoder(model, max_rows, slots=4, graphs=True)
        assert decoder.row_buckets == [1, 2, 4]
        decoder.capture()

        def frames(placement: dict[int, int], graphed: bool = True) -> dict[int, torch.Tensor]:
            """Prompt placement[slot] in each slot, stepped together: each slot's status rows."""
            for slot, which in placement.items():
                decoder.prefill(prompts[which], slot)
            positions = {slot: len(prompts[which].rows) - 1 for slot, which in placement.items()}
            rows, out = list(placement), {slot: [] for slot in placement}
            for _ in range(steps):
                furthest = max(positions.values())
                if graphed:
                    decoder.step(furthest, rows)
                else:
                    decoder.advance(decoder.graph_kv_len(furthest), rows)
                status = decoder.read_status()
                for slot in rows:
                    out[slot].append(status[slot])
                    positions[slot] += 1
            for slot in placement:
                decoder.release(slot)
            return {slot: torch.tensor(rows_of) for slot, rows_of in out.items()}

        alone = [frames({0: i})[0] for i in range(4)]
        pair = frames({3: 0, 1: 1})
        four = frames({1: 0, 0: 1, 3: 2, 2: 3})
        three = frames({2: 3, 0: 1, 1: 0})  # the 4-row graph, padded with row 3
        launched = frames({3: 0, 1: 1}, graphed=False)
    assert torch.equal(pair[3], alone[0]) and torch.equal(pair[1], alone[1])
    assert all(torch.equal(four[slot], alone[which]) for slot, which in {1: 0, 0: 1, 3: 2, 2: 3}.items())
    assert all(torch.equal(three[slot], alone[which]) for slot, which in {2: 3, 0: 1, 1: 0}.items())
    assert torch.equal(launched[3], pair[3]) and torch.equal(launched[1], pair[1])


@pytest.mark.parametrize("kernel", KERNELS)
def test_each_decode_kernel_gives_the_step_without_it(tiny_checkpoint, exact_float32, kernel: str) -> None:
    """Each Triton kernel of the step (fast.py KERNELS) selected alone, layers not compiled:
    the same frames of a seeded take and the same hidden state to float32 rounding as the
    step with none (TF32 off, the experts' plain path)."""
    from engine.drama3.checkpoint import load_model
    from engine.drama3.prompt import build_prompt
    from engine.drama3.sampling import Sampling

    model, config, tokenizer = load_model(tiny_checkpoint, device="cuda", dtype=torch.float32)
    float_activations(model)
    prompt = build_prompt("Each kernel, checked.", None, [], Sampling(max_new_tokens=32, seed=6), tokenizer, config)
    steps, max_rows = 16, len(prompt.rows) + 64
    with torch.inference_mode():
        name = kernel if kernel == "shared_beside" else f"{kernel}_kernel"  # (two streams, not a kernel)
        assert name not in install_fast_path(model, compile_layers=False, kernels=())
        decoder = Decoder(model, max_rows)
        kv = decoder.kv_len(len(prompt.rows) + steps)
        reference = frames_of(decoder, prompt, steps, lambda position: decoder.advance(kv))
        hidden_reference = decoder.hidden.clone()
        assert name in install_fast_path(model, compile_layers=False, kernels=(kernel,))
        fast = frames_of(decoder, prompt, steps, lambda position: decoder.advance(kv))
        # A prefill kernel's float32 norms sum in another order (test_norm.py: a chunk's tower cache
        # agrees to 1e-4 after 17 layers); the decode kernels keep the step to 1e-5.
        tolerance = 1e-4 if kernel == "prefill_norms" else 1e-5
        assert (decoder.hidden - hidden_reference).norm() / hidden_reference.norm() < tolerance
    assert torch.equal(fast, reference)
