"""Print the per-N wgmma wrappers of kernels/common/wgmma.cuh (the operand lists).

PTX names each accumulator register of wgmma.mma_async, so every N needs its own
asm statement; this script writes them. Paste its output over the generated block
in kernels/common/wgmma.cuh when adding an N:  python scripts/gen_wgmma.py
"""
NS = (64, 128, 192, 256)
out = []
for n in NS:
    r = n // 2
    regs = ",".join(f"%{i}" for i in range(r))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(r))
    out.append(f'#define CA_WG_REGS_{n} "{{{regs}}}"')
    out.append(f"#define CA_WG_OUTS_{n} {outs}")
    out.append(f"template <> struct Wgmma<{n}> {{")
    for ty in ("f16", "bf16"):
        inst = f'"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} " CA_WG_REGS_{n}'
        out.append(f"  __device__ __forceinline__ static void ss(float (&d)[{r}], u64 a, u64 b, int accumulate, {ty}) {{")
        out.append(f'    asm volatile("{{.reg .pred p; setp.ne.b32 p, %{r + 2}, 0; " {inst} ", %{r}, %{r + 1}, p, 1, 1, 0, 0;}}"')
        out.append(f'                 : CA_WG_OUTS_{n} : "l"(a), "l"(b), "r"(accumulate));')
        out.append("  }")
        out.append(f"  __device__ __forceinline__ static void rs(float (&d)[{r}], const u32 (&a)[4], u64 b, {ty}) {{")
        out.append(f'    asm volatile({inst} ", {{%{r},%{r + 1},%{r + 2},%{r + 3}}}, %{r + 4}, 1, 1, 1, 1;"')
        out.append(f'                 : CA_WG_OUTS_{n} : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));')
        out.append("  }")
    out.append("};")
print("\n".join(out))
