#!/usr/bin/env python3
"""Sustained GEMM and attention throughput on one GPU, with the clocks and power it ran at.

Data for the compute model (docs/validation.md, issue "forecasts that hold"): the profiles'
GEMM curves come from short best-shape runs; training runs long kernels at the power limit on
random data. This measures, with PyTorch on random bf16 data:

  1. the GEMMs of a transformer layer (forward, input-gradient and weight-gradient shapes) of
     Llama-3-8B and Llama-3-70B at tensor-parallel widths 1..8 and 8,192 tokens per micro-batch,
     each timed with CUDA events over repeated launches after a warm-up;
  2. one 8192^3 bf16 GEMM run back-to-back for SUSTAIN_S seconds, sampled once a second
     (TFLOP/s over the last second, SM clock, power draw) through NVML;
  3. causal flash attention (torch SDPA) forward and backward at head dim 128.

  python3 scripts/gpu-sustained.py OUT.json [BUDGET_S]

Reads the GPU's state only (NVML queries); changes no clock, power or mode. Of BUDGET_S (default
150): the GEMMs take the first 40%, the sustained run up to 30 s of what then leaves 20%, the
attention shapes the rest; it writes what it has after each part.
"""
import json
import sys
import time

import torch

out_path = sys.argv[1]
budget_s = float(sys.argv[2]) if len(sys.argv) > 2 else 150.0
start = time.time()
left = lambda: budget_s - (time.time() - start)
result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
          "cuda": torch.version.cuda, "gemms": [], "sustained": [], "attention": []}

try:
    import pynvml
    pynvml.nvmlInit()
    nvml = pynvml.nvmlDeviceGetHandleByIndex(0)
except Exception as e:  # NVML is optional: the samples then carry no clock or power
    nvml = None
    result["nvml_error"] = str(e)


def gpu_state():
    if nvml is None:
        return {}
    try:
        return {"sm_mhz": pynvml.nvmlDeviceGetClockInfo(nvml, pynvml.NVML_CLOCK_SM),
                "mem_mhz": pynvml.nvmlDeviceGetClockInfo(nvml, pynvml.NVML_CLOCK_MEM),
                "power_w": pynvml.nvmlDeviceGetPowerUsage(nvml) / 1000.0,
                "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(nvml) / 1000.0,
                "temp_c": pynvml.nvmlDeviceGetTemperature(nvml, pynvml.NVML_TEMPERATURE_GPU)}
    except Exception as e:
        return {"nvml_error": str(e)}


def write():
    result["elapsed_s"] = time.time() - start
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


def time_op(fn, min_s=0.25, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    # Calibrate the repeat count to about min_s of work.
    t0 = time.time()
    fn()
    torch.cuda.synchronize()
    one = max(time.time() - t0, 1e-6)
    reps = max(3, min(200, int(min_s / one)))
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / 1e3 / reps, reps


dev = torch.device("cuda")
torch.backends.cuda.matmul.allow_tf32 = False

# 1. Transformer-layer GEMMs: (name, hidden, ffn, heads, kv_heads)
models = [("llama3-8b", 4096, 14336, 32, 8), ("llama3-70b", 8192, 28672, 64, 8)]
tokens = 8192
for model, h, ffn, heads, kv in models:
    head_dim = h // heads
    for tp in (1, 2, 4, 8):
        qkv = (heads + 2 * kv) * head_dim // tp
        layer = [("qkv", h, qkv), ("proj", h // tp, h), ("fc1", h, 2 * ffn // tp),
                 ("fc2", ffn // tp, h)]
        for name, k, n in layer:
            # forward (M,K)x(K,N); input gradient (M,N)x(N,K); weight gradient (K,M)x(M,N)
            for phase, (m_, k_, n_) in (("fwd", (tokens, k, n)), ("dgrad", (tokens, n, k)),
                                         ("wgrad", (k, tokens, n))):
                if time.time() - start > 0.4 * budget_s:  # GEMMs get 40% of the budget
                    break
                x = torch.randn(m_, k_, device=dev, dtype=torch.bfloat16)
                w = torch.randn(k_, n_, device=dev, dtype=torch.bfloat16)
                s, reps = time_op(lambda: torch.mm(x, w))
                flops = 2.0 * m_ * n_ * k_
                result["gemms"].append({"model": model, "tp": tp, "gemm": name, "phase": phase,
                                        "m": m_, "n": n_, "k": k_, "seconds": s, "reps": reps,
                                        "tflops": flops / s / 1e12, **gpu_state()})
                del x, w
        write()

# 2. Sustained 8192^3 GEMM: on randn data (two thirds of the time), then on the byte pattern of
# offsim's replay fill (backends/cuda/kernels.cu launch_fill: random sign and low three bits
# over 0x38 per byte), which toggles fewer bits; tensor-core power, hence the clock at the power
# limit, depends on the data.
def replay_fill(rows, cols):
    h = torch.randint(0, 16, (rows * cols * 2,), device=dev, dtype=torch.uint8)
    return (((h & 8) << 4) | 0x38 | (h & 7)).view(torch.bfloat16).view(rows, cols)


def sustained(x, w, seconds, data):
    for _ in range(3):
        torch.mm(x, w)
    torch.cuda.synchronize()
    t_end = time.time() + seconds
    while time.time() < t_end:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        reps = 0
        t1 = time.time()
        while time.time() - t1 < 1.0:
            for _ in range(20):
                torch.mm(x, w)
            reps += 20
            torch.cuda.synchronize()
        b.record()
        torch.cuda.synchronize()
        s = a.elapsed_time(b) / 1e3
        n = x.shape[0]
        result["sustained"].append({"t_s": time.time() - start, "data": data, "reps": reps,
                                    "tflops": 2.0 * n ** 3 * reps / s / 1e12, **gpu_state()})


sustain_s = min(30.0, max(0.0, left() - 0.2 * budget_s))  # attention keeps the last 20%
if sustain_s > 6:
    n = 8192
    x = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    sustained(x, w, sustain_s * 2 / 3, "randn")
    write()
    x, w = replay_fill(n, n), replay_fill(n, n)
    sustained(x, w, sustain_s / 3, "replay_fill")
    del x, w
    write()

# 3. Causal flash attention, head dim 128, bf16.
for seq, heads in ((4096, 32), (8192, 32), (8192, 64)):
    if left() < 10:
        break
    q = torch.randn(1, heads, seq, 128, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn_like(q, requires_grad=True)
    v = torch.randn_like(q, requires_grad=True)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    fwd_s, _ = time_op(lambda: sdpa(q, k, v, is_causal=True))
    o = sdpa(q, k, v, is_causal=True)
    g = torch.randn_like(o)

    def fwd_bwd():
        out = sdpa(q, k, v, is_causal=True)
        out.backward(g)

    fb_s, _ = time_op(fwd_bwd)
    # causal: half of 4*seq^2*d*heads forward FLOPs; backward 2.5x the forward
    fwd_flops = 4.0 * seq * seq * 128 * heads / 2
    result["attention"].append({"seq": seq, "heads": heads, "head_dim": 128,
                                "fwd_seconds": fwd_s, "fwd_tflops": fwd_flops / fwd_s / 1e12,
                                "bwd_seconds": fb_s - fwd_s,
                                "bwd_tflops": 2.5 * fwd_flops / max(fb_s - fwd_s, 1e-9) / 1e12,
                                **gpu_state()})
    del q, k, v, o, g
write()
print(f"gpu-sustained: {len(result['gemms'])} GEMMs, {len(result['sustained'])} sustained "
      f"samples, {len(result['attention'])} attention shapes in {time.time() - start:.0f} s")
