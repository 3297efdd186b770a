"""The CPU harness itself: the wrapping matches MLX's, and Metal built-ins behave as on the GPU."""

import shutil

import mlx.core as mx
import numpy as np
import pytest

from mlxspec.kernels.emulator import EmulatedKernel, write_signature

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the kernel harness needs g++")


def test_signature_follows_mlx_conventions():
    # small inputs go to `constant`, 0-d inputs by reference, _shape/_ndim only when used,
    # attributes in MLX's order, template parameters typed by kind.
    src = "uint i = thread_position_in_grid.x; int n = a_shape[0] + a_ndim; out[i] = a[i] * s; (void)simdgroup_index_in_threadgroup;"
    k = EmulatedKernel(name="sig", input_names=["a", "s", "big"], output_names=["out"], source=src)
    code = write_signature("custom_kernel_sig", "", src, k.input_names,
                           [mx.zeros((4,)), mx.array(2.0), mx.zeros((8,))], k.output_names, [mx.float32],
                           [("T", mx.float16), ("N", 3), ("B", True)], k.attributes, k.shape_infos)
    assert code.startswith("template <typename T, int N, bool B>\n[[kernel]] void custom_kernel_sig(\n")
    assert "  const constant float* a [[buffer(0)]],\n" in code
    assert "  const constant int* a_shape [[buffer(1)]],\n" in code
    assert "  const constant int& a_ndim [[buffer(2)]],\n" in code
    assert "  const constant float& s [[buffer(3)]],\n" in code
    assert "  const device float* big [[buffer(4)]],\n" in code
    assert "  device float* out [[buffer(5)]],\n" in code
    assert code.index("simdgroup_index_in_threadgroup [[") < code.index("thread_position_in_grid [[")
    assert "big_shape" not in code and "a_strides" not in code


def test_simd_collectives_and_threadgroup_memory():
    src = """
      threadgroup float shared[64];
      const uint i = thread_position_in_grid.x;
      const uint lane = thread_index_in_simdgroup;
      float v = x[i];
      shared[thread_index_in_threadgroup] = v;
      threadgroup_barrier(mem_flags::mem_threadgroup);
      out[i * 6 + 0] = simd_sum(v);
      out[i * 6 + 1] = simd_prefix_exclusive_sum(v);
      out[i * 6 + 2] = simd_shuffle_xor(v, 5);
      out[i * 6 + 3] = simd_max(v);
      out[i * 6 + 4] = simd_broadcast(v, 3);
      out[i * 6 + 5] = shared[(thread_index_in_threadgroup + 1) % threads_per_threadgroup.x];  // a neighbour's write
      (void)lane;
    """
    k = EmulatedKernel(name="simd", input_names=["x"], output_names=["out"], source=src)
    x = np.arange(128, dtype=np.float32) % 37
    (out,) = k(inputs=[mx.array(x)], grid=(128, 1, 1), threadgroup=(64, 1, 1), output_shapes=[(128, 6)],
               output_dtypes=[mx.float32])
    out = np.array(out)
    g = x.reshape(4, 32)
    np.testing.assert_array_equal(out[:, 0], np.repeat(g.sum(1), 32))
    np.testing.assert_array_equal(out[:, 1], (np.cumsum(g, 1) - g).ravel())
    np.testing.assert_array_equal(out[:, 2], x[np.arange(128) ^ 5])
    np.testing.assert_array_equal(out[:, 3], np.repeat(g.max(1), 32))
    np.testing.assert_array_equal(out[:, 4], np.repeat(g[:, 3], 32))
    tg = x.reshape(2, 64)
    np.testing.assert_array_equal(out[:, 5], np.roll(tg, -1, axis=1).ravel())


def test_half_and_bfloat_inputs_and_partial_groups():
    src = "uint i = thread_position_in_grid.x; out[i] = static_cast<float>(x[i]) * 2.0f; last[0] = threads_per_threadgroup.x;"
    k = EmulatedKernel(name="cast", input_names=["x"], output_names=["out", "last"], source=src)
    for dtype in (mx.float16, mx.bfloat16):
        x = mx.array(np.linspace(-3, 3, 100, dtype=np.float32)).astype(dtype)
        out, last = k(inputs=[x], template=[("T", dtype)], grid=(100, 1, 1), threadgroup=(64, 1, 1),
                      output_shapes=[(100,), (1,)], output_dtypes=[mx.float32, mx.uint32])
        assert mx.array_equal(out, x.astype(mx.float32) * 2)
        assert last.item() in (36, 64)  # groups run in order: the last (partial) group has 36 threads


def test_divergent_barrier_is_an_error_not_a_hang():
    src = """
      if (thread_index_in_threadgroup < 16) threadgroup_barrier(mem_flags::mem_threadgroup);
      out[thread_position_in_grid.x] = 1.0f;
    """
    k = EmulatedKernel(name="div", input_names=["x"], output_names=["out"], source=src)
    with pytest.raises(RuntimeError, match="deadlock|barrier"):
        k(inputs=[mx.zeros((64,))], grid=(64, 1, 1), threadgroup=(64, 1, 1), output_shapes=[(64,)],
          output_dtypes=[mx.float32])


def test_unwritten_outputs_are_poisoned():
    k = EmulatedKernel(name="lazy", input_names=["x"], output_names=["out"],
                       source="if (thread_position_in_grid.x == 0) out[0] = x[0];")
    (out,) = k(inputs=[mx.ones((4,))], grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],
               output_dtypes=[mx.float32])
    out = np.array(out)
    assert out[0] == 1 and np.isnan(out[1:]).all()
