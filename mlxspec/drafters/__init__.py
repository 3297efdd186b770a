"""Drafters: who proposes the tokens the target verifies."""

from ..choices import DRAFTERS
from .base import Draft, Drafter, NoDrafter
from .eagle import EagleDrafter
from .model import ModelDrafter
from .ngram import NgramDrafter


__all__ = ["DRAFTERS", "Draft", "Drafter", "NoDrafter", "EagleDrafter", "ModelDrafter", "NgramDrafter"]
