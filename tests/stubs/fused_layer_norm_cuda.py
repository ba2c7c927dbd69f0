"""Stand-in for apex's compiled `fused_layer_norm_cuda` extension (tests only)."""
