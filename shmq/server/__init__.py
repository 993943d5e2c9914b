"""The broker process (``shmq server``): registry owner and housekeeper."""

from .housekeeper import Housekeeper

__all__ = ["Housekeeper"]
