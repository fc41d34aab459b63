"""Where bf16 calls run on bf16 dot products with P rounded to bf16, derived from this CPU's
vendor and flags as the documentation states it (README, "Flash attention on the CPU"), not asked
of tilelab."""

import functools
import os


@functools.cache
def cpu_vendor_and_flags():
    """This CPU's vendor and feature flags, as Linux lists them ("", set() elsewhere)."""
    vendor, flags = "", frozenset()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == "vendor_id":
                    vendor = value.strip()
                elif key.strip() == "flags":
                    flags = frozenset(value.split())
    except OSError:
        pass
    return vendor, flags


def cpu_isa_capped_below_avx512():
    """TILELAB_MAX_CPU_ISA=avx2 or sse2: the kernels stop below AVX-512 (README, "Instruction
    sets")."""
    return os.environ.get("TILELAB_MAX_CPU_ISA") in ("avx2", "sse2")


def cpu_has_bf16_dot_products():
    """AVX-512 BF16 (vdpbf16ps) and VBMI (the fp8 widening), as the kernels require."""
    flags = cpu_vendor_and_flags()[1]
    return not cpu_isa_capped_below_avx512() and {"avx512_bf16", "avx512vbmi"} <= flags


def cpu_prefers_bf16_dot_products():
    """bf16 dot products on AMD CPUs that have them (twice the FMA rate); Intel's run them at half
    the FMA rate or less."""
    return cpu_vendor_and_flags()[0] == "AuthenticAMD" and cpu_has_bf16_dot_products()


def rounds_bf16_probabilities(kv_dtype="bfloat16", fp32_probabilities=False):
    """Whether a bf16 call with k/v of kv_dtype rounds P to bf16: bf16 k/v where the CPU prefers
    bf16 dot products, fp8 k/v wherever it has them; never with fp32_probabilities."""
    if fp32_probabilities:
        return False
    if kv_dtype == "bfloat16":
        return cpu_prefers_bf16_dot_products()
    return cpu_has_bf16_dot_products()


def cpu_streams_cache_rows():
    """x86-64-v3 (AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE) unless TILELAB_MAX_CPU_ISA=sse2: the CPUs
    whose decode runs on the paged kernel's streamed micro-kernels (docs/paged_attention.md)."""
    flags = cpu_vendor_and_flags()[1]
    x86_64_v3 = {"avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe"}
    return os.environ.get("TILELAB_MAX_CPU_ISA") != "sse2" and x86_64_v3 <= flags
