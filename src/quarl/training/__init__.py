"""Training with Stable-Baselines3, saved in the RL Zoo's folder layout."""
