"""PersonaPlex's fused token draw against its reference (sampling.py `draw_reference`), and the
reference's own behaviour: greedy at temperature 0, only the top k drawn, draws that follow softmax."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import token_draw
from engine.personaplex.sampling import draw_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU the kernels run in Triton's interpreter


def rows(B: int, V: int, device: str, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, V, generator=g) * 3
    logits[0, V // 3] = logits[0].max()  # a tie at the top: the lower id wins, as argmax
    temperature = torch.tensor([0.0, 0.7, 1.0, 0.8, 2.0][:B])
    top_k = torch.tensor([5, 1, 25, 250, V + 5][:B])
    seed_ = torch.tensor([1, 2, 3, 2**40 + 5, 0][:B])
    counter = torch.tensor([0, 5, 7, 9, 2**33][:B])
    return tuple(t.to(device) for t in (logits, temperature, top_k, seed_, counter))


def test_reference_is_greedy_at_zero_and_keeps_to_the_top_k() -> None:
    logits, temperature, top_k, seed, counter = rows(5, 300, "cpu", 0)
    assert draw_reference(logits, temperature * 0, top_k, seed, counter, 0).tolist() == logits.argmax(-1).tolist()
    for c in range(50):
        drawn = draw_reference(logits, temperature, top_k, seed, counter + c, 3)
        for b in range(1, 5):
            kept = logits[b] >= logits[b].sort(descending=True).values[min(int(top_k[b]), 300) - 1]
            assert kept[drawn[b]]
    assert drawn[1] == logits[1].argmax()  # top-k 1 is greedy whatever the temperature


def test_reference_draws_follow_the_softmax() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -9.0]])
    counts = torch.zeros(5)
    for c in range(4000):
        counts[draw_reference(logits, torch.tensor([1.0]), torch.tensor([4]), torch.tensor([9]), torch.tensor([c]),
                              1)] += 1
    expected = torch.softmax(logits[0, :4], -1)
    assert counts[4] == 0  # outside the top 4
    assert (counts[:4] / 4000 - expected).abs().max() < 0.03


@pytest.mark.kernel
@pytest.mark.parametrize("V", [100, 2048, 3000])
def test_kernel_equals_reference(V: int) -> None:
    args = rows(5, V, DEVICE, V)
    for stream in (0, 3):
        assert torch.equal(token_draw.draw_kernel(*args, stream), draw_reference(*args, stream))


@pytest.mark.kernel
def test_kernel_keeps_every_tie_at_the_kth_logit() -> None:
    """Logits of few distinct values (ties at the k-th, both zeros, negatives only): the row
    kernel's k-th largest by bisection keeps what the sort's threshold keeps."""
    g = torch.Generator().manual_seed(4)
    logits = torch.randint(-4, 3, (4, 2048), generator=g).float()  # seven values, hundreds of each
    logits[1] = -logits[1].abs() - 1  # all negative
    logits[2, ::2] = -0.0  # the two zeros, one key
    temperature = torch.tensor([0.9, 1.0, 1.5, 0.7])
    top_k = torch.tensor([3, 700, 1024, 2048])
    seed, counter = torch.tensor([5, 6, 7, 8]), torch.tensor([1, 2, 3, 4])
    args = tuple(t.to(DEVICE) for t in (logits, temperature, top_k, seed, counter))
    for stream in range(6):
        assert torch.equal(token_draw.draw_kernel(*args, stream), draw_reference(*args, stream))


@pytest.mark.gpu
@pytest.mark.parametrize("V", [2048, 32000])
def test_kernel_equals_reference_at_the_released_vocabularies(V: int) -> None:
    for seed in range(5):
        args = rows(5, V, "cuda", seed)
        for stream in (0, 1, 8):
            assert torch.equal(token_draw.draw_kernel(*args, stream), draw_reference(*args, stream))


def test_the_cpu_draws_are_the_references() -> None:
    """On a CPU the Philox words are computed in numpy: the same noise (to an ulp of log), the same draws."""
    from engine.kernels.draws import gumbel_reference
    from engine.personaplex.sampling import draw, gumbel_numpy

    seed, counter = torch.tensor([1, 2**40 + 5, 0, 2**63 - 1]), torch.tensor([0, 7, 2**33, 5])
    torch.testing.assert_close(gumbel_numpy(seed, counter, 3, 700),
                               gumbel_reference(seed, counter, 3, torch.arange(700).expand(4, -1)), rtol=0,
                               atol=1e-14)
    logits, temperature, top_k, seed, counter = rows(5, 300, "cpu", 1)
    for c in range(20):
        assert torch.equal(draw(logits, temperature, top_k, seed, counter + c, 2, fused=True),
                           draw_reference(logits, temperature, top_k, seed, counter + c, 2))
