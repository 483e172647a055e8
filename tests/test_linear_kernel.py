"""hinabench.kernels.linear (y = x W^T, the driver's single-matrix case) against the fp32 reference, on
every path this machine can run (native and emulated), the registry's projection shapes and random
shapes, with W in place (row strides that are and are not multiples of 4 KiB: the fused and the
piece paths)."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from hinabench import kernels
from hinabench.dtypes import get_dtype
from hinabench.problems import LinearProblem, rel_err

TOL = get_dtype("bf16").tolerance
PATHS = [p for p in ["scalar", "avx2", "avx512", "avx512-nobf16", "amx", "avx512-emulated", "amx-emulated",
                       "avx512-nobf16-emulated"]
         if kernels.isa_status(p)[0]]


def data(N, K, T, seed=0):
    return LinearProblem.custom(N, K, T, seed=seed).materialize(rotate=False)


def check(y, ref, what):
    assert y.dtype == torch.bfloat16 and tuple(y.shape) == tuple(ref.shape), what
    err = rel_err(y, ref)
    assert err <= 5e-3, f"{what}: rel err {err:.3g}"


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("N, K, T", [(64, 2048, 1), (96, 1536, 5), (32, 512, 33), (128, 4096, 3)])
def test_linear_matches_the_reference(isa, N, K, T):
    d = data(N, K, T)
    check(kernels.linear(d.x, d.w[0], isa=isa, threads=2), d.reference(0), f"{isa} N={N} K={K} T={T}")


@pytest.mark.parametrize("proj", ["qkv", "o"])
def test_registry_projection_shapes_on_avx2(proj):
    if "avx2" not in PATHS:
        pytest.skip("no AVX2 here")
    d = LinearProblem.create("qwen3-30b-a3b", proj, 4).materialize(rotate=False)
    check(kernels.linear(d.x, d.w[0], isa="avx2", threads=2), d.reference(0), proj)


def test_strided_weights_and_tokens_are_read_in_place():
    big = torch.randn(64, 2048 + 96).to(torch.bfloat16)
    w = big[:, 32:32 + 1024]                       # row stride 2144: not a multiple of 2048 (piece path)
    x = torch.randn(7, 1024 + 64).to(torch.bfloat16)[:, :1024]
    before = big.clone()
    ref = x.float() @ w.float().T
    for isa in PATHS:
        check(kernels.linear(x, w, isa=isa, threads=2), ref, isa)
    assert torch.equal(big, before)


@settings(max_examples=12, deadline=None)
@given(N=st.integers(1, 6), K=st.integers(1, 80), T=st.integers(1, 40), seed=st.integers(0, 99))
def test_random_shapes(N, K, T, seed):
    d = data(32 * N, 32 * K, T, seed)
    isa = "avx2" if "avx2" in PATHS else "scalar"
    check(kernels.linear(d.x, d.w[0], isa=isa, threads=2), d.reference(0), f"{isa} {32 * N}x{32 * K} T={T}")


@pytest.mark.parametrize("bad, msg", [
    (lambda x, w: (x, w[:, :100]), "multiples of 32"),
    (lambda x, w: (x.float(), w), "bfloat16"),
    (lambda x, w: (x, w.float()), "bfloat16"),
    (lambda x, w: (x[:, :64], w), r"x must be \[T, K=128\]"),
    (lambda x, w: (x, w.t()), "contiguous along K"),
])
def test_bad_input_is_a_clear_error(bad, msg):
    x = torch.ones(3, 128, dtype=torch.bfloat16)
    w = torch.ones(64, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=msg):
        kernels.linear(*bad(x, w))


@pytest.mark.parametrize("isa", PATHS)
def test_a_group_is_each_projection_bit_for_bit(isa):
    """linear_group (q, k, v on one x: one pack, one task list) returns exactly what separate linear
    calls return, with a matrix on the piece path (row stride not a multiple of 2048) in the group."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 1024, generator=g).to(torch.bfloat16)
    big = torch.randn(96, 1024 + 64, generator=g).to(torch.bfloat16)
    ws = [torch.randn(n, 1024, generator=g).to(torch.bfloat16) for n in (256, 32, 64)] + [big[:, 64:]]
    ys = kernels.linear_group(x, ws, isa=isa, threads=2)
    for w, y in zip(ws, ys):
        assert torch.equal(y, kernels.linear(x, w, isa=isa, threads=2)), isa
        check(y, x.float() @ w.float().T, isa)


@settings(max_examples=8, deadline=None)
@given(Ns=st.lists(st.integers(1, 5), min_size=1, max_size=4), K=st.integers(1, 40), T=st.integers(1, 9),
       seed=st.integers(0, 99))
def test_random_groups(Ns, K, T, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, 32 * K, generator=g).to(torch.bfloat16)
    ws = [torch.randn(32 * n, 32 * K, generator=g).to(torch.bfloat16) for n in Ns]
    isa = "avx2" if "avx2" in PATHS else "scalar"
    for w, y in zip(ws, kernels.linear_group(x, ws, isa=isa, threads=2)):
        check(y, x.float() @ w.float().T, f"{isa} {[32 * n for n in Ns]}x{32 * K} T={T}")


def test_a_group_with_differing_k_or_no_matrix_is_a_clear_error():
    x = torch.ones(2, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="same K"):
        kernels.linear_group(x, [torch.ones(32, 128, dtype=torch.bfloat16), torch.ones(32, 64, dtype=torch.bfloat16)])
    with pytest.raises(ValueError, match="at least one"):
        kernels.linear_group(x, [])


@pytest.mark.parametrize("T", [1, 5])
def test_threads_do_not_change_the_result(T):
    """1, 2 and 3 threads cut a different last round of tasks into quarters (moe_ffn.cpp's split_tail):
    the same rows, the same bits."""
    d = data(2048, 1024, T)
    for isa in [p for p in PATHS if "emulated" not in p]:
        one = kernels.linear(d.x, d.w[0], isa=isa, threads=1)
        for threads in (2, 3):
            assert torch.equal(one, kernels.linear(d.x, d.w[0], isa=isa, threads=threads)), (isa, threads)
