// Kernels for the GPU check: compiled to PTX on the GPU machine by scripts/gpu_check.sh.
extern "C" __global__ void add_one(float *p, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] += 1.0f;
}

extern "C" __global__ void empty(void) {}

// Keeps an SM busy for about `cycles` clock cycles (the dlmopen sibling of security_check.py).
extern "C" __global__ void spin(long long cycles)
{
    long long t0 = clock64();
    while (clock64() - t0 < cycles)
        ;
}
