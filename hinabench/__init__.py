"""hinabench: MoE kernels on CPUs, measured against the memory-bandwidth roofline."""
__version__ = "0.1.0"
