"""The optional frameworks of tensors: torch (imported lazily, only where a call needs it)
and ml_dtypes (NumPy's bfloat16), and what each is asked for.  The only module of the
package that imports torch."""

from __future__ import annotations

import sys
import warnings
from typing import Any

import numpy as np

_no_torch = False  # an import of torch failed once: do not retry it on every load


def _torch() -> Any:
    """torch if importable (imported on first use), else None."""
    global _no_torch
    mod = sys.modules.get("torch")
    if mod is not None or _no_torch:
        return mod
    try:
        import torch
    except ImportError:
        _no_torch = True
        return None
    return torch


def _is_torch_tensor(value: object) -> bool:
    mod = sys.modules.get("torch")  # a torch tensor implies torch is imported
    return mod is not None and isinstance(value, mod.Tensor)


def _np_dtype(name: str) -> np.dtype[Any]:
    """The NumPy dtype of a tensor.v1 dtype name (bfloat16: ml_dtypes, else uint16 bits)."""
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            return np.dtype(np.uint16)
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _can_pin(torch: Any) -> bool:
    try:
        if torch.cuda.is_available():
            return True
        acc = getattr(torch, "accelerator", None)
        if acc is not None and acc.is_available():
            return True
    except Exception:  # a broken driver setup: behave as if there were none
        pass
    warnings.warn("pin_memory=True but torch has no accelerator; returning ordinary "
                  "(pageable) memory", stacklevel=5)
    return False
