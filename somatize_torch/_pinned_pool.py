"""The pinned staging pool: page-locked host buffers that copies between host and
device go through, kept for reuse because page-locking memory is slow, and within
a bound because memory locked is memory the rest of the machine cannot have.
Where the CUDA extension is built its buffers are exactly the size asked for;
torch's pinned allocator, used where it is not, rounds them up to a power of two.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

from somatize_torch._cuda_extension import cuda_extension

if TYPE_CHECKING:
    import torch

__all__ = ["PinnedPool", "PoolStats", "StagedCopy"]


@dataclass
class PoolStats:
    """Counters of a :class:`PinnedPool`."""

    allocations: int = 0
    reuses: int = 0
    evictions: int = 0
    overflows: int = 0


class _Block:
    __slots__ = ("capacity", "event", "pinned", "pooled", "tensor")

    def __init__(self, tensor: torch.Tensor, pinned: bool, pooled: bool) -> None:
        self.tensor = tensor
        self.capacity = int(tensor.numel())
        self.pinned = pinned
        self.pooled = pooled
        self.event: torch.cuda.Event | None = None


class StagedCopy:
    """A copy in flight. :meth:`wait` returns the destination tensor;
    :meth:`release` hands the staging buffer back to the pool.

    For :meth:`PinnedPool.to_host` the returned host tensor *is* the staging
    buffer: it stays valid until :meth:`release` (clone it to keep it longer).
    For :meth:`PinnedPool.to_device`, :meth:`wait` makes the current stream wait
    for the copy and the device tensor is the caller's; releasing early is safe.
    """

    def __init__(
        self,
        pool: PinnedPool,
        result: torch.Tensor,
        block: _Block | None,
        event: torch.cuda.Event | None,
        *,
        keep: torch.Tensor | None = None,
    ) -> None:
        self._pool = pool
        self._result = result
        self._block = block
        self._event = event
        self._keep = keep  # a caller's pinned source, referenced until the copy ends

    @property
    def pinned(self) -> bool:
        """Whether the copy went through page-locked memory."""
        return self._block is not None and self._block.pinned

    def ready(self) -> bool:
        """True when the copy has finished (never blocks)."""
        return self._event is None or bool(self._event.query())  # type: ignore[no-untyped-call]

    def wait(self) -> torch.Tensor:
        """The destination tensor, once it may be used: a host result after the copy
        has finished, a device result with the current stream ordered after it."""
        if self._event is not None:
            if self._result.is_cuda:
                import torch

                torch.cuda.current_stream(self._result.device).wait_event(self._event)
            else:
                self._event.synchronize()
        return self._result

    def release(self) -> None:
        """Hand the staging buffer back to the pool (idempotent)."""
        block, self._block = self._block, None
        if block is not None:
            self._pool._release(block, self._event)
        self._keep = None

    def __enter__(self) -> StagedCopy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class PinnedPool:
    """Bounded pool of reusable, exactly sized host staging buffers.

    On a machine with CUDA the buffers are page-locked (exact-size
    ``cudaHostAlloc`` through the native extension, or torch's pinned allocator
    when the extension is not available) and copies run on a side stream per
    device, each recording an event the caller waits on. Without CUDA the pool
    hands out plain host buffers and copies synchronously.

    ``max_bytes`` bounds the bytes the pool holds (in use plus idle). A free
    buffer is reused for a request of at most its size and at least 7/8 of it;
    idle buffers are dropped oldest first to make room. A request that cannot
    fit is served from a transient pageable buffer (counted in
    ``stats.overflows``).
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be non-negative")
        self.max_bytes = int(max_bytes)
        self.stats = PoolStats()
        self._lock = threading.Lock()
        self._free: list[_Block] = []  # oldest release first
        self._held = 0
        self._in_use = 0
        self._use_pinned: bool | None = None
        self._streams: dict[int, torch.cuda.Stream] = {}

    @property
    def held_bytes(self) -> int:
        """Bytes of pooled buffers, in use or idle."""
        return self._held

    @property
    def in_use_bytes(self) -> int:
        return self._in_use

    def clear(self) -> None:
        """Drop the idle buffers."""
        with self._lock:
            dropped, self._free = self._free, []
            for block in dropped:
                self._held -= block.capacity
        for block in dropped:
            if block.event is not None:
                block.event.synchronize()

    # -- buffers

    def _pinned_available(self) -> bool:
        import torch

        if self._use_pinned is None:
            self._use_pinned = bool(torch.version.cuda is not None and torch.cuda.is_available())
        # A child forked from a process that had started CUDA cannot use it (page-locking
        # memory there crashes the child): it stages its copies in ordinary memory.
        return self._use_pinned and not torch.cuda._is_in_bad_fork()

    @staticmethod
    def _allocate(nbytes: int, pinned: bool) -> torch.Tensor:
        import torch

        # An ordinary tensor even when asked for under `torch.inference_mode` (a validation
        # loop's): a block made there would be an inference tensor, and a later copy into
        # it, outside inference mode (a training step's rows), would be refused.
        with torch.inference_mode(False):
            if pinned:
                ext = cuda_extension()
                if ext is not None:
                    block: torch.Tensor = ext.pinned_empty(nbytes)
                    return block
                return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            return torch.empty(nbytes, dtype=torch.uint8)

    def _acquire(self, nbytes: int) -> _Block:
        pinned = self._pinned_available()
        if nbytes == 0:
            return _Block(self._allocate(0, False), pinned=False, pooled=False)
        reused: _Block | None = None
        budgeted = False
        victims: list[_Block] = []
        with self._lock:
            for block in self._free:
                fits = nbytes <= block.capacity and block.capacity - block.capacity // 8 <= nbytes
                if fits and (reused is None or block.capacity < reused.capacity):
                    reused = block
            if reused is not None:
                self._free.remove(reused)
                self._in_use += reused.capacity
                self.stats.reuses += 1
            elif nbytes <= self.max_bytes:
                while self._free and self._held + nbytes > self.max_bytes:
                    victim = self._free.pop(0)
                    self._held -= victim.capacity
                    self.stats.evictions += 1
                    victims.append(victim)
                if self._held + nbytes <= self.max_bytes:
                    self._held += nbytes
                    self._in_use += nbytes
                    self.stats.allocations += 1
                    budgeted = True
            if reused is None and not budgeted:
                self.stats.overflows += 1
        for victim in victims:  # a copy may still be running into an idle buffer
            if victim.event is not None:
                victim.event.synchronize()
        victims.clear()
        if reused is not None:
            if reused.event is not None:
                reused.event.synchronize()
                reused.event = None
            return reused
        if not budgeted:
            return _Block(self._allocate(nbytes, False), pinned=False, pooled=False)
        try:
            tensor = self._allocate(nbytes, pinned)
        except BaseException:  # an interrupt too: the bytes were never taken
            with self._lock:
                self._held -= nbytes
                self._in_use -= nbytes
            raise
        return _Block(tensor, pinned=pinned, pooled=True)

    def _release(self, block: _Block, event: torch.cuda.Event | None) -> None:
        if not block.pooled:
            return
        block.event = event
        with self._lock:
            self._in_use -= block.capacity
            self._free.append(block)

    def _side_stream(self, device: torch.device) -> torch.cuda.Stream:
        import torch

        index = device.index if device.index is not None else torch.cuda.current_device()
        with self._lock:
            stream = self._streams.get(index)
            if stream is None:
                stream = torch.cuda.Stream(device=index)  # type: ignore[no-untyped-call]
                self._streams[index] = stream
        return stream

    # -- copies

    def to_host(self, tensor: torch.Tensor) -> StagedCopy:
        """Copy ``tensor`` into a staging buffer; a CUDA source is copied on the side
        stream after the work already queued on the current stream."""
        import torch

        # Outside inference mode whatever the caller's: the blocks are reused across
        # calls, and a view of one made under it could not be written outside it.
        with torch.inference_mode(False):
            src = tensor.detach().resolve_conj().resolve_neg()
            nbytes = src.numel() * src.element_size()
            block = self._acquire(nbytes)
            event: torch.cuda.Event | None = None
            side: torch.cuda.Stream | None = None
            try:
                dst = block.tensor[:nbytes]
                if src.is_cuda and nbytes > 0:
                    current = torch.cuda.current_stream(src.device)
                    src = src.contiguous()
                    side = self._side_stream(src.device)
                    side.wait_stream(current)
                    with torch.cuda.stream(side):
                        dst.copy_(src.reshape(-1).view(torch.uint8), non_blocking=block.pinned)
                        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                        event.record(side)
                    src.record_stream(side)
                elif nbytes > 0:
                    dst.copy_(src.contiguous().reshape(-1).view(torch.uint8))
                result = dst.view(src.dtype).view(src.shape)
                return StagedCopy(self, result, block, event)
            except BaseException:
                # Interrupted (Ctrl-C) or failed: the buffer goes back to the pool, once a
                # copy queued into it with no event to wait on has finished.
                if side is not None and event is None:
                    side.synchronize()
                self._release(block, event)
                raise

    def to_device(
        self, host_tensor: torch.Tensor, device: torch.device | str | int | None = None
    ) -> StagedCopy:
        """Copy a host tensor to ``device`` (default: the current CUDA device) through
        a staging buffer, on the side stream; :meth:`StagedCopy.wait` orders the
        current stream after it. A CPU target gets a plain copy."""
        import torch

        if host_tensor.is_cuda:
            raise ValueError("to_device expects a host tensor")
        if device is None:
            target = torch.device("cuda", torch.cuda.current_device())
        elif isinstance(device, int):
            target = torch.device("cuda", device)
        else:
            target = torch.device(device)
        src = host_tensor.detach().resolve_conj().resolve_neg().contiguous()
        if target.type != "cuda":
            return StagedCopy(self, src.to(target, copy=True), None, None)
        if target.index is None:
            target = torch.device("cuda", torch.cuda.current_device())
        nbytes = src.numel() * src.element_size()
        current = torch.cuda.current_stream(target)
        result = torch.empty(src.shape, dtype=src.dtype, device=target)
        if nbytes == 0:
            return StagedCopy(self, result, None, None)
        block: _Block | None = None
        keep: torch.Tensor | None = None
        if src.is_pinned():
            staging = src.reshape(-1).view(torch.uint8)
            keep = src
        else:
            block = self._acquire(nbytes)
            with torch.inference_mode(False):  # a reused block, as in `to_host`
                staging = block.tensor[:nbytes]
                staging.copy_(src.reshape(-1).view(torch.uint8))
        side = self._side_stream(target)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            result.reshape(-1).view(torch.uint8).copy_(staging, non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(side)
        result.record_stream(side)
        return StagedCopy(self, result, block, event, keep=keep)
