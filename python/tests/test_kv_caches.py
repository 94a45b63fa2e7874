"""KV cache geometry and registration without torch: numpy arrays and duck-typed tensors."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

from kvtier_vllm.errors import InvalidArgumentError
from kvtier_vllm.kv_caches import (
    ExpandableSegmentsError,
    allocate_host_kv_cache,
    build_registration,
    describe_host_tensor,
    layer_geometry,
    order_layers,
    parse_share_cuda,
)


class Duck:
    """A tensor stand-in: shape, stride() in elements, element_size(), data_ptr()."""

    def __init__(self, shape, stride, size=2, ptr=0x1000):
        self.shape, self._stride, self._size, self._ptr = shape, stride, size, ptr
        self.is_cuda = False

    def stride(self):
        return self._stride

    def element_size(self):
        return self._size

    def data_ptr(self):
        return self._ptr


def contiguous(shape):
    st, acc = [], 1
    for d in reversed(shape):
        st.append(acc)
        acc *= d
    return tuple(reversed(st))


def test_flash_attention_nhd_and_hnd():
    nb, bs, h, d = 10, 16, 4, 8
    g = layer_geometry(Duck((2, nb, bs, h, d), contiguous((2, nb, bs, h, d))))
    assert (g.layout, g.in_block, g.block_stride_bytes, g.v_offset_bytes) == ("flash_attn", "NHD", bs * h * d * 2, nb * bs * h * d * 2)
    # vLLM's HND: physical [2, nb, h, bs, d] seen through a permuted view.
    phys = contiguous((2, nb, h, bs, d))
    g = layer_geometry(Duck((2, nb, bs, h, d), (phys[0], phys[1], phys[3], phys[2], phys[4])))
    assert g.in_block == "HND"


def test_flashinfer_and_mla_and_padding():
    nb, bs, h, d = 10, 16, 4, 8
    g = layer_geometry(Duck((nb, 2, bs, h, d), contiguous((nb, 2, bs, h, d))))
    assert (g.layout, g.block_stride_bytes, g.v_offset_bytes) == ("flashinfer", 2 * bs * h * d * 2, bs * h * d * 2)
    g = layer_geometry(Duck((nb, bs, 576), (bs * 576 + 64, 576, 1)))
    assert (g.layout, g.regions, g.block_stride_bytes) == ("mla", 1, (bs * 576 + 64) * 2)


def test_refuses_non_contiguous_blocks_and_ambiguous_shapes():
    with pytest.raises(InvalidArgumentError, match="contiguous"):
        layer_geometry(Duck((2, 10, 16, 4, 8), (5120, 512, 32, 1, 4)))
    with pytest.raises(InvalidArgumentError, match="ambiguous"):
        layer_geometry(Duck((2, 2, 16, 4, 8), contiguous((2, 2, 16, 4, 8))))
    assert layer_geometry(Duck((2, 2, 16, 4, 8), contiguous((2, 2, 16, 4, 8))), layout="flashinfer").layout == "flashinfer"
    with pytest.raises(InvalidArgumentError, match="cannot tell"):
        layer_geometry(Duck((10, 16), (16, 1)))


def test_parse_share_cuda_formats():
    h = bytes(range(64))
    assert parse_share_cuda((3, h, 4096, 512, b"", 0, b"", False)) == (3, h, 4096, 512)
    assert parse_share_cuda((0, b"\x02c" + h, 4096, 0, b"", 0, b"", False))[1] == h
    with pytest.raises(ExpandableSegmentsError, match="expandable_segments:False"):
        parse_share_cuda((0, b"\x02e" + b"\0" * 40, 4096, 0, b"", 0, b"", False))
    with pytest.raises(InvalidArgumentError, match="unrecognized"):
        parse_share_cuda((0, b"\x02x" + h, 4096, 0, b"", 0, b"", False))


@pytest.mark.parametrize("layout", ["flash_attn", "flashinfer", "mla"])
@pytest.mark.parametrize("in_block", ["NHD", "HND"])
def test_host_cache_registration(layout, in_block):
    path = f"/dev/shm/kvtier-test-{uuid.uuid4().hex}"
    c = allocate_host_kv_cache(path, num_layers=3, num_blocks=8, block_size=4, num_heads=2, head_dim=8, layout=layout, in_block=in_block, block_pad_bytes=16)
    try:
        mla = layout == "mla"
        reg = build_registration(
            {f"model.layers.{i}.self_attn.attn": t for i, t in reversed(list(enumerate(c.layers)))},
            engine_id="e", model_id="m", dtype="float16", num_kv_heads=1 if mla else 2, head_dim=8, block_size=4, mla=mla,
        )
        assert reg["device"] == "host"
        assert reg["layoutVersion"] == 1, "the stored form's version, whatever the in-block order"
        assert reg.get("blockLayout") == (None if mla else in_block)
        offs = [layer["k"]["offsetBytes"] for layer in reg["layers"]]
        assert offs == sorted(offs), "layers in model order"
        assert all(layer["k"]["path"] == path for layer in reg["layers"])
        assert ("v" in reg["layers"][0]) is (not mla)
        # Block 3 of layer 1's K region is where the registration says.
        arr = c.layers[1].view(np.uint16)
        blk = arr[3] if mla else (arr[0, 3] if layout == "flash_attn" else arr[3, 0])
        blk[...] = 0xBEEF
        with open(path, "rb") as f:
            f.seek(reg["layers"][1]["k"]["offsetBytes"] + 3 * reg["blockStrideBytes"])
            raw = np.frombuffer(f.read(blk.size * 2), dtype=np.uint16)
        assert (raw == 0xBEEF).all()
    finally:
        c.close()
    assert not os.path.exists(path)


def test_registration_checks_the_model_shape():
    path = f"/dev/shm/kvtier-test-{uuid.uuid4().hex}"
    c = allocate_host_kv_cache(path, num_layers=2, num_blocks=8, block_size=4, num_heads=2, head_dim=8)
    try:
        with pytest.raises(InvalidArgumentError, match="tokens per block"):
            build_registration(c.layers, engine_id="e", model_id="m", dtype="float16", num_kv_heads=2, head_dim=8, block_size=8)
        # What the scheduler assumes does not matter: the tensors' own order is registered.
        reg = build_registration(c.layers, engine_id="e", model_id="m", dtype="float16", num_kv_heads=2, head_dim=8, block_size=4, kv_layout="HND")
        assert (reg["layoutVersion"], reg["blockLayout"]) == (1, "NHD")
        with pytest.raises(InvalidArgumentError, match="kv layout must be one of"):
            build_registration(c.layers, engine_id="e", model_id="m", dtype="float16", num_kv_heads=2, head_dim=8, block_size=4, kv_layout="XYZ")
        with pytest.raises(InvalidArgumentError, match="shared-memory file"):
            describe_host_tensor(np.zeros(16))
    finally:
        c.close()


def test_order_layers():
    assert [n for n, _ in order_layers({"l.10.a": 1, "l.2.a": 2, "l.1.a": 3})] == ["l.1.a", "l.2.a", "l.10.a"]
    assert [n for n, _ in order_layers({"b": 1, "a": 2})] == ["b", "a"]
