"""End to end (issue 15; the paper's Figures 12-14 and Table 4): whole-model prefill and decode.

  checkpoint.py  synthetic-weight Hugging Face checkpoints from the model registry (`--layers N`),
                 written once per (config, seed) so that every engine loads the same weights
  dropin.py      the HiNa kernels dropped into transformers through its experts interface: the
                 whole patch (`hinabench e2e --show-patch` prints it and counts its lines)
  engines.py     the engines (hf, hina, vllm, llamacpp, ipex, kt): each runs, or says why not
  measure.py     validation against transformers in fp32, then TTFT, TPOT, the FFN's share of decode
  vllm_run.py    the script the vllm engine runs in its own environment (llamacpp_run.py: llama.cpp's,
                 ipex_run.py: IPEX's);
  peer_run.py    their shared frame: the request in, the result (or the error) out
  gguf_writer.py the same checkpoint as GGUF (BF16, Q8_0) for llama.cpp
  figures.py     Figures 12, 13, 14 and Table 4 from stored rows
"""
