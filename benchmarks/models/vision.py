"""Vision models at their real sizes (issue 42), random weights, imported as a PyTorch user's model is
(`ts.import_torch`): ViT-B/16 on 224 x 224 images through transformers, and a ResNet-50 bottleneck block written in
torch.nn as torchvision writes it (convolutions, batch norm in eval mode, ReLU, the residual), batch 8, float16.
Built when run; need torch (and transformers for the ViT)."""
from __future__ import annotations

import functools
from typing import Any

from tensorsmith.bench import DeferredCase

try:
    import torch
except ImportError:   # the suite lists without torch; building these cases needs it
    torch = None  # type: ignore[assignment]

BATCH, IMAGE = 8, 224
BLOCK_CHANNELS, BLOCK_WIDTH, BLOCK_SIZE = 256, 64, 56   # ResNet-50's first stage: 256 -> 64 -> 64 -> 256 at 56 x 56


if torch is not None:
    class Bottleneck(torch.nn.Module):
        """ResNet-50's bottleneck block: 1x1, 3x3 and 1x1 convolutions, each with batch norm, ReLU, the residual."""

        def __init__(self, channels: int = BLOCK_CHANNELS, width: int = BLOCK_WIDTH) -> None:
            super().__init__()
            self.conv1 = torch.nn.Conv2d(channels, width, 1, bias=False)
            self.conv2 = torch.nn.Conv2d(width, width, 3, padding=1, bias=False)
            self.conv3 = torch.nn.Conv2d(width, channels, 1, bias=False)
            self.bn1, self.bn2 = torch.nn.BatchNorm2d(width), torch.nn.BatchNorm2d(width)
            self.bn3 = torch.nn.BatchNorm2d(channels)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.bn1(self.conv1(x)))
            h = torch.relu(self.bn2(self.conv2(h)))
            return torch.relu(self.bn3(self.conv3(h)) + x)

    class Pixels(torch.nn.Module):
        """A transformers vision encoder called as pixels -> its last hidden state."""

        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return self.model(pixel_values=pixel_values).last_hidden_state


def _vit() -> Any:
    import transformers

    return Pixels(transformers.ViTModel(transformers.ViTConfig(), add_pooling_layer=False))   # ViT-B/16, 224


def _pixels(shape: tuple[int, ...], generator: Any, device: str) -> Any:
    return torch.randn(shape, generator=generator, device=device)


def _case(name: str, make: Any, shape: tuple[int, ...], note: str) -> Any:
    from tensorsmith.suite.hugging_face import module_case

    return module_case(make, torch.zeros(shape), functools.partial(_pixels, shape), name, "vision", note)


def _parameters(make: Any) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in make().parameters())


def _deferred(name: str, make: Any, shape: tuple[int, ...], note: str) -> DeferredCase:
    """A row built when run; its parameter count is known without building it."""
    return DeferredCase(name, "vision", functools.partial(_case, name, make, shape, note), note=note,
                        parameters=functools.partial(_parameters, make))


def _bottleneck() -> Any:
    return Bottleneck()


CASES = [
    _deferred("vit_b16", _vit, (BATCH, 3, IMAGE, IMAGE), f"ViT-B/16 at {IMAGE} x {IMAGE}, batch {BATCH}, float16"),
    _deferred("resnet_block", _bottleneck, (BATCH, BLOCK_CHANNELS, BLOCK_SIZE, BLOCK_SIZE),
              f"ResNet-50's bottleneck block ({BLOCK_CHANNELS} -> {BLOCK_WIDTH} -> {BLOCK_CHANNELS} channels) at"
              f" {BLOCK_SIZE} x {BLOCK_SIZE}, batch {BATCH}, float16"),
]
