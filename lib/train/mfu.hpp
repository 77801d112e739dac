// Model FLOPs utilisation: the GPU's dense bf16 tensor-core peak, looked up by its CUDA
// device name, and the share of it a run achieves. Pure arithmetic: no CUDA here.
#pragma once
#include <string>

namespace pptrain {

// Dense (no 2:4 sparsity) bf16 tensor-core peak of one GPU in TFLOP/s, found by the
// model words in its CUDA device name (e.g. "H100" in "NVIDIA H100 80GB HBM3"), in any
// letter case; 0 for an unknown device or an empty name.
double dense_bf16_peak_tflops(const std::string& device_model);

// Achieved FLOP/s of one GPU over its peak (a fraction, 0.42 for 42%); 0 when the peak
// is not positive.
double mfu(double flops_per_second_per_gpu, double peak_tflops);

// The MFU denominator of a run: `configured` (train.peak_tflops) when positive, else
// the table's peak for `device_model`.
double peak_tflops_for(double configured, const std::string& device_model);

}  // namespace pptrain
