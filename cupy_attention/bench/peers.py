"""torch SDPA as a peer: one backend forced per call (the rows beside ours)."""

from __future__ import annotations

from .cases import Case
from .timing import Unsupported


class TorchPeers:
    """The torch SDPA calls of :class:`Runner` (needs ``self.torch``, ``self.free_memory``)."""

    def _torch_sdpa(self, backend: str, case: Case):
        """torch SDPA forced onto one backend; Unsupported where it declines the case."""
        torch = self.torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        which = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                 "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend]
        gqa = {"enable_gqa": True} if case.heads_q != case.heads_kv else {}
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def fn(q, k, v):
            try:
                with sdpa_kernel(which):
                    return sdpa(q, k, v, is_causal=case.causal, **gqa)
            except RuntimeError as exc:
                if "No available kernel" in str(exc):
                    raise Unsupported(f"torch {backend} does not take this case") from None
                raise

        return fn

    def _torch_forward(self, backend: str, case: Case):
        sdpa = self._torch_sdpa(backend, case)

        def fn(q, k, v):
            with self.torch.no_grad():
                return sdpa(q, k, v)

        return fn
