"""The committed tuning databases (one folder per target), shipped as package data: `wide_tvm.tuning_logs` in editable
and wheel installs alike (wide_tvm/tuning/folders.py finds them)."""
