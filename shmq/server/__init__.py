"""The broker process (``shmq server``): TCP front, registry owner, housekeeper."""

from .housekeeper import Housekeeper

__all__ = ["Housekeeper"]
