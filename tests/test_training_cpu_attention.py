"""CPU's attention kernel choice (targets/torch/cpu/attention.py): scaled_dot_product_attention with k and v of fewer
heads than q runs the math path where they broadcast (enable_gqa off: Falcon's multi-query attention) and flash
attention with enable_gqa; what the estimate keeps follows PyTorch's saved tensors."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

BATCH, HEADS, TOKENS, WIDTH = 2, 4, 16, 16


class MultiQuery(torch.nn.Module):
    """One attention whose k and v have `kv_heads` heads, called with or without enable_gqa."""

    def __init__(self, kv_heads: int, gqa: bool) -> None:
        super().__init__()
        self.q = torch.nn.Linear(32, HEADS * WIDTH)
        self.kv = torch.nn.Linear(32, 2 * kv_heads * WIDTH)
        self.out = torch.nn.Linear(HEADS * WIDTH, 10)
        self.kv_heads, self.gqa = kv_heads, gqa

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, HEADS, WIDTH).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2, self.kv_heads, WIDTH).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.gqa)
        return self.out(y.transpose(1, 2).reshape(b, t, HEADS * WIDTH))


def _inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(BATCH, TOKENS, 32),)


def _pytorch_saved_bytes(model: torch.nn.Module) -> tuple[int, str]:
    """Give the bytes of the distinct storages PyTorch saves for backward in the model's forward, and the
    attention's backward node."""
    storages: dict[int, int] = {}
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    x = _inputs()[0]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
    node = out.grad_fn
    names = []
    todo = [node]
    while todo:
        n = todo.pop()
        if n is None:
            continue
        names.append(n.name())
        todo.extend(f for f, _ in n.next_functions)
    flash = any("FlashAttention" in name for name in names)
    return sum(v for k, v in storages.items() if k != x.untyped_storage().data_ptr()), "flash" if flash else "math"


def _onnxmem_saved(path: Path, device: str) -> int:
    import onnxmem

    options = onnxmem.TrainingOptions(optimizer="sgd", device=device, loss="none")
    report = onnxmem.analyze(str(path), {}, training=options)
    assert report.training is not None
    return report.training.saved_activation_bytes


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, bool], Path]:
    from onnxmem.torch import export_for_training

    folder = tmp_path_factory.mktemp("attention")
    made = {}
    for kv_heads, gqa in ((1, False), (1, True), (HEADS, False)):
        torch.manual_seed(0)
        made[kv_heads, gqa] = export_for_training(MultiQuery(kv_heads, gqa).train(), _inputs(),
                                                  folder / f"attention_{kv_heads}_{gqa}.onnx")
    return made


def test_pytorch_runs_math_for_broadcast_key_values_and_flash_with_enable_gqa() -> None:
    torch.manual_seed(0)
    assert _pytorch_saved_bytes(MultiQuery(1, False))[1] == "math"
    assert _pytorch_saved_bytes(MultiQuery(1, True))[1] == "flash"
    assert _pytorch_saved_bytes(MultiQuery(HEADS, False))[1] == "flash"


def test_broadcast_key_values_keep_what_pytorchs_math_path_saves(exports: dict[tuple[int, bool], Path]) -> None:
    # the same model with and without enable_gqa: PyTorch's extra saved bytes (the probabilities, q scaled, k and v
    # expanded to the query's heads) are the estimate's extra saved bytes on CPU
    torch.manual_seed(0)
    broadcast, _ = _pytorch_saved_bytes(MultiQuery(1, False))
    torch.manual_seed(0)
    grouped, _ = _pytorch_saved_bytes(MultiQuery(1, True))
    ours = _onnxmem_saved(exports[1, False], "cpu") - _onnxmem_saved(exports[1, True], "cpu")
    assert ours == broadcast - grouped > BATCH * HEADS * TOKENS * TOKENS * 4


def test_equal_heads_keep_flash_attentions_tensors(exports: dict[tuple[int, bool], Path]) -> None:
    torch.manual_seed(0)
    truth, _ = _pytorch_saved_bytes(MultiQuery(HEADS, False))
    assert _onnxmem_saved(exports[HEADS, False], "cpu") == truth
