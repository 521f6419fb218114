"""Naming an autotuner's pick (krex/bench/choices.py): the bench's `choice`, the check's winner."""

from __future__ import annotations

from krex.bench.choices import KERNEL_NAME_CHARS, inductor_winner, kernel_names

# Shapes of Inductor's generated wrapper code (torch 2.11): cuBLAS through extern_kernels, or a
# Triton template whose constexprs and launch name the configuration.
ATEN = """
def call(args):
    arg0_1, arg1_1 = args
    buf0 = empty_strided_cuda((4096, 4096), (4096, 1), torch.float16)
    extern_kernels.mm(arg0_1, arg1_1, out=buf0)
    return (buf0, )
"""
TEMPLATE = """
@triton.jit
def triton_tem_fused_mm_0(arg_A, arg_B, out_ptr0):
    GROUP_M : tl.constexpr = 8
    EVEN_K : tl.constexpr = True
    ALLOW_TF32 : tl.constexpr = False
    BLOCK_M : tl.constexpr = 128
    BLOCK_N : tl.constexpr = 256
    BLOCK_K : tl.constexpr = 64
    acc_type : tl.constexpr = tl.float32
''', device_str='cuda')
...
        triton_tem_fused_mm_0.run(arg0_1, arg1_1, buf0, grid=(512, 1, 1), num_stages=3, num_warps=8)
"""


def test_inductors_pick_is_aten_or_the_templates_configuration() -> None:
    assert inductor_winner(ATEN) == "aten mm"
    assert inductor_winner(ATEN.replace("extern_kernels.mm(", "extern_kernels.bmm(")) == "aten mm"
    addmm = ATEN.replace("extern_kernels.mm(", "extern_kernels.addmm(arg2_1, ")
    assert inductor_winner(addmm) == "aten addmm"
    got = inductor_winner(TEMPLATE)
    assert got == (
        "template ALLOW_TF32=False,BLOCK_K=64,BLOCK_M=128,BLOCK_N=256,EVEN_K=True,GROUP_M=8 "
        "stages,warps=[('3', '8')]"
    )
    # another configuration names differently: the report compares the names
    assert (
        inductor_winner(
            TEMPLATE.replace("BLOCK_N : tl.constexpr = 256", "BLOCK_N : tl.constexpr = 128")
        )
        != got
    )


def test_kernel_names_are_distinct_sorted_and_cut() -> None:
    long = "sm90_xmma_fprop_implicit_gemm_" + "x" * 500
    got = kernel_names(["void at::native::relu_kernel", long, "void at::native::relu_kernel"])
    assert got == f"{long[:KERNEL_NAME_CHARS]} | void at::native::relu_kernel"
    assert kernel_names([]) == ""
