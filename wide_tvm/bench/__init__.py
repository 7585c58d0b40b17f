"""wide-bench: gated kernels against dense cuBLAS, TVM dense and the roofline, on one GPU.

`wide-bench build DIR` compiles (here, no GPU needed) our kernels and TVM's dense baselines for the
Llama-3.1-8B shapes; `wide-bench run DIR` times them on the GPU with the TVM runtime alone, next to
`torch.matmul`, and writes a table, JSON and a plot.
"""
