"""Drafters: who proposes the tokens the target verifies."""

from .base import Draft, Drafter, NoDrafter
from .model import ModelDrafter
from .ngram import NgramDrafter

DRAFTERS = ("model", "ngram", "none")  # the names Engine and load accept

__all__ = ["DRAFTERS", "Draft", "Drafter", "NoDrafter", "ModelDrafter", "NgramDrafter"]
