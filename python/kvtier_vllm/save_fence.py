"""Save fences: a worker cancels a SAVE the sidecar may not have read yet, without waiting.

The sidecar reads a SAVE's blocks out of the engine's KV cache itself, some time after the worker
sent it. Before the engine may reuse those blocks (a preempted request's, a finished request's
whose free was delayed), that read must be over or must never count. A fence makes the second
possible at once, whatever the sidecar is doing (frozen, killed, its disk stalled):

- the worker owns a small shared-memory *state file* of u32 words, registered with its KV caches
  (``stateFile``); each SAVE in flight holds one slot, set to a fresh *ticket* before the SAVE is
  sent and named in it (docs/protocol.md 4.9, ``fenceSlot``/``fenceTicket``);
- to cancel, the worker writes another value into the slot (:meth:`SaveFences.cancel`) and may
  reuse the blocks right away;
- the sidecar copies nothing when the word differs before its copy, and stores nothing when it
  differs after the copy completed. A copy that read reused bytes finished after the engine's
  cancel was visible (the cancel is published before the engine writes into the blocks), so its
  check sees the cancel and the bytes are thrown away; a copy the check lets through finished
  before any reuse.

Tickets are ``(sequence << 2) | 1`` (cancelled: ``| 3``); a slot is reused with a new sequence, so
a SAVE read after its slot moved on to another SAVE sees a word that is not its ticket. Words are
written whole (aligned 4-byte stores); a torn write could only show a value that is not the
ticket, which reads as cancelled. Standard library only.
"""

from __future__ import annotations

import mmap
import os
import threading
import uuid

__all__ = ["SaveFences", "DEFAULT_SLOTS"]

#: Slots of a state file: SAVEs a worker may have in flight with a fence at once.
DEFAULT_SLOTS = 4096
_PENDING, _CANCELLED = 1, 3
_SEQ_MASK = (1 << 30) - 1


class SaveFences:
    """One worker's state file and its slots (see the module).

    :param directory: where the file is made (``/dev/shm``: memory the sidecar maps too).
    :param slots: words in the file, 1..16M.
    :raises OSError: when the file cannot be made.
    """

    def __init__(self, directory: str = "/dev/shm", slots: int = DEFAULT_SLOTS) -> None:
        if not isinstance(slots, int) or not 1 <= slots <= 1 << 24:
            raise ValueError(f"slots must be an integer in [1, 2^24], got {slots!r}")
        self.slots = slots
        self.path = os.path.join(directory, f"kvtier-fences-{os.getpid()}-{uuid.uuid4().hex[:12]}")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, 4 * slots)
            self._map = mmap.mmap(fd, 4 * slots)
        except BaseException:
            os.close(fd)
            os.unlink(self.path)
            raise
        os.close(fd)
        self._words = memoryview(self._map).cast("I")
        self._free = list(range(slots - 1, -1, -1))
        self._seq = 0
        # A release of this lock followed by an acquire orders the cancel before every later
        # memory access of this thread (a store barrier on every CPU kvtier runs on).
        self._barrier = threading.Lock()
        self._closed = False

    @property
    def spec(self) -> dict:
        """The registration's ``stateFile``: ``{"path", "slots"}``."""
        return {"path": self.path, "slots": self.slots}

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def arm(self) -> tuple[int, int] | None:
        """A slot set to a fresh ticket for a SAVE about to be sent: ``(slot, ticket)``; None when
        every slot is in use (the SAVE then goes without a fence)."""
        if self._closed or not self._free:
            return None
        slot = self._free.pop()
        self._seq = (self._seq + 1) & _SEQ_MASK
        ticket = (self._seq << 2) | _PENDING
        self._words[slot] = ticket
        return slot, ticket

    def take(self) -> int | None:
        """A slot set to 0 for another use of the file: a layer-wise LOAD's progress word, which
        the sidecar raises as the load's layers land (docs/protocol.md 4.9, ``progressSlot``).
        None when every slot is in use. Free it with :meth:`release` once the LOAD settled."""
        if self._closed or not self._free:
            return None
        slot = self._free.pop()
        self._words[slot] = 0
        self._publish()
        return slot

    def cancel(self, slot: int, ticket: int) -> None:
        """Cancels the SAVE holding ``slot``: from the moment this returns, the sidecar copies
        and stores nothing of it, and the engine may reuse its blocks. Frees the slot."""
        if self._closed:
            return
        if self._words[slot] == ticket:
            self._words[slot] = ticket | _CANCELLED
        self._publish()
        self._free.append(slot)

    def release(self, slot: int) -> None:
        """Frees the slot of a SAVE the sidecar answered (its word is left as it is)."""
        if not self._closed:
            self._free.append(slot)

    def word(self, slot: int) -> int:
        """The slot's word now (a progress word; tests and diagnostics)."""
        return int(self._words[slot])

    def _publish(self) -> None:
        with self._barrier:
            pass
        with self._barrier:
            pass

    def close(self) -> None:
        """Removes the file. SAVEs still fenced read as cancelled from then on (a sidecar that
        mapped the file keeps its pages, whose words are never made to match again). Idempotent."""
        if self._closed:
            return
        for slot in range(self.slots):
            w = int(self._words[slot])
            if w & 3 == _PENDING:
                self._words[slot] = w | _CANCELLED
        self._publish()
        self._closed = True
        self._words.release()
        self._map.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
