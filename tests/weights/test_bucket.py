import pytest
import torch
from weights_procs import same_bits, tiny_state_dict

from asyncrl.engine.bucket_layout import BucketLayout, parse_dtype
from asyncrl.engine.bucket_layout import unflatten
from asyncrl.weights.bucket import drain, flatten, iter_buckets


def test_round_trip_is_bit_exact_in_several_one_dtype_buckets():
    sd = tiny_state_dict()
    sd["empty"] = torch.zeros(0, 3)
    sd["flags"] = torch.tensor([True, False, True])
    buckets = list(iter_buckets(sd.items(), bucket_bytes=1024))
    assert len(buckets) > 3
    got = {}
    for flat, layout in buckets:
        assert flat.dtype == torch.uint8 and flat.numel() == layout.nbytes
        assert len(set(layout.dtypes)) == 1  # one dtype per bucket -> every offset aligned
        assert layout.nbytes <= 1024 or len(layout.names) == 1  # only a lone big tensor may exceed it
        got.update(unflatten(flat, layout))
    assert sorted(got) == sorted(sd)
    for name, t in sd.items():
        assert same_bits(got[name], t), name


def test_buckets_cast_floating_tensors_to_the_push_dtype_and_keep_the_rest():
    sd = {"w": torch.randn(4, 3), "b": torch.randn(3), "step": torch.tensor([7, 8]), "w16": torch.randn(2).half()}
    buckets = list(iter_buckets(sd.items(), bucket_bytes=1 << 20, dtype=torch.bfloat16))
    got = {}
    for flat, layout in buckets:
        got.update(unflatten(flat, layout))
    assert {n: t.dtype for n, t in got.items()} == {"w": torch.bfloat16, "b": torch.bfloat16, "step": torch.int64,
                                                    "w16": torch.bfloat16}
    for name in ("w", "b", "w16"):
        assert torch.equal(got[name], sd[name].to(torch.bfloat16)), name  # the same rounding as a plain cast
    assert torch.equal(got["step"], sd["step"])
    sizes = {tuple(layout.names): layout.nbytes for _, layout in buckets}
    assert sizes[("w", "b")] == 15 * 2  # sized in the pushed dtype


def test_a_bucket_refuses_mixed_dtypes():
    with pytest.raises(ValueError, match="one dtype per bucket"):
        flatten([("a", torch.zeros(2)), ("b", torch.zeros(2, dtype=torch.float64))])


def test_layout_matches_sglang_flattened_bucket():
    a, b = torch.randn(3, 2), torch.randn(5)
    flat, layout = flatten([("a", a), ("b", b)])
    assert layout.offsets == [0, 24] and layout.nbytes == 44 and layout.shapes == [[3, 2], [5]]
    assert layout.dtypes == ["float32", "float32"]
    assert torch.equal(flat, torch.cat([a.flatten().view(torch.uint8), b.view(torch.uint8)]))


def _layout(**kw) -> BucketLayout:
    base = dict(names=["a", "b"], dtypes=["float32", "float32"], shapes=[[2], [3]], offsets=[0, 8], nbytes=20)
    return BucketLayout(**{**base, **kw})


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(names=[], dtypes=[], shapes=[], offsets=[], nbytes=0), "empty weight bucket"),
        (dict(dtypes=["float32", "torch.float32"]), "unknown bucket dtype 'torch.float32'"),
        (dict(dtypes=["float32", "complex64"]), "unknown bucket dtype"),
        (dict(shapes=[[2], [-3]]), "negative"),
        (dict(dtypes=["float32", "bfloat16"], offsets=[0, 9], nbytes=15), "not a multiple"),
        (dict(offsets=[0, 12], nbytes=24), "expected 8"),
        (dict(nbytes=24), "nbytes=24"),
        (dict(offsets=[0]), "every list needs one entry"),
        (dict(names=["a", "a"]), "unique"),
    ],
)
def test_validation_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        _layout(**kw).validate()


def test_size_limit_and_buffer_mismatch():
    with pytest.raises(ValueError, match="exceeds the limit"):
        _layout().validate(max_nbytes=16)
    with pytest.raises(ValueError, match="layout needs uint8"):
        unflatten(torch.zeros(19, dtype=torch.uint8), _layout())
    with pytest.raises(ValueError, match="unknown bucket dtype"):
        parse_dtype("float")


def test_unsupported_dtype_and_bad_size_are_refused_before_any_bucket():
    with pytest.raises(TypeError, match="cannot travel"):
        list(iter_buckets([("a", torch.zeros(2)), ("c", torch.zeros(2, dtype=torch.complex64))], 1 << 20))
    with pytest.raises(ValueError, match="bucket_bytes"):
        list(iter_buckets([("a", torch.zeros(2))], 0))


def test_drain_consumes_the_stream():
    seen = []
    drain((seen.append(i) or ("x", torch.zeros(1))) for i in range(3))
    assert seen == [0, 1, 2]


def test_unflatten_gives_views_of_each_run_of_one_dtype():
    """Runs of one dtype become one typed view split in C++; every tensor is still a view of the flat buffer
    with its own values, whatever dtype follows it (a layout may mix dtypes: SGLang's does)."""
    parts = [("c", torch.tensor([1, -2], dtype=torch.int64)), ("a", torch.arange(6, dtype=torch.float32).view(2, 3)),
             ("b", torch.tensor(7.5)), ("e", torch.full((2, 2), -1.25)), ("d", torch.ones(3, dtype=torch.bfloat16) / 3)]
    raw = [t.reshape(-1).view(torch.uint8) for _, t in parts]
    offsets, off = [], 0
    for r in raw:
        offsets.append(off)
        off += r.numel()
    flat = torch.cat(raw)
    layout = BucketLayout(names=[n for n, _ in parts], dtypes=[str(t.dtype).removeprefix("torch.") for _, t in parts],
                          shapes=[list(t.shape) for _, t in parts], offsets=offsets, nbytes=off)
    got = unflatten(flat, layout)
    assert [n for n, _ in got] == ["c", "a", "b", "e", "d"]
    for (_, want), (_, t) in zip(parts, got, strict=True):
        assert t.dtype == want.dtype and t.shape == want.shape and torch.equal(t, want)
        assert t.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()  # a view, no copy
    flat[16:20].view(torch.float32).fill_(9.0)  # a's first element, after c's 16 bytes
    assert got[1][1][0, 0] == 9.0
    assert [n for n, _ in unflatten(flat, layout, validated=True)] == ["c", "a", "b", "e", "d"]
