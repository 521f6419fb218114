// Kernels for the GPU check: compiled to PTX on the GPU machine by scripts/gpu_check.sh.
extern "C" __global__ void add_one(float *p, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] += 1.0f;
}

extern "C" __global__ void empty(void) {}
