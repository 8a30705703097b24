"""Stdlib-only scripts shipped to hosts and run there before anything is installed (weight staging, the converged
check); they import nothing of ours."""
