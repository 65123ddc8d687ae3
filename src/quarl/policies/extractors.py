"""Features extractors quarl trains with, laid out as SB3's NatureCNN is (``cnn`` then
``linear``), so the SB3 loader rebuilds them from the state dict alone like any zoo CNN."""

from __future__ import annotations

import gymnasium as gym
import torch
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn


class SmallCNN(BaseFeaturesExtractor):
    """MinAtar's network (Young and Tian 2019): one 3x3 convolution of 16 filters, stride 1,
    over channel-first 10x10 frames, then a Linear layer of ``features_dim`` units. NatureCNN
    needs frames of at least 36x36."""

    def __init__(self, observation_space: gym.spaces.Box, features_dim: int = 128, filters: int = 16) -> None:
        super().__init__(observation_space, features_dim)
        channels, height, width = observation_space.shape
        self.cnn = nn.Sequential(nn.Conv2d(channels, filters, kernel_size=3, stride=1), nn.ReLU(), nn.Flatten())
        flat = filters * (height - 2) * (width - 2)
        self.linear = nn.Sequential(nn.Linear(flat, features_dim), nn.ReLU())

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        features: torch.Tensor = self.linear(self.cnn(observations))
        return features
