"""Writes the wgmma wrappers of fastnf4/ops/matmul/wgmma.cu (one per x-rows-per-block BM and input dtype: the
m64nBMk16 instruction with A from registers has BM / 2 accumulator operands, too many to write by hand).
usage: python -m fastnf4.ops.matmul.gen_wgmma  (prints the block, to paste into wgmma.cu;
tests/ops/matmul/test_matmul.py checks the source holds it). Imports nothing: the package does not use it at run time."""


def wrappers() -> str:
    out = []
    for n in (8, 16, 32, 64, 128, 256):
        nacc = n // 2
        a = nacc
        for ty, tn in (("bf16", "__nv_bfloat16"), ("f16", "__half")):
            out.append(f"template <> struct Wgmma<{tn}, {n}> {{")
            out.append(f"  static __device__ __forceinline__ void run(float (&d)[{nacc}], uint32_t a0, uint32_t a1, "
                       "uint32_t a2,")
            out.append("                                              uint32_t a3, uint64_t desc) {")
            out.append("    asm volatile(")
            out.append(f"        \"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{a + 5}, 0;\\n\"")
            out.append(f"        \"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} \"")
            for i in range(0, nacc, 16):
                chunk = ",".join(f"%{j}" for j in range(i, min(nacc, i + 16)))
                pre = "{" if i == 0 else ""
                post = "}, " if i + 16 >= nacc else ","
                out.append(f"        \"{pre}{chunk}{post}\"")
            out.append(f"        \"{{%{a},%{a + 1},%{a + 2},%{a + 3}}}, %{a + 4}, p, 1, 1, 0;\\n}}\\n\"")
            for i in range(0, nacc, 8):
                regs = ", ".join(f"\"+f\"(d[{j}])" for j in range(i, min(nacc, i + 8)))
                out.append(f"        {':' if i == 0 else ' '} {regs}{',' if i + 8 < nacc else ''}")
            out.append("        : \"r\"(a0), \"r\"(a1), \"r\"(a2), \"r\"(a3), \"l\"(desc), \"r\"(1));")
            out.append("  }")
            out.append("};")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(wrappers(), end="")
