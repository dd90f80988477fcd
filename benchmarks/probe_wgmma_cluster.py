"""Split-K summed by thread block clusters in the wgmma kernel (wgmma.cu cluster_sum) against the second kernel
(splitk_sum), on every model weight of >= 8 MB whose default plan at M splits every row tile: each variant first
checked on fresh data with a poisoned output (error against a float64 product with the dequantized weight within 2x
cuBLAS's), then interleaved graph timing with bf16 cuBLAS (harness.time_graphs). With --src FILE the kernel is
built from FILE instead (an older wgmma.cu with the same Params, for an A / B of the whole build: then only its own
default path is timed, on every weight). With --sweep, every weight whose default plan splits every tile (summed by
either) also runs the cluster sum with each smaller part count whose clusters are all resident at once ("clS"), and
without --src every weight runs its default path (an A / B against --src). Also prints the resident clusters per
(BM, parts). usage: python benchmarks/probe_wgmma_cluster.py LABEL [--src FILE] [--ms 8,16,32] [--sweep] [JSON]"""
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.ops.matmul import wgmma
from probe_weights import check_and_time, model_weights, rotated, write_rows


def main():
    label = sys.argv[1]
    src = sys.argv[sys.argv.index("--src") + 1] if "--src" in sys.argv else None
    ms = [int(v) for v in sys.argv[sys.argv.index("--ms") + 1].split(",")] if "--ms" in sys.argv else [8, 16, 32]
    if src:
        wgmma.SOURCE = src  # before the first load (wgmma._lib_for is cached)
    rows = []
    torch.manual_seed(0)
    for model, layer, n, k, w, q in model_weights():
        prep = wgmma.Prepared(*linear_args(q))
        if not src and model == "llama-3.3-70b" and layer == "q+o":
            print({bm: [prep.lib.clusters[(0, bm, 1, s)] for s in range(2, 9)] for bm in (8, 16, 32, 64)}, flush=True)
        sweep = "--sweep" in sys.argv
        todo = [m for m in ms if src or sweep or prep.launch_plan(m, torch.bfloat16)[4]]
        if not todo:
            continue
        ws, qs = rotated(w, q)
        wd = fastnf4.dequantize(q)
        for m in todo:
            plan = prep.launch_plan(m, torch.bfloat16)
            runs = {"wg": lambda x, q, y=None: wgmma.launch(x, *linear_args(q), y=y)}
            bm, parts, _, full, _ = plan
            if not src and full == 0 and parts > 1:
                runs["wg_sum"] = lambda x, q, y=None: wgmma.launch(x, *linear_args(q), y=y, cluster=False)
                for want in range(parts, 1, -1) if sweep else ():
                    bm2, s2, _, _, _ = prep.launch_plan(m, torch.bfloat16, splits=want, cluster=False)
                    if s2 != want or -(-m // bm2) * -(-n // 128) > prep.lib.clusters[(0, bm2, 1, s2)]:
                        continue
                    runs[f"cl{s2}"] = lambda x, q, y=None, s2=s2: wgmma.launch(x, *linear_args(q), y=y, splits=s2,
                                                                             cluster=True)
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            us, errs = check_and_time(x, wd, ws, qs, runs, f"{model} {layer}")
            rows.append(dict(label=label, model=model, layer=layer, N=n, K=k, M=m, plan=plan, us=us, err=errs))
            line = f"{label} {model[:6]} {layer:8s} M {m:2d} {plan}: " + " ".join(f"{p} {v:.1f}" for p, v in us.items())
            if "wg_sum" in us:
                line += f" | sum/cluster {us['wg_sum'] / us['wg']:.3f}"
            print(line + f" | cublas/wg {us['cublas'] / us['wg']:.3f}", flush=True)
        del qs, ws, wd
        torch.cuda.empty_cache()
    write_rows(rows)


if __name__ == "__main__":
    main()
