cat > bench.py <<'EOF'
import krex, torch, triton

x = torch.randn(4096, 4096, device="cuda")
x @ x  # warm-up and compilation: outside the region
with krex.region():
    ms = triton.testing.do_bench(lambda: x @ x)
print(f"{ms:.3f} ms")
EOF
krex run --report r.json -- python bench.py   # run several at once: each region runs alone
krex status                                    # slots, queues, regions; `krex top` live
krex daemon stop
