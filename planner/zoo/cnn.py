"""Plain convolutional classifiers: LeNet-5, AlexNet and VGG-16.

LeNet-5 is the small CNN on which FlexFlow (sec. 8.4) checks that its search finds the globally
optimal strategy, and OptCNN's Table 2 reduces; AlexNet and VGG-16 are OptCNN's (sec. 6) and
FlexFlow's (sec. 8.1, Table 3) CNN benchmarks.  AlexNet and VGG-16 follow torchvision's
definitions layer for layer (same parameter counts: 61.1M and 138.4M) with two deliberate changes:
ReLUs are not in-place, so every op of the traced graph produces a fresh tensor the planner can
place and partition, and the classifier's hidden width is an option (`fc`) so tests can build
small instances.

Inputs: ``images`` ``(N, C, H, W)``; output: logits ``(N, classes)``.
"""

from __future__ import annotations

import torch
from torch import nn

from .spec import (ModelSpec, check_dropout, check_image, check_sizes, class_labels, conv_out,
                   images, seeded)


class LeNet5(nn.Module):
    """LeNet-5: conv6 5x5 (padded so a 28x28 input keeps its size), pool, conv16 5x5, pool, fc120, fc84."""

    def __init__(self, channels: int = 1, image: int = 28, classes: int = 10) -> None:
        super().__init__()
        side = conv_out(conv_out(conv_out(image, 2, 2), 5), 2, 2)
        self.features = nn.Sequential(
            nn.Conv2d(channels, 6, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=2),
            nn.Conv2d(6, 16, kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=2),
        )
        self.classifier = nn.Sequential(
            nn.Linear(16 * side * side, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


class AlexNet(nn.Module):
    """torchvision's AlexNet (the one-GPU variant of Krizhevsky et al.)."""

    def __init__(self, classes: int = 1000, fc: int = 4096, dropout: float = 0.5) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(64, 192, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(192, 384, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(384, 256, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(256, 256, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout),
            nn.Linear(256 * 6 * 6, fc),
            nn.ReLU(),
            nn.Dropout(p=dropout),
            nn.Linear(fc, fc),
            nn.ReLU(),
            nn.Linear(fc, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


# VGG configuration "D" of Simonyan & Zisserman: channels of the 3x3 convolutions, "M" = max pool.
_VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


class VGG16(nn.Module):
    """torchvision's VGG-16 (configuration D, no batch norm)."""

    def __init__(self, classes: int = 1000, fc: int = 4096, dropout: float = 0.5) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_channels = 3
        for v in _VGG16:
            if v == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                layers += [nn.Conv2d(in_channels, v, kernel_size=3, padding=1), nn.ReLU()]
                in_channels = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, fc),
            nn.ReLU(),
            nn.Dropout(p=dropout),
            nn.Linear(fc, fc),
            nn.ReLU(),
            nn.Dropout(p=dropout),
            nn.Linear(fc, classes),
        )
        # torchvision's initialization, so the model trains as the reference does.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


def lenet(*, batch: int = 64, image: int = 28, channels: int = 1, classes: int = 10, seed: int = 0) -> ModelSpec:
    check_sizes("lenet", batch=batch, image=image, channels=channels, classes=classes)
    side = conv_out(conv_out(conv_out(image, 2, 2), 5), 2, 2)
    check_image("lenet", image, side, minimum=12)
    return ModelSpec(
        name="lenet",
        module=seeded(seed, lambda: LeNet5(channels, image, classes)),
        inputs=images(batch, channels, image),
        target=class_labels(batch),
        loss="cross_entropy",
        description="LeNet-5 (LeCun et al. 1998): 2 conv + 2 pool + 3 fully-connected layers",
    )


def alexnet(*, batch: int = 256, image: int = 224, classes: int = 1000, fc: int = 4096,
            dropout: float = 0.5, seed: int = 0) -> ModelSpec:
    check_sizes("alexnet", batch=batch, image=image, classes=classes, fc=fc)
    check_dropout("alexnet", dropout)
    side = conv_out(image, 11, 4, 2)
    for _ in range(3):  # the three 3x3/2 max pools (the 5x5 and 3x3 convs keep the size)
        side = conv_out(side, 3, 2)
    check_image("alexnet", image, side, minimum=63)
    return ModelSpec(
        name="alexnet",
        module=seeded(seed, lambda: AlexNet(classes, fc, dropout)),
        inputs=images(batch, 3, image),
        target=class_labels(batch),
        loss="cross_entropy",
        description="AlexNet (Krizhevsky et al. 2012, torchvision variant): 5 conv + 3 fully-connected layers",
    )


def vgg16(*, batch: int = 64, image: int = 224, classes: int = 1000, fc: int = 4096,
          dropout: float = 0.5, seed: int = 0) -> ModelSpec:
    check_sizes("vgg16", batch=batch, image=image, classes=classes, fc=fc)
    check_dropout("vgg16", dropout)
    check_image("vgg16", image, image // 32, minimum=32)
    return ModelSpec(
        name="vgg16",
        module=seeded(seed, lambda: VGG16(classes, fc, dropout)),
        inputs=images(batch, 3, image),
        target=class_labels(batch),
        loss="cross_entropy",
        description="VGG-16 (Simonyan & Zisserman 2014, configuration D): 13 conv + 3 fully-connected layers",
    )
