"""Fake (meta) kernels and autograd for the torch.ops.flashattn.* ops.

The op schemas live in C++ (csrc/api/schema.h) and are the single source of truth: nothing
here repeats an argument list. fwd_kvcache (flash_attn_with_kvcache) mutates its caches and
has no autograd, as in flash-attn. The fake kernels read only the leading tensors; the autograd
glue matches forward inputs to backward arguments by their schema names.
"""
import torch

__all__ = []

_ops = torch.ops.flashattn


def _arg_names(op):
    return tuple(a.name for a in op._schema.arguments)


# ---------------------------------------------------------------------------------------------
# Fake kernels: shapes, dtypes and (contiguous) strides of what the real kernels return.
# ---------------------------------------------------------------------------------------------

def _bound(op, args, kwargs):
    """The arguments of a call of `op` by schema name, defaults filled in."""
    named = {a.name: a.default_value for a in op._schema.arguments if a.has_default_value()}
    named.update(zip(_arg_names(op), args))
    named.update(kwargs)
    return named


def _out_dtype(op, q, args, kwargs):
    """out's dtype (csrc/api/params_fill.h, out_scalar_type): the op's out_dtype where given
    (FP8), else bfloat16 for float8_e4m3fn inputs and q's dtype otherwise."""
    out_dtype = _bound(op, args, kwargs).get("out_dtype")
    if out_dtype is not None:
        return out_dtype
    return torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype


@torch.library.register_fake("flashattn::fwd")
def _fwd_fake(q, k, v, *options, **kw_options):
    # q (B, Sq, H, d), v (B, Sk, Hk, dv) -> out (B, Sq, H, dv) in q's dtype (FP8: out_dtype),
    # lse (B, H, Sq) fp32.
    batch, seqlen_q, nheads, _ = q.shape
    dtype = _out_dtype(_ops.fwd.default, q, (q, k, v, *options), kw_options)
    out = q.new_empty((batch, seqlen_q, nheads, v.shape[-1]), dtype=dtype)
    softmax_lse = q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)
    return out, softmax_lse


@torch.library.register_fake("flashattn::varlen_fwd")
def _varlen_fwd_fake(q, k, v, *options, **kw_options):
    # q (total_q, H, d), v (total_k, Hk, dv) -> out (total_q, H, dv), lse (H, total_q) fp32.
    total_q, nheads, _ = q.shape
    dtype = _out_dtype(_ops.varlen_fwd.default, q, (q, k, v, *options), kw_options)
    out = q.new_empty((total_q, nheads, v.shape[-1]), dtype=dtype)
    softmax_lse = q.new_empty((nheads, total_q), dtype=torch.float32)
    return out, softmax_lse


@torch.library.register_fake("flashattn::fwd_kvcache")
def _fwd_kvcache_fake(q, k_cache, v_cache, *options, **kw_options):
    # flash_attn_with_kvcache: the caches (k_cache, v_cache) are mutated in place (the schema's
    # alias annotations let torch.compile functionalize the op); out (q's dtype) and lse are
    # fresh.
    batch, seqlen_q, nheads, _ = q.shape
    out = q.new_empty((batch, seqlen_q, nheads, v_cache.shape[-1]))
    softmax_lse = q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)
    return out, softmax_lse


def _make_grads_fake(op):
    def grads_fake(dout, q, k, v, *options, **kw_options):
        # dq/dk/dv: fresh contiguous tensors with the shapes of q/k/v, in q's dtype; dsink fp32
        # (nheads,), or (0,) without a sink.
        sink = _bound(op, (dout, q, k, v, *options), kw_options)["learnable_sink"]
        dsink = q.new_empty((0,) if sink is None else sink.shape, dtype=torch.float32)
        return (*(x.new_empty(x.shape, dtype=q.dtype) for x in (q, k, v)), dsink)

    return grads_fake


@torch.library.register_fake("flashattn::attn_probs")
def _attn_probs_fake(q, k, v, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                     max_seqlen_k, *options, **kw_options):
    # S (B, H, round128(Sq), round128(Sk)) in q's dtype; varlen: the max_seqlen hints clamped
    # to the row counts, as the op does (torch.sym_min: a fake kernel runs under fake tensors,
    # not dynamo, and min() there would guard on the comparison).
    if cu_seqlens_q is None:
        batch, sq, nheads, sk = q.shape[0], q.shape[1], q.shape[2], k.shape[1]
    else:
        batch, nheads = cu_seqlens_q.shape[0] - 1, q.shape[1]
        sq, sk = torch.sym_min(max_seqlen_q, q.shape[0]), torch.sym_min(max_seqlen_k, k.shape[0])
    return q.new_empty((batch, nheads, (sq + 127) // 128 * 128, (sk + 127) // 128 * 128))


# ---------------------------------------------------------------------------------------------
# Autograd: fwd -> bwd and varlen_fwd -> varlen_bwd. Every forward input is kept under its
# schema name (tensors through save_for_backward, the rest on ctx); the backward op is called
# with the arguments of the same names, plus dout, out and softmax_lse. So `deterministic`, a
# forward argument unused by the forward kernels, reaches the backward inside the op graph.
# ---------------------------------------------------------------------------------------------

# The backward's outputs, in order: the gradients of these forward inputs.
_DIFFERENTIABLE = ("q", "k", "v", "learnable_sink")

# FP8 (issue 14) is forward only: the words of csrc/api/checks.h's kFp8ForwardOnly, which the
# backward ops raise too.
FP8_FORWARD_ONLY = (
    "flashattn: FP8 attention is forward only (issue 14): float8_e4m3fn q, k, v have no "
    "backward (call the forward under torch.no_grad(), or on tensors that do not require grad)")


def _make_setup_context(fwd_op):
    fwd_names = _arg_names(fwd_op)

    def setup_context(ctx, inputs, output):
        # `inputs` comes with defaulted arguments filled in, in schema order.
        named = dict(zip(fwd_names, inputs))
        out, softmax_lse = output
        ctx.mark_non_differentiable(softmax_lse)
        tensors = {n: x for n, x in named.items() if isinstance(x, torch.Tensor)}
        tensors.update(out=out, softmax_lse=softmax_lse)
        ctx.tensor_names = tuple(tensors)
        ctx.save_for_backward(*tensors.values())
        ctx.options = {n: x for n, x in named.items() if n not in tensors}

    return setup_context


def _make_backward(fwd_op, bwd_op):
    fwd_names = _arg_names(fwd_op)
    bwd_names = _arg_names(bwd_op)

    def backward(ctx, dout, _dsoftmax_lse):
        # softmax_lse is marked non-differentiable: its incoming gradient is ignored.
        named = dict(ctx.options)
        named.update(zip(ctx.tensor_names, ctx.saved_tensors))
        if named["q"].dtype == torch.float8_e4m3fn:
            raise NotImplementedError(FP8_FORWARD_ONLY)
        if named.get("block_table") is not None:
            raise NotImplementedError(
                "flashattn: the backward of paged KV (varlen_fwd with block_table) is not "
                "supported yet")
        named["dout"] = dout  # any strides: the op makes an expanded gradient contiguous
        grads = dict(zip(_DIFFERENTIABLE, bwd_op(**{n: named[n] for n in bwd_names})))
        if named.get("learnable_sink") is None:
            grads["learnable_sink"] = None  # the op's empty (0,) placeholder
        return tuple(grads.get(n) for n in fwd_names)

    return backward


def _register_autograd(fwd_op, bwd_op):
    """The Autograd-key kernel of a forward op: what torch.library.register_autograd builds
    (an autograd.Function whose forward redispatches below autograd), without its per-call
    torch._library.utils.fill_defaults, which re-reads the pybind schema's argument list per
    argument: 225 us of host time per forward call on our 25-argument schema (H100, torch
    2.11; 35 us without grad), more than the kernel of a 1k-token forward. The defaults the
    dispatcher leaves out are filled from a tuple read once here."""
    defaults = tuple(a.default_value if a.has_default_value() else None
                     for a in fwd_op._schema.arguments)
    if any(a.kwarg_only for a in fwd_op._schema.arguments):
        raise AssertionError(f"{fwd_op}: keyword-only arguments (not handled here)")
    setup_context = _make_setup_context(fwd_op)
    backward = _make_backward(fwd_op, bwd_op)
    after_autograd = torch._C._after_autograd_keyset

    def redispatch(keyset, args):
        with torch._C._AutoDispatchBelowAutograd():
            return fwd_op.redispatch(keyset & after_autograd, *args)

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args_and_keyset):
            args, keyset = args_and_keyset[:-1], args_and_keyset[-1]
            result = redispatch(keyset, args)
            ctx.n_args = len(args)
            setup_context(ctx, args + defaults[len(args):], result)
            return result

        @staticmethod
        def backward(ctx, *grads):
            # One gradient per schema argument; those the call passed, then None (keyset).
            return (*backward(ctx, *grads)[:ctx.n_args], None)

    Function.__name__ = Function.__qualname__ = f"Backward_{fwd_op._opname}"

    def autograd_kernel(keyset, *args):
        if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
            return Function.apply(*args, keyset)
        return redispatch(keyset, args)

    _lib.impl(fwd_op._opname, autograd_kernel, "Autograd", with_keyset=True)


_below_autograd = torch._C._AutoDispatchBelowAutograd


def call_forward(op, *args, **kwargs):
    """A call of the forward op `op` (torch.ops.flashattn.fwd / varlen_fwd), straight to the
    backend's kernel when no gradient can flow: the Autograd-key kernel above is Python, and
    entering it only to redispatch below autograd cost ~3-6 us of host time per call (the
    arguments boxed into Python and parsed again; 20.2 -> 17.1 us per CPU call of a tiny
    forward on the development machine). The condition is the Autograd kernel's own (grad
    mode on and an input requiring grad), so the result is the same; calls under
    torch.compile or a torch.func transform take the dispatcher's way."""
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active() or \
            (torch.is_grad_enabled() and torch._C._any_requires_grad(*args, **kwargs)):
        return op(*args, **kwargs)  # (is_compiling first: Dynamo cannot trace the others)
    with _below_autograd():
        return op.default(*args, **kwargs)


def _register_no_double_backward(bwd_op):
    # Without an autograd kernel, differentiating the backward is silently wrong (torch warns).
    def backward(ctx, *grads):
        raise NotImplementedError(
            f"flashattn: double backward (differentiating {bwd_op._name}) is not supported"
        )

    torch.library.register_autograd(bwd_op, backward)


# attn_probs (return_attn_probs' S) and fwd_kvcache have no backward (as in flash-attn): the
# former is called on detached inputs, the latter's outputs do not require grad. A mutating
# op cannot take register_autograd; a fallthrough at the Autograd key skips autograd.
_lib = torch.library.Library("flashattn", "IMPL")
_lib.impl("fwd_kvcache", torch.library.fallthrough_kernel, "Autograd")

torch.library.register_fake("flashattn::bwd", _make_grads_fake(_ops.bwd.default))
torch.library.register_fake("flashattn::varlen_bwd", _make_grads_fake(_ops.varlen_bwd.default))

_register_autograd(_ops.fwd.default, _ops.bwd.default)
_register_autograd(_ops.varlen_fwd.default, _ops.varlen_bwd.default)
_register_no_double_backward(_ops.bwd.default)
_register_no_double_backward(_ops.varlen_bwd.default)
