"""Out of device memory: the entry points raise OutOfMemoryError (an AttentionError
and a MemoryError) for an allocator's out-of-memory, and let every other error
through unchanged. CPU: the translation; GPU (tests/test_gpu_faults.py): a real one."""
import pytest

from cupy_attention.errors import AttentionError, OutOfMemoryError, ShapeError, translate_oom


class OutOfMemoryError_(MemoryError):
    pass


OutOfMemoryError_.__name__ = "OutOfMemoryError"   # as CuPy's and torch's are named


def test_allocator_oom_becomes_typed():
    @translate_oom
    def f():
        raise OutOfMemoryError_("Out of memory allocating 1,024 bytes")
    with pytest.raises(OutOfMemoryError, match="ran out of memory") as info:
        f()
    assert isinstance(info.value, AttentionError) and isinstance(info.value, MemoryError)
    assert isinstance(info.value.__cause__, OutOfMemoryError_)


@pytest.mark.parametrize("exc", [ShapeError("q"), ValueError("x"), MemoryError("host")])
def test_other_errors_pass_unchanged(exc):
    @translate_oom
    def f():
        raise exc
    with pytest.raises(type(exc)) as info:
        f()
    assert info.value is exc
