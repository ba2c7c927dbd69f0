"""Stand-in for apex's compiled `amp_C` extension (tests only): its presence is what
`pretrain.runtime.kernels.apex_extension_available` checks."""
