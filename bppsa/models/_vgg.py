"""VGG-11 for CIFAR-10 as a :class:`~bppsa.models.Chain`."""

from __future__ import annotations

from bppsa.models._chain import Chain
from bppsa.models._layers import Conv2d, Flatten, Layer, Linear, MaxPool2d, ReLU

# Output channels of each 3x3 convolution; "M" is a 2x2 max pooling.
VGG11: tuple[int | str, ...] = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


def vgg11(num_classes: int = 10, in_channels: int = 3) -> Chain:
    """VGG-11 (configuration "A" of Simonyan & Zisserman, 2015) in its CIFAR-10 variant.

    The variant (as in the common ``pytorch-cifar`` models, without batch norm): 3x3
    convolutions with padding 1 and widths 64, M, 128, M, 256, 256, M, 512, 512, M, 512, 512, M,
    a ReLU after each convolution, ``MaxPool2d(2)`` at each M, then ``Flatten`` and a single
    ``Linear(512, num_classes)`` classifier (no 4096-wide hidden layers, no dropout). It takes
    ``(B, in_channels, 32, 32)`` inputs; 9,225,610 parameters for 10 classes.

    Args:
        num_classes: outputs of the classifier.
        in_channels: channels of the input images.

    Returns:
        A :class:`Chain` of 23 layers (8 Conv2d, 8 ReLU, 5 MaxPool2d, Flatten, Linear).
    """
    layers: list[Layer] = []
    channels = in_channels
    for width in VGG11:
        if isinstance(width, str):  # "M"
            layers.append(MaxPool2d(2))
        else:
            layers += [Conv2d(channels, width, 3, padding=1), ReLU()]
            channels = width
    layers += [Flatten(), Linear(channels, num_classes)]
    return Chain(layers)
