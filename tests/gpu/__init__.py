"""Tests that read real NVML; skipped on machines without an NVIDIA driver."""
