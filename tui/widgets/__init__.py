"""The chat screen's widgets."""

from .header import PairHeader
from .history import ChatHistory
from .pane import AnswerPane

__all__ = ["PairHeader", "ChatHistory", "AnswerPane"]
