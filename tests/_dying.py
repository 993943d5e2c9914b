"""A kill between any two of a writer's stores to shared memory, played out in one
process: the writer's words (a handle's ``_mq``) die at a chosen store."""

__all__ = ["Killed", "DyingWords", "killed_at_each_store"]


class Killed(Exception):
    """The writer died here (before this store)."""


class DyingWords:
    """Words that raise Killed at their ``left``-th store."""

    def __init__(self, mq, left):
        self.mq, self.left = mq, left

    def __getitem__(self, i):
        return self.mq[i]

    def __setitem__(self, i, v):
        if self.left == 0:
            raise Killed
        self.left -= 1
        self.mq[i] = v


def killed_at_each_store(handle, step):
    """Run ``step()`` once per store it makes to ``handle._mq``, killed before that store;
    yield the store's number after each kill (``handle``'s words back for the check), then
    None after a whole run."""
    mq, k = handle._mq, 0
    while True:
        handle._mq = DyingWords(mq, k)
        try:
            step()
        except Killed:
            handle._mq = mq
            yield k
            k += 1
            continue
        finally:
            handle._mq = mq
        yield None
        return
