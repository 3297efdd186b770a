"""The chat screen's widgets."""

from .header import PairHeader
from .history import ChatHistory
from .pane import AnswerPane
from .prompt import PromptInput

__all__ = ["PairHeader", "ChatHistory", "AnswerPane", "PromptInput"]
