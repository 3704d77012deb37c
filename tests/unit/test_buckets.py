"""Buckets' per-parameter views and the multi-tensor calls built on them: the residual add of
error feedback and the write-back into ``p.grad`` give what one operation per parameter gave,
for every shape, dtype, layout and missing gradient a bucket meets."""
import torch

from horovod_gravac.buckets import Bucket, grouped_buckets, make_buckets, views_like
from horovod_gravac.error_feedback import add_into_slices


def _params():
    torch.manual_seed(0)
    shapes = [(4, 3), (), (0,), (2, 3, 5), (7,)]
    return [(f"p{i}", torch.nn.Parameter(torch.randn(s))) for i, s in enumerate(shapes)]


def test_views_like_shares_the_buffer_and_takes_each_shape():
    bucket = Bucket(0, _params())
    flat = torch.arange(bucket.numel, dtype=torch.float32)
    views = views_like(flat, bucket.params, bucket.offsets)
    for v, p, (s, e) in zip(views, bucket.params, bucket.offsets):
        assert v.shape == p.shape and torch.equal(v.reshape(-1), flat[s:e])
        if v.numel():
            assert v.data_ptr() == flat[s:e].data_ptr()   # a view, not a copy
    # a missing tensor (a frozen parameter's gradient) gets its 1-D slice
    like = list(bucket.params)
    like[3] = None
    views = views_like(flat, like, bucket.offsets)
    s, e = bucket.offsets[3]
    assert views[3].shape == (e - s,) and views[3].data_ptr() == flat[s:e].data_ptr()
    assert views[0].shape == (4, 3)


def test_add_into_slices_matches_one_add_per_parameter():
    bucket = Bucket(0, _params())
    grads = [torch.randn(p.shape, dtype=dt) for p, dt in
             zip(bucket.params, (torch.float16, torch.float32, torch.float32, torch.float64, torch.bfloat16))]
    grads[0] = torch.randn(3, 4).t()           # non-contiguous
    grads[3] = torch.randn(1, 2, 3, 5).to(memory_format=torch.channels_last).view(2, 3, 5)
    grads[4] = None                             # frozen: its slice is left alone
    buf = torch.randn(bucket.numel)
    want = buf.clone()
    for g, (s, e) in zip(grads, bucket.offsets):
        if g is not None:
            want[s:e] += 0.5 * g.reshape(-1).float()
    add_into_slices(buf, grads, bucket.offsets, alpha=0.5)
    assert torch.allclose(buf, want, rtol=0, atol=1e-6)


def test_write_grads_fills_every_trainable_grad_in_its_dtype_and_layout():
    named = _params()
    named.append(("conv", torch.nn.Parameter(torch.randn(2, 3, 4, 5))))   # a channels_last conv weight
    named[1] = ("p1", torch.nn.Parameter(torch.randn((), dtype=torch.float16)))   # half precision
    named[3] = ("p3", torch.nn.Parameter(torch.randn(2, 3, 5, dtype=torch.float64)))
    bucket = Bucket(0, named)
    params = bucket.params
    params[0].grad = torch.zeros(3, 4).t()                       # non-contiguous grad
    params[1].grad = torch.zeros((), dtype=torch.float16)
    params[2].grad = torch.zeros(0)
    params[3].grad = torch.zeros(2, 3, 5, dtype=torch.float64)
    params[4].requires_grad_(False)                              # frozen: its grad is the user's
    params[4].grad = torch.full((7,), 9.0)
    params[5].grad = torch.zeros(2, 3, 4, 5).to(memory_format=torch.channels_last)
    aggregated = torch.randn(bucket.numel)
    bucket.write_grads(aggregated)
    assert params[5].grad.is_contiguous(memory_format=torch.channels_last)
    for p, (s, e) in zip(params[:4] + params[5:], bucket.offsets[:4] + bucket.offsets[5:]):
        assert torch.equal(p.grad.reshape(-1).float(), aggregated[s:e].to(p.grad.dtype).float())
    assert params[0].grad.stride() == (1, 4)                     # written in place
    assert params[1].grad.dtype == torch.float16 and params[3].grad.dtype == torch.float64
    assert torch.equal(params[4].grad, torch.full((7,), 9.0))


def _typed(dtypes, n=6):
    return [(f"p{i}", torch.nn.Parameter(torch.zeros(n, dtype=dt))) for i, dt in enumerate(dtypes)]


def test_float64_parameters_never_share_a_bucket_with_others():
    """A bucket's values travel and are remembered in one dtype: float64 parameters get
    buckets of their own (value_dtype float64), the others stay together as before."""
    f32, f64, f16 = torch.float32, torch.float64, torch.float16
    named = _typed([f32, f32, f64, f64, f16, f32, f64])
    buckets = make_buckets(named, cap_bytes=2 ** 20)
    # reverse order; a switch between float64 and the rest starts a bucket, fp16 stays with float32
    assert [b.names for b in buckets] == [["p6"], ["p5", "p4"], ["p3", "p2"], ["p1", "p0"]]
    assert [b.value_dtype for b in buckets] == [f64, f32, f64, f32]
    assert [b.dtype for b in buckets] == [f64, None, f64, f32]
    # without float64, the layout is what the size cap alone makes
    plain = make_buckets(_typed([f32, f16, f32, f32]), cap_bytes=2 * 6 * 4)
    assert [b.names for b in plain] == [["p3", "p2"], ["p1", "p0"]]


def test_a_group_mixing_float64_with_others_becomes_two_buckets():
    f32, f64 = torch.float32, torch.float64
    named = _typed([f32, f64, f32, f32, f64])
    params = [p for _, p in named]
    listed = grouped_buckets(named, [[params[0], params[1], params[2]], [params[3]]], cap_bytes=2 ** 20)
    assert [b.names for b in listed] == [["p3"], ["p0", "p2"], ["p1"], ["p4"]]
    assert [b.value_dtype for b in listed] == [f32, f32, f64, f64]
    assert [b.index for b in listed] == [0, 1, 2, 3]
    counted = grouped_buckets(named, 2, cap_bytes=2 ** 20)   # chunks p0-p2 and p3-p4
    assert [b.names for b in counted] == [["p3"], ["p4"], ["p2", "p0"], ["p1"]]
    assert [b.index for b in counted] == [0, 1, 2, 3]
    # a float32-only grouping is unchanged
    assert [b.names for b in grouped_buckets(_typed([f32] * 4), 2, cap_bytes=2 ** 20)] == \
        [["p3", "p2"], ["p1", "p0"]]
