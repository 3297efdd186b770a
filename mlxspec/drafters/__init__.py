"""Drafters: who proposes the tokens the target verifies."""

from .base import Draft, Drafter, NoDrafter
from .eagle import EagleDrafter
from .model import ModelDrafter
from .ngram import NgramDrafter

DRAFTERS = ("model", "eagle", "ngram", "none")  # the names Engine and load accept

__all__ = ["DRAFTERS", "Draft", "Drafter", "NoDrafter", "EagleDrafter", "ModelDrafter", "NgramDrafter"]
