"""ResNet-101 (He et al. 2016), the residual CNN of FlexFlow Table 3.

torchvision's ResNet with bottleneck blocks ``[3, 4, 23, 3]`` (v1.5: the stride of a downsampling
block is on its 3x3 convolution), 44.5M parameters.  The residual sum is written ``out + identity``
rather than in place, so the traced graph has an explicit add op joining the two paths; the
shortcut is the kind of edge OptCNN's edge elimination (sec. 5) merges.
Inputs: ``images`` ``(N, 3, H, W)`` (224 in the paper; padding keeps every size valid); output: logits ``(N, classes)``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import AutoparError
from .spec import ModelSpec, check_sizes, class_labels, images, seeded


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_channels: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        out_channels = planes * self.expansion
        self.conv1 = nn.Conv2d(in_channels, planes, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out_channels, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU()
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, blocks: tuple[int, ...] = (3, 4, 23, 3), classes: int = 1000, width: int = 64) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        in_channels = width
        stages = []
        for i, count in enumerate(blocks):
            planes = width * 2**i
            stride = 1 if i == 0 else 2
            stage = [Bottleneck(in_channels, planes, stride)]
            in_channels = planes * Bottleneck.expansion
            stage += [Bottleneck(in_channels, planes) for _ in range(count - 1)]
            stages.append(nn.Sequential(*stage))
        # Named layer1..layer4 as in torchvision, so checkpoints and op names line up.
        for i, stage in enumerate(stages, start=1):
            self.add_module(f"layer{i}", stage)
        self.num_stages = len(stages)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(in_channels, classes)
        # torchvision's initialization.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for i in range(1, self.num_stages + 1):
            x = getattr(self, f"layer{i}")(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.fc(x)


def resnet101(*, batch: int = 64, image: int = 224, classes: int = 1000, width: int = 64,
              blocks: tuple[int, ...] = (3, 4, 23, 3), seed: int = 0) -> ModelSpec:
    check_sizes("resnet101", batch=batch, image=image, classes=classes, width=width)
    if not blocks or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in blocks):
        raise AutoparError(f"model 'resnet101': option blocks={blocks!r} must be positive block counts per stage, e.g. 3,4,23,3")
    return ModelSpec(
        name="resnet101",
        module=seeded(seed, lambda: ResNet(tuple(blocks), classes, width)),
        inputs=images(batch, 3, image),
        target=class_labels(batch),
        loss="cross_entropy",
        description=f"ResNet-101 (He et al. 2016): bottleneck blocks per stage {list(blocks)}",
    )
