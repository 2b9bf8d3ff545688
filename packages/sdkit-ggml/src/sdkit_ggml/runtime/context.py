"""The ggml side of building one graph: two ``no_alloc`` contexts (compute tensors and the
graph itself in ``ctx``, weights in ``wctx``, each allocated later in its own buffer) and the
calls that create tensors in them.

``result_type`` states which ggml type each op produces; the compiler's shape-only builder
(``check()``) relies on it, so every real call verifies it against what ggml returned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sdkit_ggml.runtime import lib as L

if TYPE_CHECKING:
    from sdkit_ggml.runtime.lib import GgmlLib

Ne = tuple[int, int, int, int]

# A compute block is replaced once it has room for fewer tensors than this: more than any
# one ggml call creates.
BLOCK_SPARE = 4

# ops whose result has the type of their first tensor argument (layout and copies)
_SAME_TYPE = frozenset(
    {
        "ggml_reshape_4d",
        "ggml_view_4d",
        "ggml_permute",
        "ggml_cont",
        "ggml_transpose",
        "ggml_concat",
        "ggml_repeat_4d",
        "ggml_pad_ext",
        "ggml_set_inplace",
    }
)


def result_type(fn: str, first_type: int, args: tuple[Any, ...]) -> int:
    """The ggml type ``fn(ctx, *args)`` returns, given the type of its first tensor argument."""
    if fn == "ggml_cast":
        return int(args[1])
    if fn == "ggml_im2col":
        return int(args[-1])
    if fn == "ggml_argmax":
        return L.GGML_TYPE_I32
    if fn == "ggml_get_rows":
        return L.GGML_TYPE_I32 if first_type == L.GGML_TYPE_I32 else L.GGML_TYPE_F32
    if fn in _SAME_TYPE:
        return first_type
    return L.GGML_TYPE_F32


class GgmlContext:
    """The ggml contexts of one graph. ``free()`` releases them (the Program owns them once
    the graph is allocated).

    Weights go in ``wctx``, sized for ``capacity`` tensors (``Builder`` refuses more). Compute
    tensors go in blocks of ``capacity`` tensors, a new block opened whenever the current one
    is nearly full: how many a graph needs is known only once it is lowered (a chunked conv
    makes tensors in proportion to its output rows), and a full context is a ggml abort. The
    graph itself is made last (``new_graph``), sized for the tensors actually created."""

    def __init__(self, lib: GgmlLib, capacity: int) -> None:
        self.lib = lib
        self.capacity = capacity
        self.overhead = int(lib.ggml_tensor_overhead())
        self.blocks: list[int] = []  # compute contexts, the last one in use
        self.graph_ctx: int | None = None
        self.graph_size = 0
        self.wctx = lib.ggml_init(L.InitParams(self.overhead * capacity, None, True))
        if not self.wctx:
            raise MemoryError("ggml_init failed")
        self._open_block()

    @property
    def ctx(self) -> int:
        """The compute context new tensors go in: a fresh block when the last is nearly full."""
        ctx = self.blocks[-1]
        if self.lib.ggml_get_mem_size(ctx) - self.lib.ggml_used_mem(ctx) < BLOCK_SPARE * self.overhead:
            ctx = self._open_block()
        return ctx

    def _open_block(self) -> int:
        ctx = self.lib.ggml_init(L.InitParams(self.overhead * max(self.capacity, 2 * BLOCK_SPARE), None, True))
        if not ctx:
            self.free()
            raise MemoryError("ggml_init failed")
        self.blocks.append(ctx)
        return int(ctx)

    def tensor_count(self) -> int:
        """Tensors created in every context so far (compute and weights)."""
        used = sum(int(self.lib.ggml_used_mem(c)) for c in [*self.blocks, self.wctx])
        return -(-used // self.overhead)

    def new_graph(self) -> int:
        """The ggml graph of this context's tensors, in a context of its own sized for all of
        them (nodes and leafs are each at most every tensor)."""
        if self.graph_ctx is not None:
            raise RuntimeError("this context already has its graph")
        self.graph_size = self.tensor_count() + 16
        nbytes = self.lib.ggml_graph_overhead_custom(self.graph_size, False)
        self.graph_ctx = self.lib.ggml_init(L.InitParams(nbytes, None, True))
        if not self.graph_ctx:
            raise MemoryError("ggml_init failed")
        return int(self.lib.ggml_new_graph_custom(self.graph_ctx, self.graph_size, False))

    def call(self, fn: str, *args: Any) -> tuple[int, Ne, int]:
        """``fn(ctx, *args)``: the new tensor's pointer, ne and type (0 when ggml refused)."""
        ptr = getattr(self.lib, fn)(self.ctx, *args)
        if not ptr:
            return 0, (0, 0, 0, 0), L.GGML_TYPE_F32
        head = L.tensor_head(ptr)
        expected = result_type(fn, L.tensor_head(args[0]).type, args)
        if head.type != expected:
            # the shape-only builder of check() would disagree with this build: a bug, not bad input
            raise RuntimeError(f"{fn}: ggml returned type {head.type}, expected {expected}")
        ne = tuple(int(n) for n in head.ne)
        return int(ptr), (ne[0], ne[1], ne[2], ne[3]), int(head.type)

    def new_tensor(self, ggml_type: int, ne: Ne, *, weight: bool) -> int:
        """A tensor of the weight context (``weight``) or an input of the compute context."""
        ptr = self.lib.ggml_new_tensor_4d(self.wctx if weight else self.ctx, ggml_type, *ne)
        if not weight:
            self.lib.ggml_set_input(ptr)
        return int(ptr)

    def set_prec_f32(self, ptr: int) -> None:
        self.lib.ggml_flash_attn_ext_set_prec(ptr, L.GGML_PREC_F32)

    def set_mul_mat_prec_f32(self, ptr: int) -> None:
        self.lib.ggml_mul_mat_set_prec(ptr, L.GGML_PREC_F32)

    def free(self) -> None:
        for ctx in self.blocks:
            self.lib.ggml_free(ctx)
        self.blocks = []
        for attr in ("graph_ctx", "wctx"):
            ptr = getattr(self, attr, None)
            if ptr:
                self.lib.ggml_free(ptr)
                setattr(self, attr, None)
