"""What the suite's Hugging Face cases share (the toy ones of imported.py, the real-size ones of real.py): a model
called as token ids -> one tensor, and the case that imports it with `ts.import_torch` as a user imports the model
they run. No cases of its own."""
from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

from tensorsmith.bench import Case, DeferredCase
from tensorsmith.ir.dtypes import DType

try:
    import torch
except ImportError:   # the suite lists without torch; building these cases needs it
    torch = None  # type: ignore[assignment]

CASES: list[Case | DeferredCase] = []     # helpers only: the cases are imported.py's and real.py's


if torch is not None:
    class Logits(torch.nn.Module):
        """A causal language model called as ids -> logits, what the importers' tests export."""

        def __init__(self, model: torch.nn.Module):
            super().__init__()
            self.model = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=ids, use_cache=False).logits

    class Hidden(torch.nn.Module):
        """An encoder's last hidden state for token ids (an encoder has no logits)."""

        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=ids).last_hidden_state


def hf_case(make: Callable[[], Any], ids_shape: tuple[int, ...], vocab: int, name: str, family: str, note: str,
            dtype: str = "float16") -> Case:
    """The module `make` builds (float32, eval mode), called on token ids of `ids_shape` drawn from the vocabulary,
    as `module_case` makes it."""
    def ids(generator: Any, device: str) -> Any:
        return torch.randint(0, vocab, ids_shape, generator=generator, device=device, dtype=torch.int32)
    return module_case(make, torch.zeros(ids_shape, dtype=torch.long), ids, name, family, note, dtype)


def module_case(make: Callable[[], Any], example: Any, draw: Callable[[Any, str], Any], name: str, family: str,
                note: str, dtype: str = "float16") -> Case:
    """The module `make` builds (float32, eval mode, called on one tensor as its users call it), cast to `dtype`
    and imported where it runs on `example`, on the GPU where there is one (there PyTorch's attention is one fused
    op, on the CPU the math it decomposes into), as a user imports the model they run.

    Its inputs are the model's own: its one input drawn by `draw(generator, device)` (token ids, or pixels, in
    `dtype`) and the module's weights. The reference is the module itself in `dtype`, or, given float32 tensors
    (the harness's truth), the same weights widened."""
    from tensorsmith.torch_import import import_torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(device):      # built where it runs: no float32 copy of a large model in host memory
        module = make().to(getattr(torch, dtype)).eval()
    example = example.to(device, getattr(torch, dtype) if example.is_floating_point() else example.dtype)
    imported = import_torch(module, (example,), name=name)
    (argument,) = imported.arguments
    probe = next(key for key, value in imported.bound.items() if value.is_floating_point())
    bound = {key: (value.int() if imported.graph.inputs[key].dtype == DType.INT32 else value).detach().to(device)
             for key, value in imported.bound.items()}

    @functools.cache
    def widened() -> Any:
        """The same weights in float32, the truth the narrower runs are held to: made on the first float32 call."""
        return module if dtype == "float32" else copy.deepcopy(module).float()

    def values(torch_module: Any, seed: int) -> dict[str, Any]:
        drawn = draw(torch.Generator(device=device).manual_seed(seed), device)
        return {argument: drawn.to(example.dtype) if drawn.is_floating_point() else drawn, **bound}

    def given(tensor: Any, dtype: Any) -> Any:   # ids as the model takes them; pixels in the weights' dtype
        return tensor.to(dtype) if tensor.is_floating_point() else tensor.long()

    def reference(**tensors: Any) -> Any:
        model = widened() if tensors[probe].dtype == torch.float32 else module
        return model(given(tensors[argument], tensors[probe].dtype))

    def backend(torch_module: Any) -> Callable[..., Any]:
        """The module as `torch.compile(backend="tensorsmith")` makes it, called like the reference."""
        compiled = torch_module.compile(module, backend="tensorsmith")
        return lambda **tensors: compiled(given(tensors[argument], tensors[probe].dtype))

    return Case(imported.graph, reference, family, values=values, note=note, backend=backend)
